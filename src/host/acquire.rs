//! Doing: carries a [`Plan`] out on the GPUs, one GPU at a time under its lock, as one
//! transaction: every acquire undoes its own changes on failure ([`Host::acquire`] and its
//! rollback). The steps it takes live with their concern ([`crate::host::daemon`],
//! [`crate::host::driver_limit`], [`crate::host::reservation`]); the reverse is in
//! [`crate::host::release`].

use crate::decide::domain::{self, DomainError, PlannedDomain};
use crate::decide::plan::{Plan, PlannedGpu};
use crate::host::driver_limit::clear_driver_limit;
use crate::host::procinfo::ProcId;
use crate::host::state::{now_seconds, Cap, Client, Domain, Record};
use crate::host::step::Done;
use crate::host::timeslice;
use crate::vocab::quantity::to_mib;
use crate::vocab::{ComputeMode, Mode};

// Callers name them by these paths.
pub use crate::host::handle::Host;
pub use crate::host::step::AcquireError;

impl Host<'_> {
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
                    self.acquire_one(plan, gpu, process, reservation, false)
                        .or_else(|e| {
                            // Left to a running reaper, an exited client may still be listed
                            // (it releases it once this lock is free): it refuses nobody.
                            if e.is_for_other_clients() && self.state.reaper_alive(&gpu.uuid) {
                                self.acquire_one(plan, gpu, process, reservation, true)
                            } else {
                                Err(e)
                            }
                        })
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
    /// back, see [`crate::host::mps::MpsControl::refresh`]) through control clients nobody
    /// waits for. Call it once the container is set up: nothing that follows then competes
    /// with them.
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
        check_every_client: bool,
    ) -> Result<Done, AcquireError> {
        // The other clients are carried as their stored lines: what is asked of them here is
        // in the header's tally.
        let before = self.state.load_lazy(&gpu.uuid)?;
        crate::logging::step("record loaded");
        let mut rec = before
            .clone()
            .unwrap_or_else(|| Record::new(&gpu.uuid, gpu.index));
        rec.index = gpu.index;
        // With the GPU's reaper running, exited clients are released as they exit; without it
        // (killed, or never started), this acquire drops them.
        if check_every_client || !self.state.reaper_alive(&gpu.uuid) {
            rec.drop_stale();
        }
        let created_by_container = plan.domain.as_ref().filter(|d| !d.from_policy);
        if let Some(key) = created_by_container.map(|d| d.key.as_str()) {
            if !rec.domain_in_use(key) && rec.domains.get(key).is_some_and(|d| d.daemon.is_some()) {
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
        crate::logging::step("GPU set up");
        rec.tidy();
        if let Err(e) = self.state.save(&rec) {
            self.rollback(vec![done]);
            return Err(e.into());
        }
        crate::failpoint::hit("acquire-saved");
        crate::logging::step("record saved");
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
        let tally = rec.clients.tally();
        let held = crate::decide::admission::Held {
            caps: tally.capped_bytes,
            uncapped: tally.uncapped,
        };
        // The holders are named only in a refusal.
        let holders = || {
            rec.clients
                .iter()
                .map(|(id, c)| (id.clone(), c.cap.as_ref().map(|k| k.bytes)))
                .collect()
        };
        crate::decide::admission::admit_held(
            gpu.index,
            &gpu.uuid,
            total,
            held,
            holders,
            plan.cap,
            self.cfg.policy.memory_overcommit,
            self.cfg.policy.uncapped,
        )?;
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
        // A GPU that already serves timeslice or limit containers was put in the default
        // compute mode by the first of them, under this lock: a join does not load NVML to read
        // it again, as a join of a running MPS domain does not (NVML's load: 0.12-0.15 ms of a
        // timeslice create with the simulated driver, about 50 ms for the real library here).
        let joins = !rec.clients.is_empty() && rec.serving().is_some_and(|m| m != Mode::Mps);
        if !joins {
            let previous = self.inventory.compute_mode(rec.index)?;
            if previous != ComputeMode::Default {
                self.inventory
                    .set_compute_mode(rec.index, ComputeMode::Default)?;
                done.compute_mode_before = Some(previous);
            }
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
        let occupied =
            rec.domain_in_use(key) || rec.domains.get(key).is_some_and(|d| d.daemon.is_some());
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
}
