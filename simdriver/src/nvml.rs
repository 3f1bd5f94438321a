//! TEST-ONLY: the NVML half of the simulated driver (`libnvidia-ml.so.1` stand-in).
//!
//! Signatures follow `nvml.h`. Handles are pointers into a static table, validated when passed
//! back. Calls before `nvmlInit*` return `NVML_ERROR_UNINITIALIZED`.

use crate::config::{self, config, device_count, MAX_DEVICES};
use crate::state;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};

mod limits;
pub use limits::*;

pub type NvmlReturn = c_uint;
pub const SUCCESS: NvmlReturn = 0;
pub const UNINITIALIZED: NvmlReturn = 1;
pub const INVALID_ARGUMENT: NvmlReturn = 2;
pub const NOT_SUPPORTED: NvmlReturn = 3;
pub const NO_PERMISSION: NvmlReturn = 4;
pub const NOT_FOUND: NvmlReturn = 6;
pub const INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const UNKNOWN: NvmlReturn = 999;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// What an `nvmlDevice_t` points at.
#[repr(C)]
pub struct Handle {
    index: u32,
}

static HANDLES: [Handle; MAX_DEVICES] = {
    let mut h = [const { Handle { index: 0 } }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        h[i].index = i as u32;
        i += 1;
    }
    h
};

pub type NvmlDevice = *const Handle;

fn handle_for(i: usize) -> NvmlDevice {
    &HANDLES[i]
}

/// Index behind a handle, if it is one of ours and in range.
fn index_of(dev: NvmlDevice) -> Option<usize> {
    let base = HANDLES.as_ptr() as usize;
    let p = dev as usize;
    let size = std::mem::size_of::<Handle>();
    if p < base || p >= base + MAX_DEVICES * size || !(p - base).is_multiple_of(size) {
        return None;
    }
    let i = (p - base) / size;
    (i < device_count()).then_some(i)
}

fn initialized() -> bool {
    INIT_COUNT.load(Ordering::Acquire) > 0
}

/// Common prologue: fault injection, init check, handle check.
fn enter(name: &str, dev: Option<NvmlDevice>) -> Result<usize, NvmlReturn> {
    if let Some(code) = config::fail_code(name) {
        return Err(code.unwrap_or(UNKNOWN));
    }
    if !initialized() {
        return Err(UNINITIALIZED);
    }
    match dev {
        Some(d) => index_of(d).ok_or(INVALID_ARGUMENT),
        None => Ok(0),
    }
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// Copies `s` NUL-terminated into `buf` of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn put_str(s: &str, buf: *mut c_char, len: c_uint) -> NvmlReturn {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: caller guarantees `len` writable bytes; we write s.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    SUCCESS
}

/// Writes `v` through `p` if non-null.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> NvmlReturn {
    if p.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and, per the caller, valid for writes.
    unsafe { p.write(v) };
    SUCCESS
}

fn init(name: &str) -> NvmlReturn {
    if config::fails(name) {
        return UNKNOWN;
    }
    if let Some(log) = &config().init_log {
        note_init(log);
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    SUCCESS
}

/// Appends `<pid> <argv joined by spaces>` to `GPUSHARE_SIM_INIT_LOG`, in one write (lines of
/// processes that load NVML at the same time do not interleave).
fn note_init(log: &std::path::Path) {
    use std::io::Write;
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let line = format!("{} {}\n", std::process::id(), args.join(" "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        config::warn(&format!("GPUSHARE_SIM_INIT_LOG={}: {e}", log.display()));
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    init("nvmlInit_v2")
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    init("nvmlInit")
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    init("nvmlInitWithFlags")
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    if config::fails("nvmlShutdown") {
        return UNKNOWN;
    }
    let r = INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    if r.is_ok() {
        SUCCESS
    } else {
        UNINITIALIZED
    }
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NO_PERMISSION => c"Insufficient Permissions",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        FUNCTION_NOT_FOUND => c"Function Not Found",
        UNKNOWN => c"Unknown Error",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// # Safety
/// `version` must be valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    tri!(enter("nvmlSystemGetDriverVersion", None));
    // SAFETY: `version` is null or valid for `length` bytes of writes, as this function's
    // `# Safety` requires of the caller; `put_str` refuses null and writes at most `length` bytes,
    // NUL included.
    unsafe { put_str(config::DRIVER_VERSION, version, length) }
}

/// # Safety
/// `version` must be valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    tri!(enter("nvmlSystemGetNVMLVersion", None));
    // SAFETY: `version` is null or valid for `length` bytes of writes, as this function's
    // `# Safety` requires of the caller; `put_str` refuses null and writes at most `length` bytes,
    // NUL included.
    unsafe { put_str(config::NVML_VERSION, version, length) }
}

/// # Safety
/// `v` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> NvmlReturn {
    tri!(enter("nvmlSystemGetCudaDriverVersion", None));
    // SAFETY: `v` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(v, config::CUDA_VERSION) }
}

/// # Safety
/// `v` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> NvmlReturn {
    tri!(enter("nvmlSystemGetCudaDriverVersion_v2", None));
    // SAFETY: `v` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(v, config::CUDA_VERSION) }
}

