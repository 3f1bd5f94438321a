//! The state directory: per-GPU JSON records, their `flock` locks, atomic writes.
//!
//! Layout under `state_dir` (mode 0700):
//! - `gpus/<uuid>.lock`: the GPU's lock file; its content names the current holder.
//! - `gpus/<uuid>.json`: the GPU's [`Record`], written to a temp file, fsynced and renamed.
//! - `mps/<id>/{owner,pipe,log,shm}`: the directories of one isolation domain's MPS daemon
//!   (see [`crate::host::mps`]); `<id>` is a digest of the GPU and the domain key (`gpu`,
//!   `g-<group>` or `c-<container>`), which `owner` names.
//! - `containers/<id>/`: per-container files (limit mode).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::decide::kube::KubeLabels;
use crate::host::mps::MpsDirs;
use crate::host::procinfo::ProcId;
use crate::vocab::is_safe_name;
use crate::vocab::{ComputeMode, Limits, Mode};

/// Version of the record layout.
pub const RECORD_VERSION: u32 = 2;
/// Largest record read back.
const MAX_RECORD_BYTES: u64 = 4 << 20;

/// State that cannot be read or written.
#[derive(Debug, Error)]
pub enum StateError {
    #[error("cannot create state directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {path} is not a directory owned by this user; remove it or set state_dir elsewhere")]
    Unsafe { path: PathBuf },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {seconds}s waiting for the lock on GPU {uuid}, held by {holder}; retry, or stop that process if it is stuck (the lock goes with it)")]
    LockTimeout {
        uuid: String,
        seconds: u64,
        holder: String,
    },
    #[error("cannot read record {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("record {path} is corrupt; run `gpushare-hook gc`, which keeps it aside and rebuilds it from the running daemons")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("record {path} has layout version {found}, this gpushare reads {RECORD_VERSION}; run `gpushare-hook gc`, which keeps it aside and rebuilds it from the running daemons")]
    Version { path: PathBuf, found: u32 },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One container using a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    pub mode: Mode,
    /// The container's init process; `None` when the runtime gave no pid (then the client is
    /// only dropped by poststop).
    pub process: Option<ProcId>,
    pub cores: u8,
    pub memory: Option<u64>,
    /// `mps`: the key of the isolation domain it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The container's Kubernetes names, when a CRI engine gave them (for metrics).
    #[serde(default, skip_serializing_if = "KubeLabels::is_empty")]
    pub kube: KubeLabels,
    /// Its memory cap for the whole container, and what enforces it (`None`: uncapped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<Cap>,
}

/// A container's memory cap on one GPU (all its processes together) and what enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cap {
    pub bytes: u64,
    #[serde(flatten)]
    pub enforcement: crate::vocab::memcap::Enforcement,
}

/// An MPS control daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Daemon {
    pub process: ProcId,
}

/// One MPS isolation domain on a GPU: its daemon, the limits that daemon enforces, and the
/// spec edits that reserved its directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Domain {
    pub daemon: Option<Daemon>,
    /// The daemon's defaults as gpushare set them: the domain's enforced limits.
    pub limits: Limits,
    /// The uid its clients run as (one per daemon when the driver has no multi-user server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Spec edits that made the domain's directories a mount source for a container whose
    /// hook has not run yet, by key, with the time (seconds since the epoch). While one is
    /// fresh the directories stay even when the daemon stops, so that container's mounts keep
    /// working.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, u64>,
}

impl Domain {
    pub fn new(limits: Limits) -> Self {
        Self {
            daemon: None,
            limits,
            uid: None,
            reserved: BTreeMap::new(),
        }
    }
}

/// Everything recorded about one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    pub uuid: String,
    pub index: u32,
    /// The compute mode to put back once no daemon of gpushare's runs on the GPU. Written
    /// (and saved) before gpushare changes the mode, so a hook killed in between leaves a
    /// record that says what to restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_compute_mode: Option<ComputeMode>,
    /// MPS isolation domains by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub domains: BTreeMap<String, Domain>,
    /// Clients by container id; a domain's reference count is the number of its clients.
    pub clients: BTreeMap<String, Client>,
}

/// How long a spec edit's reservation of a GPU's MPS directories lasts.
pub const RESERVATION_SECONDS: u64 = 120;

fn fresh(at: u64, now: u64) -> bool {
    now.saturating_sub(at) < RESERVATION_SECONDS && at <= now + 60
}

