//! The reaper: a share ends when its container's process ends, not when the engine gets round to
//! the poststop hook (CRI-O runs it at RemoveContainer, podman and Docker at removal of a
//! stopped container, and some engines never when they die with it).
//!
//! After an acquire, [`ensure`] starts `gpushare-hook reap GPU` for each GPU of the plan unless
//! one already runs. The reaper holds `<state>/reapers/<GPU>.lock` (flock, released by the
//! kernel when it dies), waits on pidfds of the clients recorded on that GPU (pid plus start
//! time, so a reused pid is never taken for the client) and on the record changing (inotify),
//! and when a client's process has exited it runs one release step under the GPU's lock, as
//! poststop would: the client is dropped, a domain nobody uses has its daemon stopped and the
//! compute mode put back. It signals nothing itself; daemons are stopped only by that release
//! step. Once the record holds no client with a process it stays for [`IDLE_LINGER`], waiting
//! for the next acquire's client: starting a reaper anew costs the next create on an idle GPU
//! the move out of the hook's cgroups, which waits for an RCU grace period (6-14 ms against
//! 0.02 ms right after another migration). Then it exits, under the GPU's lock so that no
//! acquire can slip in unseen. A reaper whose binary was replaced or removed (a package
//! upgrade or removal) does not stay: an idle one exits within `IDLE_CHECK` (2 s), and one that
//! cannot read the record gives way to a new one. Killed, it loses nothing: the next acquire
//! starts another, and `gc` still drops clients whose process is gone.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::config::{Config, Source};
use crate::host::acquire::Host;
use crate::host::procinfo::ProcId;
use crate::host::state::{Record, StateDir, StateError};
use crate::vocab::Inventory;

/// How long the reaper waits without any event before it looks at the record again.
const RESCAN: Duration = Duration::from_secs(30);
/// How long the reaper lets a change settle before it looks ([`settle`]).
const SETTLE: Duration = Duration::from_millis(10);
/// After a release step that failed, how long before the next try.
const RETRY: Duration = Duration::from_secs(1);
/// How long a reaper whose GPU has no client left waits for the next one before it exits.
pub const IDLE_LINGER: Duration = Duration::from_secs(600);
/// How often an idle reaper looks whether its binary is still there: one removed by a package's
/// removal or upgrade (with a state dir the package does not remove) ends it within this.
const IDLE_CHECK: Duration = Duration::from_secs(2);

/// Whether this process's executable was replaced or removed since it started (a package
/// upgrade renames a new binary over it): the kernel then names it "(deleted)".
fn binary_replaced() -> bool {
    std::fs::read_link("/proc/self/exe")
        .is_ok_and(|p| p.as_os_str().as_encoded_bytes().ends_with(b" (deleted)"))
}

#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    #[error("reaper lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GPU name: {0:?}")]
    BadGpu(String),
    #[error("cannot watch {path} for changes: {source}")]
    Watch { path: PathBuf, source: nix::Error },
}

/// The lock a GPU's reaper holds while it runs.
pub fn lock_path(state: &StateDir, uuid: &str) -> PathBuf {
    state.reaper_lock_path(uuid)
}

/// The clients of `rec` whose process can be waited on.
pub fn watched(rec: &Record) -> Vec<ProcId> {
    rec.clients.values().filter_map(|c| c.process).collect()
}

/// Takes the reaper lock of `uuid` without waiting: `None` when another process holds it.
fn try_lock(state: &StateDir, uuid: &str) -> Result<Option<Flock<File>>, ReaperError> {
    let path = lock_path(state, uuid);
    let err = |source| ReaperError::Lock {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(dir)
            .map_err(err)?;
    }
    let f = crate::host::lockfile::open(&path).map_err(err)?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(err(e.into())),
    }
}

/// Writes who holds the reaper lock `l` (this process), for `StateDir::reaper_alive`, which
/// reads instead of locking.
fn stamp(l: &mut Flock<File>) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    let me = ProcId::of(std::process::id() as i32);
    let text = me.map_or_else(String::new, |p| format!("{} {}\n", p.pid, p.start_time));
    l.set_len(0)?;
    l.rewind()?;
    l.write_all(text.as_bytes())
}

/// Whether a reaper runs for `uuid` (someone holds its lock). Asking takes the lock for a
/// moment when it is free, and leaves its stamp as it was.
pub fn running(state: &StateDir, uuid: &str) -> bool {
    matches!(try_lock(state, uuid), Ok(None))
}

/// Starts a reaper for each of `uuids` that has none, as `gpushare-hook reap UUID` with this
/// policy file, detached from the caller (own session, no inherited descriptors, out of the
/// caller's cgroups as the MPS daemon is). Failures are logged: the share works without it, and
/// `gc` or the next acquire catches up.
pub fn ensure(state: &StateDir, source: &Source, uuids: &[&str]) {
    for uuid in uuids {
        if running(state, uuid) {
            continue;
        }
        match spawn(source, uuid) {
            Ok(pid) => tracing::debug!(uuid, pid, "reaper started"),
            Err(e) => {
                tracing::warn!(uuid, error = %e, "cannot start the reaper; exited containers are released at poststop or by gc")
            }
        }
    }
}

