//! Runs a script of `tests/engines/` with the binaries under test and judges its exit: 0
//! passes, 77 is a loud SKIPPED (a failure under `CI=true`), anything else fails.

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
pub fn judge(script: &str, code: Option<i32>, stdout: &str, ci: bool) -> Result<(), String> {
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
