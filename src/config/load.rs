//! Finding, reading and parsing the policy file: where it comes from ([`Source`]), capped
//! reading, parse errors with their position, and [`salvage`] of a file that does not load.

use std::path::{Path, PathBuf};

use super::{Config, ConfigError};

/// Default location of the policy file.
pub const DEFAULT_PATH: &str = "/etc/gpushare/config.toml";
/// Environment variable that overrides the policy file location.
pub const ENV_PATH: &str = "GPUSHARE_CONFIG";
/// Largest policy file read.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

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
    use crate::config::PolicyConfig;

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
}
