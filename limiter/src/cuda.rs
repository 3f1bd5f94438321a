//! Exported CUDA driver API wrappers: memory accounting, cap reporting, launch gating and
//! `cuGetProcAddress`. Each wrapper calls the real driver; only valid `CUresult` codes are
//! returned (`CUDA_ERROR_OUT_OF_MEMORY` over the cap, the driver's own code otherwise).
#![allow(clippy::too_many_arguments)]

use crate::interpose::{self, extra, H};
use crate::nvml;
use crate::state::{self, Kind};
use crate::sys::Lib;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub type CuResult = c_uint;
pub const SUCCESS: CuResult = 0;
pub const OUT_OF_MEMORY: CuResult = 2;
pub const NOT_INITIALIZED: CuResult = 3;
pub(crate) type Opaque = *mut c_void;

macro_rules! real {
    ($h:ident as $ty:ty) => {{
        let p = interpose::real(H::$h);
        if p.is_null() {
            return NOT_INITIALIZED;
        }
        // SAFETY: `p` is the driver's export of this very name, whose C signature is `$ty`.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}
pub(crate) use real;

pub(crate) fn extra_fn(slot: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> *mut c_void {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let p = interpose::real_extra(Lib::Cuda, name);
    slot.store(p, Ordering::Release);
    p
}

static CTX_GET_CURRENT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static CTX_GET_DEVICE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DEVICE_GET_UUID: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// Bumped whenever a context is created or destroyed (invalidates the per-thread cache).
static CTX_GEN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (generation, context, ordinal) of the last context seen on this thread.
    static CURRENT: Cell<(u64, usize, usize)> = const { Cell::new((u64::MAX, 0, 0)) };
}

/// CUDA ordinal of the calling thread's current context.
#[inline]
pub fn current_ordinal() -> Option<usize> {
    let p = extra_fn(&CTX_GET_CURRENT, extra::CU_CTX_GET_CURRENT);
    if p.is_null() {
        return None;
    }
    // SAFETY: the driver's cuCtxGetCurrent(CUcontext*).
    let get_current = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Opaque) -> CuResult>(p)
    };
    let mut ctx: Opaque = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    if unsafe { get_current(&mut ctx) } != SUCCESS || ctx.is_null() {
        return None;
    }
    let gen = CTX_GEN.load(Ordering::Acquire);
    let (g, c, o) = CURRENT.with(Cell::get);
    if g == gen && c == ctx as usize {
        return Some(o);
    }
    let p = extra_fn(&CTX_GET_DEVICE, extra::CU_CTX_GET_DEVICE);
    if p.is_null() {
        return None;
    }
    // SAFETY: the driver's cuCtxGetDevice(CUdevice*).
    let get_device = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int) -> CuResult>(p)
    };
    let mut dev: c_int = -1;
    // SAFETY: `dev` is a valid out-pointer.
    if unsafe { get_device(&mut dev) } != SUCCESS {
        return None;
    }
    let ord = usize::try_from(dev).ok()?;
    CURRENT.with(|cur| cur.set((gen, ctx as usize, ord)));
    Some(ord)
}

/// UUID bytes of CUDA ordinal `ord` from the real driver.
pub fn real_uuid(ord: usize) -> Option<[u8; 16]> {
    let p = extra_fn(&DEVICE_GET_UUID, extra::CU_DEVICE_GET_UUID);
    if p.is_null() {
        return None;
    }
    // SAFETY: the driver's cuDeviceGetUuid(CUuuid*, CUdevice).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult>(
            p,
        )
    };
    let mut uuid = [0u8; 16];
    // SAFETY: `uuid` is a valid 16-byte out-buffer.
    (unsafe { f(&mut uuid, c_int::try_from(ord).ok()?) } == SUCCESS).then_some(uuid)
}

/// Runs an allocation on CUDA ordinal `ord` under the cap. `key` reads the new pointer or
/// handle after success.
pub(crate) fn counted(
    ord: usize,
    size: u64,
    kind: Kind,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let Some(l) = state::get() else {
        return call();
    };
    let ticket = match l.reserve(ord, size) {
        Ok(t) => t,
        Err(()) => return OUT_OF_MEMORY,
    };
    let r = call();
    if let Some(t) = ticket {
        if r == SUCCESS {
            l.commit(kind, key(), t);
        } else {
            l.unreserve(t);
        }
    }
    r
}

