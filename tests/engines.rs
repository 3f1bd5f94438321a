//! End-to-end tests with real engines (podman, containerd, Docker, runc), checked from inside
//! the container. Each test runs one script of `tests/engines/` (they take a host-wide lock, so
//! they run one at a time). A script that cannot run its engine exits 77 after printing
//! `SKIPPED: <why>`: that fails the test when `CI=true` and is reported loudly otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook"))
        .parent()
        .expect("target dir")
        .to_owned()
}

fn lib(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        p.display()
    );
    p
}

/// Runs `tests/engines/<script>` and judges its exit code.
pub fn run_script(script: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let why_not_root = (!nix::unistd::geteuid().is_root()).then_some("needs root");
    let out = match why_not_root {
        Some(why) => {
            skip(script, why);
            return;
        }
        None => Command::new("bash")
            .arg(repo.join("tests/engines").join(script))
            .env("GS_HOOK", env!("CARGO_BIN_EXE_gpushare-hook"))
            .env("GS_RUNTIME", env!("CARGO_BIN_EXE_gpushare-runtime"))
            .env("GS_SIMDRIVER", lib("libgpushare_simdriver.so"))
            .env("GS_LIMITER", lib("libgpushare_limiter.so"))
            .env("GS_REPO", repo)
            .env_remove("GPUSHARE_CONFIG")
            .output()
            .expect("run bash"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    match out.status.code() {
        Some(0) => {}
        Some(77) => {
            let why = stdout
                .lines()
                .find_map(|l| l.strip_prefix("SKIPPED: "))
                .unwrap_or("engine unavailable");
            skip(script, why);
        }
        other => panic!("{script} failed ({other:?}); see its output above"),
    }
}

fn skip(script: &str, why: &str) {
    let msg = format!("SKIPPED: {script}: {why}");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI=true requires every engine)");
    }
    eprintln!("\n******** {msg} ********\n");
}

#[test]
fn podman_hooks_dir_precreate_limit_and_lifecycle() {
    run_script("podman_hooks.sh");
}

#[test]
fn runc_runtime_wrapper_and_hook_alone() {
    run_script("runc.sh");
}

#[test]
fn podman_runtime_wrapper() {
    run_script("podman_runtime.sh");
}

#[test]
fn containerd_ctr_runc_binary() {
    run_script("containerd.sh");
}

#[test]
fn docker_add_runtime_env_fallback() {
    run_script("docker.sh");
}

#[test]
fn chaining_wrappers_in_front_and_behind_and_loops() {
    run_script("chaining.sh");
}

#[test]
fn security_hostile_images_and_hook_env() {
    run_script("security.sh");
}
