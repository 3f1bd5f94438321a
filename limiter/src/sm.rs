//! The SM cap's token buckets: one per CUDA device, taken from on every launch path and
//! refilled by the watcher thread (`watcher.rs`).
//!
//! Hot path (under the cap): three loads and one store, no read-modify-write, no `getenv`, no
//! allocation, no lock. A bucket is two counters, each written by one side only: launches
//! count up `taken`, the watcher moves `granted` (the launches allowed so far) up; the tokens
//! left are `granted − taken`. A launch bumps `taken` with a plain load and store rather than
//! an atomic add (an atomic read-modify-write costs more than the whole launch wrapper is
//! allowed): two threads launching in the same few nanoseconds may count as one. The watcher
//! sets the rate from the launches it counted against the utilisation NVML measured, so such a
//! lost count raises the measured cost per counted launch and the controller stays on the cap.
#![forbid(unsafe_code)]

use crate::limits::{Limits, MAX_DEVICES};
use crate::sys;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// One device's bucket.
pub struct Bucket {
    /// Cap in percent; 0 = uncapped.
    pub target: u32,
    /// Launches counted (only launches write it). So the watcher counts the launches between
    /// two of its looks from this counter alone.
    pub taken: AtomicI64,
    /// Launches allowed so far (only the watcher writes it, and only upwards).
    pub granted: AtomicI64,
}

impl Bucket {
    /// Tokens left (negative: in debt).
    pub fn tokens(&self) -> i64 {
        self.granted
            .load(Ordering::Acquire)
            .saturating_sub(self.taken.load(Ordering::Acquire))
    }

    /// Opens the bucket for good (no watcher can refill it).
    pub fn open(&self) {
        self.granted.store(i64::MAX / 2, Ordering::Release);
    }
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
            taken: AtomicI64::new(0),
            granted: AtomicI64::new(2),
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
        // Plain load and store: see the module's documentation.
        let taken = b.taken.load(Ordering::Relaxed).wrapping_add(1);
        b.taken.store(taken, Ordering::Relaxed);
        taken <= b.granted.load(Ordering::Acquire) && WATCHER_STARTED.load(Ordering::Relaxed)
    }

    /// Waits until the bucket of `ord` is out of debt.
    #[cold]
    #[inline(never)]
    pub fn wait(&self, ord: usize) {
        let Some(b) = self.buckets.get(ord) else {
            return;
        };
        while b.tokens() < 0 {
            sys::sleep_ns(200_000);
        }
    }
}