/// Seconds since the epoch.
pub fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Record {
    pub fn new(uuid: &str, index: u32) -> Self {
        Self {
            version: RECORD_VERSION,
            uuid: uuid.to_owned(),
            index,
            restore_compute_mode: None,
            domains: BTreeMap::new(),
            clients: BTreeMap::new(),
        }
    }

    /// Drops reservations older than [`RESERVATION_SECONDS`] (or from the future).
    pub fn prune_reservations(&mut self, now: u64) -> Vec<(String, String)> {
        let mut dropped = Vec::new();
        for (domain, d) in &mut self.domains {
            d.reserved.retain(|key, at| {
                let keep = fresh(*at, now);
                if !keep {
                    dropped.push((domain.clone(), key.clone()));
                }
                keep
            });
        }
        dropped
    }

    /// Removes `key`'s reservations in every domain.
    pub fn unreserve(&mut self, key: &str) {
        for d in self.domains.values_mut() {
            d.reserved.remove(key);
        }
    }

    /// The ids of the clients of domain `key`.
    pub fn domain_clients(&self, key: &str) -> Vec<String> {
        self.clients
            .iter()
            .filter(|(_, c)| c.domain.as_deref() == Some(key))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether a container uses, or is about to mount, the directories of domain `key`.
    pub fn dirs_in_use(&self, key: &str, now: u64) -> bool {
        !self.domain_clients(key).is_empty()
            || self
                .domains
                .get(key)
                .is_some_and(|d| d.reserved.values().any(|at| fresh(*at, now)))
    }

    /// Whether any domain has a recorded daemon.
    pub fn has_daemon(&self) -> bool {
        self.domains.values().any(|d| d.daemon.is_some())
    }

    /// The mode the GPU currently serves (that of its clients), if any.
    pub fn serving(&self) -> Option<Mode> {
        if self.has_daemon() || self.clients.values().any(|c| c.mode == Mode::Mps) {
            return Some(Mode::Mps);
        }
        self.clients.values().next().map(|c| c.mode)
    }

    /// Drops clients whose process is gone; returns their ids.
    pub fn drop_stale(&mut self) -> Vec<String> {
        let stale: Vec<String> = self
            .clients
            .iter()
            .filter(|(_, c)| c.process.is_some_and(|p| !p.is_alive()))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &stale {
            self.clients.remove(id);
        }
        stale
    }

    /// Forgets domains with no client, no daemon and no reservation.
    pub fn tidy(&mut self) {
        let used: std::collections::BTreeSet<String> = self
            .clients
            .values()
            .filter_map(|c| c.domain.clone())
            .collect();
        self.domains
            .retain(|k, d| used.contains(k) || d.daemon.is_some() || !d.reserved.is_empty());
    }

    /// Whether there is nothing to keep (then the record file is removed).
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty() && self.domains.is_empty() && self.restore_compute_mode.is_none()
    }
}

