//! NVML, loaded by hand: the library opened once and only the dozen functions gpushare calls
//! looked up, with the types `nvml.h` declares (nvml-wrapper-sys's bindings, generated from
//! it). nvml-wrapper looked up all of its 396 functions on every load, most of them absent
//! from any one driver, which cost a hook that loads NVML more than the library's own load.
//! The r615 cgroup memory limits, which no binding has yet, use the structs declared here.

use std::ffi::{c_char, c_uint, c_void, CStr, CString};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

use nvml_wrapper_sys::bindings as nv;

/// Why NVML could not be loaded or asked.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The dynamic loader's own words.
    #[error("{0}")]
    Load(String),
    /// A function this NVML does not export.
    #[error("the library does not export {0}")]
    Missing(&'static str),
    /// A return code, with NVML's text for it.
    #[error("{text} (NVML code {code})")]
    Code { code: u32, text: String },
    /// A string NVML wrote that is not UTF-8 text.
    #[error("{0} returned text that is not UTF-8")]
    NotText(&'static str),
}

/// `nvmlSetMemoryLimits_v1_t` (CUDA 13.4 `nvml.h`): no version field; the `_v1` suffix is
/// the version. 24 bytes on x86_64.
#[repr(C)]
struct SetMemoryLimitsV1 {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`: the same with `currentUsed` [out]. 32 bytes on x86_64.
#[repr(C)]
struct GetMemoryLimitsV1 {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type Ret = nv::nvmlReturn_t;
type Dev = nv::nvmlDevice_t;
type InitFn = unsafe extern "C" fn() -> Ret;
type ErrorStringFn = unsafe extern "C" fn(Ret) -> *const c_char;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> Ret;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Dev) -> Ret;
type UuidFn = unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> Ret;
type UintFn = unsafe extern "C" fn(Dev, *mut c_uint) -> Ret;
type SetModeFn = unsafe extern "C" fn(Dev, nv::nvmlComputeMode_t) -> Ret;
type MemoryFn = unsafe extern "C" fn(Dev, *mut nv::nvmlMemory_t) -> Ret;
type SetMemoryLimitsFn = unsafe extern "C" fn(Dev, *const SetMemoryLimitsV1) -> Ret;
type GetMemoryLimitsFn = unsafe extern "C" fn(Dev, *mut GetMemoryLimitsV1) -> Ret;

/// The functions, each `None` when this NVML does not export it (an error when called, as
/// from nvml-wrapper).
struct Fns {
    shutdown: Option<InitFn>,
    error_string: Option<ErrorStringFn>,
    count: Option<CountFn>,
    handle: Option<HandleFn>,
    uuid: Option<UuidFn>,
    minor: Option<UintFn>,
    compute_mode: Option<UintFn>,
    set_compute_mode: Option<SetModeFn>,
    memory: Option<MemoryFn>,
    set_limits: Option<SetMemoryLimitsFn>,
    get_limits: Option<GetMemoryLimitsFn>,
}

/// A loaded, initialised NVML; shut down and unloaded when dropped.
pub struct Nvml {
    handle: *mut c_void,
    f: Fns,
}

/// A GPU's handle, valid while the [`Nvml`] it came from is.
#[derive(Clone, Copy)]
pub struct Device<'a> {
    raw: Dev,
    _nvml: PhantomData<&'a Nvml>,
}

/// `dlerror`'s text, or `what` when it has none.
fn last_dl_error(what: &str) -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        what.to_owned()
    } else {
        // SAFETY: checked non-NULL above; NUL-terminated per dlerror's contract.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The address of `name` in `handle`, as the function type `F`.
///
/// # Safety
/// `handle` is a live dlopen handle, and `F` is the function pointer type `nvml.h` declares
/// for `name` (a pointer-sized `extern "C" fn`).
unsafe fn lookup<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    // SAFETY: the caller's contract: `handle` is live; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    // SAFETY: non-NULL, and by the caller's contract the symbol is a function of type `F`,
    // which has the size of a pointer.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Nvml {
    /// Loads NVML from `library` (a soname or a path; `RTLD_LAZY | RTLD_LOCAL`, nothing made
    /// visible to this process) and calls `nvmlInit_v2`.
    ///
    /// # Errors
    /// [`NvmlError`]: the library cannot be loaded, lacks `nvmlInit_v2`, or its init fails.
    pub fn open(library: &str) -> Result<Nvml, NvmlError> {
        let c = CString::new(library)
            .map_err(|_| NvmlError::Load(format!("{library:?} has a NUL byte")))?;
        // SAFETY: dlopen reads the NUL-terminated `c`, alive across the call. The library is
        // the driver's NVML the admin's policy names (trusted as the policy is); loading it
        // runs its initialisers, as every NVML user does.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(NvmlError::Load(last_dl_error("dlopen failed")));
        }
        // SAFETY: `handle` is the live handle from dlopen above, and each type is the one
        // nvml.h declares for its name.
        let (init, f) = unsafe {
            let init = lookup::<InitFn>(handle, c"nvmlInit_v2");
            let f = Fns {
                shutdown: lookup(handle, c"nvmlShutdown"),
                error_string: lookup(handle, c"nvmlErrorString"),
                count: lookup(handle, c"nvmlDeviceGetCount_v2"),
                handle: lookup(handle, c"nvmlDeviceGetHandleByIndex_v2"),
                uuid: lookup(handle, c"nvmlDeviceGetUUID"),
                minor: lookup(handle, c"nvmlDeviceGetMinorNumber"),
                compute_mode: lookup(handle, c"nvmlDeviceGetComputeMode"),
                set_compute_mode: lookup(handle, c"nvmlDeviceSetComputeMode"),
                memory: lookup(handle, c"nvmlDeviceGetMemoryInfo"),
                set_limits: lookup(handle, c"nvmlDeviceSetMemoryLimits_v1"),
                get_limits: lookup(handle, c"nvmlDeviceGetMemoryLimits_v1"),
            };
            (init, f)
        };
        // Not yet initialised: dropping it would shut NVML down, so an error closes it here.
        let close = |e: NvmlError| {
            // SAFETY: `handle` came from dlopen above and is closed once, here; nothing from it
            // is kept.
            unsafe { libc::dlclose(handle) };
            e
        };
        let Some(init) = init else {
            return Err(close(NvmlError::Missing("nvmlInit_v2")));
        };
        // SAFETY: nvmlInit_v2 takes no arguments; NVML is loaded (`handle`).
        let rc = unsafe { init() };
        if rc != nv::nvmlReturn_enum_NVML_SUCCESS {
            let text = Self::text(f.error_string, rc);
            return Err(close(NvmlError::Code { code: rc, text }));
        }
        Ok(Nvml { handle, f })
    }

    /// NVML's text for `rc`, from `nvmlErrorString` when it is exported.
    fn text(error_string: Option<ErrorStringFn>, rc: Ret) -> String {
        let p = match error_string {
            // SAFETY: nvmlErrorString takes any code and returns NULL or a static
            // NUL-terminated string (nvml.h).
            Some(f) => unsafe { f(rc) },
            None => std::ptr::null(),
        };
        if p.is_null() {
            "NVML error".to_owned()
        } else {
            // SAFETY: checked non-NULL above; a static NUL-terminated string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    /// `rc` as a result.
    fn check(&self, rc: Ret) -> Result<(), NvmlError> {
        if rc == nv::nvmlReturn_enum_NVML_SUCCESS {
            Ok(())
        } else {
            Err(NvmlError::Code {
                code: rc,
                text: Self::text(self.f.error_string, rc),
            })
        }
    }

    /// The number of GPUs (`nvmlDeviceGetCount_v2`).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML.
    pub fn device_count(&self) -> Result<u32, NvmlError> {
        let f = self
            .f
            .count
            .ok_or(NvmlError::Missing("nvmlDeviceGetCount_v2"))?;
        let mut n: c_uint = 0;
        // SAFETY: NVML is initialised (`self`); it writes one c_uint to `n`.
        self.check(unsafe { f(&mut n) })?;
        Ok(n)
    }

    /// GPU `index`'s handle (`nvmlDeviceGetHandleByIndex_v2`).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML.
    pub fn device(&self, index: u32) -> Result<Device<'_>, NvmlError> {
        let f = self
            .f
            .handle
            .ok_or(NvmlError::Missing("nvmlDeviceGetHandleByIndex_v2"))?;
        let mut raw: Dev = std::ptr::null_mut();
        // SAFETY: NVML is initialised (`self`); it writes one handle to `raw`.
        self.check(unsafe { f(index, &mut raw) })?;
        Ok(Device {
            raw,
            _nvml: PhantomData,
        })
    }

    /// The GPU's UUID (`nvmlDeviceGetUUID`).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML, or text that is not UTF-8.
    pub fn uuid(&self, dev: Device<'_>) -> Result<String, NvmlError> {
        let f = self.f.uuid.ok_or(NvmlError::Missing("nvmlDeviceGetUUID"))?;
        let mut buf = [0 as c_char; nv::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
        // SAFETY: `dev` is a handle of this initialised NVML; it writes at most `buf.len()`
        // bytes, NUL included, to `buf`.
        self.check(unsafe { f(dev.raw, buf.as_mut_ptr(), buf.len() as c_uint) })?;
        // NUL-terminated by NVML; the last byte made NUL so that a driver that fills the
        // buffer cannot send the read past it.
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` holds a NUL (set above) and lives across the read.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        s.to_str()
            .map(str::to_owned)
            .map_err(|_| NvmlError::NotText("nvmlDeviceGetUUID"))
    }

    /// One c_uint out of `f` on `dev`.
    fn uint(
        &self,
        f: Option<UintFn>,
        name: &'static str,
        dev: Device<'_>,
    ) -> Result<u32, NvmlError> {
        let f = f.ok_or(NvmlError::Missing(name))?;
        let mut v: c_uint = 0;
        // SAFETY: `dev` is a handle of this initialised NVML; `f` writes one c_uint to `v`.
        self.check(unsafe { f(dev.raw, &mut v) })?;
        Ok(v)
    }

    /// The GPU's device minor number (`nvmlDeviceGetMinorNumber`).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML.
    pub fn minor_number(&self, dev: Device<'_>) -> Result<u32, NvmlError> {
        self.uint(self.f.minor, "nvmlDeviceGetMinorNumber", dev)
    }

    /// The GPU's compute mode, as `nvmlComputeMode_t` (`nvmlDeviceGetComputeMode`).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML.
    pub fn compute_mode(&self, dev: Device<'_>) -> Result<u32, NvmlError> {
        self.uint(self.f.compute_mode, "nvmlDeviceGetComputeMode", dev)
    }

    /// Sets the GPU's compute mode (`nvmlDeviceSetComputeMode`; needs root).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML.
    pub fn set_compute_mode(&self, dev: Device<'_>, mode: u32) -> Result<(), NvmlError> {
        let f = self
            .f
            .set_compute_mode
            .ok_or(NvmlError::Missing("nvmlDeviceSetComputeMode"))?;
        // SAFETY: `dev` is a handle of this initialised NVML; the mode is passed by value.
        self.check(unsafe { f(dev.raw, mode) })
    }

    /// The GPU's total memory in bytes (`nvmlDeviceGetMemoryInfo`).
    ///
    /// # Errors
    /// [`NvmlError`] from NVML.
    pub fn memory_total(&self, dev: Device<'_>) -> Result<u64, NvmlError> {
        let f = self
            .f
            .memory
            .ok_or(NvmlError::Missing("nvmlDeviceGetMemoryInfo"))?;
        let mut m = nv::nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: `dev` is a handle of this initialised NVML; it writes one nvmlMemory_t.
        self.check(unsafe { f(dev.raw, &mut m) })?;
        Ok(m.total)
    }

    /// Forgets the cgroup memory-limit functions, as with an NVML from before r615.
    #[cfg(test)]
    pub fn forget_memory_limits(&mut self) {
        self.f.set_limits = None;
        self.f.get_limits = None;
    }

    /// Whether this NVML exports both cgroup memory-limit functions (r615 and later).
    pub fn has_memory_limits(&self) -> bool {
        self.f.set_limits.is_some() && self.f.get_limits.is_some()
    }

    /// `nvmlDeviceSetMemoryLimits_v1` on `dev`: the NVML return code; `None` when this NVML
    /// does not export it.
    pub fn set_memory_limits(
        &self,
        dev: Device<'_>,
        namespace: &CStr,
        soft: u64,
        hard: u64,
    ) -> Option<u32> {
        let f = self.f.set_limits?;
        let limits = SetMemoryLimitsV1 {
            name_space: namespace.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: `dev` is a handle of this initialised NVML; it reads `limits`, a #[repr(C)]
        // copy of nvmlSetMemoryLimits_v1_t, and the NUL-terminated `namespace` it points to,
        // both alive across the call.
        Some(unsafe { f(dev.raw, &limits) })
    }

    /// `nvmlDeviceGetMemoryLimits_v1` on `dev`: the return code and (soft, hard, used);
    /// `None` when this NVML does not export it.
    pub fn memory_limits(&self, dev: Device<'_>, namespace: &CStr) -> Option<(u32, u64, u64, u64)> {
        let f = self.f.get_limits?;
        let mut limits = GetMemoryLimitsV1 {
            name_space: namespace.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: `dev` is a handle of this initialised NVML; it reads the NUL-terminated
        // `namespace` and writes the three u64 fields of `limits`, a #[repr(C)] copy of
        // nvmlGetMemoryLimits_v1_t (its layout is tested below), both alive across the call.
        let rc = unsafe { f(dev.raw, &mut limits) };
        Some((
            rc,
            limits.soft_limit,
            limits.hard_limit,
            limits.current_used,
        ))
    }
}

/// Whether a dropped [`Nvml`] stays loaded for the process's exit to unload (see
/// [`leave_loaded_until_exit`]).
static LEFT_TO_EXIT: AtomicBool = AtomicBool::new(false);

/// Leaves NVML loaded when an [`Nvml`] is dropped, from now on in this process: its shutdown
/// and unload are left to the process's exit, which unmaps the whole process at once. For a
/// process that ends soon after its last use of NVML (a hook stage): unloading the library
/// page range by page range took 42-48 µs of a hook's 1.5-3 ms here (the TEST-ONLY simulated
/// driver; a real driver's library is larger), and exit frees the same. A process that runs on
/// (`serve`, a reaper) never calls this: each load would stay.
pub fn leave_loaded_until_exit() {
    LEFT_TO_EXIT.store(true, Ordering::Relaxed);
}

impl Nvml {
    /// Shuts NVML down and unloads it, unless `leave_loaded`.
    fn release(&mut self, leave_loaded: bool) {
        if leave_loaded {
            return;
        }
        if let Some(shutdown) = self.f.shutdown {
            // SAFETY: NVML was initialised in `open`, once; this is its one shutdown (`release`
            // runs once, from `drop`).
            unsafe { shutdown() };
        }
        // SAFETY: `handle` came from dlopen in `open` and is closed once, here; the function
        // pointers die with `self`, and no `Device` outlives it (they borrow it).
        unsafe { libc::dlclose(self.handle) };
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        self.release(LEFT_TO_EXIT.load(Ordering::Relaxed));
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

    #[test]
    fn a_library_that_is_not_there_is_the_loaders_error() {
        let Err(e) = Nvml::open("/nonexistent/libnvidia-ml.so.1") else {
            panic!("loaded a library that is not there");
        };
        assert!(
            matches!(&e, NvmlError::Load(t) if t.contains("/nonexistent/libnvidia-ml.so.1")),
            "{e:?}"
        );
    }

    /// Whether the library at `path` is loaded in this process (`RTLD_NOLOAD` loads nothing).
    fn loaded(path: &CStr) -> bool {
        // SAFETY: `path` is NUL-terminated; RTLD_NOLOAD only looks the library up.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            return false;
        }
        // SAFETY: the handle RTLD_NOLOAD returned holds a reference of its own: given back.
        unsafe { libc::dlclose(h) };
        true
    }

    /// Dropped, NVML is shut down and unloaded; left to the process's exit, it stays loaded.
    #[test]
    fn a_released_nvml_is_unloaded_unless_left_to_the_exit() {
        let _one = crate::host::tests::SIMULATED_NVML
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tmp = tempfile::tempdir().unwrap();
        for (i, leave) in [(0, false), (1, true)] {
            // The TEST-ONLY simulated driver, a copy of its own (another inode) each time: no
            // other load of it keeps it loaded.
            let lib = crate::host::tests::simulated_nvml_at(
                &tmp.path().join(format!("libnvidia-ml-{i}.so")),
            );
            let c = CString::new(lib.as_str()).unwrap();
            let mut nvml = Nvml::open(&lib).unwrap();
            assert!(loaded(&c), "positive control: opened, it is loaded");
            nvml.release(leave);
            std::mem::forget(nvml);
            assert_eq!(loaded(&c), leave, "left loaded: {leave}");
        }
    }

    #[test]
    fn a_library_without_nvml_init_is_refused_and_closed() {
        // libc is loaded in every process and exports no NVML.
        let Err(e) = Nvml::open("libc.so.6") else {
            panic!("libc taken for NVML");
        };
        assert!(matches!(e, NvmlError::Missing("nvmlInit_v2")), "{e:?}");
    }
}
