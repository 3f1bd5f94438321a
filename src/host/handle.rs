//! [`Host`], what the doing layer works through (the policy, the state directory, the GPUs and
//! the MPS control program): how it is built, and the parts every concern uses. Its other
//! methods live with their concern: the acquire transaction and its rollback in
//! [`crate::host::acquire`], MPS daemons and compute modes in [`crate::host::daemon`], driver
//! memory limits in [`crate::host::driver_limit`], spec-edit reservations in
//! [`crate::host::reservation`], release in [`crate::host::release`] and gc in
//! [`crate::host::gc_sweep`].

use std::time::Duration;

use crate::config::Config;
use crate::decide::kube::KubeLabels;
use crate::host::mps::{Control, MpsControl, MpsDirs, MpsError};
use crate::host::state::StateDir;
use crate::vocab::Inventory;

/// What the doing layer works with: the policy, the state directory, the GPUs and the MPS
/// control program. Built with [`Host::new`] (the real ones) or [`Host::with_control`].
pub struct Host<'a> {
    pub cfg: &'a Config,
    pub state: StateDir,
    pub inventory: &'a dyn Inventory,
    control: Result<Box<dyn MpsControl + 'a>, String>,
    /// The Kubernetes names recorded with the clients this host adds.
    pub(super) labels: KubeLabels,
}

impl<'a> Host<'a> {
    /// The doing layer over the state directory `cfg` names, with NVIDIA's control program.
    pub fn new(cfg: &'a Config, inventory: &'a dyn Inventory) -> Self {
        let control = Control::new(&cfg.mps.control)
            .map(|c| Box::new(c) as Box<dyn MpsControl>)
            .map_err(|_| cfg.mps.control.clone());
        Host {
            cfg,
            state: StateDir::new(&cfg.state_dir),
            inventory,
            control,
            labels: KubeLabels::default(),
        }
    }

    /// The doing layer with another MPS control (a fake in tests).
    pub fn with_control(
        cfg: &'a Config,
        inventory: &'a dyn Inventory,
        control: Box<dyn MpsControl + 'a>,
    ) -> Self {
        Host {
            cfg,
            state: StateDir::new(&cfg.state_dir),
            inventory,
            control: Ok(control),
            labels: KubeLabels::default(),
        }
    }

    /// Records `labels` (the container's Kubernetes names) with the clients it adds.
    #[must_use]
    pub fn with_labels(mut self, labels: KubeLabels) -> Self {
        self.labels = labels;
        self
    }

    pub(crate) fn lock_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.lock_timeout_seconds)
    }

    /// The MPS control program.
    ///
    /// # Errors
    /// [`MpsError::NotFound`] when the configured binary is missing.
    pub(crate) fn control(&self) -> Result<&dyn MpsControl, MpsError> {
        match &self.control {
            Ok(c) => Ok(c.as_ref()),
            Err(name) => Err(MpsError::NotFound(name.clone())),
        }
    }

    /// The directories of domain `domain` of GPU `uuid`.
    pub fn mps_dirs(&self, uuid: &str, domain: &str) -> MpsDirs {
        self.state.mps_dirs(uuid, domain)
    }
}
