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

/// Arranges for `cmd` to start in a new session with inherited descriptors closed on exec.
pub fn detached(cmd: &mut Command) {
    // SAFETY: runs between fork and exec, makes only async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            close_inherited_on_exec();
            Ok(())
        });
    }
}
