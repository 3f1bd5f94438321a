//! The SM cap's token buckets: one per CUDA device, taken from on every launch path and
//! refilled by the watcher thread (`watcher.rs`).
//!
//! Hot path (under the cap): one atomic operation, no `getenv`, no allocation, no lock.
#![forbid(unsafe_code)]

use crate::limits::{Limits, MAX_DEVICES};
use crate::sys;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// One device's bucket.
pub struct Bucket {
    /// Cap in percent; 0 = uncapped.
    pub target: u32,
    /// Launches allowed now; each launch takes one, only the watcher thread adds. So the
    /// watcher counts the launches between two of its looks from the tokens alone, and a
    /// launch pays one atomic operation.
    pub tokens: AtomicI64,
}

/// All buckets.
pub struct Sm {
    pub any: bool,
    pub buckets: [Bucket; MAX_DEVICES],
}

/// Set once the watcher thread of this process runs (claimed by `watcher::start`).
pub static WATCHER_STARTED: AtomicBool = AtomicBool::new(false);

/// The watcher thread does not survive `fork`; the child starts its own.
pub fn after_fork_child() {
    WATCHER_STARTED.store(false, Ordering::SeqCst);
}

impl Sm {
    pub fn new(l: &Limits) -> Sm {
        let buckets = std::array::from_fn(|i| Bucket {
            target: l.sm[i].unwrap_or(0),
            tokens: AtomicI64::new(2),
        });
        Sm {
            any: l.any_sm(),
            buckets,
        }
    }

    /// Takes one launch token for CUDA ordinal `ord`. False when the caller must start the
    /// watcher (if it does not run yet) and [`Self::wait`]: the bucket is in debt.
    #[inline(always)]
    pub fn take(&self, ord: usize) -> bool {
        let Some(b) = self.buckets.get(ord) else {
            return true;
        };
        if b.target == 0 {
            return true;
        }
        b.tokens.fetch_sub(1, Ordering::AcqRel) > 0 && WATCHER_STARTED.load(Ordering::Relaxed)
    }

    /// Waits until the bucket of `ord` is out of debt.
    #[cold]
    #[inline(never)]
    pub fn wait(&self, ord: usize) {
        let Some(b) = self.buckets.get(ord) else {
            return;
        };
        while b.tokens.load(Ordering::Acquire) < 0 {
            sys::sleep_ns(200_000);
        }
    }
}