fn get_count(name: &str, count: *mut c_uint) -> NvmlReturn {
    tri!(enter(name, None));
    // SAFETY: `count` is null or writable per the C API contract.
    unsafe { put(count, device_count() as c_uint) }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    get_count("nvmlDeviceGetCount_v2", count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    get_count("nvmlDeviceGetCount", count)
}

fn by_index(name: &str, index: c_uint, device: *mut NvmlDevice) -> NvmlReturn {
    tri!(enter(name, None));
    if index as usize >= device_count() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: `device` is null or writable per the C API contract.
    unsafe { put(device, handle_for(index as usize)) }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    by_index("nvmlDeviceGetHandleByIndex_v2", index, device)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn {
    by_index("nvmlDeviceGetHandleByIndex", index, device)
}

/// # Safety
/// `s` must be null or a NUL-terminated string.
unsafe fn c_str<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

/// # Safety
/// `uuid` must be a NUL-terminated string; `device` null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    tri!(enter("nvmlDeviceGetHandleByUUID", None));
    // SAFETY: `device` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    let Some(want) = (unsafe { c_str(uuid) }) else {
        return INVALID_ARGUMENT;
    };
    match (0..device_count()).find(|&i| config::uuid(i).eq_ignore_ascii_case(want)) {
        // SAFETY: `device` is null or valid for one write of its type, as this function's
        // `# Safety` requires of the caller; `put` refuses null.
        Some(i) => unsafe { put(device, handle_for(i)) },
        None => NOT_FOUND,
    }
}

/// # Safety
/// `bus_id` must be a NUL-terminated string; `device` null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    tri!(enter("nvmlDeviceGetHandleByPciBusId_v2", None));
    // SAFETY: `bus_id` is null or a NUL-terminated string, as this function's `# Safety` requires
    // of the caller; `c_str` refuses null.
    let Some(want) = (unsafe { c_str(bus_id) }) else {
        return INVALID_ARGUMENT;
    };
    let want = want.to_ascii_lowercase();
    let matches = |i: usize| {
        let id = config::pci_bus_id(i);
        id == want || id[4..] == *want
    };
    match (0..device_count()).find(|&i| matches(i)) {
        // SAFETY: `device` is null or valid for one write of its type, as this function's
        // `# Safety` requires of the caller; `put` refuses null.
        Some(i) => unsafe { put(device, handle_for(i)) },
        None => NOT_FOUND,
    }
}

/// # Safety
/// `uuid` must be valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetUUID", Some(device)));
    // SAFETY: `uuid` is null or valid for `length` bytes of writes, as this function's `# Safety`
    // requires of the caller; `put_str` refuses null and writes at most `length` bytes, NUL
    // included.
    unsafe { put_str(&config::uuid(i), uuid, length) }
}

/// # Safety
/// `name` must be valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    tri!(enter("nvmlDeviceGetName", Some(device)));
    // SAFETY: `name` is null or valid for `length` bytes of writes, as this function's `# Safety`
    // requires of the caller; `put_str` refuses null and writes at most `length` bytes, NUL
    // included.
    unsafe { put_str(config::NAME, name, length) }
}