fn spawn(source: &Source, uuid: &str) -> std::io::Result<i32> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    match source {
        Source::Flag(p) | Source::Env(p) => {
            cmd.arg("--config").arg(p);
        }
        Source::Default => {}
    }
    cmd.arg("reap")
        .arg(uuid)
        // A test's failpoint is for the hook it was given to.
        .env_remove("GPUSHARE_FAILPOINT")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    crate::sys::detached(&mut cmd);
    // Not waited for: it outlives the hook and is reparented.
    Ok(crate::host::mps::spawn_out_of_cgroups(&mut cmd)?.id())
}

/// What one look at the clients found.
enum Look {
    /// Every watched client lives: wait on these.
    Wait(Vec<OwnedFd>),
    /// A client's process has exited (or its pid is someone else's now).
    Exited,
}

fn look(clients: &[ProcId]) -> Look {
    let mut fds = Vec::with_capacity(clients.len());
    for p in clients {
        match crate::sys::pidfd_open(p.pid) {
            // Checked after opening: the descriptor is then the recorded process's.
            Ok(fd) if p.is_alive() => fds.push(fd),
            _ => return Look::Exited,
        }
    }
    Look::Wait(fds)
}

/// Waits until a watched client's pidfd is readable (its process exited), `record` (the GPU's
/// record file name) is written or removed, or the watched directory goes, and then lets the
/// change [`settle`]; or until `timeout` passes. Other names in the directory (other GPUs'
/// records, every hook's lock files, temp files) change with each hook on the node: they do not
/// wake the reaper.
fn wait(fds: &[OwnedFd], inotify: &Inotify, record: &std::ffi::OsStr, timeout: Duration) {
    let end = std::time::Instant::now() + timeout;
    loop {
        let mut polls: Vec<PollFd<'_>> = fds
            .iter()
            .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
            .collect();
        polls.push(PollFd::new(inotify.as_fd(), PollFlags::POLLIN));
        let left = end.saturating_duration_since(std::time::Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        if nix::poll::poll(&mut polls, PollTimeout::from(ms)).is_ok_and(|n| n == 0) {
            return;
        }
        let exited = polls[..fds.len()]
            .iter()
            .any(|p| p.revents().is_some_and(|r| !r.is_empty()));
        let mut ours = false;
        while let Ok(events) = inotify.read_events() {
            if events.is_empty() {
                break;
            }
            ours |= events.iter().any(|e| {
                e.name.as_deref() == Some(record)
                    || e.mask
                        .intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_IGNORED)
            });
        }
        if exited || ours {
            settle(inotify);
            return;
        }
        if std::time::Instant::now() >= end {
            return;
        }
    }
}

/// After a wake for a change: sleeps [`SETTLE`] before the reaper looks, then drains what came
/// meanwhile. The hook whose rename of the record woke it is still running (its mounts, events
/// and exit are left), and a reaper that read the record and opened its clients' pidfds at once
/// took the CPU from it (a warm MPS join's `rename` took 0.28-0.35 ms then, against 0.035 ms
/// with the reaper stopped); a client's exit is usually followed by its poststop, which then
/// releases it first. Changes that come meanwhile are read in the same look.
fn settle(inotify: &Inotify) {
    std::thread::sleep(SETTLE);
    while inotify.read_events().is_ok_and(|e| !e.is_empty()) {}
}

