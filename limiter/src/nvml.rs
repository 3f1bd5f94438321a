//! Exported NVML wrappers: `nvmlDeviceGetMemoryInfo` and `_v2` report the cap (total), the
//! container's usage (used) and the rest (free). NVML devices are matched to CUDA ordinals by
//! UUID once a CUDA process of the container has recorded it, else by `CUDA_VISIBLE_DEVICES`
//! (or the NVML index when it is unset).

use crate::driver::nvml::{
    self as drv, Handle, Memory, MemoryV2, NvmlReturn, SUCCESS, UNINITIALIZED,
};
use crate::state;

/// `(total, used)` to report for NVML device `h`, if the container caps it.
///
/// # Safety
/// `h` is a handle NVML has just accepted.
unsafe fn capped(h: Handle, real_total: u64) -> Option<(u64, u64)> {
    let l = state::get()?;
    if !l.any_mem {
        return None;
    }
    // SAFETY: valid per the caller.
    let uuid = unsafe { drv::uuid_of(h) }?;
    let found = l.shared_ok().then(|| l.region.find_dev(&uuid)).flatten();
    let (limit, used) = match found {
        Some(e) => {
            let limit = l.region.devs[e]
                .limit
                .load(std::sync::atomic::Ordering::SeqCst);
            ((limit > 0).then_some(limit)?, l.container_used(e))
        }
        None => {
            // No CUDA process of the container has used it yet: its CUDA ordinal is its NVML
            // index, or its place in CUDA_VISIBLE_DEVICES.
            // SAFETY: valid per the caller.
            let index = unsafe { drv::index_of(h) }?;
            let ord = match std::env::var_os("CUDA_VISIBLE_DEVICES") {
                Some(v) => {
                    let name = drv::uuid_string(&uuid);
                    crate::visible::ordinal(v.to_str()?, index, &name)?
                }
                None => index,
            };
            let limit = l.mem_limit(ord)?;
            // A shared file of another layout: allocations are refused, nothing is free.
            (limit, if l.shared_ok() { 0 } else { limit })
        }
    };
    Some((limit.min(real_total), used))
}

/// # Safety
/// The NVML contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: Handle,
    memory: *mut Memory,
) -> NvmlReturn {
    let Some(f) = drv::memory_info_fn() else {
        return UNINITIALIZED;
    };
    // SAFETY: `f` is the driver's own `nvmlDeviceGetMemoryInfo`, typed as nvml.h declares it
    // (`drv::memory_info_fn`); it gets this function's arguments unchanged, under the contract its
    // caller accepted (`# Safety`): `memory` null or writable as the documentation of
    // `nvmlDeviceGetMemoryInfo` says (the driver refuses null); handles are the driver's to check.
    let r = unsafe { f(device, memory) };
    if r == SUCCESS && !memory.is_null() {
        // SAFETY: filled by NVML; valid per the caller.
        let m = unsafe { &mut *memory };
        // SAFETY: NVML just accepted `device`.
        if let Some((total, used)) = unsafe { capped(device, m.total) } {
            let free = total.saturating_sub(used).min(m.free);
            *m = Memory {
                total,
                free,
                used: total - free,
            };
        }
    }
    r
}

/// # Safety
/// The NVML contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Handle,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    let Some(f) = drv::memory_info_v2_fn() else {
        return UNINITIALIZED;
    };
    // SAFETY: `f` is the driver's own `nvmlDeviceGetMemoryInfo_v2`, typed as nvml.h declares it
    // (`drv::memory_info_v2_fn`); it gets this function's arguments unchanged, under the contract
    // its caller accepted (`# Safety`): `memory` null or writable as the documentation of
    // `nvmlDeviceGetMemoryInfo_v2` says (the driver refuses null); handles are the driver's to
    // check.
    let r = unsafe { f(device, memory) };
    if r == SUCCESS && !memory.is_null() {
        // SAFETY: filled by NVML; valid per the caller.
        let m = unsafe { &mut *memory };
        // SAFETY: NVML just accepted `device`.
        if let Some((total, used)) = unsafe { capped(device, m.total) } {
            let free = total.saturating_sub(used).min(m.free);
            m.total = total;
            m.free = free;
            m.used = total - free;
            m.reserved = m.reserved.min(m.used);
        }
    }
    r
}
