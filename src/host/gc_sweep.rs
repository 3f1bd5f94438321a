//! gc (the host's side of `gpushare-hook gc`): drops what dead containers and killed hooks left
//! behind, restarts dead daemons that still have clients, rebuilds an unreadable record from
//! what runs, and puts back compute modes nothing explains.

use std::path::Path;

use crate::host::handle::Host;
use crate::host::mps::MpsDirs;
use crate::host::procinfo::ProcId;
use crate::host::state::{now_seconds, StateError};
use crate::host::state::{Client, Daemon, Domain, Record};
use crate::vocab::{ComputeMode, Mode};

/// Why gc could not rebuild an unreadable record (it then leaves it, and its daemons, alone).
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("cannot take the GPU's lock")]
    Lock(#[source] StateError),
    #[error("cannot list the GPUs to learn its index")]
    Inventory(#[source] crate::vocab::InventoryError),
    #[error("GPU {0} is not among the GPUs NVML lists")]
    NoSuchGpu(String),
    #[error("cannot move {from} aside to {to}")]
    Rename {
        from: std::path::PathBuf,
        to: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot save the rebuilt record")]
    Save(#[source] StateError),
}

/// What `gc` did, and what it could not do (then it exits 1).
#[derive(Debug, Default)]
pub struct GcOutcome {
    pub actions: Vec<String>,
    pub problems: Vec<String>,
}

impl GcOutcome {
    /// Actions, then problems, as one list of lines.
    pub fn into_lines(self) -> Vec<String> {
        let mut v = self.actions;
        v.extend(self.problems);
        v
    }
}

impl Host<'_> {
    /// Drops stale clients everywhere, stops daemons nobody uses (recorded or not), restarts
    /// dead daemons that still have clients, puts back compute modes no daemon explains and
    /// removes leftover directories. A record that cannot be read is left alone (and said so):
    /// nothing it might describe is stopped. Returns a line per thing it did or could not do.
    pub fn gc(&self) -> GcOutcome {
        let mut out = GcOutcome::default();
        let report = &mut out.actions;
        let problems = &mut out.problems;
        let mut unreadable = std::collections::BTreeSet::new();
        for (uuid, rec) in self.state.list_records() {
            if let Err(e) = rec {
                match self.quarantine_and_rebuild(&uuid, &e) {
                    Ok(line) => report.push(line),
                    Err(why) => {
                        problems.push(format!(
                            "{uuid}: record unreadable ({}), left alone with its daemons: {}",
                            crate::vocab::chain(&e),
                            crate::vocab::chain(&why)
                        ));
                        unreadable.insert(uuid);
                    }
                }
                continue;
            }
            match self.release_one(&uuid, None, true) {
                Ok(did) => report.extend(did),
                Err(e) => problems.push(format!("{uuid}: {}", crate::vocab::chain(&e))),
            }
        }
        // Domain directories without a record, or without a daemon or user in their record.
        if let Ok(rd) = std::fs::read_dir(self.state.mps_root()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(rest) = name.strip_prefix(crate::host::mps::NEW_PREFIX) {
                    // A directory being made: removed once its maker is gone.
                    let maker = rest.split('-').next().unwrap_or("");
                    if !Path::new(&format!("/proc/{maker}")).exists()
                        && std::fs::remove_dir_all(e.path()).is_ok()
                    {
                        report.push(format!(
                            "removed {} of a killed acquire",
                            e.path().display()
                        ));
                    }
                    continue;
                }
                self.gc_domain_dir(&e.path(), &unreadable, report, problems);
            }
        }
        let _ = std::fs::remove_dir(self.state.mps_root());
        self.gc_compute_modes(&unreadable, report, problems);
        self.gc_container_dirs(report);
        for dir in [self.state.gpus_dir(), self.state.root().to_path_buf()] {
            for p in crate::host::state::sweep_temp_files(&dir) {
                report.push(format!("removed {} of a killed write", p.display()));
            }
        }
        self.gc_bases(&unreadable, report);
        if let Some(line) = crate::host::snapshot::drop_if_stale(self.state.root(), self.inventory)
        {
            report.push(line);
        }
        out
    }

    /// Base files no record names (a save killed between its two writes), removed under their
    /// GPU's lock; those of a record that cannot be read are left with it.
    fn gc_bases(&self, unreadable: &std::collections::BTreeSet<String>, report: &mut Vec<String>) {
        for uuid in self.state.base_owners() {
            if unreadable.contains(&uuid) {
                continue;
            }
            let Ok(_lock) = self
                .state
                .lock(&uuid, self.lock_timeout(), "gc (base files)")
            else {
                continue;
            };
            for p in self.state.remove_unnamed_bases(&uuid) {
                report.push(format!(
                    "{uuid}: removed {}, a base file its record does not name (a save cut short)",
                    p.display()
                ));
            }
        }
    }

    /// gc's care of domain `key` of GPU `uuid`, which still has `clients`: its recorded daemon
    /// `daemon`, when dead, not answering or tampered with, is stopped and restarted. Returns
    /// what it did; `None` when the daemon answers.
    pub(super) fn heal_domain(
        &self,
        rec: &mut Record,
        uuid: &str,
        key: &str,
        clients: &[String],
        daemon: Option<Daemon>,
    ) -> Option<String> {
        let pid = daemon.as_ref().map(|d| d.process.pid);
        let why = match daemon.filter(|d| d.process.is_alive()) {
            None => Some(None),
            Some(d) => self.check(key, rec, d.process).err().map(|e| {
                // Stopped here (quit, else signals to the recorded pid only), so that
                // the restart does not ask it again.
                if let Ok(c) = self.control() {
                    c.stop(&self.mps_dirs(uuid, key).pipe, Some(d.process));
                }
                if e.is_tampered() {
                    tracing::error!(
                        uuid,
                        domain = %key,
                        containers = %clients.join(", "),
                        "MPS domain {key} tampered with: {}",
                        crate::vocab::chain(&e)
                    );
                    Some(format!(
                        "was tampered with ({}), for {} client(s): {}",
                        crate::vocab::chain(&e),
                        clients.len(),
                        clients.join(", ")
                    ))
                } else {
                    Some(format!("did not answer, for {} client(s)", clients.len()))
                }
            }),
        };
        let why = why?;
        if let (Some(_), Some(pid)) = (&why, pid) {
            crate::host::events::note(crate::host::events::Event::daemon(
                "replace", uuid, key, pid,
            ));
        }
        if why.is_some() {
            // Stopped above.
            if let Some(dom) = rec.domains.get_mut(key) {
                dom.daemon = None;
            }
        }
        let done = self.restart(rec, key);
        Some(match (why, done) {
            (None, Ok(())) => format!(
                "{uuid}: restarted the dead MPS daemon of domain {key} for {} client(s)",
                clients.len()
            ),
            (Some(why), Ok(())) => {
                format!("{uuid}: replaced the MPS daemon of domain {key}, which {why}")
            }
            (_, Err(e)) => format!(
                "{uuid}: cannot restart the MPS daemon of domain {key}: {}",
                crate::vocab::chain(&e)
            ),
        })
    }

    /// The check of domain `key`'s daemon `daemon` a joining container gets: it answers in
    /// time, proven, and its defaults are put back.
    fn check(
        &self,
        key: &str,
        rec: &Record,
        daemon: ProcId,
    ) -> Result<(), crate::host::mps::MpsError> {
        let Some(limits) = rec.domains.get(key).map(|d| d.limits) else {
            return Ok(());
        };
        self.control()?
            .refresh(&self.mps_dirs(&rec.uuid, key).pipe, daemon, &limits)
    }

    /// Under the GPU's lock: moves an unreadable record aside (kept for inspection) and writes a
    /// new one from what really runs: each domain directory of the GPU whose daemon answers
    /// becomes a domain with that daemon and its current defaults as limits, and every
    /// container that has its pipe directory mounted becomes a client (`rebuilt-<pid>`, dropped
    /// when that process ends). Nothing that runs is stopped.
    fn quarantine_and_rebuild(&self, uuid: &str, why: &StateError) -> Result<String, RebuildError> {
        let _lock = self
            .state
            .lock(uuid, self.lock_timeout(), "gc (rebuild)")
            .map_err(RebuildError::Lock)?;
        // Read again under the lock: someone may have fixed it meanwhile.
        if let Ok(Some(_)) = self.state.load(uuid) {
            return Ok(format!("{uuid}: record readable again, nothing to rebuild"));
        }
        // The GPU's index first: without it nothing is moved (a record under index 0 would
        // name another GPU).
        let index = self
            .inventory
            .gpus()
            .map_err(RebuildError::Inventory)?
            .into_iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.index)
            .ok_or_else(|| RebuildError::NoSuchGpu(uuid.to_owned()))?;
        let path = self.state.record_path(uuid);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let aside = path.with_extension(format!("json.quarantined-{stamp}"));
        std::fs::rename(&path, &aside).map_err(|source| RebuildError::Rename {
            from: path.clone(),
            to: aside.clone(),
            source,
        })?;
        // The base files it names go aside with it (the rebuilt record names none).
        self.state
            .set_bases_aside(uuid, &format!("quarantined-{stamp}"));
        let mut rec = Record::new(uuid, index);
        let (mut daemons, mut clients) = (0, 0);
        if let (Ok(rd), Ok(control)) = (std::fs::read_dir(self.state.mps_root()), self.control()) {
            for e in rd.flatten() {
                let Some((owner, key)) = MpsDirs::read_owner(&e.path()) else {
                    continue;
                };
                if owner != uuid {
                    continue;
                }
                let dirs = self.state.mps_dirs(uuid, &key);
                let Some(p) = control.find_daemon(&dirs.pipe) else {
                    continue;
                };
                let Ok(limits) = control.defaults(&dirs.pipe, p) else {
                    continue;
                };
                let mut d = Domain::new(limits);
                d.daemon = Some(Daemon { process: p });
                rec.domains.insert(key.clone(), d);
                daemons += 1;
                for pid in crate::host::mounts::holders_of(&dirs.pipe, &[p.pid]) {
                    if let Some(process) = ProcId::of(pid) {
                        rec.clients.insert(
                            format!("rebuilt-{pid}"),
                            Client {
                                mode: Mode::Mps,
                                process: Some(process),
                                cores: limits.cores,
                                memory: None,
                                domain: Some(key.clone()),
                                kube: Default::default(),
                                cap: None,
                            },
                        );
                        clients += 1;
                    }
                }
            }
        }
        if rec.has_daemon() {
            if let Ok(m) = self.inventory.compute_mode(index) {
                if m != ComputeMode::Default {
                    rec.restore_compute_mode = Some(ComputeMode::Default);
                }
            }
        }
        self.state.save(&rec).map_err(RebuildError::Save)?;
        Ok(format!(
            "{uuid}: record unreadable ({}); moved to {} and rebuilt from {daemons} running daemon(s) and {clients} container(s) that have them mounted",
            crate::vocab::chain(why),
            aside.display()
        ))
    }

    /// One `mps/<id>` directory: kept while its record says a daemon or a container uses it;
    /// otherwise any daemon found serving it is stopped and it is removed. A directory whose
    /// owner cannot be read is left a minute for the acquire that is making it.
    fn gc_domain_dir(
        &self,
        dir: &std::path::Path,
        unreadable: &std::collections::BTreeSet<String>,
        report: &mut Vec<String>,
        problems: &mut Vec<String>,
    ) {
        let (dirs, _lock) = match MpsDirs::read_owner(dir) {
            Some((uuid, key)) => {
                if unreadable.contains(&uuid) || !crate::vocab::is_safe_name(&uuid) {
                    return;
                }
                let lock = match self.state.lock(&uuid, self.lock_timeout(), "gc") {
                    Ok(l) => l,
                    Err(e) => {
                        problems.push(format!("{uuid}: {}", crate::vocab::chain(&e)));
                        return;
                    }
                };
                let rec = match self.state.load(&uuid) {
                    Ok(r) => r,
                    // Unreadable: leave everything it may describe alone.
                    Err(_) => return,
                };
                if rec.as_ref().is_some_and(|r| {
                    r.domains.get(&key).is_some_and(|d| d.daemon.is_some())
                        || r.dirs_in_use(&key, now_seconds())
                }) {
                    return;
                }
                (self.state.mps_dirs(&uuid, &key), Some(lock))
            }
            None => {
                let young = std::fs::metadata(dir)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < std::time::Duration::from_secs(60));
                if young {
                    return;
                }
                (MpsDirs::new(dir.to_owned()), None)
            }
        };
        if let Ok(c) = self.control() {
            if let Some(p) = c.find_daemon(&dirs.pipe) {
                c.stop(&dirs.pipe, Some(p));
                report.push(format!(
                    "stopped unrecorded MPS daemon pid {} of {}",
                    p.pid,
                    dirs.dir.display()
                ));
            }
        }
        dirs.remove();
        report.push(format!("removed leftover {}", dirs.dir.display()));
    }

    /// GPUs left in EXCLUSIVE_PROCESS that neither a record (a mode to restore, a daemon, a
    /// client) nor a running gpushare daemon explains, e.g. after a record was lost. Under a
    /// policy that itself puts GPUs in EXCLUSIVE_PROCESS for MPS (isolation `gpu`,
    /// `exclusive_compute_mode`) the mode is gpushare's leftover and is put back to DEFAULT;
    /// under any other policy gpushare never sets it, so it is left as it is and said so.
    fn gc_compute_modes(
        &self,
        unreadable: &std::collections::BTreeSet<String>,
        report: &mut Vec<String>,
        problems: &mut Vec<String>,
    ) {
        let Ok(gpus) = self.inventory.gpus() else {
            return;
        };
        let ours = self.cfg.mps.isolation == crate::vocab::Isolation::Gpu
            && self.cfg.mps.exclusive_compute_mode;
        for g in gpus {
            if unreadable.contains(&g.uuid) || !crate::vocab::is_safe_name(&g.uuid) {
                continue;
            }
            if self.inventory.compute_mode(g.index).ok() != Some(ComputeMode::ExclusiveProcess) {
                continue;
            }
            let lock = self.state.ensure().and_then(|()| {
                self.state
                    .lock(&g.uuid, self.lock_timeout(), "gc (compute mode)")
            });
            let _lock = match lock {
                Ok(l) => l,
                Err(e) => {
                    problems.push(format!("{}: {}", g.uuid, crate::vocab::chain(&e)));
                    continue;
                }
            };
            let explained = match self.state.load(&g.uuid) {
                Ok(Some(r)) => {
                    r.has_daemon() || !r.clients.is_empty() || r.restore_compute_mode.is_some()
                }
                Ok(None) => false,
                Err(_) => true,
            };
            // Read again under the lock: an acquire may have set it meanwhile.
            if explained
                || self.inventory.compute_mode(g.index).ok() != Some(ComputeMode::ExclusiveProcess)
            {
                continue;
            }
            if !ours {
                // Not gpushare's doing under this policy (an admin may have set it on purpose):
                // said, not counted as a problem of gpushare's state.
                report.push(format!(
                    "{}: note: compute mode EXCLUSIVE_PROCESS, which this policy never sets (mps.isolation is not \"gpu\" with exclusive_compute_mode); left as it is: if nobody set it on purpose, run `nvidia-smi -i {} -c DEFAULT`",
                    g.uuid, g.index
                ));
                continue;
            }
            match self
                .inventory
                .set_compute_mode(g.index, ComputeMode::Default)
            {
                Ok(()) => report.push(format!(
                    "{}: put back compute mode DEFAULT (was EXCLUSIVE_PROCESS with no gpushare MPS daemon and no record of it)",
                    g.uuid
                )),
                Err(e) => problems.push(format!(
                    "{}: compute mode EXCLUSIVE_PROCESS with no gpushare MPS daemon; cannot put back DEFAULT: {}",
                    g.uuid,
                    crate::vocab::chain(&e)
                )),
            }
        }
    }

    /// Per-container directories: a precreate's `pending-*` one whose create never reached the
    /// hook (after an hour), and one whose container is no client of any GPU any more.
    fn gc_container_dirs(&self, report: &mut Vec<String>) {
        use crate::host::pending::{sweep_pending, PENDING_MAX_AGE};
        for p in sweep_pending(&self.state, PENDING_MAX_AGE) {
            report.push(format!("removed abandoned {}", p.display()));
        }
        let clients: std::collections::BTreeSet<String> = self
            .state
            .list_records()
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .flat_map(|r| r.clients.into_keys())
            .collect();
        let Ok(rd) = std::fs::read_dir(self.state.root().join("containers")) else {
            return;
        };
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if id.starts_with(crate::host::pending::PENDING_PREFIX) || clients.contains(&id) {
                continue;
            }
            if crate::host::mounts::remove_container_dir(&e.path()).is_ok() {
                report.push(format!(
                    "removed {} of a container that is gone",
                    e.path().display()
                ));
            }
        }
    }
}
