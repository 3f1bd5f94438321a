//! Undoing: releasing a container from its GPUs (poststop) and `gc`, which drops what dead
//! containers and killed hooks left behind.

use crate::host::acquire::Host;
use crate::host::mps::find_daemon;
use crate::host::state::{now_seconds, StateError};

impl Host<'_> {
    /// Removes the container from every GPU that lists it, stopping daemons whose last client
    /// left. Idempotent; problems are returned as warnings, never as a failure.
    pub fn release(&self, container: &str) -> Vec<String> {
        let mut warnings = Vec::new();
        for (uuid, rec) in self.state.list_records() {
            match rec {
                Ok(r) if !r.clients.contains_key(container) => continue,
                Ok(_) => {}
                Err(e) => {
                    warnings.push(crate::vocab::chain(&e));
                    continue;
                }
            }
            if let Err(e) = self.release_one(&uuid, Some(container)) {
                warnings.push(crate::vocab::chain(&e));
            }
        }
        warnings
    }

    /// Under the GPU's lock: drop `container` (if any) and stale clients; stop an unused daemon.
    fn release_one(&self, uuid: &str, container: Option<&str>) -> Result<(), StateError> {
        let holder = format!("release of {}", container.unwrap_or("stale clients"));
        let _lock = self.state.lock(uuid, self.lock_timeout(), &holder)?;
        let Some(mut rec) = self.state.load(uuid)? else {
            return Ok(());
        };
        let before = rec.clone();
        if let Some(c) = container {
            rec.clients.remove(c);
        }
        rec.drop_stale();
        rec.prune_reservations(now_seconds());
        crate::failpoint::hit("release-locked");
        if rec.clients.is_empty() {
            self.stop_daemon(&mut rec);
            crate::failpoint::hit("release-daemon-stopped");
        } else if let Some(d) = &rec.daemon {
            if !d.process.is_alive() {
                // Restarted on the next acquire, in the same directories (the remaining
                // clients have them mounted).
                let restore = d.restore_compute_mode;
                rec.daemon = None;
                if let Some(m) = restore {
                    let _ = self.inventory.set_compute_mode(rec.index, m);
                }
            }
        }
        if rec != before {
            self.state.save(&rec)?;
        }
        Ok(())
    }

    /// Drops stale clients everywhere, stops daemons nobody uses (recorded or not) and removes
    /// leftover directories. Returns a line per thing it did or could not do.
    pub fn gc(&self) -> Vec<String> {
        let mut report = Vec::new();
        let recorded: Vec<String> = self
            .state
            .list_records()
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        for uuid in &recorded {
            let before = self.state.load(uuid).ok().flatten();
            match self.release_one(uuid, None) {
                Ok(()) => {
                    let after = self.state.load(uuid).ok().flatten();
                    if before != after {
                        report.push(format!("{uuid}: dropped stale clients or an unused daemon"));
                    }
                }
                Err(e) => report.push(format!("{uuid}: {}", crate::vocab::chain(&e))),
            }
        }
        // Daemon directories without a record, or without a daemon in their record.
        if let Ok(rd) = std::fs::read_dir(self.state.root().join("mps")) {
            for e in rd.flatten() {
                let uuid = e.file_name().to_string_lossy().into_owned();
                let Ok(_lock) = self.state.lock(&uuid, self.lock_timeout(), "gc") else {
                    continue;
                };
                let rec = self.state.load(&uuid).ok().flatten();
                if rec
                    .as_ref()
                    .is_some_and(|r| r.daemon.is_some() || r.dirs_in_use(now_seconds()))
                {
                    continue;
                }
                let dirs = self.mps_dirs(&uuid);
                if let Ok(c) = self.control() {
                    if let Some(p) = find_daemon(&dirs.pipe, c.binary()) {
                        c.stop(&dirs.pipe, Some(p));
                        report.push(format!(
                            "{uuid}: stopped unrecorded MPS daemon pid {}",
                            p.pid
                        ));
                    }
                }
                dirs.remove();
                report.push(format!("{uuid}: removed leftover {}", dirs.dir.display()));
            }
        }
        self.gc_container_dirs(&mut report);
        report
    }

    /// Per-container directories: a precreate's `pending-*` one whose create never reached the
    /// hook (after an hour), and one whose container is no client of any GPU any more.
    fn gc_container_dirs(&self, report: &mut Vec<String>) {
        use crate::host::pending::{sweep_pending, PENDING_MAX_AGE};
        for p in sweep_pending(&self.state, PENDING_MAX_AGE) {
            report.push(format!("removed abandoned {}", p.display()));
        }
        let clients: std::collections::BTreeSet<String> = self
            .state
            .list_records()
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .flat_map(|r| r.clients.into_keys())
            .collect();
        let Ok(rd) = std::fs::read_dir(self.state.root().join("containers")) else {
            return;
        };
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if id.starts_with(crate::host::pending::PENDING_PREFIX) || clients.contains(&id) {
                continue;
            }
            if std::fs::remove_dir_all(e.path()).is_ok() {
                report.push(format!(
                    "removed {} of a container that is gone",
                    e.path().display()
                ));
            }
        }
    }
}
