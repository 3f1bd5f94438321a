//! Starting a child straight into a cgroup v2 cgroup (`clone3` with `CLONE_INTO_CGROUP`), so that
//! it is never moved there: a write to `cgroup.procs` takes the kernel's cgroup write lock, which
//! waits for an RCU grace period unless another move happened just before (13 ms of an MPS
//! daemon's 16-20 ms start on an idle GPU here); a child born in the cgroup takes only the read
//! side.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Why [`spawn_into_cgroup`] started nothing.
#[derive(Debug)]
pub enum IntoCgroupError {
    /// No child was made: the caller may spawn another way.
    Clone(std::io::Error),
    /// The child failed before or at its exec, and was waited for.
    Child(std::io::Error),
}

/// `CLONE_INTO_CGROUP` (Linux 5.7, `linux/sched.h`).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// [`spawn_into_cgroup`] where this process has one thread (so no other thread can hold a lock
/// at the clone, nor start while this one is in here); `IntoCgroupError::Clone` with
/// `Unsupported` where it has more, for the caller to spawn another way.
///
/// # Errors
/// As [`spawn_into_cgroup`].
pub fn spawn_into_cgroup_if_alone(
    cmd: &mut Command,
    cgroup: BorrowedFd<'_>,
) -> Result<i32, IntoCgroupError> {
    if !single_threaded() {
        return Err(IntoCgroupError::Clone(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this process has another thread",
        )));
    }
    // SAFETY: this process has one thread (checked above), and only that thread could start
    // another: none can hold a lock at the clone.
    unsafe { spawn_into_cgroup(cmd, cgroup) }
}

/// Starts `cmd` (its stdio, environment, directory and `pre_exec` steps, as `Command::spawn`
/// would) as a child of this process born in the cgroup v2 directory `cgroup`, and returns its
/// pid once it has exec'd. The child is this process's to wait for (`SIGCHLD` on exit).
///
/// # Safety
/// No other thread of this process may hold a lock at the call (the C library's allocator's,
/// std's environment lock): the child is made by a raw `clone3`, which skips the C library's
/// fork handlers, and it prepares `cmd` itself (environment, argument arrays) before the exec,
/// where such a lock would be held forever, or the state behind it half-changed.
///
/// # Errors
/// [`IntoCgroupError::Clone`]: no child was made (`ENOSYS` before Linux 5.7; `EINVAL`, `EPERM`,
/// `EBUSY` for a cgroup that cannot take it); [`IntoCgroupError::Child`]: the child's own error
/// before or at its exec, what `Command::spawn` would have returned (the child is waited for).
pub unsafe fn spawn_into_cgroup(
    cmd: &mut Command,
    cgroup: BorrowedFd<'_>,
) -> Result<i32, IntoCgroupError> {
    let (report_read, report_write) = close_on_exec_pipe().map_err(IntoCgroupError::Clone)?;
    // SAFETY: `clone_args` is a plain C struct of integers, for which all zeroes is valid.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup.as_raw_fd() as u64;
    // SAFETY: clone3 reads `args` (alive across the call, its size passed). Without CLONE_VM
    // the child runs on a copy of this process's memory, as after fork(2), from this point; it
    // only execs `cmd` or exits (below). By the caller's contract no other thread holds a lock
    // in that copy.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if pid < 0 {
        return Err(IntoCgroupError::Clone(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // The child: `exec` returns only with what went wrong, which goes to the parent.
        drop(report_read);
        let e = cmd.exec();
        let code = e.raw_os_error().unwrap_or(libc::EIO);
        let mut w = std::fs::File::from(report_write);
        let _ = w.write_all(&code.to_ne_bytes());
        // SAFETY: _exit ends the child at once, running no handler of the parent's copy.
        unsafe { libc::_exit(127) };
    }
    let pid = pid as i32;
    drop(report_write);
    let mut code = [0u8; 4];
    let mut r = std::fs::File::from(report_read);
    match r.read(&mut code) {
        // Closed by the exec: the child runs `cmd`'s program.
        Ok(0) => Ok(pid),
        Ok(_) => {
            let _ = reap(pid);
            Err(IntoCgroupError::Child(std::io::Error::from_raw_os_error(
                i32::from_ne_bytes(code),
            )))
        }
        Err(e) => {
            let _ = reap(pid);
            Err(IntoCgroupError::Child(e))
        }
    }
}

/// Waits for the child `pid` to exit and returns its status (`waitpid`'s, undecoded).
///
/// # Errors
/// `waitpid`'s (`ECHILD`: not this process's child, or already waited for).
pub fn reap(pid: i32) -> std::io::Result<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status to `status`, a live local.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            return Ok(status);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// The status of the child `pid` if it has exited (and is now waited for), else `None`.
pub fn try_reap(pid: i32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid writes the status to `status`, a live local; WNOHANG never blocks.
    (unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid).then_some(status)
}

/// Whether this process has one thread (its `/proc/self/status` says `Threads: 1`).
pub fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .is_some_and(|n| n.trim() == "1")
    })
}

