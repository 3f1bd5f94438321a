//! Stream-ordered memory pools the limiter watches: each pool's CUDA ordinal and the reserved
//! size last charged for it. A pool's memory is counted as the pool's reserved size (what it
//! holds on the device), not as the sizes of the allocations made from it.
//!
//! Lookups scan a fixed table with atomic loads (no lock). Adding and removing a pool take a
//! small mutex that is never held across a driver call.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Pools watched at once; allocations from further pools are counted by request size.
pub const MAX_POOLS: usize = 64;
/// `ord` of a pool whose memory is not device memory (not counted).
pub const NOT_DEVICE: u32 = u32::MAX;

/// One watched pool.
pub struct Entry {
    handle: AtomicUsize,
    ord: AtomicU32,
    charged: AtomicU64,
    /// Free reserved memory promised to allocations in flight (they need not grow the pool),
    /// in the low 48 bits, and a count of changes (allocations completed, shrinks done; mod
    /// 2^16) above: one word, so that a promise is made only if nothing changed the pool since
    /// it was read.
    promises: AtomicU64,
}

const PROMISED: u64 = (1 << 48) - 1;
const ONE_COMPLETED: u64 = 1 << 48;

/// A change of a pool's charged size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delta {
    Grew(u64),
    Shrank(u64),
}

impl Entry {
    const fn new() -> Entry {
        Entry {
            handle: AtomicUsize::new(0),
            ord: AtomicU32::new(NOT_DEVICE),
            charged: AtomicU64::new(0),
            promises: AtomicU64::new(0),
        }
    }

    /// The reserved size charged so far.
    pub fn charged(&self) -> u64 {
        self.charged.load(Ordering::Acquire)
    }

    /// Records a fresh reading `reserved` in place of the charge `expected` read before it.
    /// `None` when the charge changed meanwhile (an allocation charged growth): read again.
    pub fn replace(&self, expected: u64, reserved: u64) -> Option<Delta> {
        self.charged
            .compare_exchange(expected, reserved, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|old| {
                if reserved >= old {
                    Delta::Grew(reserved - old)
                } else {
                    Delta::Shrank(old - reserved)
                }
            })
    }

    /// Records a reading taken on an allocation path: only growth counts, since an allocation
    /// never shrinks a pool (a lower reading is older than the charge).
    #[inline]
    pub fn raise(&self, reserved: u64) -> Delta {
        if reserved <= self.charged.load(Ordering::Acquire) {
            return Delta::Grew(0);
        }
        let old = self.charged.fetch_max(reserved, Ordering::AcqRel);
        Delta::Grew(reserved.saturating_sub(old))
    }

    /// How many changes (completed allocations, shrinks) this pool has seen (mod 2^16): read
    /// before a reading of the pool and handed to [`Self::promise`].
    #[inline]
    pub fn completed(&self) -> u64 {
        self.promises.load(Ordering::SeqCst) >> 48
    }

    /// Promises up to `size` bytes of the pool's `free` reserved memory (a reading taken after
    /// [`Self::completed`] returned `since`) to an allocation, less what is promised to others
    /// already; returns the bytes granted. `None` (nothing promised) when an allocation
    /// completed or the pool shrank since: the reading may count memory that is gone.
    #[inline]
    pub fn promise(&self, size: u64, free: u64, since: u64) -> Option<u64> {
        let mut granted = 0;
        self.promises
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                if w >> 48 != since {
                    return None;
                }
                granted = size.min(free.saturating_sub(w & PROMISED));
                Some(w + granted)
            })
            .ok()
            .map(|_| granted)
    }

    /// Takes a promise back (the allocation did not go ahead).
    pub fn unpromise(&self, granted: u64) {
        if granted != 0 {
            self.promises.fetch_sub(granted, Ordering::SeqCst);
        }
    }

    /// Whether any allocation in flight holds a promise.
    pub fn promised(&self) -> bool {
        self.promises.load(Ordering::SeqCst) & PROMISED != 0
    }

    /// An allocation holding `granted` completed (the pool's used size now shows it).
    #[inline]
    pub fn complete(&self, granted: u64) {
        // One step: the count goes up (wrapping off the top) and the promise is released.
        self.promises
            .fetch_add(ONE_COMPLETED.wrapping_sub(granted), Ordering::SeqCst);
    }

    /// CUDA ordinal of the pool's device; `None` for host pools.
    pub fn ord(&self) -> Option<usize> {
        let o = self.ord.load(Ordering::Acquire);
        (o != NOT_DEVICE).then_some(o as usize)
    }
}

/// The table of watched pools.
pub struct Pools {
    entries: [Entry; MAX_POOLS],
    edit: Mutex<()>,
    /// Calls in progress after which pools may have shrunk (synchronisation, trim): while one
    /// runs, no allocation is promised a pool's free memory, which may be going away.
    shrinking: AtomicU32,
}

/// The process's watched pools.
pub static POOLS: Pools = Pools::new();

impl Default for Pools {
    fn default() -> Self {
        Self::new()
    }
}

impl Pools {
    pub const fn new() -> Pools {
        Pools {
            entries: [const { Entry::new() }; MAX_POOLS],
            edit: Mutex::new(()),
            shrinking: AtomicU32::new(0),
        }
    }

    /// The entry of `handle`, if watched.
    pub fn find(&self, handle: usize) -> Option<&Entry> {
        if handle == 0 {
            return None;
        }
        self.entries
            .iter()
            .find(|e| e.handle.load(Ordering::Acquire) == handle)
    }

