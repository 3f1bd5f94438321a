//! The one way to know a domain's daemon: the pid and start time written into
//! `<state>/mps/<id>/daemon` by the spawned child itself, before exec ([`record_on_exec`]).
//! That file lies in the state directory (mode 0700), which no container sees and the daemon's
//! own sandbox shows read-only, so only gpushare writes it. A process is never taken for a
//! daemon by its name, arguments or environment: anything a tenant can imitate.

use std::path::Path;

use crate::host::mps::MpsDirs;
use crate::host::procinfo::ProcId;

/// Name of the file in a domain's directory that names the daemon gpushare started there.
pub const DAEMON_FILE: &str = "daemon";

/// Records `proc` as the daemon of `dirs` (written to a temp file, then renamed).
///
/// # Errors
/// The file cannot be written.
pub fn record(dirs: &MpsDirs, proc: ProcId) -> std::io::Result<()> {
    let tmp = temp_path(dirs, std::process::id());
    std::fs::write(&tmp, format!("{} {}\n", proc.pid, proc.start_time))?;
    std::fs::rename(&tmp, dirs.dir.join(DAEMON_FILE))
}

/// Arranges for the daemon `cmd` starts in `dirs` to record itself, between fork and exec
/// ([`crate::sys::record_self_on_exec`]): a hook SIGKILLed right after the spawn leaves a daemon
/// that the next acquire adopts and a release stops, not one nobody knows. Call it before the
/// sandbox makes the host read-only for the child.
///
/// # Errors
/// A path with a NUL byte.
pub fn record_on_exec(cmd: &mut std::process::Command, dirs: &MpsDirs) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::from);
    // The launcher's pid names the temp file, as in `record`.
    let tmp = c(&temp_path(dirs, std::process::id()))?;
    crate::sys::record_self_on_exec(cmd, tmp, c(&dirs.dir.join(DAEMON_FILE))?);
    Ok(())
}

fn temp_path(dirs: &MpsDirs, pid: u32) -> std::path::PathBuf {
    dirs.dir.join(format!(".{DAEMON_FILE}.{pid}"))
}

/// Forgets `proc` as the daemon of `dirs` (if it is the one recorded).
pub fn forget(dirs: &MpsDirs, proc: ProcId) {
    if recorded(&dirs.dir) == Some(proc) {
        let _ = std::fs::remove_file(dirs.dir.join(DAEMON_FILE));
    }
}

/// The daemon recorded in the domain directory `dir`, whether it runs or not.
pub fn recorded(dir: &Path) -> Option<ProcId> {
    let text = std::fs::read_to_string(dir.join(DAEMON_FILE)).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    Some(ProcId {
        pid: pid.parse().ok()?,
        start_time: start.parse().ok()?,
    })
}

/// The daemon gpushare started for the pipe directory `pipe`, if it still runs.
pub fn running(pipe: &Path) -> Option<ProcId> {
    recorded(pipe.parent()?).filter(ProcId::is_alive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_recorded_live_process_is_found() {
        let t = tempfile::tempdir().unwrap();
        let dirs = MpsDirs::new(t.path().join("d"));
        std::fs::create_dir_all(&dirs.pipe).unwrap();
        assert_eq!(running(&dirs.pipe), None, "nothing recorded");
        let me = ProcId::of(std::process::id() as i32).unwrap();
        record(&dirs, me).unwrap();
        assert_eq!(running(&dirs.pipe), Some(me));
        let reused = ProcId {
            start_time: me.start_time + 1,
            ..me
        };
        record(&dirs, reused).unwrap();
        assert_eq!(running(&dirs.pipe), None, "a reused pid is not the daemon");
        forget(&dirs, me);
        assert_eq!(recorded(&dirs.dir), Some(reused), "another's record stays");
        forget(&dirs, reused);
        assert_eq!(recorded(&dirs.dir), None);
        std::fs::write(dirs.dir.join(DAEMON_FILE), "garbage").unwrap();
        assert_eq!(running(&dirs.pipe), None);
    }
}
