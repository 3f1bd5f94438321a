//! Exported wrappers of the plain device-memory entry points: `cuMemAlloc_v2`,
//! `cuMemAllocPitch_v2`, `cuMemAllocManaged`, `cuMemCreate` and their frees, and the two calls
//! that report memory (`cuMemGetInfo_v2`, `cuDeviceTotalMem_v2`). Over the cap a wrapper returns
//! `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver; every other result is the driver's
//! own `CUresult`, and a free the limiter did not count reaches the driver untouched.

use crate::driver::cuda::{self as drv, Opaque};
use crate::driver::real;
use crate::state::{self, Kind, Limiter, Ticket};
use cuda_abi::result::{OUT_OF_MEMORY, SUCCESS};
use cuda_abi::{CuResult, MemAllocationProp, LOCATION_DEVICE};
use std::ffi::{c_int, c_uint};

/// Runs an allocation on CUDA ordinal `ord` under the cap, owned by context `ctx`. `key` reads
/// the new pointer or handle after success.
pub(crate) fn counted(
    ord: usize,
    ctx: usize,
    size: u64,
    kind: Kind,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    match state::get() {
        Some(l) => counted_by(l, ord, ctx, size, kind, call, key),
        None => call(),
    }
}

/// [`counted`] with the limiter at hand.
#[inline(always)]
fn counted_by(
    l: &Limiter,
    ord: usize,
    ctx: usize,
    size: u64,
    kind: Kind,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let ticket = match l.reserve(ord, size) {
        Ok(t) => t,
        Err(()) => return OUT_OF_MEMORY,
    };
    let r = call();
    if let Some(t) = ticket {
        if r == SUCCESS {
            l.commit(kind, key(), t, ctx);
        } else {
            l.unreserve(t);
        }
    }
    r
}

/// An allocation on the current context's device, owned by that context.
pub(crate) fn counted_current(
    size: u64,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    match state::get() {
        Some(l) if l.any_mem => match drv::current() {
            Some((ctx, ord)) => counted_by(l, ord, ctx, size, Kind::Ptr, call, key),
            None => call(),
        },
        _ => call(),
    }
}

/// An allocation whose real size is known only after the driver made it (pitched memory,
/// arrays): `estimate` is reserved first (`None`: the estimate overflows, nothing is reserved
/// and the driver decides), then the reservation is brought to the driver's own figure; when
/// that does not fit under the cap, `undo` frees the allocation again and the caller gets
/// `CUDA_ERROR_OUT_OF_MEMORY`. So the cap holds exactly, whatever the driver's rounding.
pub(crate) struct Sized<'a> {
    pub kind: Kind,
    /// The device, for memory of the process (`cuMemCreate`); `None`: the current context's
    /// device, and the context owns the memory.
    pub device: Option<usize>,
    pub estimate: Option<u64>,
    pub call: &'a mut dyn FnMut() -> CuResult,
    /// The new pointer or handle.
    pub key: &'a dyn Fn() -> u64,
    /// The driver's own size of the new object on the given ordinal.
    pub real_size: &'a dyn Fn(u64, usize) -> Option<u64>,
    pub undo: &'a dyn Fn(u64) -> CuResult,
}

pub(crate) fn counted_sized(s: Sized<'_>) -> CuResult {
    let Some(l) = state::get().filter(|l| l.any_mem) else {
        return (s.call)();
    };
    let target = match s.device {
        Some(ord) => Some((0, ord)),
        None => drv::current(),
    };
    let Some((ctx, ord)) = target else {
        return (s.call)();
    };
    if l.mem_limit(ord).is_none() {
        return (s.call)();
    }
    let ticket = match s.estimate.map(|e| l.reserve(ord, e)) {
        Some(Err(())) => return OUT_OF_MEMORY,
        Some(Ok(t)) => t,
        None => None,
    };
    let r = (s.call)();
    if r != SUCCESS {
        if let Some(t) = ticket {
            l.unreserve(t);
        }
        return r;
    }
    let key = (s.key)();
    let size = (s.real_size)(key, ord).or(s.estimate);
    match settle(l, ord, ticket, size) {
        Ok(Some(t)) => l.commit(s.kind, key, t, ctx),
        Ok(None) => {}
        Err(()) => {
            (s.undo)(key);
            return OUT_OF_MEMORY;
        }
    }
    r
}

