//! Starting and stopping a domain's control daemon: its sandbox, its capabilities, its log,
//! leaving the caller's cgroups, and signals that reach only the daemon gpushare started.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use crate::host::mps::{find, protocol, MpsDirs, MpsError, SAFE_PATH};
use crate::host::procinfo::ProcId;

/// How long a daemon has between SIGTERM and SIGKILL.
const KILL_AFTER_TERM: Duration = Duration::from_millis(500);

/// How long a starting daemon has for one answer to the readiness check.
const READY_ANSWER: Duration = Duration::from_millis(500);

/// The capabilities the control daemon keeps (as a `CAP_*` bit mask). Measured with driver
/// 535's `nvidia-cuda-mps-control -f`: with none at all (and NoNewPrivs) it starts, makes its
/// sockets, FIFO and lock file, answers `get_*`/`set_default_*`/`get_server_list` and exits on
/// `quit`. Multi-user daemons (a flag no driver seen so far has) start servers for other users
/// and would need `CAP_SETUID`/`CAP_SETGID`, which no test here could measure: they keep those
/// two.
pub fn daemon_capabilities(multiuser: bool) -> u64 {
    if multiuser {
        (1 << caps::Capability::CAP_SETUID.index()) | (1 << caps::Capability::CAP_SETGID.index())
    } else {
        0
    }
}

/// Whether the daemon `proc` serving `pipe` answers a command (the readiness check).
fn daemon_answers(pipe: &Path, proc: ProcId) -> bool {
    protocol::converse(
        pipe,
        proc,
        &["get_default_active_thread_percentage"],
        READY_ANSWER,
    )
    .is_ok_and(|a| !a.lines.is_empty())
}

/// Size past which the daemon's log is moved aside to `<log>.1` when a daemon starts, and
/// trimmed by [`trim_log`] while it runs (its tmpfs holds 4 MiB).
const LOG_KEEP_BYTES: u64 = 1 << 20;

/// What [`trim_log`] keeps of a trimmed log, in `<log>.1`.
const LOG_TAIL_BYTES: u64 = 256 << 10;

/// Trims the running daemon's `control.log` in `log_dir` when it has grown past
/// [`LOG_KEEP_BYTES`]: its last [`LOG_TAIL_BYTES`] go to `control.log.1` and it starts again
/// empty (the daemon writes it in append mode, so its next line lands at the start). Never
/// through a link; says whether it trimmed.
pub fn trim_log(log_dir: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_dir.join("control.log");
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
    else {
        return false;
    };
    let len = match f.metadata() {
        Ok(m) if m.is_file() && m.len() > LOG_KEEP_BYTES => m.len(),
        _ => return false,
    };
    let mut tail = Vec::new();
    let read = f
        .seek(SeekFrom::Start(len - LOG_TAIL_BYTES.min(len)))
        .and_then(|_| (&mut f).take(LOG_TAIL_BYTES).read_to_end(&mut tail));
    // Room first (the tmpfs may be full), then the tail.
    if read.is_err() || f.set_len(0).is_err() {
        return false;
    }
    let old = log_dir.join("control.log.1");
    let _ = std::fs::remove_file(&old);
    let _ = crate::host::state::write_atomic(&old, &tail, 0o640);
    true
}

/// Opens the daemon's log file for appending, never through a link; one grown past
/// [`LOG_KEEP_BYTES`] is first moved aside to `<path>.1` (replacing an older one).
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() > LOG_KEEP_BYTES) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(path, old)?;
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Starts of a daemon [`start`] makes before it gives up on one that exits at once.
const START_ATTEMPTS: usize = 5;

/// Starts a daemon for GPU `uuid` in `dirs` (prepared) and waits until it answers; a daemon
/// that exits at once (a tenant racing its start-up makes it give up, never follow) is started
/// again, afresh.
///
/// # Errors
/// [`MpsError`] when it cannot be started or does not become ready; a started daemon that
/// never answered is stopped before returning.
pub(crate) fn start(
    binary: &Path,
    uuid: &str,
    dirs: &MpsDirs,
    multiuser: Option<&str>,
    ready_timeout: Duration,
) -> Result<ProcId, MpsError> {
    let mut attempt = 1;
    loop {
        match start_once(binary, uuid, dirs, multiuser, ready_timeout) {
            Err(MpsError::Exited { .. }) if attempt < START_ATTEMPTS => attempt += 1,
            other => return other,
        }
    }
}

