//! How calls reach the wrappers: the table of wrappers (in the order of
//! [`crate::driver::SLOTS`]), the `dlsym` override and `cuGetProcAddress`.
//!
//! `dlsym` is a naked trampoline: it asks [`dlsym_decide`] whether to hand out a wrapper and
//! otherwise *jumps* to glibc's `dlsym`, so glibc still sees the caller's return address and
//! `RTLD_NEXT` lookups keep their meaning for every other library. A wrapper is handed out only
//! when the caller's handle resolves the name to the driver's own export (or to the wrapper
//! itself): a lookup through any other library's handle returns what that library has.

use crate::driver::{self, hook_list, real, H, SLOTS};
use crate::sys::{self, Lib};
use crate::{arrays, contexts, graphs, interpose, launch, memory, mempool, nvml, state, vmm};
use cuda_abi::result::SUCCESS;
use cuda_abi::{proc_flags, CuResult, VERSIONED};
use std::ffi::{c_char, c_int, c_void, CStr};

/// The address of one exported wrapper.
pub struct Wrapper(pub *const c_void);

// SAFETY: a function address is immutable and valid from every thread.
unsafe impl Sync for Wrapper {}

macro_rules! wrappers {
    ($($lib:ident $module:ident :: $name:ident;)*) => {
        /// Every wrapper, in the order of [`crate::driver::H`].
        pub static WRAPPERS: [Wrapper; driver::COUNT] = [$(Wrapper($module::$name as *const c_void)),*];
    };
}
hook_list!(wrappers);

/// Our wrapper for intercepted entry point `h`.
pub fn wrapper(h: H) -> *mut c_void {
    WRAPPERS[h as usize].0 as *mut c_void
}

fn is_wrapper(p: *mut c_void) -> bool {
    WRAPPERS
        .iter()
        .any(|w| std::ptr::eq(w.0, p as *const c_void))
}

/// The `dlsym` decision: our wrapper for an intercepted name that `handle` resolves to the
/// driver's own export, else null (the trampoline then jumps to glibc's `dlsym`, which returns
/// what the handle really has). Also makes sure glibc's `dlsym` is known.
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
    let Some(i) = driver::find(bytes) else {
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
    let ours = WRAPPERS[i].0 as *mut c_void;
    if p.is_null() || !(p == ours || p == driver::real_at(i)) {
        return std::ptr::null_mut();
    }
    ours
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

/// The export the driver hands out for `symbol` at `version` with `flags`, by name: the
/// `_ptsz` form for the per-thread default stream, else the newest versioned export the
/// version allows (the unversioned one below the first). Intercepted ones only.
fn concrete(symbol: &str, version: c_int, flags: u64) -> Option<usize> {
    if flags & proc_flags::PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some(i) = driver::find(format!("{symbol}_ptsz").as_bytes()) {
            return Some(i);
        }
    }
    let newest = VERSIONED
        .iter()
        .filter(|(base, min, _)| *base == symbol && version >= *min)
        .map(|(_, _, name)| *name)
        .next_back();
    // Below the first version the driver hands out the original export (the legacy 32-bit
    // forms are intercepted too).
    driver::find(newest.unwrap_or(symbol).as_bytes())
}

/// After a successful real `cuGetProcAddress`: swap in our wrapper if `*pfn` is an
/// intercepted entry point. Matched by address against the driver's exports first (exact for
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
    if p.is_null() || is_wrapper(p) {
        return;
    }
    let by_address =
        (0..driver::COUNT).find(|&i| SLOTS[i].lib == Lib::Cuda && driver::real_at(i) == p);
    let hit = by_address.or_else(|| {
        // SAFETY: NUL-terminated per the caller.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        concrete(name, version, flags)
    });
    if let Some(i) = hit {
        // SAFETY: valid per the caller.
        unsafe { *pfn = WRAPPERS[i].0 as *mut c_void };
    }
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 11.3–11.8 form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    let real = real!(
        cuGetProcAddress
            as unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult
    );
    // SAFETY: `real` is the driver's own `cuGetProcAddress`, typed as cuda.h declares it (`real!`);
    // it gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `pfn` null or writable and `symbol` null or readable as the documentation of
    // `cuGetProcAddress` says (the driver refuses null); handles are the driver's to check.
    let r = unsafe { real(symbol, pfn, version, flags) };
    if r == SUCCESS {
        // SAFETY: `symbol` is NUL-terminated, as the driver just read it as a name and succeeded
        // (it refuses null); `pfn` is writable, as the driver just wrote the entry point there.
        unsafe { fixup_proc_address(symbol, pfn, version, flags) };
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 12 form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    let real = real!(
        cuGetProcAddress_v2
            as unsafe extern "C" fn(
                *const c_char,
                *mut *mut c_void,
                c_int,
                u64,
                *mut c_int,
            ) -> CuResult
    );
    // SAFETY: `real` is the driver's own `cuGetProcAddress_v2`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `pfn`, `status` null or writable and `symbol` null or readable as the
    // documentation of `cuGetProcAddress_v2` says (the driver refuses null); handles are the
    // driver's to check.
    let r = unsafe { real(symbol, pfn, version, flags, status) };
    if r == SUCCESS {
        // SAFETY: `symbol` is NUL-terminated, as the driver just read it as a name and succeeded
        // (it refuses null); `pfn` is writable, as the driver just wrote the entry point there.
        unsafe { fixup_proc_address(symbol, pfn, version, flags) };
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_share_one_order() {
        assert_eq!(SLOTS[H::cuMemAlloc_v2 as usize].name, c"cuMemAlloc_v2");
        assert_eq!(
            SLOTS[H::nvmlDeviceGetMemoryInfo_v2 as usize].name,
            c"nvmlDeviceGetMemoryInfo_v2"
        );
        assert!(std::ptr::eq(
            wrapper(H::cuGetProcAddress_v2),
            cuGetProcAddress_v2 as *const c_void
        ));
        assert!(std::ptr::eq(
            wrapper(H::cuArrayDestroy),
            arrays::cuArrayDestroy as *const c_void
        ));
    }

    #[test]
    fn concrete_names() {
        let cases: &[(&str, &str, c_int, u64, Option<&str>)] = &[
            ("versioned", "cuMemAlloc", 12000, 0, Some("cuMemAlloc_v2")),
            (
                "too old for _v2: the legacy form",
                "cuMemAlloc",
                3000,
                0,
                Some("cuMemAlloc"),
            ),
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
            (
                "context, CUDA 11.0",
                "cuCtxCreate",
                11000,
                0,
                Some("cuCtxCreate_v2"),
            ),
            (
                "context, CUDA 11.4",
                "cuCtxCreate",
                11040,
                0,
                Some("cuCtxCreate_v3"),
            ),
            (
                "context, CUDA 12.5",
                "cuCtxCreate",
                12050,
                0,
                Some("cuCtxCreate_v4"),
            ),
            ("array", "cuArrayCreate", 12000, 0, Some("cuArrayCreate_v2")),
            (
                "primary release",
                "cuDevicePrimaryCtxRelease",
                11000,
                0,
                Some("cuDevicePrimaryCtxRelease_v2"),
            ),
            ("not intercepted", "cuModuleLoad", 12000, 0, None),
        ];
        for (what, sym, ver, flags, want) in cases {
            let got = concrete(sym, *ver, *flags).map(|i| SLOTS[i].name.to_str().unwrap_or(""));
            assert_eq!(got, *want, "{what}");
        }
    }
}
