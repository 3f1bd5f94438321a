//! Doing: carries a [`Plan`] out on the GPUs (locks, records, MPS daemons of isolation
//! domains, compute modes). Every acquire undoes its own changes on failure. The reverse is in
//! [`crate::host::release`].

use std::time::Duration;

use thiserror::Error;

use crate::config::Config;
use crate::decide::domain::{self, DomainError, PlannedDomain};
use crate::decide::kube::KubeLabels;
use crate::decide::plan::{Plan, PlannedGpu};
use crate::host::events::{self, Event};
use crate::host::mps::{Control, MpsControl, MpsDirs, MpsError};
use crate::host::procinfo::ProcId;
use crate::host::state::{now_seconds, Cap, Client, Daemon, Domain, Record, StateDir, StateError};
use crate::host::timeslice::{self, TimesliceError};
use crate::vocab::memcap::{Backend, Enforcement, LIMIT_MAX};
use crate::vocab::quantity::to_mib;
use crate::vocab::{ComputeMode, Inventory, InventoryError, Isolation, Mode};

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
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error("GPU {index} ({uuid}) serves {serving} to {users}; {wanted} cannot share it with them. Wait for them to stop, or ask for gpu.share={serving}")]
    Busy {
        index: u32,
        uuid: String,
        serving: Mode,
        wanted: Mode,
        users: String,
    },
    #[error("an mps plan without an isolation domain")]
    NoDomain,
    #[error(transparent)]
    Overcommitted(#[from] Box<crate::decide::admission::Overcommitted>),
    #[error("the container's cgroup {cgroup} is, or is nested with, the cgroup whose driver memory limit container {other} holds on GPU {index}; a container may not name another's cgroup (linux.cgroupsPath). Give it a cgroup of its own")]
    CgroupTaken {
        index: u32,
        cgroup: String,
        other: String,
    },
    #[error("cannot set the driver's memory limit of {} on {cgroup} for GPU {index}, so the container would run uncapped; it is refused. Check `gpushare-hook doctor`, or ask an admin", crate::vocab::size::human(.cap_mib.saturating_mul(1 << 20)))]
    DriverLimit {
        index: u32,
        cgroup: String,
        cap_mib: u64,
        #[source]
        source: InventoryError,
    },
}

/// What the doing layer works with: the policy, the state directory, the GPUs and the MPS
/// control program. Built with [`Host::new`] (the real ones) or [`Host::with_control`].
pub struct Host<'a> {
    pub cfg: &'a Config,
    pub state: StateDir,
    pub inventory: &'a dyn Inventory,
    control: Result<Box<dyn MpsControl + 'a>, String>,
    /// The Kubernetes names recorded with the clients this host adds.
    labels: KubeLabels,
}

/// What one acquire changed on one GPU, for rollback.
struct Done {
    gpu: PlannedGpu,
    before: Option<Record>,
    /// The daemon this acquire started, and its domain.
    started: Option<(String, ProcId)>,
    /// The domain whose directories this acquire may have made.
    domain: Option<String>,
    /// The compute mode this acquire changed away from.
    compute_mode_before: Option<ComputeMode>,
    /// The cgroup whose driver memory limits this acquire set on this GPU.
    driver_limit: Option<String>,
}

impl<'a> Host<'a> {
    /// The doing layer over the state directory `cfg` names, with NVIDIA's control program.
    pub fn new(cfg: &'a Config, inventory: &'a dyn Inventory) -> Self {
        let control = Control::new(&cfg.mps.control)
            .map(|c| Box::new(c) as Box<dyn MpsControl>)
            .map_err(|_| cfg.mps.control.clone());
        Host {
            cfg,
            state: StateDir::new(&cfg.state_dir),
            inventory,
            control,
            labels: KubeLabels::default(),
        }
    }

    /// The doing layer with another MPS control (a fake in tests).
    pub fn with_control(
        cfg: &'a Config,
        inventory: &'a dyn Inventory,
        control: Box<dyn MpsControl + 'a>,
    ) -> Self {
        Host {
            cfg,
            state: StateDir::new(&cfg.state_dir),
            inventory,
            control: Ok(control),
            labels: KubeLabels::default(),
        }
    }