/// One start of the daemon for [`start`]: empty the pipe directory, spawn the daemon
/// in its sandbox, wait until it answers.
fn start_once(
    binary: &Path,
    uuid: &str,
    dirs: &MpsDirs,
    multiuser: Option<&str>,
    ready_timeout: Duration,
) -> Result<ProcId, MpsError> {
    // Whatever a tenant left in the pipe directory goes before the daemon looks at it.
    // A tenant that keeps writing into it cannot stop the start: the daemon is confined to
    // its directories whatever it finds there.
    let left = crate::host::sandbox::empty_dir(&dirs.pipe).map_err(|source| MpsError::Dirs {
        path: dirs.pipe.clone(),
        source,
    })?;
    if left > 0 {
        tracing::warn!(
            "{left} entries a container keeps writing into {} were left there; starting the daemon anyway",
            dirs.pipe.display()
        );
    }
    let mounts = crate::host::sandbox::daemon_mounts(&dirs.pipe, &dirs.log, &dirs.shm, binary)
        .map_err(|source| MpsError::Dirs {
            path: dirs.dir.clone(),
            source,
        })?;
    // In the foreground the daemon logs to stdout: into `<log>/control.log` (the log
    // directory is never mounted into a container).
    let log_file = open_log(&dirs.log.join("control.log")).map_err(|source| MpsError::Dirs {
        path: dirs.log.join("control.log"),
        source,
    })?;
    let mut cmd = Command::new(binary);
    cmd.arg("-f");
    if let Some(flag) = multiuser {
        cmd.arg(flag);
    }
    cmd.env_clear()
        .env("PATH", SAFE_PATH)
        .env("CUDA_VISIBLE_DEVICES", uuid)
        .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::null());
    // First of all in the child, while the host is still writable there: the daemon is known
    // as gpushare's, by pid and start time, before it runs, wherever this process stops.
    find::record_on_exec(&mut cmd, dirs).map_err(|source| MpsError::Dirs {
        path: dirs.dir.clone(),
        source,
    })?;
    crate::sys::daemon_in_sandbox(&mut cmd, mounts);
    // After the sandbox's mounts (which need CAP_SYS_ADMIN): the daemon keeps only what it
    // needs and can never gain more.
    crate::sys::drop_privileges_on_exec(&mut cmd, daemon_capabilities(multiuser.is_some()));
    // Started out of the hook's cgroups (a scope that ends with one container does not take
    // the daemon that others use).
    let mut child = spawn_out_of_cgroups(&mut cmd).map_err(|e| MpsError::Spawn {
        binary: binary.to_owned(),
        source: sandbox_spawn_error(e),
    })?;
    crate::failpoint::hit("mps-spawned");
    let pid = child.id();
    let proc = ProcId::of(pid).unwrap_or(ProcId { pid, start_time: 0 });
    // The child recorded itself before exec; should that record not name it (a start time
    // read differently), this process records it.
    let recorded = if find::recorded(&dirs.dir) == Some(proc) {
        Ok(())
    } else {
        find::record(dirs, proc)
    };
    if let Err(source) = recorded {
        child.kill();
        return Err(MpsError::Dirs {
            path: dirs.dir.clone(),
            source,
        });
    }
    let deadline = Instant::now() + ready_timeout;
    loop {
        if daemon_answers(&dirs.pipe, proc) {
            // Not waited for: it outlives this process and is reparented.
            return Ok(proc);
        }
        if let Some(status) = child.try_wait() {
            find::forget(dirs, proc);
            return Err(MpsError::Exited {
                binary: binary.to_owned(),
                status: status.to_string(),
                hint: if multiuser.is_some() {
                    "; this driver's MPS may not support multi-user: set [mps] multiuser = false"
                } else {
                    ""
                },
                log: dirs.log.join("control.log"),
            });
        }
        if Instant::now() >= deadline {
            stop_process(proc, Duration::from_millis(500));
            find::forget(dirs, proc);
            return Err(MpsError::NotReady {
                uuid: uuid.to_owned(),
                seconds: ready_timeout.as_secs(),
                log: dirs.log.join("control.log"),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits for the daemon `p` (one gpushare started: the caller has it from the record) to exit;
/// SIGTERM after `grace`, SIGKILL half a second after that. A signal goes through a pidfd
/// opened while `p` still had its recorded start time, so it can never reach another process
/// that took the pid meanwhile.
pub fn stop_process(p: ProcId, grace: Duration) {
    let Ok(pidfd) = crate::sys::pidfd_open(p.pid) else {
        return;
    };
    // Opened on the pid: the process behind it is `p` only if it still has `p`'s start time.
    if !p.is_alive() {
        return;
    }
    let start = Instant::now();
    let mut sent_term = false;
    while p.is_alive() {
        let waited = start.elapsed();
        if waited >= grace + KILL_AFTER_TERM {
            let _ = crate::sys::pidfd_send_signal(&pidfd, libc::SIGKILL);
            break;
        }
        if waited >= grace && !sent_term {
            let _ = crate::sys::pidfd_send_signal(&pidfd, libc::SIGTERM);
            sent_term = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Reap it if it is our child; it usually is not.
    let _ = nix::sys::wait::waitpid(
        Pid::from_raw(p.pid),
        Some(nix::sys::wait::WaitPidFlag::WNOHANG),
    );
}

/// Moves `pid` into the root cgroup of each of `roots`. Best effort: a hierarchy we cannot
/// write to is left as it is.
fn move_to_roots(pid: i32, roots: &[HierarchyRoot]) {
    for root in roots {
        let _ = std::fs::write(root.mount_point.join("cgroup.procs"), pid.to_string());
    }
}

/// The root of a cgroup hierarchy, as mounted.
#[derive(Debug, PartialEq)]
struct HierarchyRoot {
    mount_point: std::path::PathBuf,
    /// cgroup v2 (the unified hierarchy).
    v2: bool,
}

/// The root of each cgroup hierarchy (v1 and v2) in `mountinfo`.
fn hierarchy_roots(mountinfo: &str) -> Vec<HierarchyRoot> {
    crate::host::mounts::entries(mountinfo)
        .filter(|e| (e.fstype == "cgroup" || e.fstype == "cgroup2") && e.root == Path::new("/"))
        .map(|e| HierarchyRoot {
            v2: e.fstype == "cgroup2",
            mount_point: e.mount_point,
        })
        .collect()
}

/// A child started by [`spawn_out_of_cgroups`]: by `Command::spawn`, or born in the cgroup v2
/// root (then waited for by pid: it is this process's child until waited for, so the pid
/// cannot name another process).
pub enum Started {
    /// Spawned, then moved.
    Spawned(std::process::Child),
    /// Born in the cgroup v2 root: its pid.
    Cloned(i32),
}

impl Started {
    pub fn id(&self) -> i32 {
        match self {
            Started::Spawned(c) => c.id() as i32,
            Started::Cloned(pid) => *pid,
        }
    }

    /// Its exit status if it has exited (it is then waited for).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        match self {
            Started::Spawned(c) => c.try_wait().ok().flatten(),
            Started::Cloned(pid) => crate::sys::try_reap(*pid).map(ExitStatusExt::from_raw),
        }
    }

    /// Kills it and waits for it.
    pub fn kill(&mut self) {
        match self {
            Started::Spawned(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            Started::Cloned(pid) => {
                // The pid is this process's child, not yet waited for: it names that child
                // and no other process.
                let _ = nix::sys::signal::kill(Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
                let _ = crate::sys::reap(*pid);
            }
        }
    }
}

/// Starts `cmd` out of this process's cgroups, so that a scope that ends with one container
/// does not take a process that outlives it (an MPS daemon, a GPU's reaper): into the root of
/// every cgroup hierarchy. Where a cgroup v2 hierarchy is mounted and this process has one
/// thread, the child is born in its root (`CLONE_INTO_CGROUP`), and only v1 hierarchies are
/// written to: a move takes the kernel's cgroup write lock, which waits for an RCU grace period
/// unless another move came just before (13 ms of an MPS daemon's start on an idle GPU here).
/// Otherwise (no v2, another thread, a kernel before 5.7) it is spawned and moved, as before.
///
/// # Errors
/// What `Command::spawn` returns for `cmd`.
pub fn spawn_out_of_cgroups(cmd: &mut Command) -> std::io::Result<Started> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let roots = hierarchy_roots(&mountinfo);
    let v2_root = roots
        .iter()
        .find(|r| r.v2)
        .and_then(|r| std::fs::File::open(&r.mount_point).ok());
    if let Some(dir) = v2_root {
        use std::os::fd::AsFd;
        match crate::sys::spawn_into_cgroup_if_alone(cmd, dir.as_fd()) {
            Ok(pid) => {
                let v1: Vec<_> = roots.into_iter().filter(|r| !r.v2).collect();
                move_to_roots(pid, &v1);
                return Ok(Started::Cloned(pid));
            }
            Err(crate::sys::IntoCgroupError::Child(e)) => return Err(e),
            Err(crate::sys::IntoCgroupError::Clone(e)) => {
                tracing::debug!("clone3 into the cgroup v2 root: {e}; spawning and moving instead");
            }
        }
    }
    let child = cmd.spawn()?;
    move_to_roots(child.id() as i32, &roots);
    Ok(Started::Spawned(child))
}

/// A spawn error that names the sandbox where the kernel is the likely cause: `EINVAL` or
/// `ENOSYS` from the mount calls made between fork and exec (`mount_setattr` with
/// `MOUNT_ATTR_NOSYMFOLLOW` needs Linux 5.14).
fn sandbox_spawn_error(e: std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) => std::io::Error::new(
            e.kind(),
            format!("{e} while setting up its mount namespace; this needs Linux 5.14 or later"),
        ),
        _ => e,
    }
}

#[cfg(test)]
mod sandbox_error_tests {
    use super::sandbox_spawn_error;

    #[test]
    fn kernel_errors_from_the_sandbox_name_the_kernel_others_pass_through() {
        for (errno, names_kernel) in [
            (libc::EINVAL, true),
            (libc::ENOSYS, true),
            (libc::ENOENT, false),
            (libc::EPERM, false),
        ] {
            let e = sandbox_spawn_error(std::io::Error::from_raw_os_error(errno)).to_string();
            assert_eq!(e.contains("Linux 5.14"), names_kernel, "errno {errno}: {e}");
        }
    }
}

#[cfg(test)]
mod log_tests {
    use super::{open_log, trim_log, LOG_KEEP_BYTES, LOG_TAIL_BYTES};
    use std::io::Write;

    #[test]
    fn a_running_daemons_log_is_trimmed_to_its_tail_and_appended_to_after() {
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("control.log");
        let mut f = open_log(&log).unwrap();
        f.write_all(b"small\n").unwrap();
        assert!(!trim_log(t.path()), "a small log is left as it is");
        let mut big = vec![b'a'; LOG_KEEP_BYTES as usize];
        big.extend_from_slice(b"the last line\n");
        f.write_all(&big).unwrap();
        assert!(trim_log(t.path()));
        let old = std::fs::read(t.path().join("control.log.1")).unwrap();
        assert_eq!(old.len() as u64, LOG_TAIL_BYTES);
        assert!(old.ends_with(b"the last line\n"));
        // The daemon's descriptor (append mode) writes at the start of the emptied file.
        f.write_all(b"next\n").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "next\n");
        let target = t.path().join("elsewhere");
        std::fs::write(&target, vec![b'x'; LOG_KEEP_BYTES as usize + 1]).unwrap();
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(!trim_log(t.path()), "a link is not followed");
        assert_eq!(
            std::fs::metadata(&target).unwrap().len(),
            LOG_KEEP_BYTES + 1
        );
    }

    #[test]
    fn a_log_of_exactly_the_size_it_keeps_is_left_as_it_is() {
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("control.log");
        std::fs::write(&log, vec![b'x'; LOG_KEEP_BYTES as usize]).unwrap();
        assert!(!trim_log(t.path()), "trimmed at its size");
        drop(open_log(&log).unwrap());
        assert!(
            !t.path().join("control.log.1").exists(),
            "moved aside at its size"
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), LOG_KEEP_BYTES);
    }

    #[test]
    fn a_grown_log_is_moved_aside_once_and_links_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("control.log");
        open_log(&log).unwrap().write_all(b"first\n").unwrap();
        open_log(&log).unwrap().write_all(b"second\n").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "first\nsecond\n");
        std::fs::write(&log, vec![b'x'; LOG_KEEP_BYTES as usize + 1]).unwrap();
        open_log(&log).unwrap().write_all(b"fresh\n").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "fresh\n");
        assert_eq!(
            std::fs::metadata(t.path().join("control.log.1"))
                .unwrap()
                .len(),
            LOG_KEEP_BYTES + 1
        );
        let target = t.path().join("elsewhere");
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(open_log(&log).is_err(), "a link is not followed");
        assert!(!target.exists());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mps::scripted::{Held, Scripted};

    fn me() -> ProcId {
        ProcId::of(std::process::id() as i32).unwrap()
    }

    #[test]
    fn a_daemon_keeps_no_capability_and_a_multi_user_one_only_setuid_and_setgid() {
        assert_eq!(daemon_capabilities(false), 0);
        // linux/capability.h: CAP_SETGID 6, CAP_SETUID 7.
        assert_eq!(daemon_capabilities(true), (1 << 6) | (1 << 7));
    }

    #[test]
    fn a_daemon_is_ready_once_it_answers() {
        let t = tempfile::tempdir().unwrap();
        let pipe = t.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        assert!(!daemon_answers(&pipe, me()), "nothing listens");
        let _d = Scripted::start(&pipe, Held::default());
        assert!(daemon_answers(&pipe, me()));
    }

    /// A process of this test's own: `sleep`, which SIGTERM ends, or a shell that ignores it.
    fn child(ignores_term: bool) -> (std::process::Child, ProcId) {
        let c = if ignores_term {
            Command::new("sh")
                .args(["-c", "trap '' TERM; echo ready; while :; do sleep 1; done"])
                .stdout(Stdio::piped())
                // Its last `sleep 1` outlives the KILL by up to a second: not on the test's
                // own stderr.
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        } else {
            Command::new("sleep").arg("60").spawn().unwrap()
        };
        let mut c = c;
        if ignores_term {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(c.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
        }
        let p = ProcId::of(c.id() as i32).unwrap();
        (c, p)
    }

    #[test]
    fn stop_sends_term_after_the_grace_then_kill() {
        let grace = Duration::from_millis(200);
        let (mut c, p) = child(false);
        let t0 = Instant::now();
        stop_process(p, grace);
        let took = t0.elapsed();
        let _ = c.wait();
        assert!(!p.is_alive());
        assert!(
            took >= grace && took < grace + KILL_AFTER_TERM,
            "SIGTERM at the grace: {took:?}"
        );
        let (mut c, p) = child(true);
        let t0 = Instant::now();
        stop_process(p, grace);
        let took = t0.elapsed();
        let _ = c.kill();
        let _ = c.wait();
        assert!(
            took >= grace + KILL_AFTER_TERM,
            "SIGKILL only after the TERM's time: {took:?}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn only_the_roots_of_cgroup_hierarchies_are_written() {
        let mountinfo = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
25 22 0:5 / /dev rw - devtmpfs udev rw
31 22 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro
32 31 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
33 31 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
40 22 0:27 /docker/abc /run/inner rw - cgroup2 cgroup2 rw
";
        assert_eq!(
            hierarchy_roots(mountinfo),
            [
                HierarchyRoot {
                    mount_point: "/sys/fs/cgroup/unified".into(),
                    v2: true
                },
                HierarchyRoot {
                    mount_point: "/sys/fs/cgroup/memory".into(),
                    v2: false
                }
            ]
        );
    }

    /// A daemon leaves the cgroup it was started in (a container's scope) for the root one.
    #[test]
    fn a_daemon_leaves_the_cgroup_it_was_started_in() {
        let Some(own) = crate::host::tests::OwnCgroup::new("the cgroup move test", "leave") else {
            return;
        };
        let cg = own.dir.clone();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mut kid = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = kid.id() as i32;
        let unified = || crate::host::tests::unified_cgroup(pid);
        let moved = std::fs::write(cg.join("cgroup.procs"), pid.to_string());
        let before = unified();
        // What a child spawned the other way (no v2 root to be born in) is given.
        move_to_roots(pid, &hierarchy_roots(&mountinfo));
        let after = unified();
        let _ = kid.kill();
        let _ = kid.wait();
        moved.unwrap();
        assert_eq!(
            before,
            Some(own.unified.clone()),
            "positive control: it was in the test's cgroup"
        );
        assert_eq!(after.as_deref(), Some("/"));
    }

    /// A control program that exits at once is started again, afresh, five times in all.
    #[test]
    fn a_daemon_that_exits_at_once_is_started_five_times_then_given_up() {
        if !crate::host::tests::can_mount("the daemon start tests (a sandbox)") {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let ctl = bin.join("nvidia-cuda-mps-control");
        std::fs::write(
            &ctl,
            "#!/bin/sh\necho started >> \"$CUDA_MPS_LOG_DIRECTORY/attempts\"\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dirs = MpsDirs::owned(t.path().join("mps/d"), "GPU-1", "gpu");
        let _remove = crate::host::tests::RemoveOnDrop(&dirs);
        dirs.prepare(1 << 20).unwrap();
        let e = start(&ctl, "GPU-1", &dirs, None, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, MpsError::Exited { .. }), "{e:?}");
        let attempts = std::fs::read_to_string(dirs.log.join("attempts")).unwrap_or_default();
        assert_eq!(attempts.lines().count(), START_ATTEMPTS, "{attempts:?}");
        assert_eq!(find::recorded(&dirs.dir), None, "no daemon left recorded");
    }
}
