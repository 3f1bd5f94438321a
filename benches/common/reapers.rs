//! The GPU reapers a bench's hooks started, waited for before its temp dir goes: a reaper exits
//! once `gpus/` is gone (found by the pid and start time in its lock file; never signalled), so
//! that none writes into the removed dir, holds its mount, or stays for its idle linger.

use std::path::Path;
use std::time::{Duration, Instant};

use gpushare::host::procinfo::ProcId;

/// Removes `state`'s `gpus/` and waits (at most 5 s) for the reapers stamped in `reapers/`.
pub fn remove_gpus_and_wait(state: &Path) {
    let _ = std::fs::remove_dir_all(state.join("gpus"));
    let reapers: Vec<ProcId> = std::fs::read_dir(state.join("reapers"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|t| {
                    let mut f = t.split_whitespace();
                    Some(ProcId {
                        pid: f.next()?.parse().ok()?,
                        start_time: f.next()?.parse().ok()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(5);
    while reapers.iter().any(ProcId::is_alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}