/// # Safety
/// `index` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetIndex", Some(device)));
    // SAFETY: `index` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(index, i as c_uint) }
}

/// # Safety
/// `minor` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: NvmlDevice,
    minor: *mut c_uint,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetMinorNumber", Some(device)));
    // SAFETY: `minor` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(minor, i as c_uint) }
}

/// `nvmlPciInfo_t` as laid out in nvml.h.
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// # Safety
/// `pci` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: NvmlDevice,
    pci: *mut PciInfo,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetPciInfo_v3", Some(device)));
    let id = config::pci_bus_id(i);
    let mut info = PciInfo {
        bus_id_legacy: [0; 16],
        domain: 0,
        bus: i as c_uint + 1,
        device: 0,
        pci_device_id: 0x2330_10de,
        pci_sub_system_id: 0,
        bus_id: [0; 32],
    };
    for (k, b) in id.bytes().enumerate() {
        info.bus_id[k] = b as c_char;
    }
    for (k, b) in id[4..].bytes().enumerate() {
        info.bus_id_legacy[k] = b as c_char;
    }
    // SAFETY: `pci` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(pci, info) }
}

/// # Safety
/// `mode` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetComputeMode", Some(device)));
    // SAFETY: `mode` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(mode, state::compute_mode(i)) }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceSetComputeMode(device: NvmlDevice, mode: c_uint) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceSetComputeMode", Some(device)));
    if mode > 3 {
        return INVALID_ARGUMENT;
    }
    match state::set_compute_mode(i, mode) {
        Ok(()) => SUCCESS,
        Err(_) => UNKNOWN,
    }
}

pub use cuda_abi::nvml::{Memory, MemoryV2, MEMORY_V2};

/// `(total, used)` of GPU `i` as the calling process sees it: capped by its cgroup's hard
/// memory limit, if one applies (used is then what the limit leaves unavailable).
fn mem_of(i: usize) -> (u64, u64) {
    let total = config().devices[i];
    let (total, free) = crate::memlimits::view(i, total, state::used_on(i).min(total));
    (total, total - free)
}

/// # Safety
/// `memory` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut Memory,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetMemoryInfo", Some(device)));
    let (total, used) = mem_of(i);
    // SAFETY: `memory` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe {
        put(
            memory,
            Memory {
                total,
                free: total - used,
                used,
            },
        )
    }
}

/// # Safety
/// `memory` must be null or a writable `nvmlMemory_v2_t` with `version` set.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetMemoryInfo_v2", Some(device)));
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and readable per the caller.
    if unsafe { (*memory).version } != MEMORY_V2 {
        return 25; // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    }
    let (total, used) = mem_of(i);
    let v = MemoryV2 {
        version: MEMORY_V2,
        total,
        reserved: 0,
        free: total - used,
        used,
    };
    // SAFETY: `memory` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(memory, v) }
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// Window the device-wide utilisation is averaged over.
const UTIL_WINDOW_NS: u64 = 1_000_000_000;

fn percent(busy: u64, window: u64) -> c_uint {
    ((busy.saturating_mul(100) + window / 2) / window.max(1)).min(100) as c_uint
}

/// # Safety
/// `util` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    util: *mut Utilization,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetUtilizationRates", Some(device)));
    let now = state::now_ns();
    let t0 = now.saturating_sub(UTIL_WINDOW_NS);
    let mut busy = 0u64;
    state::for_each_live(|_, rec| busy += state::busy_between(&rec.devs[i], t0, now));
    // SAFETY: `util` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe {
        put(
            util,
            Utilization {
                gpu: percent(busy, now - t0),
                memory: 0,
            },
        )
    }
}

pub use cuda_abi::nvml::ProcessUtilizationSample;

