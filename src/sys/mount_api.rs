//! Linux's mount API (open_tree, mount_setattr, move_mount; Linux 5.12) and `statx`, as raw
//! system calls: the glibc the binaries target (2.17) has no wrappers. Every function here makes
//! only system calls on memory it is given, so it may run in a forked child before exec.

use std::ffi::CStr;

use libc::{MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH, OPEN_TREE_CLOEXEC, OPEN_TREE_CLONE};

/// Mount attributes (`MOUNT_ATTR_*` of `linux/mount.h`), as `libc` exports them.
pub use libc::{
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NOSYMFOLLOW,
    MOUNT_ATTR_RDONLY,
};

/// Whether `path` (a symlink is not followed) is the root of a mount, as `statx` says
/// (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8); `None` when it cannot say.
pub fn is_mount_root(path: &CStr) -> Option<bool> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // The raw system call, not glibc's `statx` wrapper (glibc 2.28): the binaries are built
    // for glibc 2.17 (.cargo/config.toml).
    // SAFETY: `path` is a valid C string and `stx` a writable buffer of the right type, both
    // living across the call; the arguments are those of statx(2).
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0u32,
            &mut stx as *mut libc::statx,
        )
    };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (r == 0 && stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0)
}

/// `/proc/self/fd/<fd>` written into `buf`, without allocating.
fn proc_fd_path(fd: libc::c_int, buf: &mut [u8; 32]) -> &CStr {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut n = fd.max(0) as u32;
    let mut digits = [0u8; 10];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[prefix.len() + i] = digits[len - 1 - i];
    }
    buf[prefix.len() + len] = 0;
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/")
}

pub(super) const AT_RECURSIVE: libc::c_uint = libc::AT_RECURSIVE as libc::c_uint;

/// `open_tree(2)`; returns the raw descriptor. Makes only the system call.
pub(super) fn open_tree_raw(
    dirfd: libc::c_int,
    path: &CStr,
    flags: libc::c_uint,
) -> nix::Result<libc::c_int> {
    // SAFETY: open_tree(2) reads the NUL-terminated `path`, borrowed across the call, and
    // writes no memory; the descriptor it returns is checked before use.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) };
    nix::errno::Errno::result(fd).map(|fd| fd as libc::c_int)
}

/// `mount_setattr(2)` setting `set` and clearing `clr`. Makes only the system call.
pub(super) fn set_attrs(
    dirfd: libc::c_int,
    path: &CStr,
    flags: libc::c_uint,
    set: u64,
    clr: u64,
) -> nix::Result<()> {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) reads the NUL-terminated `path` and `size_of::<mount_attr>()`
    // bytes at `attr`, both borrowed across the call (`attr` is libc's copy of the kernel's
    // struct), and writes no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// `move_mount(2)` of the detached tree `tree` onto the path `target`. Makes only the system
/// call.
pub(super) fn move_mount_raw(tree: libc::c_int, target: &CStr) -> nix::Result<()> {
    move_mount_at(tree, libc::AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)
}

/// `move_mount(2)` of the detached tree `tree` onto `to_path` relative to `to_dirfd` (with
/// `MOVE_MOUNT_T_EMPTY_PATH` in `flags`: onto what `to_dirfd` is open on). Makes only the
/// system call.
fn move_mount_at(
    tree: libc::c_int,
    to_dirfd: libc::c_int,
    to_path: &CStr,
    flags: libc::c_uint,
) -> nix::Result<()> {
    // SAFETY: move_mount(2) reads two NUL-terminated paths (a static empty one and `to_path`,
    // borrowed across the call) and writes no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            to_dirfd,
            to_path.as_ptr(),
            flags,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// A system call that failed: its name, the flags it was given and the errno (what libpathrs'
/// errors carry). The path it was given is named by the caller's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call}(flags {flags:#x}) failed")]
pub struct SyscallError {
    pub call: &'static str,
    pub flags: u64,
    #[source]
    pub errno: nix::errno::Errno,
}

impl SyscallError {
    /// Whether the same call may succeed if made again (interrupted, or a transient shortage).
    pub fn is_retry(&self) -> bool {
        matches!(
            self.errno,
            nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN
        )
    }
}

/// `open_tree(2)` with `OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE`: a detached copy of
/// the mount tree at `path` (a host path), which can later be attached in another mount
/// namespace with [`move_mount_onto`]. `attrs` (`MOUNT_ATTR_*`) are set on the copy.
///
/// # Errors
/// [`SyscallError`]: `open_tree` or `mount_setattr`, its flags and errno.
pub fn clone_tree(path: &std::ffi::CStr, attrs: u64) -> Result<std::os::fd::OwnedFd, SyscallError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE;
    let fd = open_tree_raw(libc::AT_FDCWD, path, flags).map_err(|errno| SyscallError {
        call: "open_tree",
        flags: u64::from(flags),
        errno,
    })?;
    // SAFETY: open_tree returned a new descriptor (checked above) that nothing else owns, so
    // the OwnedFd is its only owner and closes it once.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    if attrs != 0 {
        set_attrs(
            fd.as_raw_fd(),
            c"",
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            attrs,
            0,
        )
        .map_err(|errno| SyscallError {
            call: "mount_setattr",
            flags: attrs,
            errno,
        })?;
    }
    Ok(fd)
}

/// `move_mount(2)` of the detached tree `tree` onto the object `target` is open on (an
/// `O_PATH` descriptor resolved inside the container's root). Makes only the system call, so it
/// may be used in a forked child.
///
/// # Errors
/// The system call's errno.
pub fn move_mount_onto(
    tree: std::os::fd::BorrowedFd<'_>,
    target: std::os::fd::BorrowedFd<'_>,
) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    move_mount_at(
        tree.as_raw_fd(),
        target.as_raw_fd(),
        c"",
        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
    )
}

/// Detaches the mount whose root `fd` (an `O_PATH` descriptor) is open on, through
/// `/proc/self/fd/<fd>`. Allocation-free, so it may be used in a forked child.
///
/// # Errors
/// The system call's errno.
pub fn umount_fd_detach(fd: std::os::fd::BorrowedFd<'_>) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 32];
    let path = proc_fd_path(fd.as_raw_fd(), &mut buf);
    // SAFETY: umount2(2) reads the NUL-terminated `path` in `buf`, alive across the call, and
    // writes no memory; it detaches the mount `fd` names, which the caller chose to detach.
    let r = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    nix::errno::Errno::result(r).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_clone_names_the_call_its_flags_and_errno() {
        let e = clone_tree(c"/nonexistent/gpushare-clone-source", 0).unwrap_err();
        assert_eq!(e.call, "open_tree");
        assert_eq!(e.errno, nix::errno::Errno::ENOENT);
        assert_eq!(
            e.flags,
            u64::from(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
        );
        assert!(e.to_string().starts_with("open_tree(flags 0x"), "{e}");
        assert!(!e.is_retry());
        let again = SyscallError {
            errno: nix::errno::Errno::EINTR,
            ..e
        };
        assert!(again.is_retry());
    }
}
