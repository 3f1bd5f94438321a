//! C-ABI facts of the CUDA driver API (and the NVML structs, in [`nvml`]) that both
//! `libgpushare_limiter.so` and the TEST-ONLY simulated driver need: `CUresult` codes, the head of the structs they read, enum values and
//! the table of entry points whose default name became a versioned export. Facts only, as
//! `cuda.h` (CUDA 11.8) and `cudaTypedefs.h` state them: what each side *does* with them lives
//! in that side, so the simulated driver stays an independent oracle for the limiter's tests.
#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint};

/// `CUresult`.
pub type CuResult = c_uint;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;

/// `CUresult` values (cuda.h `cudaError_enum`).
pub mod result {
    use super::CuResult;
    pub const SUCCESS: CuResult = 0;
    pub const INVALID_VALUE: CuResult = 1;
    pub const OUT_OF_MEMORY: CuResult = 2;
    pub const NOT_INITIALIZED: CuResult = 3;
    pub const INVALID_DEVICE: CuResult = 101;
    pub const INVALID_CONTEXT: CuResult = 201;
    pub const CONTEXT_ALREADY_IN_USE: CuResult = 216;
    pub const INVALID_HANDLE: CuResult = 400;
    pub const NOT_FOUND: CuResult = 500;
    pub const NOT_SUPPORTED: CuResult = 801;
    pub const UNKNOWN: CuResult = 999;
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_DEVICE: c_uint = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_PINNED: c_uint = 1;

/// Head of `CUmemAllocationProp`: type, requested handle types, location {type, id}.
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// Head of `CUmemPoolProps`: allocation type, handle types, location {type, id}.
#[repr(C)]
pub struct MemPoolPropsHead {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (120 bytes): a graph memory-allocation node's pool
/// properties (whose location names the device), size and the address CUDA assigns.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: MemPoolPropsHead,
    pub win32_security_attributes: *mut std::ffi::c_void,
    pub pool_reserved: [u8; 64],
    pub access_descs: *const std::ffi::c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// `CUgraphNodeType` of a memory-allocation node.
pub const GRAPH_NODE_TYPE_MEM_ALLOC: c_uint = 10;
/// `CUgraphNodeType` of a memory-free node.
pub const GRAPH_NODE_TYPE_MEM_FREE: c_uint = 11;

/// `CUgraphMem_attribute` values (`cuDeviceGetGraphMemAttribute`, all `cuuint64_t`).
pub mod graph_mem_attr {
    use std::ffi::c_int;
    pub const USED_MEM_CURRENT: c_int = 0;
    pub const USED_MEM_HIGH: c_int = 1;
    pub const RESERVED_MEM_CURRENT: c_int = 2;
    pub const RESERVED_MEM_HIGH: c_int = 3;
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`, `size_t` sizes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (CUDA < 3.2, `unsigned int` sizes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (CUDA < 3.2, `unsigned int` sizes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

impl From<ArrayDescriptorV1> for Array3dDescriptor {
    fn from(d: ArrayDescriptorV1) -> Self {
        Array3dDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        }
    }
}

impl From<Array3dDescriptorV1> for Array3dDescriptor {
    fn from(d: Array3dDescriptorV1) -> Self {
        Array3dDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            depth: d.depth as usize,
            format: d.format,
            num_channels: d.num_channels,
            flags: d.flags,
        }
    }
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

/// Bytes of one element of `CUarray_format` `format` with `channels` channels: the plain
/// formats hold `channels` values of their size; the packed `*_INT8X<n>`/`*_INT16X<n>` formats
/// are one element each; block-compressed and NV12 formats have no per-element size (`None`).
pub fn array_element_bytes(format: c_uint, channels: c_uint) -> Option<u64> {
    let per_channel: u64 = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => return Some(1),
        0xc1 | 0xc7 | 0xc3 | 0xc9 => return Some(2),
        0xc2 | 0xc8 | 0xc4 | 0xca => return Some(4),
        0xc5 | 0xcb => return Some(8),
        _ => return None,
    };
    matches!(channels, 1 | 2 | 4).then_some(per_channel * u64::from(channels))
}

/// Bytes of one 4×4 block of a block-compressed array format (`CU_AD_FORMAT_BC*`, `cuda.h`):
/// 8 for BC1 and BC4, 16 for BC2, BC3, BC5, BC6H and BC7; `None` for other formats.
pub fn block_compressed_bytes(format: c_uint) -> Option<u64> {
    match format {
        0x91 | 0x92 | 0x97 | 0x98 => Some(8),
        0x93..=0x96 | 0x99..=0x9e => Some(16),
        _ => None,
    }
}

/// `CUDA_ARRAY3D_DEFERRED_MAPPING` (`cuda.h`): the array takes no memory until it is mapped.
pub const ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;

/// NVML structs both sides read or fill (`nvml.h`).
pub mod nvml {
    use std::ffi::{c_uint, c_ulonglong};

    /// `nvmlMemory_t`.
    #[repr(C)]
    pub struct Memory {
        pub total: c_ulonglong,
        pub free: c_ulonglong,
        pub used: c_ulonglong,
    }

    /// `nvmlMemory_v2_t`.
    #[repr(C)]
    pub struct MemoryV2 {
        pub version: c_uint,
        pub total: c_ulonglong,
        pub reserved: c_ulonglong,
        pub free: c_ulonglong,
        pub used: c_ulonglong,
    }

    /// `nvmlMemory_v2` version tag.
    pub const MEMORY_V2: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

    /// `nvmlProcessUtilizationSample_t`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct ProcessUtilizationSample {
        pub pid: c_uint,
        pub time_stamp: c_ulonglong,
        pub sm_util: c_uint,
        pub mem_util: c_uint,
        pub enc_util: c_uint,
        pub dec_util: c_uint,
    }
}

/// `CUmemPool_attribute` values.
pub mod pool_attr {
    use std::ffi::c_int;
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
    pub const REUSE_ALLOW_OPPORTUNISTIC: c_int = 2;
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
    pub const RELEASE_THRESHOLD: c_int = 4;
    pub const RESERVED_MEM_CURRENT: c_int = 5;
    pub const RESERVED_MEM_HIGH: c_int = 6;
    pub const USED_MEM_CURRENT: c_int = 7;
    pub const USED_MEM_HIGH: c_int = 8;
}

/// `CUdevice_attribute` values the limiter and the simulated driver use.
pub mod device_attr {
    use std::ffi::c_int;
    pub const MAX_THREADS_PER_BLOCK: c_int = 1;
    pub const MAX_BLOCK_DIM_X: c_int = 2;
    pub const MAX_BLOCK_DIM_Y: c_int = 3;
    pub const MAX_BLOCK_DIM_Z: c_int = 4;
    pub const MAX_GRID_DIM_X: c_int = 5;
    pub const MAX_GRID_DIM_Y: c_int = 6;
    pub const MAX_GRID_DIM_Z: c_int = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 8;
    pub const TOTAL_CONSTANT_MEMORY: c_int = 9;
    pub const WARP_SIZE: c_int = 10;
    pub const MAX_PITCH: c_int = 11;
    pub const MAX_REGISTERS_PER_BLOCK: c_int = 12;
    pub const CLOCK_RATE: c_int = 13;
    pub const TEXTURE_ALIGNMENT: c_int = 14;
    pub const GPU_OVERLAP: c_int = 15;
    pub const MULTIPROCESSOR_COUNT: c_int = 16;
    pub const INTEGRATED: c_int = 18;
    pub const CAN_MAP_HOST_MEMORY: c_int = 19;
    pub const COMPUTE_MODE: c_int = 20;
    pub const CONCURRENT_KERNELS: c_int = 31;
    pub const ECC_ENABLED: c_int = 32;
    pub const PCI_BUS_ID: c_int = 33;
    pub const PCI_DEVICE_ID: c_int = 34;
    pub const MEMORY_CLOCK_RATE: c_int = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: c_int = 37;
    pub const L2_CACHE_SIZE: c_int = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;
    pub const ASYNC_ENGINE_COUNT: c_int = 40;
    pub const UNIFIED_ADDRESSING: c_int = 41;
    pub const PCI_DOMAIN_ID: c_int = 50;
    pub const TEXTURE_PITCH_ALIGNMENT: c_int = 51;
    pub const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
    pub const COMPUTE_CAPABILITY_MINOR: c_int = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: c_int = 78;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: c_int = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: c_int = 82;
    pub const MANAGED_MEMORY: c_int = 83;
    pub const CONCURRENT_MANAGED_ACCESS: c_int = 89;
    pub const COOPERATIVE_LAUNCH: c_int = 95;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: c_int = 106;
    pub const MEMORY_POOLS_SUPPORTED: c_int = 115;
}

/// `cuGetProcAddress` flags (`CUdriverProcAddress_flags`).
pub mod proc_flags {
    pub const DEFAULT: u64 = 0;
    pub const LEGACY_STREAM: u64 = 1;
    pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;
}

/// Entry points whose default name (`cuMemAlloc`) became a versioned export (`cuMemAlloc_v2`)
/// at a CUDA version (`cudaTypedefs.h`): `(name, version, export)`, ascending per name. At a
/// requested version the driver hands out the newest export whose version is not above it;
/// below the first, the unversioned export.
pub const VERSIONED: &[(&str, c_int, &str)] = &[
    ("cuMemAlloc", 3020, "cuMemAlloc_v2"),
    ("cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"),
    ("cuMemFree", 3020, "cuMemFree_v2"),
    ("cuMemGetInfo", 3020, "cuMemGetInfo_v2"),
    ("cuMemAllocHost", 3020, "cuMemAllocHost_v2"),
    ("cuMemHostRegister", 6050, "cuMemHostRegister_v2"),
    ("cuArrayCreate", 3020, "cuArrayCreate_v2"),
    ("cuArray3DCreate", 3020, "cuArray3DCreate_v2"),
    ("cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"),
    ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12050, "cuCtxCreate_v4"),
    ("cuCtxDestroy", 4000, "cuCtxDestroy_v2"),
    ("cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"),
    ("cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"),
    ("cuStreamDestroy", 4000, "cuStreamDestroy_v2"),
    ("cuEventDestroy", 4000, "cuEventDestroy_v2"),
    (
        "cuDevicePrimaryCtxRelease",
        11000,
        "cuDevicePrimaryCtxRelease_v2",
    ),
    (
        "cuDevicePrimaryCtxReset",
        11000,
        "cuDevicePrimaryCtxReset_v2",
    ),
    (
        "cuDevicePrimaryCtxSetFlags",
        11000,
        "cuDevicePrimaryCtxSetFlags_v2",
    ),
    ("cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"),
    ("cuGetProcAddress", 12000, "cuGetProcAddress_v2"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_cuda_h() {
        let rows: &[(&str, usize, usize)] = &[
            ("CUDA_ARRAY_DESCRIPTOR", size_of::<ArrayDescriptor>(), 24),
            (
                "CUDA_ARRAY3D_DESCRIPTOR",
                size_of::<Array3dDescriptor>(),
                40,
            ),
            (
                "CUDA_ARRAY_MEMORY_REQUIREMENTS",
                size_of::<ArrayMemoryRequirements>(),
                32,
            ),
        ];
        for (what, got, want) in rows {
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn versioned_table_is_ascending_per_name() {
        for (i, (name, v, _)) in VERSIONED.iter().enumerate() {
            for (later, lv, _) in &VERSIONED[i + 1..] {
                if later == name {
                    assert!(lv > v, "{name}: versions must ascend");
                }
            }
        }
    }

    #[test]
    fn element_bytes() {
        let rows: &[(&str, c_uint, c_uint, Option<u64>)] = &[
            ("float x4", 0x20, 4, Some(16)),
            ("uint8 x1", 0x01, 1, Some(1)),
            ("half x2", 0x10, 2, Some(4)),
            ("three channels are not a CUDA array", 0x20, 3, None),
            ("packed unorm int16x4", 0xc5, 4, Some(8)),
            ("block compressed: no element size", 0x91, 4, None),
        ];
        for (what, f, c, want) in rows {
            assert_eq!(array_element_bytes(*f, *c), *want, "{what}");
        }
    }

    #[test]
    fn alloc_node_params_layout() {
        assert_eq!(std::mem::size_of::<MemAllocNodeParams>(), 120);
        assert_eq!(std::mem::offset_of!(MemAllocNodeParams, bytesize), 104);
        assert_eq!(std::mem::offset_of!(MemAllocNodeParams, dptr), 112);
    }
}
