//! TEST-ONLY: the simulated driver's environment contract, parsed once per process.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

/// Most GPUs the simulated driver will expose.
pub const MAX_DEVICES: usize = 16;
/// Device memory of the default single GPU, in MiB (80 GiB).
pub const DEFAULT_DEVICE_MIB: u64 = 81920;
/// Default directory for state shared between processes.
pub const DEFAULT_STATE_DIR: &str = "/tmp/gpushare-sim";
/// Default simulated kernel duration in microseconds.
pub const DEFAULT_KERNEL_US: u64 = 500;

/// Everything the environment configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Memory size of each GPU in bytes; the length is the GPU count.
    pub devices: Vec<u64>,
    /// `GPUSHARE_SIM_STATE`.
    pub state_dir: PathBuf,
    /// `GPUSHARE_SIM_FAIL`: exported function names that must fail (`name` or `name=code`).
    pub fail: Vec<String>,
    /// `GPUSHARE_SIM_KERNEL_US`: simulated GPU time per launch.
    pub kernel_ns: u64,
    /// `GPUSHARE_SIM_CTX_MIB`: device memory a context itself occupies.
    pub ctx_bytes: u64,
    /// `GPUSHARE_SIM_PITCH_ALIGN`: row alignment of `cuMemAllocPitch` and CUDA arrays, bytes (a
    /// power of two; 512 by default).
    pub pitch_align: u64,
    /// `GPUSHARE_SIM_MEMORY_LIMITS`: whether the r615 cgroup memory-limit functions exist
    /// (`0` models an older driver: they answer `NVML_ERROR_FUNCTION_NOT_FOUND`).
    pub memory_limits: bool,
    /// `GPUSHARE_SIM_INIT_LOG`: a file each successful `nvmlInit*` appends a line to (the
    /// caller's pid and command line), so that a test sees which processes loaded NVML.
    pub init_log: Option<PathBuf>,
}

/// Prints a one-line TEST-ONLY warning on stderr.
pub(crate) fn warn(msg: &str) {
    use std::io::Write;
    let line = format!("gpushare-simdriver (TEST-ONLY): warning: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Parses `GPUSHARE_SIM_DEVICES` (comma list of MiB). Invalid: warning + default.
pub fn parse_devices(raw: Option<&str>) -> Vec<u64> {
    let default = vec![DEFAULT_DEVICE_MIB << 20];
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return default;
    };
    let parsed: Option<Vec<u64>> = raw
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<u64>()
                .ok()
                .filter(|&m| m > 0 && m < (1 << 30))
        })
        .map(|m| m.map(|m| m << 20))
        .collect();
    match parsed {
        Some(v) if v.len() <= MAX_DEVICES => v,
        _ => {
            warn(&format!(
                "GPUSHARE_SIM_DEVICES={raw:?} is not a comma list of at most {MAX_DEVICES} sizes in MiB; using one GPU of {DEFAULT_DEVICE_MIB} MiB"
            ));
            default
        }
    }
}

fn parse_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u64>() {
            Ok(n) => n,
            Err(_) => {
                warn(&format!("{name}={v:?} is not a number; using {default}"));
                default
            }
        },
        _ => default,
    }
}

/// Parses an on/off switch that defaults to on: `0`, `false`, `off` and `no` turn it off.
pub fn parse_switch(raw: Option<&str>) -> bool {
    !matches!(
        raw.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("0" | "false" | "off" | "no")
    )
}

