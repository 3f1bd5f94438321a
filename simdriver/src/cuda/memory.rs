//! TEST-ONLY: simulated CUDA device memory: per-process accounting against the GPU's size,
//! plain allocations (`cuMemAlloc*`, `cuMemCreate`), frees and `cuMemGetInfo`.

use super::{
    current_dev, dev_index, enter, record, with_driver, CuDevicePtr, CuResult, INVALID_VALUE,
    NEXT_PTR, OUT_OF_MEMORY, SUCCESS,
};
use crate::config::{self, config};
use crate::state;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU64, Ordering};

fn others_used(dev: usize) -> u64 {
    let own = record(dev).map_or(0, |r| r.mem_used.load(Ordering::Relaxed));
    state::used_on(dev).saturating_sub(own)
}

/// Cached "memory used by other processes" per device, refreshed every 100 ms.
static OTHERS: [(AtomicU64, AtomicU64); config::MAX_DEVICES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; config::MAX_DEVICES];

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
    if let Some(r) = rec {
        r.mem_used.fetch_add(size, Ordering::Relaxed);
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
    NEXT_PTR.fetch_add(size.div_ceil(512) * 512, Ordering::Relaxed)
}

fn alloc_on(dev: usize, size: u64) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    device_take(dev, size)?;
    let ptr = new_ptr(size);
    with_driver(|d| d.allocs.insert(ptr, (dev, size)));
    Ok(ptr)
}

pub(super) fn free_ptr(ptr: u64) -> CuResult {
    if ptr == 0 {
        return SUCCESS;
    }
    with_driver(|d| {
        if let Some((pool, size)) = d.pool_allocs.remove(&ptr) {
            // Back to the pool; the reserved memory stays until a trim or synchronisation.
            if let Some(p) = d.pools.get_mut(&pool) {
                p.used = p.used.saturating_sub(size);
                if p.destroyed && p.used == 0 {
                    device_give(p.dev, p.reserved);
                    d.pools.remove(&pool);
                }
            }
            return SUCCESS;
        }
        match d.allocs.remove(&ptr) {
            Some((dev, size)) => {
                device_give(dev, size);
                SUCCESS
            }
            None => INVALID_VALUE,
        }
    })
}

fn alloc_current(name: &str, dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    tri!(enter(name));
    let dev = tri!(current_dev());
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let p = tri!(alloc_on(dev, size as u64));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { dptr.write(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    alloc_current("cuMemAlloc_v2", dptr, size)
}

/// # Safety
/// `pitch` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _elem: c_uint,
) -> CuResult {
    if pitch.is_null() {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    let r = alloc_current("cuMemAllocPitch_v2", dptr, p.saturating_mul(height));
    if r == SUCCESS {
        // SAFETY: checked non-null; writable per the caller.
        unsafe { pitch.write(p) };
    }
    r
}

#[no_mangle]
pub extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    size: usize,
    _flags: c_uint,
) -> CuResult {
    alloc_current("cuMemAllocManaged", dptr, size)
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: CuDevicePtr) -> CuResult {
    tri!(enter("cuMemFree_v2"));
    free_ptr(ptr)
}

/// `CUmemAllocationProp` head: type, requested handle types, location {type, id}.
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// # Safety
/// `handle` null or writable; `prop` null or a valid `CUmemAllocationProp`.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    _flags: u64,
) -> CuResult {
    tri!(enter("cuMemCreate"));
    if handle.is_null() || prop.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null; valid per the caller.
    let id = unsafe { (*prop).location_id };
    let dev = tri!(dev_index(id));
    let h = tri!(alloc_on(dev, size as u64));
    // SAFETY: checked non-null.
    unsafe { handle.write(h) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    tri!(enter("cuMemRelease"));
    if handle == 0 {
        return INVALID_VALUE;
    }
    free_ptr(handle)
}

/// # Safety
/// `free` and `total` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    tri!(enter("cuMemGetInfo_v2"));
    let dev = tri!(current_dev());
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    let t = config().devices[dev];
    let used = state::used_on(dev).min(t);
    // SAFETY: checked non-null; writable per the caller.
    unsafe {
        free.write((t - used) as usize);
        total.write(t as usize);
    }
    SUCCESS
}