/// The reaper of GPU `uuid` (`gpushare-hook reap`). Returns at once when another reaper runs.
/// NVML is opened (`open_inventory`) only for a release step and closed after it, so that a
/// waiting reaper holds no GPU device open (`reap` gives an inventory that loads it only when the
/// step needs it: [`crate::host::inventory::OnFirstUse`]). `linger`: how long it waits, once the GPU has no
/// client, for the next one ([`IDLE_LINGER`]).
///
/// # Errors
/// [`ReaperError`] when its lock or the watch on the state directory cannot be set up.
pub fn run(
    cfg: &Config,
    uuid: &str,
    open_inventory: &dyn Fn() -> Box<dyn Inventory>,
    linger: Duration,
) -> Result<(), ReaperError> {
    let state = StateDir::new(&cfg.state_dir);
    let Some(mut mine) = try_lock(&state, uuid)? else {
        return Ok(());
    };
    stamp(&mut mine).map_err(|source| ReaperError::Lock {
        path: lock_path(&state, uuid),
        source,
    })?;
    let gpus = state.gpus_dir();
    let record = state
        .record_path(uuid)
        .file_name()
        .map(std::ffi::OsStr::to_owned)
        .unwrap_or_default();
    let inotify =
        Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(|source| {
            ReaperError::Watch {
                path: gpus.clone(),
                source,
            }
        })?;
    inotify
        .add_watch(
            &gpus,
            AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_DELETE_SELF,
        )
        .map_err(|source| ReaperError::Watch {
            path: gpus.clone(),
            source,
        })?;
    // Since when the GPU has had no client (its linger ends `linger` after).
    let mut idle_since: Option<std::time::Instant> = None;
    loop {
        // The directory it watches is gone (the state dir removed, or emptied, under it):
        // nothing is left to reap, and no change would ever wake it again.
        if !state.root().exists() || !gpus.is_dir() {
            return Ok(());
        }
        let clients = match state.load(uuid) {
            Ok(rec) => rec.as_ref().map(watched).unwrap_or_default(),
            // A record a newer gpushare wrote: this reaper's lock goes with it, so that the
            // next acquire starts one of the new binary.
            Err(_) if binary_replaced() => return Ok(()),
            Err(e) => {
                tracing::warn!(uuid, error = %crate::vocab::chain(&e), "reaper: record unreadable; waiting");
                wait(&[], &inotify, &record, RESCAN);
                continue;
            }
        };
        if !clients.is_empty() {
            idle_since = None;
        } else {
            // Idle: the next acquire's client is likely soon, and a reaper started anew would
            // cost it a cgroup move's RCU grace period. Any change of the record wakes it.
            let left = linger.saturating_sub(
                idle_since
                    .get_or_insert_with(std::time::Instant::now)
                    .elapsed(),
            );
            if !left.is_zero() && !binary_replaced() {
                wait(&[], &inotify, &record, left.min(IDLE_CHECK));
                continue;
            }
            match done(cfg, &state, uuid, mine) {
                Finish::Done => return Ok(()),
                Finish::Joined(kept) => {
                    mine = kept;
                    continue;
                }
                Finish::Busy(kept) => {
                    // The GPU's lock could not be had: wait before trying again, never spin.
                    mine = kept;
                    wait(&[], &inotify, &record, RETRY);
                    continue;
                }
            }
        }
        match look(&clients) {
            Look::Wait(fds) => wait(&fds, &inotify, &record, RESCAN),
            Look::Exited => match release(cfg, uuid, open_inventory) {
                Ok(lines) => {
                    for l in lines {
                        tracing::info!(uuid, "reaper: {l}");
                    }
                }
                Err(e) => {
                    tracing::warn!(uuid, error = %crate::vocab::chain(&e), "reaper: release failed; retrying");
                    wait(&[], &inotify, &record, RETRY);
                }
            },
        }
    }
}

/// One release step with NVML open for it (the compute mode may have to be put back).
fn release(
    cfg: &Config,
    uuid: &str,
    open_inventory: &dyn Fn() -> Box<dyn Inventory>,
) -> Result<Vec<String>, StateError> {
    let inventory = open_inventory();
    let host = Host::new(cfg, inventory.as_ref());
    let lines = host.release_exited(uuid)?;
    host.flush();
    // What the reaper did is healing like gc's: counted and written to the event log with the
    // same kinds (a dropped client, a stopped daemon), as each step is done.
    crate::host::events::note_gc(&lines);
    crate::host::events::flush_if_any(cfg);
    Ok(lines)
}

/// How a reaper with no client left to watch ends.
enum Finish {
    /// Its lock is given back: the reaper is done.
    Done,
    /// An acquire came in: keep reaping, with this lock.
    Joined(Flock<File>),
    /// The GPU's lock could not be had now: try again later, with this lock.
    Busy(Flock<File>),
}

/// Under the GPU's lock: when the record still holds no client to watch, gives the reaper lock
/// back (so that the next acquire starts a new reaper): [`Finish::Done`].
fn done(cfg: &Config, state: &StateDir, uuid: &str, mine: Flock<File>) -> Finish {
    let timeout = Duration::from_secs(cfg.lock_timeout_seconds);
    let gpu_lock = match state.lock(uuid, timeout, "reaper") {
        Ok(l) => l,
        // The state dir (or its gpus/) is gone: nothing left to watch.
        Err(_) if !state.root().exists() || !state.gpus_dir().is_dir() => return Finish::Done,
        Err(e) => {
            tracing::warn!(uuid, error = %crate::vocab::chain(&e), "reaper: cannot take the GPU's lock; retrying");
            return Finish::Busy(mine);
        }
    };
    let empty = match state.load(uuid) {
        Ok(rec) => rec.as_ref().map(watched).unwrap_or_default().is_empty(),
        Err(_) => false,
    };
    if !empty {
        return Finish::Joined(mine);
    }
    // No longer running as far as `StateDir::reaper_alive` can tell, before the lock goes: an
    // acquire after this one drops its stale clients itself until the next reaper stamps.
    let _ = mine.set_len(0);
    drop(mine);
    drop(gpu_lock);
    Finish::Done
}

#[cfg(test)]
mod tests;