    /// Watches `handle` on CUDA ordinal `ord` ([`NOT_DEVICE`]: a host pool), charged 0 so far.
    /// Returns the existing entry if already watched; `None` when the table is full.
    pub fn register(&self, handle: usize, ord: u32) -> Option<&Entry> {
        if handle == 0 {
            return None;
        }
        let _g = self.edit.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.find(handle) {
            return Some(e);
        }
        let e = self
            .entries
            .iter()
            .find(|e| e.handle.load(Ordering::Acquire) == 0)?;
        e.ord.store(ord, Ordering::Release);
        e.charged.store(0, Ordering::Release);
        e.handle.store(handle, Ordering::Release);
        Some(e)
    }

    /// Stops watching `handle`; returns its ordinal and what it had charged.
    pub fn remove(&self, handle: usize) -> Option<(Option<usize>, u64)> {
        let _g = self.edit.lock().unwrap_or_else(|e| e.into_inner());
        let e = self.find(handle)?;
        e.handle.store(0, Ordering::Release);
        Some((e.ord(), e.charged.swap(0, Ordering::AcqRel)))
    }

    /// Whether a call that may shrink pools is in progress.
    pub fn shrinking(&self) -> bool {
        self.shrinking.load(Ordering::SeqCst) != 0
    }

    /// Runs `call`, which may make pools give memory back, once no allocation in flight holds
    /// a promise of a pool's free memory (waiting at most `max_wait_ns`); no new promise is
    /// made until it returns.
    pub fn shrink<T>(&self, max_wait_ns: u64, call: impl FnOnce() -> T) -> T {
        self.shrinking.fetch_add(1, Ordering::SeqCst);
        let start = crate::sys::now_ns();
        while self.iter().any(|(_, e)| e.promised())
            && crate::sys::now_ns().saturating_sub(start) < max_wait_ns
        {
            std::thread::yield_now();
        }
        let r = call();
        // Readings taken before or during the call are stale now (see `Entry::promise`).
        for (_, e) in self.iter() {
            e.promises.fetch_add(ONE_COMPLETED, Ordering::SeqCst);
        }
        self.shrinking.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// Every watched pool with its handle.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Entry)> {
        self.entries.iter().filter_map(|e| {
            let h = e.handle.load(Ordering::Acquire);
            (h != 0).then_some((h, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_report_growth_and_shrinkage_that_add_up() {
        let p = Pools::new();
        let e = p.register(0x10, 1).unwrap();
        let rows: &[(&str, u64, Delta)] = &[
            ("first reading charges everything", 6, Delta::Grew(6)),
            ("same size, no change", 6, Delta::Grew(0)),
            ("growth", 10, Delta::Grew(4)),
            ("trim", 2, Delta::Shrank(8)),
        ];
        for (what, reserved, want) in rows {
            assert_eq!(e.replace(e.charged(), *reserved), Some(*want), "{what}");
        }
        assert_eq!(
            e.replace(7, 3),
            None,
            "a charge that changed since it was read is not replaced"
        );
        let raises: &[(&str, u64, Delta)] = &[
            ("growth on an allocation path", 5, Delta::Grew(3)),
            ("an older, lower reading is ignored", 4, Delta::Grew(0)),
        ];
        for (what, reserved, want) in raises {
            assert_eq!(e.raise(*reserved), *want, "{what}");
        }
        assert_eq!(e.ord(), Some(1));
    }

    #[test]
    fn promises_never_hand_out_free_memory_twice() {
        let p = Pools::new();
        let e = p.register(0x10, 0).unwrap();
        let since = e.completed();
        let rows: &[(&str, u64, Option<u64>)] = &[
            ("first allocation served from free memory", 60, Some(60)),
            ("the second gets only what is left", 60, Some(40)),
            ("nothing left to promise", 10, Some(0)),
        ];
        for (what, size, want) in rows {
            assert_eq!(e.promise(*size, 100, since), *want, "{what}");
        }
        e.complete(60);
        assert_ne!(e.completed(), since, "a completion is seen");
        assert_eq!(
            e.promise(30, 100, since),
            None,
            "a reading older than a completion earns no promise"
        );
        assert_eq!(
            e.promise(30, 100, e.completed()),
            Some(30),
            "the completed allocation's promise was given back"
        );
        e.unpromise(40);
        e.unpromise(30);
        assert!(!e.promised(), "all back");
        for _ in 0..70_000 {
            e.complete(0);
        }
        assert_eq!(e.promise(5, 100, e.completed()), Some(5), "the count wraps");
        e.unpromise(5);
        assert!(!e.promised());
    }

    #[test]
    fn register_find_remove_and_full_table() {
        let p = Pools::new();
        assert!(p.find(0x10).is_none(), "unknown pool");
        assert!(p.register(0, 0).is_none(), "null handle is never watched");
        let e = p.register(0x10, 0).unwrap();
        e.raise(5);
        assert!(
            std::ptr::eq(p.register(0x10, 3).unwrap(), e),
            "registering again returns the same entry"
        );
        assert_eq!(
            p.register(0x20, NOT_DEVICE).unwrap().ord(),
            None,
            "host pool"
        );
        assert_eq!(p.iter().count(), 2);
        assert_eq!(
            p.remove(0x10),
            Some((Some(0), 5)),
            "removal returns the charge"
        );
        assert!(p.find(0x10).is_none());
        for h in 1..MAX_POOLS {
            assert!(p.register(0x1000 + h, 0).is_some(), "room for {h}");
        }
        assert!(p.register(0x9999, 0).is_none(), "table full");
    }
}
