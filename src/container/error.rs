//! The top-level error every entry point returns ([`crate::vocab::chain`] renders it).

use thiserror::Error;

use crate::config::ConfigError;
use crate::decide::input::InputError;
use crate::host::acquire::AcquireError;
use crate::vocab::InventoryError;

/// Everything a hook or admin command can fail with.
#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Decide(#[from] crate::decide::front::DecideError),
    #[error(transparent)]
    Profile(#[from] crate::decide::profile::ProfileError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Acquire(#[from] AcquireError),
    #[error(transparent)]
    Inject(#[from] crate::container::inject::InjectError),
    #[error(transparent)]
    SpecEdit(#[from] crate::container::spec_edit::SpecEditError),
    #[error("gpushare-hook lacks CAP_SYS_ADMIN, needed to {0}; run it as root from the container runtime")]
    NoSysAdmin(&'static str),
    #[error("{0}")]
    Other(String),
}
