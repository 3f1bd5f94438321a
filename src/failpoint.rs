//! Named points where a test can have the hook killed (`GPUSHARE_FAILPOINT=<name>` in the
//! hook's own environment, which the container cannot set): crash-safety is tested by
//! SIGKILLing the real binary exactly there.

use std::sync::OnceLock;

/// Kills this process with SIGKILL if `GPUSHARE_FAILPOINT` names `point`.
pub fn hit(point: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var("GPUSHARE_FAILPOINT").ok());
    if armed.as_deref() == Some(point) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