/// Per-process SM utilisation: one sample per live process with a context on the device,
/// averaged over `[max(lastSeenTimeStamp, now - 2.5 s), now]` (at least 10 ms). Timestamps
/// are CLOCK_MONOTONIC microseconds.
///
/// # Safety
/// `utilization` must be null or valid for `*count` samples; `count` must be valid.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    utilization: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> NvmlReturn {
    let i = tri!(enter("nvmlDeviceGetProcessUtilization", Some(device)));
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    let now = state::now_ns();
    let history = (state::BUCKETS as u64 - 6) * state::BUCKET_NS;
    let t0 = last_seen
        .saturating_mul(1000)
        .max(now.saturating_sub(history))
        .min(now.saturating_sub(state::BUCKET_NS));
    let mut samples = Vec::new();
    state::for_each_live(|pid, rec| {
        let dev = &rec.devs[i];
        if dev.has_ctx.load(Ordering::Relaxed) != 0 {
            samples.push(ProcessUtilizationSample {
                pid,
                time_stamp: now / 1000,
                sm_util: percent(state::busy_between(dev, t0, now), now - t0),
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            });
        }
    });
    // SAFETY: `count` checked non-null; valid per the caller.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = samples.len() as c_uint };
    if samples.is_empty() {
        return NOT_FOUND;
    }
    if utilization.is_null() || cap < samples.len() {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: `utilization` holds at least `cap >= samples.len()` entries.
    unsafe { std::ptr::copy_nonoverlapping(samples.as_ptr(), utilization, samples.len()) };
    SUCCESS
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` / `nvmlProcessInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

fn running(i: usize) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    state::for_each_live(|pid, rec| {
        let dev = &rec.devs[i];
        if dev.has_ctx.load(Ordering::Relaxed) != 0 {
            out.push((pid, dev.mem_used.load(Ordering::Relaxed)));
        }
    });
    out
}

/// # Safety
/// `infos` null or valid for `*count` entries of `T`; `count` valid.
unsafe fn put_procs<T: Copy>(
    name: &str,
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> NvmlReturn {
    let i = tri!(enter(name, Some(device)));
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    let procs = running(i);
    // SAFETY: `count` checked non-null; valid per the caller.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = procs.len() as c_uint };
    if procs.is_empty() {
        return SUCCESS;
    }
    if infos.is_null() || cap < procs.len() {
        return INSUFFICIENT_SIZE;
    }
    for (k, (pid, mem)) in procs.into_iter().enumerate() {
        // SAFETY: k < procs.len() <= cap entries.
        unsafe { infos.add(k).write(make(pid, mem)) };
    }
    SUCCESS
}

/// # Safety
/// See `put_procs`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    // SAFETY: `count` is null or writable and `infos` null or writable for `*count` entries, as
    // this function's `# Safety` requires of the caller, which is `put_procs`'s contract; it
    // refuses a null `count` and writes no more entries than `*count`.
    unsafe {
        put_procs(
            "nvmlDeviceGetComputeRunningProcesses",
            device,
            count,
            infos,
            |pid, m| ProcessInfoV1 {
                pid,
                used_gpu_memory: m,
            },
        )
    }
}

fn v2(pid: u32, m: u64) -> ProcessInfoV2 {
    ProcessInfoV2 {
        pid,
        used_gpu_memory: m,
        gpu_instance_id: u32::MAX,
        compute_instance_id: u32::MAX,
    }
}

/// # Safety
/// See `put_procs`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    // SAFETY: `count` is null or writable and `infos` null or writable for `*count` entries, as
    // this function's `# Safety` requires of the caller, which is `put_procs`'s contract; it
    // refuses a null `count` and writes no more entries than `*count`.
    unsafe {
        put_procs(
            "nvmlDeviceGetComputeRunningProcesses_v2",
            device,
            count,
            infos,
            v2,
        )
    }
}

/// # Safety
/// See `put_procs`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> NvmlReturn {
    // SAFETY: `count` is null or writable and `infos` null or writable for `*count` entries, as
    // this function's `# Safety` requires of the caller, which is `put_procs`'s contract; it
    // refuses a null `count` and writes no more entries than `*count`.
    unsafe {
        put_procs(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            device,
            count,
            infos,
            v2,
        )
    }
}

/// Graphics processes: the simulated driver has none.
///
/// # Safety
/// `count` must be valid.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    tri!(enter(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        Some(device)
    ));
    // SAFETY: `count` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(count, 0) }
}
