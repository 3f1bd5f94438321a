//! What the steps of an acquire share: why one failed ([`AcquireError`]) and what one changed on
//! a GPU (`Done`), which the rollback in [`crate::host::acquire`] undoes.

use thiserror::Error;

use crate::decide::domain::DomainError;
use crate::decide::plan::PlannedGpu;
use crate::host::mps::MpsError;
use crate::host::procinfo::ProcId;
use crate::host::state::{Record, StateError};
use crate::host::timeslice::TimesliceError;
use crate::vocab::{ComputeMode, InventoryError, Mode};

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

impl AcquireError {
    /// A refusal for what the GPU's other clients hold or serve: one that an exited client
    /// still listed may cause.
    pub(super) fn is_for_other_clients(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::Overcommitted(_) | Self::CgroupTaken { .. } | Self::Domain(_)
        )
    }
}

/// What one acquire changed on one GPU, for rollback.
pub(super) struct Done {
    pub(super) gpu: PlannedGpu,
    pub(super) before: Option<Record>,
    /// The daemon this acquire started, and its domain.
    pub(super) started: Option<(String, ProcId)>,
    /// The domain whose directories this acquire may have made.
    pub(super) domain: Option<String>,
    /// The compute mode this acquire changed away from.
    pub(super) compute_mode_before: Option<ComputeMode>,
    /// The cgroup whose driver memory limits this acquire set on this GPU.
    pub(super) driver_limit: Option<String>,
}
