//! Graph memory: what CUDA graphs with memory-allocation nodes (`cuGraphAddMemAllocNode`, or
//! `cuMemAllocAsync` captured from a stream) take. A graph's memory comes from the device's
//! graph memory pool when the graph is launched, and the pool keeps it (after the allocations
//! are freed too) until `cuDeviceGraphMemTrim`. So, as for stream-ordered pools, what counts is
//! the graph pool's *reserved* memory (`cuDeviceGetGraphMemAttribute`,
//! `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
//!
//! At instantiation the limiter reads the graph's allocation nodes (`cuGraphGetNodes`,
//! `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`) and remembers, per instantiated graph,
//! the bytes it allocates per device. A launch of such a graph is checked first: the launch is
//! refused with `CUDA_ERROR_OUT_OF_MEMORY` when what it allocates, less the pool's free
//! reserved memory, does not fit under the cap; after the launch the pool's growth is charged.
//! `cuDeviceGraphMemTrim` credits what the pool gave back. Launches of graphs without memory
//! nodes pay one atomic load.

use crate::driver::cuda::Opaque;
use crate::driver::{extra, real, Extra};
use crate::limits::MAX_DEVICES;
use crate::state::{self, Ticket};
use crate::sys::Lib;
use cuda_abi::result::{OUT_OF_MEMORY, SUCCESS};
use cuda_abi::{graph_mem_attr, CuResult, MemAllocNodeParams, GRAPH_NODE_TYPE_MEM_ALLOC};
use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

static GET_NODES: Extra = Extra::new(Lib::Cuda, c"cuGraphGetNodes");
static NODE_TYPE: Extra = Extra::new(Lib::Cuda, c"cuGraphNodeGetType");
static ALLOC_PARAMS: Extra = Extra::new(Lib::Cuda, c"cuGraphMemAllocNodeGetParams");
static GRAPH_MEM_ATTR: Extra = Extra::new(Lib::Cuda, c"cuDeviceGetGraphMemAttribute");

/// Per instantiated graph with memory nodes: bytes allocated per CUDA ordinal.
struct Table {
    execs: HashMap<usize, Vec<(usize, u64)>>,
    /// Graph-pool reserved bytes last charged, per CUDA ordinal.
    charged: [u64; MAX_DEVICES],
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);
/// Instantiated graphs with memory nodes (the launch path reads only this when 0).
static WITH_MEMORY: AtomicUsize = AtomicUsize::new(0);

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    let mut g = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Table {
        execs: HashMap::default(),
        charged: [0; MAX_DEVICES],
    }))
}

/// Bytes `graph`'s memory-allocation nodes take, per CUDA ordinal.
fn alloc_needs(graph: Opaque) -> Vec<(usize, u64)> {
    let (Some(get_nodes), Some(node_type), Some(params)) = (
        extra!(
            GET_NODES,
            unsafe extern "C" fn(Opaque, *mut Opaque, *mut usize) -> CuResult
        ),
        extra!(
            NODE_TYPE,
            unsafe extern "C" fn(Opaque, *mut c_uint) -> CuResult
        ),
        extra!(
            ALLOC_PARAMS,
            unsafe extern "C" fn(Opaque, *mut MemAllocNodeParams) -> CuResult
        ),
    ) else {
        return Vec::new();
    };
    let mut n: usize = 0;
    // SAFETY: cuGraphGetNodes(graph, NULL, &n) asks for the count only.
    if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut n) } != SUCCESS || n == 0 {
        return Vec::new();
    }
    let mut nodes: Vec<Opaque> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    if unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut n) } != SUCCESS {
        return Vec::new();
    }
    let mut needs: Vec<(usize, u64)> = Vec::new();
    for &node in nodes.iter().take(n) {
        let mut t: c_uint = 0;
        // SAFETY: a node the driver just listed and a valid out-pointer.
        if unsafe { node_type(node, &mut t) } != SUCCESS || t != GRAPH_NODE_TYPE_MEM_ALLOC {
            continue;
        }
        // SAFETY: all-zero bytes are a valid CUDA_MEM_ALLOC_NODE_PARAMS (null pointers, zeros).
        let mut p: MemAllocNodeParams = unsafe { std::mem::zeroed() };
        // SAFETY: a memory-allocation node and a valid out-pointer.
        if unsafe { params(node, &mut p) } != SUCCESS {
            continue;
        }
        let Ok(ord) = usize::try_from(p.pool_props.location_id) else {
            continue;
        };
        match needs.iter_mut().find(|(o, _)| *o == ord) {
            Some(e) => e.1 = e.1.saturating_add(p.bytesize as u64),
            None => needs.push((ord, p.bytesize as u64)),
        }
    }
    needs
}

/// A `cuuint64_t` graph-memory attribute of CUDA ordinal `ord`.
fn attr(ord: usize, which: c_int) -> Option<u64> {
    let f = extra!(
        GRAPH_MEM_ATTR,
        unsafe extern "C" fn(c_int, c_int, *mut c_void) -> CuResult
    )?;
    let mut v: u64 = 0;
    // SAFETY: cuDeviceGetGraphMemAttribute(CUdevice, attr, void*); every attribute is
    // cuuint64_t and `v` is a valid out-pointer.
    (unsafe {
        f(
            c_int::try_from(ord).ok()?,
            which,
            (&mut v as *mut u64).cast(),
        )
    } == SUCCESS)
        .then_some(v)
}

/// Brings the charge for `ord`'s graph pool to `reserved`.
fn settle(t: &mut Table, ord: usize, reserved: u64) {
    let Some(l) = state::get() else {
        return;
    };
    let Some(old) = t.charged.get_mut(ord) else {
        return;
    };
    if reserved > *old {
        l.charge(ord, reserved - *old);
    } else {
        l.credit(ord, *old - reserved);
    }
    *old = reserved;
}

