//! Doing: carries a [`Plan`] out on the GPUs (locks, records, MPS daemons, compute modes), and
//! the reverse on release and `gc`. Every acquire undoes its own changes on failure.

use std::time::Duration;

use thiserror::Error;

use crate::config::Config;
use crate::inventory::{ComputeMode, Inventory, InventoryError};
use crate::mps::{find_daemon, Control, MpsDirs, MpsError};
use crate::plan::{Plan, PlannedGpu};
use crate::procinfo::ProcId;
use crate::quantity::to_mib;
use crate::request::Mode;
use crate::state::{now_seconds, Client, Daemon, Record, StateDir, StateError};
use crate::timeslice::{self, TimesliceError};

/// An acquire that could not be done; nothing it changed is left behind.
#[derive(Debug, Error)]
pub enum AcquireError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Mps(#[from] MpsError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Timeslice(#[from] TimesliceError),
    #[error("GPU {index} ({uuid}) serves {serving} to {users}; {wanted} cannot share it with them. Wait for them to stop, or ask for gpu.share={serving}")]
    Busy {
        index: u32,
        uuid: String,
        serving: Mode,
        wanted: Mode,
        users: String,
    },
}

/// What the doing layer works with: the policy, the state directory and the GPUs.
pub struct Host<'a> {
    pub cfg: &'a Config,
    pub state: StateDir,
    pub inventory: &'a dyn Inventory,
}

/// What one acquire changed on one GPU, for rollback.
struct Done {
    gpu: PlannedGpu,
    before: Option<Record>,
    started: Option<(ProcId, Option<ComputeMode>)>,
    /// The compute mode a non-MPS acquire changed away from.
    compute_mode_before: Option<ComputeMode>,
}

