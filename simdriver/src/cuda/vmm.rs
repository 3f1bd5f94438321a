//! TEST-ONLY: simulated virtual memory management: address ranges (`cuMemAddressReserve`,
//! `cuMemAddressFree`), mappings of `cuMemCreate` memory into them (`cuMemMap`, `cuMemUnmap`,
//! `cuMemSetAccess`) and `cuMemRelease`. As the `cuMemRelease` documentation says, memory
//! released while still mapped stays taken until its last mapping is unmapped.

use super::device_memory::{device_give, new_ptr, LAST_FREE};
use super::memory::free_ptr;
use super::{enter, with_driver, CuDevicePtr, CuResult, Driver, INVALID_VALUE, SUCCESS};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_ulonglong, c_void};
use std::sync::atomic::Ordering;

/// The address ranges, mappings and released-but-mapped handles of the process.
#[derive(Default)]
pub(super) struct Vmm {
    /// Reserved address ranges: start -> size.
    ranges: HashMap<u64, u64>,
    /// Mappings: start address -> (handle, size).
    maps: HashMap<u64, (u64, u64)>,
    /// Handles released while mapped: their memory goes with the last unmap.
    released: HashSet<u64>,
}

impl Vmm {
    fn mapped(&self, handle: u64) -> bool {
        self.maps.values().any(|&(h, _)| h == handle)
    }

    fn in_range(&self, ptr: u64, size: u64) -> bool {
        self.ranges
            .iter()
            .any(|(&s, &len)| ptr >= s && ptr.saturating_add(size) <= s.saturating_add(len))
    }
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    tri!(enter("cuMemRelease"));
    if handle == 0 {
        LAST_FREE.store(0, Ordering::Relaxed);
        return INVALID_VALUE;
    }
    LAST_FREE.store(handle, Ordering::Relaxed);
    release(handle)
}

/// `cuMemRelease`: frees the handle's memory now, or marks it released while it is mapped.
fn release(handle: u64) -> CuResult {
    let deferred = with_driver(|d: &mut Driver| {
        if d.vmm.mapped(handle) && d.allocs.contains_key(&handle) {
            d.vmm.released.insert(handle)
        } else {
            false
        }
    });
    if deferred {
        return SUCCESS;
    }
    free_ptr(handle)
}

/// # Safety
/// `ptr` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CuDevicePtr,
    size: usize,
    _alignment: usize,
    _addr: CuDevicePtr,
    _flags: c_ulonglong,
) -> CuResult {
    tri!(enter("cuMemAddressReserve"));
    if ptr.is_null() || size == 0 {
        return INVALID_VALUE;
    }
    let va = new_ptr(size as u64);
    with_driver(|d| d.vmm.ranges.insert(va, size as u64));
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { ptr.write(va) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: CuDevicePtr, size: usize) -> CuResult {
    tri!(enter("cuMemAddressFree"));
    with_driver(|d| match d.vmm.ranges.get(&ptr) {
        Some(&len) if len == size as u64 => {
            d.vmm.ranges.remove(&ptr);
            SUCCESS
        }
        _ => INVALID_VALUE,
    })
}

#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: CuDevicePtr,
    size: usize,
    offset: usize,
    handle: u64,
    _flags: c_ulonglong,
) -> CuResult {
    tri!(enter("cuMemMap"));
    let size = size as u64;
    with_driver(|d| {
        let Some(a) = d.allocs.get(&handle).filter(|a| a.ctx == 0) else {
            return INVALID_VALUE;
        };
        let fits = (offset as u64)
            .checked_add(size)
            .is_some_and(|end| end <= a.size);
        let overlaps = d
            .vmm
            .maps
            .iter()
            .any(|(&s, &(_, len))| ptr < s + len && s < ptr.saturating_add(size));
        if size == 0
            || !fits
            || overlaps
            || !d.vmm.in_range(ptr, size)
            || d.vmm.released.contains(&handle)
        {
            return INVALID_VALUE;
        }
        d.vmm.maps.insert(ptr, (handle, size));
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: CuDevicePtr, size: usize) -> CuResult {
    tri!(enter("cuMemUnmap"));
    let end = ptr.saturating_add(size as u64);
    with_driver(|d| {
        if !d.vmm.maps.contains_key(&ptr) {
            return INVALID_VALUE;
        }
        let gone: Vec<(u64, u64)> = d
            .vmm
            .maps
            .iter()
            .filter(|(&s, _)| s >= ptr && s < end)
            .map(|(&s, &(h, _))| (s, h))
            .collect();
        for (s, h) in gone {
            d.vmm.maps.remove(&s);
            if d.vmm.released.contains(&h) && !d.vmm.mapped(h) {
                d.vmm.released.remove(&h);
                if let Some(a) = d.allocs.remove(&h) {
                    device_give(a.dev, a.size);
                }
            }
        }
        SUCCESS
    })
}

/// Access rights are not simulated: any mapped range may be made accessible.
#[no_mangle]
pub extern "C" fn cuMemSetAccess(
    ptr: CuDevicePtr,
    size: usize,
    _desc: *const c_void,
    count: usize,
) -> CuResult {
    tri!(enter("cuMemSetAccess"));
    let ok = with_driver(|d| d.vmm.in_range(ptr, size as u64));
    if ok && count > 0 {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}