/// An allocation on the current context's device.
pub(crate) fn counted_current(
    size: u64,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    match state::get() {
        Some(l) if l.limits.any_mem() => match current_ordinal() {
            Some(ord) => counted(ord, size, Kind::Ptr, call, key),
            None => call(),
        },
        _ => call(),
    }
}

pub(crate) fn read_ptr(p: *const u64) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: the driver just wrote a result through this caller-provided pointer.
    unsafe { p.read() }
}

fn forget(kind: Kind, key: u64, r: CuResult) -> CuResult {
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
    // SAFETY: forwarded caller contract.
    counted_current(size as u64, || unsafe { f(dptr, size) }, || read_ptr(dptr))
}

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
    let estimate = (width.div_ceil(512) * 512).saturating_mul(height) as u64;
    // SAFETY: forwarded caller contract.
    counted_current(
        estimate,
        || unsafe { f(dptr, pitch, width, height, elem) },
        || read_ptr(dptr),
    )
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> CuResult {
    let f = real!(cuMemAllocManaged as unsafe extern "C" fn(*mut u64, usize, c_uint) -> CuResult);
    // SAFETY: forwarded caller contract.
    counted_current(
        size as u64,
        || unsafe { f(dptr, size, flags) },
        || read_ptr(dptr),
    )
}