impl Host<'_> {
    fn lock_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.lock_timeout_seconds)
    }

    fn control(&self) -> Result<Control, MpsError> {
        Control::new(&self.cfg.mps.control)
    }

    pub fn mps_dirs(&self, uuid: &str) -> MpsDirs {
        MpsDirs::new(self.state.mps_dir(uuid))
    }

    /// Adds the container to every GPU of the plan (in index order, each under its lock),
    /// starting MPS daemons and setting compute modes as needed.
    ///
    /// `reservation`: the key under which a spec edit reserved the MPS directories for this
    /// container (see [`Host::reserve`]); it is consumed, as is one under the container id.
    ///
    /// # Errors
    /// [`AcquireError`]; then every record, daemon and compute mode this call touched is as it
    /// was before.
    pub fn acquire(
        &self,
        plan: &Plan,
        process: Option<ProcId>,
        reservation: Option<&str>,
    ) -> Result<(), AcquireError> {
        self.state.ensure()?;
        let control = match plan.mode {
            Mode::Mps => Some(self.control()?),
            _ => None,
        };
        let mut gpus = plan.gpus.clone();
        gpus.sort_by_key(|g| g.index);
        let holder = format!("container {}", plan.container);
        let mut locks = Vec::new();
        let mut done: Vec<Done> = Vec::new();
        for gpu in &gpus {
            let step = self
                .state
                .lock(&gpu.uuid, self.lock_timeout(), &holder)
                .map_err(AcquireError::from)
                .and_then(|lock| {
                    locks.push(lock);
                    crate::failpoint::hit("acquire-locked");
                    self.acquire_one(plan, gpu, process, reservation, control.as_ref())
                });
            match step {
                Ok(d) => done.push(d),
                Err(e) => {
                    self.rollback(done, control.as_ref());
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn acquire_one(
        &self,
        plan: &Plan,
        gpu: &PlannedGpu,
        process: Option<ProcId>,
        reservation: Option<&str>,
        control: Option<&Control>,
    ) -> Result<Done, AcquireError> {
        let before = self.state.load(&gpu.uuid)?;
        let mut rec = before
            .clone()
            .unwrap_or_else(|| Record::new(&gpu.uuid, gpu.index));
        rec.index = gpu.index;
        rec.drop_stale();
        rec.prune_reservations(now_seconds());
        rec.reserved.remove(&plan.container);
        if let Some(key) = reservation {
            rec.reserved.remove(key);
        }
        rec.clients.remove(&plan.container);
        let mut done = Done {
            gpu: gpu.clone(),
            before,
            started: None,
            compute_mode_before: None,
        };
        let serving = if rec.clients.is_empty() {
            None
        } else {
            rec.serving()
        };
        if let Some(serving) = serving {
            if (serving == Mode::Mps) != (plan.mode == Mode::Mps) {
                return Err(AcquireError::Busy {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    serving,
                    wanted: plan.mode,
                    users: rec.clients.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        match (plan.mode, control) {
            (Mode::Mps, Some(control)) => {
                self.ensure_daemon(&mut rec, control, &mut done)?;
            }
            _ => {
                if rec.daemon.is_some() {
                    // A daemon with no clients left behind (e.g. a killed release): stop it.
                    self.stop_daemon(&mut rec);
                }
                let previous = self.inventory.compute_mode(gpu.index)?;
                if previous != ComputeMode::Default {
                    self.inventory
                        .set_compute_mode(gpu.index, ComputeMode::Default)?;
                    done.compute_mode_before = Some(previous);
                }
                if let Some(slice) = plan.timeslice {
                    if let Err(e) = timeslice::set(&self.cfg.timeslice.smi, gpu.index, slice) {
                        if let Some(p) = done.compute_mode_before {
                            let _ = self.inventory.set_compute_mode(gpu.index, p);
                        }
                        return Err(e.into());
                    }
                }
            }
        }
        rec.clients.insert(
            plan.container.clone(),
            Client {
                mode: plan.mode,
                process,
                cores: plan.cores,
                memory: plan.memory,
            },
        );
        if let Err(e) = self.state.save(&rec) {
            self.rollback(vec![done], control);
            return Err(e.into());
        }
        crate::failpoint::hit("acquire-saved");
        Ok(done)
    }

    /// Makes sure one live, answering daemon serves the GPU: keeps the recorded one, adopts an
    /// unrecorded one, or starts a new one.
    fn ensure_daemon(
        &self,
        rec: &mut Record,
        control: &Control,
        done: &mut Done,
    ) -> Result<(), AcquireError> {
        let dirs = self.mps_dirs(&rec.uuid);
        if let Some(d) = &rec.daemon {
            if d.process.is_alive() && control.answers(&dirs.pipe) {
                return Ok(());
            }
            // Died or hung: stop it and start afresh below, in the same directories, which
            // running containers have mounted.
            tracing::warn!(uuid = %rec.uuid, pid = d.process.pid, "MPS daemon dead or not answering; restarting it");
            let restore = d.restore_compute_mode;
            control.stop(&dirs.pipe, Some(d.process));
            rec.daemon = None;
            if let Some(m) = restore {
                let _ = self.inventory.set_compute_mode(rec.index, m);
            }
        } else if let Some(found) = find_daemon(&dirs.pipe, control.binary()) {
            if control.answers(&dirs.pipe) {
                tracing::warn!(uuid = %rec.uuid, pid = found.pid, "adopting an MPS daemon missing from the record");
                let restore = self
                    .cfg
                    .mps
                    .exclusive_compute_mode
                    .then_some(ComputeMode::Default);
                rec.daemon = Some(Daemon {
                    process: found,
                    restore_compute_mode: restore,
                });
                return Ok(());
            }
            control.stop(&dirs.pipe, Some(found));
        }
        let previous = if self.cfg.mps.exclusive_compute_mode {
            let prev = self.inventory.compute_mode(rec.index)?;
            if prev != ComputeMode::ExclusiveProcess {
                self.inventory
                    .set_compute_mode(rec.index, ComputeMode::ExclusiveProcess)?;
            }
            Some(prev)
        } else {
            None
        };
        let undo_mode = |s: &Self| {
            if let Some(p) = previous {
                let _ = s.inventory.set_compute_mode(rec.index, p);
            }
        };
        let timeout = Duration::from_secs(self.cfg.mps.start_timeout_seconds);
        let proc = match control.start(&rec.uuid, &dirs, self.cfg.mps.multiuser, timeout) {
            Ok(p) => p,
            Err(e) => {
                self.remove_dirs_unless_used(rec);
                undo_mode(self);
                return Err(e.into());
            }
        };
        let max_mib = self.cfg.max_memory_bytes().map(to_mib);
        if let Err(e) = control.set_defaults(&dirs.pipe, self.cfg.policy.default_cores, max_mib) {
            control.stop(&dirs.pipe, Some(proc));
            self.remove_dirs_unless_used(rec);
            undo_mode(self);
            return Err(e.into());
        }
        rec.daemon = Some(Daemon {
            process: proc,
            restore_compute_mode: previous,
        });
        done.started = Some((proc, previous));
        crate::failpoint::hit("acquire-daemon-started");
        Ok(())
    }

    /// Stops the record's daemon, removes its directories and restores the compute mode.
    fn stop_daemon(&self, rec: &mut Record) {
        let Some(d) = rec.daemon.take() else {
            return;
        };
        let dirs = self.mps_dirs(&rec.uuid);
        match self.control() {
            Ok(c) => c.stop(&dirs.pipe, Some(d.process)),
            Err(_) => crate::mps::stop_process(d.process, Duration::from_secs(2)),
        }
        self.remove_dirs_unless_used(rec);
        if let Some(m) = d.restore_compute_mode {
            if let Err(e) = self.inventory.set_compute_mode(rec.index, m) {
                tracing::warn!(uuid = %rec.uuid, error = %crate::error::chain(&e), "cannot restore compute mode");
            }
        }
    }

    /// Unmounts and removes the GPU's MPS directories unless a container uses them or a spec
    /// edit has just made them a mount source.
    fn remove_dirs_unless_used(&self, rec: &Record) {
        if !rec.dirs_in_use(now_seconds()) {
            self.mps_dirs(&rec.uuid).remove();
        }
    }

    fn rollback(&self, done: Vec<Done>, control: Option<&Control>) {
        for d in done.into_iter().rev() {
            if let Some((proc, previous)) = d.started {
                let dirs = self.mps_dirs(&d.gpu.uuid);
                if let Some(c) = control {
                    c.stop(&dirs.pipe, Some(proc));
                }
                let before = d
                    .before
                    .clone()
                    .unwrap_or_else(|| Record::new(&d.gpu.uuid, d.gpu.index));
                self.remove_dirs_unless_used(&before);
                if let Some(p) = previous {
                    let _ = self.inventory.set_compute_mode(d.gpu.index, p);
                }
            }
            if let Some(p) = d.compute_mode_before {
                let _ = self.inventory.set_compute_mode(d.gpu.index, p);
            }
            let res = match &d.before {
                Some(r) => self.state.save(r),
                None => self.state.save(&Record::new(&d.gpu.uuid, d.gpu.index)),
            };
            if let Err(e) = res {
                tracing::error!(uuid = %d.gpu.uuid, error = %crate::error::chain(&e), "rollback could not restore the record");
            }
        }
    }

    /// Announces that a spec edit made the MPS directories of `gpu` a mount source for the
    /// container `key` (its id, or a pending key): under the GPU's lock, creates them if needed
    /// and records the reservation, so that a release in the meantime does not remove them.
    ///
    /// # Errors
    /// [`AcquireError`] when the state or the directories cannot be made.
    pub fn reserve(&self, gpu: &PlannedGpu, key: &str) -> Result<(), AcquireError> {
        self.state.ensure()?;
        let _lock = self.state.lock(
            &gpu.uuid,
            self.lock_timeout(),
            &format!("spec edit for {key}"),
        )?;
        let mut rec = self
            .state
            .load(&gpu.uuid)?
            .unwrap_or_else(|| Record::new(&gpu.uuid, gpu.index));
        let now = now_seconds();
        rec.prune_reservations(now);
        self.mps_dirs(&gpu.uuid).prepare()?;
        rec.reserved.insert(key.to_owned(), now);
        self.state.save(&rec)?;
        Ok(())
    }

    /// Removes the container from every GPU that lists it, stopping daemons whose last client
    /// left. Idempotent; problems are returned as warnings, never as a failure.
    pub fn release(&self, container: &str) -> Vec<String> {
        let mut warnings = Vec::new();
        for (uuid, rec) in self.state.list_records() {
            match rec {
                Ok(r) if !r.clients.contains_key(container) => continue,
                Ok(_) => {}
                Err(e) => {
                    warnings.push(crate::error::chain(&e));
                    continue;
                }
            }
            if let Err(e) = self.release_one(&uuid, Some(container)) {
                warnings.push(crate::error::chain(&e));
            }
        }
        warnings
    }

    /// Under the GPU's lock: drop `container` (if any) and stale clients; stop an unused daemon.
    fn release_one(&self, uuid: &str, container: Option<&str>) -> Result<(), StateError> {
        let holder = format!("release of {}", container.unwrap_or("stale clients"));
        let _lock = self.state.lock(uuid, self.lock_timeout(), &holder)?;
        let Some(mut rec) = self.state.load(uuid)? else {
            return Ok(());
        };
        let before = rec.clone();
        if let Some(c) = container {
            rec.clients.remove(c);
        }
        rec.drop_stale();
        rec.prune_reservations(now_seconds());
        crate::failpoint::hit("release-locked");
        if rec.clients.is_empty() {
            self.stop_daemon(&mut rec);
            crate::failpoint::hit("release-daemon-stopped");
        } else if let Some(d) = &rec.daemon {
            if !d.process.is_alive() {
                // Restarted on the next acquire, in the same directories (the remaining
                // clients have them mounted).
                let restore = d.restore_compute_mode;
                rec.daemon = None;
                if let Some(m) = restore {
                    let _ = self.inventory.set_compute_mode(rec.index, m);
                }
            }
        }
        if rec != before {
            self.state.save(&rec)?;
        }
        Ok(())
    }

    /// Drops stale clients everywhere, stops daemons nobody uses (recorded or not) and removes
    /// leftover directories. Returns a line per thing it did or could not do.
    pub fn gc(&self) -> Vec<String> {
        let mut report = Vec::new();
        let recorded: Vec<String> = self
            .state
            .list_records()
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        for uuid in &recorded {
            let before = self.state.load(uuid).ok().flatten();
            match self.release_one(uuid, None) {
                Ok(()) => {
                    let after = self.state.load(uuid).ok().flatten();
                    if before != after {
                        report.push(format!("{uuid}: dropped stale clients or an unused daemon"));
                    }
                }
                Err(e) => report.push(format!("{uuid}: {}", crate::error::chain(&e))),
            }
        }
        // Daemon directories without a record, or without a daemon in their record.
        if let Ok(rd) = std::fs::read_dir(self.state.root().join("mps")) {
            for e in rd.flatten() {
                let uuid = e.file_name().to_string_lossy().into_owned();
                let Ok(_lock) = self.state.lock(&uuid, self.lock_timeout(), "gc") else {
                    continue;
                };
                let rec = self.state.load(&uuid).ok().flatten();
                if rec
                    .as_ref()
                    .is_some_and(|r| r.daemon.is_some() || r.dirs_in_use(now_seconds()))
                {
                    continue;
                }
                let dirs = self.mps_dirs(&uuid);
                if let Ok(c) = self.control() {
                    if let Some(p) = find_daemon(&dirs.pipe, c.binary()) {
                        c.stop(&dirs.pipe, Some(p));
                        report.push(format!(
                            "{uuid}: stopped unrecorded MPS daemon pid {}",
                            p.pid
                        ));
                    }
                }
                dirs.remove();
                report.push(format!("{uuid}: removed leftover {}", dirs.dir.display()));
            }
        }
        self.gc_container_dirs(&mut report);
        report
    }

    /// Per-container directories: a precreate's `pending-*` one whose create never reached the
    /// hook (after an hour), and one whose container is no client of any GPU any more.
    fn gc_container_dirs(&self, report: &mut Vec<String>) {
        use crate::inject::host::{sweep_pending, PENDING_MAX_AGE};
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
            if id.starts_with(crate::inject::PENDING_PREFIX) || clients.contains(&id) {
                continue;
            }
            if std::fs::remove_dir_all(e.path()).is_ok() {
                report.push(format!(
                    "removed {} of a container that is gone",
                    e.path().display()
                ));
            }
        }
    }
}
