//! Exported wrappers of the CUDA array entry points: `cuArrayCreate_v2`, `cuArray3DCreate_v2`,
//! `cuMipmappedArrayCreate` and their destroys.
//!
//! What an array takes is not documented: `cuArrayGetMemoryRequirements` answers only for
//! arrays created with `CUDA_ARRAY3D_DEFERRED_MAPPING` (`cuda.h`), and those take no memory
//! until mapped (the mapped memory is `cuMemCreate`'s, counted there), so they are charged 0.
//! Any other array is charged a conservative size ([`estimate`]): every row of elements (or of
//! 4×4 blocks, for block-compressed formats) padded to the device's texture pitch alignment
//! and at least 512 bytes, per mipmap level, the whole rounded up to 64 KiB; the driver's own
//! figure replaces it where the driver answers. It is checked against the cap before the call;
//! an array whose figure turns out not to fit is destroyed again and refused with
//! `CUDA_ERROR_OUT_OF_MEMORY`.

use crate::driver::cuda::{self as drv, Opaque};
use crate::driver::real;
use crate::memory::{counted_sized, forget, Sized};
use crate::state::Kind;
use cuda_abi::{
    array_element_bytes, block_compressed_bytes, Array3dDescriptor, Array3dDescriptorV1,
    ArrayDescriptor, ArrayDescriptorV1, CuResult, ARRAY3D_DEFERRED_MAPPING,
};
use std::ffi::c_uint;

/// The least row padding assumed, whatever the device reports.
pub const MIN_ROW_ALIGN: u64 = 512;
/// What the whole of an array is rounded up to.
pub const ARRAY_ALIGN: u64 = 64 << 10;

/// Conservative bytes of `levels` mipmap levels of a `w × h × d` array (`h`, `d` 0: fewer
/// dimensions) with rows padded to `row_align`. `None` when it overflows or the format is
/// unknown.
pub fn estimate(desc: &Array3dDescriptor, levels: u32, row_align: u64) -> Option<u64> {
    let block = block_compressed_bytes(desc.format);
    let elem = block.or_else(|| array_element_bytes(desc.format, desc.num_channels))?;
    let align = row_align.max(MIN_ROW_ALIGN).checked_next_power_of_two()?;
    let (w, h, d) = (desc.width as u64, desc.height as u64, desc.depth as u64);
    let mut total: u64 = 0;
    for l in 0..levels.clamp(1, 64) {
        let shrink = |x: u64| (x >> l).max(1);
        let (mut lw, mut lh) = (shrink(w), shrink(h));
        if block.is_some() {
            (lw, lh) = (lw.div_ceil(4), lh.div_ceil(4));
        }
        let row = lw.checked_mul(elem)?.checked_next_multiple_of(align)?;
        let level = row.checked_mul(lh)?.checked_mul(shrink(d))?;
        total = total.checked_add(level)?;
    }
    total.checked_next_multiple_of(ARRAY_ALIGN)
}

