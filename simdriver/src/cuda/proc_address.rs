//! TEST-ONLY: simulated CUDA entry-point lookup: error strings, `cuGetExportTable` and
//! `cuGetProcAddress` with its symbol table.

use super::arrays::*;
use super::contexts::*;
use super::devices::*;
use super::graphs::*;
use super::host::*;
use super::launch::*;
use super::memory::*;
use super::pools::*;
use super::vmm::*;
use super::{
    put, CuResult, INVALID_CONTEXT, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, NOT_FOUND,
    NOT_INITIALIZED, NOT_SUPPORTED, OUT_OF_MEMORY, SUCCESS, UNKNOWN,
};
use crate::config;
use std::ffi::{c_char, c_int, c_void, CStr};

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: CuResult, out: *mut *const c_char) -> CuResult {
    let s: &'static CStr = match e {
        SUCCESS => c"no error",
        INVALID_VALUE => c"invalid argument",
        OUT_OF_MEMORY => c"out of memory",
        NOT_INITIALIZED => c"initialization error",
        INVALID_DEVICE => c"invalid device ordinal",
        INVALID_CONTEXT => c"invalid device context",
        INVALID_HANDLE => c"invalid resource handle",
        NOT_FOUND => c"named symbol not found",
        NOT_SUPPORTED => c"operation not supported",
        UNKNOWN => c"unknown error",
        _ => return INVALID_VALUE,
    };
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, s.as_ptr()) }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: CuResult, out: *mut *const c_char) -> CuResult {
    let s: &'static CStr = match e {
        SUCCESS => c"CUDA_SUCCESS",
        INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        OUT_OF_MEMORY => c"CUDA_ERROR_OUT_OF_MEMORY",
        NOT_INITIALIZED => c"CUDA_ERROR_NOT_INITIALIZED",
        INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        INVALID_CONTEXT => c"CUDA_ERROR_INVALID_CONTEXT",
        INVALID_HANDLE => c"CUDA_ERROR_INVALID_HANDLE",
        NOT_FOUND => c"CUDA_ERROR_NOT_FOUND",
        NOT_SUPPORTED => c"CUDA_ERROR_NOT_SUPPORTED",
        UNKNOWN => c"CUDA_ERROR_UNKNOWN",
        _ => return INVALID_VALUE,
    };
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, s.as_ptr()) }
}

/// The CUDA runtime's private export tables are not simulated.
#[no_mangle]
pub extern "C" fn cuGetExportTable(_out: *mut *const c_void, _id: *const c_void) -> CuResult {
    NOT_SUPPORTED
}

use cuda_abi::VERSIONED;

macro_rules! table {
    ($($f:ident),* $(,)?) => {
        &[$((stringify!($f), $f as *const c_void)),*]
    };
}

