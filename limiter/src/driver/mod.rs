//! Asking the real driver: the list of intercepted entry points, where their real functions
//! are (resolved from the driver libraries alone, never from whatever handle a caller passed
//! to `dlsym`), and the queries the limiter itself makes ([`cuda`], [`nvml`]). Depends only on
//! [`crate::sys`]; every other module asks the driver through here.

pub mod cuda;
pub mod nvml;

use crate::sys::{self, Lib};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Where the real function of one intercepted entry point is.
pub struct Slot {
    pub name: &'static CStr,
    pub lib: Lib,
    real: AtomicPtr<c_void>,
}

const fn cstr(b: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(b) {
        Ok(c) => c,
        Err(_) => panic!("hook name"),
    }
}

/// Every intercepted entry point, as `Library module::name;`: calls `$then!` with the list, so
/// that the slot table here and the wrapper table in `interpose` come from one list and share
/// one order.
macro_rules! hook_list {
    ($then:ident) => {
        $then! {
            Cuda memory::cuMemAlloc_v2;
            Cuda memory::cuMemAlloc;
            Cuda memory::cuMemAllocPitch_v2;
            Cuda memory::cuMemAllocPitch;
            Cuda memory::cuMemAllocManaged;
            Cuda mempool::cuMemAllocAsync;
            Cuda mempool::cuMemAllocAsync_ptsz;
            Cuda mempool::cuMemAllocFromPoolAsync;
            Cuda mempool::cuMemAllocFromPoolAsync_ptsz;
            Cuda memory::cuMemCreate;
            Cuda vmm::cuMemRelease;
            Cuda vmm::cuMemMap;
            Cuda vmm::cuMemUnmap;
            Cuda memory::cuMemFree_v2;
            Cuda memory::cuMemFree;
            Cuda memory::cuMemFreeAsync;
            Cuda memory::cuMemFreeAsync_ptsz;
            Cuda arrays::cuArrayCreate_v2;
            Cuda arrays::cuArray3DCreate_v2;
            Cuda arrays::cuArrayCreate;
            Cuda arrays::cuArray3DCreate;
            Cuda arrays::cuMipmappedArrayCreate;
            Cuda arrays::cuArrayDestroy;
            Cuda arrays::cuMipmappedArrayDestroy;
            Cuda mempool::cuMemPoolCreate;
            Cuda mempool::cuMemPoolDestroy;
            Cuda mempool::cuMemPoolTrimTo;
            Cuda mempool::cuMemPoolSetAttribute;
            Cuda launch::cuCtxSynchronize;
            Cuda launch::cuStreamSynchronize;
            Cuda launch::cuStreamSynchronize_ptsz;
            Cuda launch::cuEventSynchronize;
            Cuda memory::cuMemGetInfo_v2;
            Cuda memory::cuMemGetInfo;
            Cuda memory::cuDeviceTotalMem_v2;
            Cuda memory::cuDeviceTotalMem;
            Cuda contexts::cuCtxCreate_v2;
            Cuda contexts::cuCtxCreate_v3;
            Cuda contexts::cuCtxCreate_v4;
            Cuda contexts::cuCtxDestroy_v2;
            Cuda contexts::cuCtxDestroy;
            Cuda contexts::cuDevicePrimaryCtxRetain;
            Cuda contexts::cuDevicePrimaryCtxRelease_v2;
            Cuda contexts::cuDevicePrimaryCtxReset_v2;
            Cuda contexts::cuDevicePrimaryCtxRelease;
            Cuda contexts::cuDevicePrimaryCtxReset;
            Cuda launch::cuLaunchKernel;
            Cuda launch::cuLaunchKernel_ptsz;
            Cuda launch::cuLaunchKernelEx;
            Cuda launch::cuLaunchKernelEx_ptsz;
            Cuda launch::cuLaunchCooperativeKernel;
            Cuda launch::cuLaunchCooperativeKernel_ptsz;
            Cuda launch::cuGraphLaunch;
            Cuda launch::cuGraphLaunch_ptsz;
            Cuda graphs::cuGraphInstantiateWithFlags;
            Cuda graphs::cuGraphInstantiate_v2;
            Cuda graphs::cuGraphInstantiateWithParams;
            Cuda graphs::cuGraphExecDestroy;
            Cuda graphs::cuDeviceGraphMemTrim;
            Cuda interpose::cuGetProcAddress;
            Cuda interpose::cuGetProcAddress_v2;
            Nvml nvml::nvmlDeviceGetMemoryInfo;
            Nvml nvml::nvmlDeviceGetMemoryInfo_v2;
        }
    };
}
pub(crate) use hook_list;

