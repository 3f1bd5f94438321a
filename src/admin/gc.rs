//! `gpushare-hook gc`: drop clients whose process is gone, stop unused daemons, remove
//! leftovers (see [`Host::gc`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::Config;
use crate::host::acquire::Host;
use crate::vocab::Inventory;

use super::report::Report;

/// What `gc` did, one line per action, and what it could not do.
#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub actions: Vec<String>,
    pub problems: Vec<String>,
    /// Why the state dir cannot be read (then nothing was done).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl GcReport {
    /// Whether something could not be done (the command then exits 1).
    pub fn failed(&self) -> bool {
        !self.problems.is_empty() || self.error.is_some()
    }
}

impl Report for GcReport {
    fn human(&self) -> String {
        if let Some(e) = &self.error {
            return format!("{e}\n");
        }
        let mut out: String = self.actions.iter().map(|a| format!("{a}\n")).collect();
        for p in &self.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        if out.is_empty() {
            out.push_str("nothing to do\n");
        }
        out
    }
}

/// Runs `gc` over the state directory of `cfg`; does nothing when it cannot be read.
pub fn gc(cfg: &Config, inventory: &dyn Inventory) -> GcReport {
    if let Some(error) = super::status::unreadable(cfg) {
        return GcReport {
            error: Some(error),
            ..GcReport::default()
        };
    }
    let before = paths(&cfg.state_dir);
    let o = Host::new(cfg, inventory).gc();
    let after = paths(&cfg.state_dir);
    let mut actions = o.actions;
    actions.extend(unreported(&before, &after, &actions));
    GcReport {
        actions,
        problems: o.problems,
        error: None,
    }
}

/// Every path under `dir` but lock files (made on first use, never removed by gc).
fn paths(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "lock") {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

/// `removed PATH` for each path gone between `before` and `after` that no action line names
/// (only the topmost of a removed tree), so that the report says everything gc removed.
fn unreported(
    before: &BTreeSet<PathBuf>,
    after: &BTreeSet<PathBuf>,
    actions: &[String],
) -> Vec<String> {
    let gone = |p: &Path| before.contains(p) && !after.contains(p);
    let named = |p: &Path| {
        actions.iter().any(|a| {
            a.split_whitespace()
                .map(|w| w.trim_matches(|c: char| matches!(c, ':' | ',' | '(' | ')' | ';')))
                .any(|w| Path::new(w) == p)
        })
    };
    before
        .iter()
        .filter(|p| gone(p))
        .filter(|p| !p.parent().is_some_and(gone))
        .filter(|p| !named(p))
        .map(|p| format!("removed {}", p.display()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_gc_removed_without_saying_is_reported_topmost_only() {
        let set = |v: &[&str]| v.iter().map(PathBuf::from).collect::<BTreeSet<_>>();
        let before = set(&[
            "/s/mps",
            "/s/mps/d1",
            "/s/mps/d1/pipe",
            "/s/containers",
            "/s/containers/c1",
            "/s/gpus",
        ]);
        let after = set(&["/s/gpus"]);
        let actions = vec!["removed /s/containers/c1 of a container that is gone".to_owned()];
        assert_eq!(
            unreported(&before, &after, &actions),
            ["removed /s/containers", "removed /s/mps"]
        );
        assert!(unreported(&before, &before, &[]).is_empty());
    }
}
