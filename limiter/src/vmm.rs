//! Exported wrappers of the virtual-memory-management mappings: `cuMemRelease`, `cuMemMap` and
//! `cuMemUnmap` are tracked so that `cuMemCreate` memory is credited only when it is both released
//! (`cuMemRelease`) and unmapped, as the driver keeps it until then. The table ([`Mappings`])
//! is pure; only these calls touch it.

use crate::driver::real;
use crate::memory::forget;
use crate::state::Kind;
use cuda_abi::result::SUCCESS;
use cuda_abi::CuResult;
use rustc_hash::FxHashMap as HashMap;
use std::ffi::c_ulonglong;
use std::sync::Mutex;

/// Mappings of `cuMemCreate` handles and the handles released while mapped.
#[derive(Default)]
pub struct Mappings {
    /// Mapped address -> handle.
    maps: HashMap<u64, u64>,
    /// Handle -> (live mappings, released).
    handles: HashMap<u64, (u32, bool)>,
}

impl Mappings {
    /// `handle` was mapped at `va`.
    pub fn mapped(&mut self, va: u64, handle: u64) {
        self.maps.insert(va, handle);
        self.handles.entry(handle).or_default().0 += 1;
    }

    /// `handle` was released: whether its memory is gone now (it has no mapping).
    pub fn released(&mut self, handle: u64) -> bool {
        match self.handles.get_mut(&handle) {
            Some(e) if e.0 > 0 => {
                e.1 = true;
                false
            }
            _ => {
                self.handles.remove(&handle);
                true
            }
        }
    }

    /// `[va, va + size)` was unmapped: the released handles whose last mapping went.
    pub fn unmapped(&mut self, va: u64, size: u64) -> Vec<u64> {
        let end = va.saturating_add(size);
        let gone: Vec<u64> = self
            .maps
            .keys()
            .copied()
            .filter(|&s| s >= va && s < end)
            .collect();
        let mut freed = Vec::new();
        for s in gone {
            let Some(h) = self.maps.remove(&s) else {
                continue;
            };
            if let Some(e) = self.handles.get_mut(&h) {
                e.0 = e.0.saturating_sub(1);
                if e.0 == 0 {
                    let released = e.1;
                    self.handles.remove(&h);
                    if released {
                        freed.push(h);
                    }
                }
            }
        }
        freed
    }
}

static MAPPINGS: Mutex<Option<Mappings>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Mappings) -> T) -> T {
    let mut g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Mappings::default))
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    let f = real!(cuMemRelease as unsafe extern "C" fn(u64) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMemRelease`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    let r = unsafe { f(handle) };
    // The driver keeps memory that is still mapped until its last cuMemUnmap: credit it
    // unless it is still mapped.
    if r == SUCCESS && with(|m| m.released(handle)) {
        return forget(Kind::Handle, handle, r);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: u64,
    size: usize,
    offset: usize,
    handle: u64,
    flags: c_ulonglong,
) -> CuResult {
    let f =
        real!(cuMemMap as unsafe extern "C" fn(u64, usize, usize, u64, c_ulonglong) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMemMap`, typed as cuda.h declares it (`real!`); it gets
    // this function's arguments unchanged, under the contract its caller accepted (`# Safety`):
    // plain values and handles, which the driver checks itself.
    let r = unsafe { f(ptr, size, offset, handle, flags) };
    if r == SUCCESS {
        with(|m| m.mapped(ptr, handle));
    }
    r
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> CuResult {
    let f = real!(cuMemUnmap as unsafe extern "C" fn(u64, usize) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMemUnmap`, typed as cuda.h declares it (`real!`); it gets
    // this function's arguments unchanged, under the contract its caller accepted (`# Safety`):
    // plain values and handles, which the driver checks itself.
    let r = unsafe { f(ptr, size) };
    if r == SUCCESS {
        for h in with(|m| m.unmapped(ptr, size as u64)) {
            forget(Kind::Handle, h, r);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::Mappings;

    #[test]
    fn memory_goes_with_release_and_the_last_unmap() {
        let mut m = Mappings::default();
        assert!(m.released(7), "never mapped: gone at release");
        m.mapped(0x1000, 7);
        m.mapped(0x9000, 7);
        assert!(!m.released(7), "mapped twice: kept");
        assert_eq!(m.unmapped(0x1000, 0x1000), Vec::<u64>::new(), "one left");
        assert_eq!(m.unmapped(0x9000, 0x1000), vec![7], "the last one");
        m.mapped(0x1000, 8);
        assert_eq!(
            m.unmapped(0x0, 0x10000),
            Vec::<u64>::new(),
            "unmapped, not released"
        );
        assert!(m.released(8), "released after its unmap: gone");
    }
}
