//! `timeslice` mode: the time-slice length set through `nvidia-smi compute-policy`.

use std::process::{Command, Stdio};

use thiserror::Error;

use crate::host::mps::{find_binary, SAFE_PATH};
use crate::vocab::Timeslice;

/// `nvidia-smi` could not set the time slice.
#[derive(Debug, Error)]
pub enum TimesliceError {
    #[error("{0:?} not found, needed for gpu.share.timeslice; install nvidia-smi, set [timeslice] smi in the config, or drop gpu.share.timeslice")]
    NotFound(String),
    #[error("nvidia-smi compute-policy --set-timeslice failed on GPU {index}: {output}")]
    Failed { index: u32, output: String },
}

/// Sets the time slice of GPU `index`.
///
/// # Errors
/// [`TimesliceError`] when `nvidia-smi` is missing or fails.
pub fn set(smi: &str, index: u32, slice: Timeslice) -> Result<(), TimesliceError> {
    let bin = find_binary(smi).ok_or_else(|| TimesliceError::NotFound(smi.to_owned()))?;
    let out = Command::new(bin)
        .env_clear()
        .env("PATH", SAFE_PATH)
        .args([
            "compute-policy",
            "-i",
            &index.to_string(),
            "--set-timeslice",
        ])
        .arg(slice.smi_value().to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TimesliceError::Failed {
            index,
            output: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Err(TimesliceError::Failed {
        index,
        output: text.split_whitespace().collect::<Vec<_>>().join(" "),
    })
}
