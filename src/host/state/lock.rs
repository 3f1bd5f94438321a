//! The GPU locks (`gpus/<uuid>.lock`, an `flock` per GPU) and who holds one: the process named
//! by `/proc/locks`, with the name it wrote into the file.

use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::time::Duration;

use super::{StateDir, StateError};

impl StateDir {
    /// Takes the GPU's lock, waiting up to `timeout`. The lock is released when the guard drops
    /// (or the process dies).
    ///
    /// # Errors
    /// [`StateError::LockTimeout`] naming the holder, or [`StateError::Lock`].
    pub fn lock(&self, uuid: &str, timeout: Duration, holder: &str) -> Result<GpuLock, StateError> {
        let path = self.lock_path(uuid);
        let lock_err = |source| StateError::Lock {
            path: path.clone(),
            source,
        };
        let mut file = crate::host::lockfile::open(&path).map_err(lock_err)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                if let Err(e) = wait_for_lock(&file, timeout) {
                    if e.kind() != std::io::ErrorKind::TimedOut {
                        return Err(lock_err(e));
                    }
                    let mut who = String::new();
                    let _ = (&file).take(256).read_to_string(&mut who);
                    return Err(StateError::LockTimeout {
                        uuid: uuid.to_owned(),
                        seconds: timeout.as_secs(),
                        holder: lock_holder(&file, who.trim()),
                    });
                }
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(lock_err(e)),
        }
        // Name the holder for whoever times out waiting; best effort.
        let _ = file.set_len(0);
        let _ = file.rewind();
        // One write: a waiter that times out reads either nothing or the whole line.
        let _ = file.write_all(format!("pid {} ({holder})\n", std::process::id()).as_bytes());
        Ok(GpuLock { _file: file })
    }
}

/// Waits up to `timeout` for `file`'s `flock`: a blocking `flock` on a duplicate of the
/// descriptor (the lock belongs to the open file they share), made on a thread of its own, so
/// that the kernel wakes the waiter the moment the lock is free and no poll interval adds
/// latency. A lock the thread gets after the timeout is let go at once: the thread closes its
/// duplicate, and the caller, having timed out, closes the original.
///
/// # Errors
/// `TimedOut`, or the error of `dup` or `flock`.
fn wait_for_lock(file: &File, timeout: Duration) -> std::io::Result<()> {
    let waiter = file.try_clone()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.lock());
    });
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Names the process that really holds `file`'s `flock` (from `/proc/locks`), with what it
/// wrote into the file when that was the same process; the file's text alone can name a holder
/// that has since gone.
fn lock_holder(file: &File, written: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else {
        return written_or_unknown(written);
    };
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    match holder_pid(&locks, meta.dev(), meta.ino()) {
        Some(pid) if written.starts_with(&format!("pid {pid} ")) => written.to_owned(),
        Some(pid) => {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim())
        }
        None => written_or_unknown(written),
    }
}

fn written_or_unknown(written: &str) -> String {
    if written.is_empty() {
        "an unknown process".into()
    } else {
        written.to_owned()
    }
}

/// The pid holding a `FLOCK` on the file (`dev`, `ino`) in the text of `/proc/locks`.
pub fn holder_pid(locks: &str, dev: u64, ino: u64) -> Option<i32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; blocked waiters have "->".
        if f.get(1) != Some(&"FLOCK") || f.contains(&"->") {
            return None;
        }
        (f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4).and_then(|p| p.parse().ok()))
            .flatten()
    })
}

/// A held GPU lock.
#[derive(Debug)]
pub struct GpuLock {
    _file: File,
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_holder_that_wrote_nothing_is_an_unknown_process() {
        assert_eq!(written_or_unknown(""), "an unknown process");
        assert_eq!(written_or_unknown("pid 5 (hook)"), "pid 5 (hook)");
    }

    use super::*;

    #[test]
    fn lock_holders_come_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:1a:99 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 5151 00:1a:99 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 6161 00:1a:100 0 EOF\n";
        let dev = libc::makedev(0, 0x1a);
        assert_eq!(
            holder_pid(locks, dev, 99),
            Some(4242),
            "the holder, not the waiter"
        );
        assert_eq!(
            holder_pid(locks, dev, 100),
            None,
            "POSIX locks are not ours"
        );
        assert_eq!(holder_pid(locks, dev, 7), None);
    }

    #[test]
    fn a_timed_out_lock_names_the_live_holder() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let _held = sd.lock("G", Duration::from_secs(1), "container a").unwrap();
        // A stale name in the file (a holder that is gone) is not believed.
        std::fs::write(sd.lock_path("G"), "pid 1 (container gone)\n").unwrap();
        let err = match sd.lock("G", Duration::from_millis(50), "container b") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("lock taken twice"),
        };
        let me = std::process::id();
        assert!(err.contains(&format!("held by pid {me} (")), "{err}");
        assert!(!err.contains("gc"), "{err}");
    }

    #[test]
    fn lock_timeout_names_holder() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let _held = sd
            .lock("G", Duration::from_secs(1), "container first")
            .unwrap();
        // A second open file description conflicts with the first, even in one process.
        let err = sd
            .lock("G", Duration::from_millis(100), "container second")
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("container first"), "{msg}");
        assert!(msg.contains("timed out"), "{msg}");
    }
}
