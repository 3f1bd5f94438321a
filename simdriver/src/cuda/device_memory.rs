//! TEST-ONLY: the simulated device memory of this process: what it holds per GPU against the
//! GPU's size (and the r615 cgroup limit and the MPS client limit), the most it held, the last
//! pointer passed to a free entry point, and new device addresses. Every allocation path
//! (plain, pools, graphs, arrays, VMM) takes and gives back memory here.

use super::{record, CuResult, NEXT_PTR, OUT_OF_MEMORY};
use crate::config::{self, config};
use crate::state;
use std::sync::atomic::{AtomicU64, Ordering};

fn others_used(dev: usize) -> u64 {
    let own = record(dev).map_or(0, |r| r.mem_used.load(Ordering::Relaxed));
    state::used_on(dev).saturating_sub(own)
}

/// Cached "memory used by other processes" per device, refreshed every 100 ms.
static OTHERS: [(AtomicU64, AtomicU64); config::MAX_DEVICES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; config::MAX_DEVICES];

/// Most device memory this process has held at once, per GPU.
pub(super) static PEAK: [AtomicU64; config::MAX_DEVICES] =
    [const { AtomicU64::new(0) }; config::MAX_DEVICES];

/// The last pointer or handle passed to a free entry point.
pub(super) static LAST_FREE: AtomicU64 = AtomicU64::new(0);

fn others_used_cached(dev: usize) -> u64 {
    let (val, at) = &OTHERS[dev];
    let now = state::now_ns();
    if now.saturating_sub(at.load(Ordering::Relaxed)) > 100_000_000 {
        val.store(others_used(dev), Ordering::Relaxed);
        at.store(now, Ordering::Relaxed);
    }
    val.load(Ordering::Relaxed)
}

/// Takes `size` bytes of GPU `dev` for this process, or `CUDA_ERROR_OUT_OF_MEMORY`.
pub(super) fn device_take(dev: usize, size: u64) -> Result<(), CuResult> {
    let total = config().devices[dev];
    let rec = record(dev);
    let own = rec.map_or(0, |r| r.mem_used.load(Ordering::Relaxed));
    if own
        .saturating_add(others_used_cached(dev))
        .saturating_add(size)
        > total
    {
        return Err(OUT_OF_MEMORY);
    }
    // The r615 cgroup hard limit (memlimits.rs): every allocation path comes through here.
    if !crate::memlimits::fits(dev, size) {
        return Err(OUT_OF_MEMORY);
    }
    // The MPS client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT on its own use (mps.rs).
    if !crate::mps::fits(dev, own, size) {
        return Err(OUT_OF_MEMORY);
    }
    if let Some(r) = rec {
        let now = r.mem_used.fetch_add(size, Ordering::Relaxed) + size;
        PEAK[dev].fetch_max(now, Ordering::Relaxed);
    }
    Ok(())
}

/// Gives `size` bytes of GPU `dev` back.
pub(super) fn device_give(dev: usize, size: u64) {
    if size == 0 {
        return;
    }
    if let Some(r) = record(dev) {
        let _ = r
            .mem_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(size))
            });
    }
}

pub(super) fn new_ptr(size: u64) -> u64 {
    NEXT_PTR.fetch_add(size.div_ceil(512).max(1) * 512, Ordering::Relaxed)
}
