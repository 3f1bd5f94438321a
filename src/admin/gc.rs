//! `gpushare-hook gc`: drop clients whose process is gone, stop unused daemons, remove
//! leftovers (see [`Host::gc`]).

use serde::Serialize;

use crate::config::Config;
use crate::host::acquire::Host;
use crate::vocab::Inventory;

use super::report::Report;

/// What `gc` did, one line per action.
#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub actions: Vec<String>,
}

impl Report for GcReport {
    fn human(&self) -> String {
        self.actions.iter().map(|a| format!("{a}\n")).collect()
    }
}

/// Runs `gc` over the state directory of `cfg`.
pub fn gc(cfg: &Config, inventory: &dyn Inventory) -> GcReport {
    GcReport {
        actions: Host::new(cfg, inventory).gc(),
    }
}
