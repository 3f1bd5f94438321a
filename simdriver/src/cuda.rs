//! TEST-ONLY: the CUDA driver API half of the simulated driver (`libcuda.so.1` stand-in).
//!
//! Allocations are bookkeeping (fake device pointers; memory pools with reserved/used sizes and
//! a release threshold); launches queue simulated busy time that
//! NVML reports as per-process SM utilisation. Only what gpushare's tests need is implemented;
//! everything returns valid `CUresult` codes.

use crate::config::{self, config, device_count};
use crate::state::{self, DevRecord};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub type CuResult = c_uint;
pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const OUT_OF_MEMORY: CuResult = 2;
pub const NOT_INITIALIZED: CuResult = 3;
pub const INVALID_DEVICE: CuResult = 101;
pub const INVALID_CONTEXT: CuResult = 201;
pub const INVALID_HANDLE: CuResult = 400;
pub const NOT_FOUND: CuResult = 500;
pub const NOT_SUPPORTED: CuResult = 801;
pub const UNKNOWN: CuResult = 999;

pub type CuDevice = c_int;
pub type CuDevicePtr = u64;
pub type Opaque = *mut c_void;

/// Most simulated work that may be queued before a launch blocks.
const QUEUE_NS: u64 = 20_000_000;

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// A context: which device it belongs to.
struct Ctx {
    _dev: usize,
}

struct Driver {
    /// Live contexts (address -> device), including primary ones.
    contexts: HashMap<usize, usize>,
    /// Primary context per device and its retain count.
    primary: HashMap<usize, (usize, u32)>,
    /// Contexts per device in this process (for the footprint).
    ctx_count: [u32; config::MAX_DEVICES],
    /// Live allocations: pointer or handle -> (device, bytes).
    allocs: HashMap<u64, (usize, u64)>,
    /// Memory pools by handle (default, current and created ones).
    pools: HashMap<usize, Pool>,
    /// Default pool per device (0: not created yet).
    default_pool: [usize; config::MAX_DEVICES],
    /// Current pool per device set by `cuDeviceSetMemPool` (0: the default pool).
    current_pool: [usize; config::MAX_DEVICES],
    /// Live stream-ordered allocations: pointer -> (pool, bytes).
    pool_allocs: HashMap<u64, (usize, u64)>,
}

/// Granularity in which a pool's reserved memory grows and shrinks.
pub const POOL_CHUNK: u64 = 2 << 20;

/// A stream-ordered memory pool: reserved device memory, part of it handed out.
struct Pool {
    dev: usize,
    reserved: u64,
    used: u64,
    threshold: u64,
    reserved_high: u64,
    used_high: u64,
    /// `cuMemPoolDestroy` was called while allocations were outstanding: the pool goes away
    /// (and its memory back to the device) when the last one is freed.
    destroyed: bool,
}

impl Pool {
    fn new(dev: usize) -> Pool {
        Pool {
            dev,
            reserved: 0,
            used: 0,
            threshold: 0,
            reserved_high: 0,
            used_high: 0,
            destroyed: false,
        }
    }

    /// Releases reserved memory above `max(used, keep)` (in whole chunks); returns the bytes
    /// given back to the device.
    fn shrink_to(&mut self, keep: u64) -> u64 {
        let target = self.used.max(keep);
        if self.reserved <= target {
            return 0;
        }
        let target = target
            .div_ceil(POOL_CHUNK)
            .saturating_mul(POOL_CHUNK)
            .min(self.reserved);
        let released = self.reserved - target;
        self.reserved = target;
        released
    }
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);
static NEXT_PTR: AtomicU64 = AtomicU64::new(0x7000_0000_0000);

thread_local! {
    static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn with_driver<T>(f: impl FnOnce(&mut Driver) -> T) -> T {
    let mut g = DRIVER.lock().unwrap_or_else(|e| e.into_inner());
    let d = g.get_or_insert_with(|| Driver {
        contexts: HashMap::new(),
        primary: HashMap::new(),
        ctx_count: [0; config::MAX_DEVICES],
        allocs: HashMap::new(),
        pools: HashMap::new(),
        default_pool: [0; config::MAX_DEVICES],
        current_pool: [0; config::MAX_DEVICES],
        pool_allocs: HashMap::new(),
    });
    f(d)
}

fn enter(name: &str) -> Result<(), CuResult> {
    if config::fails(name) {
        return Err(UNKNOWN);
    }
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(NOT_INITIALIZED);
    }
    Ok(())
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> CuResult {
    if p.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null and valid per the caller.
    unsafe { p.write(v) };
    SUCCESS
}

fn dev_index(dev: CuDevice) -> Result<usize, CuResult> {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < device_count())
        .ok_or(INVALID_DEVICE)
}

