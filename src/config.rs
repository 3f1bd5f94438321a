//! The admin policy file (`/etc/gpushare/config.toml`): paths, allowed modes, defaults, maxima.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::vocab::domain::is_group_name;
use crate::vocab::quantity::{self, QuantityError};
use crate::vocab::{Isolation, Limits, Mode};

/// Default location of the policy file.
pub const DEFAULT_PATH: &str = "/etc/gpushare/config.toml";
/// Environment variable that overrides the policy file location.
pub const ENV_PATH: &str = "GPUSHARE_CONFIG";
/// Largest policy file read.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

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

impl Config {
    /// Parses and validates a policy file's text. `path` is only used in messages.
    ///
    /// # Errors
    /// [`ConfigError`] for bad TOML, unknown keys or out-of-range values.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| parse_error(path, text, &e))?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Loads the policy from where [`Source::resolve`] says. A missing default file means all
    /// defaults; a missing explicit file is an error.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or is invalid.
    pub fn load(explicit: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(&Source::resolve(explicit))
    }

    /// Loads the policy from `source`.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or is invalid.
    pub fn load_from(source: &Source) -> Result<Self, ConfigError> {
        let path = source.path();
        let text = match read_capped(path) {
            Ok(t) => t,
            Err(ConfigError::Read { source: e, .. })
                if !source.required() && e.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(Self::default())
            }
            Err(e) => return Err(e),
        };
        Self::parse(&text, path)
    }

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

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |what: &str| ConfigError::Invalid {
            path: path.to_owned(),
            what: what.to_owned(),
        };
        if let Some(m) = &self.policy.max_memory {
            quantity::parse_memory(m).map_err(|source| ConfigError::MaxMemory {
                path: path.to_owned(),
                source,
            })?;
        }
        if !(1..=100).contains(&self.policy.max_cores) {
            return Err(invalid("[policy] max_cores must be 1 to 100"));
        }
        if !(1..=100).contains(&self.policy.default_cores) {
            return Err(invalid("[policy] default_cores must be 1 to 100"));
        }
        if self.policy.default_cores > self.policy.max_cores {
            return Err(invalid("[policy] default_cores is above max_cores"));
        }
        let oc = self.policy.memory_overcommit;
        if !(oc.is_finite() && (0.1..=100.0).contains(&oc)) {
            return Err(invalid(&format!(
                "[policy] memory_overcommit {oc} must be a number from 0.1 to 100 (1.0: caps add up to at most the GPU's memory)"
            )));
        }
        if self.lock_timeout_seconds == 0 || self.lock_timeout_seconds > 3600 {
            return Err(invalid("lock_timeout_seconds must be 1 to 3600"));
        }
        if !self.state_dir.is_absolute() {
            return Err(invalid("state_dir must be an absolute path"));
        }
        if !quantity::parse_memory(&self.mps.shm_size).is_ok_and(|b| b >= 1 << 20) {
            return Err(invalid(&format!(
                "[mps] shm_size {:?} is not a size of at least 1Mi like 64Mi",
                self.mps.shm_size
            )));
        }
        for (name, g) in &self.mps.groups {
            if !is_group_name(name) {
                return Err(invalid(&format!(
                    "[mps.groups.{name}]: a group name is [a-z0-9][a-z0-9._-]{{0,62}}"
                )));
            }
            if let Some(c) = g.cores {
                if !(1..=100).contains(&c) {
                    return Err(invalid(&format!(
                        "[mps.groups.{name}] cores must be 1 to 100"
                    )));
                }
            }
            if let Some(m) = &g.memory {
                quantity::parse_memory(m).map_err(|_| {
                    invalid(&format!(
                        "[mps.groups.{name}] memory {m:?} is not a size like 4Gi or 512Mi"
                    ))
                })?;
            }
        }
        for (group, namespaces) in &self.mps.group_namespaces {
            if !is_group_name(group)
                || namespaces.is_empty()
                || !namespaces
                    .iter()
                    .all(|n| crate::vocab::names::is_namespace(n))
            {
                return Err(invalid(&format!(
                    "[mps] group_namespaces: {group:?} must be a group name bound to a list of Kubernetes namespaces, like team-a = [\"team-a\"]"
                )));
            }
        }
        for (name, p) in &self.profiles {
            validate_profile(name, p).map_err(|what| invalid(&what))?;
        }
        if self.serve.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "[serve] listen must be an address and port, like 127.0.0.1:9401 or [::1]:9401",
            ));
        }
        if !(1..=86400).contains(&self.serve.gc_interval_seconds) {
            return Err(invalid("[serve] gc_interval_seconds must be 1 to 86400"));
        }
        if self
            .serve
            .events_file
            .as_deref()
            .is_some_and(|p| !p.is_absolute())
        {
            return Err(invalid("[serve] events_file must be an absolute path"));
        }
        if self.runtime.next.is_empty() {
            return Err(invalid("[runtime] next must name at least one runtime"));
        }
        Ok(())
    }
}

