//! TEST-ONLY: simulated CUDA contexts (created and primary), the per-thread current-context
//! stack and context synchronisation. Destroying a context (`cuCtxDestroy`, and for the
//! primary context `cuDevicePrimaryCtxReset` or its last `cuDevicePrimaryCtxRelease`) frees
//! every allocation and array it owns, as a real driver does.

use super::device_memory::device_give;
use super::memory::free_owned_by;
use super::{
    current_dev, dev_index, enter, put, record, with_driver, CuDevice, CuResult, Driver, Opaque,
    CONTEXT_ALREADY_IN_USE, CTX_STACK, INVALID_CONTEXT, INVALID_VALUE, SUCCESS,
};
use crate::config::config;
use crate::state;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

/// A context: which device it belongs to.
struct Ctx {
    _dev: usize,
}

fn ctx_added(d: &mut Driver, dev: usize) {
    d.ctx_count[dev] += 1;
    if d.ctx_count[dev] == 1 {
        if let Some(r) = record(dev) {
            r.has_ctx.store(1, Ordering::Relaxed);
            r.mem_used.fetch_add(config().ctx_bytes, Ordering::Relaxed);
        }
    }
}

fn ctx_removed(d: &mut Driver, dev: usize) {
    d.ctx_count[dev] = d.ctx_count[dev].saturating_sub(1);
    if d.ctx_count[dev] == 0 {
        if let Some(r) = record(dev) {
            r.has_ctx.store(0, Ordering::Relaxed);
            let _ = r
                .mem_used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(config().ctx_bytes))
                });
        }
    }
}

fn new_ctx(d: &mut Driver, dev: usize) -> usize {
    let p = Box::into_raw(Box::new(Ctx { _dev: dev })) as usize;
    d.contexts.insert(p, dev);
    ctx_added(d, dev);
    p
}

fn create(name: &str, ctx: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter(name));
    let i = tri!(dev_index(dev));
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    if state::compute_mode(i) == 2 {
        // A prohibited device refuses contexts; the real driver's code is close to this one.
        return CONTEXT_ALREADY_IN_USE;
    }
    let p = with_driver(|d| new_ctx(d, i));
    CTX_STACK.with(|s| s.borrow_mut().push(p));
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(ctx, p as Opaque) }
}

#[no_mangle]
pub extern "C" fn cuCtxCreate_v2(ctx: *mut Opaque, _flags: c_uint, dev: CuDevice) -> CuResult {
    create("cuCtxCreate_v2", ctx, dev)
}

/// CUDA 11.4 form with execution-affinity parameters (accepted and ignored).
#[no_mangle]
pub extern "C" fn cuCtxCreate_v3(
    ctx: *mut Opaque,
    params: *mut std::ffi::c_void,
    num_params: c_int,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    if num_params < 0 || (num_params > 0 && params.is_null()) {
        return INVALID_VALUE;
    }
    create("cuCtxCreate_v3", ctx, dev)
}

/// CUDA 12.5 form with `CUctxCreateParams` (null or ignored).
#[no_mangle]
pub extern "C" fn cuCtxCreate_v4(
    ctx: *mut Opaque,
    _params: *mut std::ffi::c_void,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    create("cuCtxCreate_v4", ctx, dev)
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: Opaque) -> CuResult {
    destroy("cuCtxDestroy_v2", ctx)
}

/// The CUDA < 4.0 form: the same as `_v2`.
#[no_mangle]
pub extern "C" fn cuCtxDestroy(ctx: Opaque) -> CuResult {
    destroy("cuCtxDestroy", ctx)
}

fn destroy(name: &str, ctx: Opaque) -> CuResult {
    tri!(enter(name));
    let p = ctx as usize;
    let removed = with_driver(|d| {
        let is_primary = d.primary.values().any(|&(pc, _)| pc == p);
        if is_primary {
            return None;
        }
        let dev = d.contexts.remove(&p)?;
        free_owned_by(d, p);
        ctx_removed(d, dev);
        Some(())
    });
    if removed.is_none() {
        return INVALID_CONTEXT;
    }
    CTX_STACK.with(|s| s.borrow_mut().retain(|&c| c != p));
    // SAFETY: `p` came from Box::into_raw in new_ctx and was just removed from the registry.
    drop(unsafe { Box::from_raw(p as *mut Ctx) });
    SUCCESS
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Opaque) -> CuResult {
    tri!(enter("cuCtxGetCurrent"));
    let top = CTX_STACK.with(|s| s.borrow().last().copied()).unwrap_or(0);
    // SAFETY: `ctx` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(ctx, top as Opaque) }
}

