//! TEST-ONLY: simulated CUDA modules, streams and graphs (opaque tokens) and kernel launches,
//! which queue simulated busy time that NVML reports as per-process SM utilisation.

use super::contexts::sync_and_release;
use super::{
    current_dev, enter, put, record, token, CuResult, Opaque, INVALID_HANDLE, INVALID_VALUE,
    SUCCESS,
};
use crate::config::config;
use crate::state;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::Ordering;

/// Most simulated work that may be queued before a launch blocks.
const QUEUE_NS: u64 = 20_000_000;

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut Opaque, _image: *const c_void) -> CuResult {
    tri!(enter("cuModuleLoadData"));
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, token()) }
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(_m: Opaque) -> CuResult {
    tri!(enter("cuModuleUnload"));
    SUCCESS
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut Opaque,
    m: Opaque,
    _name: *const c_char,
) -> CuResult {
    tri!(enter("cuModuleGetFunction"));
    if m.is_null() {
        return INVALID_HANDLE;
    }
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, token()) }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(out: *mut Opaque, _flags: c_uint) -> CuResult {
    tri!(enter("cuStreamCreate"));
    let (ctx, _) = tri!(super::current_ctx());
    if out.is_null() {
        return INVALID_VALUE;
    }
    let s = token();
    super::with_driver(|d| d.streams.insert(s as usize, ctx));
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, s) }
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(s: Opaque) -> CuResult {
    tri!(enter("cuStreamDestroy_v2"));
    match super::with_driver(|d| d.streams.remove(&(s as usize))) {
        Some(_) => SUCCESS,
        None => INVALID_HANDLE,
    }
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(s: Opaque, ctx: *mut Opaque) -> CuResult {
    tri!(enter("cuStreamGetCtx"));
    let (c, _) = tri!(super::stream_ctx(s));
    // SAFETY: `ctx` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(ctx, c as Opaque) }
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(_s: Opaque) -> CuResult {
    tri!(enter("cuStreamSynchronize"));
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize_ptsz(_s: Opaque) -> CuResult {
    tri!(enter("cuStreamSynchronize_ptsz"));
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

// ---- launches ----

/// Queues one simulated kernel on the current context's device.
fn launch(name: &str, f: Opaque) -> CuResult {
    tri!(enter(name));
    if f.is_null() {
        return INVALID_HANDLE;
    }
    let dev = tri!(current_dev());
    let Some(r) = record(dev) else {
        return SUCCESS;
    };
    let d = config().kernel_ns;
    if d == 0 {
        return SUCCESS;
    }
    let now = state::now_ns();
    let until = r.busy_until.load(Ordering::Acquire);
    if until > now + QUEUE_NS {
        std::thread::sleep(std::time::Duration::from_nanos(until - now - QUEUE_NS));
    }
    let now = state::now_ns();
    let start = r.busy_until.load(Ordering::Acquire).max(now);
    r.busy_until.store(start + d, Ordering::Release);
    state::add_busy(r, start, start + d);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuLaunchKernel(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    launch("cuLaunchKernel", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchKernel_ptsz(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    launch("cuLaunchKernel_ptsz", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchCooperativeKernel(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
) -> CuResult {
    launch("cuLaunchCooperativeKernel", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
) -> CuResult {
    launch("cuLaunchCooperativeKernel_ptsz", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchKernelEx(
    _config: *const c_void,
    f: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    if _config.is_null() {
        return INVALID_VALUE;
    }
    launch("cuLaunchKernelEx", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchKernelEx_ptsz(
    _config: *const c_void,
    f: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    if _config.is_null() {
        return INVALID_VALUE;
    }
    launch("cuLaunchKernelEx_ptsz", f)
}

/// A graph launch: its memory first (`graphs.rs`), then one simulated kernel.
fn graph_launch(name: &str, exec: Opaque) -> CuResult {
    tri!(enter(name));
    tri!(super::graphs::launch_memory(exec as usize));
    launch(name, exec)
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: Opaque, _stream: Opaque) -> CuResult {
    graph_launch("cuGraphLaunch", exec)
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch_ptsz(exec: Opaque, _stream: Opaque) -> CuResult {
    graph_launch("cuGraphLaunch_ptsz", exec)
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(out: *mut Opaque, _flags: c_uint) -> CuResult {
    tri!(enter("cuEventCreate"));
    tri!(current_dev());
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, token()) }
}

#[no_mangle]
pub extern "C" fn cuEventRecord(ev: Opaque, _stream: Opaque) -> CuResult {
    tri!(enter("cuEventRecord"));
    if ev.is_null() {
        return INVALID_HANDLE;
    }
    SUCCESS
}

/// Waits for the device's queued work, like a synchronisation (pools release memory).
#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: Opaque) -> CuResult {
    tri!(enter("cuEventSynchronize"));
    if ev.is_null() {
        return INVALID_HANDLE;
    }
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: Opaque) -> CuResult {
    tri!(enter("cuEventDestroy_v2"));
    if ev.is_null() {
        return INVALID_HANDLE;
    }
    SUCCESS
}
