//! TEST-ONLY: simulated CUDA driver initialisation, version and device queries.

use super::{
    dev_index, enter, put, CuDevice, CuResult, INITIALIZED, INVALID_VALUE, SUCCESS, UNKNOWN,
};
use crate::config::{self, config, device_count};
use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::Ordering;

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    if config::fails("cuInit") {
        return UNKNOWN;
    }
    if flags != 0 {
        return INVALID_VALUE;
    }
    let _ = config();
    // An MPS client reads its limits when CUDA initialises (mps.rs).
    let _ = crate::mps::client_limits();
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
    // SAFETY: `v` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(v, config::CUDA_VERSION) }
}

/// # Safety
/// `count` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    tri!(enter("cuDeviceGetCount"));
    // SAFETY: `count` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(count, device_count() as c_int) }
}

/// # Safety
/// `dev` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CuDevice, ordinal: c_int) -> CuResult {
    tri!(enter("cuDeviceGet"));
    let i = tri!(dev_index(ordinal));
    // SAFETY: `dev` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(dev, i as CuDevice) }
}

/// # Safety
/// `name` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetName"));
    tri!(dev_index(dev));
    // SAFETY: `name` is null or valid for `len` bytes of writes, as this function's `# Safety`
    // requires of the caller; `put_str` refuses null and writes at most `len` bytes, NUL included.
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
    // SAFETY: `uuid` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(uuid, config::uuid_bytes(i)) }
}

/// # Safety
/// `uuid` null or valid for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceGetUuid_v2"));
    let i = tri!(dev_index(dev));
    // SAFETY: `uuid` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
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
    // SAFETY: `bus_id` is null or valid for `len` bytes of writes, as this function's `# Safety`
    // requires of the caller; `put_str` refuses null and writes at most `len` bytes, NUL included.
    unsafe { put_str(&config::pci_bus_id(i), bus_id, len) }
}

/// # Safety
/// `bytes` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceTotalMem_v2"));
    let i = tri!(dev_index(dev));
    // SAFETY: `bytes` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(bytes, config().devices[i] as usize) }
}

/// The CUDA < 3.2 form: a 32-bit size, clamped (a guess, see `guesses.rs`).
///
/// # Safety
/// `bytes` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut u32, dev: CuDevice) -> CuResult {
    tri!(enter("cuDeviceTotalMem"));
    let i = tri!(dev_index(dev));
    let t = u32::try_from(crate::config::config().devices[i]).unwrap_or(u32::MAX);
    // SAFETY: `bytes` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(bytes, t) }
}

/// # Safety
/// `value` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    dev: CuDevice,
) -> CuResult {
    use cuda_abi::device_attr::*;
    tri!(enter("cuDeviceGetAttribute"));
    let i = tri!(dev_index(dev));
    // An H100 SXM's figures, which SM limiters size their budgets from.
    let v = match attrib {
        MAX_THREADS_PER_BLOCK => 1024,
        MAX_BLOCK_DIM_X | MAX_BLOCK_DIM_Y => 1024,
        MAX_BLOCK_DIM_Z => 64,
        MAX_GRID_DIM_X => c_int::MAX,
        MAX_GRID_DIM_Y | MAX_GRID_DIM_Z => 65535,
        MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        TOTAL_CONSTANT_MEMORY => 64 << 10,
        WARP_SIZE => 32,
        MAX_PITCH => c_int::MAX,
        MAX_REGISTERS_PER_BLOCK | MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        CLOCK_RATE => 1_980_000,
        TEXTURE_ALIGNMENT => 512,
        // The row alignment this driver really pads arrays and pitched memory to.
        TEXTURE_PITCH_ALIGNMENT => crate::config::config().pitch_align as c_int,
        GPU_OVERLAP | CAN_MAP_HOST_MEMORY | CONCURRENT_KERNELS | ECC_ENABLED => 1,
        UNIFIED_ADDRESSING | STREAM_PRIORITIES_SUPPORTED | MANAGED_MEMORY => 1,
        CONCURRENT_MANAGED_ACCESS | COOPERATIVE_LAUNCH => 1,
        VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED | MEMORY_POOLS_SUPPORTED => 1,
        MULTIPROCESSOR_COUNT => 132,
        INTEGRATED => 0,
        COMPUTE_MODE => match crate::state::compute_mode(i) {
            // NVML's EXCLUSIVE_PROCESS is 3, CUDA's CU_COMPUTEMODE_EXCLUSIVE_PROCESS 3 too;
            // PROHIBITED is 2 in both.
            m @ (0 | 2 | 3) => m as c_int,
            _ => 0,
        },
        PCI_BUS_ID => i as c_int + 1,
        PCI_DEVICE_ID | PCI_DOMAIN_ID => 0,
        MEMORY_CLOCK_RATE => 2_619_000,
        GLOBAL_MEMORY_BUS_WIDTH => 5120,
        L2_CACHE_SIZE => 50 << 20,
        MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        ASYNC_ENGINE_COUNT => 3,
        COMPUTE_CAPABILITY_MAJOR => 9,
        COMPUTE_CAPABILITY_MINOR => 0,
        MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 << 10,
        MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 << 10,
        MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        a if (1..=124).contains(&a) => 0,
        _ => return INVALID_VALUE,
    };
    // SAFETY: `value` is null or valid for one write of its type, as this function's `# Safety`
    // requires of the caller; `put` refuses null.
    unsafe { put(value, v) }
}
