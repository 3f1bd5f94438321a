//! Driver memory limits: the cap of a container whose enforcement is the driver backend, set on
//! its cgroup for each GPU by acquire (a failure refuses the container) and cleared when it
//! leaves.

use crate::decide::plan::{Plan, PlannedGpu};
use crate::host::handle::Host;
use crate::host::state::{Client, Record};
use crate::host::step::{AcquireError, Done};
use crate::vocab::memcap::{Backend, Enforcement, LIMIT_MAX};
use crate::vocab::quantity::to_mib;
use crate::vocab::{Inventory, InventoryError};

impl Host<'_> {
    /// Sets the driver's memory limit of the container's cgroup on this GPU when the driver
    /// backend enforces its cap; a failure refuses the container (never uncapped).
    pub(super) fn set_driver_limit(
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
        // The clients are read only when the tally says one has a driver cap.
        let others = (rec.clients.tally().driver_caps > 0)
            .then(|| rec.clients.iter())
            .into_iter()
            .flatten()
            .filter_map(|(id, c)| {
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

    /// Clears the driver memory limits of clients `gone` from GPU `rec`.
    pub(super) fn clear_driver_limits(
        &self,
        rec: &Record,
        gone: &[(String, Client)],
        did: &mut Vec<String>,
    ) {
        let uuid = &rec.uuid;
        for (id, c) in gone {
            let Some(cgroup) = c.cap.as_ref().and_then(|k| k.enforcement.cgroup.as_deref()) else {
                continue;
            };
            match clear_driver_limit(self.inventory, rec.index, cgroup) {
                Ok(true) => did.push(format!(
                    "{uuid}: cleared the driver's memory limit of {id} on {cgroup}"
                )),
                Ok(false) => {}
                Err(e) => did.push(format!(
                    "{uuid}: cannot clear the driver's memory limit of {id} on {cgroup}: {}",
                    crate::vocab::chain(&e)
                )),
            }
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
