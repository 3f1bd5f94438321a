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
    Intake(#[from] crate::container::intake::IntakeError),
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
    #[error(transparent)]
    Runtime(#[from] crate::container::runtime::wrapper_error::RuntimeError),
    #[error("gpushare-hook lacks CAP_SYS_ADMIN, needed to {0}; run it as root from the container runtime")]
    NoSysAdmin(&'static str),
    /// A refusal the precreate hook made and handed on to createRuntime in its env (podman
    /// drops precreate's stderr): only its text crosses the process boundary.
    #[error("{0}")]
    RefusedAtPrecreate(String),
}

/// What a caller can do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The same request may succeed if made again (what was saved about the GPUs was stale
    /// and has been dropped).
    Retry,
    /// Anything else: the message says what to change.
    Fail,
}

impl Error {
    /// The reason label of a refusal, for `gpushare_refusals_total` and the event log.
    pub fn reason(&self) -> &'static str {
        use crate::host::state::StateError;
        match self {
            Error::Config(_) => "policy",
            Error::Intake(_) | Error::Input(_) => "input",
            // An image that cannot load the limiter: refused where it is injected, or where
            // deciding finds only the limiter could enforce the cap.
            Error::Decide(crate::decide::front::DecideError::LimiterImage(_)) => "inject",
            Error::Decide(_) => "request",
            Error::Inventory(_) | Error::Acquire(AcquireError::Inventory(_)) => "nvml",
            Error::Acquire(AcquireError::Busy { .. }) => "busy",
            Error::Acquire(AcquireError::Domain(_) | AcquireError::NoDomain) => "domain",
            Error::Acquire(AcquireError::State(StateError::LockTimeout { .. })) => "lock_timeout",
            Error::Acquire(AcquireError::State(_)) => "state",
            Error::Acquire(AcquireError::Mps(_)) => "mps",
            Error::Acquire(AcquireError::Timeslice(_)) => "timeslice",
            Error::Acquire(AcquireError::Overcommitted(_)) => "memory",
            Error::Acquire(AcquireError::DriverLimit { .. } | AcquireError::CgroupTaken { .. }) => {
                "driver_limit"
            }
            Error::Inject(_) => "inject",
            Error::SpecEdit(_) => "spec_edit",
            Error::NoSysAdmin(_) => "capability",
            Error::Profile(_) => "profile",
            Error::Runtime(_) => "runtime",
            Error::RefusedAtPrecreate(_) => "precreate",
        }
    }

    /// Whether to retry, judged on the error's variants, never on its text.
    pub fn kind(&self) -> ErrorKind {
        let inventory = match self {
            Error::Inventory(e)
            | Error::Decide(crate::decide::front::DecideError::Inventory(e))
            | Error::Acquire(AcquireError::Inventory(e)) => Some(e),
            _ => None,
        };
        match inventory {
            Some(e) if e.is_retry() => ErrorKind::Retry,
            _ => ErrorKind::Fail,
        }
    }
}

/// Writes a refusal of container `container` (`?` when unknown) as one event and counts it,
/// with its request: every entry point that refuses (the createRuntime hook, one carried from
/// precreate, `gpushare-runtime`) calls this once for it, and no other stage does.
pub fn record_refusal(cfg: &crate::config::Config, container: &str, reason: &str, message: &str) {
    crate::host::events::note(crate::host::events::Event::Refusal {
        container: container.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
    });
    crate::host::events::flush(cfg, |c| c.requests += 1);
}

/// A reason label as carried from precreate: a short lowercase word, or `precreate`.
pub fn carried_reason(raw: Option<&str>) -> &str {
    raw.filter(|r| {
        !r.is_empty() && r.len() <= 32 && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    })
    .unwrap_or("precreate")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_gpu_list_is_a_retry_wherever_it_surfaces_and_nothing_else_is() {
        let changed = || InventoryError::Changed {
            path: "inventory.json".into(),
        };
        for (what, e) in [
            ("inventory", Error::Inventory(changed())),
            ("decide", Error::Decide(changed().into())),
            ("acquire", Error::Acquire(changed().into())),
        ] {
            assert_eq!(e.kind(), ErrorKind::Retry, "{what}");
        }
        for (what, e) in [
            (
                "other inventory error",
                Error::Inventory(InventoryError::BadUuid("x".into())),
            ),
            ("no CAP_SYS_ADMIN", Error::NoSysAdmin("mount")),
        ] {
            assert_eq!(e.kind(), ErrorKind::Fail, "{what}");
        }
    }
}