/// The name of a domain's directory: 16 base32 characters (80 bits) of SHA-256 over the GPU
/// and the domain, so that a tenant choosing a group name cannot aim at another domain's
/// directory.
pub fn domain_dir_name(uuid: &str, domain: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{uuid}/{domain}").as_bytes());
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut bits: u128 = 0;
    for b in &digest[..10] {
        bits = (bits << 8) | u128::from(*b);
    }
    (0..16)
        .rev()
        .map(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
        .collect()
}

/// Paths of the state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn gpus_dir(&self) -> PathBuf {
        self.root.join("gpus")
    }

    pub fn lock_path(&self, uuid: &str) -> PathBuf {
        self.gpus_dir().join(format!("{uuid}.lock"))
    }

    /// `<state>/reapers/<GPU>.lock`: held (flock) by the GPU's reaper while it runs, and
    /// holding its pid and start time.
    pub fn reaper_lock_path(&self, uuid: &str) -> PathBuf {
        self.root.join("reapers").join(format!("{uuid}.lock"))
    }

    /// Whether the GPU's reaper runs: the pid and start time it wrote into its lock file name
    /// a live process. Read, not locked, so that asking never keeps a starting reaper from its
    /// lock. A running reaper releases every client whose process exits (it waits on their
    /// pidfds), so an acquire need not check each client's liveness itself.
    pub fn reaper_alive(&self, uuid: &str) -> bool {
        let stamp =
            File::open(self.reaper_lock_path(uuid)).and_then(|f| crate::vocab::read_capped(f, 64));
        let Ok(Some(bytes)) = stamp else {
            return false;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut parts = text.split_ascii_whitespace();
        let pid = parts.next().and_then(|p| p.parse::<i32>().ok());
        let start_time = parts.next().and_then(|t| t.parse::<u64>().ok());
        match (pid, start_time) {
            (Some(pid), Some(start_time)) => ProcId { pid, start_time }.is_alive(),
            _ => false,
        }
    }

    pub fn record_path(&self, uuid: &str) -> PathBuf {
        self.gpus_dir().join(format!("{uuid}.json"))
    }

    /// `mps/`: the directories of every isolation domain's daemon.
    pub fn mps_root(&self) -> PathBuf {
        self.root.join("mps")
    }

    /// `mps/<id>`: the daemon directories of domain `domain` of GPU `uuid`. `<id>` is a short
    /// digest of the two, so that the daemon's socket paths stay within the 108 bytes a unix
    /// socket path may have whatever the domain is called; its `owner` file names them.
    pub fn mps_dirs(&self, uuid: &str, domain: &str) -> MpsDirs {
        MpsDirs::owned(
            self.mps_root().join(domain_dir_name(uuid, domain)),
            uuid,
            domain,
        )
    }

    /// `containers/<id>`: per-container files.
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.root.join("containers").join(id)
    }

    /// Creates the directory tree (mode 0700) and checks the root is not a symlink or owned by
    /// someone else.
    ///
    /// # Errors
    /// [`StateError`] when it cannot be created or is unsafe.
    pub fn ensure(&self) -> Result<(), StateError> {
        for dir in [self.root.clone(), self.gpus_dir()] {
            match fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(&dir)
            {
                Ok(()) => {}
                Err(source) => return Err(StateError::Dir { path: dir, source }),
            }
        }
        use std::os::unix::fs::MetadataExt;
        let meta = fs::symlink_metadata(&self.root).map_err(|source| StateError::Dir {
            path: self.root.clone(),
            source,
        })?;
        let me = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != me {
            return Err(StateError::Unsafe {
                path: self.root.clone(),
            });
        }
        if meta.mode() & 0o077 != 0 {
            // Ours, but too open (made by hand, or by an older install): tighten it.
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&self.root, fs::Permissions::from_mode(0o700)).map_err(
                |source| StateError::Dir {
                    path: self.root.clone(),
                    source,
                },
            )?;
        }
        Ok(())
    }

    /// All GPU records present (unlocked read, for listing and poststop's first pass).
    pub fn list_records(&self) -> Vec<(String, Result<Record, StateError>)> {
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(self.gpus_dir()) else {
            return out;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(uuid) = name.strip_suffix(".json") {
                if is_safe_name(uuid) {
                    out.push((
                        uuid.to_owned(),
                        self.load(uuid)
                            .map(|r| r.unwrap_or_else(|| Record::new(uuid, 0))),
                    ));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Loads a GPU's record; `None` when there is none.
    ///
    /// # Errors
    /// [`StateError`] when it cannot be read or parsed.
    pub fn load(&self, uuid: &str) -> Result<Option<Record>, StateError> {
        let path = self.record_path(uuid);
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let mut buf = Vec::new();
        f.take(MAX_RECORD_BYTES)
            .read_to_end(&mut buf)
            .map_err(|source| StateError::Read {
                path: path.clone(),
                source,
            })?;
        let rec: Record = serde_json::from_slice(&buf).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        if rec.version != RECORD_VERSION {
            return Err(StateError::Version {
                path,
                found: rec.version,
            });
        }
        Ok(Some(rec))
    }

    /// Saves a record atomically; a record with no clients and no daemon is removed instead.
    ///
    /// # Errors
    /// [`StateError::Write`] when it cannot be written.
    pub fn save(&self, rec: &Record) -> Result<(), StateError> {
        let path = self.record_path(&rec.uuid);
        if rec.is_empty() {
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(StateError::Write { path, source: e })
                }
                _ => Ok(()),
            };
        }
        let bytes = serde_json::to_vec_pretty(rec).expect("record serialises");
        write_atomic(&path, &bytes, 0o600).map_err(|source| StateError::Write { path, source })
    }

    /// Takes the GPU's lock, waiting up to `timeout`. The lock is released when the guard drops
    /// (or the process dies).
    ///
    /// # Errors
    /// [`StateError::LockTimeout`] naming the holder, or [`StateError::Lock`].
    pub fn lock(&self, uuid: &str, timeout: Duration, holder: &str) -> Result<GpuLock, StateError> {
        let path = self.lock_path(uuid);
        let lock_err = |source| StateError::Lock {
            path: path.clone(),
            source,
        };
        let mut file = crate::host::lockfile::open(&path).map_err(lock_err)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                if let Err(e) = wait_for_lock(&file, timeout) {
                    if e.kind() != std::io::ErrorKind::TimedOut {
                        return Err(lock_err(e));
                    }
                    let mut who = String::new();
                    let _ = (&file).take(256).read_to_string(&mut who);
                    return Err(StateError::LockTimeout {
                        uuid: uuid.to_owned(),
                        seconds: timeout.as_secs(),
                        holder: lock_holder(&file, who.trim()),
                    });
                }
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(lock_err(e)),
        }
        // Name the holder for whoever times out waiting; best effort.
        let _ = file.set_len(0);
        let _ = file.rewind();
        let _ = writeln!(file, "pid {} ({holder})", std::process::id());
        Ok(GpuLock { _file: file })
    }
}

