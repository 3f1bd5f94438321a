//! Lock files in gpushare's own directories: opened (made 0600 when missing) without following
//! a link, and locked with `flock`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Opens (creating, 0600) a lock file, never following a link there.
///
/// # Errors
/// The open's error.
pub fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Takes `path`'s lock, waiting at most `wait`; `None` when it could not be had (or the file
/// not opened) by then. The lock goes with the returned file.
pub fn lock_within(path: &Path, wait: Duration) -> Option<File> {
    let file = open(path).ok()?;
    let end = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_waited_for_then_given_up() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x.lock");
        let held = lock_within(&p, Duration::ZERO).expect("a free lock is had at once");
        let t0 = Instant::now();
        assert!(
            lock_within(&p, Duration::from_millis(50)).is_none(),
            "held elsewhere"
        );
        assert!(t0.elapsed() >= Duration::from_millis(50), "waited for it");
        drop(held);
        assert!(lock_within(&p, Duration::ZERO).is_some(), "free again");
        std::os::unix::fs::symlink(&p, t.path().join("link.lock")).unwrap();
        assert!(
            open(&t.path().join("link.lock")).is_err(),
            "no link followed"
        );
    }
}
