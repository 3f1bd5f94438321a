//! [`super::libc::check`] with the image's `libc.so.6` read and parsed once per file, not on
//! every capped create: the glibc release found in it is kept in the state directory
//! (`cache/libc/<dev>-<ino>`), under the file's identity as `fstat` gives it on the descriptor
//! that is read (device, inode, size, modification and change times). Any write to the file
//! changes its change time, so a changed file is read again; images that share a layer share
//! the file (overlayfs reports a lower file's own device and inode), so one read serves them
//! all. The loaders and glibc's companion libraries are looked for on every call, as
//! [`super::libc::inspect`] does: those are existence checks, not reads.
//!
//! The cache is host-only (in the 0700 state directory). A cache that cannot be read or
//! written is passed over: the file is then read as without it.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, SFlag};

use super::libc::{glibc_release, judge, Found, GlibcVersion, LibcError};
use super::rootfs;
use crate::host::state::StateDir;

/// Largest `libc.so.6` read (as [`super::libc`] reads it).
const MAX_LIBC: u64 = 32 * 1024 * 1024;

/// [`inspect`] then [`judge`].
///
/// # Errors
/// [`LibcError`], the same as [`super::libc::check`] gives for the same image.
pub fn check(sd: &StateDir, rootfs_dir: &Path) -> Result<GlibcVersion, LibcError> {
    judge(&inspect(sd, rootfs_dir)?)
}

/// What deciding found of an image's C library, kept for the injection that follows in the
/// same process: when every answer came from the cache (nothing read that is not stored), the
/// injection judges what was found instead of looking again ([`check_seen`]), one lookup per
/// create instead of two. A first look at an image, which reads `libc.so.6`, is not kept: the
/// injection's own look stores it.
#[derive(Debug, Default)]
pub struct Seen(std::cell::RefCell<Option<(PathBuf, Found)>>);

/// What `rootfs`'s C library is for the limiter, as deciding asks it of a capped `mps` or
/// `timeslice` share ([`crate::decide::enforce::without_limiter`] serves it without the
/// limiter where the driver enforces the cap, and refuses it where only the limiter could):
/// unknown without a root filesystem to look at (a dry run on a bundle without its rootfs; the
/// limiter's own check refuses it later if it cannot load). What it found is kept in `seen`.
pub fn image_fact(
    cfg: &crate::config::Config,
    rootfs: Option<&Path>,
    seen: Option<&Seen>,
) -> crate::decide::enforce::ImageFact {
    use crate::decide::enforce::ImageFact;
    let Some(rootfs) = rootfs.filter(|r| r.is_dir()) else {
        return ImageFact::Unknown;
    };
    // From the cache, as the injection's own check reads it: one read of a given `libc.so.6`
    // serves every create. Only looked up, never written here: deciding writes nothing (a dry
    // run leaves no state); the injection stores what it reads.
    let sd = crate::host::state::StateDir::new(&cfg.state_dir);
    let mut read = false;
    let judged = inspect_as(&sd, rootfs, false, &mut read).and_then(|found| {
        let v = judge(&found);
        if let Some(s) = seen.filter(|_| !read) {
            *s.0.borrow_mut() = Some((rootfs.to_owned(), found));
        }
        v
    });
    match judged {
        Ok(_) => ImageFact::Loads,
        Err(e) => ImageFact::Cannot {
            libc: e.to_string(),
            advice: super::libc::advice_for_cap(cfg),
        },
    }
}

/// [`check`], or the judgement of what [`image_fact`] kept in `seen` of this very root.
///
/// # Errors
/// [`LibcError`], as [`check`].
pub fn check_seen(
    sd: &StateDir,
    rootfs_dir: &Path,
    seen: Option<&Seen>,
) -> Result<GlibcVersion, LibcError> {
    if let Some((_, found)) = seen
        .and_then(|s| s.0.borrow().clone())
        .filter(|(dir, _)| dir == rootfs_dir)
    {
        return judge(&found);
    }
    check(sd, rootfs_dir)
}

/// What [`super::libc::inspect`] finds, with `libc.so.6`'s release taken from the cache when
/// the file is the one cached.
///
/// # Errors
/// [`LibcError::Read`] for a file that exists but cannot be read.
pub fn inspect(sd: &StateDir, rootfs_dir: &Path) -> Result<Found, LibcError> {
    inspect_as(sd, rootfs_dir, true, &mut false)
}

/// [`inspect`]; with `store` false, a release read from the file is not cached. `read` is set
/// when a file was read (not answered from the cache).
fn inspect_as(
    sd: &StateDir,
    rootfs_dir: &Path,
    store: bool,
    read: &mut bool,
) -> Result<Found, LibcError> {
    super::libc::inspect_with(rootfs_dir, |path| {
        release_of(sd, rootfs_dir, path, store, read)
            .map_err(|source| LibcError::Read { path, source })
    })
}

