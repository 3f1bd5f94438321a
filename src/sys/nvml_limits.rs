//! NVML's cgroup memory limits (r615 and later), which nvml-wrapper does not bind: the two
//! functions looked up in the loaded NVML and called with the structs `nvml.h` declares.

use std::ffi::{CStr, CString};

/// `nvmlSetMemoryLimits_v1_t` (CUDA 13.4 `nvml.h`): no version field; the `_v1` suffix is
/// the version. 24 bytes on x86_64.
#[repr(C)]
struct SetMemoryLimitsV1 {
    name_space: *const libc::c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`: the same with `currentUsed` [out]. 32 bytes on x86_64.
#[repr(C)]
struct GetMemoryLimitsV1 {
    name_space: *const libc::c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type SetMemoryLimitsFn =
    unsafe extern "C" fn(*mut libc::c_void, *const SetMemoryLimitsV1) -> libc::c_uint;
type GetMemoryLimitsFn =
    unsafe extern "C" fn(*mut libc::c_void, *mut GetMemoryLimitsV1) -> libc::c_uint;

/// NVML's cgroup memory limits (r615 and later), looked up in the NVML library the inventory
/// loaded; `None` from [`NvmlMemoryLimits::open`] when it does not export both functions.
pub struct NvmlMemoryLimits {
    handle: *mut libc::c_void,
    set: SetMemoryLimitsFn,
    get: GetMemoryLimitsFn,
}

impl NvmlMemoryLimits {
    /// Looks both functions up in `library` (the soname or path NVML was loaded from, so the
    /// same, already initialised, library is found).
    pub fn open(library: &str) -> Option<Self> {
        let c = CString::new(library).ok()?;
        // SAFETY: `c` is NUL-terminated and lives across the call. NVML is already loaded by
        // nvml-wrapper from the same name, so this only takes another reference to it.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: `handle` is the live handle from dlopen above; the name is a NUL-terminated
        // static string.
        let set = unsafe { libc::dlsym(handle, c"nvmlDeviceSetMemoryLimits_v1".as_ptr()) };
        // SAFETY: `handle` is the live handle from dlopen above; the name is a NUL-terminated
        // static string.
        let get = unsafe { libc::dlsym(handle, c"nvmlDeviceGetMemoryLimits_v1".as_ptr()) };
        if set.is_null() || get.is_null() {
            // SAFETY: `handle` came from dlopen above and is closed once; nothing from it is kept.
            unsafe { libc::dlclose(handle) };
            return None;
        }
        Some(Self {
            handle,
            // SAFETY: `set` is non-NULL (checked above) and NVML declares
            // nvmlDeviceSetMemoryLimits_v1 with exactly this signature (nvml.h, r615); it stays
            // loaded while `self` holds `handle`.
            set: unsafe { std::mem::transmute::<*mut libc::c_void, SetMemoryLimitsFn>(set) },
            // SAFETY: `get` is non-NULL (checked above) and NVML declares
            // nvmlDeviceGetMemoryLimits_v1 with exactly this signature (nvml.h, r615); it stays
            // loaded while `self` holds `handle`.
            get: unsafe { std::mem::transmute::<*mut libc::c_void, GetMemoryLimitsFn>(get) },
        })
    }

    /// `nvmlDeviceSetMemoryLimits_v1` on `device`: the NVML return code.
    pub fn set(
        &self,
        device: &nvml_wrapper::Device<'_>,
        namespace: &CStr,
        soft: u64,
        hard: u64,
    ) -> u32 {
        let limits = SetMemoryLimitsV1 {
            name_space: namespace.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: the raw handle is only passed back to the NVML it came from, which stays
        // initialised while `device` borrows it; it is not kept past this call.
        let dev = unsafe { device.handle() }.cast::<libc::c_void>();
        // SAFETY: `self.set` is NVML's function with this signature (see `open`), still loaded
        // (`self` holds `handle`); it reads `limits`, a #[repr(C)] copy of
        // nvmlSetMemoryLimits_v1_t, and the NUL-terminated `namespace` it points to, both
        // alive across the call.
        unsafe { (self.set)(dev, &limits) }
    }

    /// `nvmlDeviceGetMemoryLimits_v1` on `device`: the return code and (soft, hard, used).
    pub fn get(&self, device: &nvml_wrapper::Device<'_>, namespace: &CStr) -> (u32, u64, u64, u64) {
        let mut limits = GetMemoryLimitsV1 {
            name_space: namespace.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: the raw handle is only passed back to the NVML it came from, which stays
        // initialised while `device` borrows it; it is not kept past this call.
        let dev = unsafe { device.handle() }.cast::<libc::c_void>();
        // SAFETY: `self.get` is NVML's function with this signature (see `open`), still loaded
        // (`self` holds `handle`); it reads the NUL-terminated `namespace` and writes the three
        // u64 fields of `limits`, a #[repr(C)] copy of nvmlGetMemoryLimits_v1_t (its layout is
        // tested below), both alive across the call.
        let rc = unsafe { (self.get)(dev, &mut limits) };
        (
            rc,
            limits.soft_limit,
            limits.hard_limit,
            limits.current_used,
        )
    }
}

impl Drop for NvmlMemoryLimits {
    fn drop(&mut self) {
        // SAFETY: `handle` came from dlopen in `open` and is closed once, here; the function
        // pointers die with `self`.
        unsafe { libc::dlclose(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limit_structs_have_nvml_layout() {
        assert_eq!(std::mem::size_of::<SetMemoryLimitsV1>(), 24);
        assert_eq!(std::mem::size_of::<GetMemoryLimitsV1>(), 32);
        assert_eq!(std::mem::offset_of!(GetMemoryLimitsV1, hard_limit), 16);
        assert_eq!(std::mem::offset_of!(GetMemoryLimitsV1, current_used), 24);
    }
}