/// The syntax of one `[profiles.<name>]`; whether the policy allows what it asks is checked
/// like any request (`decide::profile`).
fn validate_profile(name: &str, p: &ProfileConfig) -> Result<(), String> {
    if !is_group_name(name) {
        return Err(format!(
            "[profiles.{name}]: a profile name is [a-z0-9][a-z0-9._-]{{0,62}}"
        ));
    }
    if BUILTIN_PROFILES.contains(&name) {
        return Err(format!(
            "[profiles.{name}]: {name} is a mode and already a device of its own; name the profile otherwise"
        ));
    }
    if let Some(c) = p.cores {
        if !(1..=100).contains(&c) {
            return Err(format!("[profiles.{name}] cores must be 1 to 100"));
        }
    }
    if let Some(m) = &p.memory {
        if quantity::parse_memory(m).is_err() {
            return Err(format!(
                "[profiles.{name}] memory {m:?} is not a size like 4Gi or 512Mi"
            ));
        }
    }
    if let Some(g) = &p.group {
        if !is_group_name(g) {
            return Err(format!(
                "[profiles.{name}] group {g:?} is not [a-z0-9][a-z0-9._-]{{0,62}}"
            ));
        }
    }
    if let Some(t) = &p.timeslice {
        if !matches!(t.as_str(), "default" | "short" | "medium" | "long") {
            return Err(format!(
                "[profiles.{name}] timeslice {t:?} is not default, short, medium or long"
            ));
        }
    }
    Ok(())
}

/// What can be kept of a policy file that does not load: every key (and every key of every
/// table) that is valid on its own and with the keys kept before it; the defaults for the
/// rest. For the commands that must still run on a broken policy (`status`, `gc`, `poststop`,
/// `doctor`): they read the state where the file says it is.
pub fn salvage(source: &Source) -> Config {
    let Ok(text) = read_capped(source.path()) else {
        return Config::default();
    };
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Config::default();
    };
    let fits = |t: &toml::Table| {
        toml::Value::Table(t.clone())
            .try_into::<Config>()
            .is_ok_and(|c| c.validate(source.path()).is_ok())
    };
    let mut kept = toml::Table::new();
    for (k, v) in doc {
        let mut whole = kept.clone();
        whole.insert(k.clone(), v.clone());
        if fits(&whole) {
            kept = whole;
            continue;
        }
        let toml::Value::Table(inner) = v else {
            continue;
        };
        kept.insert(k.clone(), toml::Value::Table(toml::Table::new()));
        if !fits(&kept) {
            kept.remove(&k);
            continue;
        }
        for (ik, iv) in inner {
            let mut one = kept.clone();
            if let Some(toml::Value::Table(t)) = one.get_mut(&k) {
                t.insert(ik, iv);
            }
            if fits(&one) {
                kept = one;
            }
        }
    }
    toml::Value::Table(kept).try_into().unwrap_or_default()
}

