//! Each engine gpushare wires into, in one file of its own: what `configure` merges into the
//! engine's files, what `configure --remove` takes out again, and what `doctor` checks, in the
//! files and in the running engine. The engines share [`edit`] (merging into TOML and JSON),
//! [`hooks`] (the OCI hook files), [`launcher`] and [`check`] (doctor's verdicts).
//!
//! Adding an engine: a file with a type implementing [`EngineDef`], and its line in
//! [`ENGINES`].

pub mod check;
mod containerd;
mod crio;
pub mod crio_api;
mod docker;
pub mod edit;
pub mod hooks;
pub mod launcher;
mod nvidia;
mod podman;
pub mod record;
pub mod setup;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use check::{Check, Verdict};
pub use setup::{
    is_ours, launcher_path, runtime_path, Change, ConfigureError, Edit, Options, Order, Setup,
};

/// Every engine, in the order the command line lists them and doctor checks them.
pub static ENGINES: &[Engine] = &[
    Engine(&podman::Podman),
    Engine(&crio::Crio),
    Engine(&containerd::Containerd),
    Engine(&docker::Docker),
    Engine(&nvidia::NvidiaContainerRuntime),
];

/// What gpushare knows of one engine.
pub trait EngineDef: Sync {
    /// The name on the command line.
    fn name(&self) -> &'static str;

    /// The engine's files whose entries `configure` writes, its main file first (an entry in
    /// any of them may run a launcher).
    fn files(&self) -> &'static [&'static str];

    /// The main file `configure` edits: `--path`, else the engine's own.
    fn main_file(&self, _setup: &Setup, opts: &Options) -> PathBuf {
        opts.path
            .clone()
            .unwrap_or_else(|| PathBuf::from(self.files()[0]))
    }

    /// The files the engine needs, merged with what `main` and the others hold now. Reads
    /// only.
    ///
    /// # Errors
    /// [`ConfigureError`] for a file that cannot be read or parsed.
    fn plan(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Change>, ConfigureError>;

    /// The edits that undo [`EngineDef::plan`] with the same options. Reads only.
    ///
    /// # Errors
    /// [`ConfigureError`] for a file that cannot be read or parsed.
    fn remove(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Edit>, ConfigureError>;

    /// Whether the engine's entries run `gpushare-runtime` (and so need the launcher for a
    /// non-default policy).
    fn runs_runtime(&self, _order: Order) -> bool {
        true
    }

    /// Whether the engine runs `[runtime] hook` from hook files.
    fn runs_hook(&self) -> bool {
        false
    }

    /// Whether the main file is the engine's own main file, into which only gpushare's part is
    /// merged (so `--print` shows that part alone), rather than a drop-in of gpushare's.
    fn merged(&self) -> bool {
        true
    }

    /// What to restart (or reload) after the engine's files changed.
    fn restart(&self, order: Order) -> &'static str;

    /// doctor's checks of the engine: its files, then the running engine.
    fn doctor(&self) -> Vec<Check> {
        Vec::new()
    }

    /// doctor's check of one file of the engine's that `configure` wrote elsewhere (`--path`);
    /// `None` for an engine whose files doctor does not read.
    fn check_file(&self, _path: &Path) -> Option<Check> {
        None
    }
}

/// One engine of [`ENGINES`].
#[derive(Clone, Copy)]
pub struct Engine(&'static dyn EngineDef);

impl Engine {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The engine called `name`.
    pub fn by_name(name: &str) -> Option<Engine> {
        ENGINES.iter().copied().find(|e| e.name() == name)
    }

    /// What gpushare knows of it.
    pub fn def(self) -> &'static dyn EngineDef {
        self.0
    }
}

impl PartialEq for Engine {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Engine {}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Engine {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl clap::ValueEnum for Engine {
    fn value_variants<'a>() -> &'a [Self] {
        ENGINES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

/// The files `engine` needs (and the launcher for a non-default policy), merged with what they
/// hold now. Reads only.
///
/// # Errors
/// [`ConfigureError`] for a file that cannot be read or parsed.
pub fn plan(engine: Engine, setup: &Setup, opts: &Options) -> Result<Vec<Change>, ConfigureError> {
    let def = engine.def();
    let mut out = def.plan(&def.main_file(setup, opts), setup, opts)?;
    if let (Some(policy), true) = (&setup.policy, def.runs_runtime(opts.order)) {
        out.push(launcher::plan(policy, &setup.runtime)?);
    }
    Ok(out)
}

/// The edits that undo `configure engine` with the same options. Reads only.
///
/// # Errors
/// [`ConfigureError`] for a file that cannot be read or parsed (nothing is then changed).
pub fn remove(engine: Engine, setup: &Setup, opts: &Options) -> Result<Vec<Edit>, ConfigureError> {
    let def = engine.def();
    let mut out = def.remove(&def.main_file(setup, opts), setup, opts)?;
    if let Some(policy) = &setup.policy {
        let files: Vec<&Path> = ENGINES
            .iter()
            .flat_map(|e| e.def().files())
            .map(Path::new)
            .collect();
        out.extend(launcher::remove(policy, &out, &files)?);
    }
    Ok(out)
}

/// doctor's checks of every engine.
pub fn doctor() -> Vec<Check> {
    ENGINES.iter().flat_map(|e| e.def().doctor()).collect()
}

/// doctor's checks of the files `configure` recorded writing elsewhere than each engine's usual
/// file, added to `checks`; an engine's usual-file warning that it has no gpushare entry
/// becomes ok when a recorded file of that engine checks ok (not a warning beside an ok about
/// the same thing).
pub fn doctor_recorded(checks: &mut Vec<Check>, record: &record::Record) {
    for e in ENGINES {
        let def = e.def();
        let usual = def.files().first().map(Path::new);
        for p in record.of(def.name()) {
            if Some(p) == usual {
                continue;
            }
            let Some(mut c) = def.check_file(p) else {
                continue;
            };
            let ok = c.verdict == Verdict::Ok;
            let file_check = c.name.clone();
            c.name = format!("{file_check} (configured)");
            if ok {
                let cmd = def.name();
                if let Some(usual) = checks.iter_mut().find(|x| {
                    x.name == file_check
                        && x.verdict == Verdict::Warn
                        && x.detail
                            .ends_with(&format!("; run `gpushare-hook configure {cmd}`"))
                }) {
                    *usual = check::check(
                        &file_check,
                        Verdict::Ok,
                        format!(
                            "configure wrote {} instead of the usual file (checked below)",
                            p.display()
                        ),
                    );
                }
            }
            checks.push(c);
        }
    }
}
