//! TEST-ONLY: simulated CUDA device memory: per-process accounting against the GPU's size,
//! plain allocations (`cuMemAlloc*`, `cuMemCreate`), frees, `cuMemGetInfo`, the allocation
//! granularity, and two test-only probes of what happened underneath an interposer
//! (`gpushare_sim_mem_peak`, `gpushare_sim_last_free`).

use super::device_memory::{device_give, device_take, new_ptr, LAST_FREE, PEAK};
use super::guesses;
use super::{
    current_ctx, dev_index, enter, put, record, with_driver, Alloc, CuDevicePtr, CuResult, Driver,
    INVALID_VALUE, OUT_OF_MEMORY, SUCCESS,
};
use crate::config::{self, config};
use crate::state;
use cuda_abi::{MemAllocationProp, ALLOCATION_PINNED, LOCATION_DEVICE};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

/// Granularity of `cuMemCreate` sizes (`cuMemGetAllocationGranularity`), as on current GPUs.
pub const GRANULARITY: u64 = guesses::VMM_GRANULARITY;

fn alloc_on(dev: usize, size: u64, ctx: usize) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    device_take(dev, size)?;
    let ptr = new_ptr(size);
    with_driver(|d| d.allocs.insert(ptr, Alloc { dev, size, ctx }));
    Ok(ptr)
}

/// Frees every allocation and array context `ctx` owns (the driver does so when a context is
/// destroyed). The caller holds the driver lock.
pub(super) fn free_owned_by(d: &mut Driver, ctx: usize) {
    d.allocs.retain(|_, a| {
        if a.ctx == ctx {
            device_give(a.dev, a.size);
        }
        a.ctx != ctx
    });
    d.arrays.retain(|_, a| {
        if a.ctx == ctx {
            device_give(a.dev, a.size);
        }
        a.ctx != ctx
    });
}

pub(super) fn free_ptr(ptr: u64) -> CuResult {
    LAST_FREE.store(ptr, Ordering::Relaxed);
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
            Some(a) => {
                device_give(a.dev, a.size);
                SUCCESS
            }
            // Graph memory goes back to the device's graph pool.
            None if super::graphs::free_graph_ptr(d, ptr) => SUCCESS,
            None => INVALID_VALUE,
        }
    })
}

fn alloc_current(name: &str, dptr: *mut CuDevicePtr, size: u64) -> CuResult {
    tri!(enter(name));
    let (ctx, dev) = tri!(current_ctx());
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let p = tri!(alloc_on(dev, size, ctx));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { dptr.write(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    alloc_current("cuMemAlloc_v2", dptr, size as u64)
}

/// A legacy allocation of `size` bytes on the current context: a pointer that fits in 32 bits.
fn alloc32(name: &str, size: u64) -> Result<u32, CuResult> {
    enter(name)?;
    let (ctx, dev) = current_ctx()?;
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    device_take(dev, size)?;
    let step = size.div_ceil(512) * 512;
    with_driver(|d| {
        // The lowest gap between the live 32-bit allocations (guesses.rs).
        let mut live: Vec<(u64, u64)> = d
            .allocs
            .iter()
            .filter(|(&p, _)| p < 1 << 32)
            .map(|(&p, a)| (p, a.size.div_ceil(512) * 512))
            .collect();
        live.sort_unstable();
        let mut at = guesses::LEGACY_PTR_BASE;
        for (p, len) in live {
            if p >= at + step {
                break;
            }
            at = at.max(p + len);
        }
        match u32::try_from(at + step) {
            Ok(_) => {
                d.allocs.insert(at, Alloc { dev, size, ctx });
                Ok(at as u32)
            }
            Err(_) => {
                device_give(dev, size);
                Err(OUT_OF_MEMORY)
            }
        }
    })
}

/// The CUDA < 3.2 `cuMemAlloc(CUdeviceptr_v1 *, unsigned int)`: a 32-bit pointer and size.
///
/// # Safety
/// `dptr` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut u32, size: c_uint) -> CuResult {
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let p = tri!(alloc32("cuMemAlloc", u64::from(size)));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { dptr.write(p) };
    SUCCESS
}

/// The CUDA < 3.2 `cuMemAllocPitch`: 32-bit pointer, pitch and sizes, rows padded like `_v2`.
///
/// # Safety
/// `dptr` and `pitch` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut u32,
    pitch: *mut u32,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CuResult {
    if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) {
        return INVALID_VALUE;
    }
    let align = config().pitch_align;
    let p = u64::from(width).div_ceil(align) * align;
    let Ok(p32) = u32::try_from(p) else {
        return INVALID_VALUE;
    };
    let ptr = tri!(alloc32("cuMemAllocPitch", p * u64::from(height)));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe {
        dptr.write(ptr);
        pitch.write(p32);
    }
    SUCCESS
}

/// The CUDA < 3.2 `cuMemFree(CUdeviceptr_v1)`.
#[no_mangle]
pub extern "C" fn cuMemFree(ptr: u32) -> CuResult {
    tri!(enter("cuMemFree"));
    free_ptr(u64::from(ptr))
}

