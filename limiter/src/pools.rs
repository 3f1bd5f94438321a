//! Stream-ordered memory pools the limiter watches: each pool's CUDA ordinal and the reserved
//! size last charged for it. A pool's memory is counted as the pool's reserved size (what it
//! holds on the device), not as the sizes of the allocations made from it.
//!
//! Lookups scan a fixed table with atomic loads (no lock). Adding and removing a pool take a
//! small mutex that is never held across a driver call. Each pool's accounting (a reading of
//! the driver, the admission decided from it, the allocation, the reading after it, and the
//! charge) is one step under the pool's own spin lock, so that no reading is applied out of
//! order with another; a forked child starts with every pool lock free.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
    /// Held while the pool's accounting is read and changed (see the module's text).
    busy: AtomicBool,
}

/// A held pool lock; released on drop.
pub struct PoolGuard<'a>(&'a Entry);

impl Drop for PoolGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

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
            busy: AtomicBool::new(false),
        }
    }

    /// The reserved size charged so far.
    pub fn charged(&self) -> u64 {
        self.charged.load(Ordering::Acquire)
    }

    /// Takes the pool's lock, waiting for another thread's accounting step (which holds it
    /// across one driver allocation).
    pub fn lock(&self) -> PoolGuard<'_> {
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        PoolGuard(self)
    }

    /// Takes the pool's lock if it is free.
    pub fn try_lock(&self) -> Option<PoolGuard<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Made only on success: a guard dropped unused would free another holder's lock.
            .then(|| PoolGuard(self))
    }

    /// Records the reading `reserved` as the pool's charge; returns the change. Called with
    /// the pool's lock held (the guard proves it), so readings are applied in the order taken.
    pub fn set(&self, _held: &PoolGuard<'_>, reserved: u64) -> Delta {
        let old = self.charged.swap(reserved, Ordering::AcqRel);
        if reserved >= old {
            Delta::Grew(reserved - old)
        } else {
            Delta::Shrank(old - reserved)
        }
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

    /// In a forked child: frees every pool lock (the threads that held them are gone).
    pub fn after_fork_child(&self) {
        for e in &self.entries {
            e.busy.store(false, Ordering::Release);
        }
    }

    /// Every watched pool with its handle.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Entry)> {
        self.entries.iter().filter_map(|e| {
            let h = e.handle.load(Ordering::Acquire);
            (h != 0).then_some((h, e))
        })
    }
}

/// Pools whose memory freed on one stream is not reused on another before a synchronisation:
/// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC` and `…_ALLOW_INTERNAL_DEPENDENCIES` both off.
/// Empty in the common case, so the allocation path only reads a counter.
pub struct NoReuse {
    count: AtomicUsize,
    pools: Mutex<Vec<usize>>,
}

/// The process's pools without cross-stream reuse.
pub static NO_REUSE: NoReuse = NoReuse {
    count: AtomicUsize::new(0),
    pools: Mutex::new(Vec::new()),
};

impl NoReuse {
    /// Records whether `pool` reuses memory across streams.
    pub fn set(&self, pool: usize, reuse: bool) {
        let mut v = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|&p| p != pool);
        if !reuse {
            v.push(pool);
        }
        self.count.store(v.len(), Ordering::Release);
    }

    /// Whether `pool` does not reuse memory across streams.
    #[inline]
    pub fn contains(&self, pool: usize) -> bool {
        self.count.load(Ordering::Acquire) != 0
            && self
                .pools
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_report_growth_and_shrinkage_that_add_up() {
        let p = Pools::new();
        let e = p.register(0x10, 1).unwrap();
        let g = e.lock();
        let rows: &[(&str, u64, Delta)] = &[
            ("first reading charges everything", 6, Delta::Grew(6)),
            ("same size, no change", 6, Delta::Grew(0)),
            ("growth", 10, Delta::Grew(4)),
            ("trim", 2, Delta::Shrank(8)),
        ];
        for (what, reserved, want) in rows {
            assert_eq!(e.set(&g, *reserved), *want, "{what}");
        }
        assert_eq!(e.charged(), 2);
        assert_eq!(e.ord(), Some(1));
    }

    #[test]
    fn one_accounting_step_at_a_time_and_a_fork_frees_the_locks() {
        let p = Pools::new();
        let e = p.register(0x10, 0).unwrap();
        let g = e.lock();
        assert!(e.try_lock().is_none(), "held");
        assert!(
            e.try_lock().is_none(),
            "a failed try leaves the holder's lock alone"
        );
        assert_eq!(e.set(&g, 100), Delta::Grew(100));
        assert_eq!(e.set(&g, 40), Delta::Shrank(60));
        drop(g);
        assert!(e.try_lock().is_some(), "free again");
        // Sixteen threads each add 1000 one-unit growths under the lock: none is lost.
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        let g = e.lock();
                        let now = e.charged();
                        assert_eq!(e.set(&g, now + 1), Delta::Grew(1));
                    }
                });
            }
        });
        assert_eq!(e.charged(), 16_040);
        std::mem::forget(e.lock());
        assert!(e.try_lock().is_none());
        p.after_fork_child();
        assert!(e.try_lock().is_some(), "a child starts with the lock free");
    }

    #[test]
    fn register_find_remove_and_full_table() {
        let p = Pools::new();
        assert!(p.find(0x10).is_none(), "unknown pool");
        assert!(p.register(0, 0).is_none(), "null handle is never watched");
        let e = p.register(0x10, 0).unwrap();
        e.set(&e.lock(), 5);
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
