//! Exported wrappers for stream-ordered allocation: `cuMemAllocAsync`,
//! `cuMemAllocFromPoolAsync` (and `_ptsz`), and the calls after which a pool may have shrunk
//! (`cuMemPoolTrimTo`, `cuMemPoolDestroy`, `cuCtxSynchronize`, `cuStreamSynchronize`).
//!
//! What counts is a pool's *reserved* memory (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, read from
//! the real driver), not the requests: memory a pool keeps after `cuMemFreeAsync` (up to its
//! release threshold) stays counted until the pool releases it. Before an allocation the
//! limiter refuses it with `CUDA_ERROR_OUT_OF_MEMORY` when `request − the pool's free reserved
//! memory` does not fit under the cap; after it, the pool's growth (new reading − last charged
//! reading, [`crate::pools`]) is charged. Every other result is the driver's own `CUresult`.
#![allow(clippy::too_many_arguments)]

use crate::cuda::{self, extra_fn, read_ptr, real, CuResult, Opaque, NOT_INITIALIZED};
use crate::cuda::{OUT_OF_MEMORY, SUCCESS};
use crate::interpose::{self, extra, H};
use crate::limits::MAX_DEVICES;
use crate::pools::{Delta, Entry, NOT_DEVICE, POOLS};
use crate::state::{self, Kind, Limiter};
use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::atomic::AtomicPtr;

/// `CUmemPool_attribute` values (cuda.h).
const ATTR_RESERVED_MEM_CURRENT: c_int = 5;
const ATTR_USED_MEM_CURRENT: c_int = 7;

static POOL_GET_ATTRIBUTE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DEVICE_GET_MEM_POOL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DEVICE_GET_DEFAULT_MEM_POOL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// A `cuuint64_t` attribute of `pool` from the real driver.
fn attr(pool: usize, which: c_int) -> Option<u64> {
    let p = extra_fn(&POOL_GET_ATTRIBUTE, extra::CU_MEM_POOL_GET_ATTRIBUTE);
    if p.is_null() {
        return None;
    }
    // SAFETY: the driver's cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void*).
    let f = unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(Opaque, c_int, *mut c_void) -> CuResult,
        >(p)
    };
    let mut v: u64 = 0;
    // SAFETY: both attributes asked for here are cuuint64_t; `v` is a valid out-pointer.
    (unsafe { f(pool as Opaque, which, (&mut v as *mut u64).cast()) } == SUCCESS).then_some(v)
}

/// `cuDeviceGetMemPool` (current pool) or `cuDeviceGetDefaultMemPool` of ordinal `ord`.
fn device_pool(slot: &AtomicPtr<c_void>, name: &CStr, ord: usize) -> Option<usize> {
    let p = extra_fn(slot, name);
    if p.is_null() {
        return None;
    }
    // SAFETY: both functions are CUresult f(CUmemoryPool*, CUdevice).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Opaque, c_int) -> CuResult>(p)
    };
    let mut pool: Opaque = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer.
    let r = unsafe { f(&mut pool, c_int::try_from(ord).ok()?) };
    (r == SUCCESS && !pool.is_null()).then_some(pool as usize)
}

/// The device of a pool the limiter has not seen created: the one whose default or current
/// pool it is.
fn device_of(pool: usize) -> Option<usize> {
    (0..MAX_DEVICES)
        .map_while(|ord| {
            let default = device_pool(
                &DEVICE_GET_DEFAULT_MEM_POOL,
                extra::CU_DEVICE_GET_DEFAULT_MEM_POOL,
                ord,
            )?;
            let current = device_pool(&DEVICE_GET_MEM_POOL, extra::CU_DEVICE_GET_MEM_POOL, ord);
            Some((ord, default == pool || current == Some(pool)))
        })
        .find_map(|(ord, hit)| hit.then_some(ord))
}

/// Applies a pool size change to the shared accounting (capped devices only).
fn apply(l: &Limiter, ord: usize, d: Delta) {
    if l.mem_limit(ord).is_none() {
        return;
    }
    match d {
        Delta::Grew(b) => l.charge(ord, b),
        Delta::Shrank(b) => l.credit(ord, b),
    }
}

/// Re-reads the reserved size of `pool` and charges or credits the change.
fn resync(l: &Limiter, pool: usize, e: &Entry) {
    if let (Some(ord), Some(reserved)) = (e.ord(), attr(pool, ATTR_RESERVED_MEM_CURRENT)) {
        apply(l, ord, e.update(reserved));
    }
}

/// Re-reads every watched pool (after a synchronisation, when pools release memory).
fn resync_all() {
    if let Some(l) = state::get().filter(|l| l.limits.any_mem()) {
        for (pool, e) in POOLS.iter() {
            resync(l, pool, e);
        }
    }
}

