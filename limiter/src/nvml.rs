//! Exported NVML wrappers (`nvmlDeviceGetMemoryInfo`, `_v2`: report the cap) and the real NVML
//! calls the limiter itself needs (memory used for context footprints, per-process
//! utilisation for the SM cap). NVML devices are matched to CUDA ordinals by UUID only.

use crate::interpose::{self, H};
use crate::sys::Lib;
use crate::{cuda, state};
use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::sync::OnceLock;

pub type NvmlReturn = c_uint;
const SUCCESS: NvmlReturn = 0;
const UNINITIALIZED: NvmlReturn = 1;
const INSUFFICIENT_SIZE: NvmlReturn = 7;
type Handle = *mut c_void;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct UtilSample {
    pub pid: c_uint,
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

fn sym<T>(name: &CStr) -> Option<T> {
    let p = interpose::real_extra(Lib::Nvml, name);
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is always the function-pointer type of `name` (callers pass matching pairs).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

/// Initialises NVML once for the limiter's own use.
fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        sym::<unsafe extern "C" fn() -> NvmlReturn>(c"nvmlInit_v2")
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

/// The 16 bytes of a `GPU-…` UUID string.
pub fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let hex: String = s
        .strip_prefix("GPU-")?
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// NVML handle of CUDA ordinal `ord` (by UUID).
pub fn handle_for_ordinal(ord: usize) -> Option<Handle> {
    if !ready() {
        return None;
    }
    let uuid = std::ffi::CString::new(uuid_string(&cuda::real_uuid(ord)?)).ok()?;
    let f = sym::<unsafe extern "C" fn(*const c_char, *mut Handle) -> NvmlReturn>(
        c"nvmlDeviceGetHandleByUUID",
    )?;
    let mut h: Handle = std::ptr::null_mut();
    // SAFETY: NUL-terminated UUID and a valid out-pointer.
    (unsafe { f(uuid.as_ptr(), &mut h) } == SUCCESS).then_some(h)
}

/// Device memory in use on CUDA ordinal `ord`, as the real NVML reports it.
pub fn used_by_ordinal(ord: usize) -> Option<u64> {
    let h = handle_for_ordinal(ord)?;
    let p = interpose::real(H::nvmlDeviceGetMemoryInfo);
    if p.is_null() {
        return None;
    }
    // SAFETY: the real nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t*).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, *mut Memory) -> NvmlReturn>(
            p,
        )
    };
    let mut m = Memory {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: valid handle and out-pointer.
    (unsafe { f(h, &mut m) } == SUCCESS).then_some(m.used)
}

/// Per-process utilisation samples newer than `last_seen`.
///
/// # Safety
/// `h` must be a handle the real NVML returned.
pub unsafe fn process_util(h: Handle, last_seen: u64) -> Option<Vec<UtilSample>> {
    let f = sym::<
        unsafe extern "C" fn(Handle, *mut UtilSample, *mut c_uint, c_ulonglong) -> NvmlReturn,
    >(c"nvmlDeviceGetProcessUtilization")?;
    let mut buf = vec![UtilSample::default(); 64];
    for _ in 0..3 {
        let mut n = buf.len() as c_uint;
        // SAFETY: `buf` holds `n` samples.
        let r = unsafe { f(h, buf.as_mut_ptr(), &mut n, last_seen) };
        match r {
            SUCCESS => {
                buf.truncate(n as usize);
                return Some(buf);
            }
            INSUFFICIENT_SIZE => buf.resize(n as usize + 16, UtilSample::default()),
            _ => return Some(Vec::new()),
        }
    }
    None
}

/// `(total, used)` to report for NVML device `h`, if the container caps it.
fn capped(h: Handle, real_total: u64) -> Option<(u64, u64)> {
    let l = state::get()?;
    if !l.limits.any_mem() {
        return None;
    }
    let get_uuid = sym::<unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> NvmlReturn>(
        c"nvmlDeviceGetUUID",
    )?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: a 96-byte buffer and its length.
    if unsafe { get_uuid(h, buf.as_mut_ptr(), buf.len() as c_uint) } != SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates on success.
    let uuid = uuid_bytes(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok()?)?;
    let (limit, used) = match l.region.find_dev(&uuid) {
        Some(e) => {
            let limit = l.region.devs[e]
                .limit
                .load(std::sync::atomic::Ordering::SeqCst);
            ((limit > 0).then_some(limit)?, l.container_used(e))
        }
        None => {
            // No CUDA process of the container has used it yet: its NVML index is its CUDA
            // ordinal only when CUDA_VISIBLE_DEVICES does not reorder devices.
            if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
                return None;
            }
            let index = sym::<unsafe extern "C" fn(Handle, *mut c_uint) -> NvmlReturn>(
                c"nvmlDeviceGetIndex",
            )?;
            let mut i: c_uint = 0;
            // SAFETY: valid out-pointer.
            if unsafe { index(h, &mut i) } != SUCCESS {
                return None;
            }
            (l.mem_limit(i as usize)?, 0)
        }
    };
    Some((limit.min(real_total), used))
}

/// # Safety
/// The NVML contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: Handle,
    memory: *mut Memory,
) -> NvmlReturn {
    let p = interpose::real(H::nvmlDeviceGetMemoryInfo);
    if p.is_null() {
        return UNINITIALIZED;
    }
    // SAFETY: the real function of this name and signature.
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, *mut Memory) -> NvmlReturn>(
            p,
        )
    };
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(device, memory) };
    if r == SUCCESS && !memory.is_null() {
        // SAFETY: filled by NVML; valid per the caller.
        let m = unsafe { &mut *memory };
        if let Some((total, used)) = capped(device, m.total) {
            let free = total.saturating_sub(used).min(m.free);
            *m = Memory {
                total,
                free,
                used: total - free,
            };
        }
    }
    r
}

/// # Safety
/// The NVML contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Handle,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    let p = interpose::real(H::nvmlDeviceGetMemoryInfo_v2);
    if p.is_null() {
        return UNINITIALIZED;
    }
    // SAFETY: the real function of this name and signature.
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, *mut MemoryV2) -> NvmlReturn>(
            p,
        )
    };
    // SAFETY: forwarded caller contract.
    let r = unsafe { f(device, memory) };
    if r == SUCCESS && !memory.is_null() {
        // SAFETY: filled by NVML; valid per the caller.
        let m = unsafe { &mut *memory };
        if let Some((total, used)) = capped(device, m.total) {
            let free = total.saturating_sub(used).min(m.free);
            m.total = total;
            m.free = free;
            m.used = total - free;
            m.reserved = m.reserved.min(m.used);
        }
    }
    r
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