/// Waits up to `timeout` for `file`'s `flock`: a blocking `flock` on a duplicate of the
/// descriptor (the lock belongs to the open file they share), made on a thread of its own, so
/// that the kernel wakes the waiter the moment the lock is free and no poll interval adds
/// latency. A lock the thread gets after the timeout is let go at once: the thread closes its
/// duplicate, and the caller, having timed out, closes the original.
///
/// # Errors
/// `TimedOut`, or the error of `dup` or `flock`.
fn wait_for_lock(file: &File, timeout: Duration) -> std::io::Result<()> {
    let waiter = file.try_clone()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.lock());
    });
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Names the process that really holds `file`'s `flock` (from `/proc/locks`), with what it
/// wrote into the file when that was the same process; the file's text alone can name a holder
/// that has since gone.
fn lock_holder(file: &File, written: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else {
        return written_or_unknown(written);
    };
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    match holder_pid(&locks, meta.dev(), meta.ino()) {
        Some(pid) if written.starts_with(&format!("pid {pid} ")) => written.to_owned(),
        Some(pid) => {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim())
        }
        None => written_or_unknown(written),
    }
}

fn written_or_unknown(written: &str) -> String {
    if written.is_empty() {
        "an unknown process".into()
    } else {
        written.to_owned()
    }
}

/// The pid holding a `FLOCK` on the file (`dev`, `ino`) in the text of `/proc/locks`.
pub fn holder_pid(locks: &str, dev: u64, ino: u64) -> Option<i32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; blocked waiters have "->".
        if f.get(1) != Some(&"FLOCK") || f.contains(&"->") {
            return None;
        }
        (f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4).and_then(|p| p.parse().ok()))
            .flatten()
    })
}

/// Removes temp files of record writes whose writer was killed (`.<name>.<pid>.tmp` of a pid
/// that no longer runs). Returns their paths.
pub fn sweep_temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_suffix(".tmp")
            .filter(|n| n.starts_with('.'))
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(_, pid)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() && fs::remove_file(e.path()).is_ok() {
            out.push(e.path());
        }
    }
    out
}

/// A held GPU lock.
#[derive(Debug)]
pub struct GpuLock {
    _file: File,
}