fn record(dev: usize) -> Option<&'static DevRecord> {
    state::own_record().map(|r| &r.devs[dev])
}

fn current_dev() -> Result<usize, CuResult> {
    let top = CTX_STACK.with(|s| s.borrow().last().copied());
    let ctx = top.ok_or(INVALID_CONTEXT)?;
    with_driver(|d| d.contexts.get(&ctx).copied()).ok_or(INVALID_CONTEXT)
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    if config::fails("cuInit") {
        return UNKNOWN;
    }
    if flags != 0 {
        return INVALID_VALUE;
    }
    let _ = config();
    INITIALIZED.store(true, Ordering::Release);
    SUCCESS
}

/// # Safety
/// `v` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CuResult {
    if config::fails("cuDriverGetVersion") {
        return UNKNOWN;
    }
    // SAFETY: forwarded caller contract.
    unsafe { put(v, config::CUDA_VERSION) }
}

/// # Safety
/// `count` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    tri!(enter("cuDeviceGetCount"));
    // SAFETY: forwarded caller contract.
    unsafe { put(count, device_count() as c_int) }
}

/// # Safety
/// `dev` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CuDevice, ordinal: c_int) -> CuResult {
    tri!(enter("cuDeviceGet"));
    let i = tri!(dev_index(ordinal));
    // SAFETY: forwarded caller contract.
    unsafe { put(dev, i as CuDevice) }
}

/// # Safety
/// `name` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetName"));
    tri!(dev_index(dev));
    // SAFETY: forwarded caller contract.
    unsafe { put_str(config::NAME, name, len) }
}

/// # Safety
/// `buf` null or valid for `len` bytes.
unsafe fn put_str(s: &str, buf: *mut c_char, len: c_int) -> CuResult {
    if buf.is_null() || len <= 0 {
        return INVALID_VALUE;
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: n + 1 <= len writable bytes per the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    SUCCESS
}

/// # Safety
/// `uuid` null or valid for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetUuid"));
    let i = tri!(dev_index(dev));
    // SAFETY: forwarded caller contract.
    unsafe { put(uuid, config::uuid_bytes(i)) }
}

/// # Safety
/// `uuid` null or valid for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetUuid_v2"));
    let i = tri!(dev_index(dev));
    // SAFETY: forwarded caller contract.
    unsafe { put(uuid, config::uuid_bytes(i)) }
}

/// # Safety
/// `bus_id` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CuDevice,
) -> CuResult {
    tri!(enter("cuDeviceGetPCIBusId"));
    let i = tri!(dev_index(dev));
    // SAFETY: forwarded caller contract.
    unsafe { put_str(&config::pci_bus_id(i), bus_id, len) }
}

/// # Safety
/// `bytes` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceTotalMem_v2"));
    let i = tri!(dev_index(dev));
    // SAFETY: forwarded caller contract.
    unsafe { put(bytes, config().devices[i] as usize) }
}

/// # Safety
/// `value` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    dev: CuDevice,
) -> CuResult {
    tri!(enter("cuDeviceGetAttribute"));
    let i = tri!(dev_index(dev));
    let v = match attrib {
        1 => 1024,            // max threads per block
        16 => 132,            // multiprocessor count
        33 => i as c_int + 1, // PCI bus id
        75 => 9,              // compute capability major
        76 => 0,              // compute capability minor
        _ => 0,
    };
    // SAFETY: forwarded caller contract.
    unsafe { put(value, v) }
}

fn ctx_added(d: &mut Driver, dev: usize) {
    d.ctx_count[dev] += 1;
    if d.ctx_count[dev] == 1 {
        if let Some(r) = record(dev) {
            r.has_ctx.store(1, Ordering::Relaxed);
            r.mem_used.fetch_add(config().ctx_bytes, Ordering::Relaxed);
        }
    }
}

fn ctx_removed(d: &mut Driver, dev: usize) {
    d.ctx_count[dev] = d.ctx_count[dev].saturating_sub(1);
    if d.ctx_count[dev] == 0 {
        if let Some(r) = record(dev) {
            r.has_ctx.store(0, Ordering::Relaxed);
            let _ = r
                .mem_used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(config().ctx_bytes))
                });
        }
    }
}

