//! Doing: carries a [`Plan`] out on the GPUs (locks, records, MPS daemons, compute modes).
//! Every acquire undoes its own changes on failure. The reverse is in [`crate::host::release`].

use std::time::Duration;

use thiserror::Error;

use crate::config::Config;
use crate::decide::plan::{Plan, PlannedGpu};
use crate::host::mps::{find_daemon, Control, MpsDirs, MpsError};
use crate::host::procinfo::ProcId;
use crate::host::state::{now_seconds, Client, Daemon, Record, StateDir, StateError};
use crate::host::timeslice::{self, TimesliceError};
use crate::vocab::quantity::to_mib;
use crate::vocab::Mode;
use crate::vocab::{ComputeMode, Inventory, InventoryError};

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

impl<'a> Host<'a> {
    /// The doing layer over the state directory `cfg` names.
    pub fn new(cfg: &'a Config, inventory: &'a dyn Inventory) -> Self {
        Host {
            cfg,
            state: StateDir::new(&cfg.state_dir),
            inventory,
        }
    }

    pub(crate) fn lock_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.lock_timeout_seconds)
    }

    pub(crate) fn control(&self) -> Result<Control, MpsError> {
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
    pub(crate) fn stop_daemon(&self, rec: &mut Record) {
        let Some(d) = rec.daemon.take() else {
            return;
        };
        let dirs = self.mps_dirs(&rec.uuid);
        match self.control() {
            Ok(c) => c.stop(&dirs.pipe, Some(d.process)),
            Err(_) => crate::host::mps::stop_process(d.process, Duration::from_secs(2)),
        }
        self.remove_dirs_unless_used(rec);
        if let Some(m) = d.restore_compute_mode {
            if let Err(e) = self.inventory.set_compute_mode(rec.index, m) {
                tracing::warn!(uuid = %rec.uuid, error = %crate::vocab::chain(&e), "cannot restore compute mode");
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
                tracing::error!(uuid = %d.gpu.uuid, error = %crate::vocab::chain(&e), "rollback could not restore the record");
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
}
