//! Process descriptors: naming a process so that a reused pid is never signalled by mistake.

/// `pidfd_open(2)`: a descriptor that refers to the process `pid` is now, and to no other
/// process later, whatever reuses the pid.
///
/// # Errors
/// The system call's errno (`ESRCH` when there is no such process).
pub fn pidfd_open(pid: i32) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open(2) takes two integers and reads or writes no memory of this process;
    // its result is checked before it is used as a descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = nix::errno::Errno::result(fd)?;
    // SAFETY: pidfd_open returned a new descriptor (checked above) that nothing else owns, so
    // the OwnedFd is its only owner and closes it once.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `pidfd_send_signal(2)`: sends `signal` to the process `pidfd` refers to.
///
/// # Errors
/// The system call's errno (`ESRCH` when it has exited).
pub fn pidfd_send_signal(pidfd: &std::os::fd::OwnedFd, signal: libc::c_int) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `pidfd` is borrowed, so it stays open across the call; with a NULL `info`
    // pidfd_send_signal(2) reads no memory (the kernel fills the siginfo in itself).
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}
