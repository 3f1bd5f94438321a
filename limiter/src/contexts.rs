//! Exported wrappers of the context lifetime: creation (`cuCtxCreate_v2`, `_v3`, `_v4`,
//! `cuDevicePrimaryCtxRetain`) counts the context's own footprint once per device, and
//! destruction (`cuCtxDestroy_v2`, `cuDevicePrimaryCtxReset_v2`, the last
//! `cuDevicePrimaryCtxRelease_v2`, and their legacy forms without `_v2`) gives back everything the context owned, as the driver frees
//! it then.

use crate::driver::cuda::{self as drv, Opaque};
use crate::driver::{nvml, real};
use crate::limits::MAX_DEVICES;
use crate::memory::read_ptr;
use crate::state;
use cuda_abi::result::SUCCESS;
use cuda_abi::CuResult;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The primary context of each CUDA ordinal, as `cuDevicePrimaryCtxRetain` handed it out.
static PRIMARY: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

/// Creates a context through `call` and counts its own footprint (device memory used before
/// vs after, as the real NVML reports it; once per device until that context is destroyed).
fn with_footprint(dev: c_int, ctx: *mut Opaque, call: impl FnOnce() -> CuResult) -> CuResult {
    let ord = usize::try_from(dev).ok();
    let turn = ord.and_then(|o| {
        state::get()
            .filter(|l| l.take_footprint_turn(o))
            .map(|l| (l, o))
    });
    let Some((l, ord)) = turn else {
        let r = call();
        drv::contexts_changed();
        if let (SUCCESS, Some(l), Some(o)) = (r, state::get(), ord) {
            l.context_created(read_ptr(ctx.cast()) as usize, o);
        }
        return r;
    };
    let before = nvml::used_by_ordinal(ord);
    let r = call();
    drv::contexts_changed();
    if r != SUCCESS {
        l.return_footprint_turn(ord);
        return r;
    }
    let handle = read_ptr(ctx.cast()) as usize;
    l.context_created(handle, ord);
    match (before, nvml::used_by_ordinal(ord)) {
        (Some(b), Some(a)) => l.add_footprint(handle, ord, a.saturating_sub(b).min(2 << 30)),
        _ => l.return_footprint_turn(ord),
    }
    r
}

/// Context `ctx` is gone: the driver freed what it owned.
fn destroyed(ctx: usize) {
    drv::contexts_changed();
    if let Some(l) = state::get() {
        l.forget_context(ctx);
    }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut Opaque, flags: c_uint, dev: c_int) -> CuResult {
    let f = real!(cuCtxCreate_v2 as unsafe extern "C" fn(*mut Opaque, c_uint, c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuCtxCreate_v2`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `ctx` null or writable as the documentation of `cuCtxCreate_v2` says (the
    // driver refuses null); handles are the driver's to check.
    with_footprint(dev, ctx, || unsafe { f(ctx, flags, dev) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 11.4, execution
/// affinity).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut Opaque,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: c_int,
) -> CuResult {
    let f = real!(
        cuCtxCreate_v3
            as unsafe extern "C" fn(*mut Opaque, *mut c_void, c_int, c_uint, c_int) -> CuResult
    );
    // SAFETY: `f` is the driver's own `cuCtxCreate_v3`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `ctx`, `params` null or writable as the documentation of `cuCtxCreate_v3` says
    // (the driver refuses null); handles are the driver's to check.
    with_footprint(dev, ctx, || unsafe {
        f(ctx, params, num_params, flags, dev)
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 12.5,
/// `CUctxCreateParams`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut Opaque,
    params: *mut c_void,
    flags: c_uint,
    dev: c_int,
) -> CuResult {
    let f = real!(
        cuCtxCreate_v4 as unsafe extern "C" fn(*mut Opaque, *mut c_void, c_uint, c_int) -> CuResult
    );
    // SAFETY: `f` is the driver's own `cuCtxCreate_v4`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `ctx`, `params` null or writable as the documentation of `cuCtxCreate_v4` says
    // (the driver refuses null); handles are the driver's to check.
    with_footprint(dev, ctx, || unsafe { f(ctx, params, flags, dev) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Opaque) -> CuResult {
    let f = real!(cuCtxDestroy_v2 as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: `f` is the driver's own `cuCtxDestroy_v2`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(ctx) };
    if r == SUCCESS {
        destroyed(ctx as usize);
    }
    r
}

/// The CUDA < 4.0 form; it destroys the context as `_v2` does.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: Opaque) -> CuResult {
    let f = real!(cuCtxDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: `f` is the driver's own `cuCtxDestroy`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(ctx) };
    if r == SUCCESS {
        destroyed(ctx as usize);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Opaque, dev: c_int) -> CuResult {
    let f = real!(cuDevicePrimaryCtxRetain as unsafe extern "C" fn(*mut Opaque, c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDevicePrimaryCtxRetain`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `ctx` null or writable as the documentation of
    // `cuDevicePrimaryCtxRetain` says (the driver refuses null); handles are the driver's to check.
    let r = with_footprint(dev, ctx, || unsafe { f(ctx, dev) });
    if r == SUCCESS {
        if let Some(slot) = usize::try_from(dev).ok().and_then(|o| PRIMARY.get(o)) {
            slot.store(read_ptr(ctx.cast()) as usize, Ordering::Release);
        }
    }
    r
}

/// The primary context of `dev` may be gone (`reset`: it is): credit what it owned.
fn primary_maybe_gone(dev: c_int, reset: bool) {
    let Some(ord) = usize::try_from(dev).ok().filter(|&o| o < MAX_DEVICES) else {
        return;
    };
    if reset || drv::primary_active(ord) == Some(false) {
        let ctx = PRIMARY[ord].swap(0, Ordering::AcqRel);
        destroyed(ctx);
    }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CuResult {
    let f = real!(cuDevicePrimaryCtxRelease_v2 as unsafe extern "C" fn(c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDevicePrimaryCtxRelease_v2`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(dev) };
    if r == SUCCESS {
        primary_maybe_gone(dev, false);
    }
    r
}

/// The CUDA < 11.0 form; it releases as `_v2` does.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: c_int) -> CuResult {
    let f = real!(cuDevicePrimaryCtxRelease as unsafe extern "C" fn(c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDevicePrimaryCtxRelease`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(dev) };
    if r == SUCCESS {
        primary_maybe_gone(dev, false);
    }
    r
}

/// The CUDA < 11.0 form; it resets as `_v2` does.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: c_int) -> CuResult {
    let f = real!(cuDevicePrimaryCtxReset as unsafe extern "C" fn(c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDevicePrimaryCtxReset`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(dev) };
    if r == SUCCESS {
        primary_maybe_gone(dev, true);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: c_int) -> CuResult {
    let f = real!(cuDevicePrimaryCtxReset_v2 as unsafe extern "C" fn(c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDevicePrimaryCtxReset_v2`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(dev) };
    if r == SUCCESS {
        primary_maybe_gone(dev, true);
    }
    r
}