fn new_ctx(d: &mut Driver, dev: usize) -> usize {
    let p = Box::into_raw(Box::new(Ctx { _dev: dev })) as usize;
    d.contexts.insert(p, dev);
    ctx_added(d, dev);
    p
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut Opaque,
    _flags: c_uint,
    dev: CuDevice,
) -> CuResult {
    tri!(enter("cuCtxCreate_v2"));
    let i = tri!(dev_index(dev));
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    if state::compute_mode(i) == 2 {
        return 216; // CUDA_ERROR_CONTEXT_ALREADY_IN_USE is close; prohibited devices refuse contexts
    }
    let p = with_driver(|d| new_ctx(d, i));
    CTX_STACK.with(|s| s.borrow_mut().push(p));
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(ctx, p as Opaque) }
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: Opaque) -> CuResult {
    tri!(enter("cuCtxDestroy_v2"));
    let p = ctx as usize;
    let removed = with_driver(|d| {
        let is_primary = d.primary.values().any(|&(pc, _)| pc == p);
        if is_primary {
            return None;
        }
        let dev = d.contexts.remove(&p)?;
        ctx_removed(d, dev);
        Some(())
    });
    if removed.is_none() {
        return INVALID_CONTEXT;
    }
    CTX_STACK.with(|s| s.borrow_mut().retain(|&c| c != p));
    // SAFETY: `p` came from Box::into_raw in new_ctx and was just removed from the registry.
    drop(unsafe { Box::from_raw(p as *mut Ctx) });
    SUCCESS
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Opaque) -> CuResult {
    tri!(enter("cuCtxGetCurrent"));
    let top = CTX_STACK.with(|s| s.borrow().last().copied()).unwrap_or(0);
    // SAFETY: forwarded caller contract.
    unsafe { put(ctx, top as Opaque) }
}

fn known(p: usize) -> bool {
    with_driver(|d| d.contexts.contains_key(&p))
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Opaque) -> CuResult {
    tri!(enter("cuCtxSetCurrent"));
    let p = ctx as usize;
    if p != 0 && !known(p) {
        return INVALID_CONTEXT;
    }
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if p != 0 {
            s.push(p);
        }
    });
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Opaque) -> CuResult {
    tri!(enter("cuCtxPushCurrent_v2"));
    let p = ctx as usize;
    if !known(p) {
        return INVALID_CONTEXT;
    }
    CTX_STACK.with(|s| s.borrow_mut().push(p));
    SUCCESS
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut Opaque) -> CuResult {
    tri!(enter("cuCtxPopCurrent_v2"));
    let Some(p) = CTX_STACK.with(|s| s.borrow_mut().pop()) else {
        return INVALID_CONTEXT;
    };
    if !ctx.is_null() {
        // SAFETY: non-null; writable per the caller.
        unsafe { ctx.write(p as Opaque) };
    }
    SUCCESS
}

/// # Safety
/// `dev` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CuDevice) -> CuResult {
    tri!(enter("cuCtxGetDevice"));
    let i = tri!(current_dev());
    // SAFETY: forwarded caller contract.
    unsafe { put(dev, i as CuDevice) }
}

fn sync_dev(i: usize) {
    if let Some(r) = record(i) {
        let until = r.busy_until.load(Ordering::Acquire);
        let now = state::now_ns();
        if until > now {
            std::thread::sleep(std::time::Duration::from_nanos(until - now));
        }
    }
}

/// Synchronisation of device `i`: waits for queued work, then every pool on the device
/// releases reserved memory above its release threshold (as CUDA does at synchronisation).
fn sync_and_release(i: usize) {
    sync_dev(i);
    with_driver(|d| {
        for p in d.pools.values_mut().filter(|p| p.dev == i) {
            let released = p.shrink_to(p.threshold);
            device_give(p.dev, released);
        }
    });
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    tri!(enter("cuCtxSynchronize"));
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

/// # Safety
/// `ctx` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter("cuDevicePrimaryCtxRetain"));
    let i = tri!(dev_index(dev));
    if ctx.is_null() {
        return INVALID_VALUE;
    }
    let p = with_driver(|d| {
        if let Some(e) = d.primary.get_mut(&i) {
            e.1 += 1;
            return e.0;
        }
        let p = new_ctx(d, i);
        d.primary.insert(i, (p, 1));
        p
    });
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(ctx, p as Opaque) }
}

