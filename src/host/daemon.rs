//! The MPS daemons' lifecycle (start, check, adopt, replace, stop, restart) and the compute
//! modes they need (set write-ahead, put back once no daemon is left).

use std::time::Duration;

use crate::decide::plan::PlannedGpu;
use crate::host::events::{self, Event};
use crate::host::handle::Host;
use crate::host::mps::MpsError;
use crate::host::procinfo::ProcId;
use crate::host::state::{now_seconds, Daemon, Record};
use crate::host::step::{AcquireError, Done};
use crate::vocab::{ComputeMode, Isolation};

impl Host<'_> {
    /// The compute mode a GPU serving MPS under this policy runs in: EXCLUSIVE_PROCESS where
    /// exactly one daemon can serve it (isolation `gpu`), else DEFAULT (several daemons).
    fn mps_compute_mode(&self) -> Option<ComputeMode> {
        match self.cfg.mps.isolation {
            Isolation::Gpu if self.cfg.mps.exclusive_compute_mode => {
                Some(ComputeMode::ExclusiveProcess)
            }
            Isolation::Gpu => None,
            Isolation::Group | Isolation::Container => Some(ComputeMode::Default),
        }
    }

    /// Makes sure one live, answering daemon serves domain `key` with its limits as defaults:
    /// keeps the recorded one (putting back defaults a tenant changed), adopts an unrecorded
    /// one, or starts a new one.
    pub(super) fn ensure_daemon(
        &self,
        rec: &mut Record,
        key: &str,
        done: &mut Done,
    ) -> Result<(), AcquireError> {
        let control = self.control()?;
        let dirs = self.mps_dirs(&rec.uuid, key);
        let limits = rec.domains[key].limits;
        if let Some(d) = rec.domains[key].daemon.clone() {
            // Live means answering: a real command, proven to reach the daemon gpushare
            // started, within a short deadline; the same conversation puts back defaults a
            // tenant changed.
            let checked = if d.process.is_alive() {
                control.refresh(&dirs.pipe, d.process, &limits)
            } else {
                Err(MpsError::Gone { pid: d.process.pid })
            };
            match checked {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.log_replacement(rec, key, d.process, &e);
                    events::note(Event::daemon(
                        if d.process.is_alive() {
                            "replace"
                        } else {
                            "restart"
                        },
                        &rec.uuid,
                        key,
                        d.process.pid,
                    ));
                    // Replaced in the same directories, which running containers have
                    // mounted; the start empties the pipe directory first.
                    control.stop(&dirs.pipe, Some(d.process));
                    if let Some(dom) = rec.domains.get_mut(key) {
                        dom.daemon = None;
                    }
                }
            }
        } else if let Some(found) = control.find_daemon(&dirs.pipe) {
            // One gpushare started and recorded in the domain directory, missing from the
            // record (the hook was killed between start and save): adopted if it answers.
            if control.set_defaults(&dirs.pipe, found, &limits).is_ok() {
                tracing::warn!(
                    "adopting the MPS daemon of GPU {} ({}, domain {key}), pid {}, missing from the record",
                    rec.index,
                    rec.uuid,
                    found.pid
                );
                if let Some(dom) = rec.domains.get_mut(key) {
                    dom.daemon = Some(Daemon { process: found });
                }
                return Ok(());
            }
            control.stop(&dirs.pipe, Some(found));
        }
        dirs.prepare(self.cfg.mps.shm_bytes())?;
        self.set_mps_compute_mode(rec, done)?;
        let timeout = Duration::from_secs(self.cfg.mps.start_timeout_seconds);
        let proc = control.start(&rec.uuid, &dirs, self.cfg.mps.multiuser, timeout)?;
        done.started = Some((key.to_owned(), proc));
        if let Some(dom) = rec.domains.get_mut(key) {
            dom.daemon = Some(Daemon { process: proc });
        }
        if let Err(e) = control.set_defaults(&dirs.pipe, proc, &limits) {
            // Never leave a daemon serving without the domain's limits.
            control.stop(&dirs.pipe, Some(proc));
            done.started = None;
            if let Some(dom) = rec.domains.get_mut(key) {
                dom.daemon = None;
            }
            return Err(e.into());
        }
        events::note(Event::daemon("start", &rec.uuid, key, proc.pid));
        tracing::info!(
            "MPS daemon started on GPU {} ({}, domain {key}), pid {}",
            rec.index,
            rec.uuid,
            proc.pid
        );
        crate::failpoint::hit("acquire-daemon-started");
        Ok(())
    }

    /// Logs why the daemon `daemon` of domain `key` is replaced: tampered with (another
    /// process holds its socket), hung, or dead; with the domain's containers.
    fn log_replacement(&self, rec: &Record, key: &str, daemon: ProcId, why: &MpsError) {
        let containers = rec.domain_clients(key).join(", ");
        let tampered = why.is_tampered();
        let why = crate::vocab::chain(why);
        if tampered {
            tracing::error!(
                gpu = rec.index,
                uuid = %rec.uuid,
                domain = key,
                containers = %containers,
                "MPS domain {key} of GPU {} tampered with: {why}; restarting its daemon (pid {}) in an emptied pipe directory",
                rec.index,
                daemon.pid
            );
        } else {
            tracing::warn!(
                gpu = rec.index,
                uuid = %rec.uuid,
                domain = key,
                containers = %containers,
                "MPS daemon of GPU {} ({}, domain {key}), pid {}, is dead or does not answer ({why}); replacing it",
                rec.index,
                rec.uuid,
                daemon.pid
            );
        }
    }

    /// Restarts the daemon of domain `key` for the clients it still has (gc).
    ///
    /// # Errors
    /// [`AcquireError`] when it cannot be started.
    pub(crate) fn restart(&self, rec: &mut Record, key: &str) -> Result<(), AcquireError> {
        let mut done = Done {
            gpu: PlannedGpu {
                index: rec.index,
                uuid: rec.uuid.clone(),
                ordinal: 0,
            },
            before: None,
            started: None,
            domain: None,
            compute_mode_before: None,
            driver_limit: None,
        };
        self.ensure_daemon(rec, key, &mut done)
    }

    /// Puts the GPU in the compute mode MPS needs under this policy, recording (and saving)
    /// the mode to restore first.
    fn set_mps_compute_mode(&self, rec: &mut Record, done: &mut Done) -> Result<(), AcquireError> {
        let Some(wanted) = self.mps_compute_mode() else {
            return Ok(());
        };
        let current = self.inventory.compute_mode(rec.index)?;
        if current == wanted {
            return Ok(());
        }
        if rec.restore_compute_mode.is_none() {
            rec.restore_compute_mode = Some(current);
            // Write-ahead: a hook killed after the change leaves a record that says what to
            // restore.
            self.state.save(rec)?;
            crate::failpoint::hit("acquire-mode-recorded");
        }
        self.inventory.set_compute_mode(rec.index, wanted)?;
        done.compute_mode_before = Some(current);
        Ok(())
    }

    /// Stops the daemon of domain `key`, removes its directories unless a container uses them,
    /// and restores the GPU's compute mode once no daemon is left on it.
    pub(crate) fn stop_daemon(&self, rec: &mut Record, key: &str) -> Option<ProcId> {
        let dirs = self.mps_dirs(&rec.uuid, key);
        let recorded = rec.domains.get_mut(key).and_then(|d| d.daemon.take());
        // A daemon missing from the record (a hook killed between start and save) goes too.
        let found = recorded
            .map(|d| d.process)
            .or_else(|| self.control().ok()?.find_daemon(&dirs.pipe));
        if let Some(p) = found {
            events::note(Event::daemon("stop", &rec.uuid, key, p.pid));
            match self.control() {
                Ok(c) => c.stop(&dirs.pipe, Some(p)),
                // Stopping needs no control program: quit is spoken in-process.
                Err(_) => crate::host::mps::stop(&dirs.pipe, Some(p)),
            }
            tracing::info!(
                "MPS daemon stopped on GPU {} ({}, domain {key}), pid {}",
                rec.index,
                rec.uuid,
                p.pid
            );
        }
        if !rec.dirs_in_use(key, now_seconds()) {
            dirs.remove();
        }
        rec.tidy();
        self.restore_compute_mode(rec);
        found
    }

    /// Puts back the compute mode recorded before gpushare changed it, once no daemon runs.
    pub(crate) fn restore_compute_mode(&self, rec: &mut Record) {
        if rec.has_daemon() {
            return;
        }
        let Some(m) = rec.restore_compute_mode else {
            return;
        };
        match self.inventory.set_compute_mode(rec.index, m) {
            Ok(()) => rec.restore_compute_mode = None,
            Err(e) => {
                tracing::warn!(uuid = %rec.uuid, error = %crate::vocab::chain(&e), "cannot restore compute mode")
            }
        }
    }
}