/// A pipe whose two ends close on exec.
fn close_on_exec_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors to `fds`, a live local array of two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened by pipe2 and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::process::Stdio;

    use crate::host::tests::unified_cgroup as unified;

    /// The cgroup v2 directory the helper starts its children in, set by the test that runs it.
    const HELPER_CGROUP: &str = "GPUSHARE_TEST_INTO_CGROUP";

    /// The children [`spawn_into_cgroup`] makes, in a process of its own whose other thread
    /// (the test harness's main one) only waits: its contract wants one running thread.
    #[test]
    #[ignore = "run by spawns_a_child_born_in_the_cgroup as a child process with one test thread"]
    fn helper() {
        let dir = std::env::var_os(HELPER_CGROUP).unwrap_or_else(|| {
            panic!("run by spawns_a_child_born_in_the_cgroup, which sets {HELPER_CGROUP}")
        });
        let cg = std::fs::File::open(&dir).unwrap();
        let mut sleep = Command::new("sleep");
        sleep
            .arg("60")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // The harness's main thread only waits for this test to end (one test,
        // `--test-threads=1`), holding no lock: each call below keeps `spawn_into_cgroup`'s
        // contract.
        // SAFETY: see just above.
        let pid = unsafe { spawn_into_cgroup(&mut sleep, cg.as_fd()) }.unwrap();
        println!("BORN {}", unified(pid).unwrap_or_default());
        // SAFETY: kill(2) takes integers; `pid` is this process's child, not yet waited for.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(reap(pid).is_ok());

        // The child's own errors come back as Command::spawn gives them, the child waited for.
        let mut missing = Command::new("/nonexistent/program");
        // SAFETY: as for the first call.
        let got = unsafe { spawn_into_cgroup(&mut missing, cg.as_fd()) };
        let Err(IntoCgroupError::Child(e)) = got else {
            panic!("a program that is not there was started");
        };
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        let mut refused = Command::new("true");
        // SAFETY: the closure makes no call at all; it only returns an error.
        unsafe {
            refused.pre_exec(|| Err(std::io::Error::from_raw_os_error(libc::EXDEV)));
        }
        // SAFETY: as for the first call.
        let got = unsafe { spawn_into_cgroup(&mut refused, cg.as_fd()) };
        let Err(IntoCgroupError::Child(e)) = got else {
            panic!("a pre_exec step's error was lost");
        };
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
        // No child is left to wait for.
        let mut status = 0;
        // SAFETY: waitpid writes to `status`, a live local; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        assert_eq!(r, -1, "a child was left unwaited for");
        println!("HELPER OK");
    }

    /// With another thread in the process, nothing is cloned: the caller spawns another way.
    #[test]
    fn a_process_with_another_thread_is_told_to_spawn_another_way() {
        assert!(
            !single_threaded(),
            "positive control: the harness runs tests on a thread"
        );
        let dir = std::fs::File::open("/").unwrap();
        let mut never = Command::new("/nonexistent/program");
        let Err(IntoCgroupError::Clone(e)) = spawn_into_cgroup_if_alone(&mut never, dir.as_fd())
        else {
            panic!("cloned with another thread running");
        };
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    }

    /// A child is born in the cgroup it is given, never moved there, and its errors reach the
    /// caller.
    #[test]
    fn spawns_a_child_born_in_the_cgroup() {
        let Some(own) = crate::host::tests::OwnCgroup::new("the clone3 cgroup test", "into") else {
            return;
        };
        let cg = own.dir.clone();
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sys::into_cgroup::tests::helper"])
            .args(["--ignored", "--test-threads=1", "--nocapture"])
            .env(HELPER_CGROUP, &cg)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("HELPER OK"),
            "the helper failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("BORN {}\n", own.unified)),
            "the child was not born in the test's cgroup: {stdout}"
        );
        assert_ne!(
            unified(std::process::id() as i32),
            Some(own.unified.clone()),
            "positive control: the test's own process is elsewhere, so the child did not inherit it"
        );
    }
}
