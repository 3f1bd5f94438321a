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