fn primary_release(name: &str, dev: CuDevice, reset: bool) -> CuResult {
    tri!(enter(name));
    let i = tri!(dev_index(dev));
    let gone = with_driver(|d| {
        let e = d.primary.get_mut(&i)?;
        e.1 = if reset { 0 } else { e.1.saturating_sub(1) };
        if e.1 > 0 {
            return Some(None);
        }
        let (p, _) = d.primary.remove(&i)?;
        d.contexts.remove(&p);
        ctx_removed(d, i);
        Some(Some(p))
    });
    match gone {
        None if reset => SUCCESS,
        None => INVALID_CONTEXT,
        Some(None) => SUCCESS,
        Some(Some(p)) => {
            CTX_STACK.with(|s| s.borrow_mut().retain(|&c| c != p));
            // SAFETY: `p` came from Box::into_raw in new_ctx and left the registry above.
            drop(unsafe { Box::from_raw(p as *mut Ctx) });
            SUCCESS
        }
    }
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CuDevice) -> CuResult {
    primary_release("cuDevicePrimaryCtxRelease_v2", dev, false)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CuDevice) -> CuResult {
    primary_release("cuDevicePrimaryCtxReset_v2", dev, true)
}

/// # Safety
/// `flags` and `active` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CuDevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    tri!(enter("cuDevicePrimaryCtxGetState"));
    let i = tri!(dev_index(dev));
    let on = with_driver(|d| d.primary.contains_key(&i));
    // SAFETY: forwarded caller contract.
    unsafe {
        let r = put(flags, 0);
        if r != SUCCESS {
            return r;
        }
        put(active, c_int::from(on))
    }
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CuDevice, _flags: c_uint) -> CuResult {
    tri!(enter("cuDevicePrimaryCtxSetFlags_v2"));
    tri!(dev_index(dev));
    SUCCESS
}

// ---- memory ----

fn others_used(dev: usize) -> u64 {
    let own = record(dev).map_or(0, |r| r.mem_used.load(Ordering::Relaxed));
    state::used_on(dev).saturating_sub(own)
}

/// Cached "memory used by other processes" per device, refreshed every 100 ms.
static OTHERS: [(AtomicU64, AtomicU64); config::MAX_DEVICES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; config::MAX_DEVICES];

fn others_used_cached(dev: usize) -> u64 {
    let (val, at) = &OTHERS[dev];
    let now = state::now_ns();
    if now.saturating_sub(at.load(Ordering::Relaxed)) > 100_000_000 {
        val.store(others_used(dev), Ordering::Relaxed);
        at.store(now, Ordering::Relaxed);
    }
    val.load(Ordering::Relaxed)
}

/// Takes `size` bytes of GPU `dev` for this process, or `CUDA_ERROR_OUT_OF_MEMORY`.
fn device_take(dev: usize, size: u64) -> Result<(), CuResult> {
    let total = config().devices[dev];
    let rec = record(dev);
    let own = rec.map_or(0, |r| r.mem_used.load(Ordering::Relaxed));
    if own
        .saturating_add(others_used_cached(dev))
        .saturating_add(size)
        > total
    {
        return Err(OUT_OF_MEMORY);
    }
    if let Some(r) = rec {
        r.mem_used.fetch_add(size, Ordering::Relaxed);
    }
    Ok(())
}

/// Gives `size` bytes of GPU `dev` back.
fn device_give(dev: usize, size: u64) {
    if size == 0 {
        return;
    }
    if let Some(r) = record(dev) {
        let _ = r
            .mem_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(size))
            });
    }
}

fn new_ptr(size: u64) -> u64 {
    NEXT_PTR.fetch_add(size.div_ceil(512) * 512, Ordering::Relaxed)
}

fn alloc_on(dev: usize, size: u64) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    device_take(dev, size)?;
    let ptr = new_ptr(size);
    with_driver(|d| d.allocs.insert(ptr, (dev, size)));
    Ok(ptr)
}

