//! The CUDA driver queries the limiter makes for itself: the calling thread's context and its
//! device, device UUIDs and count, memory-pool attributes, array sizes, the primary context's
//! state, and the frees that undo an allocation the cap turns out not to allow.

use super::{extra, real, Extra};
use crate::sys::Lib;
use cuda_abi::result::SUCCESS;
use cuda_abi::{ArrayMemoryRequirements, CuResult, MemAllocationProp};
use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// `CUcontext`, `CUstream`, `CUmemoryPool`, `CUarray`…
pub type Opaque = *mut c_void;

static CTX_GET_CURRENT: Extra = Extra::new(Lib::Cuda, c"cuCtxGetCurrent");
static CTX_GET_DEVICE: Extra = Extra::new(Lib::Cuda, c"cuCtxGetDevice");
static DEVICE_GET_UUID: Extra = Extra::new(Lib::Cuda, c"cuDeviceGetUuid");
static DEVICE_GET_COUNT: Extra = Extra::new(Lib::Cuda, c"cuDeviceGetCount");
static POOL_GET_ATTRIBUTE: Extra = Extra::new(Lib::Cuda, c"cuMemPoolGetAttribute");
static DEVICE_GET_MEM_POOL: Extra = Extra::new(Lib::Cuda, c"cuDeviceGetMemPool");
static DEVICE_GET_DEFAULT_MEM_POOL: Extra = Extra::new(Lib::Cuda, c"cuDeviceGetDefaultMemPool");
static ARRAY_REQUIREMENTS: Extra = Extra::new(Lib::Cuda, c"cuArrayGetMemoryRequirements");
static MIPMAPPED_REQUIREMENTS: Extra =
    Extra::new(Lib::Cuda, c"cuMipmappedArrayGetMemoryRequirements");
static ALLOCATION_GRANULARITY: Extra = Extra::new(Lib::Cuda, c"cuMemGetAllocationGranularity");
static PRIMARY_CTX_GET_STATE: Extra = Extra::new(Lib::Cuda, c"cuDevicePrimaryCtxGetState");
static DEVICE_GET_ATTRIBUTE: Extra = Extra::new(Lib::Cuda, c"cuDeviceGetAttribute");
static STREAM_GET_CTX: Extra = Extra::new(Lib::Cuda, c"cuStreamGetCtx");
static STREAM_IS_CAPTURING: Extra = Extra::new(Lib::Cuda, c"cuStreamIsCapturing");
static CTX_PUSH_CURRENT: Extra = Extra::new(Lib::Cuda, c"cuCtxPushCurrent_v2");
static CTX_POP_CURRENT: Extra = Extra::new(Lib::Cuda, c"cuCtxPopCurrent_v2");

/// `CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT` per CUDA ordinal (0: not asked yet).
static PITCH_ALIGN: [AtomicU64; crate::limits::MAX_DEVICES] =
    [const { AtomicU64::new(0) }; crate::limits::MAX_DEVICES];

/// Bumped whenever a context is created or destroyed (invalidates the per-thread cache).
static CTX_GEN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (generation, context, ordinal) of the last context seen on this thread.
    static CURRENT: Cell<(u64, usize, usize)> = const { Cell::new((u64::MAX, 0, 0)) };
}

/// A context was created or destroyed: forget every thread's cached (context, device).
pub fn contexts_changed() {
    CTX_GEN.fetch_add(1, Ordering::AcqRel);
}

/// The calling thread's current context and its CUDA ordinal.
#[inline]
pub fn current() -> Option<(usize, usize)> {
    let get_current = extra!(
        CTX_GET_CURRENT,
        unsafe extern "C" fn(*mut Opaque) -> CuResult
    )?;
    let mut ctx: Opaque = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent(CUcontext*) with a valid out-pointer.
    if unsafe { get_current(&mut ctx) } != SUCCESS || ctx.is_null() {
        return None;
    }
    // One device: every context is on ordinal 0 (no thread-local cache to consult).
    if single_device() {
        return Some((ctx as usize, 0));
    }
    let gen = CTX_GEN.load(Ordering::Acquire);
    let (g, c, o) = CURRENT.with(Cell::get);
    if g == gen && c == ctx as usize {
        return Some((c, o));
    }
    let get_device = extra!(CTX_GET_DEVICE, unsafe extern "C" fn(*mut c_int) -> CuResult)?;
    let mut dev: c_int = -1;
    // SAFETY: cuCtxGetDevice(CUdevice*) with a valid out-pointer.
    if unsafe { get_device(&mut dev) } != SUCCESS {
        return None;
    }
    let ord = usize::try_from(dev).ok()?;
    CURRENT.with(|cur| cur.set((gen, ctx as usize, ord)));
    Some((ctx as usize, ord))
}