fn exports() -> &'static [(&'static str, *const c_void)] {
    struct Table(&'static [(&'static str, *const c_void)]);
    // SAFETY: function pointers are immutable and valid from any thread.
    unsafe impl Sync for Table {}
    static TABLE: Table = Table(table![
        cuInit,
        cuDriverGetVersion,
        cuDeviceGetCount,
        cuDeviceGet,
        cuDeviceGetName,
        cuDeviceGetUuid,
        cuDeviceGetUuid_v2,
        cuDeviceGetPCIBusId,
        cuDeviceTotalMem_v2,
        cuDeviceGetAttribute,
        cuCtxCreate_v2,
        cuCtxCreate_v3,
        cuCtxCreate_v4,
        cuCtxDestroy_v2,
        cuCtxDestroy,
        cuCtxGetCurrent,
        cuCtxSetCurrent,
        cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2,
        cuCtxGetDevice,
        cuCtxSynchronize,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxReset_v2,
        cuDevicePrimaryCtxRelease,
        cuDevicePrimaryCtxReset,
        cuDevicePrimaryCtxGetState,
        cuDevicePrimaryCtxSetFlags_v2,
        cuMemAlloc_v2,
        cuMemAlloc,
        cuMemAllocPitch,
        cuArrayCreate,
        cuArray3DCreate,
        cuMemFree,
        cuMemGetInfo,
        cuDeviceTotalMem,
        cuMemAllocPitch_v2,
        cuMemAllocManaged,
        cuMemAllocAsync,
        cuMemAllocAsync_ptsz,
        cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz,
        cuMemFree_v2,
        cuMemFreeAsync,
        cuMemFreeAsync_ptsz,
        cuMemCreate,
        cuMemRelease,
        cuMemAddressReserve,
        cuMemAddressFree,
        cuMemMap,
        cuMemUnmap,
        cuMemSetAccess,
        cuMemGetInfo_v2,
        cuMemGetAllocationGranularity,
        cuArrayCreate_v2,
        cuArray3DCreate_v2,
        cuMipmappedArrayCreate,
        cuArrayDestroy,
        cuMipmappedArrayDestroy,
        cuArrayGetMemoryRequirements,
        cuMipmappedArrayGetMemoryRequirements,
        cuMemAllocHost_v2,
        cuMemHostAlloc,
        cuMemFreeHost,
        cuMemHostRegister_v2,
        cuMemHostUnregister,
        cuMemHostGetDevicePointer_v2,
        cuDeviceGetDefaultMemPool,
        cuDeviceGetMemPool,
        cuDeviceSetMemPool,
        cuMemPoolCreate,
        cuMemPoolDestroy,
        cuMemPoolTrimTo,
        cuMemPoolSetAttribute,
        cuMemPoolGetAttribute,
        cuModuleLoadData,
        cuModuleUnload,
        cuModuleGetFunction,
        cuStreamCreate,
        cuStreamDestroy_v2,
        cuStreamGetCtx,
        cuStreamSynchronize,
        cuStreamSynchronize_ptsz,
        cuEventCreate,
        cuEventRecord,
        cuEventSynchronize,
        cuEventDestroy_v2,
        cuGraphCreate,
        cuGraphInstantiateWithFlags,
        cuGraphInstantiate_v2,
        cuGraphExecDestroy,
        cuGraphDestroy,
        cuGraphAddMemAllocNode,
        cuGraphAddMemFreeNode,
        cuGraphGetNodes,
        cuGraphNodeGetType,
        cuGraphMemAllocNodeGetParams,
        cuStreamBeginCapture_v2,
        cuStreamEndCapture,
        cuStreamIsCapturing,
        cuDeviceGraphMemTrim,
        cuDeviceGetGraphMemAttribute,
        cuLaunchKernel,
        cuLaunchKernel_ptsz,
        cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz,
        cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz,
        cuGraphLaunch,
        cuGraphLaunch_ptsz,
        cuGetErrorString,
        cuGetErrorName,
        cuGetExportTable,
        cuGetProcAddress,
        cuGetProcAddress_v2,
    ]);
    TABLE.0
}

fn lookup(name: &str) -> Option<*const c_void> {
    exports().iter().find(|(n, _)| *n == name).map(|&(_, p)| p)
}

/// Resolves `symbol` the way the real driver does: the `_ptsz` form when per-thread default
/// stream is asked for (flag 2), the newest versioned form the requested version allows.
/// Returns the pointer, or the `CUdriverProcAddressQueryResult` (1 not found, 2 version too low).
fn resolve(symbol: &str, version: c_int, flags: u64) -> Result<*const c_void, c_int> {
    if flags & cuda_abi::proc_flags::PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some(p) = lookup(&format!("{symbol}_ptsz")) {
            return Ok(p);
        }
    }
    let mut too_low = false;
    for &(base, min, concrete) in VERSIONED.iter().rev() {
        if base == symbol {
            if version >= min {
                return lookup(concrete).ok_or(1);
            }
            too_low = true;
        }
    }
    match lookup(symbol) {
        Some(p) if !symbol.ends_with("_v2") && !symbol.ends_with("_ptsz") => Ok(p),
        _ if too_low => Err(2),
        _ => Err(1),
    }
}

/// # Safety
/// `symbol` NUL-terminated; `pfn` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    // SAFETY: `symbol` is NUL-terminated and `pfn` null or writable, as this function's
    // `# Safety` requires of the caller; a null `status` is `get_proc`'s "no status" (it writes
    // through `status` only when non-null).
    unsafe {
        get_proc(
            "cuGetProcAddress",
            symbol,
            pfn,
            version,
            flags,
            std::ptr::null_mut(),
        )
    }
}

/// # Safety
/// `symbol` NUL-terminated; `pfn` null or writable; `status` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    // SAFETY: `symbol` NUL-terminated, `pfn` and `status` null or writable, as this function's
    // `# Safety` requires of the caller: exactly `get_proc`'s contract.
    unsafe { get_proc("cuGetProcAddress_v2", symbol, pfn, version, flags, status) }
}

/// # Safety
/// See `cuGetProcAddress_v2`.
unsafe fn get_proc(
    name: &str,
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    if config::fails(name) {
        return UNKNOWN;
    }
    if symbol.is_null() || pfn.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null, NUL-terminated per the caller.
    let sym = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let r = resolve(sym, version, flags);
    // SAFETY: `pfn` checked non-null; `status` null or writable per the caller.
    unsafe {
        pfn.write(*r.as_ref().unwrap_or(&std::ptr::null()));
        if !status.is_null() {
            status.write(r.err().unwrap_or(0));
        }
    }
    if r.is_ok() {
        SUCCESS
    } else {
        NOT_FOUND
    }
}
