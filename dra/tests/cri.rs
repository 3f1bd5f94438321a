//! `tests/engines/dra_cri.sh`: the plugin binary behind a fake API server and a test kubelet,
//! then containerd's CRI with CDI creating the claims' containers, gpushare's hook taking the
//! shares (see the script). Exit 0 passes; 77 is a loud SKIPPED (a failure under `CI=true`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's target dir, where `cargo build --workspace` put the other binaries.
fn bin(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .parent()
        .expect("target dir")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        p.display()
    );
    p
}

fn run(containerd: &str) {
    let label = format!("dra_cri.sh CRI_CONTAINERD={containerd}");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !nix_is_root() {
        let msg = format!("SKIPPED: {label}: needs root");
        assert!(!ci, "{msg} (CI=true requires it)");
        eprintln!("\n******** {msg} ********\n");
        return;
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(here.join("tests/engines/dra_cri.sh"))
        .env("GS_DRA", env!("CARGO_BIN_EXE_gpushare-dra"))
        .env("GS_HOOK", bin("gpushare-hook"))
        .env("GS_RUNTIME", bin("gpushare-runtime"))
        .env("GS_SIMDRIVER", bin("libgpushare_simdriver.so"))
        .env("GS_LIMITER", bin("libgpushare_limiter.so"))
        .env("GS_REPO", here.join(".."))
        .env("CRI_CONTAINERD", containerd)
        .env_remove("GPUSHARE_CONFIG")
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(0) => {
            for want in [
                "ok: ResourceSlices published",
                "ok: registered through plugins_registry",
                "ok: c refused",
                "ok: status: two clients with the claims' caps",
                "ok: no spec, no checkpoint entry, no client, no daemon left",
            ] {
                assert!(stdout.contains(want), "{label}: no {want:?}");
            }
        }
        Some(77) => {
            let why = stdout
                .lines()
                .find_map(|l| l.strip_prefix("SKIPPED: "))
                .unwrap_or("no reason given");
            let msg = format!("SKIPPED: {label}: {why}");
            assert!(!ci, "{msg} (CI=true requires it)");
            eprintln!("\n******** {msg} ********\n");
        }
        code => panic!("{label} failed ({code:?})"),
    }
}

/// Whether the test runs as root (the owner of its own /proc entry).
fn nix_is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn claims_prepared_by_the_plugin_become_shares_through_containerd_cri_and_cdi() {
    run("trixie");
}

#[test]
fn the_same_with_containerd_2() {
    run("sid");
}
