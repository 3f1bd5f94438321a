//! The shipped policy: every key's default, what a missing policy file means.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{
    Config, LimitConfig, MpsConfig, NvmlConfig, PolicyConfig, RuntimeConfig, ServeConfig,
    TimesliceConfig,
};
use crate::vocab::{Isolation, Mode};

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9401".into(),
            gc_interval_seconds: 30,
            events_file: None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/run/gpushare"),
            log_file: PathBuf::from("/var/log/gpushare.log"),
            lock_timeout_seconds: 30,
            nvml: NvmlConfig::default(),
            mps: MpsConfig::default(),
            limit: LimitConfig::default(),
            timeslice: TimesliceConfig::default(),
            policy: PolicyConfig::default(),
            runtime: RuntimeConfig::default(),
            profiles: BTreeMap::new(),
            serve: ServeConfig::default(),
        }
    }
}

impl Default for NvmlConfig {
    fn default() -> Self {
        Self {
            library: "libnvidia-ml.so.1".into(),
        }
    }
}

impl Default for MpsConfig {
    fn default() -> Self {
        Self {
            control: "nvidia-cuda-mps-control".into(),
            exclusive_compute_mode: true,
            multiuser: false,
            start_timeout_seconds: 10,
            isolation: Isolation::Gpu,
            groups: BTreeMap::new(),
            shm_size: "64Mi".into(),
            pipe_readonly: false,
            group_namespaces: BTreeMap::new(),
        }
    }
}

impl Default for LimitConfig {
    fn default() -> Self {
        Self {
            library: PathBuf::from("/usr/lib/gpushare/libgpushare_limiter.so"),
        }
    }
}

impl Default for TimesliceConfig {
    fn default() -> Self {
        Self {
            smi: "nvidia-smi".into(),
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            modes: vec![Mode::Mps, Mode::Timeslice, Mode::Limit],
            env_fallback: true,
            max_memory: None,
            max_cores: 100,
            default_cores: 100,
            memory_overcommit: 1.0,
            // Uncapped shares share: the README's first example (two `gpu.share=mps`
            // containers on one GPU) works with the shipped policy; caps are still admitted
            // against the GPU's memory.
            uncapped: crate::vocab::memcap::Uncapped::Share,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            next: vec!["runc".into(), "crun".into()],
            hook: PathBuf::from("/usr/bin/gpushare-hook"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn empty_is_default() {
        assert_eq!(
            Config::parse("", Path::new("t")).unwrap(),
            Config::default()
        );
    }
}