/// Brings a reservation (or none) to `size` bytes.
fn settle(
    l: &Limiter,
    ord: usize,
    ticket: Option<Ticket>,
    size: Option<u64>,
) -> Result<Option<Ticket>, ()> {
    match (ticket, size) {
        (Some(t), Some(size)) => match l.resize(ord, t, size) {
            Ok(t) => Ok(Some(t)),
            Err(t) => {
                l.unreserve(t);
                Err(())
            }
        },
        (Some(t), None) => Ok(Some(t)),
        (None, Some(size)) => l.reserve(ord, size),
        (None, None) => Ok(None),
    }
}

pub(crate) fn read_ptr(p: *const u64) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: the driver just wrote a result through this caller-provided pointer.
    unsafe { p.read() }
}

pub(crate) fn forget(kind: Kind, key: u64, r: CuResult) -> CuResult {
    if r == SUCCESS && key != 0 {
        if let Some(l) = state::get() {
            l.forget(kind, key);
        }
    }
    r
}

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
type FreeFn = unsafe extern "C" fn(u64) -> CuResult;
type FreeStreamFn = unsafe extern "C" fn(u64, Opaque) -> CuResult;

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CuResult {
    let f = real!(cuMemAlloc_v2 as AllocFn);
    // SAFETY: `f` is the driver's own `cuMemAlloc_v2`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `dptr` null or writable as the documentation of `cuMemAlloc_v2` says (the
    // driver refuses null); handles are the driver's to check.
    counted_current(size as u64, || unsafe { f(dptr, size) }, || read_ptr(dptr))
}

/// The CUDA < 3.2 form: a 32-bit pointer and size, counted like `_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut u32, size: c_uint) -> CuResult {
    let f = real!(cuMemAlloc as unsafe extern "C" fn(*mut u32, c_uint) -> CuResult);
    counted_current(
        u64::from(size),
        // SAFETY: `f` is the driver's own `cuMemAlloc`, typed as cuda.h declares it (`real!`); it
        // gets this function's arguments unchanged, under the contract its caller accepted
        // (`# Safety`): `dptr` null or writable as the documentation of `cuMemAlloc` says (the
        // driver refuses null); handles are the driver's to check.
        || unsafe { f(dptr, size) },
        || {
            (!dptr.is_null())
                // SAFETY: the driver just wrote the pointer through the caller's out-pointer.
                .then(|| unsafe { dptr.read() })
                .map_or(0, u64::from)
        },
    )
}

/// The CUDA < 3.2 form of `cuMemFree_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree(ptr: u32) -> CuResult {
    let f = real!(cuMemFree as unsafe extern "C" fn(u32) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMemFree`, typed as cuda.h declares it (`real!`); it gets
    // this function's arguments unchanged, under the contract its caller accepted (`# Safety`):
    // plain values and handles, which the driver checks itself.
    forget(Kind::Ptr, u64::from(ptr), unsafe { f(ptr) })
}

/// Rows are charged at the pitch the driver returned, not at an assumed alignment.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CuResult {
    let f = real!(
        cuMemAllocPitch_v2
            as unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CuResult
    );
    // The smallest pitch current GPUs use; the driver's own pitch settles it afterwards.
    let estimate = (width as u64)
        .checked_next_multiple_of(512)
        .and_then(|w| w.checked_mul(height as u64));
    counted_sized(Sized {
        kind: Kind::Ptr,
        device: None,
        estimate,
        // SAFETY: `f` is the driver's own `cuMemAllocPitch_v2`, typed as cuda.h declares it
        // (`real!`); it gets this function's arguments unchanged, under the contract its caller
        // accepted (`# Safety`): `dptr`, `pitch` null or writable as the documentation of
        // `cuMemAllocPitch_v2` says (the driver refuses null); handles are the driver's to check.
        call: &mut || unsafe { f(dptr, pitch, width, height, elem) },
        key: &|| read_ptr(dptr),
        real_size: &|_, _| {
            // SAFETY: the driver succeeded, so it wrote the pitch through the caller's pointer.
            let p = (!pitch.is_null()).then(|| unsafe { pitch.read() })?;
            (p as u64).checked_mul(height as u64)
        },
        undo: &drv::free,
    })
}

