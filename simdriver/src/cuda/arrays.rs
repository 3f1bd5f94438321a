//! TEST-ONLY: simulated CUDA arrays and mipmapped arrays: creation takes device memory the
//! way a GPU lays textures out (each row aligned to the pitch alignment, block-compressed
//! formats in 4×4 blocks, the whole array to 64 KiB: the layout is a guess, `guesses.rs`),
//! destruction and context destruction give it back. As `cuda.h` documents,
//! `cu{,Mipmapped}ArrayGetMemoryRequirements` answer only for arrays created with
//! `CUDA_ARRAY3D_DEFERRED_MAPPING` (else `CUDA_ERROR_INVALID_VALUE`), and such an array takes
//! no memory until it is mapped (mapping is not simulated).

use super::device_memory::{device_give, device_take, new_ptr};
use super::{
    current_ctx, dev_index, enter, with_driver, Array, CuDevice, CuResult, Opaque, INVALID_HANDLE,
    INVALID_VALUE, SUCCESS,
};
use crate::config::config;
use cuda_abi::{
    array_element_bytes, Array3dDescriptor, Array3dDescriptorV1, ArrayDescriptor,
    ArrayDescriptorV1, ArrayMemoryRequirements,
};
use std::ffi::c_uint;

use super::guesses::ARRAY_ALIGN;

/// `CUDA_ARRAY3D_DEFERRED_MAPPING` (`cuda.h`).
pub const DEFERRED_MAPPING: c_uint = cuda_abi::ARRAY3D_DEFERRED_MAPPING;

/// Bytes one level of `w × h × d` elements of `elem` bytes takes (`h`/`d` 0: 1D/2D); a
/// block-compressed format (`block`) stores 4×4 blocks of `elem` bytes.
fn level_bytes(w: u64, h: u64, d: u64, elem: u64, block: bool) -> Option<u64> {
    let align = config().pitch_align;
    let (w, h) = if block {
        (w.div_ceil(4), h.max(1).div_ceil(4))
    } else {
        (w, h)
    };
    let row = w.checked_mul(elem)?.checked_next_multiple_of(align)?;
    row.checked_mul(h.max(1))?.checked_mul(d.max(1))
}

/// Device bytes of an array (`levels` mipmap levels, each dimension halved per level).
fn array_bytes(desc: &Array3dDescriptor, levels: u32) -> Option<u64> {
    let block = cuda_abi::block_compressed_bytes(desc.format);
    let elem = block.or_else(|| array_element_bytes(desc.format, desc.num_channels))?;
    let (w, h, d) = (desc.width as u64, desc.height as u64, desc.depth as u64);
    if w == 0 || (h == 0 && d != 0) || levels == 0 {
        return None;
    }
    let biggest = w.max(h).max(d);
    if levels > 64 - biggest.leading_zeros() {
        return None;
    }
    let mut total: u64 = 0;
    for l in 0..levels {
        let shrink = |x: u64| if x == 0 { 0 } else { (x >> l).max(1) };
        total = total.checked_add(level_bytes(
            shrink(w),
            shrink(h),
            shrink(d),
            elem,
            block.is_some(),
        )?)?;
    }
    total.checked_next_multiple_of(ARRAY_ALIGN)
}

fn create(
    name: &str,
    out: *mut Opaque,
    desc: Option<Array3dDescriptor>,
    levels: u32,
    mipmapped: bool,
) -> CuResult {
    tri!(enter(name));
    let (ctx, dev) = tri!(current_ctx());
    let (Some(desc), false) = (desc, out.is_null()) else {
        return INVALID_VALUE;
    };
    let Some(bytes) = array_bytes(&desc, levels) else {
        return INVALID_VALUE;
    };
    let deferred = desc.flags & DEFERRED_MAPPING != 0;
    // A deferred-mapping array takes its memory only when mapped.
    let size = if deferred { 0 } else { bytes };
    tri!(device_take(dev, size));
    let h = new_ptr(size) as usize;
    with_driver(|d| {
        d.arrays.insert(
            h,
            Array {
                dev,
                size,
                ctx,
                mipmapped,
                deferred: deferred.then_some(bytes),
            },
        )
    });
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { out.write(h as Opaque) };
    SUCCESS
}

/// # Safety
/// `out` null or writable; `desc` null or a valid `CUDA_ARRAY_DESCRIPTOR`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut Opaque,
    desc: *const ArrayDescriptor,
) -> CuResult {
    // SAFETY: null or valid per the caller.
    let desc = unsafe { desc.as_ref() }.map(|d| Array3dDescriptor {
        width: d.width,
        height: d.height,
        depth: 0,
        format: d.format,
        num_channels: d.num_channels,
        flags: 0,
    });
    create("cuArrayCreate_v2", out, desc, 1, false)
}

/// # Safety
/// `out` null or writable; `desc` null or a valid `CUDA_ARRAY3D_DESCRIPTOR`.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut Opaque,
    desc: *const Array3dDescriptor,
) -> CuResult {
    // SAFETY: null or valid per the caller.
    let desc = unsafe { desc.as_ref() }.copied();
    create("cuArray3DCreate_v2", out, desc, 1, false)
}

/// The CUDA < 3.2 form (`CUDA_ARRAY_DESCRIPTOR_v1`, 32-bit sizes).
///
/// # Safety
/// `out` null or writable; `desc` null or a valid `CUDA_ARRAY_DESCRIPTOR_v1`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate(
    out: *mut Opaque,
    desc: *const ArrayDescriptorV1,
) -> CuResult {
    // SAFETY: null or valid per the caller.
    let desc = unsafe { desc.as_ref() }.map(|d| Array3dDescriptor::from(*d));
    create("cuArrayCreate", out, desc, 1, false)
}

