//! The NVIDIA MPS control daemon of an isolation domain, behind the [`MpsControl`] seam:
//! its directories ([`dirs`]), starting and stopping it ([`spawn`]), knowing it ([`find`]: only
//! the daemon gpushare recorded counts) and talking to it ([`protocol`]: gpushare speaks the
//! control protocol itself, in-process, after the kernel proved who listens).

pub mod dirs;
pub mod find;
pub mod protocol;
#[cfg(test)]
pub(crate) mod scripted;
pub mod spawn;

use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::host::procinfo::ProcId;
use crate::vocab::Limits;

pub use dirs::{is_mount_point, MpsDirs, NEW_PREFIX, OWNER_FILE, PIPE_TMPFS_OPTIONS};
pub use spawn::{daemon_capabilities, spawn_out_of_cgroups, stop_process, Started};

/// PATH given to the programs the hook starts.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a running daemon has to answer a command before it counts as hung. A daemon
/// answers within a millisecond; a tenant that wedged it never lets it answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_millis(500);

/// How long `quit` may take before the daemon is signalled.
const QUIT_TIMEOUT: Duration = Duration::from_secs(2);

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
    #[error("cannot mount a capped tmpfs on {path}; the hook needs CAP_SYS_ADMIN")]
    Mount {
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
    #[error("MPS daemon for {uuid} did not answer within {seconds}s; see {log}")]
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
    #[error("the MPS control socket in {pipe} is not the daemon gpushare started (pid {expected}): {found}; the domain was tampered with")]
    Tampered {
        pipe: PathBuf,
        expected: i32,
        found: String,
    },
    #[error("the MPS daemon in {pipe} did not answer within {millis} ms")]
    NoAnswer { pipe: PathBuf, millis: u64 },
    #[error("no MPS daemon listens in {pipe}")]
    Unreachable {
        pipe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the MPS daemon in {pipe} broke the control protocol: {what}")]
    Protocol { pipe: PathBuf, what: String },
    #[error("MPS control command {command:?} failed: {output}")]
    Command { command: String, output: String },
    #[error("the MPS daemon gpushare started in {pipe} (pid {pid}) still runs; stop it before starting another there")]
    AlreadyServed { pipe: PathBuf, pid: i32 },
    #[error("{binary} has no multi-user mode ({reason}); set [mps] multiuser = false, or give each uid its own domain")]
    NoMultiUser { binary: PathBuf, reason: String },
    #[error("the recorded MPS daemon (pid {pid}) is gone")]
    Gone { pid: i32 },
}

impl MpsError {
    /// Whether this says that someone else's process holds the domain's control socket.
    pub fn is_tampered(&self) -> bool {
        matches!(self, MpsError::Tampered { .. })
    }
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

/// The real control: NVIDIA's `nvidia-cuda-mps-control` is run only as the daemon; every
/// command gpushare sends goes over the control socket from this process, to the daemon it
/// recorded and nothing else.
#[derive(Debug, Clone)]
pub struct Control {
    binary: PathBuf,
}

impl Control {
    /// # Errors
    /// [`MpsError::NotFound`] when the binary is missing.
    pub fn new(name: &str) -> Result<Self, MpsError> {
        find_binary(name)
            .map(|binary| Self { binary })
            .ok_or_else(|| MpsError::NotFound(name.to_owned()))
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Sets the defaults of the daemon gpushare recorded for `pipe`; see
    /// [`MpsControl::set_defaults`]. Nothing is sent when no recorded daemon runs there.
    ///
    /// # Errors
    /// [`MpsError`] when there is none, it cannot be proven, or it does not take them.
    pub fn set_defaults(&self, pipe: &Path, limits: &Limits) -> Result<(), MpsError> {
        let daemon = find::running(pipe).ok_or_else(|| MpsError::Unreachable {
            pipe: pipe.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        set_defaults(pipe, daemon, limits)
    }
}

/// Sets the daemon's defaults, the limits it enforces on every client (active thread
/// percentage and pinned device memory of device 0, the only one it sees; `None` memory clears
/// that limit) and its default client priority ([`CLIENT_PRIORITY`]), and reads them back in
/// the same conversation: the read-back is the proof they took. All are always sent, so that a
/// value a tenant changed is put back. The same conversation lists the servers already
/// running, last (a server started after that takes the defaults just set); they get the same
/// limits ([`restore_servers`]), each in a conversation of its own.
///
/// # Errors
/// [`MpsError`]: not proven, no answer in time, or read back different.
pub fn set_defaults(pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
    let set = defaults_commands(limits);
    let cmds = [
        set[0].as_str(),
        set[1].as_str(),
        SET_PRIORITY,
        GET_THREADS,
        GET_PINNED,
        GET_PRIORITY,
        GET_SERVERS,
    ];
    let answer = protocol::converse(pipe, daemon, &cmds, ANSWER_TIMEOUT)?;
    match set_answer(&answer.lines, limits) {
        Some(servers) => {
            restore(pipe, daemon, limits, server_pids(servers));
            Ok(())
        }
        None => Err(MpsError::Command {
            command: cmds.join("; "),
            output: answer.lines.join("; "),
        }),
    }
}

/// Checks the answer to [`set_defaults`]'s conversation and returns its server list: the echo
/// of the set percentage (NVIDIA's daemon echoes it; an answer without it is taken too), the
/// read-back of the defaults (no pinned line when none is set), then one server pid a line.
/// `None` when the read-back is not `limits` with [`CLIENT_PRIORITY`].
fn set_answer<'a>(lines: &'a [String], limits: &Limits) -> Option<&'a [String]> {
    let read_back = if limits.memory_mib.is_some() { 3 } else { 2 };
    let want = Settings {
        limits: *limits,
        priority: CLIENT_PRIORITY,
    };
    [1, 0].into_iter().find_map(|from| {
        let end = from + read_back;
        let back = parse_settings(lines.get(from..end)?)?;
        (back == want).then(|| &lines[end..])
    })
}

const GET_THREADS: &str = "get_default_active_thread_percentage";
const GET_PINNED: &str = "get_default_device_pinned_mem_limit 0";
const GET_PRIORITY: &str = "get_default_client_priority";
const SET_PRIORITY: &str = "set_default_client_priority 0";
const GET_SERVERS: &str = "get_server_list";

/// The default client priority gpushare keeps on every daemon: 0, NVIDIA's default (normal).
/// A client may lower its own priority (`CUDA_MPS_CLIENT_PRIORITY`); a tenant that changes the
/// default changes it for every client that starts after.
pub const CLIENT_PRIORITY: u32 = 0;

/// What a daemon says its defaults are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Default active thread percentage and pinned memory limit.
    pub limits: Limits,
    /// Default client priority.
    pub priority: u32,
}

/// Parses the answers to `GET_THREADS`, `GET_PINNED` (no line when unset) and `GET_PRIORITY`.
fn parse_settings(lines: &[String]) -> Option<Settings> {
    let (priority, rest) = lines.split_last()?;
    if rest.is_empty() || rest.len() > 2 {
        return None;
    }
    Some(Settings {
        limits: parse_defaults(&rest.join("\n"))?,
        priority: priority.trim().parse().ok()?,
    })
}

/// The daemon's current defaults.
///
/// # Errors
/// [`MpsError`] when it cannot be proven or asked, or answers something else.
pub fn defaults(pipe: &Path, daemon: ProcId) -> Result<Limits, MpsError> {
    settings(pipe, daemon).map(|s| s.limits)
}

/// The daemon's current defaults and client priority, in one conversation.
///
/// # Errors
/// [`MpsError`] when it cannot be proven or asked, or answers something else.
pub fn settings(pipe: &Path, daemon: ProcId) -> Result<Settings, MpsError> {
    let cmds = [GET_THREADS, GET_PINNED, GET_PRIORITY];
    let answer = protocol::converse(pipe, daemon, &cmds, ANSWER_TIMEOUT)?;
    parse_settings(&answer.lines).ok_or_else(|| MpsError::Command {
        command: cmds.join("; "),
        output: answer.lines.join("\n"),
    })
}

/// Puts the per-server limits of every server the daemon runs back to `limits`
/// (`set_active_thread_percentage <pid>`, `set_device_pinned_mem_limit <pid> 0`), which a
/// tenant could otherwise raise for the server its clients share, and reads them back. Best
/// effort, each server in a conversation of its own; a failure is logged. A daemon runs a
/// server only while a GPU client is connected: what a server answers was seen on a GPU
/// (`tests/gpu/mps-server-settings.sh`, driver 535 on an H100): one pid a line from
/// `get_server_list`, the set thread percentage echoed, a pinned limit read back as `1G` and
/// nothing once `0M` cleared it.
pub fn restore_servers(pipe: &Path, daemon: ProcId, limits: &Limits) {
    restore(pipe, daemon, limits, servers(pipe, daemon));
}

/// [`restore_servers`] for the servers `pids`.
fn restore(pipe: &Path, daemon: ProcId, limits: &Limits, pids: Vec<u32>) {
    for pid in pids {
        let cmds = server_commands(pid, limits);
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        let res = protocol::converse(pipe, daemon, &refs, ANSWER_TIMEOUT);
        // The echo of the set percentage, then the read-back.
        let back = res
            .as_ref()
            .ok()
            .and_then(|a| a.lines.get(1..))
            .and_then(|l| parse_defaults(&l.join("\n")));
        if back != Some(*limits) {
            tracing::warn!(
                "cannot put back the limits of MPS server {pid} in {}: {}",
                pipe.display(),
                match res {
                    Ok(a) => a.lines.join("; "),
                    Err(e) => crate::vocab::chain(&e),
                }
            );
        }
    }
}

/// The pids of the servers the daemon runs (none when it cannot be asked).
fn servers(pipe: &Path, daemon: ProcId) -> Vec<u32> {
    protocol::converse(pipe, daemon, &[GET_SERVERS], ANSWER_TIMEOUT)
        .map(|a| server_pids(&a.lines))
        .unwrap_or_default()
}

/// The limits each running server has now, as far as they can be read within about one
/// [`ANSWER_TIMEOUT`] in all (a server that cannot be read is left out).
pub fn server_limits(pipe: &Path, daemon: ProcId) -> Vec<(u32, Limits)> {
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    for pid in servers(pipe, daemon) {
        let left = ANSWER_TIMEOUT.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        let cmds = [
            format!("get_active_thread_percentage {pid}"),
            format!("get_device_pinned_mem_limit {pid} 0"),
        ];
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        if let Some(l) = protocol::converse(pipe, daemon, &refs, left)
            .ok()
            .and_then(|a| parse_defaults(&a.lines.join("\n")))
        {
            out.push((pid, l));
        }
    }
    out
}

/// The server pids in the answer to `get_server_list` (one or more per line).
fn server_pids(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The commands that set server `pid`'s limits and read them back.
fn server_commands(pid: u32, limits: &Limits) -> [String; 4] {
    [
        format!("set_active_thread_percentage {pid} {}", limits.cores),
        format!(
            "set_device_pinned_mem_limit {pid} 0 {}M",
            limits.memory_mib.unwrap_or(0)
        ),
        format!("get_active_thread_percentage {pid}"),
        format!("get_device_pinned_mem_limit {pid} 0"),
    ]
}

/// Stops the daemon `daemon` (one gpushare started): `quit` over its proven socket, then
/// SIGTERM/SIGKILL through a pidfd if it lingers. Without a daemon nothing is sent or
/// signalled. Idempotent.
pub fn stop(pipe: &Path, daemon: Option<ProcId>) {
    let Some(p) = daemon else {
        return;
    };
    if p.is_alive() {
        // A daemon that takes `quit` is given time to exit; one that does not answer (hung, or
        // its socket taken) is signalled at once.
        let grace = match protocol::converse(pipe, p, &["quit"], ANSWER_TIMEOUT) {
            Ok(_) => QUIT_TIMEOUT,
            Err(_) => Duration::ZERO,
        };
        stop_process(p, grace);
    }
    if let Some(dir) = pipe.parent() {
        find::forget(&MpsDirs::new(dir.to_owned()), p);
    }
}

/// The control commands that set a domain's defaults to `limits`.
fn defaults_commands(limits: &Limits) -> [String; 2] {
    [
        format!("set_default_active_thread_percentage {}", limits.cores),
        format!(
            "set_default_device_pinned_mem_limit 0 {}M",
            limits.memory_mib.unwrap_or(0)
        ),
    ]
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
/// [`Control`]. Every call that talks to a daemon names the one gpushare recorded (`daemon`);
/// nothing is sent to, or believed from, a socket another process listens on.
pub trait MpsControl {
    /// The control binary.
    fn binary(&self) -> &Path;
    /// Starts a daemon in `dirs` (prepared) for GPU `uuid`, records it, waits until it answers.
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
    /// Whether `daemon` answers a command on `pipe` within [`ANSWER_TIMEOUT`].
    fn answers(&self, pipe: &Path, daemon: ProcId) -> bool;
    /// The check a joining container needs: `daemon` answers within [`ANSWER_TIMEOUT`], and
    /// its defaults are put back to `limits` (a tenant's change does not outlive the next
    /// acquire), in one conversation.
    ///
    /// # Errors
    /// [`MpsError::Tampered`] when another process holds the socket; other [`MpsError`]s when
    /// the daemon does not answer in time or refuses.
    fn refresh(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError>;
    /// Sets the defaults; see [`set_defaults`].
    ///
    /// # Errors
    /// [`MpsError`] when the daemon refuses or cannot be proven.
    fn set_defaults(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError>;
    /// Reads the defaults; see [`defaults`].
    ///
    /// # Errors
    /// [`MpsError`] when the daemon cannot be proven or asked.
    fn defaults(&self, pipe: &Path, daemon: ProcId) -> Result<Limits, MpsError>;
    /// Sends what is left to send once no lock is held (nothing, for the real control).
    fn flush(&self) {}
    /// Stops `daemon` (one gpushare started) serving `pipe`; see [`stop`]. Idempotent.
    fn stop(&self, pipe: &Path, daemon: Option<ProcId>);
    /// The daemon gpushare started for `pipe` and recorded in its domain directory, if it
    /// still runs (see [`find`]); never a process recognised by its looks.
    fn find_daemon(&self, pipe: &Path) -> Option<ProcId>;
}

impl MpsControl for Control {
    fn binary(&self) -> &Path {
        &self.binary
    }
    fn start(
        &self,
        uuid: &str,
        dirs: &MpsDirs,
        multiuser: bool,
        ready_timeout: Duration,
    ) -> Result<ProcId, MpsError> {
        // One daemon per pipe directory: a second would take over the socket names while the
        // first still serves its clients.
        if let Some(p) = self.find_daemon(&dirs.pipe) {
            return Err(MpsError::AlreadyServed {
                pipe: dirs.pipe.clone(),
                pid: p.pid,
            });
        }
        let flag = if multiuser {
            Some(
                crate::host::multiuser::flag_for(&self.binary).map_err(|reason| {
                    MpsError::NoMultiUser {
                        binary: self.binary.clone(),
                        reason,
                    }
                })?,
            )
        } else {
            None
        };
        spawn::start(&self.binary, uuid, dirs, flag, ready_timeout)
    }
    fn answers(&self, pipe: &Path, daemon: ProcId) -> bool {
        protocol::converse(pipe, daemon, &[GET_THREADS], ANSWER_TIMEOUT)
            .is_ok_and(|a| !a.lines.is_empty())
    }
    fn refresh(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
        set_defaults(pipe, daemon, limits)
    }
    fn set_defaults(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
        set_defaults(pipe, daemon, limits)
    }
    fn defaults(&self, pipe: &Path, daemon: ProcId) -> Result<Limits, MpsError> {
        defaults(pipe, daemon)
    }
    fn stop(&self, pipe: &Path, daemon: Option<ProcId>) {
        stop(pipe, daemon);
    }
    fn find_daemon(&self, pipe: &Path) -> Option<ProcId> {
        find::running(pipe)
    }
}

#[cfg(test)]
mod settings_tests;
