//! The NVML queries the limiter makes for itself: device handles by UUID (never by index),
//! memory in use (context footprints), per-process utilisation (the SM cap), and the UUID and
//! index of a handle a program passed in.

use super::{extra, real_of, Extra, H};
use crate::sys::Lib;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::sync::OnceLock;

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;
pub const SUCCESS: NvmlReturn = 0;
pub const UNINITIALIZED: NvmlReturn = 1;
pub const INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `nvmlDevice_t`.
pub type Handle = *mut c_void;

pub use cuda_abi::nvml::{Memory, MemoryV2, ProcessUtilizationSample as UtilSample};

static INIT: Extra = Extra::new(Lib::Nvml, c"nvmlInit_v2");
static BY_UUID: Extra = Extra::new(Lib::Nvml, c"nvmlDeviceGetHandleByUUID");
static PROCESS_UTIL: Extra = Extra::new(Lib::Nvml, c"nvmlDeviceGetProcessUtilization");
static GET_UUID: Extra = Extra::new(Lib::Nvml, c"nvmlDeviceGetUUID");
static GET_INDEX: Extra = Extra::new(Lib::Nvml, c"nvmlDeviceGetIndex");

/// Initialises NVML once for the limiter's own use.
fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        extra!(INIT, unsafe extern "C" fn() -> NvmlReturn)
            // SAFETY: nvmlInit_v2 takes no arguments.
            .is_some_and(|f| unsafe { f() } == SUCCESS)
    })
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` for 16 UUID bytes.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 16 bytes of a `GPU-…` UUID string (the shared region's key).
pub use gpushare_region::uuid_bytes;

/// NVML handle of CUDA ordinal `ord` (by UUID).
pub fn handle_for_ordinal(ord: usize) -> Option<Handle> {
    if !ready() {
        return None;
    }
    let uuid = std::ffi::CString::new(uuid_string(&super::cuda::uuid(ord)?)).ok()?;
    let f = extra!(
        BY_UUID,
        unsafe extern "C" fn(*const c_char, *mut Handle) -> NvmlReturn
    )?;
    let mut h: Handle = std::ptr::null_mut();
    // SAFETY: nvmlDeviceGetHandleByUUID with a NUL-terminated UUID and a valid out-pointer.
    (unsafe { f(uuid.as_ptr(), &mut h) } == SUCCESS).then_some(h)
}

/// The real `nvmlDeviceGetMemoryInfo`.
pub fn memory_info_fn() -> Option<unsafe extern "C" fn(Handle, *mut Memory) -> NvmlReturn> {
    let p = real_of(H::nvmlDeviceGetMemoryInfo);
    // SAFETY: the real nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t*).
    (!p.is_null()).then(|| unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, *mut Memory) -> NvmlReturn>(
            p,
        )
    })
}

/// The real `nvmlDeviceGetMemoryInfo_v2`.
pub fn memory_info_v2_fn() -> Option<unsafe extern "C" fn(Handle, *mut MemoryV2) -> NvmlReturn> {
    let p = real_of(H::nvmlDeviceGetMemoryInfo_v2);
    // SAFETY: the real nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t*).
    (!p.is_null()).then(|| unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, *mut MemoryV2) -> NvmlReturn>(
            p,
        )
    })
}

/// Device memory in use on CUDA ordinal `ord`, as the real NVML reports it.
pub fn used_by_ordinal(ord: usize) -> Option<u64> {
    let h = handle_for_ordinal(ord)?;
    let f = memory_info_fn()?;
    let mut m = Memory {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: a handle NVML returned and a valid out-pointer.
    (unsafe { f(h, &mut m) } == SUCCESS).then_some(m.used)
}

/// `NVML_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: NvmlReturn = 3;
/// `NVML_ERROR_NOT_FOUND`: no samples since the given time stamp.
pub const NOT_FOUND: NvmlReturn = 6;

/// Per-process utilisation samples newer than `last_seen`, or NVML's error (`NOT_FOUND`: none
/// since then; `NOT_SUPPORTED`: the device does not report it, as on MIG).
///
/// # Safety
/// `h` must be a handle the real NVML returned.
pub unsafe fn process_util(h: Handle, last_seen: u64) -> Result<Vec<UtilSample>, NvmlReturn> {
    let f = extra!(
        PROCESS_UTIL,
        unsafe extern "C" fn(Handle, *mut UtilSample, *mut c_uint, c_ulonglong) -> NvmlReturn
    )
    .ok_or(NOT_SUPPORTED)?;
    let mut buf = vec![UtilSample::default(); 64];
    for _ in 0..3 {
        let mut n = buf.len() as c_uint;
        // SAFETY: `h` is valid per the caller; `buf` holds `n` samples.
        let r = unsafe { f(h, buf.as_mut_ptr(), &mut n, last_seen) };
        match r {
            SUCCESS => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            INSUFFICIENT_SIZE => buf.resize(n as usize + 16, UtilSample::default()),
            e => return Err(e),
        }
    }
    Err(INSUFFICIENT_SIZE)
}

/// UUID bytes of NVML device `h`.
///
/// # Safety
/// `h` is a handle the real NVML returned (or one it just accepted).
pub unsafe fn uuid_of(h: Handle) -> Option<[u8; 16]> {
    let f = extra!(
        GET_UUID,
        unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> NvmlReturn
    )?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: nvmlDeviceGetUUID with a valid handle (per the caller), a 96-byte buffer and
    // its length.
    if unsafe { f(h, buf.as_mut_ptr(), buf.len() as c_uint) } != SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates on success, within the buffer.
    uuid_bytes(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok()?)
}

/// NVML index of device `h`.
///
/// # Safety
/// `h` is a handle the real NVML returned (or one it just accepted).
pub unsafe fn index_of(h: Handle) -> Option<usize> {
    let f = extra!(
        GET_INDEX,
        unsafe extern "C" fn(Handle, *mut c_uint) -> NvmlReturn
    )?;
    let mut i: c_uint = 0;
    // SAFETY: nvmlDeviceGetIndex with a valid handle (per the caller) and out-pointer.
    (unsafe { f(h, &mut i) } == SUCCESS).then_some(i as usize)
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_roundtrip() {
        let s = "GPU-5a1e0000-0000-4000-8000-000000000001";
        let b = super::uuid_bytes(s).unwrap();
        assert_eq!(super::uuid_string(&b), s);
        assert_eq!(super::uuid_bytes("GPU-zz"), None);
    }
}
