//! GPUs, compute modes and the narrow [`Inventory`] trait through which the host asks and sets
//! them (NVML implements it in [`crate::host::inventory`]).

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One physical GPU as NVML names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// Minor number of `/dev/nvidia<N>`.
    pub minor: u32,
}

/// Compute modes the hook sets and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
    Prohibited,
}

impl fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ComputeMode::Default => "DEFAULT",
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
            ComputeMode::Prohibited => "PROHIBITED",
        })
    }
}

/// NVML could not answer.
#[derive(Debug, Error)]
pub enum InventoryError {
    #[error("cannot load NVML from {library}; install the NVIDIA driver (libnvidia-ml.so.1) or set [nvml] library in the config")]
    Load {
        library: String,
        #[source]
        source: crate::sys::nvml::NvmlError,
    },
    #[error("NVML {call} failed")]
    Call {
        call: &'static str,
        #[source]
        source: crate::sys::nvml::NvmlError,
    },
    #[error("NVML unavailable: {0}")]
    Unavailable(String),
    /// Every call of an inventory made after NVML failed to load: the load's own error.
    #[error("NVML was not loaded")]
    NotLoaded(#[source] std::sync::Arc<InventoryError>),
    #[error("the GPUs NVML lists differ from those saved in {path}, which was dropped; retry")]
    Changed { path: String },
    /// A raw NVML return code of the r615 memory limits, with what it means for them.
    #[error("NVML {call} failed: {what} (code {code})")]
    Code {
        call: &'static str,
        code: u32,
        what: &'static str,
    },
    #[error("NVML reports a GPU UUID {0:?} that is not a safe name")]
    BadUuid(String),
}

impl InventoryError {
    /// Whether the same request may succeed if made again: the saved GPU list was stale and
    /// has been dropped.
    pub fn is_retry(&self) -> bool {
        matches!(self, InventoryError::Changed { .. })
    }
}

/// What the hook needs to know about, and do to, the GPUs.
pub trait Inventory {
    /// All GPUs, in index order.
    ///
    /// # Errors
    /// When the driver cannot be asked.
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError>;
    /// Current compute mode of GPU `index`.
    ///
    /// # Errors
    /// When the driver cannot be asked.
    fn compute_mode(&self, index: u32) -> Result<ComputeMode, InventoryError>;
    /// Sets the compute mode of GPU `index`.
    ///
    /// # Errors
    /// When the driver refuses.
    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), InventoryError>;
    /// Total memory of GPU `index`, in bytes. The default: not known (no check is made).
    ///
    /// # Errors
    /// When the driver cannot be asked.
    fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
        let _ = index;
        Err(InventoryError::Unavailable(
            "this inventory does not report memory sizes".into(),
        ))
    }
    /// Why this inventory could not reach the driver, once it tried and failed (NVML that did
    /// not load). The default: it did not fail so.
    fn unavailable(&self) -> Option<&InventoryError> {
        None
    }
    /// Keeps what this inventory learned for later commands; called once a request has
    /// succeeded, so that a refused one leaves the state directory as it was. The default:
    /// nothing to keep.
    fn remember(&self) {}
    /// Whether the driver has cgroup memory limits (NVML exports `nvmlDeviceSetMemoryLimits_v1`
    /// and `nvmlDeviceGetMemoryLimits_v1`, r615 and later, and answers for GPU `index`). The
    /// default: no.
    fn has_memory_limits(&self, index: u32) -> bool {
        let _ = index;
        false
    }
    /// Sets the driver's memory limits of the cgroup directory `namespace` on GPU `index`
    /// (soft 0 and hard [`crate::vocab::memcap::LIMIT_MAX`] clear them).
    ///
    /// # Errors
    /// When the driver has no such limits or refuses.
    fn set_memory_limits(
        &self,
        index: u32,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), InventoryError> {
        let _ = (index, namespace, soft, hard);
        Err(InventoryError::Unavailable(
            "this inventory has no driver memory limits".into(),
        ))
    }
    /// The driver's memory limits of the cgroup directory `namespace` on GPU `index`.
    ///
    /// # Errors
    /// When the driver has no such limits or cannot answer.
    fn memory_limits(
        &self,
        index: u32,
        namespace: &str,
    ) -> Result<crate::vocab::memcap::DriverLimits, InventoryError> {
        let _ = (index, namespace);
        Err(InventoryError::Unavailable(
            "this inventory has no driver memory limits".into(),
        ))
    }
}