impl Config {
    fn from_env() -> Config {
        let devices = parse_devices(std::env::var("GPUSHARE_SIM_DEVICES").ok().as_deref());
        let state_dir = match std::env::var_os("GPUSHARE_SIM_STATE") {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => PathBuf::from(DEFAULT_STATE_DIR),
        };
        let fail = std::env::var("GPUSHARE_SIM_FAIL")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        Config {
            devices,
            state_dir,
            fail,
            kernel_ns: parse_u64("GPUSHARE_SIM_KERNEL_US", DEFAULT_KERNEL_US).saturating_mul(1000),
            ctx_bytes: parse_u64("GPUSHARE_SIM_CTX_MIB", 0).saturating_mul(1 << 20),
            pitch_align: match parse_u64("GPUSHARE_SIM_PITCH_ALIGN", 512) {
                a if a.is_power_of_two() && a <= 1 << 20 => a,
                a => {
                    warn(&format!(
                        "GPUSHARE_SIM_PITCH_ALIGN={a} is not a power of two up to 1 MiB; using 512"
                    ));
                    512
                }
            },
            memory_limits: parse_switch(
                std::env::var("GPUSHARE_SIM_MEMORY_LIMITS").ok().as_deref(),
            ),
            init_log: std::env::var_os("GPUSHARE_SIM_INIT_LOG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }
}

/// The process-wide configuration, read from the environment on first use.
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::from_env)
}

/// Whether fault injection asks `name` to fail.
pub fn fails(name: &str) -> bool {
    fail_code(name).is_some()
}

/// The code fault injection asks `name` to fail with: `Some(None)` for the default (999,
/// `CUDA_ERROR_UNKNOWN`/`NVML_ERROR_UNKNOWN`), `Some(Some(code))` for an entry `name=code`.
pub fn fail_code(name: &str) -> Option<Option<u32>> {
    let fail = &config().fail;
    if fail.is_empty() {
        return None;
    }
    fail.iter().find_map(|f| match f.split_once('=') {
        Some((n, code)) if n.trim() == name => Some(code.trim().parse().ok()),
        None if f == name => Some(None),
        _ => None,
    })
}

/// Number of simulated GPUs.
pub fn device_count() -> usize {
    config().devices.len()
}

/// UUID of GPU `i`.
pub fn uuid(i: usize) -> String {
    format!("GPU-5a1e0000-0000-4000-8000-{i:012x}")
}

/// The 16 raw UUID bytes of GPU `i` (what `cuDeviceGetUuid` returns).
pub fn uuid_bytes(i: usize) -> [u8; 16] {
    let hex: String = uuid(i)[4..].chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; 16];
    for (k, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).unwrap_or(0);
    }
    out
}

/// PCI bus id of GPU `i`.
pub fn pci_bus_id(i: usize) -> String {
    format!("00000000:{:02x}:00.0", i + 1)
}

/// Marketing name of every simulated GPU.
pub const NAME: &str = "Simulated GPU (gpushare test driver)";
/// Driver version string.
pub const DRIVER_VERSION: &str = "535.999.99-sim";
/// NVML library version string.
pub const NVML_VERSION: &str = "12.535.999.99";
/// CUDA driver API version (12.2).
pub const CUDA_VERSION: i32 = 12020;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse() {
        let cases: &[(&str, Option<&str>, Vec<u64>)] = &[
            ("unset gives one 80 GiB GPU", None, vec![81920 << 20]),
            ("empty gives default", Some(""), vec![81920 << 20]),
            ("two GPUs", Some("1024, 2048"), vec![1 << 30, 2 << 30]),
            ("garbage gives default", Some("lots"), vec![81920 << 20]),
            ("zero is invalid", Some("0"), vec![81920 << 20]),
        ];
        for (what, raw, want) in cases {
            assert_eq!(&parse_devices(*raw), want, "{what}");
        }
    }

    #[test]
    fn switch_parse() {
        let cases: &[(Option<&str>, bool)] = &[
            (None, true),
            (Some(""), true),
            (Some("1"), true),
            (Some("0"), false),
            (Some(" off "), false),
            (Some("FALSE"), false),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_switch(*raw), *want, "{raw:?}");
        }
    }

    #[test]
    fn uuid_roundtrip() {
        assert_eq!(uuid(3), "GPU-5a1e0000-0000-4000-8000-000000000003");
        let b = uuid_bytes(3);
        assert_eq!(b[0], 0x5a);
        assert_eq!(b[15], 3);
        assert_eq!(pci_bus_id(0), "00000000:01:00.0");
    }
}
