//! TEST-ONLY: the CUDA driver API half of the simulated driver (`libcuda.so.1` stand-in).
//!
//! Allocations are bookkeeping (fake device pointers; memory pools with reserved/used sizes and
//! a release threshold); launches queue simulated busy time that
//! NVML reports as per-process SM utilisation. Only what gpushare's tests need is implemented;
//! everything returns valid `CUresult` codes.
//!
//! This module holds the shared driver state (contexts, allocations, pools) and helpers; the
//! exported functions live in `devices`, `contexts`, `memory`, `pools`, `launch` and
//! `proc_address`, all re-exported here.

use crate::config::{self, device_count};
use crate::state::{self, DevRecord};
use pools::Pool;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
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

static INITIALIZED: AtomicBool = AtomicBool::new(false);

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

fn token() -> Opaque {
    NEXT_PTR.fetch_add(512, Ordering::Relaxed) as Opaque
}

mod contexts;
mod devices;
mod launch;
mod memory;
mod pools;
mod proc_address;

pub use contexts::*;
pub use devices::*;
pub use launch::*;
pub use memory::*;
pub use pools::*;
pub use proc_address::*;
