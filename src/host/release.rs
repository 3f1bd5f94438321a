//! Undoing: releasing a container from its GPUs (poststop, and the reaper for containers whose
//! process ended). gc, which also heals what it finds, is in [`crate::host::gc_sweep`].

use crate::host::handle::Host;
use crate::host::state::{now_seconds, StateError};

// Callers name them by these paths.
pub use crate::host::gc_sweep::{GcOutcome, RebuildError};

impl Host<'_> {
    /// Removes the container from every GPU that lists it, stopping the daemons of domains
    /// whose last client left. Idempotent; problems are returned as warnings, never as a
    /// failure.
    pub fn release(&self, container: &str) -> Vec<String> {
        let mut warnings = Vec::new();
        for (uuid, rec) in self.state.list_records_lazy() {
            match rec {
                Ok(r) if !r.clients.contains_key(container) => continue,
                Ok(_) => {}
                Err(e) => {
                    warnings.push(crate::vocab::chain(&e));
                    continue;
                }
            }
            match self.release_one(&uuid, Some(container), false) {
                Ok(_) => {
                    crate::host::events::note(crate::host::events::Event::Release {
                        container: container.to_owned(),
                        gpu: uuid.clone(),
                    });
                    tracing::info!(container, "released from GPU {uuid}");
                }
                Err(e) => warnings.push(crate::vocab::chain(&e)),
            }
        }
        warnings
    }

    /// One release step for the reaper: under the GPU's lock, drops clients whose process is
    /// gone and stops the daemons of domains nobody uses any more, as poststop would.
    ///
    /// # Errors
    /// [`StateError`] when the lock or the record cannot be had.
    pub(crate) fn release_exited(&self, uuid: &str) -> Result<Vec<String>, StateError> {
        self.release_one(uuid, None, false)
    }

    /// Under the GPU's lock: drop `container` (if any) and stale clients; stop the daemons of
    /// domains nobody uses any more; with `heal` (gc), restart a dead daemon that still has
    /// clients and put back a compute mode no daemon explains. Returns what it did.
    pub(super) fn release_one(
        &self,
        uuid: &str,
        container: Option<&str>,
        heal: bool,
    ) -> Result<Vec<String>, StateError> {
        let holder = format!("release of {}", container.unwrap_or("stale clients"));
        let _lock = self.state.lock(uuid, self.lock_timeout(), &holder)?;
        // The other clients are carried as their stored lines unless exited ones are looked
        // for (see `Record::drop_stale`).
        let Some(mut rec) = self.state.load_lazy(uuid)? else {
            return Ok(Vec::new());
        };
        let before = rec.clone();
        let mut did = Vec::new();
        let mut gone = Vec::new();
        if let Some(c) = container {
            if let Some(client) = rec.clients.remove(c) {
                gone.push((c.to_owned(), client));
            }
        }
        // The reaper and gc look for clients whose process exited; a poststop leaves them to
        // the GPU's reaper when it runs (it releases each as its process exits).
        if container.is_none() || heal || !self.state.reaper_alive(uuid) {
            for (id, client) in rec.drop_stale() {
                did.push(format!(
                    "{uuid}: dropped client {id}, whose process is gone"
                ));
                gone.push((id, client));
            }
        }
        self.clear_driver_limits(&rec, &gone, &mut did);
        for (domain, key) in rec.prune_reservations(now_seconds()) {
            did.push(format!(
                "{uuid}: dropped the expired reservation of {key} in domain {domain}"
            ));
        }
        crate::failpoint::hit("release-locked");
        let keys: Vec<String> = rec.domains.keys().cloned().collect();
        for key in keys {
            let daemon = rec.domains.get(&key).and_then(|d| d.daemon.clone());
            if !rec.domain_in_use(&key) {
                let restore = rec.restore_compute_mode;
                let dir = self.mps_dirs(uuid, &key).dir;
                let existed = dir.exists();
                if let Some(p) = self.stop_daemon(&mut rec, &key) {
                    did.push(format!(
                        "{uuid}: stopped the MPS daemon of domain {key} (pid {}), which no container uses",
                        p.pid
                    ));
                }
                if existed && !dir.exists() {
                    did.push(format!(
                        "{uuid}: removed {} of domain {key}, which nothing uses",
                        dir.display()
                    ));
                }
                if heal && restore.is_some() && rec.restore_compute_mode.is_none() {
                    did.push(format!(
                        "{uuid}: put back the compute mode no MPS daemon explains"
                    ));
                }
                crate::failpoint::hit("release-daemon-stopped");
            } else if heal {
                let clients = rec.domain_clients(&key);
                if let Some(line) = self.heal_domain(&mut rec, uuid, &key, &clients, daemon) {
                    did.push(line);
                }
            }
        }
        rec.tidy();
        if heal && rec.restore_compute_mode.is_some() && !rec.has_daemon() {
            self.restore_compute_mode(&mut rec);
            if rec.restore_compute_mode.is_none() {
                did.push(format!(
                    "{uuid}: put back the compute mode no MPS daemon explains"
                ));
            }
        }
        // The clients changed only by those gone: the rest is compared without reading them.
        let changed = !gone.is_empty()
            || rec.domains != before.domains
            || rec.restore_compute_mode != before.restore_compute_mode;
        if changed {
            self.state.save(&rec)?;
        }
        Ok(did)
    }
}
