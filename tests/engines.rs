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
    run_script_with(script, &[]);
}

/// [`run_script`] with extra environment (which engine build a script runs against).
pub fn run_script_with(script: &str, env: &[(&str, &str)]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let why_not_root = (!nix::unistd::geteuid().is_root()).then_some("needs root");
    let out = match why_not_root {
        Some(why) => {
            skip(&label(script, env), why);
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
            .envs(env.iter().copied())
            .output()
            .expect("run bash"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    if let Err(e) = judge(&label(script, env), out.status.code(), &stdout, ci()) {
        panic!("{e}");
    }
}

/// The script and its extra env, as reports name it.
fn label(script: &str, env: &[(&str, &str)]) -> String {
    let mut s = script.to_owned();
    for (k, v) in env {
        s.push_str(&format!(" {k}={v}"));
    }
    s
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The verdict on a script's exit: 0 passes, 77 is a skip (loud; a failure under CI), anything
/// else fails.
fn judge(script: &str, code: Option<i32>, stdout: &str, ci: bool) -> Result<(), String> {
    match code {
        Some(0) => Ok(()),
        Some(77) => {
            let why = stdout
                .lines()
                .find_map(|l| l.strip_prefix("SKIPPED: "))
                .unwrap_or("engine unavailable");
            skip_with(script, why, ci)
        }
        other => Err(format!("{script} failed ({other:?}); see its output above")),
    }
}

fn skip(script: &str, why: &str) {
    if let Err(e) = skip_with(script, why, ci()) {
        panic!("{e}");
    }
}

fn skip_with(script: &str, why: &str, ci: bool) -> Result<(), String> {
    let msg = format!("SKIPPED: {script}: {why}");
    if ci {
        return Err(format!("{msg} (CI=true requires every engine)"));
    }
    eprintln!("\n******** {msg} ********\n");
    Ok(())
}

#[test]
fn skips_are_loud_and_fail_under_ci() {
    // Rows: (description, exit code, stdout, CI, passes)
    let rows: &[(&str, Option<i32>, &str, bool, bool)] = &[
        ("pass", Some(0), "", true, true),
        (
            "skip outside CI",
            Some(77),
            "SKIPPED: podman not installed\n",
            false,
            true,
        ),
        (
            "skip under CI",
            Some(77),
            "SKIPPED: podman not installed\n",
            true,
            false,
        ),
        ("failure", Some(1), "FAIL: x\n", false, false),
        ("killed", None, "", false, false),
    ];
    for (what, code, out, ci, passes) in rows {
        let r = judge("x.sh", *code, out, *ci);
        assert_eq!(r.is_ok(), *passes, "{what}: {r:?}");
        if let Err(e) = r {
            if *code == Some(77) {
                assert!(
                    e.contains("SKIPPED: x.sh: podman not installed"),
                    "{what}: {e}"
                );
            }
        }
    }
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
    run_script_with("docker.sh", &[("DOCKER_ENGINE", "system")]);
}

#[test]
fn docker_26_debian13_annotation_and_env_fallback() {
    run_script_with("docker.sh", &[("DOCKER_ENGINE", "trixie")]);
}

#[test]
fn chaining_wrappers_in_front_and_behind_and_loops() {
    run_script("chaining.sh");
}

#[test]
fn security_hostile_images_and_hook_env() {
    run_script("security.sh");
}

#[test]
fn cri_containerd_1_6_system() {
    run_script_with("cri.sh", &[("CRI_CONTAINERD", "system")]);
}

#[test]
fn cri_containerd_1_7_debian13() {
    run_script_with("cri.sh", &[("CRI_CONTAINERD", "trixie")]);
}

#[test]
fn kubernetes_installer_image_podman_build_offline() {
    run_script("k8s_image.sh");
}

#[test]
fn cri_containerd_2_debian_unstable_config_v3() {
    run_script_with("cri.sh", &[("CRI_CONTAINERD", "sid")]);
}
