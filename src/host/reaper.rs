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
//! step. It exits, under the GPU's lock so that no acquire can slip in unseen, once the record
//! holds no client with a process. Killed, it loses nothing: the next acquire starts another,
//! and `gc` still drops clients whose process is gone.

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
/// After a release step that failed, how long before the next try.
const RETRY: Duration = Duration::from_secs(1);

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
    let child = cmd.spawn()?;
    let pid = child.id() as i32;
    crate::host::mps::leave_cgroups(pid);
    // Not waited for: it outlives the hook and is reparented.
    Ok(pid)
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

/// Waits until one of `fds` or `inotify` is readable, or `timeout`; drains `inotify`.
/// Waits until a watched client's pidfd is readable (its process exited), `record` (the GPU's
/// record file name) is written or removed, the watched directory goes, or `timeout` passes.
/// Other names in the directory (other GPUs' records, every hook's lock files, temp files)
/// change with each hook on the node: they do not wake the reaper.
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
        if exited || ours || std::time::Instant::now() >= end {
            return;
        }
    }
}

/// The reaper of GPU `uuid` (`gpushare-hook reap`). Returns at once when another reaper runs.
/// NVML is opened (`open_inventory`) only for a release step and closed after it, so that a
/// waiting reaper holds no GPU device open.
///
/// # Errors
/// [`ReaperError`] when its lock or the watch on the state directory cannot be set up.
pub fn run(
    cfg: &Config,
    uuid: &str,
    open_inventory: &dyn Fn() -> Box<dyn Inventory>,
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
    loop {
        // The directory it watches is gone (the state dir removed, or emptied, under it):
        // nothing is left to reap, and no change would ever wake it again.
        if !state.root().exists() || !gpus.is_dir() {
            return Ok(());
        }
        let clients = match state.load(uuid) {
            Ok(rec) => rec.as_ref().map(watched).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(uuid, error = %crate::vocab::chain(&e), "reaper: record unreadable; waiting");
                wait(&[], &inotify, &record, RESCAN);
                continue;
            }
        };
        if clients.is_empty() {
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
mod tests {
    use super::*;
    use crate::host::fakes::{uuid, FakeInventory};
    use crate::host::state::Client;
    use crate::vocab::{ComputeMode, Mode};

    /// Waits (at most 10 s) until `cond` holds.
    fn until(what: &str, cond: impl Fn() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < end, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn client(process: Option<ProcId>) -> Client {
        Client {
            mode: Mode::Timeslice,
            process,
            cores: 100,
            memory: None,
            domain: None,
            kube: Default::default(),
            cap: None,
        }
    }

    /// CPU time (user + system, clock ticks) of thread `tid` of this process.
    fn cpu_ticks(tid: i32) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    /// A reaper on GPU 0 whose clients are processes of this test's own: it holds its lock
    /// (stamped with this process), sleeps while they live, releases each as it exits (its
    /// gc event written), and ends, its stamp cleared, once no client with a process is left.
    #[test]
    fn a_reaper_sleeps_releases_each_exited_client_and_ends() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: dir.path().join("state"),
            log_file: dir.path().join("gpushare.log"),
            lock_timeout_seconds: 5,
            ..Config::default()
        };
        let sd = StateDir::new(&cfg.state_dir);
        sd.ensure().unwrap();
        let u = uuid(0);
        assert_eq!(
            lock_path(&sd, &u),
            sd.root().join(format!("reapers/{u}.lock"))
        );
        // Killed when dropped, so that a failing check cannot leave the reaper waiting on them.
        struct Kid(std::process::Child);
        impl Drop for Kid {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let a = Kid(Command::new("sleep").arg("60").spawn().unwrap());
        let b = Kid(Command::new("sleep").arg("60").spawn().unwrap());
        let proc_of = |c: &Kid| ProcId::of(c.0.id() as i32).unwrap();
        let mut rec = Record::new(&u, 0);
        rec.clients.insert("ca".into(), client(Some(proc_of(&a))));
        rec.clients.insert("cb".into(), client(Some(proc_of(&b))));
        rec.clients.insert("cn".into(), client(None));
        assert_eq!(watched(&rec), [proc_of(&a), proc_of(&b)]);
        sd.save(&rec).unwrap();
        let clients = || -> Vec<String> {
            sd.load(&u)
                .unwrap()
                .map(|r| r.clients.into_keys().collect())
                .unwrap_or_default()
        };
        assert!(!running(&sd, &u));
        assert!(
            !sd.reaper_alive(&u),
            "asking whether one runs stamps nothing"
        );
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (cfg, u) = (&cfg, &u);
            let reaper = s.spawn(move || {
                tx.send(nix::unistd::gettid().as_raw()).unwrap();
                run(cfg, u, &|| {
                    Box::new(FakeInventory::new(&[(0, ComputeMode::Default)]))
                })
            });
            let tid = rx.recv().unwrap();
            // The stamp that says this live process holds the lock (written once it has it;
            // asking `running` meanwhile could take the free lock from under a starting
            // reaper, which then leaves it to the asker, as a hook's check does).
            until("the reaper stamps its lock", || sd.reaper_alive(u));
            assert!(running(&sd, u));
            // A second reaper for the GPU returns at once.
            run(cfg, u, &|| unreachable!("the second reaper opened NVML")).unwrap();
            // While its clients live it sleeps: almost no CPU over a while.
            let before = cpu_ticks(tid);
            std::thread::sleep(Duration::from_millis(300));
            assert!(cpu_ticks(tid) - before <= 5, "the reaper spins");
            drop(a);
            until("ca released", || clients() == ["cb", "cn"]);
            assert!(!reaper.is_finished(), "cb still lives");
            // A client added meanwhile (the record changes) is watched too.
            let c = Kid(Command::new("sleep").arg("60").spawn().unwrap());
            let mut rec = sd.load(u).unwrap().unwrap();
            rec.clients.insert("cc".into(), client(Some(proc_of(&c))));
            sd.save(&rec).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            drop(c);
            until("cc released", || clients() == ["cb", "cn"]);
            drop(b);
            // The last watched client's exit wakes it at once (not at its next rescan).
            until("the reaper ends", || reaper.is_finished());
            reaper.join().unwrap().unwrap();
        });
        assert_eq!(
            clients(),
            ["cn"],
            "a client without a process is left to poststop"
        );
        assert!(!running(&sd, &u));
        assert!(!sd.reaper_alive(&u), "its stamp cleared");
        let events = std::fs::read_to_string(cfg.events_file()).unwrap();
        for c in ["ca", "cb"] {
            assert!(
                events
                    .lines()
                    .any(|l| l.contains(r#""kind":"drop_client""#) && l.contains(c)),
                "{c}: {events}"
            );
        }
    }

    /// A config whose state dir (made) is under `dir`, with a GPU lock timeout of 1 s.
    fn cfg_in(dir: &std::path::Path) -> Config {
        let cfg = Config {
            state_dir: dir.join("state"),
            log_file: dir.join("gpushare.log"),
            lock_timeout_seconds: 1,
            ..Config::default()
        };
        StateDir::new(&cfg.state_dir).ensure().unwrap();
        cfg
    }

    fn fake_nvml() -> Box<dyn Inventory> {
        Box::new(FakeInventory::new(&[(0, ComputeMode::Default)]))
    }

    /// A reaper with nothing left to watch ends under the GPU's lock: while another holds that
    /// lock it waits (and keeps its stamp), and it ends once the lock is free.
    #[test]
    fn a_reaper_ends_only_under_the_gpu_s_lock() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        let sd = StateDir::new(&cfg.state_dir);
        let u = uuid(0);
        let mut rec = Record::new(&u, 0);
        rec.clients.insert("cn".into(), client(None));
        sd.save(&rec).unwrap();
        let held = sd.lock(&u, Duration::from_secs(1), "the test").unwrap();
        std::thread::scope(|s| {
            let (cfg, u) = (&cfg, &u);
            let reaper = s.spawn(move || run(cfg, u, &fake_nvml));
            until("the reaper stamps its lock", || sd.reaper_alive(u));
            std::thread::sleep(Duration::from_millis(1500));
            assert!(!reaper.is_finished(), "ended without the GPU's lock");
            assert!(sd.reaper_alive(u));
            drop(held);
            until("the reaper ends", || reaper.is_finished());
            reaper.join().unwrap().unwrap();
        });
        assert!(!sd.reaper_alive(&u));
    }

    /// The state directory removed under a waiting reaper (its watch goes with it): it ends.
    #[test]
    fn a_reaper_whose_state_dir_is_removed_ends() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        let sd = StateDir::new(&cfg.state_dir);
        let u = uuid(0);
        let mut kid = Command::new("sleep").arg("60").spawn().unwrap();
        let mut rec = Record::new(&u, 0);
        rec.clients
            .insert("c1".into(), client(ProcId::of(kid.id() as i32)));
        sd.save(&rec).unwrap();
        let ended = std::thread::scope(|s| {
            let (cfg, u) = (&cfg, &u);
            let reaper = s.spawn(move || run(cfg, u, &fake_nvml));
            until("the reaper stamps its lock", || sd.reaper_alive(u));
            // (What the reaper writes as it wakes may race one removal: removed again.)
            let mut tries = 0;
            while let Err(e) = std::fs::remove_dir_all(sd.root()) {
                tries += 1;
                assert!(tries < 100, "cannot remove the state dir: {e}");
            }
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while !reaper.is_finished() && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            let ended = reaper.is_finished();
            // Let a reaper that did not end go, so that the scope can.
            let _ = kid.kill();
            let _ = kid.wait();
            ended
        });
        assert!(ended, "the reaper went on without its state dir");
    }

    /// A client released by someone else (poststop) while its process lives: the record goes,
    /// and the reaper, woken by that, ends.
    #[test]
    fn a_reaper_whose_record_is_removed_ends() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        let sd = StateDir::new(&cfg.state_dir);
        let u = uuid(0);
        let mut kid = Command::new("sleep").arg("60").spawn().unwrap();
        let mut rec = Record::new(&u, 0);
        rec.clients
            .insert("c1".into(), client(ProcId::of(kid.id() as i32)));
        sd.save(&rec).unwrap();
        let ended = std::thread::scope(|s| {
            let (cfg, u) = (&cfg, &u);
            let reaper = s.spawn(move || run(cfg, u, &fake_nvml));
            until("the reaper stamps its lock", || sd.reaper_alive(u));
            // What a release of the last client saves: an empty record, which removes the file.
            sd.save(&Record::new(u, 0)).unwrap();
            assert!(!sd.record_path(u).exists());
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while !reaper.is_finished() && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            let ended = reaper.is_finished();
            let _ = kid.kill();
            let _ = kid.wait();
            ended
        });
        assert!(ended, "the reaper went on after its record was removed");
    }

    /// A client whose pid now belongs to another process (its start time differs) has exited:
    /// it is released, and the other process is not waited on.
    #[test]
    fn a_client_whose_pid_was_reused_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        let sd = StateDir::new(&cfg.state_dir);
        let u = uuid(0);
        let mut other = Command::new("sleep").arg("60").spawn().unwrap();
        let mut gone = ProcId::of(other.id() as i32).unwrap();
        gone.start_time += 1;
        let mut rec = Record::new(&u, 0);
        rec.clients.insert("c1".into(), client(Some(gone)));
        sd.save(&rec).unwrap();
        let r = run(&cfg, &u, &fake_nvml);
        let _ = other.kill();
        let _ = other.wait();
        r.unwrap();
        assert_eq!(sd.load(&u).unwrap(), None, "released, and the record gone");
    }
}
