//! Exported wrappers for stream-ordered allocation: `cuMemAllocAsync`,
//! `cuMemAllocFromPoolAsync` (and `_ptsz`), and the calls after which a pool may have shrunk
//! (`cuMemPoolTrimTo`, `cuMemPoolDestroy`; `cuCtxSynchronize` and `cuStreamSynchronize` live
//! in `launch.rs`; they and `cuMemPoolTrimTo` run through `shrinking`).
//!
//! What counts is a pool's *reserved* memory (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, read from
//! the real driver), not the requests: memory a pool keeps after `cuMemFreeAsync` (up to its
//! release threshold) stays counted until the pool releases it. Under the pool's lock
//! ([`crate::pools`]), an allocation reads the pool, refuses with `CUDA_ERROR_OUT_OF_MEMORY`
//! when `request − the pool's free reserved memory` does not fit under the cap, allocates, and
//! charges the pool's new reading; a synchronisation or trim re-reads the pools afterwards.
//! Every reading replaces the charge in the order it was taken, so a trim in another thread
//! can never be applied over a growth it did not see. Every other result is the driver's own
//! `CUresult`.

use crate::driver::cuda::{self as drv, Opaque};
use crate::driver::real;
use crate::memory::{self, read_ptr};
use crate::pools::{Delta, Entry, NOT_DEVICE, NO_REUSE, POOLS};
use crate::state::{self, Kind, Limiter};
use cuda_abi::pool_attr::{
    RESERVED_MEM_CURRENT as ATTR_RESERVED_MEM_CURRENT, REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    REUSE_ALLOW_OPPORTUNISTIC, USED_MEM_CURRENT as ATTR_USED_MEM_CURRENT,
};
use cuda_abi::result::{OUT_OF_MEMORY, SUCCESS};
use cuda_abi::{CuResult, MemPoolPropsHead, LOCATION_DEVICE};
use std::cell::Cell;
use std::ffi::{c_int, c_void};

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

/// Re-reads the reserved size of `pool` and charges or credits the change. A pool whose lock
/// is held is left alone: the holder charges a reading taken after ours would have been, and
/// a change it missed is taken up by the pool's next reading.
fn resync(l: &Limiter, pool: usize, e: &Entry) {
    let Some(ord) = e.ord() else {
        return;
    };
    let Some(g) = e.try_lock() else {
        return;
    };
    if let Some(reserved) = drv::pool_attr(pool, ATTR_RESERVED_MEM_CURRENT) {
        apply(l, ord, e.set(&g, reserved));
    }
}

/// Runs a call after which pools may have shrunk (synchronisation, trim), then re-reads every
/// watched pool.
pub(crate) fn shrinking(call: impl FnOnce() -> CuResult) -> CuResult {
    let r = call();
    if r == SUCCESS {
        resync_all();
    }
    r
}

/// Re-reads every watched pool (after a synchronisation, when pools release memory).
pub(crate) fn resync_all() {
    if let Some(l) = state::get().filter(|l| l.any_mem) {
        for (pool, e) in POOLS.iter() {
            resync(l, pool, e);
        }
    }
}

