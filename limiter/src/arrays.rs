//! Exported wrappers of the CUDA array entry points: `cuArrayCreate_v2`, `cuArray3DCreate_v2`,
//! `cuMipmappedArrayCreate` and their destroys. An array is charged the device memory the
//! driver says it takes (`cuArrayGetMemoryRequirements`, `cuMipmappedArrayGetMemoryRequirements`);
//! before the call the plain size (elements × element size, per mipmap level) is checked
//! against the cap, and an array whose real size turns out not to fit is destroyed again and
//! refused with `CUDA_ERROR_OUT_OF_MEMORY`.

use crate::driver::cuda::{self as drv, Opaque};
use crate::driver::real;
use crate::memory::{counted_sized, forget, Sized};
use crate::state::Kind;
use cuda_abi::{array_element_bytes, Array3dDescriptor, ArrayDescriptor, CuResult};
use std::ffi::c_uint;

/// Plain bytes of `levels` mipmap levels of a `w × h × d` array (`h`, `d` 0: fewer
/// dimensions): a lower bound of what the driver takes. `None` when it overflows or the format
/// has no element size.
pub fn estimate(desc: &Array3dDescriptor, levels: u32) -> Option<u64> {
    let elem = array_element_bytes(desc.format, desc.num_channels)?;
    let (w, h, d) = (desc.width as u64, desc.height as u64, desc.depth as u64);
    let mut total: u64 = 0;
    for l in 0..levels.min(64) {
        let shrink = |x: u64| (x >> l).max(1);
        let level = shrink(w)
            .checked_mul(shrink(h))?
            .checked_mul(shrink(d))?
            .checked_mul(elem)?;
        total = total.checked_add(level)?;
    }
    Some(total)
}

fn create(
    kind: Kind,
    out: *mut Opaque,
    desc: Option<Array3dDescriptor>,
    levels: u32,
    call: &mut dyn FnMut() -> CuResult,
) -> CuResult {
    let mipmapped = kind == Kind::Mipmapped;
    counted_sized(Sized {
        kind,
        device: None,
        estimate: desc.as_ref().and_then(|d| estimate(d, levels)),
        call,
        key: &|| crate::memory::read_ptr(out.cast()),
        real_size: &|h, ord| drv::array_size(h as usize, ord, mipmapped),
        undo: &|h| drv::destroy_array(h as usize, mipmapped),
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut Opaque,
    desc: *const ArrayDescriptor,
) -> CuResult {
    let f = real!(
        cuArrayCreate_v2 as unsafe extern "C" fn(*mut Opaque, *const ArrayDescriptor) -> CuResult
    );
    // SAFETY: null or a valid CUDA_ARRAY_DESCRIPTOR per the caller.
    let d = unsafe { desc.as_ref() }.map(|d| Array3dDescriptor {
        width: d.width,
        height: d.height,
        depth: 0,
        format: d.format,
        num_channels: d.num_channels,
        flags: 0,
    });
    // SAFETY: forwarded caller contract.
    create(Kind::Array, out, d, 1, &mut || unsafe { f(out, desc) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut Opaque,
    desc: *const Array3dDescriptor,
) -> CuResult {
    let f = real!(
        cuArray3DCreate_v2
            as unsafe extern "C" fn(*mut Opaque, *const Array3dDescriptor) -> CuResult
    );
    // SAFETY: null or a valid CUDA_ARRAY3D_DESCRIPTOR per the caller.
    let d = unsafe { desc.as_ref() }.copied();
    // SAFETY: forwarded caller contract.
    create(Kind::Array, out, d, 1, &mut || unsafe { f(out, desc) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut Opaque,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CuResult {
    let f = real!(
        cuMipmappedArrayCreate
            as unsafe extern "C" fn(*mut Opaque, *const Array3dDescriptor, c_uint) -> CuResult
    );
    // SAFETY: null or a valid CUDA_ARRAY3D_DESCRIPTOR per the caller.
    let d = unsafe { desc.as_ref() }.copied();
    // SAFETY: forwarded caller contract.
    create(Kind::Mipmapped, out, d, levels, &mut || unsafe {
        f(out, desc, levels)
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: Opaque) -> CuResult {
    let f = real!(cuArrayDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: forwarded caller contract.
    forget(Kind::Array, array as u64, unsafe { f(array) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: Opaque) -> CuResult {
    let f = real!(cuMipmappedArrayDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: forwarded caller contract.
    forget(Kind::Mipmapped, array as u64, unsafe { f(array) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates() {
        let d = |w, h, dd, format, ch| Array3dDescriptor {
            width: w,
            height: h,
            depth: dd,
            format,
            num_channels: ch,
            flags: 0,
        };
        let rows: &[(&str, Array3dDescriptor, u32, Option<u64>)] = &[
            ("1D bytes", d(1000, 0, 0, 0x01, 1), 1, Some(1000)),
            ("2D float4", d(100, 10, 0, 0x20, 4), 1, Some(16_000)),
            ("3D", d(4, 4, 4, 0x01, 2), 1, Some(128)),
            ("two mipmap levels", d(8, 8, 0, 0x01, 1), 2, Some(64 + 16)),
            ("overflow", d(usize::MAX, 2, 0, 0x20, 4), 1, None),
            ("no element size", d(4, 4, 0, 0x91, 4), 1, None),
        ];
        for (what, desc, levels, want) in rows {
            assert_eq!(estimate(desc, *levels), *want, "{what}");
        }
    }
}
