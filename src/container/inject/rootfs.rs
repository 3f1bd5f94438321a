//! Resolving untrusted paths inside a container's root filesystem.
//!
//! Every lookup goes through `openat2(2)` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` on a
//! descriptor of the root, so a symlink in the image (absolute, `../../..`, looping) can never
//! lead outside it. Missing components are created one at a time on the descriptor of their
//! (already resolved) parent.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};

/// Largest image file read by [`read_image_file`].
pub const MAX_IMAGE_FILE: u64 = 64 * 1024;

/// What a mount target must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

/// A target path inside the root, split ahead of time so that resolving it allocates nothing.
#[derive(Debug, Clone)]
pub struct Target {
    /// `a`, `a/b`, `a/b/c` for `/a/b/c`.
    prefixes: Vec<CString>,
    /// `a`, `b`, `c`.
    names: Vec<CString>,
    kind: Kind,
}

/// A step of [`ensure_target`] that failed, with its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Resolve,
    Create,
    /// The object exists but is not of the wanted kind.
    Kind,
}

impl Target {
    /// Splits an absolute, normal container path (`/tmp/nvidia-mps`).
    ///
    /// # Panics
    /// On a path with `..`, `.`, NUL bytes or no components: targets are gpushare constants.
    pub fn new(path: &str, kind: Kind) -> Self {
        let mut prefixes = Vec::new();
        let mut names = Vec::new();
        let mut acc = String::new();
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            assert!(comp != ".." && comp != ".", "target {path} is not normal");
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(comp);
            prefixes.push(CString::new(acc.clone()).expect("no NUL in target"));
            names.push(CString::new(comp).expect("no NUL in target"));
        }
        assert!(!names.is_empty(), "empty target");
        Self {
            prefixes,
            names,
            kind,
        }
    }
}

fn how(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

/// Opens `path` (relative to the root) as an `O_PATH` descriptor, resolved inside `root`.
///
/// # Errors
/// The errno of `openat2`.
pub fn open_in_root(root: impl AsFd, path: &CStr, flags: OFlag) -> nix::Result<OwnedFd> {
    openat2(root, path, how(OFlag::O_PATH | flags))
}

fn kind_ok(fd: &OwnedFd, want: Kind) -> nix::Result<bool> {
    let st = fstat(fd)?;
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    Ok(match want {
        Kind::Dir => fmt == SFlag::S_IFDIR,
        Kind::File => fmt == SFlag::S_IFREG,
    })
}

/// Resolves `target` inside `root`, creating missing directories (mode 0755) and, for a file
/// target, a missing empty file (mode 0644). Returns an `O_PATH` descriptor of the target,
/// which must be a directory or a regular file as asked.
///
/// # Errors
/// The failed step and its errno.
pub fn ensure_target(root: &OwnedFd, target: &Target) -> Result<OwnedFd, (Step, Errno)> {
    let last = target.prefixes.len() - 1;
    // Most targets exist already (the image's, or made by an earlier bind): resolved whole,
    // as the walk below would resolve them, in one call. Anything else takes the walk, which
    // makes what is missing and names the step that failed.
    if let Ok(fd) = open_in_root(root, &target.prefixes[last], OFlag::empty()) {
        if kind_ok(&fd, target.kind) == Ok(true) {
            return Ok(fd);
        }
    }
    let mut parent: Option<OwnedFd> = None;
    for (i, prefix) in target.prefixes.iter().enumerate() {
        let want = if i < last { Kind::Dir } else { target.kind };
        let fd = match open_in_root(root, prefix, OFlag::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                let dir = parent.as_ref().unwrap_or(root);
                let name = target.names[i].as_c_str();
                let made = match want {
                    Kind::Dir => mkdirat(dir, name, Mode::from_bits_truncate(0o755)),
                    Kind::File => nix::fcntl::openat(
                        dir,
                        name,
                        OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_WRONLY
                            | OFlag::O_NOFOLLOW
                            | OFlag::O_CLOEXEC,
                        Mode::from_bits_truncate(0o644),
                    )
                    .map(drop),
                };
                match made {
                    // Made meanwhile by someone else (another hook, the container itself): it
                    // is resolved inside the root again and its kind checked below.
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err((Step::Create, e)),
                }
                open_in_root(root, prefix, OFlag::empty()).map_err(|e| (Step::Resolve, e))?
            }
            Err(e) => return Err((Step::Resolve, e)),
        };
        match kind_ok(&fd, want) {
            Ok(true) => {}
            Ok(false) => {
                let e = if want == Kind::Dir {
                    Errno::ENOTDIR
                } else {
                    Errno::EINVAL
                };
                return Err((Step::Kind, e));
            }
            Err(e) => return Err((Step::Kind, e)),
        }
        parent = Some(fd);
    }
    Ok(parent.expect("at least one component"))
}