/// The parse error with its position as line and column (1-based) and the parser's diagnostic.
fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, column) = e.span().map_or((1, 1), |s| {
        let before = &text[..s.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    });
    ConfigError::Parse {
        path: path.to_owned(),
        line,
        column,
        message: e.message().trim().to_owned(),
        diagnostic: e.to_string().trim_end().to_owned(),
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

fn read_capped(path: &Path) -> Result<String, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read_err)?;
    let bytes = crate::vocab::read_capped(f, MAX_CONFIG_BYTES)
        .map_err(read_err)?
        .ok_or_else(|| ConfigError::TooLarge {
            path: path.to_owned(),
        })?;
    String::from_utf8(bytes)
        .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Where the policy file comes from: the one place that resolves `--config`,
/// `$GPUSHARE_CONFIG` and the default path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--config PATH`.
    Flag(PathBuf),
    /// `$GPUSHARE_CONFIG`.
    Env(PathBuf),
    /// The default path; a missing file there means all defaults.
    Default,
}

impl Source {
    /// `explicit`, else `$GPUSHARE_CONFIG` (when set and not empty), else the default.
    pub fn resolve(explicit: Option<&Path>) -> Self {
        Self::pick(explicit, std::env::var_os(ENV_PATH).as_deref())
    }

    /// [`Source::resolve`] with the environment passed in (pure).
    pub fn pick(explicit: Option<&Path>, env: Option<&std::ffi::OsStr>) -> Self {
        match (explicit, env.filter(|v| !v.is_empty())) {
            (Some(p), _) => Source::Flag(p.to_owned()),
            (None, Some(v)) => Source::Env(PathBuf::from(v)),
            (None, None) => Source::Default,
        }
    }

    /// The file to read.
    pub fn path(&self) -> &Path {
        match self {
            Source::Flag(p) | Source::Env(p) => p,
            Source::Default => Path::new(DEFAULT_PATH),
        }
    }

    /// Whether a missing file is an error (it is, unless it is the default).
    pub fn required(&self) -> bool {
        !matches!(self, Source::Default)
    }

