//! Doctor's probes: each dependency is tried the way gpushare will use it, not looked for.
//! The state dir gets a probe file (created and removed), the MPS control program answers
//! `-h`, `nvidia-smi -L` reaches the driver, the limiter is loaded and its symbols looked up,
//! the log file is opened for appending, and the next runtime is resolved as
//! `gpushare-runtime` resolves it.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{check, Check, Verdict};
use crate::admin::engines::check::{first_line, run_bounded, TOOL_TIMEOUT};

/// A program found by [`crate::host::mps::find_binary`], run with a clean env and the safe PATH.
fn tool(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    c.env_clear()
        .env("PATH", crate::host::mps::SAFE_PATH)
        .current_dir("/");
    c
}

/// The state dir: the missing part of its path is created, a probe file is written in it and
/// removed, and what was created is removed again (doctor leaves nothing behind).
pub(super) fn state_dir(dir: &Path) -> Result<bool, String> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| !p.exists())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let mut created: Vec<&Path> = Vec::new();
    let result = (|| {
        for p in &missing {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(p)
                .map_err(|e| format!("cannot create {}: {e}", p.display()))?;
            created.push(p);
        }
        let probe = dir.join(format!(".doctor-probe-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&probe)
            .map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))?;
        let w = f.write_all(b"gpushare doctor probe\n");
        let _ = std::fs::remove_file(&probe);
        w.map_err(|e| format!("cannot write a file in {}: {e}", dir.display()))
    })();
    for p in created.iter().rev() {
        let _ = std::fs::remove_dir(p);
    }
    result.map(|()| !missing.is_empty())
}

/// `nvidia-cuda-mps-control -h`: it must run and say it is the MPS control program.
pub(super) fn mps_control(control: &str, missing: Verdict) -> Check {
    let name = "mps control";
    let Some(bin) = crate::host::mps::find_binary(control) else {
        return check(
            name,
            missing,
            format!("{control} not found; install nvidia-cuda-mps or set [mps] control"),
        );
    };
    match run_bounded(tool(&bin).arg("-h"), TOOL_TIMEOUT) {
        Ok(o) if o.status.success() && is_mps_help(&o) => {
            check(name, Verdict::Ok, format!("{}: {}", bin.display(), first_line(&o)))
        }
        Ok(o) => check(
            name,
            missing,
            format!(
                "{} -h does not answer as nvidia-cuda-mps-control does ({}: {:?}); set [mps] control to NVIDIA's program",
                bin.display(),
                o.status,
                first_line(&o)
            ),
        ),
        Err(e) => check(name, missing, format!("{e}; set [mps] control to NVIDIA's program")),
    }
}

/// NVIDIA's help text names the program ("CUDA MPS Control for Linux/Unix.").
fn is_mps_help(o: &Output) -> bool {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    text.contains("MPS Control")
}

/// `nvidia-smi -L`: found, and it reaches the driver (it lists the GPUs).
pub(super) fn nvidia_smi(smi: &str, missing: Verdict) -> Check {
    let name = "nvidia-smi";
    let Some(bin) = crate::host::mps::find_binary(smi) else {
        return check(
            name,
            missing,
            format!("{smi} not found; needed for gpu.share.timeslice"),
        );
    };
    match run_bounded(tool(&bin).arg("-L"), TOOL_TIMEOUT) {
        Ok(o) if o.status.success() => check(
            name,
            Verdict::Ok,
            format!("{}: {}", bin.display(), first_line(&o)),
        ),
        Ok(o) => check(
            name,
            missing,
            format!(
                "{} -L failed ({}): {}; timeslice cannot set the GPU's time slice",
                bin.display(),
                o.status,
                first_line(&o)
            ),
        ),
        Err(e) => check(
            name,
            missing,
            format!("{e}; needed for gpu.share.timeslice"),
        ),
    }
}

/// What the limiter must export for programs to reach its wrappers (linked programs,
/// `dlopen`ers and the CUDA runtime's `cuGetProcAddress`), and for `nvidia-smi` to see the cap.
pub(super) const LIMITER_SYMBOLS: &[&std::ffi::CStr] = &[
    c"cuMemAlloc_v2",
    c"cuGetProcAddress",
    c"dlsym",
    c"nvmlDeviceGetMemoryInfo",
];

/// The limiter: loaded (every dependency resolved) and exporting [`LIMITER_SYMBOLS`].
pub(super) fn limiter(lib: &Path, missing: Verdict) -> Check {
    let name = "limiter";
    if !lib.is_file() {
        return check(
            name,
            missing,
            format!("{} missing; limit mode cannot work", lib.display()),
        );
    }
    match crate::sys::missing_symbols(lib, LIMITER_SYMBOLS) {
        Ok(m) if m.is_empty() => check(
            name,
            Verdict::Ok,
            format!("{}: loads, exports the CUDA and NVML wrappers", lib.display()),
        ),
        Ok(m) => check(
            name,
            missing,
            format!(
                "{} loads but does not define {}: it is not gpushare's limiter; set [limit] library to libgpushare_limiter.so",
                lib.display(),
                m.join(", ")
            ),
        ),
        Err(e) => check(
            name,
            missing,
            format!("{} cannot be loaded: {e}; limit mode cannot work", lib.display()),
        ),
    }
}

/// The log file, opened for appending (a file created for the probe is removed again).
pub(super) fn log_file(path: &Path) -> Check {
    let name = "log file";
    let existed = path.exists();
    let r = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path);
    match r {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            check(name, Verdict::Ok, format!("{} (appendable)", path.display()))
        }
        Err(e) => check(
            name,
            Verdict::Warn,
            format!(
                "{} cannot be opened for appending: {e}; gpushare logs only to stderr. Fix its directory or set log_file",
                path.display()
            ),
        ),
    }
}

/// The next runtime, found as `gpushare-runtime` finds it ([`crate::container::runtime::find_next`])
/// with this process's `$PATH`.
pub(super) fn next_runtime(next: &[String], runtime: &Path) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH");
    crate::container::runtime::find_next(next, runtime, path.as_deref())
        .map_err(|e| crate::vocab::chain(&e))
}
