//! Running the next runtime: in place of this process (exec), or as a child with the
//! caller's signals forwarded to it.

use std::ffi::OsString;
use std::path::Path;

use super::chain::{signature, LOOP_GUARD};
use super::RuntimeError;

/// Signals a caller may send the runtime it started; forwarded to the child runtime.
const FORWARDED: [nix::sys::signal::Signal; 7] = {
    use nix::sys::signal::Signal::*;
    [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH]
};

/// Runs `next` with `argv` as a child (the loop guard set as for exec), forwarding
/// [`FORWARDED`] signals to it, and returns its exit status (128 + the signal when killed).
///
/// # Errors
/// [`RuntimeError::Exec`] when it cannot be started or waited for.
pub fn run_next_child(next: &Path, argv: &[OsString]) -> Result<u8, RuntimeError> {
    use nix::sys::signal::SigSet;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let exec_err = |source| RuntimeError::Exec {
        path: next.to_owned(),
        source,
    };
    let mut set = SigSet::empty();
    FORWARDED.iter().for_each(|s| set.add(*s));
    // Blocked here and taken by the forwarding thread; the child starts with an empty mask
    // (std resets it before exec).
    set.thread_block()
        .map_err(|e| exec_err(std::io::Error::from(e)))?;
    let mut child = std::process::Command::new(next)
        .arg0(next.as_os_str())
        .args(argv)
        .env(LOOP_GUARD, signature(argv))
        .spawn()
        .map_err(exec_err)?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    });
    let status = child.wait().map_err(exec_err)?;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    })
}

/// Replaces this process with `next`, argv unchanged (argv\[0\] set to the next runtime's path).
///
/// # Errors
/// Only when exec fails.
pub fn exec_next(next: &Path, argv: &[OsString]) -> RuntimeError {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(next)
        .arg0(next.as_os_str())
        .args(argv)
        .env(LOOP_GUARD, signature(argv))
        .exec();
    RuntimeError::Exec {
        path: next.to_owned(),
        source: err,
    }
}