    /// The path to hand on to hook entries and wrappers as `GPUSHARE_CONFIG`: absolute, and
    /// `None` for the default (which needs no handing on).
    pub fn to_hand_on(&self) -> Option<PathBuf> {
        match self {
            Source::Flag(p) | Source::Env(p) => Some(std::path::absolute(p).unwrap_or(p.clone())),
            Source::Default => None,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(p) => write!(f, "{} (--config)", p.display()),
            Source::Env(p) => write!(f, "{} (${ENV_PATH})", p.display()),
            Source::Default if Path::new(DEFAULT_PATH).exists() => {
                write!(f, "{DEFAULT_PATH} (default)")
            }
            Source::Default => write!(f, "defaults (no policy file at {DEFAULT_PATH})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_example_parses() {
        let text = r#"
state_dir = "/run/gpushare"
log_file = "/var/log/gpushare.log"
lock_timeout_seconds = 30
[nvml]
library = "libnvidia-ml.so.1"
[mps]
control = "nvidia-cuda-mps-control"
exclusive_compute_mode = true
multiuser = false
[limit]
library = "/usr/lib/gpushare/libgpushare_limiter.so"
[policy]
modes = ["mps", "timeslice", "limit"]
env_fallback = true
max_memory = "80Gi"
max_cores = 100
default_cores = 100
[runtime]
next = ["runc", "crun"]
hook = "/usr/bin/gpushare-hook"
"#;
        let cfg = Config::parse(text, Path::new("t.toml")).unwrap();
        assert_eq!(cfg.max_memory_bytes(), Some(80 << 30));
        assert_eq!(cfg.policy.modes.len(), 3);
    }

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

    #[test]
    fn bad_configs_are_refused() {
        let rows = [
            ("unknown key", "bogus = 1"),
            ("bad max memory", "[policy]\nmax_memory = \"12XB\""),
            ("cores above 100", "[policy]\nmax_cores = 101"),
            (
                "default above max",
                "[policy]\nmax_cores = 50\ndefault_cores = 60",
            ),
            ("relative state dir", "state_dir = \"run\""),
            ("unknown mode", "[policy]\nmodes = [\"turbo\"]"),
            ("zero lock timeout", "lock_timeout_seconds = 0"),
        ];
        for (what, text) in rows {
            assert!(Config::parse(text, Path::new("t")).is_err(), "{what}");
        }
    }

    #[test]
    fn bad_profiles_are_refused_naming_the_key() {
        let rows = [
            (
                "no mode",
                "[profiles.small]\ncores = 25",
                "missing field `mode`",
            ),
            (
                "cores out of range",
                "[profiles.small]\nmode = \"mps\"\ncores = 0",
                "[profiles.small] cores",
            ),
            (
                "bad memory",
                "[profiles.small]\nmode = \"mps\"\nmemory = \"lots\"",
                "[profiles.small] memory",
            ),
            (
                "bad group",
                "[profiles.small]\nmode = \"mps\"\ngroup = \"A B\"",
                "[profiles.small] group",
            ),
            (
                "bad timeslice",
                "[profiles.t]\nmode = \"timeslice\"\ntimeslice = \"forever\"",
                "[profiles.t] timeslice",
            ),
            (
                "name of a mode",
                "[profiles.mps]\nmode = \"mps\"",
                "[profiles.mps]: mps is a mode",
            ),
            (
                "bad name",
                "[profiles.Big]\nmode = \"mps\"",
                "[profiles.Big]: a profile name",
            ),
            (
                "unknown key",
                "[profiles.small]\nmode = \"mps\"\nsize = 1",
                "unknown field `size`",
            ),
        ];
        for (what, text, expect) in rows {
            let e = Config::parse(text, Path::new("t")).expect_err(what);
            assert!(e.to_string().contains(expect), "{what}: {e}");
        }
        // Positive control: a well-formed profile is read as written.
        let cfg = Config::parse(
            "[profiles.small]\nmode = \"mps\"\ncores = 25\nmemory = \"10Gi\"",
            Path::new("t"),
        )
        .unwrap();
        let p = &cfg.profiles["small"];
        assert_eq!(
            (p.mode, p.cores, p.memory.as_deref()),
            (Mode::Mps, Some(25), Some("10Gi"))
        );
    }

    #[test]
    fn parse_errors_say_where_and_keep_the_diagnostic() {
        let e = Config::parse(
            "state_dir = \"/run/x\"\n[polcy]\nmodes = []\n",
            Path::new("c.toml"),
        )
        .unwrap_err();
        let line = e.to_string();
        assert!(
            line.starts_with("config c.toml is not valid TOML for gpushare: line 2, column "),
            "{line}"
        );
        assert!(line.contains("unknown field `polcy`"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        let d = e.diagnostic().unwrap();
        assert!(
            d.lines().count() >= 3 && d.contains("[polcy]") && d.contains('^'),
            "{d}"
        );
    }

    #[test]
    fn salvage_keeps_every_key_that_is_valid_on_its_own() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("c.toml");
        std::fs::write(
            &f,
            "state_dir = \"/run/x\"\nbogus = 1\n[policy]\ndefault_cores = 40\nmodes = [\"turbo\"]\n[polcy]\n[nvml]\nlibrary = \"/l.so\"\n",
        )
        .unwrap();
        let src = Source::Flag(f.clone());
        assert!(
            Config::load_from(&src).is_err(),
            "positive control: it does not load"
        );
        let c = salvage(&src);
        assert_eq!(c.state_dir, Path::new("/run/x"));
        assert_eq!(c.nvml.library, "/l.so");
        assert_eq!(c.policy.default_cores, 40);
        assert_eq!(c.policy.modes, PolicyConfig::default().modes);
        std::fs::write(&f, "state_dir = [").unwrap();
        assert_eq!(
            salvage(&src),
            Config::default(),
            "not TOML at all: the defaults"
        );
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(
            Config::parse("", Path::new("t")).unwrap(),
            Config::default()
        );
    }
}