/// A stream-ordered allocation from `pool`: served from the pool's free reserved memory,
/// the pool growing by whole chunks of device memory only when that is too small.
fn pool_alloc(pool: usize, size: u64) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    with_driver(|d| {
        let p = d
            .pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(INVALID_VALUE)?;
        let free = p.reserved - p.used;
        if free < size {
            let grow = (size - free).div_ceil(POOL_CHUNK) * POOL_CHUNK;
            device_take(p.dev, grow)?;
            p.reserved += grow;
            p.reserved_high = p.reserved_high.max(p.reserved);
        }
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        let ptr = new_ptr(size);
        d.pool_allocs.insert(ptr, (pool, size));
        Ok(ptr)
    })
}

fn free_ptr(ptr: u64) -> CuResult {
    if ptr == 0 {
        return SUCCESS;
    }
    with_driver(|d| {
        if let Some((pool, size)) = d.pool_allocs.remove(&ptr) {
            // Back to the pool; the reserved memory stays until a trim or synchronisation.
            if let Some(p) = d.pools.get_mut(&pool) {
                p.used = p.used.saturating_sub(size);
                if p.destroyed && p.used == 0 {
                    device_give(p.dev, p.reserved);
                    d.pools.remove(&pool);
                }
            }
            return SUCCESS;
        }
        match d.allocs.remove(&ptr) {
            Some((dev, size)) => {
                device_give(dev, size);
                SUCCESS
            }
            None => INVALID_VALUE,
        }
    })
}

fn alloc_current(name: &str, dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    tri!(enter(name));
    let dev = tri!(current_dev());
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let p = tri!(alloc_on(dev, size as u64));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { dptr.write(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    alloc_current("cuMemAlloc_v2", dptr, size)
}

/// # Safety
/// `pitch` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _elem: c_uint,
) -> CuResult {
    if pitch.is_null() {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    let r = alloc_current("cuMemAllocPitch_v2", dptr, p.saturating_mul(height));
    if r == SUCCESS {
        // SAFETY: checked non-null; writable per the caller.
        unsafe { pitch.write(p) };
    }
    r
}

#[no_mangle]
pub extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    size: usize,
    _flags: c_uint,
) -> CuResult {
    alloc_current("cuMemAllocManaged", dptr, size)
}

/// The pool `cuMemAllocAsync` uses on GPU `dev`: the one set by `cuDeviceSetMemPool`, else
/// the default pool (created on first use).
fn current_pool(d: &mut Driver, dev: usize) -> usize {
    if d.current_pool[dev] != 0 {
        return d.current_pool[dev];
    }
    default_pool(d, dev)
}

fn default_pool(d: &mut Driver, dev: usize) -> usize {
    if d.default_pool[dev] == 0 {
        let h = token() as usize;
        d.pools.insert(h, Pool::new(dev));
        d.default_pool[dev] = h;
    }
    d.default_pool[dev]
}

fn alloc_async(name: &str, dptr: *mut CuDevicePtr, size: usize, pool: Option<Opaque>) -> CuResult {
    tri!(enter(name));
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let pool = match pool {
        Some(p) if p.is_null() => return INVALID_VALUE,
        Some(p) => p as usize,
        None => {
            let dev = tri!(current_dev());
            with_driver(|d| current_pool(d, dev))
        }
    };
    let p = tri!(pool_alloc(pool, size as u64));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { dptr.write(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync(
    dptr: *mut CuDevicePtr,
    size: usize,
    _stream: Opaque,
) -> CuResult {
    alloc_async("cuMemAllocAsync", dptr, size, None)
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    _stream: Opaque,
) -> CuResult {
    alloc_async("cuMemAllocAsync_ptsz", dptr, size, None)
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: Opaque,
    _stream: Opaque,
) -> CuResult {
    alloc_async("cuMemAllocFromPoolAsync", dptr, size, Some(pool))
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: Opaque,
    _stream: Opaque,
) -> CuResult {
    alloc_async("cuMemAllocFromPoolAsync_ptsz", dptr, size, Some(pool))
}

// ---- memory pools ----

/// `CUmempool_attribute` values (cuda.h).
pub mod pool_attr {
    use std::ffi::c_int;
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
    pub const REUSE_ALLOW_OPPORTUNISTIC: c_int = 2;
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
    pub const RELEASE_THRESHOLD: c_int = 4;
    pub const RESERVED_MEM_CURRENT: c_int = 5;
    pub const RESERVED_MEM_HIGH: c_int = 6;
    pub const USED_MEM_CURRENT: c_int = 7;
    pub const USED_MEM_HIGH: c_int = 8;
}

/// # Safety
/// `pool` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetDefaultMemPool"));
    let i = tri!(dev_index(dev));
    let h = with_driver(|d| default_pool(d, i));
    // SAFETY: forwarded caller contract.
    unsafe { put(pool, h as Opaque) }
}

/// # Safety
/// `pool` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetMemPool"));
    let i = tri!(dev_index(dev));
    let h = with_driver(|d| current_pool(d, i));
    // SAFETY: forwarded caller contract.
    unsafe { put(pool, h as Opaque) }
}

#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(dev: CuDevice, pool: Opaque) -> CuResult {
    tri!(enter("cuDeviceSetMemPool"));
    let i = tri!(dev_index(dev));
    let h = pool as usize;
    with_driver(|d| match d.pools.get(&h) {
        Some(p) if p.dev == i && !p.destroyed => {
            d.current_pool[i] = h;
            SUCCESS
        }
        _ => INVALID_VALUE,
    })
}

/// Head of `CUmemPoolProps`: allocation type, handle types, location {type, id}.
#[repr(C)]
pub struct MemPoolPropsHead {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// # Safety
/// `pool` null or writable; `props` null or a valid `CUmemPoolProps`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Opaque,
    props: *const MemPoolPropsHead,
) -> CuResult {
    tri!(enter("cuMemPoolCreate"));
    if pool.is_null() || props.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null; valid per the caller.
    let props = unsafe { &*props };
    const PINNED: c_uint = 1;
    const LOCATION_DEVICE: c_uint = 1;
    if props.alloc_type != PINNED || props.location_type != LOCATION_DEVICE {
        return INVALID_VALUE;
    }
    let i = tri!(dev_index(props.location_id));
    let h = token() as usize;
    with_driver(|d| d.pools.insert(h, Pool::new(i)));
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(pool, h as Opaque) }
}

