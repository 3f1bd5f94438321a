//! Reservations: a spec edit that makes a domain's MPS directories a container's mount source
//! reserves them (under the GPU's lock) so that a release in the meantime does not remove them;
//! an acquire consumes the reservation, a refusal drops it, and it expires otherwise.

use crate::decide::domain::PlannedDomain;
use crate::decide::plan::PlannedGpu;
use crate::host::handle::Host;
use crate::host::state::{now_seconds, Domain, Record};
use crate::host::step::AcquireError;

impl Host<'_> {
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

    /// Under `gpu`'s lock (held by the caller): drops the reservations of `container` and
    /// `reservation`, and the directories of a domain nothing else keeps.
    pub(super) fn drop_reservations(
        &self,
        gpu: &PlannedGpu,
        container: &str,
        reservation: Option<&str>,
    ) {
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
}
