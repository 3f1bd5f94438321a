//! The NVIDIA MPS control daemon: one per isolation domain, started, probed, configured and
//! stopped here, behind the [`MpsControl`] seam.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use thiserror::Error;

use crate::host::procinfo::ProcId;
use crate::vocab::Limits;

/// PATH given to the programs the hook starts.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The daemon could not be started, reached or stopped.
#[derive(Debug, Error)]
pub enum MpsError {
    #[error("MPS control binary {0:?} not found; install nvidia-cuda-mps or set [mps] control in the config")]
    NotFound(String),
    #[error("cannot prepare {path}")]
    Dirs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot mount the daemon's shm tmpfs on {path}; the hook needs CAP_SYS_ADMIN")]
    Shm {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot start {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("MPS daemon for {uuid} did not answer get_server_list within {seconds}s; see {log}")]
    NotReady {
        uuid: String,
        seconds: u64,
        log: PathBuf,
    },
    #[error("{binary} exited during start-up ({status}){hint}; see {log}")]
    Exited {
        binary: PathBuf,
        status: String,
        hint: &'static str,
        log: PathBuf,
    },
    #[error("MPS control command {command:?} failed: {output}")]
    Command { command: String, output: String },
}

/// The directories of one isolation domain's daemon: `<state>/mps/<id>/{pipe,log,shm}`, and
/// the `owner` file that names the GPU and domain they belong to.
#[derive(Debug, Clone)]
pub struct MpsDirs {
    pub dir: PathBuf,
    pub pipe: PathBuf,
    pub log: PathBuf,
    pub shm: PathBuf,
    /// `<uuid> <domain>`, written to `owner` first thing by [`MpsDirs::prepare`].
    owner: Option<String>,
}

/// Name of the file in a domain's directory that says whose it is.
pub const OWNER_FILE: &str = "owner";

/// Prefix of a domain directory being made (`.new-<pid>-<nanos>`), renamed into place with its
/// owner file; one whose maker is gone is removed by `gc`.
pub const NEW_PREFIX: &str = ".new-";

impl MpsDirs {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            pipe: dir.join("pipe"),
            log: dir.join("log"),
            shm: dir.join("shm"),
            dir,
            owner: None,
        }
    }

    /// The directories of domain `domain` of GPU `uuid`, in `dir`.
    pub fn owned(dir: PathBuf, uuid: &str, domain: &str) -> Self {
        Self {
            owner: Some(format!("{uuid} {domain}")),
            ..Self::new(dir)
        }
    }

    /// The (uuid, domain) these directories belong to, when made with [`MpsDirs::owned`].
    pub fn owner(&self) -> Option<(&str, &str)> {
        self.owner.as_deref()?.split_once(' ')
    }

    /// The (uuid, domain) an `owner` file names.
    pub fn read_owner(dir: &Path) -> Option<(String, String)> {
        let text = std::fs::read_to_string(dir.join(OWNER_FILE)).ok()?;
        let (uuid, domain) = text.trim().split_once(' ')?;
        Some((uuid.to_owned(), domain.to_owned()))
    }

    /// Creates the directories and mounts the shm tmpfs if it is not mounted yet. Idempotent.
    ///
    /// # Errors
    /// [`MpsError`] when a directory or the mount cannot be made.
    pub fn prepare(&self) -> Result<(), MpsError> {
        use std::os::unix::fs::DirBuilderExt;
        let dirs_err = |path: &Path| {
            let path = path.to_owned();
            move |source| MpsError::Dirs { path, source }
        };
        match &self.owner {
            // Made with its owner file in place, by a rename: a directory under `mps/` always
            // says whose it is, even when its maker was killed half-way.
            Some(owner) if !self.dir.is_dir() => {
                let parent = self.dir.parent().unwrap_or(Path::new("/"));
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .recursive(true)
                    .create(parent)
                    .map_err(dirs_err(parent))?;
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let tmp = parent.join(format!("{NEW_PREFIX}{}-{stamp}", std::process::id()));
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&tmp)
                    .map_err(dirs_err(&tmp))?;
                let made = std::fs::write(tmp.join(OWNER_FILE), owner)
                    .and_then(|()| std::fs::rename(&tmp, &self.dir));
                if let Err(e) = made {
                    let _ = std::fs::remove_dir_all(&tmp);
                    // Someone else made it meanwhile: theirs stands.
                    if !self.dir.is_dir() {
                        return Err(dirs_err(&self.dir)(e));
                    }
                }
            }
            _ => std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(&self.dir)
                .map_err(dirs_err(&self.dir))?,
        }
        for d in [&self.pipe, &self.log, &self.shm] {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(d)
                .map_err(|source| MpsError::Dirs {
                    path: d.clone(),
                    source,
                })?;
        }
        if !is_mount_point(&self.shm) {
            mount(
                Some("tmpfs"),
                &self.shm,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=1777"),
            )
            .map_err(|source| MpsError::Shm {
                path: self.shm.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Unmounts the shm tmpfs and removes the directory tree. Best effort, idempotent.
    pub fn remove(&self) {
        // The shm tmpfs, and anything else found mounted on a directory of the domain in this
        // mount namespace (nothing of gpushare's is; a mount there would only keep the
        // directory from going).
        for d in [&self.shm, &self.pipe, &self.log] {
            while is_mount_point(d) {
                if umount2(d.as_path(), MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
        }
        // The owner file goes last, so that a removal cut short leaves a directory that still
        // says whose it is (and `gc` finishes it under that GPU's lock).
        for d in [&self.pipe, &self.log, &self.shm] {
            let _ = std::fs::remove_dir_all(d);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove an MPS domain directory");
            }
        }
        // The shared `mps/` parent goes too once no domain uses it (fails harmlessly
        // otherwise).
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Whether `path` is a mount point: as `statx` says, or failing that as mountinfo says.
pub fn is_mount_point(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes());
    if let Some(root) = c.ok().and_then(|c| crate::sys::is_mount_root(&c)) {
        return root;
    }
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    text.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| unescape_mountinfo(mp) == want)
    })
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Finds `name` on the safe PATH (or takes it as a path if it has a `/`).
pub fn find_binary(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    SAFE_PATH
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A handle on the `nvidia-cuda-mps-control` program.
#[derive(Debug, Clone)]
pub struct Control {
    binary: PathBuf,
    /// Commands [`Control::refresh`] leaves for [`Control::flush`]: (pipe, commands).
    pending: std::cell::RefCell<Vec<(PathBuf, String)>>,
}

impl Control {
    /// # Errors
    /// [`MpsError::NotFound`] when the binary is missing.
    pub fn new(name: &str) -> Result<Self, MpsError> {
        find_binary(name)
            .map(|binary| Self {
                binary,
                pending: std::cell::RefCell::new(Vec::new()),
            })
            .ok_or_else(|| MpsError::NotFound(name.to_owned()))
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Sends one control command to the daemon behind `pipe`; returns its output.
    ///
    /// # Errors
    /// [`MpsError::Command`] when the client fails, says so, or hangs past `timeout`.
    pub fn command(
        &self,
        pipe: &Path,
        command: &str,
        timeout: Duration,
    ) -> Result<String, MpsError> {
        let fail = |output: String| MpsError::Command {
            command: command.to_owned(),
            output,
        };
        let mut cmd = self.client(pipe, Stdio::piped).map_err(fail)?;
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(sandbox_spawn_error(e).to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(format!("{command}\n").as_bytes());
        }
        match wait_output(&mut child, timeout).map_err(|e| fail(e.to_string()))? {
            Some((s, out)) if s.success() => Ok(out.trim().to_owned()),
            Some((s, out)) => Err(fail(format!("{} {}", s, out.trim()))),
            None => Err(fail(format!("no answer within {}s", timeout.as_secs_f32()))),
        }
    }

    /// The control client for the daemon behind `pipe`, commands on stdin and its output to
    /// `out()`. It runs in a mount namespace of its own in which it sees only this daemon's pipe
    /// directory, read-only and following no symlink, at a private path: a `control` a tenant
    /// pointed at another daemon dangles.
    fn client(&self, pipe: &Path, out: fn() -> Stdio) -> Result<Command, String> {
        let (mounts, private_pipe) = crate::host::sandbox::client_mounts(pipe)
            .map_err(|e| format!("cannot open {}: {e}", pipe.display()))?;
        let mut cmd = Command::new(&self.binary);
        cmd.env_clear()
            .env("PATH", SAFE_PATH)
            .env("CUDA_MPS_PIPE_DIRECTORY", &private_pipe)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(out())
            .stderr(out());
        crate::sys::client_in_sandbox(&mut cmd, mounts);
        Ok(cmd)
    }

    /// Whether a daemon answers on `pipe` (judged without following a link a tenant put in
    /// place of a socket).
    pub fn answers(&self, pipe: &Path) -> bool {
        daemon_answers(self, pipe)
    }

    /// Starts a daemon for GPU `uuid` in a mount namespace of its own with `dirs.shm` on
    /// `/dev/shm`, outside the caller's cgroups, and waits until it answers.
    ///
    /// # Errors
    /// [`MpsError`] when it cannot be started or does not become ready; a started daemon that
    /// never answered is killed before returning.
    pub fn start(
        &self,
        uuid: &str,
        dirs: &MpsDirs,
        multiuser: bool,
        ready_timeout: Duration,
    ) -> Result<ProcId, MpsError> {
        let multiuser = if multiuser {
            let flag = crate::host::multiuser::flag_for(&self.binary).map_err(|reason| {
                MpsError::Spawn {
                    binary: self.binary.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::Unsupported, reason),
                }
            })?;
            Some(flag)
        } else {
            None
        };
        dirs.prepare()?;
        // A tenant racing the daemon's start-up (swapping a link in where the daemon is about
        // to re-mode a file by name) makes it give up, never follow: start again, afresh.
        let mut attempt = 1;
        loop {
            match start_once(self, uuid, dirs, multiuser, ready_timeout) {
                Err(MpsError::Exited { .. }) if attempt < START_ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    /// Sets the daemon's defaults, the limits it enforces on every client: the active thread
    /// percentage and the pinned device memory of device 0 (the only one it sees); `None`
    /// memory clears that limit. Both are always sent, so that a value a tenant changed is
    /// put back.
    ///
    /// # Errors
    /// [`MpsError::Command`] when the daemon cannot be reached.
    pub fn set_defaults(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError> {
        self.command(pipe, &defaults_commands(limits), Duration::from_secs(5))
            .map(drop)
    }

    /// The cheap check of a running daemon a joining container needs: its control socket
    /// accepts a connection (the caller has checked its pid and start time). Its defaults are
    /// then put back to `limits` by a control client that [`Control::flush`] starts and nobody
    /// waits for (it is killed after five seconds if the daemon does not answer), so that a
    /// tenant's change does not last past the next acquire and the acquire neither waits for a
    /// round trip nor holds a lock for it. `status`, `doctor` and `gc` ask `get_server_list` in
    /// full.
    ///
    /// # Errors
    /// [`MpsError::Command`] when the socket does not accept, or the client cannot be started.
    pub fn refresh(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError> {
        if !listens(&pipe.join("control")) {
            return Err(MpsError::Command {
                command: "connect".into(),
                output: format!(
                    "{} does not accept connections",
                    pipe.join("control").display()
                ),
            });
        }
        self.pending
            .borrow_mut()
            .push((pipe.to_owned(), defaults_commands(limits)));
        Ok(())
    }

    /// Sends what [`Control::refresh`] left, each through a control client that is not waited
    /// for; called once the GPU locks are released, so that no lock is held for it.
    pub fn flush(&self) {
        for (pipe, cmds) in self.pending.take() {
            if let Err(e) = self.command_detached(&pipe, &cmds) {
                tracing::warn!(pipe = %pipe.display(), error = %crate::vocab::chain(&e), "cannot put a daemon's defaults back");
            }
        }
    }

    /// Sends `command` through a control client that is not waited for, not even for its
    /// exec; it leaves the caller's session, has no inherited descriptors and is killed after
    /// five seconds.
    fn command_detached(&self, pipe: &Path, command: &str) -> Result<(), MpsError> {
        let fail = |output: String| MpsError::Command {
            command: command.to_owned(),
            output,
        };
        let (mounts, private_pipe) = crate::host::sandbox::client_mounts(pipe)
            .map_err(|e| fail(format!("cannot open {}: {e}", pipe.display())))?;
        let c = |s: &[u8]| {
            std::ffi::CString::new(s).map_err(|_| fail("a path holds a NUL byte".into()))
        };
        let binary = c(self.binary.as_os_str().as_encoded_bytes())?;
        let mut pipe_env = b"CUDA_MPS_PIPE_DIRECTORY=".to_vec();
        pipe_env.extend_from_slice(private_pipe.as_os_str().as_encoded_bytes());
        let exec = crate::sys::Exec {
            argv: vec![binary.clone()],
            path: binary,
            envp: vec![c(format!("PATH={SAFE_PATH}").as_bytes())?, c(&pipe_env)?],
        };
        crate::sys::spawn_client_unwaited(&exec, &mounts, format!("{command}\n").as_bytes(), 5)
            .map(drop)
            .map_err(|e| fail(e.to_string()))
    }

    /// The daemon's current defaults.
    ///
    /// # Errors
    /// [`MpsError::Command`] when the daemon cannot be reached or answers something else.
    pub fn defaults(&self, pipe: &Path) -> Result<Limits, MpsError> {
        let cmd = "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0";
        let out = self.command(pipe, cmd, Duration::from_secs(2))?;
        parse_defaults(&out).ok_or_else(|| MpsError::Command {
            command: cmd.replace('\n', "; "),
            output: out,
        })
    }

    /// Stops a daemon: `quit`, then SIGTERM/SIGKILL if it lingers. Idempotent.
    pub fn stop(&self, pipe: &Path, daemon: Option<ProcId>) {
        let _ = self.command(pipe, "quit", Duration::from_secs(5));
        if let Some(p) = daemon {
            stop_process(p, Duration::from_secs(5));
        }
    }
}

/// Waits for `p` to exit; SIGTERM after `grace`, SIGKILL after twice that.
pub fn stop_process(p: ProcId, grace: Duration) {
    let start = Instant::now();
    let mut sent_term = false;
    while p.is_alive() {
        let waited = start.elapsed();
        if waited >= grace * 2 {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
            break;
        }
        if waited >= grace && !sent_term {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGTERM);
            sent_term = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Reap it if it is our child; it usually is not.
    let _ = nix::sys::wait::waitpid(
        Pid::from_raw(p.pid),
        Some(nix::sys::wait::WaitPidFlag::WNOHANG),
    );
}

/// Moves `pid` into the root cgroup of every hierarchy this process belongs to, so that a
/// scope that ends with one container does not take a daemon that others use. Best effort: a
/// hierarchy we cannot write to is left as it is.
pub fn leave_cgroups(pid: i32) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = post.split(' ').next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let fields: Vec<&str> = pre.split(' ').collect();
        // Only the root of each hierarchy (root field "/").
        if fields.get(3) != Some(&"/") {
            continue;
        }
        if let Some(mp) = fields.get(4) {
            let procs = Path::new(&unescape_mountinfo(mp)).join("cgroup.procs");
            let _ = std::fs::write(procs, pid.to_string());
        }
    }
}

/// Finds a running daemon serving `pipe` (its environment names that pipe directory), for
/// adopting one that is missing from the record.
pub fn find_daemon(pipe: &Path, binary: &Path) -> Option<ProcId> {
    let want = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display());
    let bin_name = binary.file_name()?.to_string_lossy().into_owned();
    let rd = std::fs::read_dir("/proc").ok()?;
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or(&[]);
        if !String::from_utf8_lossy(argv0).ends_with(&bin_name) {
            continue;
        }
        // A control client has no `-f`/`-d`: only daemons are adopted.
        if !cmdline.split(|b| *b == 0).any(|a| a == b"-f" || a == b"-d") {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            if let Some(p) = ProcId::of(pid).filter(ProcId::is_alive) {
                return Some(p);
            }
        }
    }
    None
}

/// The control commands that set a domain's defaults to `limits`.
fn defaults_commands(limits: &Limits) -> String {
    format!(
        "set_default_active_thread_percentage {}\nset_default_device_pinned_mem_limit 0 {}M",
        limits.cores,
        limits.memory_mib.unwrap_or(0)
    )
}

/// Parses the answers to `get_default_active_thread_percentage` (`60.0`) and
/// `get_default_device_pinned_mem_limit 0` (`2G`, `512M`, or nothing when unset).
pub fn parse_defaults(out: &str) -> Option<Limits> {
    let mut lines = out.lines().map(str::trim).filter(|l| !l.is_empty());
    let pct: f64 = lines.next()?.parse().ok()?;
    if !(0.0..=100.0).contains(&pct) {
        return None;
    }
    let memory_mib = match lines.next() {
        None => None,
        Some(m) => {
            let (num, unit) = m.split_at(m.find(|c: char| c.is_ascii_alphabetic())?);
            let n: f64 = num.parse().ok()?;
            let mib = match unit {
                "K" => n / 1024.0,
                "M" => n,
                "G" => n * 1024.0,
                "T" => n * 1024.0 * 1024.0,
                _ => return None,
            };
            Some(mib.round() as u64).filter(|m| *m > 0)
        }
    };
    Some(Limits {
        cores: pct.round() as u8,
        memory_mib,
    })
}

/// What the doing layer needs of an MPS control daemon: a narrow seam, implemented by
/// [`Control`] over NVIDIA's `nvidia-cuda-mps-control`.
pub trait MpsControl {
    /// The control binary (to recognise its daemons among processes).
    fn binary(&self) -> &Path;
    /// Starts a daemon in `dirs` for GPU `uuid`; see [`Control::start`].
    ///
    /// # Errors
    /// [`MpsError`] when it cannot be started or does not become ready.
    fn start(
        &self,
        uuid: &str,
        dirs: &MpsDirs,
        multiuser: bool,
        ready_timeout: Duration,
    ) -> Result<ProcId, MpsError>;
    /// Whether a daemon answers on `pipe`.
    fn answers(&self, pipe: &Path) -> bool;
    /// Liveness plus defaults put back, in one round trip; see [`Control::refresh`].
    ///
    /// # Errors
    /// [`MpsError`] when the daemon does not answer.
    fn refresh(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError>;
    /// Sets the defaults; see [`Control::set_defaults`].
    ///
    /// # Errors
    /// [`MpsError`] when the daemon refuses.
    fn set_defaults(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError>;
    /// Reads the defaults; see [`Control::defaults`].
    ///
    /// # Errors
    /// [`MpsError`] when the daemon cannot be asked.
    fn defaults(&self, pipe: &Path) -> Result<Limits, MpsError>;
    /// Sends what `refresh` left to send, once no lock is held.
    fn flush(&self) {}
    /// Stops the daemon on `pipe` (and `daemon`, if it lingers). Idempotent.
    fn stop(&self, pipe: &Path, daemon: Option<ProcId>);
    /// A running daemon serving `pipe`, recorded or not.
    fn find_daemon(&self, pipe: &Path) -> Option<ProcId>;
}

impl MpsControl for Control {
    fn binary(&self) -> &Path {
        Control::binary(self)
    }
    fn start(
        &self,
        uuid: &str,
        dirs: &MpsDirs,
        multiuser: bool,
        ready_timeout: Duration,
    ) -> Result<ProcId, MpsError> {
        Control::start(self, uuid, dirs, multiuser, ready_timeout)
    }
    fn answers(&self, pipe: &Path) -> bool {
        Control::answers(self, pipe)
    }
    fn refresh(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError> {
        Control::refresh(self, pipe, limits)
    }
    fn flush(&self) {
        Control::flush(self);
    }
    fn set_defaults(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError> {
        Control::set_defaults(self, pipe, limits)
    }
    fn defaults(&self, pipe: &Path) -> Result<Limits, MpsError> {
        Control::defaults(self, pipe)
    }
    fn stop(&self, pipe: &Path, daemon: Option<ProcId>) {
        Control::stop(self, pipe, daemon);
    }
    fn find_daemon(&self, pipe: &Path) -> Option<ProcId> {
        find_daemon(pipe, Control::binary(self))
    }
}

/// Whether `sock` is a unix socket (not a link a tenant planted) that accepts a connection.
/// MPS's control socket is a `SOCK_SEQPACKET` one. The connect never blocks: a socket a tenant
/// planted there that never accepts (a full backlog) answers "no" at once instead of holding
/// the caller, and the GPU's lock, forever.
pub fn listens(sock: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::symlink_metadata(sock).is_ok_and(|m| m.file_type().is_socket()) {
        return false;
    }
    let Ok(fd) = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC | nix::sys::socket::SockFlag::SOCK_NONBLOCK,
        None,
    ) else {
        return false;
    };
    let Ok(addr) = nix::sys::socket::UnixAddr::new(sock) else {
        return false;
    };
    nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).is_ok()
}

/// Size past which the daemon's log is moved aside to `<log>.1` when a daemon starts.
const LOG_KEEP_BYTES: u64 = 8 << 20;

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

/// Starts of a daemon [`Control::start`] makes before it gives up on one that exits at once.
const START_ATTEMPTS: usize = 5;

/// One start of the daemon for [`Control::start`]: empty the pipe directory, spawn the daemon
/// in its sandbox, wait until it answers.
fn start_once(
    control: &Control,
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
    let mounts =
        crate::host::sandbox::daemon_mounts(&dirs.pipe, &dirs.log, &dirs.shm, &control.binary)
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
    let mut cmd = Command::new(&control.binary);
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
    crate::sys::daemon_in_sandbox(&mut cmd, mounts);
    let mut child = cmd.spawn().map_err(|e| MpsError::Spawn {
        binary: control.binary.clone(),
        source: sandbox_spawn_error(e),
    })?;
    let pid = child.id() as i32;
    leave_cgroups(pid);
    let proc = ProcId::of(pid).unwrap_or(ProcId { pid, start_time: 0 });
    let deadline = Instant::now() + ready_timeout;
    loop {
        if daemon_answers(control, &dirs.pipe) {
            // Not waited for: it outlives this process and is reparented.
            return Ok(proc);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(MpsError::Exited {
                binary: control.binary.clone(),
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
            return Err(MpsError::NotReady {
                uuid: uuid.to_owned(),
                seconds: ready_timeout.as_secs(),
                log: dirs.log.join("control.log"),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the daemon behind `pipe` answers, judged without following a link a tenant put in
/// place of a socket: the privileged socket (root clients use it) must be a socket.
fn daemon_answers(control: &Control, pipe: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(pipe.join("control_privileged"))
        .is_ok_and(|m| m.file_type().is_socket())
        && control
            .command(pipe, "get_server_list", Duration::from_secs(2))
            .is_ok()
}

/// Collects a child's stdout and stderr as they come (woken by `poll`, not by a timer) and then
/// its exit status; kills and reaps it when `timeout` passes first (then `Ok(None)`).
fn wait_output(
    child: &mut std::process::Child,
    timeout: Duration,
) -> std::io::Result<Option<(std::process::ExitStatus, String)>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let deadline = Instant::now() + timeout;
    let give_up = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
        Ok(None)
    };
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let mut text = [Vec::new(), Vec::new()];
    while out.is_some() || err.is_some() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return give_up(child);
        }
        let ms = u16::try_from(left.as_millis() + 1).unwrap_or(u16::MAX);
        let mut ready = [false, false];
        {
            let mut fds = Vec::with_capacity(2);
            let mut which = Vec::with_capacity(2);
            if let Some(o) = &out {
                fds.push(PollFd::new(o.as_fd(), PollFlags::POLLIN));
                which.push(0);
            }
            if let Some(e) = &err {
                fds.push(PollFd::new(e.as_fd(), PollFlags::POLLIN));
                which.push(1);
            }
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            for (fd, i) in fds.iter().zip(which) {
                ready[i] = fd.revents().is_some_and(|r| !r.is_empty());
            }
        }
        let mut buf = [0u8; 4096];
        for (i, stream) in [&mut out as &mut dyn ReadSlot, &mut err]
            .into_iter()
            .enumerate()
        {
            if ready[i] {
                match stream.read_once(&mut buf) {
                    Ok(0) => stream.close(),
                    Ok(n) => text[i].extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => stream.close(),
                }
            }
        }
    }
    // Both pipes closed: the child is exiting.
    let mut pause = Duration::from_micros(20);
    loop {
        if let Some(s) = child.try_wait()? {
            let mut all = String::from_utf8_lossy(&text[0]).into_owned();
            all.push_str(&String::from_utf8_lossy(&text[1]));
            return Ok(Some((s, all)));
        }
        if Instant::now() >= deadline {
            return give_up(child);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

/// An optional pipe end of a child that [`wait_output`] reads from until it closes.
trait ReadSlot {
    fn read_once(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    fn close(&mut self);
}

impl<R: Read> ReadSlot for Option<R> {
    fn read_once(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Some(r) => r.read(buf),
            None => Ok(0),
        }
    }

    fn close(&mut self) {
        *self = None;
    }
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
    use super::{open_log, LOG_KEEP_BYTES};
    use std::io::Write;

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
mod listens_tests {
    use super::listens;
    use nix::sys::socket::{
        bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    use std::os::fd::AsRawFd;

    fn seqpacket(nonblock: bool) -> std::os::fd::OwnedFd {
        let mut flags = SockFlag::SOCK_CLOEXEC;
        if nonblock {
            flags |= SockFlag::SOCK_NONBLOCK;
        }
        socket(AddressFamily::Unix, SockType::SeqPacket, flags, None).unwrap()
    }

    #[test]
    fn a_socket_that_never_accepts_does_not_hold_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control");
        let addr = UnixAddr::new(&path).unwrap();
        let server = seqpacket(false);
        bind(server.as_raw_fd(), &addr).unwrap();
        listen(&server, Backlog::new(0).unwrap()).unwrap();
        assert!(listens(&path), "a listening socket accepts a connection");
        // Fill the backlog of a socket that never accepts, as a tenant could plant one.
        let mut held = Vec::new();
        for _ in 0..8 {
            let c = seqpacket(true);
            if connect(c.as_raw_fd(), &addr).is_err() {
                break;
            }
            held.push(c);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(listens(&p)).unwrap());
        let answer = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("listens() returned instead of blocking");
        assert!(!answer, "a full backlog is no answer");
        drop(held);
        assert!(!listens(&dir.path().join("absent")));
        std::os::unix::fs::symlink(&path, dir.path().join("link")).unwrap();
        assert!(!listens(&dir.path().join("link")), "a link is not followed");
    }
}