/// After a successful instantiation of `graph` as `*exec`: remembers its memory nodes.
fn instantiated(exec: *mut Opaque, graph: Opaque, r: CuResult) -> CuResult {
    if r != SUCCESS || exec.is_null() || !state::get().is_some_and(|l| l.any_mem) {
        return r;
    }
    let needs = alloc_needs(graph);
    if !needs.is_empty() {
        // SAFETY: the driver succeeded, so it wrote the new handle through `exec`.
        let e = unsafe { *exec } as usize;
        with(|t| {
            t.execs.insert(e, needs);
            WITH_MEMORY.store(t.execs.len(), Ordering::Release);
        });
    }
    r
}

/// A graph launch: checked against the cap and charged when the graph allocates memory.
#[inline]
pub(crate) fn launch(exec: Opaque, call: impl FnOnce() -> CuResult) -> CuResult {
    if WITH_MEMORY.load(Ordering::Acquire) == 0 {
        return call();
    }
    launch_counted(exec, call)
}

#[cold]
fn launch_counted(exec: Opaque, call: impl FnOnce() -> CuResult) -> CuResult {
    let Some(l) = state::get() else {
        return call();
    };
    let mut g = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(t) = g.as_mut() else {
        return call();
    };
    let Some(needs) = t.execs.get(&(exec as usize)).cloned() else {
        return call();
    };
    let mut tickets: Vec<Ticket> = Vec::new();
    let mut refused = false;
    for &(ord, bytes) in &needs {
        if l.mem_limit(ord).is_none() {
            continue;
        }
        let reserved = attr(ord, graph_mem_attr::RESERVED_MEM_CURRENT);
        let used = attr(ord, graph_mem_attr::USED_MEM_CURRENT);
        let free = match (reserved, used) {
            (Some(r), Some(u)) => {
                settle(t, ord, r);
                r.saturating_sub(u)
            }
            _ => 0,
        };
        match l.reserve(ord, bytes.saturating_sub(free)) {
            Ok(Some(tk)) => tickets.push(tk),
            Ok(None) => {}
            Err(()) => {
                refused = true;
                break;
            }
        }
    }
    if refused {
        for tk in tickets {
            l.unreserve(tk);
        }
        return OUT_OF_MEMORY;
    }
    let r = call();
    if r == SUCCESS {
        for &(ord, _) in &needs {
            if let Some(reserved) = attr(ord, graph_mem_attr::RESERVED_MEM_CURRENT) {
                settle(t, ord, reserved);
            }
        }
    }
    for tk in tickets {
        l.unreserve(tk);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Opaque,
    graph: Opaque,
    flags: u64,
) -> CuResult {
    let f = real!(
        cuGraphInstantiateWithFlags as unsafe extern "C" fn(*mut Opaque, Opaque, u64) -> CuResult
    );
    // SAFETY: `f` is the driver's own `cuGraphInstantiateWithFlags`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `exec` null or writable as the documentation of
    // `cuGraphInstantiateWithFlags` says (the driver refuses null); handles are the driver's to
    // check.
    instantiated(exec, graph, unsafe { f(exec, graph, flags) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 11 form).
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Opaque,
    graph: Opaque,
    error_node: *mut Opaque,
    log: *mut c_char,
    log_size: usize,
) -> CuResult {
    let f = real!(
        cuGraphInstantiate_v2
            as unsafe extern "C" fn(
                *mut Opaque,
                Opaque,
                *mut Opaque,
                *mut c_char,
                usize,
            ) -> CuResult
    );
    // SAFETY: `f` is the driver's own `cuGraphInstantiate_v2`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `exec`, `error_node`, `log` null or writable as the documentation of
    // `cuGraphInstantiate_v2` says (the driver refuses null); handles are the driver's to check.
    instantiated(exec, graph, unsafe {
        f(exec, graph, error_node, log, log_size)
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name (CUDA 12,
/// `CUDA_GRAPH_INSTANTIATE_PARAMS`).
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut Opaque,
    graph: Opaque,
    params: *mut c_void,
) -> CuResult {
    let f = real!(
        cuGraphInstantiateWithParams
            as unsafe extern "C" fn(*mut Opaque, Opaque, *mut c_void) -> CuResult
    );
    // SAFETY: `f` is the driver's own `cuGraphInstantiateWithParams`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `exec`, `params` null or writable as the documentation of
    // `cuGraphInstantiateWithParams` says (the driver refuses null); handles are the driver's to
    // check.
    instantiated(exec, graph, unsafe { f(exec, graph, params) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Opaque) -> CuResult {
    let f = real!(cuGraphExecDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: `f` is the driver's own `cuGraphExecDestroy`, typed as cuda.h declares it (`real!`);
    // it gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(exec) };
    if r == SUCCESS && WITH_MEMORY.load(Ordering::Acquire) != 0 {
        with(|t| {
            t.execs.remove(&(exec as usize));
            WITH_MEMORY.store(t.execs.len(), Ordering::Release);
        });
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: c_int) -> CuResult {
    let f = real!(cuDeviceGraphMemTrim as unsafe extern "C" fn(c_int) -> CuResult);
    // SAFETY: `f` is the driver's own `cuDeviceGraphMemTrim`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(dev) };
    if r == SUCCESS && state::get().is_some_and(|l| l.any_mem) {
        if let Ok(ord) = usize::try_from(dev) {
            if let Some(reserved) = attr(ord, graph_mem_attr::RESERVED_MEM_CURRENT) {
                with(|t| settle(t, ord, reserved));
            }
        }
    }
    r
}
