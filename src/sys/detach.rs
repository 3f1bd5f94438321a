//! Children that outlive their launcher: a session of their own, and none of its descriptors.

use std::os::unix::process::CommandExt;
use std::process::Command;

use libc::CLOSE_RANGE_CLOEXEC;

/// Arranges for `cmd` to start in a session of its own with every inherited descriptor above
/// stderr closed on exec: a helper that outlives the hook which starts it (the reaper) holds
/// none of the runtime's pipes. The caller sets stdio.
pub fn detached(cmd: &mut Command) {
    // SAFETY: pre_exec's closure runs in the forked child, where only async-signal-safe calls
    // are allowed (another thread may have held a lock at the fork). This one only makes two
    // raw system calls (setsid, close_range); it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            close_inherited_on_exec();
            Ok(())
        });
    }
}

/// Marks every descriptor above 2 close-on-exec, so that a long-lived child holds none of the
/// pipes its launcher was given (runc waits for a hook's stdout and stderr to close).
pub(super) fn close_inherited_on_exec() {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC takes integers only, reads no memory and
    // closes nothing now (it only sets the close-on-exec flag, so no descriptor this process
    // still uses goes away before exec); an older kernel returns ENOSYS and changes nothing.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}
