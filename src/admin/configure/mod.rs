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

mod replaced;
mod write;

use std::path::PathBuf;

use serde::Serialize;

pub use crate::admin::engines::{
    is_ours, launcher_path, runtime_path, Change, ConfigureError, Edit, Engine, Options, Order,
    Setup,
};
pub use write::{apply, apply_edit, backup_path, diff, Outcome};

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_node_wide_cdi_spec_follows_only_the_nodes_own_configuration() {
        let etc = Path::new("/etc/cdi");
        let run = Path::new("/var/run/cdi");
        let mine = Path::new("/tmp/x/cdi");
        let nodes = [run, etc];
        let both = |_: &Path| true;
        let only_etc = |d: &Path| d == etc;
        // (what, node_own, explicit, spec present, expected)
        type Row<'a> = (
            &'a str,
            bool,
            Option<&'a Path>,
            &'a dyn Fn(&Path) -> bool,
            Vec<CdiAction>,
        );
        let rows: Vec<Row> = vec![
            (
                "node's own run: present specs follow",
                true,
                None,
                &only_etc,
                vec![CdiAction::Write(etc.into())],
            ),
            (
                "--path or --config: previews only",
                false,
                None,
                &both,
                vec![
                    CdiAction::Preview(run.into()),
                    CdiAction::Preview(etc.into()),
                ],
            ),
            (
                "--path with an explicit dir: that dir written, the node's previewed",
                false,
                Some(mine),
                &only_etc,
                vec![
                    CdiAction::Write(mine.into()),
                    CdiAction::Preview(etc.into()),
                ],
            ),
            (
                "explicit node dir: written once",
                false,
                Some(etc),
                &both,
                vec![CdiAction::Write(etc.into()), CdiAction::Preview(run.into())],
            ),
            (
                "no spec anywhere: nothing",
                true,
                None,
                &|_: &Path| false,
                vec![],
            ),
        ];
        for (what, own, explicit, has, want) in rows {
            assert_eq!(cdi_actions(own, explicit, &nodes, has), want, "{what}");
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
    let merged = engine.def().merged();
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

/// The files `engine` needs, merged with what they hold now. Reads only.
///
/// # Errors
/// [`ConfigureError`] for a file that cannot be read or parsed.
pub fn plan(engine: Engine, setup: &Setup, opts: &Options) -> Result<Vec<Change>, ConfigureError> {
    crate::admin::engines::plan(engine, setup, opts)
}

/// What a `configure` run does with gpushare's CDI spec in one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CdiAction {
    /// Brought up to date with this run's policy.
    Write(PathBuf),
    /// Left alone; the report says what this run's policy would write there.
    Preview(PathBuf),
}

/// The CDI spec directories a `configure` run acts on (pure). The node-wide specs (in
/// `node_dirs`, those `has_spec` finds) follow the policy only when the run configures the
/// node's own engine files with the node's own policy (`node_own`); any other run (`--path`,
/// `--hooks-dir`, `--config`, `--policy-at`) only says what it would write there. A directory
/// given explicitly (`explicit`) is written in every case.
pub fn cdi_actions(
    node_own: bool,
    explicit: Option<&std::path::Path>,
    node_dirs: &[&std::path::Path],
    has_spec: impl Fn(&std::path::Path) -> bool,
) -> Vec<CdiAction> {
    let mut out = Vec::new();
    if let Some(d) = explicit {
        out.push(CdiAction::Write(d.to_owned()));
    }
    for d in node_dirs {
        if explicit == Some(*d) || !has_spec(d) {
            continue;
        }
        out.push(if node_own {
            CdiAction::Write(d.to_path_buf())
        } else {
            CdiAction::Preview(d.to_path_buf())
        });
    }
    out
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
        self.files.iter().any(|f| {
            !matches!(
                f.outcome,
                Outcome::Unchanged | Outcome::Kept { .. } | Outcome::LeftAlone { .. }
            )
        })
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
    let runs_runtime = engine.def().runs_runtime(opts.order);
    let runs_hook = engine.def().runs_hook();
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
    let edits = crate::admin::engines::remove(engine, setup, opts)?;
    let mut files = Vec::new();
    for e in &edits {
        let outcome = if opts.dry_run {
            match (write::edit_diff(e), e) {
                (Some(diff), _) => Outcome::WouldChange { diff },
                (None, Edit::Keep { why, .. }) => Outcome::Kept { why: why.clone() },
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
    engine.def().restart(order)
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
                Outcome::Removed { earlier_backups: 0 } => {
                    out.push_str(&format!("removed {}\n", f.path));
                }
                Outcome::Removed { earlier_backups } => {
                    out.push_str(&format!(
                        "removed {} (and the {earlier_backups} backups configure had kept of it)\n",
                        f.path
                    ));
                }
                Outcome::Kept { why } => out.push_str(&format!("kept {} ({why})\n", f.path)),
                Outcome::Regenerated => out.push_str(&format!("regenerated {}\n", f.path)),
                Outcome::LeftAlone { why, diff } => {
                    out.push_str(&format!("left alone {} ({why})", f.path));
                    match diff {
                        Some(d) => out.push_str(&format!("; this policy would write:\n{d}")),
                        None => out.push_str("; this policy would write it as it is\n"),
                    }
                }
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
