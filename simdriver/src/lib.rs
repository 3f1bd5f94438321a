//! TEST-ONLY simulated NVIDIA driver: one shared library that stands in for both
//! `libnvidia-ml.so.1` (NVML) and `libcuda.so.1` (CUDA driver API) in gpushare's tests.
//! It drives no hardware and must never be installed on a real system.
//!
//! # Environment contract (what tests and the hook core rely on)
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GPUSHARE_SIM_DEVICES` | comma list of per-GPU memory sizes in MiB; entry count = GPU count (at most 16) | `81920` (one 80 GiB GPU); an invalid value prints a one-line warning on stderr and uses the default |
//! | `GPUSHARE_SIM_STATE` | directory for state shared between processes, created with mode 0700 | `/tmp/gpushare-sim` |
//! | `GPUSHARE_SIM_FAIL` | comma list of exported function names that fail: NVML ones return `NVML_ERROR_UNKNOWN` (999), CUDA ones `CUDA_ERROR_UNKNOWN` (999); an entry `name=code` fails with that code | none |
//! | `GPUSHARE_SIM_KERNEL_US` | simulated GPU time of one kernel launch, microseconds | `500` |
//! | `GPUSHARE_SIM_CTX_MIB` | device memory a context itself occupies, MiB | `0` |
//! | `GPUSHARE_SIM_PITCH_ALIGN` | row alignment of pitched memory and CUDA arrays, bytes | `512` |
//! | `GPUSHARE_SIM_INIT_LOG` | a file each successful `nvmlInit*` appends `<pid> <command line>` to, one line per call, so that a test sees which processes loaded NVML | none |
//! | `GPUSHARE_SIM_MEMORY_LIMITS` | `0` (or `false`/`off`/`no`) models a driver older than r615: `nvmlDeviceSetMemoryLimits_v1`/`nvmlDeviceGetMemoryLimits_v1` return `NVML_ERROR_FUNCTION_NOT_FOUND` (13) and touch no state | on |
//!
//! GPU `i`: UUID `GPU-5a1e0000-0000-4000-8000-{i:012x}`, name
//! `Simulated GPU (gpushare test driver)`, minor number `i`, NVML index `i` (CUDA ordinal `i`
//! too), PCI bus id `00000000:{i+1:02x}:00.0`, driver version `535.999.99-sim`, CUDA driver
//! version 12020.
//!
//! State under `GPUSHARE_SIM_STATE`:
//! - `compute_mode.<i>`: decimal NVML compute mode of GPU `i` (0 DEFAULT, 2 PROHIBITED,
//!   3 EXCLUSIVE_PROCESS, as in nvml.h); absent = 0; written to a temp file in the same
//!   directory and renamed.
//! - `proc.<pid>`: a memory-mapped record per process that used the CUDA side (memory in use
//!   per GPU, simulated busy time). NVML memory info, running processes and utilisation sum the
//!   records of live processes; a dead process's record (pid gone, or start time from
//!   `/proc/<pid>/stat` field 22 changed) is ignored and removed, so its memory comes back.
//! - `memlimits.<i>/<st_dev>.<st_ino>`: r615 cgroup memory limits of one cgroup v2 directory on
//!   GPU `i` (text `soft=<n>`, `hard=<n>`, `namespace=<path>` lines; temp file + rename; removed
//!   when cleared). See [`memlimits`].
//! - `nvml-memory-limits.log`: one JSON line per call of either memory-limit function (success
//!   or not), e.g. `{"call":"set","index":0,"namespace":"/sys/fs/cgroup/x","soft":1,"hard":2,
//!   "result":0}` and `{"call":"get",…,"currentUsed":0,"result":0}`; unknown fields are `null`.
//!
//! NVML: calls before `nvmlInit*` return `NVML_ERROR_UNINITIALIZED`, a bad index or handle
//! `NVML_ERROR_INVALID_ARGUMENT`, a too-small buffer `NVML_ERROR_INSUFFICIENT_SIZE`. Handles
//! are pointers into a static table and are validated when passed back. Utilisation sample
//! timestamps are CLOCK_MONOTONIC microseconds.
//!
//! NVML r615 (CUDA 13.4) cgroup memory limits, as NVIDIA documents them:
//! `nvmlDeviceSetMemoryLimits_v1(device, nvmlSetMemoryLimits_v1_t *)` (24 bytes: `nameSpace`,
//! `softLimit`, `hardLimit`) and `nvmlDeviceGetMemoryLimits_v1(device,
//! nvmlGetMemoryLimits_v1_t *)` (32 bytes: `nameSpace` in; `softLimit`, `hardLimit`,
//! `currentUsed` out). `nameSpace` is the full path of a cgroup v2 directory. Set needs euid 0
//! (`NVML_ERROR_NO_PERMISSION`); a null pointer or `nameSpace`, or soft > hard with hard below
//! `NVML_DEVICE_MEMORY_LIMIT_MAX` (`u64::MAX`), is `NVML_ERROR_INVALID_ARGUMENT`; a missing
//! directory `NVML_ERROR_NOT_FOUND`. Soft 0 / hard MAX clears, and is what get reads when no
//! limit is set; removing the cgroup clears its limits. `currentUsed` is the device memory of
//! the live simulated processes in the cgroup (its `cgroup.procs` and those of the cgroups below
//! it). A hard limit makes the CUDA side of a process in that cgroup (found from
//! `/proc/self/cgroup` and the cgroup2 mounts in `/proc/self/mountinfo`, matched by the
//! directory's `st_dev`/`st_ino`) fail an allocation that would take the cgroup past it with
//! `CUDA_ERROR_OUT_OF_MEMORY`, and caps what `cuMemGetInfo*` and `nvmlDeviceGetMemoryInfo*`
//! report there (total = min(device, hard), free = the room left). The soft limit is stored and
//! read back only. A real pre-r615 `libnvidia-ml.so.1` lacks both symbols; this one library
//! cannot hide them, so callers must treat a missing symbol and `NVML_ERROR_FUNCTION_NOT_FOUND`
//! or `NVML_ERROR_NOT_SUPPORTED` alike. Also subject to `GPUSHARE_SIM_FAIL`. What goes beyond
//! NVIDIA's documentation is listed in [`cuda::guesses`].
//!
//! MPS client pinned device memory limit (TEST-ONLY model of NVIDIA MPS's
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, no MPS daemon or server is simulated): a process is an
//! MPS client when `CUDA_MPS_PIPE_DIRECTORY` is set and non-empty in its environment. A
//! client's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` is a comma list of `<device>=<size>`: the device
//! a CUDA ordinal or a GPU UUID (or a unique prefix of one from `GPU-` on), the size an integer
//! followed by `M` or `G` (`MB`/`GB` and lower case too; MiB and GiB), e.g. `0=1G,1=512M`. It
//! caps the device memory that process itself holds on that device: an allocation that would
//! take its own use (including its context footprint) past the limit fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` (every allocation path, as for the cgroup limit), and
//! `cuMemGetInfo*` reports total = min(what it reports otherwise, limit) and free = the room left
//! under the limit (never more than otherwise). NVML, `cuDeviceTotalMem*` and other processes
//! are unaffected. Both variables are read once per process, at `cuInit`; a malformed value (any
//! bad entry, an unknown device, a size without `M`/`G`) is ignored as a whole with a one-line
//! warning on stderr; without `CUDA_MPS_PIPE_DIRECTORY` the limit variable is ignored. See
//! [`mps`]; what goes beyond NVIDIA's documentation is listed in [`cuda::guesses`].
//!
//! CUDA: allocations are bookkeeping only (fake device pointers, no host memory behind them),
//! owned by the context that was current (freed when it is destroyed, as a real driver does;
//! `cuMemCreate` memory belongs to the process); arrays take driver-like rounded sizes; host
//! allocations are real host memory;
//! a launch queues `GPUSHARE_SIM_KERNEL_US` of simulated busy time on the calling process's
//! timeline for the context's device (blocking once more than 20 ms is queued), which NVML
//! reports as that process's SM utilisation. Synchronise calls wait for the queue to drain.
//!
//! Memory pools keep real bookkeeping (reserved, used, release threshold): stream-ordered
//! allocations are served from a pool's free reserved memory and grow it in 2 MiB chunks only
//! when that is too small; `cuMemFreeAsync` returns memory to the pool; synchronisation releases
//! reserved memory above the release threshold (0 by default, as in CUDA); `cuMemPoolTrimTo`
//! releases down to its argument. The device's used memory counts pools' reserved memory.
//!
//! `install-sim.sh DIR` creates `DIR/libcuda.so.1` and `DIR/libnvidia-ml.so.1` symlinks to the
//! built library, for `LD_LIBRARY_PATH`.

pub mod cgroup;
#[cfg(test)]
mod cgroup_e2e;
pub mod config;
pub mod cuda;
pub mod memlimits;
pub mod mps;
#[cfg(test)]
mod mps_e2e;
pub mod nvml;
pub mod state;