thread_local! {
    /// Set while this thread holds a pool's lock: a driver that allocates from inside an
    /// allocation is passed through instead of waiting for the lock it holds.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// A stream-ordered allocation on `stream` from `pool` (`None`: the current pool of the
/// stream's device).
fn counted_async(
    size: u64,
    pool: Option<Opaque>,
    stream: Opaque,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let Some(l) = state::get().filter(|l| l.any_mem) else {
        return call();
    };
    if IN_POOL.with(Cell::get) {
        return call();
    }
    // Under stream capture nothing is allocated: the allocation becomes a node of the graph,
    // whose memory is counted when the graph is launched (graphs.rs).
    if drv::capturing(stream as usize) {
        return call();
    }
    let found = match pool {
        None => drv::stream_ordinal(stream as usize)
            .and_then(|ord| Some((drv::current_pool(ord)?, Some(ord)))),
        Some(p) if p.is_null() => return call(),
        Some(p) => Some((p as usize, None)),
    };
    let entry = found.and_then(|(pool, ord)| {
        let e = POOLS.find(pool).or_else(|| {
            let ord = ord
                .or_else(|| drv::device_of_pool(pool))
                .or_else(drv::current_ordinal)?;
            POOLS.register(pool, u32::try_from(ord).ok()?)
        })?;
        Some((pool, e))
    });
    // No pool to watch (driver without pool queries, table full): count the request.
    let Some((pool, e)) = entry else {
        return memory::counted_current(size, call, key);
    };
    let Some(ord) = e.ord() else {
        return call();
    };
    if l.mem_limit(ord).is_none() {
        return call();
    }
    let g = e.lock();
    let (Some(reserved), Some(used)) = (
        drv::pool_attr(pool, ATTR_RESERVED_MEM_CURRENT),
        drv::pool_attr(pool, ATTR_USED_MEM_CURRENT),
    ) else {
        drop(g);
        return memory::counted(
            ord,
            drv::current().map_or(0, |(c, _)| c),
            size,
            Kind::Ptr,
            call,
            key,
        );
    };
    // Whatever changed since the last reading (a trim in a synchronisation) first.
    apply(l, ord, e.set(&g, reserved));
    // The most the pool can grow by: the request less its free reserved memory, or all of it
    // when memory freed on another stream may not be reused before a synchronisation.
    let need = if NO_REUSE.contains(pool) {
        size
    } else {
        size.saturating_sub(reserved.saturating_sub(used))
    };
    let ticket = if need == 0 {
        None
    } else {
        match l.reserve(ord, need) {
            Ok(t) => t,
            Err(()) => return OUT_OF_MEMORY,
        }
    };
    IN_POOL.with(|f| f.set(true));
    let r = call();
    IN_POOL.with(|f| f.set(false));
    if r == SUCCESS {
        match drv::pool_attr(pool, ATTR_RESERVED_MEM_CURRENT) {
            Some(now) => apply(l, ord, e.set(&g, now)),
            // No reading: charge the most it can have grown by; the next reading corrects it.
            None => apply(l, ord, e.set(&g, reserved + need)),
        }
    }
    drop(g);
    if let Some(t) = ticket {
        l.unreserve(t);
    }
    r
}

type AllocStreamFn = unsafe extern "C" fn(*mut u64, usize, Opaque) -> CuResult;
type AllocPoolFn = unsafe extern "C" fn(*mut u64, usize, Opaque, Opaque) -> CuResult;

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Opaque) -> CuResult {
    let f = real!(cuMemAllocAsync as AllocStreamFn);
    // SAFETY: `f` is the driver's own `cuMemAllocAsync`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `dptr` null or writable as the documentation of `cuMemAllocAsync` says (the
    // driver refuses null); handles are the driver's to check.
    counted_async(
        size as u64,
        None,
        stream,
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
    // SAFETY: `f` is the driver's own `cuMemAllocAsync_ptsz`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `dptr` null or writable as the documentation of `cuMemAllocAsync_ptsz`
    // says (the driver refuses null); handles are the driver's to check.
    counted_async(
        size as u64,
        None,
        stream,
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
    // SAFETY: `f` is the driver's own `cuMemAllocFromPoolAsync`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `dptr` null or writable as the documentation of
    // `cuMemAllocFromPoolAsync` says (the driver refuses null); handles are the driver's to check.
    counted_async(
        size as u64,
        Some(pool),
        stream,
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
    // SAFETY: `f` is the driver's own `cuMemAllocFromPoolAsync_ptsz`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `dptr` null or writable as the documentation of
    // `cuMemAllocFromPoolAsync_ptsz` says (the driver refuses null); handles are the driver's to
    // check.
    counted_async(
        size as u64,
        Some(pool),
        stream,
        || unsafe { f(dptr, size, pool, stream) },
        || read_ptr(dptr),
    )
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
    // SAFETY: `f` is the driver's own `cuMemPoolCreate`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `pool` null or writable and `props` null or readable as the documentation of
    // `cuMemPoolCreate` says (the driver refuses null); handles are the driver's to check.
    let r = unsafe { f(pool, props) };
    if r != SUCCESS || pool.is_null() || props.is_null() {
        return r;
    }
    let Some(l) = state::get().filter(|l| l.any_mem) else {
        return r;
    };
    // SAFETY: the driver accepted both; they are valid per the caller.
    let (handle, props) = unsafe { (*pool as usize, &*props) };
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
        drv::pool_attr(pool as usize, ATTR_USED_MEM_CURRENT)
    } else {
        None
    };
    // SAFETY: `f` is the driver's own `cuMemPoolDestroy`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(pool) };
    if r == SUCCESS {
        // A later pool may get the same handle.
        NO_REUSE.set(pool as usize, true);
    }
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
    // SAFETY: `f` is the driver's own `cuMemPoolTrimTo`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    shrinking(|| unsafe { f(pool, keep) })
}

/// Records a pool's reuse attributes when they change: with opportunistic and
/// internal-dependency reuse both off, memory freed on one stream is not reused on another
/// before a synchronisation, so an allocation may grow the pool by all it asks.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Opaque,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    let f = real!(
        cuMemPoolSetAttribute as unsafe extern "C" fn(Opaque, c_int, *mut c_void) -> CuResult
    );
    // SAFETY: `f` is the driver's own `cuMemPoolSetAttribute`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `value` null or writable as the documentation of
    // `cuMemPoolSetAttribute` says (the driver refuses null); handles are the driver's to check.
    let r = unsafe { f(pool, attr, value) };
    if r == SUCCESS
        && (attr == REUSE_ALLOW_OPPORTUNISTIC || attr == REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        && state::get().is_some()
    {
        let on = |a| drv::pool_attr_int(pool as usize, a).is_none_or(|v| v != 0);
        NO_REUSE.set(
            pool as usize,
            on(REUSE_ALLOW_OPPORTUNISTIC) || on(REUSE_ALLOW_INTERNAL_DEPENDENCIES),
        );
    }
    r
}
