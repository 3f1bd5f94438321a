//! TEST-ONLY: simulated CUDA graphs with memory nodes. A graph holds memory-allocation nodes
//! (`cuGraphAddMemAllocNode`, or `cuMemAllocAsync` on a stream under capture) and
//! memory-free nodes (`cuGraphAddMemFreeNode`, or `cuMemFreeAsync` under capture). Its memory
//! comes from a per-device graph memory pool when the graph is *launched*: the pool grows (in
//! [`super::guesses::POOL_CHUNK`] steps) when its free memory does not serve the launch, a free
//! node or a later `cuMemFreeAsync`/`cuMemFree_v2` gives the allocation back to the pool, and
//! only `cuDeviceGraphMemTrim` gives the pool's free memory back to the device (synchronisation
//! does not). `cuDeviceGetGraphMemAttribute` reports the pool. Nodes other than memory nodes
//! are not simulated (a graph launch also queues one simulated kernel, in `launch.rs`).

use super::device_memory::{device_give, device_take, new_ptr};
use super::guesses::POOL_CHUNK;
use super::{
    dev_index, enter, put, stream_ctx, stream_key, token, with_driver, CuDevice, CuDevicePtr,
    CuResult, Driver, Opaque, INVALID_HANDLE, INVALID_VALUE, SUCCESS,
};
use crate::config::MAX_DEVICES;
use cuda_abi::{
    graph_mem_attr, MemAllocNodeParams, GRAPH_NODE_TYPE_MEM_ALLOC, GRAPH_NODE_TYPE_MEM_FREE,
    LOCATION_DEVICE,
};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};

#[derive(Clone, Copy)]
enum Node {
    Alloc { dev: usize, ptr: u64, size: u64 },
    Free { ptr: u64 },
}

/// One device's graph memory pool.
#[derive(Default, Clone, Copy)]
struct GraphPool {
    reserved: u64,
    used: u64,
    reserved_high: u64,
    used_high: u64,
}

/// Graphs, their instantiations, streams under capture and the graph memory pools.
#[derive(Default)]
pub(super) struct Graphs {
    /// Graph -> its nodes (node handle, what it does).
    graphs: HashMap<usize, Vec<(usize, Node)>>,
    /// Instantiated graph -> the nodes it runs.
    execs: HashMap<usize, Vec<Node>>,
    /// Stream (`stream_key`) under capture -> the graph being captured.
    capturing: HashMap<usize, usize>,
    pools: [GraphPool; MAX_DEVICES],
    /// Graph allocations now allocated: address -> (device, bytes).
    live: HashMap<u64, (usize, u64)>,
}

/// Frees graph allocation `ptr` back to its device's graph pool; false if it is none.
pub(super) fn free_graph_ptr(d: &mut Driver, ptr: u64) -> bool {
    let Some((dev, size)) = d.graphs.live.remove(&ptr) else {
        return false;
    };
    let p = &mut d.graphs.pools[dev];
    p.used = p.used.saturating_sub(size);
    true
}

/// The graph `stream` is being captured into, if it is.
pub(super) fn capture_of(stream: Opaque) -> Option<usize> {
    with_driver(|d| d.graphs.capturing.get(&stream_key(stream)).copied())
}

/// `cuMemAllocAsync` on a stream under capture: a memory-allocation node on the stream's
/// device; nothing is allocated until the graph is launched.
pub(super) fn captured_alloc(graph: usize, stream: Opaque, size: u64) -> Result<u64, CuResult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    let (_, dev) = stream_ctx(stream)?;
    let ptr = new_ptr(size);
    let node = token() as usize;
    with_driver(|d| {
        d.graphs
            .graphs
            .entry(graph)
            .or_default()
            .push((node, Node::Alloc { dev, ptr, size }));
    });
    Ok(ptr)
}

/// `cuMemFreeAsync` on a stream under capture: a memory-free node.
pub(super) fn captured_free(graph: usize, ptr: u64) {
    let node = token() as usize;
    with_driver(|d| {
        d.graphs
            .graphs
            .entry(graph)
            .or_default()
            .push((node, Node::Free { ptr }))
    });
}

/// The memory part of launching `exec`: its allocations come from the graph pools (growing
/// them as needed, `CUDA_ERROR_OUT_OF_MEMORY` and nothing taken when the device is full), then
/// its free nodes give theirs back. Not an instantiated graph: `CUDA_ERROR_INVALID_HANDLE`.
pub(super) fn launch_memory(exec: usize) -> Result<(), CuResult> {
    with_driver(|d| {
        let nodes = d.graphs.execs.get(&exec).ok_or(INVALID_HANDLE)?.clone();
        let mut taken: Vec<(usize, u64, u64, u64)> = Vec::new(); // dev, ptr, size, grown
        for n in &nodes {
            let Node::Alloc { dev, ptr, size } = *n else {
                continue;
            };
            if d.graphs.live.contains_key(&ptr) {
                // Still allocated from the last launch and never freed.
                undo(d, &taken);
                return Err(INVALID_VALUE);
            }
            let p = &mut d.graphs.pools[dev];
            let free = p.reserved - p.used;
            let grow = if free < size {
                (size - free).div_ceil(POOL_CHUNK) * POOL_CHUNK
            } else {
                0
            };
            if grow > 0 {
                if let Err(e) = device_take(dev, grow) {
                    undo(d, &taken);
                    return Err(e);
                }
            }
            let p = &mut d.graphs.pools[dev];
            p.reserved += grow;
            p.used += size;
            p.reserved_high = p.reserved_high.max(p.reserved);
            p.used_high = p.used_high.max(p.used);
            d.graphs.live.insert(ptr, (dev, size));
            taken.push((dev, ptr, size, grow));
        }
        for n in &nodes {
            if let Node::Free { ptr } = *n {
                free_graph_ptr(d, ptr);
            }
        }
        Ok(())
    })
}