/// The CUDA < 3.2 form: 32-bit pointer, pitch and sizes, counted like `_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut u32,
    pitch: *mut u32,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CuResult {
    let f = real!(
        cuMemAllocPitch
            as unsafe extern "C" fn(*mut u32, *mut u32, c_uint, c_uint, c_uint) -> CuResult
    );
    let estimate = u64::from(width)
        .checked_next_multiple_of(512)
        .and_then(|w| w.checked_mul(u64::from(height)));
    let read32 = |p: *mut u32| {
        (!p.is_null())
            // SAFETY: read after the driver succeeded, which wrote through the caller's pointer.
            .then(|| unsafe { p.read() })
    };
    counted_sized(Sized {
        kind: Kind::Ptr,
        device: None,
        estimate,
        // SAFETY: `f` is the driver's own `cuMemAllocPitch`, typed as cuda.h declares it (`real!`);
        // it gets this function's arguments unchanged, under the contract its caller accepted
        // (`# Safety`): `dptr`, `pitch` null or writable as the documentation of `cuMemAllocPitch`
        // says (the driver refuses null); handles are the driver's to check.
        call: &mut || unsafe { f(dptr, pitch, width, height, elem) },
        key: &|| read32(dptr).map_or(0, u64::from),
        real_size: &|_, _| u64::from(read32(pitch)?).checked_mul(u64::from(height)),
        undo: &|p| {
            let free = real!(cuMemFree as unsafe extern "C" fn(u32) -> CuResult);
            // SAFETY: a pointer the driver has just handed out and nobody else knows.
            unsafe { free(p as u32) }
        },
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> CuResult {
    let f = real!(cuMemAllocManaged as unsafe extern "C" fn(*mut u64, usize, c_uint) -> CuResult);
    counted_current(
        size as u64,
        // SAFETY: `f` is the driver's own `cuMemAllocManaged`, typed as cuda.h declares it
        // (`real!`); it gets this function's arguments unchanged, under the contract its caller
        // accepted (`# Safety`): `dptr` null or writable as the documentation of
        // `cuMemAllocManaged` says (the driver refuses null); handles are the driver's to check.
        || unsafe { f(dptr, size, flags) },
        || read_ptr(dptr),
    )
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CuResult {
    let f = real!(
        cuMemCreate
            as unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> CuResult
    );
    // SAFETY: null or a valid CUmemAllocationProp per the caller.
    let ord = unsafe { prop.as_ref() }.and_then(|p| {
        (p.location_type == LOCATION_DEVICE)
            .then(|| usize::try_from(p.location_id).ok())
            .flatten()
    });
    let capped = |o: usize| state::get().is_some_and(|l| l.mem_limit(o).is_some());
    let Some(ord) = ord.filter(|&o| capped(o)) else {
        // SAFETY: `f` is the driver's own `cuMemCreate`, typed as cuda.h declares it (`real!`); it
        // gets this function's arguments unchanged, under the contract its caller accepted
        // (`# Safety`): `handle` null or writable and `prop` null or readable as the documentation
        // of `cuMemCreate` says (the driver refuses null); handles are the driver's to check.
        return unsafe { f(handle, size, prop, flags) };
    };
    // A size that is not a multiple of the granularity is the driver's to refuse, not the cap's.
    // SAFETY: `prop` is non-null (it named a device) and valid per the caller.
    let granularity = unsafe { drv::allocation_granularity(prop) }.unwrap_or(1);
    let size64 = size as u64;
    // Physical memory of the process, not of a context: only cuMemRelease frees it.
    counted_sized(Sized {
        kind: Kind::Handle,
        device: Some(ord),
        estimate: size64.is_multiple_of(granularity).then_some(size64),
        // SAFETY: `f` is the driver's own `cuMemCreate`, typed as cuda.h declares it (`real!`); it
        // gets this function's arguments unchanged, under the contract its caller accepted
        // (`# Safety`): `handle` null or writable and `prop` null or readable as the documentation
        // of `cuMemCreate` says (the driver refuses null); handles are the driver's to check.
        call: &mut || unsafe { f(handle, size, prop, flags) },
        key: &|| read_ptr(handle),
        real_size: &|_, _| Some(size64),
        undo: &drv::release,
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    let f = real!(cuMemFree_v2 as FreeFn);
    // SAFETY: `f` is the driver's own `cuMemFree_v2`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    forget(Kind::Ptr, ptr, unsafe { f(ptr) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: Opaque) -> CuResult {
    let f = real!(cuMemFreeAsync as FreeStreamFn);
    // SAFETY: `f` is the driver's own `cuMemFreeAsync`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    forget(Kind::Ptr, ptr, unsafe { f(ptr, stream) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: Opaque) -> CuResult {
    let f = real!(cuMemFreeAsync_ptsz as FreeStreamFn);
    // SAFETY: `f` is the driver's own `cuMemFreeAsync_ptsz`, typed as cuda.h declares it (`real!`);
    // it gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    forget(Kind::Ptr, ptr, unsafe { f(ptr, stream) })
}

/// `(total, used)` the container should see on CUDA ordinal `ord`, if it is capped.
fn capped_view(ord: usize, real_total: u64) -> Option<(u64, u64)> {
    let l = state::get()?;
    let limit = l.mem_limit(ord)?;
    let total = limit.min(real_total);
    // Allocations are refused (a shared file of another layout, a device without a UUID):
    // report nothing free.
    let used = l.dev_entry(ord).map_or(total, |d| l.container_used(d));
    Some((total, used))
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let f = real!(cuMemGetInfo_v2 as unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMemGetInfo_v2`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `free`, `total` null or writable as the documentation of `cuMemGetInfo_v2` says
    // (the driver refuses null); handles are the driver's to check.
    let r = unsafe { f(free, total) };
    if r != SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    if let Some(ord) = drv::current_ordinal() {
        // SAFETY: the driver just filled both; they are valid per the caller.
        let (real_free, real_total) = unsafe { (*free as u64, *total as u64) };
        if let Some((t, used)) = capped_view(ord, real_total) {
            let fr = t.saturating_sub(used).min(real_free);
            // SAFETY: as above.
            unsafe {
                *free = fr as usize;
                *total = t as usize;
            }
        }
    }
    r
}

/// The CUDA < 3.2 form: 32-bit sizes, reporting the cap like `_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CuResult {
    let f = real!(cuMemGetInfo as unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMemGetInfo`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `free`, `total` null or writable as the documentation of `cuMemGetInfo` says
    // (the driver refuses null); handles are the driver's to check.
    let r = unsafe { f(free, total) };
    if r != SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    if let Some(ord) = drv::current_ordinal() {
        // SAFETY: the driver just filled both; they are valid per the caller.
        let (real_free, real_total) = unsafe { (u64::from(*free), u64::from(*total)) };
        // A figure the driver clamped to 32 bits says only "at least 4 GiB".
        let exact = |v: u64| (v < u64::from(c_uint::MAX)).then_some(v);
        let real_total = exact(real_total).unwrap_or(u64::MAX);
        if let Some((t, used)) = capped_view(ord, real_total) {
            let fr = t
                .saturating_sub(used)
                .min(exact(real_free).unwrap_or(u64::MAX));
            let clamp = |v: u64| c_uint::try_from(v).unwrap_or(c_uint::MAX);
            // SAFETY: as above.
            unsafe {
                *free = clamp(fr);
                *total = clamp(t);
            }
        }
    }
    r
}

/// The CUDA < 3.2 form: a 32-bit size, reporting the cap like `_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: c_int) -> CuResult {
    let f = real!(cuDeviceTotalMem as unsafe extern "C" fn(*mut c_uint, c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDeviceTotalMem`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `bytes` null or writable as the documentation of `cuDeviceTotalMem` says (the
    // driver refuses null); handles are the driver's to check.
    let r = unsafe { f(bytes, dev) };
    if r == SUCCESS && !bytes.is_null() {
        let limit = usize::try_from(dev)
            .ok()
            .and_then(|o| state::get()?.mem_limit(o));
        if let Some(limit) = limit {
            let limit = c_uint::try_from(limit).unwrap_or(c_uint::MAX);
            // SAFETY: the driver just filled it; valid per the caller.
            unsafe { *bytes = (*bytes).min(limit) };
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult {
    let f = real!(cuDeviceTotalMem_v2 as unsafe extern "C" fn(*mut usize, c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDeviceTotalMem_v2`, typed as cuda.h declares it (`real!`);
    // it gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `bytes` null or writable as the documentation of `cuDeviceTotalMem_v2` says
    // (the driver refuses null); handles are the driver's to check.
    let r = unsafe { f(bytes, dev) };
    if r == SUCCESS && !bytes.is_null() {
        let limit = usize::try_from(dev)
            .ok()
            .and_then(|o| state::get()?.mem_limit(o));
        if let Some(limit) = limit {
            // SAFETY: the driver just filled it; valid per the caller.
            unsafe { *bytes = (*bytes as u64).min(limit) as usize };
        }
    }
    r
}
