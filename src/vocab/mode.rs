//! The sharing modes and time-slice lengths: words every layer uses.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a GPU is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Mps,
    Timeslice,
    Limit,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Mps => "mps",
            Mode::Timeslice => "timeslice",
            Mode::Limit => "limit",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Time-slice length for `timeslice` mode (`nvidia-smi compute-policy --set-timeslice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Timeslice {
    Default,
    Short,
    Medium,
    Long,
}

impl Timeslice {
    /// The number `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn smi_value(self) -> u8 {
        match self {
            Timeslice::Default => 0,
            Timeslice::Short => 1,
            Timeslice::Medium => 2,
            Timeslice::Long => 3,
        }
    }
}