/// Destroys a created pool: its free reserved memory goes back now, the rest when the last
/// outstanding allocation is freed. The handle is invalid afterwards; default pools cannot be
/// destroyed.
#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: Opaque) -> CuResult {
    tri!(enter("cuMemPoolDestroy"));
    let h = pool as usize;
    with_driver(|d| {
        if d.default_pool.contains(&h) {
            return INVALID_VALUE;
        }
        let Some(p) = d.pools.get_mut(&h).filter(|p| !p.destroyed) else {
            return INVALID_VALUE;
        };
        let released = p.shrink_to(0);
        device_give(p.dev, released);
        let dev = p.dev;
        if p.used == 0 {
            d.pools.remove(&h);
        } else {
            p.destroyed = true;
        }
        if d.current_pool[dev] == h {
            d.current_pool[dev] = 0;
        }
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: Opaque, keep: usize) -> CuResult {
    tri!(enter("cuMemPoolTrimTo"));
    with_driver(|d| match d.pools.get_mut(&(pool as usize)) {
        Some(p) if !p.destroyed => {
            let released = p.shrink_to(keep as u64);
            device_give(p.dev, released);
            SUCCESS
        }
        _ => INVALID_VALUE,
    })
}

/// # Safety
/// `value` null or valid for the attribute's type (`int` or `cuuint64_t`).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Opaque,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    use pool_attr::*;
    tri!(enter("cuMemPoolSetAttribute"));
    if value.is_null() {
        return INVALID_VALUE;
    }
    with_driver(|d| {
        let Some(p) = d.pools.get_mut(&(pool as usize)).filter(|p| !p.destroyed) else {
            return INVALID_VALUE;
        };
        // SAFETY: non-null; the attribute's type per the caller.
        let v64 = || unsafe { value.cast::<u64>().read() };
        match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES
            | REUSE_ALLOW_OPPORTUNISTIC
            | REUSE_ALLOW_INTERNAL_DEPENDENCIES => {}
            RELEASE_THRESHOLD => p.threshold = v64(),
            RESERVED_MEM_HIGH | USED_MEM_HIGH if v64() != 0 => return INVALID_VALUE,
            RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            USED_MEM_HIGH => p.used_high = p.used,
            _ => return INVALID_VALUE,
        }
        SUCCESS
    })
}

