//! Runs a script of `tests/engines/` with the binaries under test and judges its exit: 0
//! passes, 77 is a loud SKIPPED (a failure under `CI=true`), anything else fails.

use std::path::{Path, PathBuf};
use std::process::Command;

fn lib(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook"))
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

/// Runs `tests/engines/<script>` and panics unless it passed or (outside CI) skipped.
pub fn run_script(script: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !nix::unistd::geteuid().is_root() {
        return skip(script, "needs root", ci);
    }
    let out = Command::new("bash")
        .arg(repo.join("tests/engines").join(script))
        .env("GS_HOOK", env!("CARGO_BIN_EXE_gpushare-hook"))
        .env("GS_RUNTIME", env!("CARGO_BIN_EXE_gpushare-runtime"))
        .env("GS_SIMDRIVER", lib("libgpushare_simdriver.so"))
        .env("GS_LIMITER", lib("libgpushare_limiter.so"))
        .env("GS_REPO", repo)
        .env_remove("GPUSHARE_CONFIG")
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(0) => {}
        Some(77) => {
            let why = stdout
                .lines()
                .find_map(|l| l.strip_prefix("SKIPPED: "))
                .unwrap_or("engine unavailable");
            skip(script, why, ci);
        }
        other => panic!("{script} failed ({other:?}); see its output above"),
    }
}

fn skip(script: &str, why: &str, ci: bool) {
    let msg = format!("SKIPPED: {script}: {why}");
    assert!(!ci, "{msg} (CI=true requires it)");
    eprintln!("\n******** {msg} ********\n");
}