/// Writes `bytes` to `path` through a temp file in the same directory, fsync, rename, and an
/// fsync of the directory.
///
/// # Errors
/// Any I/O error; the temp file is removed on failure.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let res = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaper_is_alive_only_while_its_stamp_names_a_live_process() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::new(t.path());
        let uuid = "GPU-x";
        assert!(!sd.reaper_alive(uuid), "no lock file");
        let p = sd.reaper_lock_path(uuid);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let me = ProcId::of(std::process::id() as i32).unwrap();
        let rows = [
            (
                "this process",
                format!("{} {}\n", me.pid, me.start_time),
                true,
            ),
            (
                "a reused pid",
                format!("{} {}\n", me.pid, me.start_time + 1),
                false,
            ),
            ("cleared by a reaper that is done", String::new(), false),
            ("no process", "0 0\n".to_owned(), false),
            ("garbage", "pid start\n".to_owned(), false),
        ];
        for (what, text, alive) in rows {
            fs::write(&p, text).unwrap();
            assert_eq!(sd.reaper_alive(uuid), alive, "{what}");
        }
    }

    #[test]
    fn safe_names() {
        for ok in [
            "abc",
            "a-b_c.d",
            "GPU-5a1e0000-0000-4000-8000-000000000000",
            "k8s:pod",
        ] {
            assert!(is_safe_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a b",
            "a\0b",
            &"x".repeat(129),
            "é",
        ] {
            assert!(!is_safe_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn domain_dir_names_are_short_distinct_and_stable() {
        let a = domain_dir_name("GPU-1", "gpu");
        assert_eq!(a.len(), 16);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)));
        assert_eq!(a, domain_dir_name("GPU-1", "gpu"), "stable");
        assert_ne!(a, domain_dir_name("GPU-2", "gpu"), "per GPU");
        assert_ne!(a, domain_dir_name("GPU-1", "g-gpu"), "per domain");
        // The longest domain key (a 128-byte container id) keeps the deepest socket path of the
        // default state dir well under the 108-byte limit.
        let long = format!("c-{}", "f".repeat(128));
        let p = StateDir::new("/run/gpushare")
            .mps_dirs("GPU-1", &long)
            .pipe
            .join("control_privileged");
        assert!(p.as_os_str().len() < 108, "{}", p.display());
    }

    #[test]
    fn lock_holders_come_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:1a:99 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 5151 00:1a:99 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 6161 00:1a:100 0 EOF\n";
        let dev = libc::makedev(0, 0x1a);
        assert_eq!(
            holder_pid(locks, dev, 99),
            Some(4242),
            "the holder, not the waiter"
        );
        assert_eq!(
            holder_pid(locks, dev, 100),
            None,
            "POSIX locks are not ours"
        );
        assert_eq!(holder_pid(locks, dev, 7), None);
    }

    #[test]
    fn a_timed_out_lock_names_the_live_holder() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let _held = sd.lock("G", Duration::from_secs(1), "container a").unwrap();
        // A stale name in the file (a holder that is gone) is not believed.
        std::fs::write(sd.lock_path("G"), "pid 1 (container gone)\n").unwrap();
        let err = match sd.lock("G", Duration::from_millis(50), "container b") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("lock taken twice"),
        };
        let me = std::process::id();
        assert!(err.contains(&format!("held by pid {me} (")), "{err}");
        assert!(!err.contains("gc"), "{err}");
    }

    #[test]
    fn temp_files_of_dead_writers_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        for n in [
            format!(".G.json.{dead}.tmp"),
            format!(".G.json.{me}.tmp"),
            "G.json".to_owned(),
        ] {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        let swept = sweep_temp_files(dir.path());
        assert_eq!(swept, vec![dir.path().join(format!(".G.json.{dead}.tmp"))]);
        assert!(
            dir.path().join(format!(".G.json.{me}.tmp")).exists(),
            "live writer kept"
        );
    }

    #[test]
    fn save_load_remove_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("s"));
        sd.ensure().unwrap();
        let mut r = Record::new("GPU-1", 0);
        r.clients.insert(
            "c1".into(),
            Client {
                mode: Mode::Mps,
                process: None,
                cores: 100,
                memory: None,
                domain: Some("gpu".into()),
                kube: KubeLabels::default(),
                cap: None,
            },
        );
        sd.save(&r).unwrap();
        assert_eq!(sd.load("GPU-1").unwrap(), Some(r.clone()));
        r.clients.clear();
        sd.save(&r).unwrap();
        assert_eq!(sd.load("GPU-1").unwrap(), None);
    }

    #[test]
    fn corrupt_and_wrong_version_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        fs::write(sd.record_path("G"), b"{not json").unwrap();
        assert!(matches!(sd.load("G"), Err(StateError::Corrupt { .. })));
        let mut r = Record::new("G", 0);
        r.version = 99;
        fs::write(sd.record_path("G"), serde_json::to_vec(&r).unwrap()).unwrap();
        assert!(matches!(
            sd.load("G"),
            Err(StateError::Version { found: 99, .. })
        ));
    }

    #[test]
    fn state_dir_is_made_private_and_symlinks_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
        StateDir::new(&open).ensure().unwrap();
        assert_eq!(
            fs::metadata(&open).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        assert!(matches!(
            StateDir::new(&link).ensure(),
            Err(StateError::Unsafe { .. })
        ));
    }

    #[test]
    fn lock_timeout_names_holder() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let _held = sd
            .lock("G", Duration::from_secs(1), "container first")
            .unwrap();
        // A second open file description conflicts with the first, even in one process.
        let err = sd
            .lock("G", Duration::from_millis(100), "container second")
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("container first"), "{msg}");
        assert!(msg.contains("timed out"), "{msg}");
    }
}