/// # Safety
/// `value` null or writable for the attribute's type (`int` or `cuuint64_t`).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Opaque,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    use pool_attr::*;
    tri!(enter("cuMemPoolGetAttribute"));
    if value.is_null() {
        return INVALID_VALUE;
    }
    let v = with_driver(|d| {
        let p = d.pools.get(&(pool as usize)).filter(|p| !p.destroyed)?;
        match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES
            | REUSE_ALLOW_OPPORTUNISTIC
            | REUSE_ALLOW_INTERNAL_DEPENDENCIES => Some(Err(1)),
            RELEASE_THRESHOLD => Some(Ok(p.threshold)),
            RESERVED_MEM_CURRENT => Some(Ok(p.reserved)),
            RESERVED_MEM_HIGH => Some(Ok(p.reserved_high)),
            USED_MEM_CURRENT => Some(Ok(p.used)),
            USED_MEM_HIGH => Some(Ok(p.used_high)),
            _ => None,
        }
    });
    // SAFETY: non-null; writable for the attribute's type per the caller.
    unsafe {
        match v {
            Some(Ok(v)) => value.cast::<u64>().write(v),
            Some(Err(flag)) => value.cast::<c_int>().write(flag),
            None => return INVALID_VALUE,
        }
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: CuDevicePtr) -> CuResult {
    tri!(enter("cuMemFree_v2"));
    free_ptr(ptr)
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: CuDevicePtr, _stream: Opaque) -> CuResult {
    tri!(enter("cuMemFreeAsync"));
    free_ptr(ptr)
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: CuDevicePtr, _stream: Opaque) -> CuResult {
    tri!(enter("cuMemFreeAsync_ptsz"));
    free_ptr(ptr)
}

/// `CUmemAllocationProp` head: type, requested handle types, location {type, id}.
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// # Safety
/// `handle` null or writable; `prop` null or a valid `CUmemAllocationProp`.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    _flags: u64,
) -> CuResult {
    tri!(enter("cuMemCreate"));
    if handle.is_null() || prop.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null; valid per the caller.
    let id = unsafe { (*prop).location_id };
    let dev = tri!(dev_index(id));
    let h = tri!(alloc_on(dev, size as u64));
    // SAFETY: checked non-null.
    unsafe { handle.write(h) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    tri!(enter("cuMemRelease"));
    if handle == 0 {
        return INVALID_VALUE;
    }
    free_ptr(handle)
}

/// # Safety
/// `free` and `total` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    tri!(enter("cuMemGetInfo_v2"));
    let dev = tri!(current_dev());
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    let t = config().devices[dev];
    let used = state::used_on(dev).min(t);
    // SAFETY: checked non-null; writable per the caller.
    unsafe {
        free.write((t - used) as usize);
        total.write(t as usize);
    }
    SUCCESS
}

// ---- modules, streams, graphs (opaque tokens) ----