/// CUDA ordinal of the calling thread's current context.
#[inline]
pub fn current_ordinal() -> Option<usize> {
    current().map(|(_, o)| o)
}

/// The CUDA ordinal of the device stream `stream` belongs to: the current context's for the
/// NULL stream and the `CU_STREAM_LEGACY`/`CU_STREAM_PER_THREAD` handles, else its context's
/// (`cuStreamGetCtx`; a context that is not current is asked for its device by pushing it).
pub fn stream_ordinal(stream: usize) -> Option<usize> {
    let (cur, ord) = current()?;
    if stream <= 2 {
        return Some(ord);
    }
    let get_ctx = extra!(
        STREAM_GET_CTX,
        unsafe extern "C" fn(Opaque, *mut Opaque) -> CuResult
    )?;
    let mut ctx: Opaque = std::ptr::null_mut();
    // SAFETY: cuStreamGetCtx(CUstream, CUcontext*) with the caller's stream and an out-pointer.
    if unsafe { get_ctx(stream as Opaque, &mut ctx) } != SUCCESS || ctx.is_null() {
        return None;
    }
    if ctx as usize == cur {
        return Some(ord);
    }
    let push = extra!(CTX_PUSH_CURRENT, unsafe extern "C" fn(Opaque) -> CuResult)?;
    let pop = extra!(
        CTX_POP_CURRENT,
        unsafe extern "C" fn(*mut Opaque) -> CuResult
    )?;
    let get_device = extra!(CTX_GET_DEVICE, unsafe extern "C" fn(*mut c_int) -> CuResult)?;
    // SAFETY: cuCtxPushCurrent_v2 with a context the driver just named.
    if unsafe { push(ctx) } != SUCCESS {
        return None;
    }
    let mut dev: c_int = -1;
    // SAFETY: cuCtxGetDevice(CUdevice*) with a valid out-pointer.
    let r = unsafe { get_device(&mut dev) };
    let mut popped: Opaque = std::ptr::null_mut();
    // SAFETY: pops the context pushed above (cuCtxPopCurrent_v2 with an out-pointer).
    unsafe { pop(&mut popped) };
    (r == SUCCESS).then(|| usize::try_from(dev).ok()).flatten()
}