fn create(
    kind: Kind,
    out: *mut Opaque,
    desc: Option<Array3dDescriptor>,
    levels: u32,
    call: &mut dyn FnMut() -> CuResult,
) -> CuResult {
    let mipmapped = kind == Kind::Mipmapped;
    if desc.is_some_and(|d| d.flags & ARRAY3D_DEFERRED_MAPPING != 0) {
        // No memory until mapped; the mapping's memory is counted at cuMemCreate.
        return call();
    }
    let row_align = drv::current_ordinal()
        .and_then(drv::texture_pitch_alignment)
        .unwrap_or(MIN_ROW_ALIGN);
    counted_sized(Sized {
        kind,
        device: None,
        estimate: desc.as_ref().and_then(|d| estimate(d, levels, row_align)),
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
    // SAFETY: `f` is the driver's own `cuArrayCreate_v2`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `out` null or writable and `desc` null or readable as the documentation of
    // `cuArrayCreate_v2` says (the driver refuses null); handles are the driver's to check.
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
    // SAFETY: `f` is the driver's own `cuArray3DCreate_v2`, typed as cuda.h declares it (`real!`);
    // it gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `out` null or writable and `desc` null or readable as the documentation of
    // `cuArray3DCreate_v2` says (the driver refuses null); handles are the driver's to check.
    create(Kind::Array, out, d, 1, &mut || unsafe { f(out, desc) })
}

/// The CUDA < 3.2 form (`CUDA_ARRAY_DESCRIPTOR_v1`), counted like `_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate(
    out: *mut Opaque,
    desc: *const ArrayDescriptorV1,
) -> CuResult {
    let f = real!(
        cuArrayCreate as unsafe extern "C" fn(*mut Opaque, *const ArrayDescriptorV1) -> CuResult
    );
    // SAFETY: null or a valid CUDA_ARRAY_DESCRIPTOR_v1 per the caller.
    let d = unsafe { desc.as_ref() }.map(|d| Array3dDescriptor::from(*d));
    // SAFETY: `f` is the driver's own `cuArrayCreate`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `out` null or writable and `desc` null or readable as the documentation of
    // `cuArrayCreate` says (the driver refuses null); handles are the driver's to check.
    create(Kind::Array, out, d, 1, &mut || unsafe { f(out, desc) })
}

/// The CUDA < 3.2 form (`CUDA_ARRAY3D_DESCRIPTOR_v1`), counted like `_v2`.
///
/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate(
    out: *mut Opaque,
    desc: *const Array3dDescriptorV1,
) -> CuResult {
    let f = real!(
        cuArray3DCreate
            as unsafe extern "C" fn(*mut Opaque, *const Array3dDescriptorV1) -> CuResult
    );
    // SAFETY: null or a valid CUDA_ARRAY3D_DESCRIPTOR_v1 per the caller.
    let d = unsafe { desc.as_ref() }.map(|d| Array3dDescriptor::from(*d));
    // SAFETY: `f` is the driver's own `cuArray3DCreate`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): `out` null or writable and `desc` null or readable as the documentation of
    // `cuArray3DCreate` says (the driver refuses null); handles are the driver's to check.
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
    // SAFETY: `f` is the driver's own `cuMipmappedArrayCreate`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): `out` null or writable and `desc` null or readable as the
    // documentation of `cuMipmappedArrayCreate` says (the driver refuses null); handles are the
    // driver's to check.
    create(Kind::Mipmapped, out, d, levels, &mut || unsafe {
        f(out, desc, levels)
    })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: Opaque) -> CuResult {
    let f = real!(cuArrayDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: `f` is the driver's own `cuArrayDestroy`, typed as cuda.h declares it (`real!`); it
    // gets this function's arguments unchanged, under the contract its caller accepted
    // (`# Safety`): plain values and handles, which the driver checks itself.
    forget(Kind::Array, array as u64, unsafe { f(array) })
}

/// # Safety
/// The CUDA driver API contract of the function of the same name.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: Opaque) -> CuResult {
    let f = real!(cuMipmappedArrayDestroy as unsafe extern "C" fn(Opaque) -> CuResult);
    // SAFETY: `f` is the driver's own `cuMipmappedArrayDestroy`, typed as cuda.h declares it
    // (`real!`); it gets this function's arguments unchanged, under the contract its caller
    // accepted (`# Safety`): plain values and handles, which the driver checks itself.
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
        const K: u64 = 64 << 10;
        let rows: &[(&str, Array3dDescriptor, u32, u64, Option<u64>)] = &[
            ("1D bytes", d(1000, 0, 0, 0x01, 1), 1, 32, Some(K)),
            (
                "2D rows of 100 bytes padded to 512",
                d(100, 600_000, 0, 0x01, 1),
                1,
                32,
                Some((512 * 600_000u64).next_multiple_of(K)),
            ),
            (
                "padded to a coarser device alignment",
                d(100, 1024, 0, 0x01, 1),
                1,
                4096,
                Some(4096 * 1024),
            ),
            ("3D", d(4, 4, 4, 0x01, 2), 1, 32, Some(K)),
            (
                "two mipmap levels",
                d(1 << 20, 512, 0, 0x01, 1),
                2,
                32,
                Some((1 << 29) + (1 << 27)),
            ),
            ("overflow", d(usize::MAX, 2, 0, 0x20, 4), 1, 32, None),
            (
                "BC1: 8-byte 4x4 blocks",
                d(16384, 16384, 0, 0x91, 4),
                1,
                32,
                Some(128 << 20),
            ),
            (
                "BC7: 16-byte blocks",
                d(16384, 16384, 0, 0x9d, 4),
                1,
                32,
                Some(256 << 20),
            ),
            ("unknown format", d(4, 4, 0, 0x77, 4), 1, 32, None),
        ];
        for (what, desc, levels, align, want) in rows {
            assert_eq!(estimate(desc, *levels, *align), *want, "{what}");
        }
    }
}
