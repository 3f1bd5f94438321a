//! How calls reach the wrappers: the table of intercepted entry points, lazy resolution of the
//! real ones, the `dlsym` override and the `cuGetProcAddress` fix-up.
//!
//! `dlsym` is a naked trampoline: it asks [`dlsym_decide`] whether to hand out a wrapper and
//! otherwise *jumps* to glibc's `dlsym`, so glibc still sees the caller's return address and
//! `RTLD_NEXT` lookups keep their meaning for every other library.

use crate::sys::{self, Lib};
use crate::{cuda, mempool, nvml, state};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// One intercepted entry point.
pub struct Hook {
    pub name: &'static CStr,
    pub lib: Lib,
    pub wrapper: *const c_void,
    pub real: AtomicPtr<c_void>,
}

// SAFETY: `wrapper` is an immutable function address; `real` is atomic.
unsafe impl Sync for Hook {}

const fn cstr(b: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(b) {
        Ok(c) => c,
        Err(_) => panic!("hook name"),
    }
}

macro_rules! hooks {
    ($($lib:ident $module:ident :: $name:ident;)*) => {
        /// Index of each hook in [`HOOKS`], named after the C symbol.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum H { $($name),* }

        /// Every intercepted symbol, in the order of [`H`].
        pub static HOOKS: [Hook; [$(stringify!($name)),*].len()] = [$(Hook {
            name: cstr(concat!(stringify!($name), "\0").as_bytes()),
            lib: Lib::$lib,
            wrapper: $module::$name as *const c_void,
            real: AtomicPtr::new(std::ptr::null_mut()),
        }),*];
    };
}

hooks! {
    Cuda cuda::cuMemAlloc_v2;
    Cuda cuda::cuMemAllocPitch_v2;
    Cuda cuda::cuMemAllocManaged;
    Cuda mempool::cuMemAllocAsync;
    Cuda mempool::cuMemAllocAsync_ptsz;
    Cuda mempool::cuMemAllocFromPoolAsync;
    Cuda mempool::cuMemAllocFromPoolAsync_ptsz;
    Cuda cuda::cuMemCreate;
    Cuda cuda::cuMemRelease;
    Cuda cuda::cuMemFree_v2;
    Cuda cuda::cuMemFreeAsync;
    Cuda cuda::cuMemFreeAsync_ptsz;
    Cuda mempool::cuMemPoolCreate;
    Cuda mempool::cuMemPoolDestroy;
    Cuda mempool::cuMemPoolTrimTo;
    Cuda mempool::cuCtxSynchronize;
    Cuda mempool::cuStreamSynchronize;
    Cuda mempool::cuStreamSynchronize_ptsz;
    Cuda cuda::cuMemGetInfo_v2;
    Cuda cuda::cuDeviceTotalMem_v2;
    Cuda cuda::cuCtxCreate_v2;
    Cuda cuda::cuCtxDestroy_v2;
    Cuda cuda::cuDevicePrimaryCtxRetain;
    Cuda cuda::cuLaunchKernel;
    Cuda cuda::cuLaunchKernel_ptsz;
    Cuda cuda::cuLaunchKernelEx;
    Cuda cuda::cuLaunchKernelEx_ptsz;
    Cuda cuda::cuLaunchCooperativeKernel;
    Cuda cuda::cuLaunchCooperativeKernel_ptsz;
    Cuda cuda::cuGraphLaunch;
    Cuda cuda::cuGraphLaunch_ptsz;
    Cuda cuda::cuGetProcAddress;
    Cuda cuda::cuGetProcAddress_v2;
    Nvml nvml::nvmlDeviceGetMemoryInfo;
    Nvml nvml::nvmlDeviceGetMemoryInfo_v2;
}

/// Entry points the wrappers call that are not themselves intercepted.
pub mod extra {
    use std::ffi::CStr;
    pub const CU_CTX_GET_CURRENT: &CStr = c"cuCtxGetCurrent";
    pub const CU_CTX_GET_DEVICE: &CStr = c"cuCtxGetDevice";
    pub const CU_DEVICE_GET_UUID: &CStr = c"cuDeviceGetUuid";
    pub const CU_MEM_POOL_GET_ATTRIBUTE: &CStr = c"cuMemPoolGetAttribute";
    pub const CU_DEVICE_GET_MEM_POOL: &CStr = c"cuDeviceGetMemPool";
    pub const CU_DEVICE_GET_DEFAULT_MEM_POOL: &CStr = c"cuDeviceGetDefaultMemPool";
}