/// A stream-ordered allocation from `pool` (`None`: the current device's current pool).
fn counted_async(
    size: u64,
    pool: Option<Opaque>,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let Some(l) = state::get().filter(|l| l.limits.any_mem()) else {
        return call();
    };
    let found = match pool {
        None => cuda::current_ordinal().and_then(|ord| {
            let p = device_pool(&DEVICE_GET_MEM_POOL, extra::CU_DEVICE_GET_MEM_POOL, ord)?;
            Some((p, Some(ord)))
        }),
        Some(p) if p.is_null() => return call(),
        Some(p) => Some((p as usize, None)),
    };
    let entry = found.and_then(|(pool, ord)| {
        let e = POOLS.find(pool).or_else(|| {
            let ord = ord
                .or_else(|| device_of(pool))
                .or_else(cuda::current_ordinal)?;
            POOLS.register(pool, u32::try_from(ord).ok()?)
        })?;
        Some((pool, e))
    });
    // No pool to watch (driver without pool queries, table full): count the request.
    let Some((pool, e)) = entry else {
        return cuda::counted_current(size, call, key);
    };
    let Some(ord) = e.ord() else {
        return call();
    };
    if l.mem_limit(ord).is_none() {
        return call();
    }
    let (Some(reserved), Some(used)) = (
        attr(pool, ATTR_RESERVED_MEM_CURRENT),
        attr(pool, ATTR_USED_MEM_CURRENT),
    ) else {
        return cuda::counted(ord, size, Kind::Ptr, call, key);
    };
    apply(l, ord, e.update(reserved));
    // The most the pool can grow by: the request less its free reserved memory.
    let need = size.saturating_sub(reserved.saturating_sub(used));
    let ticket = if need == 0 {
        None
    } else {
        match l.reserve(ord, need) {
            Ok(t) => t,
            Err(()) => return OUT_OF_MEMORY,
        }
    };
    let r = call();
    if r == SUCCESS {
        resync(l, pool, e);
    }
    if let Some(t) = ticket {
        l.unreserve(t);
    }
    r
}

type AllocStreamFn = unsafe extern "C" fn(*mut u64, usize, Opaque) -> CuResult;
type AllocPoolFn = unsafe extern "C" fn(*mut u64, usize, Opaque, Opaque) -> CuResult;
type SyncStreamFn = unsafe extern "C" fn(Opaque) -> CuResult;

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Opaque) -> CuResult {
    let f = real!(cuMemAllocAsync as AllocStreamFn);
    // SAFETY: forwarded caller contract.
    counted_async(
        size as u64,
        None,
        || unsafe { f(dptr, size, stream) },
        || read_ptr(dptr),
    )
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    stream: Opaque,
) -> CuResult {
    let f = real!(cuMemAllocAsync_ptsz as AllocStreamFn);
    // SAFETY: forwarded caller contract.
    counted_async(
        size as u64,
        None,
        || unsafe { f(dptr, size, stream) },
        || read_ptr(dptr),
    )
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    size: usize,
    pool: Opaque,
    stream: Opaque,
) -> CuResult {
    let f = real!(cuMemAllocFromPoolAsync as AllocPoolFn);
    // SAFETY: forwarded caller contract.
    counted_async(
        size as u64,
        Some(pool),
        || unsafe { f(dptr, size, pool, stream) },
        || read_ptr(dptr),
    )
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    pool: Opaque,
    stream: Opaque,
) -> CuResult {
    let f = real!(cuMemAllocFromPoolAsync_ptsz as AllocPoolFn);
    // SAFETY: forwarded caller contract.
    counted_async(
        size as u64,
        Some(pool),
        || unsafe { f(dptr, size, pool, stream) },
        || read_ptr(dptr),
    )
}

/// Head of `CUmemPoolProps`: allocation type, handle types, location {type, id}.
#[repr(C)]
pub struct MemPoolPropsHead {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Opaque,
    props: *const MemPoolPropsHead,
) -> CuResult {
    let f = real!(
        cuMemPoolCreate as unsafe extern "C" fn(*mut Opaque, *const MemPoolPropsHead) -> CuResult
    );
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(pool, props) };
    if r != SUCCESS || pool.is_null() || props.is_null() {
        return r;
    }
    let Some(l) = state::get().filter(|l| l.limits.any_mem()) else {
        return r;
    };
    // SAFETY: the driver accepted both; they are valid per the caller.
    let (handle, props) = unsafe { (*pool as usize, &*props) };
    const LOCATION_DEVICE: c_uint = 1;
    let ord = if props.location_type == LOCATION_DEVICE {
        u32::try_from(props.location_id).unwrap_or(NOT_DEVICE)
    } else {
        NOT_DEVICE
    };
    // A handle still watched belonged to a pool whose destruction the limiter missed.
    if let Some((Some(o), charged)) = POOLS.remove(handle) {
        apply(l, o, Delta::Shrank(charged));
    }
    POOLS.register(handle, ord);
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Opaque) -> CuResult {
    let f = real!(cuMemPoolDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    let watched = state::get().is_some() && POOLS.find(pool as usize).is_some();
    let used = if watched {
        attr(pool as usize, ATTR_USED_MEM_CURRENT)
    } else {
        None
    };
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(pool) };
    if r != SUCCESS || !watched {
        return r;
    }
    if let (Some(l), Some((Some(ord), charged))) = (state::get(), POOLS.remove(pool as usize)) {
        // Allocations still outstanding keep their memory (CUDA destroys the pool when they
        // are freed); the handle is gone, so that part stays counted until the process exits.
        let keep = used.unwrap_or(charged).min(charged);
        apply(l, ord, Delta::Shrank(charged - keep));
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Opaque, keep: usize) -> CuResult {
    let f = real!(cuMemPoolTrimTo as unsafe extern "C" fn(Opaque, usize) -> CuResult);
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(pool, keep) };
    if r == SUCCESS {
        if let (Some(l), Some(e)) = (state::get(), POOLS.find(pool as usize)) {
            resync(l, pool as usize, e);
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CuResult {
    let f = real!(cuCtxSynchronize as unsafe extern "C" fn() -> CuResult);
    // SAFETY: forwarded caller contract.
    let r = unsafe { f() };
    if r == SUCCESS {
        resync_all();
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Opaque) -> CuResult {
    let f = real!(cuStreamSynchronize as SyncStreamFn);
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(stream) };
    if r == SUCCESS {
        resync_all();
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: Opaque) -> CuResult {
    let f = real!(cuStreamSynchronize_ptsz as SyncStreamFn);
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(stream) };
    if r == SUCCESS {
        resync_all();
    }
    r
}
