//! The state directory: its layout, and reading and writing the per-GPU records in it. The
//! record model is in [`record`], the GPU locks in [`lock`], atomic writes and the temp-file
//! sweep in [`io`]; their items are re-exported here.
//!
//! Layout under `state_dir` (mode 0700):
//! - `gpus/<uuid>.lock`: the GPU's lock file; its content names the current holder.
//! - `gpus/<uuid>.json`: the GPU's [`Record`] (laid out as [`layout`] says), written to a temp
//!   file, fsynced and renamed.
//! - `mps/<id>/{owner,pipe,log,shm}`: the directories of one isolation domain's MPS daemon
//!   (see [`crate::host::mps`]); `<id>` is a digest of the GPU and the domain key (`gpu`,
//!   `g-<group>` or `c-<container>`), which `owner` names.
//! - `containers/<id>/`: per-container files (limit mode).
//! - `counters.json`, `counters.log`: the node's counters (see [`crate::host::counters`]).
//! - `cache/libc/<dev>-<ino>`: what images' C libraries were found to be (see
//!   [`crate::container::inject::libc_cache`]).

mod clients;
mod io;
mod layout;
mod lock;
mod record;

pub use clients::{Cap, Client, Clients, Tally};
pub use io::{sweep_temp_files, write_atomic, write_atomic_parts};
pub use lock::{holder_pid, GpuLock};
pub use record::{
    domain_dir_name, now_seconds, Daemon, Domain, Record, RECORD_VERSION, RESERVATION_SECONDS,
};

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::host::mps::MpsDirs;
use crate::host::procinfo::ProcId;
use crate::vocab::is_safe_name;

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
        self.reaper(uuid).is_some()
    }

    /// The GPU's running reaper, by the pid and start time it wrote into its lock file (see
    /// [`StateDir::reaper_alive`]).
    pub fn reaper(&self, uuid: &str) -> Option<ProcId> {
        let stamp =
            File::open(self.reaper_lock_path(uuid)).and_then(|f| crate::vocab::read_capped(f, 64));
        let Ok(Some(bytes)) = stamp else {
            return None;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut parts = text.split_ascii_whitespace();
        let pid = parts.next().and_then(|p| p.parse::<i32>().ok())?;
        let start_time = parts.next().and_then(|t| t.parse::<u64>().ok())?;
        Some(ProcId { pid, start_time }).filter(ProcId::is_alive)
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

    /// All GPU records present (unlocked read, for listing), read in full.
    pub fn list_records(&self) -> Vec<(String, Result<Record, StateError>)> {
        self.list_with(|uuid| self.load(uuid))
    }

    /// All GPU records present, their clients parsed only if asked for (unlocked read, for
    /// finding the GPUs a container is on: poststop's first pass).
    pub fn list_records_lazy(&self) -> Vec<(String, Result<Record, StateError>)> {
        self.list_with(|uuid| self.load_lazy(uuid))
    }

    fn list_with(
        &self,
        load: impl Fn(&str) -> Result<Option<Record>, StateError>,
    ) -> Vec<(String, Result<Record, StateError>)> {
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
                        load(uuid).map(|r| r.unwrap_or_else(|| Record::new(uuid, 0))),
                    ));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Loads a GPU's record; `None` when there is none. Its clients are read and checked
    /// against the header's tally.
    ///
    /// # Errors
    /// [`StateError`] when it cannot be read or parsed.
    pub fn load(&self, uuid: &str) -> Result<Option<Record>, StateError> {
        let rec = self.load_lazy(uuid)?;
        if let Some(r) = &rec {
            if let Err(e) = r.clients.check() {
                return Err(StateError::Corrupt {
                    path: self.record_path(uuid),
                    source: <serde_json::Error as serde::de::Error>::custom(e),
                });
            }
        }
        Ok(rec)
    }

    /// Loads a GPU's record for a change under its lock: its clients are parsed only if the
    /// change asks for them (see [`Clients`]); the header read, the lines measured against it.
    ///
    /// # Errors
    /// [`StateError`] when it cannot be read or its header parsed.
    pub fn load_lazy(&self, uuid: &str) -> Result<Option<Record>, StateError> {
        self.load_between(uuid, &mut || {})
    }

    /// [`StateDir::load_lazy`], calling `between` after each read of the record's file and
    /// before that of the base it names (where a concurrent fold can come).
    fn load_between(
        &self,
        uuid: &str,
        between: &mut dyn FnMut(),
    ) -> Result<Option<Record>, StateError> {
        // A base file named by the record can go between the two reads only when a locked
        // save folded the changes into a new one meanwhile (this read may be unlocked): then
        // the record read again names the new one.
        let mut tries = 0;
        loop {
            match self.load_once(uuid, between) {
                Err(StateError::Read { path, source })
                    if source.kind() == std::io::ErrorKind::NotFound
                        && path != self.record_path(uuid)
                        && tries < 3 =>
                {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    fn load_once(
        &self,
        uuid: &str,
        between: &mut dyn FnMut(),
    ) -> Result<Option<Record>, StateError> {
        let path = self.record_path(uuid);
        let buf = match read_file(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let gpus = self.gpus_dir();
        let read_base = |name: &str| {
            between();
            read_file(&gpus.join(name))
        };
        match layout::decode(buf, read_base) {
            Ok(rec) => Ok(Some(rec)),
            Err(layout::Problem::Json(source)) => Err(StateError::Corrupt { path, source }),
            Err(layout::Problem::Version(found)) => Err(StateError::Version { path, found }),
            Err(layout::Problem::Base(name, source)) => Err(StateError::Read {
                path: gpus.join(name),
                source,
            }),
        }
    }

    /// Saves a record atomically; a record with no clients and no daemon is removed instead.
    /// A save that folds the clients' changes into a new base writes it first (see
    /// [`layout`]); one whose record names another base than it was read with (or none) then
    /// removes the GPU's other base files.
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
                _ => {
                    self.remove_bases(&rec.uuid, &[]);
                    Ok(())
                }
            };
        }
        if let Some(e) = rec.clients.lost() {
            // Read lazily and found damaged only when changed: writing it would lose the
            // clients of the lines that cannot be read.
            return Err(StateError::Corrupt {
                source: <serde_json::Error as serde::de::Error>::custom(e),
                path,
            });
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let read_with = rec.clients.base_name();
        // The base the record was read with can be gone only when a save this one undoes
        // (a rollback's) folded it away: then it is written anew from the bytes read.
        let gone = read_with.is_some_and(|b| !self.gpus_dir().join(b).exists());
        let enc = layout::encode(rec, stamp, gone);
        if let Some((name, bytes)) = &enc.new_base {
            let base = self.gpus_dir().join(name);
            write_atomic(&base, bytes, 0o600)
                .map_err(|source| StateError::Write { path: base, source })?;
            crate::failpoint::hit("save-base-written");
        }
        write_atomic_parts(&path, &[&enc.head, &enc.lines], 0o600)
            .map_err(|source| StateError::Write { path, source })?;
        if enc.base.as_deref() != read_with {
            // Only the base the record now names is kept (an unlocked reader that finds
            // the one it read of gone reads the record again).
            let keep: Vec<&str> = enc.base.as_deref().into_iter().collect();
            self.remove_bases(&rec.uuid, &keep);
        }
        Ok(())
    }

    /// Removes GPU `uuid`'s base files but those named in `keep`; returns the paths removed.
    /// Under the GPU's lock.
    pub fn remove_bases(&self, uuid: &str, keep: &[&str]) -> Vec<PathBuf> {
        self.each_base(uuid, keep, |p| fs::remove_file(p).map(|()| p.to_owned()))
    }

    /// Removes GPU `uuid`'s base files that its record does not name (none when the record
    /// cannot be read); returns their paths. Under the GPU's lock.
    pub fn remove_unnamed_bases(&self, uuid: &str) -> Vec<PathBuf> {
        match self.load_lazy(uuid) {
            Ok(rec) => {
                let named = rec.as_ref().and_then(|r| r.clients.base_name());
                self.remove_bases(uuid, &named.into_iter().collect::<Vec<_>>())
            }
            Err(_) => Vec::new(),
        }
    }

    /// The GPUs that have base files.
    pub fn base_owners(&self) -> std::collections::BTreeSet<String> {
        let Ok(rd) = fs::read_dir(self.gpus_dir()) else {
            return Default::default();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let uuid = name.strip_suffix(".lines")?.rsplit_once('.')?.0.to_owned();
                (is_safe_name(&uuid) && layout::is_base_of(&name, &uuid)).then_some(uuid)
            })
            .collect()
    }

    /// Moves GPU `uuid`'s base files aside with an unreadable record (`<name>.<suffix>`), for
    /// inspection; returns where they went. Under the GPU's lock.
    pub fn set_bases_aside(&self, uuid: &str, suffix: &str) -> Vec<PathBuf> {
        self.each_base(uuid, &[], |p| {
            let to = PathBuf::from(format!("{}.{suffix}", p.display()));
            fs::rename(p, &to).map(|()| to)
        })
    }

    fn each_base(
        &self,
        uuid: &str,
        keep: &[&str],
        act: impl Fn(&Path) -> std::io::Result<PathBuf>,
    ) -> Vec<PathBuf> {
        let Ok(rd) = fs::read_dir(self.gpus_dir()) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                layout::is_base_of(&name, uuid) && !keep.contains(&name.as_str())
            })
            .filter_map(|e| act(&e.path()).ok())
            .collect()
    }
}

