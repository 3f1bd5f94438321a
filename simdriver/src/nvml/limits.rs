//! TEST-ONLY: the r615 (CUDA 13.4) cgroup memory-limit entry points,
//! `nvmlDeviceSetMemoryLimits_v1` and `nvmlDeviceGetMemoryLimits_v1`, as NVIDIA documents them;
//! storage, the call log and enforcement live in [`crate::memlimits`].
//!
//! `GPUSHARE_SIM_MEMORY_LIMITS=0` models a driver older than r615: both answer
//! `NVML_ERROR_FUNCTION_NOT_FOUND` and touch nothing. A real older `libnvidia-ml.so.1` lacks the
//! symbols instead (one library cannot hide its exports), so a caller must treat a missing
//! symbol, `NVML_ERROR_FUNCTION_NOT_FOUND` and `NVML_ERROR_NOT_SUPPORTED` alike.

use super::{
    enter, index_of, NvmlDevice, NvmlReturn, FUNCTION_NOT_FOUND, INVALID_ARGUMENT, NOT_FOUND,
    NO_PERMISSION, SUCCESS, UNKNOWN,
};
use crate::cgroup::{self, DirId};
use crate::config::config;
use crate::memlimits::{self, Call, Limit, LIMIT_MAX};
use crate::state;
use std::ffi::{c_char, c_ulonglong, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `nvmlSetMemoryLimits_v1_t` (24 bytes on x86_64).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SetMemoryLimitsV1 {
    /// In: Full path of the cgroup v2 directory.
    pub name_space: *const c_char,
    /// In: Soft limit in bytes.
    pub soft_limit: c_ulonglong,
    /// In: Hard limit in bytes (`NVML_DEVICE_MEMORY_LIMIT_MAX`: none).
    pub hard_limit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t` (32 bytes on x86_64).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GetMemoryLimitsV1 {
    /// In: Full path of the cgroup v2 directory.
    pub name_space: *const c_char,
    /// Out: Soft limit in bytes (0: none).
    pub soft_limit: c_ulonglong,
    /// Out: Hard limit in bytes (`NVML_DEVICE_MEMORY_LIMIT_MAX`: none).
    pub hard_limit: c_ulonglong,
    /// Out: Device memory the cgroup's processes use, bytes.
    pub current_used: c_ulonglong,
}

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`.
pub const DEVICE_MEMORY_LIMIT_MAX: c_ulonglong = LIMIT_MAX;

/// The namespace string behind `p`, if `p` is non-null.
///
/// # Safety
/// `p` must be null or a NUL-terminated string.
unsafe fn namespace<'a>(p: *const c_char) -> Option<&'a Path> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Some(Path::new(OsStr::from_bytes(bytes)))
}

/// The identity of cgroup directory `ns`: `NOT_FOUND` when nothing is there (guess: also for
/// get), `INVALID_ARGUMENT` for a relative path or anything but a cgroup v2 directory (guess).
fn cgroup_dir(ns: &Path) -> Result<DirId, NvmlReturn> {
    if !ns.is_absolute() {
        return Err(INVALID_ARGUMENT);
    }
    if std::fs::metadata(ns).is_err() {
        return Err(NOT_FOUND);
    }
    match cgroup::dir_id(ns) {
        Some(id) if cgroup::is_cgroup2(ns) => Ok(id),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// Whether the caller is privileged (effective uid 0).
fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The set call after its prologue: validation, then the stored entry.
fn set(i: usize, ns: Option<&Path>, soft: u64, hard: u64) -> Result<(), NvmlReturn> {
    let ns = ns.ok_or(INVALID_ARGUMENT)?;
    if hard != LIMIT_MAX && soft > hard {
        return Err(INVALID_ARGUMENT);
    }
    if !privileged() {
        return Err(NO_PERMISSION);
    }
    let id = cgroup_dir(ns)?;
    let state = state::state_dir();
    memlimits::sweep(&state, i);
    let limit = Limit {
        soft,
        hard,
        namespace: ns.display().to_string(),
    };
    memlimits::store(&state, i, id, &limit).map_err(|_| UNKNOWN)
}

/// The get call after its prologue: `(soft, hard, currentUsed)` of cgroup `ns` on GPU `i`.
fn get(i: usize, ns: Option<&Path>) -> Result<(u64, u64, u64), NvmlReturn> {
    let ns = ns.ok_or(INVALID_ARGUMENT)?;
    let id = cgroup_dir(ns)?;
    let (soft, hard) =
        memlimits::load(&state::state_dir(), i, id).map_or((0, LIMIT_MAX), |l| (l.soft, l.hard));
    Ok((soft, hard, memlimits::cgroup_used(i, ns)))
}

/// Sets the soft and hard device-memory limits of a cgroup (r615, CUDA 13.4). Root only.
///
/// # Safety
/// `limits` must be null or a valid `nvmlSetMemoryLimits_v1_t` whose `nameSpace` is null or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *mut SetMemoryLimitsV1,
) -> NvmlReturn {
    const NAME: &str = "nvmlDeviceSetMemoryLimits_v1";
    if !config().memory_limits {
        return FUNCTION_NOT_FOUND;
    }
    // SAFETY: null or valid per the caller.
    let args = unsafe { limits.as_ref() }.copied();
    // SAFETY: `name_space` is null or NUL-terminated per the caller.
    let ns = args.and_then(|a| unsafe { namespace(a.name_space) });
    let result = match (enter(NAME, Some(device)), args) {
        (Err(code), _) => code,
        (Ok(_), None) => INVALID_ARGUMENT,
        (Ok(i), Some(a)) => set(i, ns, a.soft_limit, a.hard_limit).map_or_else(|e| e, |()| SUCCESS),
    };
    let shown = ns.map(|p| p.to_string_lossy());
    let call = Call {
        call: "set",
        index: index_of(device),
        namespace: shown.as_deref(),
        soft: args.map(|a| a.soft_limit),
        hard: args.map(|a| a.hard_limit),
        used: None,
        result,
    };
    memlimits::log(&state::state_dir(), &call);
    result
}

/// Reads a cgroup's device-memory limits and the memory its processes use (r615, CUDA 13.4).
///
/// # Safety
/// `limits` must be null or a valid, writable `nvmlGetMemoryLimits_v1_t` whose `nameSpace` is
/// null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *mut GetMemoryLimitsV1,
) -> NvmlReturn {
    const NAME: &str = "nvmlDeviceGetMemoryLimits_v1";
    if !config().memory_limits {
        return FUNCTION_NOT_FOUND;
    }
    // SAFETY: null or valid per the caller.
    let args = unsafe { limits.as_ref() }.copied();
    // SAFETY: `name_space` is null or NUL-terminated per the caller.
    let ns = args.and_then(|a| unsafe { namespace(a.name_space) });
    let got = match (enter(NAME, Some(device)), args) {
        (Err(code), _) => Err(code),
        (Ok(_), None) => Err(INVALID_ARGUMENT),
        (Ok(i), Some(_)) => get(i, ns),
    };
    if let Ok((soft, hard, used)) = got {
        // SAFETY: non-null (args is Some) and writable per the caller.
        unsafe {
            (*limits).soft_limit = soft;
            (*limits).hard_limit = hard;
            (*limits).current_used = used;
        }
    }
    let shown = ns.map(|p| p.to_string_lossy());
    let ok = got.ok();
    let call = Call {
        call: "get",
        index: index_of(device),
        namespace: shown.as_deref(),
        soft: ok.map(|v| v.0),
        hard: ok.map(|v| v.1),
        used: ok.map(|v| v.2),
        result: got.map_or_else(|e| e, |_| SUCCESS),
    };
    memlimits::log(&state::state_dir(), &call);
    call.result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_layouts_match_nvml_h() {
        assert_eq!(size_of::<SetMemoryLimitsV1>(), 24);
        assert_eq!(offset_of!(SetMemoryLimitsV1, name_space), 0);
        assert_eq!(offset_of!(SetMemoryLimitsV1, soft_limit), 8);
        assert_eq!(offset_of!(SetMemoryLimitsV1, hard_limit), 16);
        assert_eq!(size_of::<GetMemoryLimitsV1>(), 32);
        assert_eq!(offset_of!(GetMemoryLimitsV1, name_space), 0);
        assert_eq!(offset_of!(GetMemoryLimitsV1, soft_limit), 8);
        assert_eq!(offset_of!(GetMemoryLimitsV1, hard_limit), 16);
        assert_eq!(offset_of!(GetMemoryLimitsV1, current_used), 24);
        assert_eq!(DEVICE_MEMORY_LIMIT_MAX, !0u64);
    }
}