/// The glibc release of the image's regular file `path` (`Some(None)`: not glibc's; `None`:
/// gone meanwhile), from the cache when it holds this very file, else read and then cached.
fn release_of(
    sd: &StateDir,
    rootfs_dir: &Path,
    path: &str,
    keep: bool,
    read: &mut bool,
) -> std::io::Result<Option<Option<GlibcVersion>>> {
    let root = rootfs::open_root(&CString::new(rootfs_dir.as_os_str().as_bytes())?)?;
    let rel = CString::new(path.trim_start_matches('/'))?;
    let fd = match rootfs::open_in_root(&root, &rel, OFlag::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = fstat(fd.as_fd())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let key = Key::of(&st);
    let entry = entry_path(sd, &key);
    if let Some(cached) = lookup(&entry, &key) {
        return Ok(Some(cached));
    }
    // Identity taken before the read: a write during it changes the change time, so what is
    // stored under this identity is never looked up again.
    let f = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let bytes = crate::vocab::read_capped(f, MAX_LIBC)?.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_LIBC} bytes"),
        )
    })?;
    let release = glibc_release(&bytes);
    *read = true;
    if keep {
        store(&entry, &key, release);
    }
    Ok(Some(release))
}

/// A file's identity: what must all be unchanged for a cached answer to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Key {
    fn of(st: &FileStat) -> Self {
        Self {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    /// The entry's first fields (the rest is the answer).
    fn stamp(&self) -> String {
        format!(
            "{} {}.{:09} {}.{:09}",
            self.size, self.mtime.0, self.mtime.1, self.ctime.0, self.ctime.1
        )
    }
}

/// `<state>/cache/libc`.
pub fn cache_dir(sd: &StateDir) -> PathBuf {
    sd.root().join("cache").join("libc")
}

fn entry_path(sd: &StateDir, key: &Key) -> PathBuf {
    cache_dir(sd).join(format!("{}-{}", key.dev, key.ino))
}

/// The cached release when the entry names this very file (`Some(None)`: not glibc's).
fn lookup(entry: &Path, key: &Key) -> Option<Option<GlibcVersion>> {
    let text = std::fs::read_to_string(entry).ok()?;
    let answer = text
        .trim_end()
        .strip_prefix(&key.stamp())?
        .strip_prefix(' ')?;
    if answer == "none" {
        return Some(None);
    }
    let (major, minor) = answer.split_once('.')?;
    Some(Some(GlibcVersion {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    }))
}

/// Stores an answer; best effort (a cache that cannot be written only costs a later read).
fn store(entry: &Path, key: &Key, release: Option<GlibcVersion>) {
    let answer = release.map_or_else(|| "none".to_owned(), |v| v.to_string());
    let Some(dir) = entry.parent() else {
        return;
    };
    use std::os::unix::fs::DirBuilderExt;
    if std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
        .is_err()
    {
        return;
    }
    let text = format!("{} {answer}\n", key.stamp());
    if let Err(e) = crate::host::state::write_atomic(entry, text.as_bytes(), 0o600) {
        tracing::debug!(
            "cannot cache the C library's release in {}: {e}",
            entry.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An image with the node's own glibc files (the loader, libc.so.6 and its companions).
    fn image(dir: &Path) -> PathBuf {
        let root = dir.join("rootfs");
        for (host, inside) in [
            ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
            (
                "/lib/x86_64-linux-gnu/libc.so.6",
                "lib/x86_64-linux-gnu/libc.so.6",
            ),
            (
                "/lib/x86_64-linux-gnu/libpthread.so.0",
                "lib/x86_64-linux-gnu/libpthread.so.0",
            ),
            (
                "/lib/x86_64-linux-gnu/libdl.so.2",
                "lib/x86_64-linux-gnu/libdl.so.2",
            ),
        ] {
            let to = root.join(inside);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(host, to).unwrap();
        }
        root
    }

    fn entries(sd: &StateDir) -> Vec<PathBuf> {
        std::fs::read_dir(cache_dir(sd))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn answers_as_the_uncached_check_and_caches_once() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("state"));
        let root = image(dir.path());
        let uncached = super::super::libc::inspect(&root).unwrap();
        assert!(
            matches!(uncached.libc, Some((_, Some(_)))),
            "positive control: the node's glibc is found: {uncached:?}"
        );
        assert_eq!(inspect(&sd, &root).unwrap(), uncached, "first call reads");
        assert_eq!(entries(&sd).len(), 1, "one entry for one libc.so.6");
        assert_eq!(inspect(&sd, &root).unwrap(), uncached, "second call hits");
        assert_eq!(
            check(&sd, &root).unwrap(),
            super::super::libc::check(&root).unwrap()
        );
    }

    #[test]
    fn what_deciding_found_in_the_cache_serves_the_injection() {
        use crate::decide::enforce::ImageFact;
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config {
            state_dir: dir.path().join("state"),
            ..crate::config::Config::default()
        };
        let sd = StateDir::new(&cfg.state_dir);
        let root = image(dir.path());
        // A first look reads libc.so.6: not kept, so that the injection's look stores it.
        let seen = Seen::default();
        assert_eq!(image_fact(&cfg, Some(&root), Some(&seen)), ImageFact::Loads);
        assert!(seen.0.borrow().is_none());
        check_seen(&sd, &root, Some(&seen)).unwrap();
        assert_eq!(entries(&sd).len(), 1, "the injection stored it");
        // From the cache: kept, and judged by the injection without a second look (a look
        // would see the companion removed after deciding).
        let seen = Seen::default();
        assert_eq!(image_fact(&cfg, Some(&root), Some(&seen)), ImageFact::Loads);
        std::fs::remove_file(root.join("lib/x86_64-linux-gnu/libdl.so.2")).unwrap();
        check_seen(&sd, &root, Some(&seen)).unwrap();
        // Positive control: a look sees it; and what was seen of one root serves no other.
        assert!(matches!(
            check_seen(&sd, &root, None),
            Err(LibcError::Incomplete { .. })
        ));
        let other = image(&dir.path().join("other"));
        std::fs::remove_file(other.join("lib/x86_64-linux-gnu/libdl.so.2")).unwrap();
        assert!(matches!(
            check_seen(&sd, &other, Some(&seen)),
            Err(LibcError::Incomplete { .. })
        ));
    }

    #[test]
    fn a_hit_does_not_read_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("state"));
        let root = image(dir.path());
        let v = check(&sd, &root).unwrap();
        // Doctor the entry: a hit answers what the entry says, which shows the file was not
        // read again.
        let entry = entries(&sd).pop().unwrap();
        let text = std::fs::read_to_string(&entry).unwrap();
        let doctored = text.replace(&format!(" {v}\n"), " 2.99\n");
        assert_ne!(doctored, text, "entry holds the release: {text}");
        std::fs::write(&entry, doctored).unwrap();
        assert_eq!(
            check(&sd, &root).unwrap(),
            GlibcVersion {
                major: 2,
                minor: 99
            }
        );
    }

    #[test]
    fn a_changed_file_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("state"));
        let root = image(dir.path());
        let libc = root.join("lib/x86_64-linux-gnu/libc.so.6");
        check(&sd, &root).unwrap();
        // The same file (same inode) rewritten in place with something that is not glibc.
        std::thread::sleep(Duration::from_millis(20));
        let len = std::fs::metadata(&libc).unwrap().len() as usize;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&libc)
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(&vec![0u8; len])
            })
            .unwrap();
        let found = inspect(&sd, &root).unwrap();
        assert_eq!(
            found.libc,
            Some(("/lib/x86_64-linux-gnu/libc.so.6".into(), None)),
            "the stale answer was not used"
        );
        assert!(matches!(check(&sd, &root), Err(LibcError::NotGlibc { .. })));
        assert_eq!(
            inspect(&sd, &root).unwrap(),
            super::super::libc::inspect(&root).unwrap()
        );
    }

    #[test]
    fn a_replaced_file_is_read_again_and_missing_pieces_are_seen_on_a_hit() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("state"));
        let root = image(dir.path());
        check(&sd, &root).unwrap();
        // A companion removed after the release was cached: still reported.
        std::fs::remove_file(root.join("lib/x86_64-linux-gnu/libdl.so.2")).unwrap();
        assert!(matches!(
            check(&sd, &root),
            Err(LibcError::Incomplete { .. })
        ));
        // libc.so.6 replaced by another file (new inode).
        let libc = root.join("lib/x86_64-linux-gnu/libc.so.6");
        std::fs::remove_file(&libc).unwrap();
        std::fs::write(&libc, b"not an ELF").unwrap();
        assert!(matches!(check(&sd, &root), Err(LibcError::NotGlibc { .. })));
    }

    #[test]
    fn an_unwritable_cache_still_answers() {
        let dir = tempfile::tempdir().unwrap();
        // The state "directory" is a file: nothing can be cached under it.
        std::fs::write(dir.path().join("state"), b"").unwrap();
        let sd = StateDir::new(dir.path().join("state"));
        let root = image(dir.path());
        assert_eq!(
            check(&sd, &root).unwrap(),
            super::super::libc::check(&root).unwrap()
        );
    }

    #[test]
    fn an_image_without_libc_is_judged_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("state"));
        let root = dir.path().join("empty");
        std::fs::create_dir_all(&root).unwrap();
        assert!(matches!(check(&sd, &root), Err(LibcError::NoLibc)));
        assert!(entries(&sd).is_empty());
    }
}
