//! The top-level error and the one-line rendering of an error chain.

use std::error::Error as StdError;

use thiserror::Error;

use crate::acquire::AcquireError;
use crate::config::ConfigError;
use crate::devices::DeviceError;
use crate::input::InputError;
use crate::inventory::InventoryError;

/// Everything a hook or admin command can fail with.
#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("invalid share request")]
    Request(#[from] crate::request::RequestError),
    #[error(transparent)]
    Devices(#[from] DeviceError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Acquire(#[from] AcquireError),
    #[error(transparent)]
    Inject(#[from] crate::inject::InjectError),
    #[error(transparent)]
    SpecEdit(#[from] crate::spec_edit::SpecEditError),
    #[error("gpushare-hook lacks CAP_SYS_ADMIN, needed to {0}; run it as root from the container runtime")]
    NoSysAdmin(&'static str),
    #[error("{0}")]
    Other(String),
}

/// Renders an error and its sources as one line: `outer: cause: root cause`.
/// Transparent wrappers and causes that repeat the previous text are skipped.
pub fn chain(err: &dyn StdError) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&dyn StdError> = Some(err);
    while let Some(e) = cur {
        let s = e.to_string().replace('\n', " ");
        if !s.is_empty() && parts.last().is_none_or(|p| !p.ends_with(&s)) {
            parts.push(s);
        }
        cur = e.source();
    }
    parts.join(": ")
}