/// The CUDA < 3.2 form (`CUDA_ARRAY3D_DESCRIPTOR_v1`, 32-bit sizes).
///
/// # Safety
/// `out` null or writable; `desc` null or a valid `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate(
    out: *mut Opaque,
    desc: *const Array3dDescriptorV1,
) -> CuResult {
    // SAFETY: null or valid per the caller.
    let desc = unsafe { desc.as_ref() }.map(|d| Array3dDescriptor::from(*d));
    create("cuArray3DCreate", out, desc, 1, false)
}

/// # Safety
/// `out` null or writable; `desc` null or a valid `CUDA_ARRAY3D_DESCRIPTOR`.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut Opaque,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CuResult {
    // SAFETY: null or valid per the caller.
    let desc = unsafe { desc.as_ref() }.copied();
    create("cuMipmappedArrayCreate", out, desc, levels, true)
}

fn destroy(name: &str, handle: Opaque, mipmapped: bool) -> CuResult {
    tri!(enter(name));
    let h = handle as usize;
    let gone = with_driver(|d| match d.arrays.get(&h) {
        Some(a) if a.mipmapped == mipmapped => d.arrays.remove(&h),
        _ => None,
    });
    match gone {
        Some(a) => {
            device_give(a.dev, a.size);
            SUCCESS
        }
        None => INVALID_HANDLE,
    }
}

#[no_mangle]
pub extern "C" fn cuArrayDestroy(array: Opaque) -> CuResult {
    destroy("cuArrayDestroy", array, false)
}

#[no_mangle]
pub extern "C" fn cuMipmappedArrayDestroy(array: Opaque) -> CuResult {
    destroy("cuMipmappedArrayDestroy", array, true)
}

fn requirements(
    name: &str,
    out: *mut ArrayMemoryRequirements,
    handle: Opaque,
    dev: CuDevice,
    mipmapped: bool,
) -> CuResult {
    tri!(enter(name));
    let dev = tri!(dev_index(dev));
    if out.is_null() {
        return INVALID_VALUE;
    }
    let found = with_driver(|d| d.arrays.get(&(handle as usize)).copied());
    let Some(a) = found.filter(|a| a.mipmapped == mipmapped) else {
        return INVALID_HANDLE;
    };
    let Some(size) = a.deferred.filter(|_| a.dev == dev) else {
        return INVALID_VALUE;
    };
    let req = ArrayMemoryRequirements {
        size: size as usize,
        alignment: ARRAY_ALIGN as usize,
        reserved: [0; 4],
    };
    // SAFETY: checked non-null; writable per the C API contract.
    unsafe { out.write(req) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuArrayGetMemoryRequirements(
    out: *mut ArrayMemoryRequirements,
    array: Opaque,
    dev: CuDevice,
) -> CuResult {
    requirements("cuArrayGetMemoryRequirements", out, array, dev, false)
}

#[no_mangle]
pub extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    out: *mut ArrayMemoryRequirements,
    array: Opaque,
    dev: CuDevice,
) -> CuResult {
    requirements(
        "cuMipmappedArrayGetMemoryRequirements",
        out,
        array,
        dev,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(w: usize, h: usize, d: usize, format: c_uint, ch: c_uint) -> Array3dDescriptor {
        Array3dDescriptor {
            width: w,
            height: h,
            depth: d,
            format,
            num_channels: ch,
            flags: 0,
        }
    }

    #[test]
    fn array_sizes() {
        let rows: &[(&str, Array3dDescriptor, u32, Option<u64>)] = &[
            (
                "1D, 1 MiB of bytes",
                desc(1 << 20, 0, 0, 0x01, 1),
                1,
                Some(1 << 20),
            ),
            (
                "2D rows padded to 512",
                desc(100, 1000, 0, 0x01, 1),
                1,
                Some(512_000u64.next_multiple_of(ARRAY_ALIGN)),
            ),
            ("float4 2D", desc(1024, 1024, 0, 0x20, 4), 1, Some(16 << 20)),
            (
                "3D, rows of 256 bytes padded to 512",
                desc(64, 64, 64, 0x01, 4),
                1,
                Some(2 << 20),
            ),
            (
                "mipmap levels add up",
                desc(1024, 1024, 0, 0x01, 4),
                2,
                Some((4 << 20) + (1 << 20)),
            ),
            (
                "BC1: 8-byte 4×4 blocks, rows of blocks padded",
                desc(1024, 1024, 0, 0x91, 4),
                1,
                Some(2048 * 256),
            ),
            (
                "BC7: 16-byte blocks",
                desc(4096, 4, 0, 0x9d, 4),
                1,
                Some(16384u64.next_multiple_of(ARRAY_ALIGN)),
            ),
            ("too many levels", desc(4, 4, 0, 0x01, 1), 4, None),
            ("width 0", desc(0, 4, 0, 0x01, 1), 1, None),
            ("depth without height", desc(4, 0, 4, 0x01, 1), 1, None),
            ("bad format", desc(4, 4, 0, 0x77, 1), 1, None),
            (
                "overflow",
                desc(1 << 40, 1 << 40, 1 << 40, 0x20, 4),
                1,
                None,
            ),
        ];
        for (what, d, levels, want) in rows {
            assert_eq!(array_bytes(d, *levels), *want, "{what}");
        }
    }
}
