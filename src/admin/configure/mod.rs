//! `gpushare-hook configure <engine> [--path FILE] [--dry-run]`: merges the configuration that
//! wires gpushare into an engine into the engine's own files, as `nvidia-ctk runtime configure`
//! does: other keys, comments and order are kept (`toml_edit`, `serde_json` with
//! `preserve_order`); an unparsable file is refused and left untouched; every write is atomic
//! (temp file, fsync, rename) after a backup of the previous file; a second run changes nothing
//! and says so; `--dry-run` prints a unified diff instead of writing.
//!
//! A policy file at another path than the default is handed on to the runtime entries through a
//! small launcher next to the policy file (engines' runtime entries carry no env), and to hook
//! files as `GPUSHARE_CONFIG` in their env.

mod engines;
pub mod remove;
mod replaced;
mod write;

use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::config::Config;

pub use write::{apply, apply_edit, backup_path, diff, Outcome};

/// Whether the program at `path` is gpushare's `name` (`gpushare-runtime`, `gpushare-hook`, or
/// a launcher named after it), whatever directory it was installed in.
pub fn is_ours(path: &str, name: &str) -> bool {
    Path::new(path)
        .file_name()
        .is_some_and(|f| f.to_string_lossy().starts_with(name))
}

/// Engines gpushare knows how to configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    Podman,
    Crio,
    Containerd,
    Docker,
    NvidiaContainerRuntime,
}

impl Engine {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Podman => "podman",
            Engine::Crio => "crio",
            Engine::Containerd => "containerd",
            Engine::Docker => "docker",
            Engine::NvidiaContainerRuntime => "nvidia-container-runtime",
        }
    }
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

/// The files `engine` needs as text, each introduced by a `# ---- PATH` line (`PATH (merge)`:
/// only gpushare's part, to be merged into the engine's main file), for installers that put
/// them in place themselves. Reads only.
///
/// # Errors
/// [`ConfigureError`] as [`plan`].
pub fn print(engine: Engine, setup: &Setup, opts: &Options) -> Result<String, ConfigureError> {
    let opts = &opts.absolute();
    let changes = plan(engine, setup, opts)?;
    let scratch = Options {
        path: Some(PathBuf::from("/nonexistent/gpushare-configure/file")),
        ..opts.clone()
    };
    let fresh = plan(engine, setup, &scratch)?;
    let merged = matches!(
        engine,
        Engine::Docker | Engine::Containerd | Engine::NvidiaContainerRuntime
    );
    let mut out = String::new();
    for (i, c) in changes.iter().enumerate() {
        let (body, mark) = if i == 0 && merged {
            (fresh[0].after.as_str(), " (merge)")
        } else {
            (c.after.as_str(), "")
        };
        out.push_str(&format!(
            "# ---- {}{mark}\n{}\n",
            c.path.display(),
            body.trim_end()
        ));
    }
    Ok(out)
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

/// The files `engine` needs, merged with what they hold now. Reads only.
///
/// # Errors
/// [`ConfigureError`] for a file that cannot be read or parsed.
pub fn plan(engine: Engine, setup: &Setup, opts: &Options) -> Result<Vec<Change>, ConfigureError> {
    engines::plan(engine, setup, opts)
}

/// What happened to one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    pub path: String,
    pub outcome: Outcome,
}

/// The whole `configure` answer.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigureReport {
    pub engine: Engine,
    /// The policy file that was read.
    pub config: String,
    /// The `gpushare-runtime` the entries run.
    pub runtime: String,
    /// The launcher the entries run instead, for a non-default policy file.
    pub launcher: Option<String>,
    pub dry_run: bool,
    pub files: Vec<FileReport>,
    /// What to restart, and how.
    pub restart: String,
    /// gpushare entries that held another value: (file, key, old value).
    pub replaced: Vec<(String, String, String)>,
    /// `--remove`: what was taken out.
    pub remove: bool,
}

impl ConfigureReport {
    /// Whether any file changed (or would, with `--dry-run`).
    pub fn changed(&self) -> bool {
        self.files
            .iter()
            .any(|f| !matches!(f.outcome, Outcome::Unchanged | Outcome::Kept { .. }))
    }

    /// The files written or removed (not those unchanged, kept or only diffed).
    pub fn written(&self) -> Vec<&str> {
        self.files
            .iter()
            .filter(|f| {
                matches!(
                    f.outcome,
                    Outcome::Created
                        | Outcome::Written { .. }
                        | Outcome::Removed { .. }
                        | Outcome::Regenerated
                )
            })
            .map(|f| f.path.as_str())
            .collect()
    }
}

/// Plans and, unless `dry_run`, writes.
///
/// # Errors
/// [`ConfigureError`]; nothing is written when planning fails.
pub fn run(
    engine: Engine,
    setup: &Setup,
    opts: &Options,
) -> Result<ConfigureReport, ConfigureError> {
    let opts = &opts.absolute();
    if opts.remove {
        return run_remove(engine, setup, opts);
    }
    if !opts.allow_missing {
        check_installed(engine, setup, opts)?;
    }
    let changes = plan(engine, setup, opts)?;
    let replaced = changes.iter().flat_map(replaced::replaced).collect();
    let files = if opts.dry_run {
        changes
            .iter()
            .map(|c| FileReport {
                path: c.path.display().to_string(),
                outcome: if c.changes() {
                    Outcome::WouldChange { diff: diff(c) }
                } else {
                    Outcome::Unchanged
                },
            })
            .collect()
    } else {
        let mut out = Vec::new();
        for c in &changes {
            out.push(FileReport {
                path: c.path.display().to_string(),
                outcome: apply(c)?,
            });
        }
        out
    };
    Ok(ConfigureReport {
        engine,
        config: setup.source.clone(),
        runtime: setup.runtime.display().to_string(),
        launcher: setup
            .policy
            .as_ref()
            .map(|p| launcher_path(p).display().to_string()),
        dry_run: opts.dry_run,
        files,
        restart: restart_hint(engine, opts.order).to_owned(),
        replaced,
        remove: false,
    })
}

