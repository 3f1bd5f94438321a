//! Container-wide memory caps: which backend enforces one, how a share without a cap counts,
//! and the driver's cgroup memory limits as NVML (r615, CUDA 13.4) reads them back.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What enforces a container's memory cap (all its processes together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The driver's cgroup memory limits (`nvmlDeviceSetMemoryLimits_v1`), enforced by the
    /// kernel's `dmem` controller or the driver's own fallback: a tenant cannot drop it.
    Driver,
    /// gpushare's preloaded limiter (its cross-process account per container): cooperative,
    /// a process that drops the preload escapes it.
    Limiter,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Driver => "driver",
            Backend::Limiter => "limiter",
        })
    }
}

/// `[policy] uncapped`: how a share without a memory cap counts against a GPU's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Uncapped {
    /// It reserves nothing and is promised nothing: any number of uncapped shares use a GPU
    /// together, and only caps are counted against its memory (the default).
    #[default]
    Share,
    /// It counts as the whole GPU: the first uncapped share holds it alone.
    WholeGpu,
    /// It is refused: every share must name `gpu.share.memory`.
    Refuse,
}

impl fmt::Display for Uncapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Uncapped::Share => "share",
            Uncapped::WholeGpu => "whole-gpu",
            Uncapped::Refuse => "refuse",
        })
    }
}

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: the hard limit that means "no limit".
pub const LIMIT_MAX: u64 = u64::MAX;

/// The driver's limits of one cgroup on one GPU (`nvmlGetMemoryLimits_v1_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DriverLimits {
    pub soft: u64,
    pub hard: u64,
    /// Device memory the cgroup's processes use now, in bytes.
    pub used: u64,
}

impl DriverLimits {
    /// Whether no limit is set (soft 0, hard [`LIMIT_MAX`]).
    pub fn is_clear(&self) -> bool {
        self.soft == 0 && self.hard == LIMIT_MAX
    }
}

/// What enforces one container's cap, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    pub backend: Backend,
    /// The cgroup directory the driver's limits are set on (driver backend): what release
    /// clears.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Why the driver does not enforce it (limiter backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}