/// A file's bytes, in one read sized from the file (at most [`MAX_RECORD_BYTES`]).
fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let f = File::open(path)?;
    let size = f.metadata().map_or(0, |m| m.len()).min(MAX_RECORD_BYTES);
    let mut buf = Vec::with_capacity(size as usize + 1);
    f.take(MAX_RECORD_BYTES).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::kube::KubeLabels;
    use crate::vocab::Mode;

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

    /// GPU `G`'s base files in `sd`, by name.
    fn bases(sd: &StateDir) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(sd.gpus_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| layout::is_base_of(n, "G"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn many_clients_live_in_a_base_file_and_a_save_writes_only_the_changes() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let client = |n: i32| Client {
            mode: Mode::Limit,
            process: Some(ProcId {
                pid: n,
                start_time: 1,
            }),
            cores: 100,
            memory: None,
            domain: None,
            kube: KubeLabels::default(),
            cap: None,
        };
        let id = |n: i32| format!("{n:04}-{}", "f".repeat(60));
        let mut oracle = Record::new("G", 0);
        for n in 0..200 {
            oracle.clients.insert(id(n), client(n));
        }
        sd.save(&oracle).unwrap();
        let first = bases(&sd);
        assert_eq!(first.len(), 1, "the clients went to a base: {first:?}");
        let record_size = || fs::metadata(sd.record_path("G")).unwrap().len();
        assert!(
            record_size() < 1024,
            "the record's file holds the header alone"
        );
        // Changes one at a time, each under a lazy read as an acquire or release makes them.
        let mut folds = 0;
        for n in 200..400 {
            let mut rec = sd.load_lazy("G").unwrap().unwrap();
            let rec_before = rec.clone();
            let oracle_before = oracle.clone();
            let before = bases(&sd);
            rec.clients.insert(id(n), client(n));
            rec.clients.remove(&id(n - 200));
            oracle.clients.insert(id(n), client(n));
            oracle.clients.remove(&id(n - 200));
            sd.save(&rec).unwrap();
            let after = bases(&sd);
            if after != before {
                folds += 1;
                // The new base alone.
                assert_eq!(after.len(), 1, "{after:?}");
                assert_ne!(Some(after[0].as_str()), rec.clients.base_name());
                // Saved back as read (a rollback): its base, gone now, is written anew.
                sd.save(&rec_before).unwrap();
                assert_eq!(bases(&sd).len(), 1, "{:?}", bases(&sd));
                assert_eq!(sd.load("G").unwrap().unwrap(), oracle_before, "rolled back");
                sd.save(&rec).unwrap();
            }
            assert!(
                record_size() < 12 << 10,
                "changes stay small: {}",
                record_size()
            );
            assert_eq!(sd.load("G").unwrap().unwrap(), oracle, "after client {n}");
        }
        assert!(folds >= 2, "changes were folded into new bases: {folds}");
        assert!(
            !bases(&sd).contains(&first[0]),
            "the first base went at a later fold"
        );
        // A base the record names that is gone is an error, never fewer clients.
        let named = sd.load_lazy("G").unwrap().unwrap();
        if let Some(name) = named.clients.base_name() {
            let path = sd.gpus_dir().join(name);
            let kept = fs::read(&path).unwrap();
            fs::remove_file(&path).unwrap();
            assert!(matches!(sd.load("G"), Err(StateError::Read { .. })));
            fs::write(&path, kept).unwrap();
        }
        // Set aside with an unreadable record, then emptied: no base file is left behind.
        let aside = sd.set_bases_aside("G", "quarantined-1");
        assert!(!aside.is_empty() && bases(&sd).is_empty());
        for p in aside {
            fs::rename(&p, p.to_string_lossy().trim_end_matches(".quarantined-1")).unwrap();
        }
        let mut rec = sd.load_lazy("G").unwrap().unwrap();
        rec.clients.clear();
        sd.save(&rec).unwrap();
        assert!(!sd.record_path("G").exists());
        assert!(bases(&sd).is_empty(), "{:?}", bases(&sd));
    }

    #[test]
    fn a_read_whose_base_a_fold_removed_meanwhile_reads_the_record_again() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let id = |n: u32| format!("{n:04}-{}", "f".repeat(60));
        let mut rec = Record::new("G", 0);
        for n in 0..200 {
            rec.clients
                .insert(id(n), Client::plain(Mode::Limit, None, 100));
        }
        sd.save(&rec).unwrap();
        // A locked writer's fold, between this read's two reads: changes until a new base.
        let mut n = 200;
        let mut fold = || {
            let first = bases(&sd);
            while bases(&sd) == first {
                let mut r = sd.load_lazy("G").unwrap().unwrap();
                r.clients
                    .insert(id(n), Client::plain(Mode::Limit, None, 100));
                sd.save(&r).unwrap();
                n += 1;
            }
        };
        let mut calls = 0;
        let read = sd
            .load_between("G", &mut || {
                calls += 1;
                if calls == 1 {
                    fold();
                }
            })
            .expect("read again")
            .expect("present");
        assert_eq!(calls, 2, "the base was read for a second record read");
        assert!(read.clients.len() > 200, "the record after the fold");
        assert_eq!(read.clients.check(), Ok(()));
        // Positive control: a base that stays gone is an error after the tries.
        let mut always = || {
            for b in bases(&sd) {
                let _ = fs::remove_file(sd.gpus_dir().join(b));
            }
        };
        assert!(matches!(
            sd.load_between("G", &mut always),
            Err(StateError::Read { .. })
        ));
    }

    #[test]
    fn clients_cleared_from_a_record_that_stays_take_their_base_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let mut rec = Record::new("G", 0);
        rec.restore_compute_mode = Some(crate::vocab::ComputeMode::Default);
        for n in 0..200 {
            rec.clients.insert(
                format!("{n:04}-{}", "f".repeat(60)),
                Client::plain(Mode::Limit, None, 100),
            );
        }
        sd.save(&rec).unwrap();
        assert_eq!(bases(&sd).len(), 1, "a base");
        let mut read = sd.load_lazy("G").unwrap().unwrap();
        read.clients.clear();
        sd.save(&read).unwrap();
        let back = sd.load("G").unwrap().expect("kept: a mode to restore");
        assert!(back.clients.is_empty());
        assert!(bases(&sd).is_empty(), "{:?}", bases(&sd));
    }

    #[test]
    fn saving_an_empty_record_removes_the_file_and_says_when_it_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let empty = Record::new("G", 0);
        sd.save(&empty).expect("nothing to remove is fine");
        // Something that is not a file where the record goes: the removal's error is said.
        std::fs::create_dir_all(sd.record_path("G").join("x")).unwrap();
        assert!(matches!(sd.save(&empty), Err(StateError::Write { .. })));
    }

    #[test]
    fn a_record_that_cannot_be_opened_is_an_error_not_absent() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        assert!(matches!(sd.load("G"), Ok(None)), "absent");
        std::os::unix::fs::symlink("G.json", sd.record_path("G")).unwrap();
        assert!(
            matches!(sd.load("G"), Err(StateError::Read { .. })),
            "a link to itself"
        );
    }

    #[test]
    fn corrupt_and_wrong_version_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        fs::write(sd.record_path("G"), b"{not json").unwrap();
        assert!(matches!(sd.load("G"), Err(StateError::Corrupt { .. })));
        // A later layout, whatever else it holds.
        fs::write(
            sd.record_path("G"),
            b"{\"version\":99,\"uuid\":\"G\",\"clients\":[\"a later form\"]}\nmore\n",
        )
        .unwrap();
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
}