/// The binaries the engine's entries will run must exist: `gpushare-runtime` for the engines
/// that run it, `[runtime] hook` for those that run hooks.
fn check_installed(engine: Engine, setup: &Setup, opts: &Options) -> Result<(), ConfigureError> {
    let runs_runtime = match engine {
        Engine::NvidiaContainerRuntime => opts.order == Order::NvidiaFirst,
        _ => true,
    };
    let runs_hook = matches!(engine, Engine::Podman | Engine::Crio);
    for (needed, p) in [(runs_runtime, &setup.runtime), (runs_hook, &setup.hook)] {
        if needed && !p.is_file() {
            return Err(ConfigureError::Missing { path: p.clone() });
        }
    }
    Ok(())
}

/// `--remove`: plans the undo and, unless `dry_run`, carries it out.
fn run_remove(
    engine: Engine,
    setup: &Setup,
    opts: &Options,
) -> Result<ConfigureReport, ConfigureError> {
    let edits = remove::plan(engine, setup, opts)?;
    let mut files = Vec::new();
    for e in &edits {
        let outcome = if opts.dry_run {
            match (write::edit_diff(e), e) {
                (Some(diff), _) => Outcome::WouldChange { diff },
                (None, remove::Edit::Keep { why, .. }) => Outcome::Kept { why: why.clone() },
                (None, _) => Outcome::Unchanged,
            }
        } else {
            apply_edit(e)?
        };
        files.push(FileReport {
            path: e.path().display().to_string(),
            outcome,
        });
    }
    Ok(ConfigureReport {
        engine,
        config: setup.source.clone(),
        runtime: setup.runtime.display().to_string(),
        launcher: None,
        dry_run: opts.dry_run,
        files,
        restart: restart_hint(engine, opts.order).to_owned(),
        replaced: Vec::new(),
        remove: true,
    })
}

/// What to restart after `engine`'s files changed.
pub fn restart_hint(engine: Engine, order: Order) -> &'static str {
    match (engine, order) {
        (Engine::Docker, _) => "restart Docker to load it: systemctl restart docker (running containers keep running with live-restore, else they stop)",
        (Engine::Containerd, _) => "restart containerd to load it: systemctl restart containerd (running containers keep running)",
        (Engine::Crio, _) => "restart CRI-O to load it: systemctl restart crio",
        (Engine::Podman, _) => "nothing to restart: podman reads containers.conf and the hooks dirs at every run",
        (Engine::NvidiaContainerRuntime, Order::GpushareFirst) => "nothing to restart: gpushare-runtime reads the policy at every call; register gpushare-runtime with the engine (gpushare-hook configure docker|containerd|crio)",
        (Engine::NvidiaContainerRuntime, Order::NvidiaFirst) => "nothing to restart: nvidia-container-runtime reads its config.toml at every call",
    }
}

impl super::report::Report for ConfigureReport {
    fn human(&self) -> String {
        let mut out = format!(
            "engine {}\nconfig {}\nruntime {}\n",
            self.engine.name(),
            self.config,
            self.runtime
        );
        if let Some(l) = &self.launcher {
            out.push_str(&format!(
                "launcher {l} (runs the runtime with GPUSHARE_CONFIG set; the engine's entry runs it)\n"
            ));
        }
        for f in &self.files {
            match &f.outcome {
                Outcome::Unchanged => out.push_str(&format!("unchanged {}\n", f.path)),
                Outcome::Created => out.push_str(&format!("created {}\n", f.path)),
                Outcome::Written { backup } => {
                    out.push_str(&format!("written {} (backup {backup})\n", f.path));
                }
                Outcome::WouldChange { diff } => out.push_str(diff),
                Outcome::Removed { backup } => {
                    out.push_str(&format!("removed {} (backup {backup})\n", f.path));
                }
                Outcome::Kept { why } => out.push_str(&format!("kept {} ({why})\n", f.path)),
                Outcome::Regenerated => out.push_str(&format!("regenerated {}\n", f.path)),
            }
        }
        for (file, key, old) in &self.replaced {
            let verb = if self.dry_run {
                "would replace"
            } else {
                "replaced"
            };
            out.push_str(&format!("{verb} {key} in {file}; it was: {old}\n"));
        }
        if self.remove && !self.changed() {
            out.push_str(&format!(
                "nothing to remove: {} has no gpushare entries\n",
                self.engine.name()
            ));
        } else if !self.changed() {
            out.push_str(&format!(
                "nothing to change: {} is already configured\n",
                self.engine.name()
            ));
        } else if self.dry_run {
            out.push_str("dry run: nothing was written\n");
        } else {
            out.push_str(&format!("{}\n", self.restart));
        }
        out
    }
}
