//! What configuring an engine works with: the installation ([`Setup`]), how `configure` was
//! asked to run ([`Options`]), one planned file ([`Change`]) or undo ([`Edit`]), and the errors.

use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::config::Config;

/// Whether the program at `path` is gpushare's `name` (`gpushare-runtime`, `gpushare-hook`, or
/// a launcher named after it), whatever directory it was installed in.
pub fn is_ours(path: &str, name: &str) -> bool {
    Path::new(path)
        .file_name()
        .is_some_and(|f| f.to_string_lossy().starts_with(name))
}

/// Where `nvidia-container-runtime` goes relative to `gpushare-runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// engine → gpushare-runtime → nvidia-container-runtime → runc (edits the policy file).
    #[default]
    GpushareFirst,
    /// engine → nvidia-container-runtime → gpushare-runtime → runc (edits NVIDIA's config.toml).
    NvidiaFirst,
}

/// How `configure` was asked to run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Act on this file instead of the engine's usual one.
    pub path: Option<PathBuf>,
    /// Print the diff, write nothing.
    pub dry_run: bool,
    /// Put the hook files under this directory (`hooks.d`, `hooks.d-podman`) instead of the
    /// system hooks dirs.
    pub hooks_dir: Option<PathBuf>,
    /// nvidia-container-runtime chaining order.
    pub order: Order,
    /// containerd config version for a new file (2: containerd 1.x, 3: containerd 2.x);
    /// `None`: asks `containerd --version`.
    pub containerd_version: Option<i64>,
    /// Docker: make `gpushare` the daemon's `default-runtime`, so that a share request without
    /// `--runtime gpushare` is not silently ignored (containers that ask for nothing pass
    /// straight through gpushare-runtime to runc).
    pub default_runtime: bool,

    /// Undo what `configure` wrote instead.
    pub remove: bool,
    /// Write entries for a `gpushare-runtime` (or hook) that does not exist (yet).
    pub allow_missing: bool,
}

impl Options {
    /// The same options with `path` and `hooks_dir` made absolute (against the current
    /// directory), as the files are written and reported.
    pub fn absolute(&self) -> Options {
        let abs = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        };
        Options {
            path: abs(&self.path),
            hooks_dir: abs(&self.hooks_dir),
            ..self.clone()
        }
    }
}

/// This installation, as the policy file describes it.
#[derive(Debug, Clone)]
pub struct Setup {
    /// `[runtime] hook`.
    pub hook: PathBuf,
    /// `gpushare-runtime`, next to the hook.
    pub runtime: PathBuf,
    /// The policy file to hand on (`None`: the default path, which needs no handing on).
    pub policy: Option<PathBuf>,
    /// The policy file that was read, for people.
    pub source: String,
}

impl Setup {
    /// From the loaded policy and where it came from.
    pub fn new(cfg: &Config, policy: Option<PathBuf>, source: String) -> Self {
        Self {
            hook: cfg.runtime.hook.clone(),
            runtime: runtime_path(cfg),
            policy: policy.filter(|p| p != Path::new(crate::config::DEFAULT_PATH)),
            source,
        }
    }

    /// What the engine's runtime entry runs: the launcher for a non-default policy, else the
    /// runtime itself.
    pub fn runtime_entry(&self) -> PathBuf {
        match &self.policy {
            Some(p) => launcher_path(p),
            None => self.runtime.clone(),
        }
    }
}

/// `gpushare-runtime` of this installation: next to the configured hook.
pub fn runtime_path(cfg: &Config) -> PathBuf {
    cfg.runtime.hook.with_file_name("gpushare-runtime")
}

/// The launcher that runs `gpushare-runtime` with a non-default policy file:
/// `<policy dir>/gpushare-runtime-<policy stem>`.
pub fn launcher_path(policy: &Path) -> PathBuf {
    let stem = policy
        .file_stem()
        .map_or_else(|| "config".into(), |s| s.to_string_lossy().into_owned());
    policy.with_file_name(format!("gpushare-runtime-{stem}"))
}

/// An engine's file that cannot be merged into.
#[derive(Debug, Error)]
pub enum ConfigureError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON; fix it first (it was left untouched)")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} is not valid TOML; fix it first (it was left untouched)")]
    Toml {
        path: PathBuf,
        #[source]
        source: toml_edit::TomlError,
    },
    #[error("{path}: {key} is not a {want}; fix it first (it was left untouched)")]
    Shape {
        path: PathBuf,
        key: String,
        want: &'static str,
    },
    #[error("{path} is a containerd version 1 config (`version = 1`, or no `version` key); rewrite it as version 2, the layout `containerd config default` prints, first (it was left untouched)")]
    ContainerdV1 { path: PathBuf },
    #[error("{path} has `version = {version}`, a containerd config version gpushare does not know (it writes 2 for containerd 1.x and 3 for 2.x); it was left untouched")]
    ContainerdVersion { path: PathBuf, version: i64 },

    #[error("{path} does not exist, and the engine's entry would run it; install gpushare there, fix [runtime] hook in the policy, or pass --allow-missing to write it anyway")]
    Missing { path: PathBuf },
    #[error("cannot write {path} (files before it in this run were written)")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One file as it is and as the engine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    /// The file now (`None`: it does not exist).
    pub before: Option<String>,
    pub after: String,
    /// Mode of a new file.
    pub mode: u32,
}

impl Change {
    /// Whether writing it would change anything.
    pub fn changes(&self) -> bool {
        self.before.as_deref() != Some(self.after.as_str())
    }
}

/// One file to rewrite or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Rewritten without gpushare's part.
    Write(Change),
    /// gpushare's own file: deleted (its content kept in the backup).
    Delete { path: PathBuf, before: String },
    /// Left as it is, and why (a shared hook file still in use).
    Keep { path: PathBuf, why: String },
}

impl Edit {
    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            Edit::Write(c) => &c.path,
            Edit::Delete { path, .. } | Edit::Keep { path, .. } => path,
        }
    }

    /// Whether carrying it out changes anything.
    pub fn changes(&self) -> bool {
        match self {
            Edit::Write(c) => c.changes(),
            Edit::Delete { .. } => true,
            Edit::Keep { .. } => false,
        }
    }
}