fn is_wrapper(p: *mut c_void) -> bool {
    HOOKS
        .iter()
        .any(|h| std::ptr::eq(h.wrapper, p as *const c_void))
}

/// Stores `p` as the real function of `h` unless one is known or `p` is our own wrapper.
fn adopt(h: &Hook, p: *mut c_void) {
    if !p.is_null() && !is_wrapper(p) {
        let _ =
            h.real
                .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The real function behind hook `h` (null when the driver library is missing).
#[inline]
pub fn real(h: H) -> *mut c_void {
    let hook = &HOOKS[h as usize];
    let p = hook.real.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    resolve(hook)
}

#[cold]
fn resolve(hook: &Hook) -> *mut c_void {
    // The definition after this library in the global scope: the driver the program linked
    // or loaded globally, whatever its file name.
    // SAFETY: RTLD_NEXT is a glibc pseudo-handle.
    adopt(hook, unsafe { sys::dlsym(libc::RTLD_NEXT, hook.name) });
    let p = hook.real.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let handle = sys::lib_handle(hook.lib);
    if !handle.is_null() {
        // SAFETY: `handle` came from dlopen.
        adopt(hook, unsafe { sys::dlsym(handle, hook.name) });
    }
    hook.real.load(Ordering::Acquire)
}

/// Looks up a non-intercepted symbol of a real library.
pub fn real_extra(lib: Lib, name: &CStr) -> *mut c_void {
    let handle = sys::lib_handle(lib);
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `handle` came from dlopen.
    unsafe { sys::dlsym(handle, name) }
}

fn find(name: &[u8]) -> Option<&'static Hook> {
    HOOKS.iter().find(|h| h.name.to_bytes() == name)
}

/// The `dlsym` decision: our wrapper for an intercepted name found through `handle`, else null
/// (the trampoline then jumps to glibc's `dlsym`). Also makes sure glibc's `dlsym` is known.
///
/// # Safety
/// `name` is null or NUL-terminated (the `dlsym` contract).
pub unsafe extern "C" fn dlsym_decide(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let _ = sys::real_dlsym();
    if name.is_null() || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null and NUL-terminated per the dlsym contract.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
        return std::ptr::null_mut();
    }
    let Some(hook) = find(bytes) else {
        return std::ptr::null_mut();
    };
    if state::get().is_none() {
        return std::ptr::null_mut();
    }
    let Some(real_dlsym) = sys::real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: glibc dlsym with the caller's own handle and name.
    let p = unsafe { real_dlsym(handle, name) };
    if p.is_null() {
        return std::ptr::null_mut();
    }
    adopt(hook, p);
    hook.wrapper as *mut c_void
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
/// `dlsym` override: a wrapper for intercepted names, glibc's `dlsym` (tail-jumped, so the
/// caller's return address is preserved) for everything else.
///
/// # Safety
/// The `dlsym(3)` contract.
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}@PLT",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}@GOTPCREL]",
        "mov rax, qword ptr [rax]",
        "jmp rax",
        "2:",
        "ret",
        decide = sym dlsym_decide,
        real = sym sys::GPUSHARE_LIMITER_REAL_DLSYM,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
/// `dlsym` override (see the x86_64 version).
///
/// # Safety
/// The `dlsym(3)` contract.
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",
        "cbnz x0, 2f",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "adrp x16, :got:{real}",
        "ldr x16, [x16, :got_lo12:{real}]",
        "ldr x16, [x16]",
        "br x16",
        "2:",
        "ldp x29, x30, [sp], #32",
        "ret",
        decide = sym dlsym_decide,
        real = sym sys::GPUSHARE_LIMITER_REAL_DLSYM,
    )
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
/// `dlsym` override for other architectures: `RTLD_NEXT` is resolved relative to this library.
///
/// # Safety
/// The `dlsym(3)` contract.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: forwarded dlsym contract.
    let w = unsafe { dlsym_decide(handle, name) };
    if !w.is_null() {
        return w;
    }
    match sys::real_dlsym() {
        // SAFETY: forwarded dlsym contract.
        Some(f) => unsafe { f(handle, name) },
        None => std::ptr::null_mut(),
    }
}