fn token() -> Opaque {
    NEXT_PTR.fetch_add(512, Ordering::Relaxed) as Opaque
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut Opaque, _image: *const c_void) -> CuResult {
    tri!(enter("cuModuleLoadData"));
    // SAFETY: forwarded caller contract.
    unsafe { put(out, token()) }
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(_m: Opaque) -> CuResult {
    tri!(enter("cuModuleUnload"));
    SUCCESS
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut Opaque,
    m: Opaque,
    _name: *const c_char,
) -> CuResult {
    tri!(enter("cuModuleGetFunction"));
    if m.is_null() {
        return INVALID_HANDLE;
    }
    // SAFETY: forwarded caller contract.
    unsafe { put(out, token()) }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(out: *mut Opaque, _flags: c_uint) -> CuResult {
    tri!(enter("cuStreamCreate"));
    tri!(current_dev());
    // SAFETY: forwarded caller contract.
    unsafe { put(out, token()) }
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(_s: Opaque) -> CuResult {
    tri!(enter("cuStreamDestroy_v2"));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(_s: Opaque) -> CuResult {
    tri!(enter("cuStreamSynchronize"));
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize_ptsz(_s: Opaque) -> CuResult {
    tri!(enter("cuStreamSynchronize_ptsz"));
    sync_and_release(tri!(current_dev()));
    SUCCESS
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(out: *mut Opaque, _flags: c_uint) -> CuResult {
    tri!(enter("cuGraphCreate"));
    // SAFETY: forwarded caller contract.
    unsafe { put(out, token()) }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut Opaque,
    graph: Opaque,
    _flags: u64,
) -> CuResult {
    tri!(enter("cuGraphInstantiateWithFlags"));
    if graph.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: forwarded caller contract.
    unsafe { put(out, token()) }
}

// ---- launches ----

/// Queues one simulated kernel on the current context's device.
fn launch(name: &str, f: Opaque) -> CuResult {
    tri!(enter(name));
    if f.is_null() {
        return INVALID_HANDLE;
    }
    let dev = tri!(current_dev());
    let Some(r) = record(dev) else {
        return SUCCESS;
    };
    let d = config().kernel_ns;
    if d == 0 {
        return SUCCESS;
    }
    let now = state::now_ns();
    let until = r.busy_until.load(Ordering::Acquire);
    if until > now + QUEUE_NS {
        std::thread::sleep(std::time::Duration::from_nanos(until - now - QUEUE_NS));
    }
    let now = state::now_ns();
    let start = r.busy_until.load(Ordering::Acquire).max(now);
    r.busy_until.store(start + d, Ordering::Release);
    state::add_busy(r, start, start + d);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuLaunchKernel(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    launch("cuLaunchKernel", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchKernel_ptsz(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    launch("cuLaunchKernel_ptsz", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchCooperativeKernel(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
) -> CuResult {
    launch("cuLaunchCooperativeKernel", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Opaque,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shmem: c_uint,
    _stream: Opaque,
    _params: *mut Opaque,
) -> CuResult {
    launch("cuLaunchCooperativeKernel_ptsz", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchKernelEx(
    _config: *const c_void,
    f: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    if _config.is_null() {
        return INVALID_VALUE;
    }
    launch("cuLaunchKernelEx", f)
}

#[no_mangle]
pub extern "C" fn cuLaunchKernelEx_ptsz(
    _config: *const c_void,
    f: Opaque,
    _params: *mut Opaque,
    _extra: *mut Opaque,
) -> CuResult {
    if _config.is_null() {
        return INVALID_VALUE;
    }
    launch("cuLaunchKernelEx_ptsz", f)
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: Opaque, _stream: Opaque) -> CuResult {
    launch("cuGraphLaunch", exec)
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch_ptsz(exec: Opaque, _stream: Opaque) -> CuResult {
    launch("cuGraphLaunch_ptsz", exec)
}

// ---- errors, export tables, cuGetProcAddress ----

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
    // SAFETY: forwarded caller contract.
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
    // SAFETY: forwarded caller contract.
    unsafe { put(out, s.as_ptr()) }
}

/// The CUDA runtime's private export tables are not simulated.
#[no_mangle]
pub extern "C" fn cuGetExportTable(_out: *mut *const c_void, _id: *const c_void) -> CuResult {
    NOT_SUPPORTED
}

/// Symbols whose default form got a `_v2` (or later) at a given CUDA version.
const VERSIONED: &[(&str, c_int, &str)] = &[
    ("cuMemAlloc", 3020, "cuMemAlloc_v2"),
    ("cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"),
    ("cuMemFree", 3020, "cuMemFree_v2"),
    ("cuMemGetInfo", 3020, "cuMemGetInfo_v2"),
    ("cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"),
    ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
    ("cuCtxDestroy", 4000, "cuCtxDestroy_v2"),
    ("cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"),
    ("cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"),
    ("cuStreamDestroy", 4000, "cuStreamDestroy_v2"),
    (
        "cuDevicePrimaryCtxRelease",
        11000,
        "cuDevicePrimaryCtxRelease_v2",
    ),
    (
        "cuDevicePrimaryCtxReset",
        11000,
        "cuDevicePrimaryCtxReset_v2",
    ),
    (
        "cuDevicePrimaryCtxSetFlags",
        11000,
        "cuDevicePrimaryCtxSetFlags_v2",
    ),
    ("cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"),
    ("cuGetProcAddress", 12000, "cuGetProcAddress_v2"),
];

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
        cuCtxDestroy_v2,
        cuCtxGetCurrent,
        cuCtxSetCurrent,
        cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2,
        cuCtxGetDevice,
        cuCtxSynchronize,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxReset_v2,
        cuDevicePrimaryCtxGetState,
        cuDevicePrimaryCtxSetFlags_v2,
        cuMemAlloc_v2,
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
        cuMemGetInfo_v2,
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
        cuStreamSynchronize,
        cuStreamSynchronize_ptsz,
        cuGraphCreate,
        cuGraphInstantiateWithFlags,
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
    if flags & 2 != 0 {
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
    // SAFETY: forwarded caller contract.
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
    // SAFETY: forwarded caller contract.
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
