//! The admin policy file (`/etc/gpushare/config.toml`): paths, allowed modes, defaults, maxima.
//! Here the model (its tables and what is derived from them); the shipped values in
//! [`defaults`], reading and parsing the file in [`load`], the checks in [`validate`].

mod defaults;
mod load;
mod validate;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::vocab::quantity::{self, QuantityError};
use crate::vocab::{Isolation, Limits, Mode};

pub use load::{salvage, Source, DEFAULT_PATH, ENV_PATH};

/// An unusable policy file.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path} is larger than 256 KiB")]
    TooLarge { path: PathBuf },
    #[error("config {path} is not valid TOML for gpushare: line {line}, column {column}: {message} (`gpushare-hook doctor` shows where)")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
        /// The parser's own multi-line diagnostic (the line, a caret, the message).
        diagnostic: String,
    },
    #[error("config {path}: [policy] max_memory")]
    MaxMemory {
        path: PathBuf,
        #[source]
        source: QuantityError,
    },
    #[error("config {path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// The whole policy, with every default filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub state_dir: PathBuf,
    pub log_file: PathBuf,
    pub lock_timeout_seconds: u64,
    pub nvml: NvmlConfig,
    pub mps: MpsConfig,
    pub limit: LimitConfig,
    pub timeslice: TimesliceConfig,
    pub policy: PolicyConfig,
    pub runtime: RuntimeConfig,
    /// `[profiles.<name>]`: named requests, offered as CDI devices `gpushare.io/share=<name>`.
    pub profiles: BTreeMap<String, ProfileConfig>,
    pub serve: ServeConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NvmlConfig {
    /// Soname or path of the NVML library; tests point it at the simulated driver.
    pub library: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MpsConfig {
    /// `nvidia-cuda-mps-control`, by name on PATH or by path.
    pub control: String,
    /// Put the GPU in EXCLUSIVE_PROCESS while a daemon runs, DEFAULT after.
    pub exclusive_compute_mode: bool,
    /// Serve clients of different uids from one daemon, with the multi-user option of the
    /// installed driver; refused where the driver has none (see `host::multiuser`).
    pub multiuser: bool,
    /// How long to wait for a new daemon to answer `get_server_list`.
    pub start_timeout_seconds: u64,
    /// Which containers share one MPS control daemon on a GPU.
    pub isolation: Isolation,
    /// Admin-defined groups and the limits their domain enforces.
    pub groups: BTreeMap<String, GroupConfig>,
    /// Size cap of a domain's shm tmpfs (its clients' `/dev/shm`), as engines give a
    /// container's own `/dev/shm` by default.
    pub shm_size: String,
    /// Mount the pipe directory read-only into containers (whether MPS clients work so is for
    /// a GPU to tell: off by default).
    pub pipe_readonly: bool,
    /// Groups bound to the Kubernetes namespaces that alone may name them (group -> namespaces);
    /// a group not listed may be named from any namespace (each gets a domain of its own).
    pub group_namespaces: BTreeMap<String, Vec<String>>,
}

impl MpsConfig {
    /// [`MpsConfig::shm_size`] in bytes (checked by [`Config::validate`]; 64 MiB if invalid).
    pub fn shm_bytes(&self) -> u64 {
        quantity::parse_memory(&self.shm_size).unwrap_or(64 << 20)
    }
}

/// `[mps.groups.<name>]`: an admin-defined isolation domain and its enforced limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupConfig {
    /// Active thread percentage the group's daemon enforces (default: `[policy] default_cores`).
    pub cores: Option<u8>,
    /// Pinned device memory per client the group's daemon enforces (default: `[policy]
    /// max_memory`).
    pub memory: Option<String>,
}

/// `[profiles.<name>]`: a named share request (a Kubernetes-style fixed size). Each key means
/// what the annotation of the same name means; `mode` is required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    pub mode: Mode,
    /// `gpu.share.cores`.
    pub cores: Option<u8>,
    /// `gpu.share.memory`.
    pub memory: Option<String>,
    /// `gpu.share.group`.
    pub group: Option<String>,
    /// `gpu.share.timeslice`.
    pub timeslice: Option<String>,
}

