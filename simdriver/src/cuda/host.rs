//! TEST-ONLY: page-locked host memory: `cuMemAllocHost`, `cuMemHostAlloc` (real, zeroed host
//! memory the program may use), `cuMemFreeHost`, `cuMemHostRegister`/`Unregister` and
//! `cuMemHostGetDevicePointer` (unified addressing: the host address). None of it is device
//! memory.

use super::{enter, with_driver, CuDevicePtr, CuResult, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS};
use std::ffi::{c_uint, c_void};

/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` and `_NOT_REGISTERED`.
const ALREADY_REGISTERED: CuResult = 712;
const NOT_REGISTERED: CuResult = 713;

fn host_alloc(name: &str, out: *mut *mut c_void, size: usize) -> CuResult {
    tri!(enter(name));
    if out.is_null() || size == 0 {
        return INVALID_VALUE;
    }
    // SAFETY: calloc of a non-zero size; the result is checked for null.
    let p = unsafe { libc::calloc(1, size) };
    if p.is_null() {
        return OUT_OF_MEMORY;
    }
    with_driver(|d| d.host.insert(p as usize, size));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { out.write(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAllocHost_v2(out: *mut *mut c_void, size: usize) -> CuResult {
    host_alloc("cuMemAllocHost_v2", out, size)
}

#[no_mangle]
pub extern "C" fn cuMemHostAlloc(out: *mut *mut c_void, size: usize, _flags: c_uint) -> CuResult {
    host_alloc("cuMemHostAlloc", out, size)
}

/// # Safety
/// `p` came from `cuMemAllocHost`/`cuMemHostAlloc` and is not used afterwards (anything else
/// is refused with `CUDA_ERROR_INVALID_VALUE`).
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    tri!(enter("cuMemFreeHost"));
    if with_driver(|d| d.host.remove(&(p as usize))).is_none() {
        return INVALID_VALUE;
    }
    // SAFETY: `p` came from calloc in host_alloc and has just left the registry, so it is
    // freed exactly once.
    unsafe { libc::free(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, _flags: c_uint) -> CuResult {
    tri!(enter("cuMemHostRegister_v2"));
    if p.is_null() || size == 0 {
        return INVALID_VALUE;
    }
    if with_driver(|d| d.registered.insert(p as usize)) {
        SUCCESS
    } else {
        ALREADY_REGISTERED
    }
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CuResult {
    tri!(enter("cuMemHostUnregister"));
    if with_driver(|d| d.registered.remove(&(p as usize))) {
        SUCCESS
    } else {
        NOT_REGISTERED
    }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    out: *mut CuDevicePtr,
    p: *mut c_void,
    flags: c_uint,
) -> CuResult {
    tri!(enter("cuMemHostGetDevicePointer_v2"));
    let known =
        with_driver(|d| d.host.contains_key(&(p as usize)) || d.registered.contains(&(p as usize)));
    if out.is_null() || flags != 0 || !known {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the caller.
    unsafe { out.write(p as CuDevicePtr) };
    SUCCESS
}