fn known(p: usize) -> bool {
    with_driver(|d| d.contexts.contains_key(&p))
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Opaque) -> CuResult {
    tri!(enter("cuCtxSetCurrent"));
    let p = ctx as usize;
    if p != 0 && !known(p) {
        return INVALID_CONTEXT;
    }
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if p != 0 {
            s.push(p);
        }
    });
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Opaque) -> CuResult {
    tri!(enter("cuCtxPushCurrent_v2"));
    let p = ctx as usize;
    if !known(p) {
        return INVALID_CONTEXT;
    }
    CTX_STACK.with(|s| s.borrow_mut().push(p));
    SUCCESS
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut Opaque) -> CuResult {
    tri!(enter("cuCtxPopCurrent_v2"));
    let Some(p) = CTX_STACK.with(|s| s.borrow_mut().pop()) else {
        return INVALID_CONTEXT;
    };
    if !ctx.is_null() {
        // SAFETY: non-null; writable per the caller.
        unsafe { ctx.write(p as Opaque) };
    }
    SUCCESS
}

/// # Safety
/// `dev` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CuDevice) -> CuResult {
    tri!(enter("cuCtxGetDevice"));
    let i = tri!(current_dev());
    // SAFETY: `dev` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(dev, i as CuDevice) }
}

fn sync_dev(i: usize) {
    if let Some(r) = record(i) {
        let until = r.busy_until.load(Ordering::Acquire);
        let now = state::now_ns();
        if until > now {
            std::thread::sleep(std::time::Duration::from_nanos(until - now));
        }
    }
}

/// Synchronisation of device `i`: waits for queued work, then every pool on the device
/// releases reserved memory above its release threshold (as CUDA does at synchronisation).
pub(super) fn sync_and_release(i: usize) {
    sync_dev(i);
    with_driver(|d| {
        for p in d.pools.values_mut().filter(|p| p.dev == i) {
            p.synced();
            let released = p.shrink_to(p.threshold);
            device_give(p.dev, released);
        }
    });
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    tri!(enter("cuCtxSynchronize"));
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter("cuDevicePrimaryCtxRetain"));
    let i = tri!(dev_index(dev));
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    let p = with_driver(|d| {
        if let Some(e) = d.primary.get_mut(&i) {
            e.1 += 1;
            return e.0;
        }
        let p = new_ctx(d, i);
        d.primary.insert(i, (p, 1));
        p
    });
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(ctx, p as Opaque) }
}

fn primary_release(name: &str, dev: CuDevice, reset: bool) -> CuResult {
    tri!(enter(name));
    let i = tri!(dev_index(dev));
    let gone = with_driver(|d| {
        let e = d.primary.get_mut(&i)?;
        e.1 = if reset { 0 } else { e.1.saturating_sub(1) };
        if e.1 > 0 {
            return Some(None);
        }
        let (p, _) = d.primary.remove(&i)?;
        d.contexts.remove(&p);
        free_owned_by(d, p);
        ctx_removed(d, i);
        Some(Some(p))
    });
    match gone {
        None if reset => SUCCESS,
        None => INVALID_CONTEXT,
        Some(None) => SUCCESS,
        Some(Some(p)) => {
            CTX_STACK.with(|s| s.borrow_mut().retain(|&c| c != p));
            // SAFETY: `p` came from Box::into_raw in new_ctx and left the registry above.
            drop(unsafe { Box::from_raw(p as *mut Ctx) });
            SUCCESS
        }
    }
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CuDevice) -> CuResult {
    primary_release("cuDevicePrimaryCtxRelease_v2", dev, false)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CuDevice) -> CuResult {
    primary_release("cuDevicePrimaryCtxReset_v2", dev, true)
}

/// The CUDA < 11.0 form: the same as `_v2`.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CuDevice) -> CuResult {
    primary_release("cuDevicePrimaryCtxRelease", dev, false)
}

/// The CUDA < 11.0 form: the same as `_v2`.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CuDevice) -> CuResult {
    primary_release("cuDevicePrimaryCtxReset", dev, true)
}

/// # Safety
/// `flags` and `active` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CuDevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    tri!(enter("cuDevicePrimaryCtxGetState"));
    let i = tri!(dev_index(dev));
    let on = with_driver(|d| d.primary.contains_key(&i));
    // SAFETY: `flags` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe {
        let r = put(flags, 0);
        if r != SUCCESS {
            return r;
        }
        put(active, c_int::from(on))
    }
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CuDevice, _flags: c_uint) -> CuResult {
    tri!(enter("cuDevicePrimaryCtxSetFlags_v2"));
    tri!(dev_index(dev));
    SUCCESS
}