fn undo(d: &mut Driver, taken: &[(usize, u64, u64, u64)]) {
    for &(dev, ptr, size, grown) in taken {
        d.graphs.live.remove(&ptr);
        let p = &mut d.graphs.pools[dev];
        p.used -= size;
        p.reserved -= grown;
        device_give(dev, grown);
    }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(out: *mut Opaque, _flags: c_uint) -> CuResult {
    tri!(enter("cuGraphCreate"));
    if out.is_null() {
        return INVALID_VALUE;
    }
    let g = token();
    with_driver(|d| d.graphs.graphs.insert(g as usize, Vec::new()));
    // SAFETY: `out` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(out, g) }
}

fn instantiate(name: &str, out: *mut Opaque, graph: Opaque) -> CuResult {
    tri!(enter(name));
    if out.is_null() {
        return INVALID_VALUE;
    }
    let Some(nodes) = with_driver(|d| d.graphs.graphs.get(&(graph as usize)).cloned()) else {
        return INVALID_VALUE;
    };
    let e = token();
    let nodes = nodes.into_iter().map(|(_, n)| n).collect();
    with_driver(|d| d.graphs.execs.insert(e as usize, nodes));
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(out, e) }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut Opaque,
    graph: Opaque,
    _flags: u64,
) -> CuResult {
    instantiate("cuGraphInstantiateWithFlags", out, graph)
}

/// The CUDA 11 `cuGraphInstantiate` (error node and log buffer, not filled).
///
/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    out: *mut Opaque,
    graph: Opaque,
    _error_node: *mut Opaque,
    _log: *mut std::ffi::c_char,
    _log_size: usize,
) -> CuResult {
    instantiate("cuGraphInstantiate_v2", out, graph)
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: Opaque) -> CuResult {
    tri!(enter("cuGraphExecDestroy"));
    match with_driver(|d| d.graphs.execs.remove(&(exec as usize))) {
        Some(_) => SUCCESS,
        None => INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: Opaque) -> CuResult {
    tri!(enter("cuGraphDestroy"));
    match with_driver(|d| d.graphs.graphs.remove(&(graph as usize))) {
        Some(_) => SUCCESS,
        None => INVALID_VALUE,
    }
}

/// # Safety
/// `node` null or writable; `params` null or a valid `CUDA_MEM_ALLOC_NODE_PARAMS`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut Opaque,
    graph: Opaque,
    _deps: *const Opaque,
    _ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CuResult {
    tri!(enter("cuGraphAddMemAllocNode"));
    if node.is_null() || params.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null; valid per the caller.
    let p = unsafe { &mut *params };
    if p.pool_props.location_type != LOCATION_DEVICE || p.bytesize == 0 {
        return INVALID_VALUE;
    }
    let dev = tri!(dev_index(p.pool_props.location_id));
    let size = p.bytesize as u64;
    let ptr = new_ptr(size);
    let n = token();
    let added = with_driver(|d| match d.graphs.graphs.get_mut(&(graph as usize)) {
        Some(g) => {
            g.push((n as usize, Node::Alloc { dev, ptr, size }));
            true
        }
        None => false,
    });
    if !added {
        return INVALID_VALUE;
    }
    p.dptr = ptr;
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(node, n) }
}

/// # Safety
/// `node` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut Opaque,
    graph: Opaque,
    _deps: *const Opaque,
    _ndeps: usize,
    dptr: CuDevicePtr,
) -> CuResult {
    tri!(enter("cuGraphAddMemFreeNode"));
    if node.is_null() {
        return INVALID_VALUE;
    }
    let n = token();
    let added = with_driver(|d| match d.graphs.graphs.get_mut(&(graph as usize)) {
        Some(g) => {
            g.push((n as usize, Node::Free { ptr: dptr }));
            true
        }
        None => false,
    });
    if !added {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the caller.
    unsafe { put(node, n) }
}

/// # Safety
/// `num` null or writable; `nodes` null or holds `*num` entries.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: Opaque,
    nodes: *mut Opaque,
    num: *mut usize,
) -> CuResult {
    tri!(enter("cuGraphGetNodes"));
    if num.is_null() {
        return INVALID_VALUE;
    }
    let Some(list) = with_driver(|d| d.graphs.graphs.get(&(graph as usize)).cloned()) else {
        return INVALID_VALUE;
    };
    // SAFETY: checked non-null; valid per the caller.
    let room = unsafe { *num };
    if !nodes.is_null() {
        for (i, (n, _)) in list.iter().take(room).enumerate() {
            // SAFETY: `nodes` holds `room` entries per the caller.
            unsafe { nodes.add(i).write(*n as Opaque) };
        }
    }
    // SAFETY: as above.
    unsafe { num.write(list.len()) };
    SUCCESS
}