/// Profile names that are the modes themselves (CDI devices `mps`, `timeslice`, `limit`).
pub const BUILTIN_PROFILES: [&str; 3] = ["mps", "timeslice", "limit"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitConfig {
    /// The interception library mounted into `limit` containers.
    pub library: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimesliceConfig {
    /// `nvidia-smi`, by name on PATH or by path; used for `--set-timeslice`.
    pub smi: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub modes: Vec<Mode>,
    pub env_fallback: bool,
    /// Largest per-GPU memory cap a container may ask for; larger requests are refused.
    pub max_memory: Option<String>,
    pub max_cores: u8,
    pub default_cores: u8,
    /// The sum of the memory caps of a GPU's shares may be at most this times its memory.
    pub memory_overcommit: f64,
    /// How a share without a memory cap counts: as nothing (it reserves nothing and is promised
    /// nothing), as the whole GPU, or refused.
    pub uncapped: crate::vocab::memcap::Uncapped,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// `gpushare-runtime` execs the first of these that is found.
    pub next: Vec<String>,
    /// What the spec edit puts into the container's hooks.
    pub hook: PathBuf,
}

/// `[serve]`: the `gpushare-hook serve` agent and the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Address `serve` listens on for `/metrics` and `/healthz` (host:port).
    pub listen: String,
    /// Seconds between the healing passes of `serve` (1 to 86400).
    pub gc_interval_seconds: u64,
    /// The event log, one JSON line per event (default: `gpushare-events.jsonl` next to
    /// `log_file`, i.e. `/var/log/gpushare-events.jsonl`).
    pub events_file: Option<PathBuf>,
}

impl Config {
    /// The limits the domain of admin-defined group `name` enforces, if the admin defined it.
    pub fn group_limits(&self, name: &str) -> Option<Limits> {
        let g = self.mps.groups.get(name)?;
        Some(Limits {
            cores: g.cores.unwrap_or(self.policy.default_cores),
            memory_mib: g
                .memory
                .as_deref()
                .and_then(|m| quantity::parse_memory(m).ok())
                .or(self.max_memory_bytes())
                .map(quantity::to_mib),
        })
    }

    /// The limits of the one domain per GPU under `isolation = "gpu"`: the policy's defaults.
    pub fn gpu_domain_limits(&self) -> Limits {
        Limits {
            cores: self.policy.default_cores,
            memory_mib: self.max_memory_bytes().map(quantity::to_mib),
        }
    }

    /// Maximum per-GPU memory a container may ask for, in bytes.
    pub fn max_memory_bytes(&self) -> Option<u64> {
        // Validated in `validate`, so parsing cannot fail here.
        self.policy
            .max_memory
            .as_deref()
            .and_then(|m| quantity::parse_memory(m).ok())
    }

    /// The event log: `[serve] events_file`, else `gpushare-events.jsonl` next to `log_file`.
    pub fn events_file(&self) -> PathBuf {
        self.serve
            .events_file
            .clone()
            .unwrap_or_else(|| self.log_file.with_file_name("gpushare-events.jsonl"))
    }
}

impl ConfigError {
    /// The parser's own multi-line diagnostic, for a file that is not valid TOML for gpushare.
    pub fn diagnostic(&self) -> Option<&str> {
        match self {
            ConfigError::Parse { diagnostic, .. } => Some(diagnostic),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn mps_shm_size_and_pipe_readonly() {
        let d = Config::default();
        assert_eq!(d.mps.shm_bytes(), 64 << 20, "engines' /dev/shm default");
        assert!(!d.mps.pipe_readonly);
        let cfg = Config::parse(
            "[mps]\nshm_size = \"8Mi\"\npipe_readonly = true\n",
            Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(cfg.mps.shm_bytes(), 8 << 20);
        assert!(cfg.mps.pipe_readonly);
        for bad in ["lots", "512Ki", "0"] {
            let e = Config::parse(&format!("[mps]\nshm_size = {bad:?}\n"), Path::new("t.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("shm_size"), "{bad}: {e}");
        }
    }

    #[test]
    fn serve_keys_parse_and_are_checked() {
        let cfg = Config::parse(
            "[serve]\nlisten = \"0.0.0.0:9500\"\ngc_interval_seconds = 5\nevents_file = \"/var/log/ev.jsonl\"\n",
            Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(cfg.serve.listen, "0.0.0.0:9500");
        assert_eq!(cfg.serve.gc_interval_seconds, 5);
        assert_eq!(cfg.events_file(), Path::new("/var/log/ev.jsonl"));
        let d = Config::default();
        assert_eq!(d.serve.listen, "127.0.0.1:9401");
        assert_eq!(d.serve.gc_interval_seconds, 30);
        assert_eq!(d.events_file(), Path::new("/var/log/gpushare-events.jsonl"));
        for bad in [
            "[serve]\nlisten = \"localhost\"\n",
            "[serve]\ngc_interval_seconds = 0\n",
            "[serve]\nevents_file = \"ev.jsonl\"\n",
        ] {
            let err = Config::parse(bad, Path::new("t.toml")).unwrap_err();
            assert!(err.to_string().contains("[serve]"), "{bad}: {err}");
        }
    }
}