/// Opens the root directory itself (an absolute host path from the engine, not the image).
///
/// # Errors
/// The errno of `open`.
pub fn open_root(path: &CStr) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Reads a regular file of the image (at most [`MAX_IMAGE_FILE`] bytes), resolved inside the
/// root. `None` when it does not exist. The file is first opened `O_PATH`, checked to be a
/// regular file (never a fifo or device node), then reopened for reading through its
/// descriptor.
///
/// # Errors
/// An I/O error naming what was wrong.
pub fn read_image_file(rootfs: &Path, path: &str) -> std::io::Result<Option<Vec<u8>>> {
    read_image_file_max(rootfs, path, MAX_IMAGE_FILE)
}

/// [`read_image_file`] with another size cap (`max` bytes).
///
/// # Errors
/// An I/O error naming what was wrong.
pub fn read_image_file_max(
    rootfs: &Path,
    path: &str,
    max: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    let Some(fd) = open_image_path(rootfs, path)? else {
        return Ok(None);
    };
    if !kind_ok(&fd, Kind::File)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let f = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))?;
    crate::vocab::read_capped(f, max)?.map(Some).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        )
    })
}

/// Whether `path` is a regular file of the image (resolved inside the root; a missing path or
/// one that is a directory or device is `false`).
///
/// # Errors
/// An I/O error other than a missing path.
pub fn image_file_exists(rootfs: &Path, path: &str) -> std::io::Result<bool> {
    match open_image_path(rootfs, path) {
        Ok(Some(fd)) => Ok(kind_ok(&fd, Kind::File)?),
        Ok(None) => Ok(false),
        // A file on a directory's place along the path (`/lib64` a file): not there either.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `O_PATH` descriptor of `path` resolved inside the root `rootfs`; `None` when missing.
fn open_image_path(rootfs: &Path, path: &str) -> std::io::Result<Option<OwnedFd>> {
    use std::os::unix::ffi::OsStrExt;
    let root_c = CString::new(rootfs.as_os_str().as_bytes())?;
    let root = open_root(&root_c)?;
    let rel = CString::new(path.trim_start_matches('/'))?;
    match open_in_root(&root, &rel, OFlag::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root_of(dir: &Path) -> OwnedFd {
        use std::os::unix::ffi::OsStrExt;
        open_root(&CString::new(dir.as_os_str().as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn creates_missing_targets_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("rootfs");
        std::fs::create_dir(&root).unwrap();
        let r = root_of(&root);
        ensure_target(&r, &Target::new("/tmp/nvidia-mps", Kind::Dir)).unwrap();
        assert!(root.join("tmp/nvidia-mps").is_dir());
        ensure_target(&r, &Target::new("/etc/ld.so.preload", Kind::File)).unwrap();
        assert!(root.join("etc/ld.so.preload").is_file());
        // Idempotent.
        ensure_target(&r, &Target::new("/tmp/nvidia-mps", Kind::Dir)).unwrap();
    }

    #[test]
    fn an_existing_target_is_the_file_the_root_resolves_it_to() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("rootfs");
        std::fs::create_dir_all(root.join("opt/usr/local/gpushare")).unwrap();
        std::fs::write(root.join("opt/usr/local/gpushare/limits"), b"").unwrap();
        // An absolute link in the image: resolved inside the root, not on the host.
        symlink("/opt/usr", root.join("usr")).unwrap();
        let r = root_of(&root);
        let fd = ensure_target(&r, &Target::new("/usr/local/gpushare/limits", Kind::File)).unwrap();
        let want = std::fs::metadata(root.join("opt/usr/local/gpushare/limits")).unwrap();
        let got = fstat(&fd).unwrap();
        assert_eq!((got.st_dev, got.st_ino), (want.dev(), want.ino()));
        // The same directory asked as a file, or the file as a directory: refused, not made.
        let dir = Target::new("/usr/local/gpushare", Kind::File);
        assert_eq!(ensure_target(&r, &dir).unwrap_err().0, Step::Kind);
        let file = Target::new("/usr/local/gpushare/limits", Kind::Dir);
        assert_eq!(ensure_target(&r, &file).unwrap_err().0, Step::Kind);
        assert!(!root.join("usr/local/gpushare/limits").is_dir());
    }

    #[test]
    fn symlinks_never_leave_the_root() {
        // Rows: (description, link path in rootfs, link target, container target, kind).
        let rows: &[(&str, &str, &str, &str, Kind)] = &[
            ("absolute dir", "tmp", "HOST", "/tmp/nvidia-mps", Kind::Dir),
            (
                "relative climb",
                "tmp",
                "../../../../../../HOST",
                "/tmp/nvidia-mps",
                Kind::Dir,
            ),
            (
                "absolute file",
                "etc/ld.so.preload",
                "HOST/preload",
                "/etc/ld.so.preload",
                Kind::File,
            ),
            (
                "final dir",
                "tmp/nvidia-mps",
                "HOST",
                "/tmp/nvidia-mps",
                Kind::Dir,
            ),
            (
                "parent of parent",
                "usr",
                "HOST",
                "/usr/local/gpushare/shared",
                Kind::Dir,
            ),
        ];
        for (what, link, to, target, kind) in rows {
            let t = tempfile::tempdir().unwrap();
            let host = t.path().join("host");
            std::fs::create_dir(&host).unwrap();
            std::fs::write(host.join("marker"), b"m").unwrap();
            let root = t.path().join("rootfs");
            std::fs::create_dir_all(root.join("etc")).unwrap();
            std::fs::create_dir_all(root.join("tmp")).unwrap();
            let lp = root.join(link);
            let _ = std::fs::remove_dir(&lp);
            let to = to.replace("HOST", &host.to_string_lossy());
            symlink(&to, &lp).unwrap();
            let r = root_of(&root);
            let _ = ensure_target(&r, &Target::new(target, *kind));
            let entries: Vec<_> = std::fs::read_dir(&host)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(entries, vec![std::ffi::OsString::from("marker")], "{what}");
        }
    }

    #[test]
    fn loops_and_wrong_kinds_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("rootfs");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        symlink("/tmp/loop", root.join("tmp/loop")).unwrap();
        std::fs::write(root.join("tmp/file"), b"").unwrap();
        let r = root_of(&root);
        assert!(ensure_target(&r, &Target::new("/tmp/loop/x", Kind::Dir)).is_err());
        assert_eq!(
            ensure_target(&r, &Target::new("/tmp/file", Kind::Dir))
                .unwrap_err()
                .0,
            Step::Kind
        );
        nix::unistd::mkfifo(&root.join("tmp/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        assert_eq!(
            ensure_target(&r, &Target::new("/tmp/fifo", Kind::File))
                .unwrap_err()
                .0,
            Step::Kind
        );
        assert!(read_image_file(&root, "/tmp/fifo").is_err());
        assert!(read_image_file(&root, "/nope").unwrap().is_none());
    }
}
