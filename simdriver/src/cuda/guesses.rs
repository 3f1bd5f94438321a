//! TEST-ONLY: every place where the simulated driver GUESSES at what a real NVIDIA driver does,
//! because neither `cuda.h` nor NVIDIA's documentation says. Everything else the simulated driver
//! does follows `cuda.h`/`nvml.h` as documented. `tests/gpu/validate-limiter.sh` measures each
//! of them on a real GPU (probe `tests/gpu/guesses.c`, printing `GUESS OK`/`GUESS DIFFERS`);
//! until it has run on one, they are guesses.
//!
//! 1. **Array layout.** A CUDA array (`cuArrayCreate_v2`, `cuArray3DCreate_v2`,
//!    `cuMipmappedArrayCreate`) takes each row of elements padded to the pitch alignment
//!    (`GPUSHARE_SIM_PITCH_ALIGN`, default 512 bytes, which `cuDeviceGetAttribute` reports as
//!    `CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT`), times rows and depth, per mipmap level
//!    (each dimension halved, at least 1), the whole rounded up to [`ARRAY_ALIGN`].
//!    Block-compressed formats (`CU_AD_FORMAT_BC*`) store 4×4 blocks of 8 (BC1, BC4) or 16
//!    bytes, rows of blocks padded the same way. Real GPUs use tiled (block-linear) layouts
//!    whose size is not documented; the only documented size query,
//!    `cuArrayGetMemoryRequirements`, answers for deferred-mapping arrays alone.
//! 2. **Pitched memory.** `cuMemAllocPitch_v2` rounds the row up to the same pitch alignment.
//! 3. **Legacy 32-bit entry points.** `cuMemAlloc` and `cuMemAllocPitch` (no `_v2`) hand out
//!    pointers that fit in 32 bits, at the lowest free address from [`LEGACY_PTR_BASE`] up, and
//!    `CUDA_ERROR_OUT_OF_MEMORY` when no gap is left below 4 GiB; `cuMemGetInfo` and `cuDeviceTotalMem` (no `_v2`) clamp sizes above 4 GiB to
//!    `UINT_MAX`.
//! 4. **Stream-ordered pools.** A pool grows in [`POOL_CHUNK`] steps; memory freed on one stream
//!    is reused for another stream before a synchronisation only while the pool's
//!    `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC` or `…_ALLOW_INTERNAL_DEPENDENCIES` is on (both
//!    are on by default, as `cuda.h` says); memory freed on the same stream is always reused.
//!    Any synchronisation (`cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`)
//!    completes every pending free of the device, and pools release memory above their release
//!    threshold then.
//! 5. **Context footprint.** A context occupies `GPUSHARE_SIM_CTX_MIB` of device memory (0 by
//!    default), once per device and process.
//! 6. **VMM.** `cuMemCreate` memory stays taken until it is both released (`cuMemRelease`) and
//!    unmapped (`cuMemUnmap` of every mapping), as the `cuMemRelease` documentation says; the
//!    allocation granularity is [`VMM_GRANULARITY`].
//! 7. **Graph memory.** A graph's allocations are taken from one graph pool per device at
//!    launch, growing in [`POOL_CHUNK`] steps; freed graph memory stays in that pool until
//!    `cuDeviceGraphMemTrim` (synchronisation does not release it). Launching a graph whose
//!    allocation from the previous launch is still live fails with `CUDA_ERROR_INVALID_VALUE`.
//! 8. **r615 cgroup memory limits** (`nvmlDeviceSetMemoryLimits_v1`/`…Get…`, see
//!    `memlimits.rs`; `tests/gpu/guesses.c` does not probe these yet, they need an r615
//!    driver). Beyond NVIDIA's documentation the simulated driver assumes:
//!    - set checks its arguments (null pointer or `nameSpace`, soft > hard) before privilege, and
//!      privilege before looking at the path;
//!    - get on a path that does not exist is `NVML_ERROR_NOT_FOUND` too (documented for set
//!      only); a relative path, or an existing path that is not a cgroup v2 directory (a plain
//!      directory, a cgroup v1 one), is `NVML_ERROR_INVALID_ARGUMENT` for both;
//!    - a limit belongs to the cgroup, not the path: the same cgroup through another cgroup2
//!      mount point reads the same limits, and a cgroup removed and created again under the same
//!      name has none;
//!    - limits are hierarchical: a process is held to the hard limit of its cgroup and of every
//!      ancestor, and a cgroup's use (`currentUsed`, enforcement) counts the processes of the
//!      cgroups below it as well; the use is summed from the pids `cgroup.procs` shows to the
//!      reader, as the simulated per-process records name them;
//!    - every device-memory allocation counts against the hard limit (plain, pitched, managed,
//!      legacy, arrays, `cuMemCreate`, pool and graph-pool growth), except a context's own
//!      footprint (`GPUSHARE_SIM_CTX_MIB`), which is taken without a check;
//!    - the soft limit changes nothing (no memory pressure is modelled);
//!    - in a limited cgroup, `cuMemGetInfo*` free and NVML free are also never more than the
//!      device has free, NVML used is total minus free, and `cuDeviceTotalMem*` still reports the
//!      whole device;
//!    - a limit applies from the next allocation or query on, also to processes already
//!      running in the cgroup and to ones moved into it later.
//! 9. **MPS client pinned device memory limit** (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, see
//!    `mps.rs`; not probed by `tests/gpu/guesses.c`). No MPS daemon or server is simulated.
//!    Beyond NVIDIA's MPS documentation the simulated driver assumes:
//!    - a process is an MPS client exactly when `CUDA_MPS_PIPE_DIRECTORY` is set and non-empty
//!      (a real client is one that reached a running control daemon, by default through
//!      `/tmp/nvidia-mps` even with the variable unset);
//!    - size qualifiers are binary (`M` = MiB, `G` = GiB), `MB`/`GB` and lower case are accepted
//!      as well, and a size without a qualifier, a fraction or another unit is malformed;
//!    - a device key is a CUDA ordinal (no `CUDA_VISIBLE_DEVICES` remapping is simulated) or a
//!      GPU UUID or unique `GPU-` prefix; a later entry for the same device replaces an earlier
//!      one; a value without `=` (one size for every device) is malformed;
//!    - a malformed value, including one that names a device the process does not have, is
//!      ignored as a whole with a warning on stderr (no CUDA error at `cuInit`);
//!    - `0M` is a limit of zero bytes (every allocation fails), not "no limit";
//!    - the limit counts the process's own device memory on that device, its context footprint
//!      (`GPUSHARE_SIM_CTX_MIB`, taken without a check) and pool reserve included, and applies to
//!      every allocation path; it is read once, at `cuInit` (or the first allocation or memory
//!      query, if earlier), so later changes to the environment are not seen;
//!    - `cuMemGetInfo*` reports total = the device's total (or the cgroup cap) and free = the
//!      room left under the limit (never more than the device or cgroup free), as a public
//!      report of a real client with `0=1G` showed; an H100 with driver 580 did the same
//!      (docs/real-gpu.md);
//!    - NVML (`nvmlDeviceGetMemoryInfo*`), `cuDeviceTotalMem*` and other processes do not see it;
//!      the control daemon's `set_default_device_pinned_mem_limit`/`set_device_pinned_mem_limit`
//!      (which the documentation says the variable can only lower) are not modelled.

/// Alignment of a whole CUDA array's memory.
pub const ARRAY_ALIGN: u64 = 64 << 10;

/// First pointer the legacy `cuMemAlloc` hands out.
pub const LEGACY_PTR_BASE: u64 = 0x1000_0000;

/// Growth step of a memory pool.
pub const POOL_CHUNK: u64 = 2 << 20;

/// `cuMemGetAllocationGranularity` for device memory.
pub const VMM_GRANULARITY: u64 = 2 << 20;