macro_rules! slots {
    ($($lib:ident $module:ident :: $name:ident;)*) => {
        /// Index of each intercepted entry point in [`SLOTS`], named after the C symbol.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum H { $($name),* }

        /// Number of intercepted entry points.
        pub const COUNT: usize = [$(stringify!($name)),*].len();

        /// The real function of every intercepted entry point, in the order of [`H`].
        pub static SLOTS: [Slot; COUNT] = [$(Slot {
            name: cstr(concat!(stringify!($name), "\0").as_bytes()),
            lib: Lib::$lib,
            real: AtomicPtr::new(std::ptr::null_mut()),
        }),*];
    };
}
hook_list!(slots);

/// The real function behind `h`: the driver library's own export of that name (null when the
/// library is missing or does not export it).
#[inline]
pub fn real_of(h: H) -> *mut c_void {
    real_at(h as usize)
}

/// [`real_of`] by table index.
#[inline]
pub fn real_at(i: usize) -> *mut c_void {
    let slot = &SLOTS[i];
    let p = slot.real.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    resolve(slot)
}

#[cold]
fn resolve(slot: &Slot) -> *mut c_void {
    let p = real_extra(slot.lib, slot.name);
    if !p.is_null() {
        slot.real.store(p, Ordering::Release);
    }
    p
}

/// Looks up `name` in the real driver library `lib` (`libcuda.so.1`, `libnvidia-ml.so.1`).
pub fn real_extra(lib: Lib, name: &CStr) -> *mut c_void {
    let handle = sys::lib_handle(lib);
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `handle` came from dlopen and `name` is NUL-terminated.
    unsafe { sys::dlsym(handle, name) }
}

/// The index of the intercepted entry point called `name`.
pub fn find(name: &[u8]) -> Option<usize> {
    SLOTS.iter().position(|s| s.name.to_bytes() == name)
}

/// Calls the real function of an intercepted entry point, or returns `CUDA_ERROR_NOT_INITIALIZED`
/// from the calling wrapper when the driver has none: `real!(cuMemFree_v2 as FreeFn)`.
macro_rules! real {
    ($h:ident as $ty:ty) => {{
        let p = $crate::driver::real_of($crate::driver::H::$h);
        if p.is_null() {
            return cuda_abi::result::NOT_INITIALIZED;
        }
        // SAFETY: `p` is the driver's export of this very name, whose C signature is `$ty`.
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) }
    }};
}
pub(crate) use real;

/// A lazily resolved entry point the limiter calls but does not intercept.
pub struct Extra {
    lib: Lib,
    name: &'static CStr,
    p: AtomicPtr<c_void>,
}

impl Extra {
    pub const fn new(lib: Lib, name: &'static CStr) -> Extra {
        Extra {
            lib,
            name,
            p: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The function's address (null when the driver lacks it).
    #[inline]
    pub fn get(&self) -> *mut c_void {
        let p = self.p.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let p = real_extra(self.lib, self.name);
        self.p.store(p, Ordering::Release);
        p
    }
}

/// Calls an [`Extra`] entry point with signature `$ty`, or evaluates to `None` when the driver
/// lacks it: `extra!(CTX_GET_CURRENT as fn(*mut Opaque) -> CuResult)(&mut ctx)`.
macro_rules! extra {
    ($slot:expr, $ty:ty) => {{
        let p = $slot.get();
        if p.is_null() {
            None
        } else {
            // SAFETY: `p` is the driver's export named in `$slot`, whose C signature is `$ty`
            // (each `Extra` is declared next to the only type it is called with).
            Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) })
        }
    }};
}
pub(crate) use extra;
