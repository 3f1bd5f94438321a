//! The only module with `unsafe`: process set-up between fork and exec.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// Arranges for `cmd` to start in a new session and a private mount namespace of its own in
/// which `shm` (a host tmpfs) is bind-mounted on `/dev/shm`, with every inherited descriptor
/// above stderr closed on exec. The caller sets stdio and env.
///
/// # Errors
/// When `shm` cannot be turned into a C string.
pub fn daemon_in_own_mount_ns(cmd: &mut Command, shm: &Path) -> std::io::Result<()> {
    let shm = CString::new(shm.as_os_str().as_bytes())?;
    let dev_shm = CString::new("/dev/shm").expect("no NUL");
    let root = CString::new("/").expect("no NUL");
    // SAFETY: the closure runs in the forked child before exec. It only makes raw system calls
    // (setsid, unshare, mount, close_range) on data prepared before the fork; it allocates
    // nothing and takes no locks, so it is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            unshare(CloneFlags::CLONE_NEWNS)?;
            mount(
                None::<&std::ffi::CStr>,
                root.as_c_str(),
                None::<&std::ffi::CStr>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&std::ffi::CStr>,
            )?;
            mount(
                Some(shm.as_c_str()),
                dev_shm.as_c_str(),
                None::<&std::ffi::CStr>,
                MsFlags::MS_BIND,
                None::<&std::ffi::CStr>,
            )?;
            close_inherited_on_exec();
            Ok(())
        });
    }
    Ok(())
}

/// Marks every descriptor above 2 close-on-exec, so that a long-lived child holds none of the
/// pipes its launcher was given (runc waits for a hook's stdout and stderr to close).
fn close_inherited_on_exec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes descriptor flags; an unsupported kernel returns ENOSYS,
    // which leaves the descriptors as they are.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// Mount attribute: read-only (`MOUNT_ATTR_RDONLY`).
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// Mount attribute: no set-uid (`MOUNT_ATTR_NOSUID`).
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// Mount attribute: no device nodes (`MOUNT_ATTR_NODEV`).
pub const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `open_tree(2)` with `OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE`: a detached copy of
/// the mount tree at `path` (a host path), which can later be attached in another mount
/// namespace with [`move_mount_onto`]. `attrs` (`MOUNT_ATTR_*`) are set on the copy.
///
/// # Errors
/// The system call's errno.
pub fn clone_tree(path: &std::ffi::CStr, attrs: u64) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        )
    };
    let fd = nix::errno::Errno::result(fd)? as libc::c_int;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    if attrs != 0 {
        #[repr(C)]
        struct MountAttr {
            attr_set: u64,
            attr_clr: u64,
            propagation: u64,
            userns_fd: u64,
        }
        let attr = MountAttr {
            attr_set: attrs,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        use std::os::fd::AsRawFd;
        const AT_RECURSIVE_ATTR: libc::c_uint = 0x8000;
        // SAFETY: the empty path is a valid C string, `attr` lives across the call and its size
        // is passed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                fd.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE_ATTR,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        nix::errno::Errno::result(r)?;
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
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: both descriptors are open for the call; the empty paths are valid C strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// Runs `work` in a forked, single-threaded child (so that it may `setns` into a mount
/// namespace) and returns the code it ends with: `Ok(())` for 0, `Err(code)` otherwise (a
/// child killed by a signal gives `Err(-signal)`).
///
/// # Errors
/// `fork` or `waitpid` failing, as an errno.
///
/// # Safety
/// `work` must be async-signal-safe: it runs after `fork` in a possibly multi-threaded program,
/// so it must not allocate, lock or log — only make system calls on data prepared before.
pub unsafe fn in_forked_child(work: impl FnOnce() -> i32) -> nix::Result<Result<(), i32>> {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the child only runs `work`, which the caller guarantees is async-signal-safe
    // (this function's safety contract), and then leaves with `_exit`, running no destructors
    // or atexit handlers.
    match unsafe { fork() }? {
        ForkResult::Child => {
            let code = work();
            // SAFETY: `_exit` is async-signal-safe and ends the child at once.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => loop {
            match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => return Ok(Ok(())),
                Ok(WaitStatus::Exited(_, c)) => return Ok(Err(c)),
                Ok(WaitStatus::Signaled(_, s, _)) => return Ok(Err(-(s as i32))),
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e),
            }
        },
    }
}

/// Detaches the mount whose root `fd` (an `O_PATH` descriptor) is open on, through
/// `/proc/self/fd/<fd>`. Allocation-free, so it may be used in a forked child.
///
/// # Errors
/// The system call's errno.
pub fn umount_fd_detach(fd: std::os::fd::BorrowedFd<'_>) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut n = fd.as_raw_fd() as u32;
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
    // buf stays NUL-terminated: at most 14 + 10 bytes of 32 are written.
    // SAFETY: `buf` is a NUL-terminated path that lives across the call.
    let r = unsafe { libc::umount2(buf.as_ptr().cast(), libc::MNT_DETACH) };
    nix::errno::Errno::result(r).map(drop)
}

/// Arranges for `cmd` to start in a session of its own, with inherited descriptors above
/// stderr closed on exec, and to be killed by `SIGALRM` after `seconds` (an alarm survives
/// `exec`): for a helper that is not waited for.
pub fn detached_with_deadline(cmd: &mut Command, seconds: u32) {
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (setsid, alarm, close_range) on no shared data.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            libc::alarm(seconds);
            close_inherited_on_exec();
            Ok(())
        });
    }
}
