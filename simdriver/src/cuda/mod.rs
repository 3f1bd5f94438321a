//! TEST-ONLY: the CUDA driver API half of the simulated driver (`libcuda.so.1` stand-in).
//!
//! Allocations are bookkeeping (fake device pointers; memory pools with reserved/used sizes and
//! a release threshold); launches queue simulated busy time that
//! NVML reports as per-process SM utilisation. Only what gpushare's tests need is implemented;
//! everything returns valid `CUresult` codes.
//!
//! This module holds the shared driver state (contexts, allocations, pools) and helpers; the
//! exported functions live in `devices`, `contexts`, `memory`, `arrays`, `host`, `pools`,
//! `launch` and `proc_address`, all re-exported here.

use crate::config::{self, device_count};
use crate::state::{self, DevRecord};
use pools::Pool;
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub use cuda_abi::result::*;
pub use cuda_abi::{CuDevice, CuDevicePtr, CuResult};
pub type Opaque = *mut c_void;

static INITIALIZED: AtomicBool = AtomicBool::new(false);

struct Driver {
    /// Live contexts (address -> device), including primary ones.
    contexts: HashMap<usize, usize>,
    /// Primary context per device and its retain count.
    primary: HashMap<usize, (usize, u32)>,
    /// Contexts per device in this process (for the footprint).
    ctx_count: [u32; config::MAX_DEVICES],
    /// Live allocations: pointer or `cuMemCreate` handle -> what it holds.
    allocs: HashMap<u64, Alloc>,
    /// Live CUDA arrays and mipmapped arrays by handle.
    arrays: HashMap<usize, Array>,
    /// Live page-locked host allocations (`cuMemAllocHost`, `cuMemHostAlloc`): pointer -> bytes.
    host: HashMap<usize, usize>,
    /// Host ranges registered with `cuMemHostRegister`: start pointer.
    registered: HashSet<usize>,
    /// Memory pools by handle (default, current and created ones).
    pools: HashMap<usize, Pool>,
    /// Default pool per device (0: not created yet).
    default_pool: [usize; config::MAX_DEVICES],
    /// Current pool per device set by `cuDeviceSetMemPool` (0: the default pool).
    current_pool: [usize; config::MAX_DEVICES],
    /// Live stream-ordered allocations: pointer -> (pool, bytes).
    pool_allocs: HashMap<u64, (usize, u64)>,
    /// Address ranges and mappings of `cuMemCreate` memory.
    vmm: vmm::Vmm,
    /// Created streams: handle -> the context they belong to.
    streams: HashMap<usize, usize>,
    /// Graphs, memory nodes, capture and the graph memory pools.
    graphs: graphs::Graphs,
}

/// A device allocation: its GPU, size and the context that owns it (0: none, `cuMemCreate`
/// memory belongs to the process, not to a context).
#[derive(Debug, Clone, Copy)]
struct Alloc {
    dev: usize,
    size: u64,
    ctx: usize,
}

/// A CUDA array (or mipmapped array): GPU, bytes, owning context, which kind.
#[derive(Debug, Clone, Copy)]
struct Array {
    dev: usize,
    size: u64,
    ctx: usize,
    mipmapped: bool,
    /// For a `CUDA_ARRAY3D_DEFERRED_MAPPING` array: the bytes it needs once mapped (it holds
    /// none until then); `None` for an ordinary array.
    deferred: Option<u64>,
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
        arrays: HashMap::new(),
        host: HashMap::new(),
        registered: HashSet::new(),
        pools: HashMap::new(),
        default_pool: [0; config::MAX_DEVICES],
        current_pool: [0; config::MAX_DEVICES],
        pool_allocs: HashMap::new(),
        vmm: vmm::Vmm::default(),
        streams: HashMap::new(),
        graphs: graphs::Graphs::default(),
    });
    f(d)
}

fn enter(name: &str) -> Result<(), CuResult> {
    if let Some(code) = config::fail_code(name) {
        return Err(code.unwrap_or(UNKNOWN));
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
    current_ctx().map(|(_, dev)| dev)
}

/// The calling thread's current context and its device.
fn current_ctx() -> Result<(usize, usize), CuResult> {
    let top = CTX_STACK.with(|s| s.borrow().last().copied());
    let ctx = top.ok_or(INVALID_CONTEXT)?;
    let dev = with_driver(|d| d.contexts.get(&ctx).copied()).ok_or(INVALID_CONTEXT)?;
    Ok((ctx, dev))
}

/// The context and device stream `s` belongs to: the calling thread's current context for the
/// NULL stream and the `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2) handles.
fn stream_ctx(s: Opaque) -> Result<(usize, usize), CuResult> {
    let h = s as usize;
    if h <= 2 {
        return current_ctx();
    }
    with_driver(|d| {
        let ctx = *d.streams.get(&h).ok_or(INVALID_HANDLE)?;
        let dev = *d.contexts.get(&ctx).ok_or(INVALID_CONTEXT)?;
        Ok((ctx, dev))
    })
}

/// The key pending frees are kept under for stream `s` (the NULL, legacy and per-thread
/// streams are one stream here).
fn stream_key(s: Opaque) -> usize {
    let h = s as usize;
    if h <= 2 {
        0
    } else {
        h
    }
}

fn token() -> Opaque {
    NEXT_PTR.fetch_add(512, Ordering::Relaxed) as Opaque
}

mod arrays;
mod contexts;
mod device_memory;
mod devices;
mod graphs;
pub mod guesses;
mod host;
mod launch;
mod memory;
mod pools;
mod proc_address;
mod vmm;

pub use arrays::*;
pub use contexts::*;
pub use devices::*;
pub use graphs::*;
pub use host::*;
pub use launch::*;
pub use memory::*;
pub use pools::*;
pub use proc_address::*;
pub use vmm::*;