/// The CUDA < 3.2 `cuMemGetInfo(unsigned int *, unsigned int *)`: both clamped to 32 bits (a
/// guess, see `guesses.rs`).
///
/// # Safety
/// `free` and `total` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CuResult {
    tri!(enter("cuMemGetInfo"));
    // Not through the exported cuMemGetInfo_v2, which an interposer may wrap.
    let (f, t) = tri!(mem_info());
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    // SAFETY: checked non-null; writable per the caller.
    unsafe {
        free.write(clamp(f));
        total.write(clamp(t));
    }
    SUCCESS
}

/// # Safety
/// `pitch` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CuResult {
    tri!(enter("cuMemAllocPitch_v2"));
    if pitch.is_null() || !matches!(elem, 4 | 8 | 16) {
        return INVALID_VALUE;
    }
    let align = config().pitch_align;
    let p = (width as u64).div_ceil(align).saturating_mul(align);
    let Some(size) = p.checked_mul(height as u64) else {
        return INVALID_VALUE;
    };
    let r = alloc_current("cuMemAllocPitch_v2", dptr, size);
    if r == SUCCESS {
        // SAFETY: checked non-null; writable per the caller.
        unsafe { pitch.write(p as usize) };
    }
    r
}

#[no_mangle]
pub extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    size: usize,
    _flags: c_uint,
) -> CuResult {
    alloc_current("cuMemAllocManaged", dptr, size as u64)
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: CuDevicePtr) -> CuResult {
    tri!(enter("cuMemFree_v2"));
    free_ptr(ptr)
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
    if handle.is_null() || prop.is_null() || !(size as u64).is_multiple_of(GRANULARITY) {
        return INVALID_VALUE;
    }
    // SAFETY: non-null; valid per the caller.
    let prop = unsafe { &*prop };
    if prop.kind != ALLOCATION_PINNED || prop.location_type != LOCATION_DEVICE {
        return INVALID_VALUE;
    }
    let dev = tri!(dev_index(prop.location_id));
    let h = tri!(alloc_on(dev, size as u64, 0));
    // SAFETY: checked non-null.
    unsafe { handle.write(h) };
    SUCCESS
}

/// # Safety
/// `granularity` null or writable; `prop` null or a valid `CUmemAllocationProp`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const MemAllocationProp,
    option: c_uint,
) -> CuResult {
    tri!(enter("cuMemGetAllocationGranularity"));
    if prop.is_null() || option > 1 {
        return INVALID_VALUE;
    }
    // SAFETY: non-null; valid per the caller.
    let prop = unsafe { &*prop };
    if prop.location_type != LOCATION_DEVICE {
        return INVALID_VALUE;
    }
    tri!(dev_index(prop.location_id));
    // SAFETY: `granularity` is null or valid for one write of its type, as this function's
    // `# Safety` requires of the caller; `put` refuses null.
    unsafe { put(granularity, GRANULARITY as usize) }
}

/// # Safety
/// `free` and `total` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    tri!(enter("cuMemGetInfo_v2"));
    let (f, t) = tri!(mem_info());
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the caller.
    unsafe {
        free.write(f);
        total.write(t);
    }
    SUCCESS
}

/// Free and total memory of the current context's device, capped by the hard memory limit of
/// this process's cgroup if one applies (memlimits.rs), then by its MPS client limit (mps.rs).
fn mem_info() -> Result<(usize, usize), CuResult> {
    let (_, dev) = current_ctx()?;
    let t = config().devices[dev];
    let (total, free) = crate::memlimits::view(dev, t, state::used_on(dev).min(t));
    let own = record(dev).map_or(0, |r| r.mem_used.load(Ordering::Relaxed));
    let (total, free) = crate::mps::view(dev, total, free, own);
    Ok((free as usize, total as usize))
}

/// TEST-ONLY probe (not a CUDA entry point): the most device memory this process has held at
/// once on GPU `dev`, as the simulated driver counted it underneath any interposer.
#[no_mangle]
pub extern "C" fn gpushare_sim_mem_peak(dev: c_int) -> u64 {
    usize::try_from(dev)
        .ok()
        .and_then(|d| PEAK.get(d))
        .map_or(0, |p| p.load(Ordering::Relaxed))
}

/// TEST-ONLY probe (not a CUDA entry point): the device memory this process holds now on GPU
/// `dev`, as the simulated driver counts it underneath any interposer.
#[no_mangle]
pub extern "C" fn gpushare_sim_mem_used(dev: c_int) -> u64 {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < config::MAX_DEVICES)
        .and_then(record)
        .map_or(0, |r| r.mem_used.load(Ordering::Relaxed))
}

/// TEST-ONLY probe (not a CUDA entry point): the pointer or handle the last free entry point
/// (`cuMemFree_v2`, `cuMemFreeAsync`, `cuMemRelease`) received, exactly as it arrived.
#[no_mangle]
pub extern "C" fn gpushare_sim_last_free() -> u64 {
    LAST_FREE.load(Ordering::Relaxed)
}