/// Whether `stream` is being captured into a graph (`cuStreamIsCapturing` says
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`). The NULL and `CU_STREAM_LEGACY` streams cannot be.
pub fn capturing(stream: usize) -> bool {
    if stream == 0 || stream == 1 {
        return false;
    }
    let Some(f) = extra!(
        STREAM_IS_CAPTURING,
        unsafe extern "C" fn(Opaque, *mut c_int) -> CuResult
    ) else {
        return false;
    };
    let mut status: c_int = 0;
    // SAFETY: cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*) with the caller's stream.
    let r = unsafe { f(stream as Opaque, &mut status) };
    r == SUCCESS && status == 1
}

/// An `int` attribute (`CU_MEMPOOL_ATTR_REUSE_*`) of memory pool `pool`.
pub fn pool_attr_int(pool: usize, which: c_int) -> Option<c_int> {
    let f = extra!(
        POOL_GET_ATTRIBUTE,
        unsafe extern "C" fn(Opaque, c_int, *mut c_void) -> CuResult
    )?;
    let mut v: c_int = 0;
    // SAFETY: cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void*); the reuse
    // attributes are int and `v` is a valid out-pointer.
    (unsafe { f(pool as Opaque, which, (&mut v as *mut c_int).cast()) } == SUCCESS).then_some(v)
}

/// UUID bytes of CUDA ordinal `ord`.
pub fn uuid(ord: usize) -> Option<[u8; 16]> {
    let f = extra!(
        DEVICE_GET_UUID,
        unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult
    )?;
    let mut uuid = [0u8; 16];
    // SAFETY: cuDeviceGetUuid(CUuuid*, CUdevice) with a valid 16-byte out-buffer.
    (unsafe { f(&mut uuid, c_int::try_from(ord).ok()?) } == SUCCESS).then_some(uuid)
}

/// Number of CUDA devices this process sees (`None` before `cuInit` or without a driver).
pub fn device_count() -> Option<usize> {
    let f = extra!(
        DEVICE_GET_COUNT,
        unsafe extern "C" fn(*mut c_int) -> CuResult
    )?;
    let mut n: c_int = 0;
    // SAFETY: cuDeviceGetCount(int*) with a valid out-pointer.
    (unsafe { f(&mut n) } == SUCCESS)
        .then(|| usize::try_from(n).ok())
        .flatten()
}

/// [`single_device`]'s answer once the driver gave it: 0 not known yet, 1 one device, 2
/// several (or none).
static SINGLE: AtomicU8 = AtomicU8::new(0);

/// Whether the driver has already said that this process sees exactly one device (one load;
/// false while it has not answered).
#[inline(always)]
pub fn known_single_device() -> bool {
    SINGLE.load(Ordering::Relaxed) == 1
}

/// Whether this process sees exactly one CUDA device (then every context is on ordinal 0),
/// asked of the driver until it answers, then remembered: the devices a process sees are
/// fixed at `cuInit`.
#[inline]
pub fn single_device() -> bool {
    match SINGLE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => match device_count() {
            Some(n) => {
                SINGLE.store(if n == 1 { 1 } else { 2 }, Ordering::Relaxed);
                n == 1
            }
            None => false,
        },
    }
}

/// A `cuuint64_t` attribute (`cuda_abi::pool_attr`) of memory pool `pool`.
pub fn pool_attr(pool: usize, which: c_int) -> Option<u64> {
    let f = extra!(
        POOL_GET_ATTRIBUTE,
        unsafe extern "C" fn(Opaque, c_int, *mut c_void) -> CuResult
    )?;
    let mut v: u64 = 0;
    // SAFETY: cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void*); the attributes
    // asked for here are all cuuint64_t and `v` is a valid out-pointer.
    (unsafe { f(pool as Opaque, which, (&mut v as *mut u64).cast()) } == SUCCESS).then_some(v)
}

fn pool_query(slot: &Extra, ord: usize) -> Option<usize> {
    let f = extra!(slot, unsafe extern "C" fn(*mut Opaque, c_int) -> CuResult)?;
    let mut pool: Opaque = std::ptr::null_mut();
    // SAFETY: cuDeviceGetMemPool and cuDeviceGetDefaultMemPool are both
    // CUresult f(CUmemoryPool*, CUdevice); `pool` is a valid out-pointer.
    let r = unsafe { f(&mut pool, c_int::try_from(ord).ok()?) };
    (r == SUCCESS && !pool.is_null()).then_some(pool as usize)
}

/// The current memory pool of CUDA ordinal `ord` (`cuDeviceGetMemPool`).
pub fn current_pool(ord: usize) -> Option<usize> {
    pool_query(&DEVICE_GET_MEM_POOL, ord)
}

/// The device of a pool the limiter has not seen created: the one whose default or current
/// pool it is.
pub fn device_of_pool(pool: usize) -> Option<usize> {
    (0..device_count()?).find(|&ord| {
        pool_query(&DEVICE_GET_DEFAULT_MEM_POOL, ord) == Some(pool)
            || current_pool(ord) == Some(pool)
    })
}

/// Device memory array `handle` takes on CUDA ordinal `ord`, as the driver reports it
/// (`cuArrayGetMemoryRequirements`, or the mipmapped form).
pub fn array_size(handle: usize, ord: usize, mipmapped: bool) -> Option<u64> {
    let slot = if mipmapped {
        &MIPMAPPED_REQUIREMENTS
    } else {
        &ARRAY_REQUIREMENTS
    };
    let f = extra!(
        slot,
        unsafe extern "C" fn(*mut ArrayMemoryRequirements, Opaque, c_int) -> CuResult
    )?;
    let mut req = ArrayMemoryRequirements::default();
    // SAFETY: both functions are CUresult f(CUDA_ARRAY_MEMORY_REQUIREMENTS*, handle, CUdevice);
    // `req` is a valid out-pointer and `handle` an array the driver just created.
    let r = unsafe { f(&mut req, handle as Opaque, c_int::try_from(ord).ok()?) };
    (r == SUCCESS).then_some(req.size as u64)
}

/// `CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT` of CUDA ordinal `ord`, asked once.
pub fn texture_pitch_alignment(ord: usize) -> Option<u64> {
    let cached = PITCH_ALIGN.get(ord)?;
    let v = cached.load(Ordering::Relaxed);
    if v != 0 {
        return Some(v);
    }
    let f = extra!(
        DEVICE_GET_ATTRIBUTE,
        unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult
    )?;
    let mut a: c_int = 0;
    // SAFETY: cuDeviceGetAttribute(int*, CUdevice_attribute, CUdevice) with a valid out-pointer.
    let r = unsafe {
        f(
            &mut a,
            cuda_abi::device_attr::TEXTURE_PITCH_ALIGNMENT,
            c_int::try_from(ord).ok()?,
        )
    };
    let v = u64::try_from(a).ok().filter(|&v| r == SUCCESS && v > 0)?;
    cached.store(v, Ordering::Relaxed);
    Some(v)
}

/// The minimum granularity of `cuMemCreate` sizes for `prop`.
///
/// # Safety
/// `prop` is a valid `CUmemAllocationProp` (the one the caller passed to `cuMemCreate`).
pub unsafe fn allocation_granularity(prop: *const MemAllocationProp) -> Option<u64> {
    let f = extra!(
        ALLOCATION_GRANULARITY,
        unsafe extern "C" fn(*mut usize, *const MemAllocationProp, c_uint) -> CuResult
    )?;
    let mut g: usize = 0;
    // SAFETY: cuMemGetAllocationGranularity(size_t*, const CUmemAllocationProp*, MINIMUM = 0)
    // with a valid out-pointer and `prop` valid per the caller.
    (unsafe { f(&mut g, prop, 0) } == SUCCESS && g != 0).then_some(g as u64)
}

/// Releases `cuMemCreate` handle `h` through the real `cuMemRelease` (undoing an allocation).
pub fn release(h: u64) -> CuResult {
    let f = real!(cuMemRelease as unsafe extern "C" fn(u64) -> CuResult);
    // SAFETY: `h` is a handle the driver has just created and nobody else knows.
    unsafe { f(h) }
}

/// Whether the primary context of CUDA ordinal `ord` is active.
pub fn primary_active(ord: usize) -> Option<bool> {
    let f = extra!(
        PRIMARY_CTX_GET_STATE,
        unsafe extern "C" fn(c_int, *mut c_uint, *mut c_int) -> CuResult
    )?;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: cuDevicePrimaryCtxGetState(CUdevice, unsigned*, int*) with valid out-pointers.
    (unsafe { f(c_int::try_from(ord).ok()?, &mut flags, &mut active) } == SUCCESS)
        .then_some(active != 0)
}

/// Frees device pointer `ptr` through the real `cuMemFree_v2` (undoing an allocation).
pub fn free(ptr: u64) -> CuResult {
    let f = real!(cuMemFree_v2 as unsafe extern "C" fn(u64) -> CuResult);
    // SAFETY: `ptr` is an allocation the driver has just handed out and nobody else knows.
    unsafe { f(ptr) }
}

/// Destroys array `handle` through the real `cuArrayDestroy`/`cuMipmappedArrayDestroy`.
pub fn destroy_array(handle: usize, mipmapped: bool) -> CuResult {
    let f = if mipmapped {
        real!(cuMipmappedArrayDestroy as unsafe extern "C" fn(Opaque) -> CuResult)
    } else {
        real!(cuArrayDestroy as unsafe extern "C" fn(Opaque) -> CuResult)
    };
    // SAFETY: `handle` is an array the driver has just created and nobody else knows.
    unsafe { f(handle as Opaque) }
}
