//! GPU inventory and compute mode, behind the narrow [`Inventory`] trait; NVML implements it.

use std::fmt;

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::Nvml;
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
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML {call} failed")]
    Call {
        call: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML unavailable: {0}")]
    Unavailable(String),
    #[error("NVML reports a GPU UUID {0:?} that is not a safe name")]
    BadUuid(String),
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
}

/// The real inventory: NVML, loaded from a configured library path.
pub struct NvmlInventory {
    nvml: Nvml,
}

impl NvmlInventory {
    /// Loads and initialises NVML from `library` (a soname or a path).
    ///
    /// # Errors
    /// [`InventoryError::Load`] when the library is missing or `nvmlInit` fails.
    pub fn open(library: &str) -> Result<Self, InventoryError> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(library))
            .init()
            .map_err(|source| InventoryError::Load {
                library: library.to_owned(),
                source,
            })?;
        Ok(Self { nvml })
    }

    fn call<T>(
        call: &'static str,
        r: Result<T, nvml_wrapper::error::NvmlError>,
    ) -> Result<T, InventoryError> {
        r.map_err(|source| InventoryError::Call { call, source })
    }
}

impl Inventory for NvmlInventory {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        let count = Self::call("nvmlDeviceGetCount", self.nvml.device_count())?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count.min(1024) {
            let dev = Self::call(
                "nvmlDeviceGetHandleByIndex",
                self.nvml.device_by_index(index),
            )?;
            let uuid = Self::call("nvmlDeviceGetUUID", dev.uuid())?;
            if !crate::state::is_safe_name(&uuid) {
                return Err(InventoryError::BadUuid(uuid));
            }
            let minor = dev.minor_number().unwrap_or(index);
            out.push(Gpu { index, uuid, minor });
        }
        Ok(out)
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, InventoryError> {
        let dev = Self::call(
            "nvmlDeviceGetHandleByIndex",
            self.nvml.device_by_index(index),
        )?;
        let m = Self::call("nvmlDeviceGetComputeMode", dev.compute_mode())?;
        Ok(match m {
            NvmlComputeMode::Default => ComputeMode::Default,
            NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
            _ => ComputeMode::Prohibited,
        })
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), InventoryError> {
        let mut dev = Self::call(
            "nvmlDeviceGetHandleByIndex",
            self.nvml.device_by_index(index),
        )?;
        let m = match mode {
            ComputeMode::Default => NvmlComputeMode::Default,
            ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
            ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
        };
        Self::call("nvmlDeviceSetComputeMode", dev.set_compute_mode(m))
    }
}

/// An inventory for when NVML cannot be loaded: every call fails with the reason. Lets a
/// release still clean records up.
pub struct Unavailable(pub String);

impl Inventory for Unavailable {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        Err(InventoryError::Unavailable(self.0.clone()))
    }

    fn compute_mode(&self, _index: u32) -> Result<ComputeMode, InventoryError> {
        Err(InventoryError::Unavailable(self.0.clone()))
    }

    fn set_compute_mode(&self, _index: u32, _mode: ComputeMode) -> Result<(), InventoryError> {
        Err(InventoryError::Unavailable(self.0.clone()))
    }
}
