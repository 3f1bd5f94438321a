//! The README's demo, as written: `scripts/demo.sh` runs end to end (it installs what it
//! lacks and checks itself; it runs the binaries the suite built, `GS_DEMO_BIN`, instead of
//! building them a second time), and its output shows what the README says it shows. Needs root, runc and NVIDIA's MPS control daemon; on a node without an NVIDIA GPU its
//! NVML answers come from the TEST-ONLY simulated driver.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_runs_as_the_readme_says() {
    if !common::require(
        "the demo",
        &["runc", "nvidia-cuda-mps-control", "jq", "busybox"],
    ) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("\n******** SKIPPED: the demo: needs root ********\n");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The suite's own build of the four files the demo runs (the workspace is built once);
    // the demo's own build step is what scripts/time-demo-fresh.sh times on a fresh machine.
    let bin = common::simdriver()
        .parent()
        .expect("target dir")
        .to_path_buf();
    let out = Command::new(repo.join("scripts/demo.sh"))
        .current_dir(repo)
        .env("GS_DEMO_BIN", &bin)
        .output()
        .expect("run scripts/demo.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/demo.sh exited with {}:\n{stdout}\n{stderr}",
        out.status
    );
    // What the README says the demo shows, in its order.
    let expect = [
        // Two capped containers reach the GPU's MPS control daemon from inside.
        "[a] the MPS control daemon answers inside the container",
        "[b] the MPS control daemon answers inside the container",
        // status: one daemon with its two clients, each with its cap.
        "== gpushare-hook status",
        "16.0 GiB",
        "8.0 GiB",
        // The third, which would overcommit the GPU's memory, is refused by admission.
        "cannot take 64.0 GiB more",
        // The daemon outlives the first container and is gone after the second.
        "== container b stops: the daemon is gone",
        "== daemon directories removed; demo done",
    ];
    let all = format!("{stdout}{stderr}");
    let mut at = 0;
    for e in expect {
        match all[at..].find(e) {
            Some(i) => at += i + e.len(),
            None => panic!("the demo did not show {e:?} (in order):\n{stdout}\n{stderr}"),
        }
    }
    // Positive control: one daemon served both containers (the status between them lists one
    // running daemon and the two clients, a with 16.0 GiB and b with 8.0 GiB).
    let status = &stdout[stdout.find("== gpushare-hook status").unwrap()..];
    let status = &status[..status.find("== container c").unwrap_or(status.len())];
    let lines: Vec<&str> = status.lines().map(str::trim_start).collect();
    let daemons = lines
        .iter()
        .filter(|l| l.starts_with("mps domain") && l.contains(" running "))
        .count();
    let client = |suffix: &str, memory: &str| {
        lines.iter().any(|l| {
            l.starts_with("client demo")
                && l.split_whitespace()
                    .nth(1)
                    .is_some_and(|id| id.ends_with(suffix))
                && l.ends_with(&format!("memory {memory}"))
        })
    };
    assert!(
        daemons == 1 && client("-a", "16.0 GiB") && client("-b", "8.0 GiB"),
        "{status}"
    );
}