/// Symbols whose default form became a newer versioned export at a given CUDA version.
const VERSIONED: &[(&str, c_int, &str)] = &[
    ("cuMemAlloc", 3020, "cuMemAlloc_v2"),
    ("cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"),
    ("cuMemFree", 3020, "cuMemFree_v2"),
    ("cuMemGetInfo", 3020, "cuMemGetInfo_v2"),
    ("cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"),
    ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
    ("cuCtxDestroy", 4000, "cuCtxDestroy_v2"),
    ("cuGetProcAddress", 12000, "cuGetProcAddress_v2"),
];

/// The export the driver hands out for `symbol` at `version` with `flags` (by name).
fn concrete(symbol: &str, version: c_int, flags: u64) -> Option<&'static Hook> {
    const PER_THREAD: u64 = 2;
    if flags & PER_THREAD != 0 {
        if let Some(h) = find(format!("{symbol}_ptsz").as_bytes()) {
            return Some(h);
        }
    }
    for &(base, min, name) in VERSIONED {
        if base == symbol {
            // Below `min` the driver hands out the original export (intercepted only if
            // it is in the table: the 32-bit-size legacy ones are not).
            return find(if version >= min { name } else { base }.as_bytes());
        }
    }
    find(symbol.as_bytes())
}

/// After a successful real `cuGetProcAddress`: swap in our wrapper if `*pfn` is an
/// intercepted entry point. Matched by address against the real exports first (exact for
/// any version/flag combination), by name, version and flags second.
///
/// # Safety
/// `symbol` NUL-terminated; `pfn` valid.
pub unsafe fn fixup_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    if symbol.is_null() || pfn.is_null() || state::get().is_none() {
        return;
    }
    // SAFETY: valid per the caller.
    let p = unsafe { *pfn };
    if p.is_null() {
        return;
    }
    if is_wrapper(p) {
        return;
    }
    for (i, h) in HOOKS.iter().enumerate() {
        if h.lib == Lib::Cuda && real_by_index(i) == p {
            // SAFETY: valid per the caller.
            unsafe { *pfn = h.wrapper as *mut c_void };
            return;
        }
    }
    // SAFETY: NUL-terminated per the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    if let Some(h) = concrete(name, version, flags) {
        adopt(h, p);
        // SAFETY: valid per the caller.
        unsafe { *pfn = h.wrapper as *mut c_void };
    }
}

fn real_by_index(i: usize) -> *mut c_void {
    let hook = &HOOKS[i];
    let p = hook.real.load(Ordering::Acquire);
    if p.is_null() {
        resolve(hook)
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_order_matches_enum() {
        assert_eq!(HOOKS[H::cuMemAlloc_v2 as usize].name, c"cuMemAlloc_v2");
        assert_eq!(
            HOOKS[H::nvmlDeviceGetMemoryInfo_v2 as usize].name,
            c"nvmlDeviceGetMemoryInfo_v2"
        );
        assert_eq!(
            HOOKS[H::cuGetProcAddress_v2 as usize].name,
            c"cuGetProcAddress_v2"
        );
    }

    #[test]
    fn concrete_names() {
        let cases: &[(&str, &str, c_int, u64, Option<&str>)] = &[
            ("versioned", "cuMemAlloc", 12000, 0, Some("cuMemAlloc_v2")),
            ("too old for _v2", "cuMemAlloc", 3000, 0, None),
            (
                "per-thread stream",
                "cuLaunchKernel",
                12000,
                2,
                Some("cuLaunchKernel_ptsz"),
            ),
            (
                "legacy stream",
                "cuLaunchKernel",
                12000,
                1,
                Some("cuLaunchKernel"),
            ),
            ("no ptsz form", "cuMemFree", 12000, 2, Some("cuMemFree_v2")),
            (
                "stream synchronise, per-thread stream",
                "cuStreamSynchronize",
                12000,
                2,
                Some("cuStreamSynchronize_ptsz"),
            ),
            (
                "pool trim",
                "cuMemPoolTrimTo",
                12000,
                0,
                Some("cuMemPoolTrimTo"),
            ),
            (
                "itself, CUDA 12",
                "cuGetProcAddress",
                12000,
                0,
                Some("cuGetProcAddress_v2"),
            ),
            (
                "itself, CUDA 11",
                "cuGetProcAddress",
                11080,
                0,
                Some("cuGetProcAddress"),
            ),
            ("not intercepted", "cuModuleLoad", 12000, 0, None),
        ];
        for (what, sym, ver, flags, want) in cases {
            let got = concrete(sym, *ver, *flags).map(|h| h.name.to_str().unwrap_or(""));
            assert_eq!(got, *want, "{what}");
        }
    }
}
