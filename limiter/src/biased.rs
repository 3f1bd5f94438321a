//! A lock biased to one thread: the first thread that takes it (in practice, the thread that
//! makes a program's allocations) enters and leaves it with plain stores and loads, where any
//! lock costs an atomic read-modify-write (several nanoseconds, the largest part of what the
//! limiter adds to an allocation). The first time another thread wants it, that thread revokes
//! the bias for good: it publishes the revocation, runs a full memory barrier on every thread
//! of the process (`membarrier(2)`, [`sys::heavy_barrier`]) and waits for the owner to leave;
//! from then on every thread takes the inner spin lock. Where `membarrier` is not allowed
//! (kernels before 4.14, a seccomp filter) the lock is never biased.
//!
//! Why the owner needs no fence (the asymmetric Dekker pattern of liburcu and folly): the owner
//! stores "inside" and then loads the owner word; the revoker stores "revoked", then the
//! barrier runs on the owner's CPU somewhere in the owner's program: before the owner's load
//! (which then sees "revoked" and the owner backs off to the inner lock), or after its store
//! (which the revoker then sees, and waits for the owner to leave).

use crate::sys;
use spin::mutex::{SpinMutex, SpinMutexGuard};
use spin::relax::Yield;
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};

/// [`Biased::owner`] before any thread took the lock.
const UNSET: usize = 0;
/// [`Biased::owner`] once the bias is gone (or was never possible): the inner lock only.
const REVOKED: usize = usize::MAX;

pub struct Biased<T> {
    /// The thread the lock is biased to ([`sys::thread_id`]), [`UNSET`] or [`REVOKED`].
    owner: AtomicUsize,
    /// The owner is inside (written by the owner thread only).
    owner_in: AtomicBool,
    /// Taken by every thread but the owner, and by all once the bias is revoked.
    inner: SpinMutex<(), Yield>,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, and guards exclude each other (the module's
// documentation); `T: Send` is what a `Mutex<T>` asks for the same.
unsafe impl<T: Send> Sync for Biased<T> {}
// SAFETY: as for `Mutex<T>`.
unsafe impl<T: Send> Send for Biased<T> {}

/// Access to the data; dropping it leaves the lock.
pub struct Guard<'a, T> {
    lock: &'a Biased<T>,
    /// `None`: entered as the owner.
    inner: Option<SpinMutexGuard<'a, ()>>,
}

impl<T> Biased<T> {
    pub const fn new(data: T) -> Biased<T> {
        Biased {
            owner: AtomicUsize::new(UNSET),
            owner_in: AtomicBool::new(false),
            inner: SpinMutex::new(()),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock.
    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        let me = sys::thread_id();
        if self.owner.load(Ordering::Relaxed) == me {
            self.owner_in.store(true, Ordering::Relaxed);
            // The CPU may still let the load below pass the store: the revoker's barrier
            // covers that (the module's documentation); the compiler may not.
            compiler_fence(Ordering::SeqCst);
            if self.owner.load(Ordering::Relaxed) == me {
                compiler_fence(Ordering::SeqCst);
                return Guard {
                    lock: self,
                    inner: None,
                };
            }
            // Revoked meanwhile: out, and through the inner lock.
            self.owner_in.store(false, Ordering::Release);
        }
        self.lock_slow(me)
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self, me: usize) -> Guard<'_, T> {
        let inner = self.inner.lock();
        match self.owner.load(Ordering::Acquire) {
            REVOKED => {}
            UNSET => {
                // The first thread in: bias to it if the barrier the revocation needs exists.
                // It holds the inner lock now, so no one else can be inside.
                let next = if sys::register_heavy_barrier() {
                    me
                } else {
                    REVOKED
                };
                self.owner.store(next, Ordering::SeqCst);
            }
            owner if owner == me => {}
            _ => self.revoke(),
        }
        Guard {
            lock: self,
            inner: Some(inner),
        }
    }

    /// Takes the bias away from its owner (the inner lock held): from now on the owner too
    /// takes the inner lock, and the owner is not inside when this returns.
    #[cold]
    fn revoke(&self) {
        self.owner.store(REVOKED, Ordering::SeqCst);
        if !sys::heavy_barrier() {
            // Registered when the bias was given, so this does not fail; should it, the owner
            // still sees the revocation at its next entry and the wait below covers one that
            // is inside and visible.
            sys::warn("membarrier failed while revoking a biased lock");
        }
        while self.owner_in.load(Ordering::Acquire) {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
    }

    /// In the child after `fork`, where only the forking thread runs: no owner, and the
    /// membarrier registration (which does not survive `fork`) asked for again at the next bias.
    /// An owner that was inside at the fork (another thread, gone in the child) stays inside:
    /// the data may be half-changed, and the child waits on it as on any lock held at a fork.
    pub fn after_fork_child(&self) {
        if !self.owner_in.load(Ordering::SeqCst) {
            self.owner.store(UNSET, Ordering::SeqCst);
        }
    }

    /// Whether the lock is biased to the calling thread (for tests).
    pub fn biased_to_me(&self) -> bool {
        self.owner.load(Ordering::Acquire) == sys::thread_id()
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.inner.is_none() {
            self.lock.owner_in.store(false, Ordering::Release);
        }
        // Otherwise the inner guard, dropped after this, leaves the inner lock.
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard excludes every other (the module's documentation).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference from the guard.
        unsafe { &mut *self.lock.data.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::Biased;
    use std::sync::Arc;

    /// Increments from the biased owner and from other threads at once lose nothing (a
    /// plain read-then-write under the lock, so two threads inside at once would lose counts).
    #[test]
    fn owner_and_other_threads_exclude_each_other() {
        let lock = Arc::new(Biased::new(0u64));
        *lock.lock() += 1;
        assert!(
            lock.biased_to_me() || !crate::sys::register_heavy_barrier(),
            "the first thread gets the bias where membarrier is allowed"
        );
        const N: u64 = 200_000;
        let others: Vec<_> = (0..3)
            .map(|_| {
                let l = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..N {
                        let mut g = l.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for _ in 0..N {
            let mut g = lock.lock();
            let v = *g;
            std::hint::black_box(&v);
            *g = v + 1;
        }
        for t in others {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 1 + 4 * N, "no increment lost");
        assert!(!lock.biased_to_me(), "another thread revoked the bias");
    }

    /// A lock only ever taken by one thread stays biased to it.
    #[test]
    fn one_thread_keeps_the_bias() {
        let lock = Biased::new(Vec::new());
        for i in 0..1000 {
            lock.lock().push(i);
        }
        assert_eq!(lock.lock().len(), 1000);
        if crate::sys::register_heavy_barrier() {
            assert!(lock.biased_to_me());
        }
    }
}