    /// Records `labels` (the container's Kubernetes names) with the clients it adds.
    #[must_use]
    pub fn with_labels(mut self, labels: KubeLabels) -> Self {
        self.labels = labels;
        self
    }

    pub(crate) fn lock_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.lock_timeout_seconds)
    }

    /// The MPS control program.
    ///
    /// # Errors
    /// [`MpsError::NotFound`] when the configured binary is missing.
    pub(crate) fn control(&self) -> Result<&dyn MpsControl, MpsError> {
        match &self.control {
            Ok(c) => Ok(c.as_ref()),
            Err(name) => Err(MpsError::NotFound(name.clone())),
        }
    }

    /// The directories of domain `domain` of GPU `uuid`.
    pub fn mps_dirs(&self, uuid: &str, domain: &str) -> MpsDirs {
        self.state.mps_dirs(uuid, domain)
    }

    /// The compute mode a GPU serving MPS under this policy runs in: EXCLUSIVE_PROCESS where
    /// exactly one daemon can serve it (isolation `gpu`), else DEFAULT (several daemons).
    fn mps_compute_mode(&self) -> Option<ComputeMode> {
        match self.cfg.mps.isolation {
            Isolation::Gpu if self.cfg.mps.exclusive_compute_mode => {
                Some(ComputeMode::ExclusiveProcess)
            }
            Isolation::Gpu => None,
            Isolation::Group | Isolation::Container => Some(ComputeMode::Default),
        }
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
        if plan.mode == Mode::Mps {
            self.control()?;
        }
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
                    self.acquire_one(plan, gpu, process, reservation)
                });
            match step {
                Ok(d) => done.push(d),
                Err(e) => {
                    self.rollback(done);
                    // A refused or failed request holds nothing: its reservations (and the
                    // directories only they kept) go now, not when they expire.
                    for g in gpus.iter().take(locks.len()) {
                        self.drop_reservations(g, &plan.container, reservation);
                    }
                    return Err(e);
                }
            }
        }
        drop(locks);
        Ok(())
    }

    /// Sends what the last [`Host::acquire`] left for running daemons (their defaults put
    /// back, see [`MpsControl::refresh`]) through control clients nobody waits for. Call it
    /// once the container is set up: nothing that follows then competes with them.
    pub fn flush(&self) {
        if let Ok(c) = self.control() {
            c.flush();
        }
    }

    fn acquire_one(
        &self,
        plan: &Plan,
        gpu: &PlannedGpu,
        process: Option<ProcId>,
        reservation: Option<&str>,
    ) -> Result<Done, AcquireError> {
        let before = self.state.load(&gpu.uuid)?;
        let mut rec = before
            .clone()
            .unwrap_or_else(|| Record::new(&gpu.uuid, gpu.index));
        rec.index = gpu.index;
        // With the GPU's reaper running, exited clients are released as they exit; without it
        // (killed, or never started), this acquire drops them.
        if !self.state.reaper_alive(&gpu.uuid) {
            rec.drop_stale();
        }
        let created_by_container = plan.domain.as_ref().filter(|d| !d.from_policy);
        if let Some(key) = created_by_container.map(|d| d.key.as_str()) {
            if rec.domain_clients(key).is_empty()
                && rec.domains.get(key).is_some_and(|d| d.daemon.is_some())
            {
                // Left running by clients that are gone: this container creates the domain
                // anew, with its own limits.
                self.stop_daemon(&mut rec, key);
            }
        }
        rec.prune_reservations(now_seconds());
        rec.unreserve(&plan.container);
        if let Some(key) = reservation {
            rec.unreserve(key);
        }
        rec.clients.remove(&plan.container);
        let mut done = Done {
            gpu: gpu.clone(),
            before,
            started: None,
            domain: plan.domain.as_ref().map(|d| d.key.clone()),
            compute_mode_before: None,
            driver_limit: None,
        };
        if let Some(serving) = rec.serving().filter(|_| !rec.clients.is_empty()) {
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
        self.admit_memory(&rec, plan, gpu)?;
        let result = match plan.mode {
            Mode::Mps => {
                let planned = plan.domain.as_ref().ok_or(AcquireError::NoDomain)?;
                self.join_domain(&mut rec, plan, planned, &mut done)
            }
            _ => self.plain_share(&mut rec, plan, &mut done),
        }
        .and_then(|()| self.set_driver_limit(&rec, plan, gpu, &mut done));
        if let Err(e) = result {
            self.rollback(vec![done]);
            return Err(e);
        }
        // A container that names no limit gets its domain's, and is listed with them.
        let enforced = plan
            .domain
            .as_ref()
            .and_then(|d| rec.domains.get(&d.key))
            .map(|d| d.limits);
        let (cores, memory) = match enforced {
            Some(l) => (
                if plan.cores_explicit {
                    plan.cores
                } else {
                    l.cores
                },
                plan.memory.or(l.memory_mib.map(|m| m << 20)),
            ),
            None => (plan.cores, plan.memory),
        };
        rec.clients.insert(
            plan.container.clone(),
            Client {
                mode: plan.mode,
                process,
                cores,
                memory,
                domain: plan.domain.as_ref().map(|d| d.key.clone()),
                kube: self.labels.clone(),
                cap: plan.cap.map(|bytes| Cap {
                    bytes,
                    enforcement: plan.enforcement.clone(),
                }),
            },
        );
        rec.tidy();
        if let Err(e) = self.state.save(&rec) {
            self.rollback(vec![done]);
            return Err(e.into());
        }
        crate::failpoint::hit("acquire-saved");
        Ok(done)
    }

    /// Refuses a request whose memory cap (or an uncapped share under `[policy] uncapped =
    /// "whole-gpu"`) would take the caps of the GPU's shares above `[policy] memory_overcommit`
    /// times its memory. A GPU whose size NVML does not report is not counted (logged).
    fn admit_memory(
        &self,
        rec: &Record,
        plan: &Plan,
        gpu: &PlannedGpu,
    ) -> Result<(), AcquireError> {
        let total = match self.inventory.memory_total(gpu.index) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(
                    uuid = %gpu.uuid,
                    "memory caps not counted: GPU {} reports no size: {}",
                    gpu.index,
                    crate::vocab::chain(&e)
                );
                return Ok(());
            }
        };
        let holders = rec
            .clients
            .iter()
            .map(|(id, c)| (id.as_str(), c.cap.as_ref().map(|k| k.bytes)));
        crate::decide::admission::admit(
            gpu.index,
            &gpu.uuid,
            total,
            holders,
            plan.cap,
            self.cfg.policy.memory_overcommit,
            self.cfg.policy.uncapped,
        )?;
        Ok(())
    }

    /// Sets the driver's memory limit of the container's cgroup on this GPU when the driver
    /// backend enforces its cap; a failure refuses the container (never uncapped).
    fn set_driver_limit(
        &self,
        rec: &Record,
        plan: &Plan,
        gpu: &PlannedGpu,
        done: &mut Done,
    ) -> Result<(), AcquireError> {
        let (
            Some(cap),
            Enforcement {
                backend: Backend::Driver,
                cgroup: Some(cgroup),
                ..
            },
        ) = (plan.cap, &plan.enforcement)
        else {
            return Ok(());
        };
        let others = rec.clients.iter().filter_map(|(id, c)| {
            let k = c.cap.as_ref()?;
            (k.enforcement.backend == Backend::Driver)
                .then_some((id.as_str(), k.enforcement.cgroup.as_deref()?))
        });
        if let Some(other) = crate::host::cgroup::claimed_by(cgroup, others) {
            return Err(AcquireError::CgroupTaken {
                index: gpu.index,
                cgroup: cgroup.clone(),
                other: other.to_owned(),
            });
        }
        // Soft 0: only the hard cap. A soft limit raises every ancestor's `dmem.min`, and the
        // runtime deletes the container's cgroup before poststop could lower it again, so the
        // ancestors would keep the reservation (NVIDIA's MPS memory partitioning guide).
        self.inventory
            .set_memory_limits(gpu.index, cgroup, 0, cap)
            .map_err(|source| AcquireError::DriverLimit {
                index: gpu.index,
                cgroup: cgroup.clone(),
                cap_mib: to_mib(cap),
                source,
            })?;
        done.driver_limit = Some(cgroup.clone());
        crate::failpoint::hit("acquire-driver-limit-set");
        Ok(())
    }

    /// `timeslice` / `limit`: stops leftover daemons, puts the GPU in DEFAULT, sets the slice.
    fn plain_share(
        &self,
        rec: &mut Record,
        plan: &Plan,
        done: &mut Done,
    ) -> Result<(), AcquireError> {
        let keys: Vec<String> = rec.domains.keys().cloned().collect();
        for key in keys {
            // Daemons with no clients left behind (e.g. a killed release): stop them.
            self.stop_daemon(rec, &key);
        }
        let previous = self.inventory.compute_mode(rec.index)?;
        if previous != ComputeMode::Default {
            self.inventory
                .set_compute_mode(rec.index, ComputeMode::Default)?;
            done.compute_mode_before = Some(previous);
        }
        if let Some(slice) = plan.timeslice {
            timeslice::set(&self.cfg.timeslice.smi, rec.index, slice)?;
        }
        Ok(())
    }

    /// `mps`: admits the container to its domain (limits, uid) and makes sure one live,
    /// answering daemon with the domain's defaults serves it.
    fn join_domain(
        &self,
        rec: &mut Record,
        plan: &Plan,
        planned: &PlannedDomain,
        done: &mut Done,
    ) -> Result<(), AcquireError> {
        let key = planned.key.as_str();
        let occupied = !rec.domain_clients(key).is_empty()
            || rec.domains.get(key).is_some_and(|d| d.daemon.is_some());
        let entry = rec
            .domains
            .entry(key.to_owned())
            .or_insert_with(|| Domain::new(planned.limits));
        if occupied {
            let cores = plan.cores_explicit.then_some(plan.cores);
            domain::admit(
                key,
                &rec.uuid,
                &entry.limits,
                cores,
                plan.memory.map(to_mib),
            )?;
            if !self.cfg.mps.multiuser {
                if let Some(serving) = entry.uid.filter(|u| *u != plan.uid) {
                    return Err(DomainError::OtherUser {
                        uid: plan.uid,
                        serving,
                        domain: key.to_owned(),
                        uuid: rec.uuid.clone(),
                    }
                    .into());
                }
            }
        } else {
            // The first container of the domain sets its limits (admin-defined groups and the
            // per-GPU domain take the policy's).
            entry.limits = planned.limits;
        }
        entry.uid = Some(plan.uid);
        self.ensure_daemon(rec, key, done)
    }

    /// Makes sure one live, answering daemon serves domain `key` with its limits as defaults:
    /// keeps the recorded one (putting back defaults a tenant changed), adopts an unrecorded
    /// one, or starts a new one.
    fn ensure_daemon(
        &self,
        rec: &mut Record,
        key: &str,
        done: &mut Done,
    ) -> Result<(), AcquireError> {
        let control = self.control()?;
        let dirs = self.mps_dirs(&rec.uuid, key);
        let limits = rec.domains[key].limits;
        if let Some(d) = rec.domains[key].daemon.clone() {
            // Live means answering: a real command, proven to reach the daemon gpushare
            // started, within a short deadline; the same conversation puts back defaults a
            // tenant changed.
            let checked = if d.process.is_alive() {
                control.refresh(&dirs.pipe, d.process, &limits)
            } else {
                Err(MpsError::Gone { pid: d.process.pid })
            };
            match checked {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.log_replacement(rec, key, d.process, &e);
                    events::note(Event::daemon(
                        if d.process.is_alive() {
                            "replace"
                        } else {
                            "restart"
                        },
                        &rec.uuid,
                        key,
                        d.process.pid,
                    ));
                    // Replaced in the same directories, which running containers have
                    // mounted; the start empties the pipe directory first.
                    control.stop(&dirs.pipe, Some(d.process));
                    if let Some(dom) = rec.domains.get_mut(key) {
                        dom.daemon = None;
                    }
                }
            }
        } else if let Some(found) = control.find_daemon(&dirs.pipe) {
            // One gpushare started and recorded in the domain directory, missing from the
            // record (the hook was killed between start and save): adopted if it answers.
            if control.set_defaults(&dirs.pipe, found, &limits).is_ok() {
                tracing::warn!(
                    "adopting the MPS daemon of GPU {} ({}, domain {key}), pid {}, missing from the record",
                    rec.index,
                    rec.uuid,
                    found.pid
                );
                if let Some(dom) = rec.domains.get_mut(key) {
                    dom.daemon = Some(Daemon { process: found });
                }
                return Ok(());
            }
            control.stop(&dirs.pipe, Some(found));
        }
        dirs.prepare(self.cfg.mps.shm_bytes())?;
        self.set_mps_compute_mode(rec, done)?;
        let timeout = Duration::from_secs(self.cfg.mps.start_timeout_seconds);
        let proc = control.start(&rec.uuid, &dirs, self.cfg.mps.multiuser, timeout)?;
        done.started = Some((key.to_owned(), proc));
        if let Some(dom) = rec.domains.get_mut(key) {
            dom.daemon = Some(Daemon { process: proc });
        }
        if let Err(e) = control.set_defaults(&dirs.pipe, proc, &limits) {
            // Never leave a daemon serving without the domain's limits.
            control.stop(&dirs.pipe, Some(proc));
            done.started = None;
            if let Some(dom) = rec.domains.get_mut(key) {
                dom.daemon = None;
            }
            return Err(e.into());
        }
        events::note(Event::daemon("start", &rec.uuid, key, proc.pid));
        tracing::info!(
            "MPS daemon started on GPU {} ({}, domain {key}), pid {}",
            rec.index,
            rec.uuid,
            proc.pid
        );
        crate::failpoint::hit("acquire-daemon-started");
        Ok(())
    }

    /// Logs why the daemon `daemon` of domain `key` is replaced: tampered with (another
    /// process holds its socket), hung, or dead; with the domain's containers.
    fn log_replacement(&self, rec: &Record, key: &str, daemon: ProcId, why: &MpsError) {
        let containers = rec.domain_clients(key).join(", ");
        let tampered = why.is_tampered();
        let why = crate::vocab::chain(why);
        if tampered {
            tracing::error!(
                gpu = rec.index,
                uuid = %rec.uuid,
                domain = key,
                containers = %containers,
                "MPS domain {key} of GPU {} tampered with: {why}; restarting its daemon (pid {}) in an emptied pipe directory",
                rec.index,
                daemon.pid
            );
        } else {
            tracing::warn!(
                gpu = rec.index,
                uuid = %rec.uuid,
                domain = key,
                containers = %containers,
                "MPS daemon of GPU {} ({}, domain {key}), pid {}, is dead or does not answer ({why}); replacing it",
                rec.index,
                rec.uuid,
                daemon.pid
            );
        }
    }

    /// Under `gpu`'s lock (held by the caller): drops the reservations of `container` and
    /// `reservation`, and the directories of a domain nothing else keeps.
    fn drop_reservations(&self, gpu: &PlannedGpu, container: &str, reservation: Option<&str>) {
        let Ok(Some(mut rec)) = self.state.load(&gpu.uuid) else {
            return;
        };
        let before = rec.clone();
        rec.unreserve(container);
        if let Some(key) = reservation {
            rec.unreserve(key);
        }
        if rec == before {
            return;
        }
        let now = now_seconds();
        let idle: Vec<String> = rec
            .domains
            .iter()
            .filter(|(k, d)| d.daemon.is_none() && !rec.dirs_in_use(k, now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in idle {
            self.mps_dirs(&rec.uuid, &key).remove();
        }
        rec.tidy();
        if let Err(e) = self.state.save(&rec) {
            tracing::warn!(uuid = %gpu.uuid, error = %crate::vocab::chain(&e), "cannot drop a refused request's reservation");
        }
    }

    /// Restarts the daemon of domain `key` for the clients it still has (gc).
    ///
    /// # Errors
    /// [`AcquireError`] when it cannot be started.
    pub(crate) fn restart(&self, rec: &mut Record, key: &str) -> Result<(), AcquireError> {
        let mut done = Done {
            gpu: PlannedGpu {
                index: rec.index,
                uuid: rec.uuid.clone(),
                ordinal: 0,
            },
            before: None,
            started: None,
            domain: None,
            compute_mode_before: None,
            driver_limit: None,
        };
        self.ensure_daemon(rec, key, &mut done)
    }

    /// Puts the GPU in the compute mode MPS needs under this policy, recording (and saving)
    /// the mode to restore first.
    fn set_mps_compute_mode(&self, rec: &mut Record, done: &mut Done) -> Result<(), AcquireError> {
        let Some(wanted) = self.mps_compute_mode() else {
            return Ok(());
        };
        let current = self.inventory.compute_mode(rec.index)?;
        if current == wanted {
            return Ok(());
        }
        if rec.restore_compute_mode.is_none() {
            rec.restore_compute_mode = Some(current);
            // Write-ahead: a hook killed after the change leaves a record that says what to
            // restore.
            self.state.save(rec)?;
            crate::failpoint::hit("acquire-mode-recorded");
        }
        self.inventory.set_compute_mode(rec.index, wanted)?;
        done.compute_mode_before = Some(current);
        Ok(())
    }

    /// Stops the daemon of domain `key`, removes its directories unless a container uses them,
    /// and restores the GPU's compute mode once no daemon is left on it.
    pub(crate) fn stop_daemon(&self, rec: &mut Record, key: &str) -> Option<ProcId> {
        let dirs = self.mps_dirs(&rec.uuid, key);
        let recorded = rec.domains.get_mut(key).and_then(|d| d.daemon.take());
        // A daemon missing from the record (a hook killed between start and save) goes too.
        let found = recorded
            .map(|d| d.process)
            .or_else(|| self.control().ok()?.find_daemon(&dirs.pipe));
        if let Some(p) = found {
            events::note(Event::daemon("stop", &rec.uuid, key, p.pid));
            match self.control() {
                Ok(c) => c.stop(&dirs.pipe, Some(p)),
                // Stopping needs no control program: quit is spoken in-process.
                Err(_) => crate::host::mps::stop(&dirs.pipe, Some(p)),
            }
            tracing::info!(
                "MPS daemon stopped on GPU {} ({}, domain {key}), pid {}",
                rec.index,
                rec.uuid,
                p.pid
            );
        }
        if !rec.dirs_in_use(key, now_seconds()) {
            dirs.remove();
        }
        rec.tidy();
        self.restore_compute_mode(rec);
        found
    }

    /// Puts back the compute mode recorded before gpushare changed it, once no daemon runs.
    pub(crate) fn restore_compute_mode(&self, rec: &mut Record) {
        if rec.has_daemon() {
            return;
        }
        let Some(m) = rec.restore_compute_mode else {
            return;
        };
        match self.inventory.set_compute_mode(rec.index, m) {
            Ok(()) => rec.restore_compute_mode = None,
            Err(e) => {
                tracing::warn!(uuid = %rec.uuid, error = %crate::vocab::chain(&e), "cannot restore compute mode")
            }
        }
    }

    fn rollback(&self, done: Vec<Done>) {
        for d in done.into_iter().rev() {
            if let Some((key, proc)) = &d.started {
                if let Ok(c) = self.control() {
                    c.stop(&self.mps_dirs(&d.gpu.uuid, key).pipe, Some(*proc));
                }
            }
            if let Some(key) = &d.domain {
                let before = d
                    .before
                    .clone()
                    .unwrap_or_else(|| Record::new(&d.gpu.uuid, d.gpu.index));
                let had_daemon = before
                    .domains
                    .get(key)
                    .is_some_and(|dom| dom.daemon.is_some());
                let pipe = self.mps_dirs(&d.gpu.uuid, key).pipe;
                let adopted = self
                    .control()
                    .ok()
                    .and_then(|c| c.find_daemon(&pipe))
                    .is_some();
                if !had_daemon && !adopted && !before.dirs_in_use(key, now_seconds()) {
                    self.mps_dirs(&d.gpu.uuid, key).remove();
                }
            }
            if let Some(p) = d.compute_mode_before {
                let _ = self.inventory.set_compute_mode(d.gpu.index, p);
            }
            if let Some(cgroup) = &d.driver_limit {
                let held_before = d.before.as_ref().is_some_and(|r| {
                    r.clients.values().any(|c| {
                        c.cap
                            .as_ref()
                            .is_some_and(|k| k.enforcement.cgroup.as_deref() == Some(cgroup))
                    })
                });
                if !held_before {
                    let _ = clear_driver_limit(self.inventory, d.gpu.index, cgroup);
                }
            }
            let before = d
                .before
                .clone()
                .unwrap_or_else(|| Record::new(&d.gpu.uuid, d.gpu.index));
            // Nothing to put back when the failing step was the first write.
            let on_disk = self.state.load(&d.gpu.uuid).ok().flatten();
            if on_disk.as_ref() == d.before.as_ref() {
                continue;
            }
            if let Err(e) = self.state.save(&before) {
                tracing::error!(uuid = %d.gpu.uuid, error = %crate::vocab::chain(&e), "rollback could not restore the record");
            }
        }
    }

    /// Announces that a spec edit made the MPS directories of `gpu`'s domain `domain` a mount
    /// source for the container `key` (its id, or a pending key): under the GPU's lock, creates
    /// them if needed and records the reservation, so that a release in the meantime does not
    /// remove them. Returns the limits the domain already enforces when it is running (a
    /// container joining it that names no limit gets those).
    ///
    /// # Errors
    /// [`AcquireError`] when the state or the directories cannot be made.
    pub fn reserve(
        &self,
        gpu: &PlannedGpu,
        domain: &PlannedDomain,
        key: &str,
    ) -> Result<Option<crate::vocab::Limits>, AcquireError> {
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
        rec.drop_stale();
        let enforced = rec
            .domains
            .get(&domain.key)
            .filter(|d| d.daemon.is_some() || !rec.domain_clients(&domain.key).is_empty())
            .map(|d| d.limits);
        self.mps_dirs(&gpu.uuid, &domain.key)
            .prepare(self.cfg.mps.shm_bytes())?;
        rec.domains
            .entry(domain.key.clone())
            .or_insert_with(|| Domain::new(domain.limits))
            .reserved
            .insert(key.to_owned(), now);
        self.state.save(&rec)?;
        Ok(enforced)
    }

    /// Drops the reservations made under `key` on every GPU that holds one (and the domain
    /// directories only they kept): a container refused after a spec edit reserved for it
    /// holds nothing.
    pub fn forget(&self, key: &str) {
        for (uuid, rec) in self.state.list_records() {
            let Ok(rec) = rec else { continue };
            if !rec.domains.values().any(|d| d.reserved.contains_key(key)) {
                continue;
            }
            let gpu = PlannedGpu {
                index: rec.index,
                uuid,
                ordinal: 0,
            };
            self.unreserve(&gpu, key);
        }
    }

    /// Drops what [`Host::reserve`] made for `key` on `gpu` (the reservation, and the domain
    /// directories only it kept), under the GPU's lock: a spec edit that is refused after
    /// reserving leaves nothing. Best effort (logged): the reservation expires anyway.
    pub fn unreserve(&self, gpu: &PlannedGpu, key: &str) {
        match self.state.lock(
            &gpu.uuid,
            self.lock_timeout(),
            &format!("refused spec edit for {key}"),
        ) {
            Ok(_lock) => self.drop_reservations(gpu, key, None),
            Err(e) => tracing::warn!(
                uuid = %gpu.uuid,
                error = %crate::vocab::chain(&e),
                "cannot drop a refused spec edit's reservation; it expires"
            ),
        }
    }
}

/// Clears the driver's memory limits of `cgroup` on GPU `index` (soft 0, hard max). A cgroup
/// that is gone has none left (removing a cgroup clears its limits): `Ok(false)`. A failure is
/// logged and returned for the caller's report.
pub(crate) fn clear_driver_limit(
    inventory: &dyn Inventory,
    index: u32,
    cgroup: &str,
) -> Result<bool, InventoryError> {
    if !std::path::Path::new(cgroup).is_dir() {
        return Ok(false);
    }
    inventory
        .set_memory_limits(index, cgroup, 0, LIMIT_MAX)
        .inspect_err(|e| {
            tracing::warn!(
                cgroup,
                "cannot clear the driver's memory limit on GPU {index}: {}",
                crate::vocab::chain(e)
            );
        })
        .map(|()| true)
}
