//! A short kill storm (scripts/kill-storm.sh, 20 rounds, fixed seed) against the built hook on
//! the TEST-ONLY simulated driver: concurrent createRuntime/poststop hooks, random SIGKILLs,
//! `gc`, then the invariants of scripts/check-invariants.py. Any violation fails the test.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn short_kill_storm_keeps_every_invariant() {
    storm("gpu", "9");
}

#[test]
fn short_kill_storm_with_isolation_domains_keeps_every_invariant() {
    storm("group", "10");
}

/// Runs 20 rounds under `[mps] isolation = <isolation>`.
fn storm(isolation: &str, seed: &str) {
    if !common::require(
        "kill storm",
        &["nvidia-cuda-mps-control", "unshare", "python3"],
    ) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/kill-storm.sh"))
        .args(["20", seed])
        .env("GS_ISOLATION", isolation)
        .env("GS_HOOK", common::hook_bin())
        .env("GS_SIMDRIVER", common::simdriver())
        .output()
        .expect("run scripts/kill-storm.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("0 distinct violations"), "{text}");
}