fn find_node(node: Opaque) -> Option<Node> {
    with_driver(|d| {
        d.graphs
            .graphs
            .values()
            .flatten()
            .find(|(n, _)| *n == node as usize)
            .map(|&(_, k)| k)
    })
}

/// Only memory nodes are simulated; they report their own types.
///
/// # Safety
/// `kind` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(node: Opaque, kind: *mut c_uint) -> CuResult {
    tri!(enter("cuGraphNodeGetType"));
    let t = match find_node(node) {
        Some(Node::Alloc { .. }) => GRAPH_NODE_TYPE_MEM_ALLOC,
        Some(Node::Free { .. }) => GRAPH_NODE_TYPE_MEM_FREE,
        None => return INVALID_VALUE,
    };
    // SAFETY: `kind` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(kind, t) }
}

/// # Safety
/// `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: Opaque,
    out: *mut MemAllocNodeParams,
) -> CuResult {
    tri!(enter("cuGraphMemAllocNodeGetParams"));
    let Some(Node::Alloc { dev, ptr, size }) = find_node(node) else {
        return INVALID_VALUE;
    };
    if out.is_null() {
        return INVALID_VALUE;
    }
    let p = MemAllocNodeParams {
        pool_props: cuda_abi::MemPoolPropsHead {
            alloc_type: cuda_abi::ALLOCATION_PINNED,
            handle_types: 0,
            location_type: LOCATION_DEVICE,
            location_id: dev as c_int,
        },
        win32_security_attributes: std::ptr::null_mut(),
        pool_reserved: [0; 64],
        access_descs: std::ptr::null(),
        access_desc_count: 0,
        bytesize: size as usize,
        dptr: ptr,
    };
    // SAFETY: checked non-null; writable per the caller.
    unsafe { out.write(p) };
    SUCCESS
}

/// # Safety
/// `graph` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: Opaque, _mode: c_int) -> CuResult {
    tri!(enter("cuStreamBeginCapture_v2"));
    if (stream as usize) == 0 {
        // The legacy NULL stream cannot be captured.
        return super::NOT_SUPPORTED;
    }
    tri!(stream_ctx(stream));
    let g = token() as usize;
    with_driver(|d| {
        d.graphs.graphs.insert(g, Vec::new());
        d.graphs.capturing.insert(stream_key(stream), g);
    });
    SUCCESS
}

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE` (1) while `stream` is captured, else `…_NONE` (0).
///
/// # Safety
/// `status` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: Opaque, status: *mut c_int) -> CuResult {
    tri!(enter("cuStreamIsCapturing"));
    tri!(stream_ctx(stream));
    let on = capture_of(stream).is_some();
    // SAFETY: `status` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(status, c_int::from(on)) }
}

/// # Safety
/// `graph` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Opaque, graph: *mut Opaque) -> CuResult {
    tri!(enter("cuStreamEndCapture"));
    let Some(g) = with_driver(|d| d.graphs.capturing.remove(&stream_key(stream))) else {
        return INVALID_VALUE;
    };
    // SAFETY: `graph` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(graph, g as Opaque) }
}

#[no_mangle]
pub extern "C" fn cuDeviceGraphMemTrim(dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGraphMemTrim"));
    let i = tri!(dev_index(dev));
    let released = with_driver(|d| {
        let p = &mut d.graphs.pools[i];
        let keep = p.used.div_ceil(POOL_CHUNK) * POOL_CHUNK;
        let released = p.reserved.saturating_sub(keep);
        p.reserved -= released;
        released
    });
    device_give(i, released);
    SUCCESS
}

/// # Safety
/// `value` null or writable for a `cuuint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CuDevice,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    tri!(enter("cuDeviceGetGraphMemAttribute"));
    let i = tri!(dev_index(dev));
    let p = with_driver(|d| d.graphs.pools[i]);
    let v = match attr {
        graph_mem_attr::USED_MEM_CURRENT => p.used,
        graph_mem_attr::USED_MEM_HIGH => p.used_high,
        graph_mem_attr::RESERVED_MEM_CURRENT => p.reserved,
        graph_mem_attr::RESERVED_MEM_HIGH => p.reserved_high,
        _ => return INVALID_VALUE,
    };
    // SAFETY: `value` is null or valid for one write of its type (a `u64`, as the attribute's
    // documentation says), as this function's `# Safety` requires of the caller; `put` refuses
    // null.
    unsafe { put(value.cast::<u64>(), v) }
}
