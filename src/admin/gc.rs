//! `gpushare-hook gc`: drop clients whose process is gone, stop unused daemons, remove
//! leftovers (see [`Host::gc`]).

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
    let o = Host::new(cfg, inventory).gc();
    GcReport {
        actions: o.actions,
        problems: o.problems,
        error: None,
    }
}