/// Head of `CUmemAllocationProp`: type, requested handle types, location {type, id}.
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
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
    // SAFETY: forwarded caller contract.
    let call = || unsafe { f(handle, size, prop, flags) };
    const LOCATION_DEVICE: c_uint = 1;
    let ord = if prop.is_null() {
        None
    } else {
        // SAFETY: non-null; a valid CUmemAllocationProp per the caller.
        let p = unsafe { &*prop };
        (p.location_type == LOCATION_DEVICE)
            .then(|| usize::try_from(p.location_id).ok())
            .flatten()
    };
    match ord {
        Some(ord) if ord < crate::limits::MAX_DEVICES => {
            counted(ord, size as u64, Kind::Handle, call, || read_ptr(handle))
        }
        _ => call(),
    }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    let f = real!(cuMemRelease as FreeFn);
    // SAFETY: forwarded caller contract.
    forget(Kind::Handle, handle, unsafe { f(handle) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    let f = real!(cuMemFree_v2 as FreeFn);
    // SAFETY: forwarded caller contract.
    forget(Kind::Ptr, ptr, unsafe { f(ptr) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: Opaque) -> CuResult {
    let f = real!(cuMemFreeAsync as FreeStreamFn);
    // SAFETY: forwarded caller contract.
    forget(Kind::Ptr, ptr, unsafe { f(ptr, stream) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: Opaque) -> CuResult {
    let f = real!(cuMemFreeAsync_ptsz as FreeStreamFn);
    // SAFETY: forwarded caller contract.
    forget(Kind::Ptr, ptr, unsafe { f(ptr, stream) })
}

/// `(total, used)` the container should see on CUDA ordinal `ord`, if it is capped.
fn capped_view(ord: usize, real_total: u64) -> Option<(u64, u64)> {
    let l = state::get()?;
    let limit = l.mem_limit(ord)?;
    let total = limit.min(real_total);
    let used = l.dev_entry(ord).map_or(0, |d| l.container_used(d));
    Some((total, used))
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let f = real!(cuMemGetInfo_v2 as unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult);
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(free, total) };
    if r != SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    if let Some(ord) = current_ordinal() {
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

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult {
    let f = real!(cuDeviceTotalMem_v2 as unsafe extern "C" fn(*mut usize, c_int) -> CuResult);
    // SAFETY: forwarded caller contract.
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

/// Counts a new context's own footprint (device memory used before vs after, once per device).
fn with_footprint(dev: c_int, call: impl FnOnce() -> CuResult) -> CuResult {
    let turn = usize::try_from(dev).ok().and_then(|o| {
        state::get()
            .filter(|l| l.take_footprint_turn(o))
            .map(|l| (l, o))
    });
    let Some((l, ord)) = turn else {
        let r = call();
        CTX_GEN.fetch_add(1, Ordering::AcqRel);
        return r;
    };
    let before = nvml::used_by_ordinal(ord);
    let r = call();
    CTX_GEN.fetch_add(1, Ordering::AcqRel);
    if r == SUCCESS {
        if let (Some(b), Some(a)) = (before, nvml::used_by_ordinal(ord)) {
            l.add_footprint(ord, a.saturating_sub(b).min(2 << 30));
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut Opaque, flags: c_uint, dev: c_int) -> CuResult {
    let f = real!(cuCtxCreate_v2 as unsafe extern "C" fn(*mut Opaque, c_uint, c_int) -> CuResult);
    // SAFETY: forwarded caller contract.
    with_footprint(dev, || unsafe { f(ctx, flags, dev) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Opaque, dev: c_int) -> CuResult {
    let f = real!(cuDevicePrimaryCtxRetain as unsafe extern "C" fn(*mut Opaque, c_int) -> CuResult);
    // SAFETY: forwarded caller contract.
    with_footprint(dev, || unsafe { f(ctx, dev) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Opaque) -> CuResult {
    let f = real!(cuCtxDestroy_v2 as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(ctx) };
    CTX_GEN.fetch_add(1, Ordering::AcqRel);
    r
}

/// The SM gate on every launch path: free when the process has no SM cap.
#[inline(always)]
fn gate() {
    if let Some(l) = state::get() {
        if l.sm.any {
            if let Some(ord) = current_ordinal() {
                l.sm.gate(ord);
            }
        }
    }
}

type LaunchFn = unsafe extern "C" fn(
    Opaque,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Opaque,
    *mut Opaque,
    *mut Opaque,
) -> CuResult;
type CoopFn = unsafe extern "C" fn(
    Opaque,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Opaque,
    *mut Opaque,
) -> CuResult;
type LaunchExFn = unsafe extern "C" fn(*const c_void, Opaque, *mut Opaque, *mut Opaque) -> CuResult;
type GraphFn = unsafe extern "C" fn(Opaque, Opaque) -> CuResult;

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Opaque,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    sh: c_uint,
    st: Opaque,
    p: *mut Opaque,
    e: *mut Opaque,
) -> CuResult {
    let real = real!(cuLaunchKernel as LaunchFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(f, gx, gy, gz, bx, by, bz, sh, st, p, e) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Opaque,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    sh: c_uint,
    st: Opaque,
    p: *mut Opaque,
    e: *mut Opaque,
) -> CuResult {
    let real = real!(cuLaunchKernel_ptsz as LaunchFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(f, gx, gy, gz, bx, by, bz, sh, st, p, e) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Opaque,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    sh: c_uint,
    st: Opaque,
    p: *mut Opaque,
) -> CuResult {
    let real = real!(cuLaunchCooperativeKernel as CoopFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(f, gx, gy, gz, bx, by, bz, sh, st, p) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Opaque,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    sh: c_uint,
    st: Opaque,
    p: *mut Opaque,
) -> CuResult {
    let real = real!(cuLaunchCooperativeKernel_ptsz as CoopFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(f, gx, gy, gz, bx, by, bz, sh, st, p) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const c_void,
    f: Opaque,
    p: *mut Opaque,
    e: *mut Opaque,
) -> CuResult {
    let real = real!(cuLaunchKernelEx as LaunchExFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(config, f, p, e) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const c_void,
    f: Opaque,
    p: *mut Opaque,
    e: *mut Opaque,
) -> CuResult {
    let real = real!(cuLaunchKernelEx_ptsz as LaunchExFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(config, f, p, e) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: Opaque, stream: Opaque) -> CuResult {
    let real = real!(cuGraphLaunch as GraphFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(exec, stream) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Opaque, stream: Opaque) -> CuResult {
    let real = real!(cuGraphLaunch_ptsz as GraphFn);
    gate();
    // SAFETY: forwarded caller contract.
    unsafe { real(exec, stream) }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 11.3–11.8 form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut Opaque,
    version: c_int,
    flags: u64,
) -> CuResult {
    let real = real!(
        cuGetProcAddress
            as unsafe extern "C" fn(*const c_char, *mut Opaque, c_int, u64) -> CuResult
    );
    // SAFETY: forwarded caller contract.
    let r = unsafe { real(symbol, pfn, version, flags) };
    if r == SUCCESS {
        // SAFETY: forwarded caller contract; the driver succeeded, so `pfn` is valid.
        unsafe { interpose::fixup_proc_address(symbol, pfn, version, flags) };
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 12 form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut Opaque,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    let real = real!(
        cuGetProcAddress_v2
            as unsafe extern "C" fn(*const c_char, *mut Opaque, c_int, u64, *mut c_int) -> CuResult
    );
    // SAFETY: forwarded caller contract.
    let r = unsafe { real(symbol, pfn, version, flags, status) };
    if r == SUCCESS {
        // SAFETY: forwarded caller contract; the driver succeeded, so `pfn` is valid.
        unsafe { interpose::fixup_proc_address(symbol, pfn, version, flags) };
    }
    r
}
