//! TEST-ONLY: simulated CUDA stream-ordered memory pools: reserved/used bookkeeping, release
//! threshold, `cuMemAllocAsync`/`cuMemFreeAsync` and the `cuMemPool*` calls.

use super::device_memory::{device_give, device_take, new_ptr};
use super::memory::free_ptr;
use super::{
    dev_index, enter, put, stream_ctx, stream_key, token, with_driver, CuDevice, CuDevicePtr,
    CuResult, Driver, Opaque, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS,
};
use cuda_abi::{MemPoolPropsHead, ALLOCATION_PINNED, LOCATION_DEVICE};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

/// Granularity in which a pool's reserved memory grows and shrinks.
pub const POOL_CHUNK: u64 = super::guesses::POOL_CHUNK;

/// A stream-ordered memory pool: reserved device memory, part of it handed out.
pub(super) struct Pool {
    pub(super) dev: usize,
    pub(super) reserved: u64,
    pub(super) used: u64,
    pub(super) threshold: u64,
    pub(super) reserved_high: u64,
    pub(super) used_high: u64,
    /// `cuMemPoolDestroy` was called while allocations were outstanding: the pool goes away
    /// (and its memory back to the device) when the last one is freed.
    pub(super) destroyed: bool,
    /// Bytes freed per stream (`stream_key`) and not yet synchronised: reused for another
    /// stream only while `reuse_opportunistic` or `reuse_internal` is on (guesses.rs).
    pub(super) pending: HashMap<usize, u64>,
    pub(super) reuse_events: bool,
    pub(super) reuse_opportunistic: bool,
    pub(super) reuse_internal: bool,
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
            pending: HashMap::new(),
            reuse_events: true,
            reuse_opportunistic: true,
            reuse_internal: true,
        }
    }

    /// Free reserved memory an allocation on `stream` may use now.
    fn usable_by(&self, stream: usize) -> u64 {
        let free = self.reserved - self.used;
        if self.reuse_opportunistic || self.reuse_internal {
            return free;
        }
        let others: u64 = self
            .pending
            .iter()
            .filter(|(&s, _)| s != stream)
            .map(|(_, &b)| b)
            .sum();
        free.saturating_sub(others)
    }

    /// A synchronisation: every free has completed.
    pub(super) fn synced(&mut self) {
        self.pending.clear();
    }

    /// Releases reserved memory above `max(used, keep)` (in whole chunks); returns the bytes
    /// given back to the device.
    pub(super) fn shrink_to(&mut self, keep: u64) -> u64 {
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

/// A stream-ordered allocation from `pool`: served from the pool's free reserved memory,
/// the pool growing by whole chunks of device memory only when that is too small.
fn pool_alloc(pool: usize, size: u64, stream: usize) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    with_driver(|d| {
        let p = d
            .pools
            .get_mut(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(INVALID_VALUE)?;
        let free = p.usable_by(stream);
        if free < size {
            let grow = (size - free)
                .checked_next_multiple_of(POOL_CHUNK)
                .ok_or(OUT_OF_MEMORY)?;
            device_take(p.dev, grow)?;
            p.reserved += grow;
            p.reserved_high = p.reserved_high.max(p.reserved);
        }
        // What this stream freed itself is reused first.
        if let Some(own) = p.pending.get_mut(&stream) {
            *own = own.saturating_sub(size);
        }
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        let ptr = new_ptr(size);
        d.pool_allocs.insert(ptr, (pool, size));
        Ok(ptr)
    })
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

fn alloc_async(
    name: &str,
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: Option<Opaque>,
    stream: Opaque,
) -> CuResult {
    tri!(enter(name));
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    if let Some(graph) = super::graphs::capture_of(stream) {
        let p = tri!(super::graphs::captured_alloc(graph, stream, size as u64));
        // SAFETY: checked non-null; writable per the C API contract.
        unsafe { dptr.write(p) };
        return SUCCESS;
    }
    // The stream's device: a stream of another device than the current context's allocates
    // from that device's pool.
    let (_, dev) = tri!(stream_ctx(stream));
    let pool = match pool {
        Some(p) if p.is_null() => return INVALID_VALUE,
        Some(p) => p as usize,
        None => with_driver(|d| current_pool(d, dev)),
    };
    let p = tri!(pool_alloc(pool, size as u64, stream_key(stream)));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { dptr.write(p) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync(dptr: *mut CuDevicePtr, size: usize, stream: Opaque) -> CuResult {
    alloc_async("cuMemAllocAsync", dptr, size, None, stream)
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: Opaque,
) -> CuResult {
    alloc_async("cuMemAllocAsync_ptsz", dptr, size, None, stream)
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: Opaque,
    stream: Opaque,
) -> CuResult {
    alloc_async("cuMemAllocFromPoolAsync", dptr, size, Some(pool), stream)
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: Opaque,
    stream: Opaque,
) -> CuResult {
    alloc_async(
        "cuMemAllocFromPoolAsync_ptsz",
        dptr,
        size,
        Some(pool),
        stream,
    )
}

pub use cuda_abi::pool_attr;

/// # Safety
/// `pool` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetDefaultMemPool"));
    let i = tri!(dev_index(dev));
    let h = with_driver(|d| default_pool(d, i));
    // SAFETY: `pool` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(pool, h as Opaque) }
}

/// # Safety
/// `pool` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Opaque, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetMemPool"));
    let i = tri!(dev_index(dev));
    let h = with_driver(|d| current_pool(d, i));
    // SAFETY: `pool` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
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
    if props.alloc_type != ALLOCATION_PINNED || props.location_type != LOCATION_DEVICE {
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
        // SAFETY: non-null; the reuse attributes are `int` per the caller.
        let v32 = || unsafe { value.cast::<c_int>().read() };
        match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES => p.reuse_events = v32() != 0,
            REUSE_ALLOW_OPPORTUNISTIC => p.reuse_opportunistic = v32() != 0,
            REUSE_ALLOW_INTERNAL_DEPENDENCIES => p.reuse_internal = v32() != 0,
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
            REUSE_FOLLOW_EVENT_DEPENDENCIES => Some(Err(c_int::from(p.reuse_events))),
            REUSE_ALLOW_OPPORTUNISTIC => Some(Err(c_int::from(p.reuse_opportunistic))),
            REUSE_ALLOW_INTERNAL_DEPENDENCIES => Some(Err(c_int::from(p.reuse_internal))),
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

/// A stream-ordered free: the memory goes back to its pool, pending on `stream` until the next
/// synchronisation.
fn free_async(ptr: CuDevicePtr, stream: Opaque) -> CuResult {
    if let Some(graph) = super::graphs::capture_of(stream) {
        super::graphs::captured_free(graph, ptr);
        return SUCCESS;
    }
    let pool = with_driver(|d| d.pool_allocs.get(&ptr).copied());
    let r = free_ptr(ptr);
    if let (SUCCESS, Some((pool, size))) = (r, pool) {
        with_driver(|d| {
            if let Some(p) = d.pools.get_mut(&pool) {
                *p.pending.entry(stream_key(stream)).or_default() += size;
            }
        });
    }
    r
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: CuDevicePtr, stream: Opaque) -> CuResult {
    tri!(enter("cuMemFreeAsync"));
    free_async(ptr, stream)
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: CuDevicePtr, stream: Opaque) -> CuResult {
    tri!(enter("cuMemFreeAsync_ptsz"));
    free_async(ptr, stream)
}
