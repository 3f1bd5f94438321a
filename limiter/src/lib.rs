//! libgpushare_limiter.so: the interception library for gpushare's `limit` mode. Preloaded into
//! every process of a container, it caps device memory and SM utilisation per GPU and makes
//! `cuMemGetInfo`, `cuDeviceTotalMem` and NVML memory queries (`nvidia-smi`) report the cap.
//!
//! Limits come from the HAMi-core compatible environment (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`,
//! `CUDA_DEVICE_SM_LIMIT[_<i>]`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`) or, when the env has no limit,
//! from the limits file (`/usr/local/gpushare/limits`, or `GPUSHARE_LIMITS_FILE`). With no limit
//! the library is inert: every wrapper forwards to the driver unchanged.
//!
//! Programs reach the wrappers three ways: the exported `cu*`/`nvml*` symbols (linked
//! programs), the `dlsym` override (programs that `dlopen` the driver), and
//! `cuGetProcAddress`/`_v2` (the CUDA runtime 11.3+). See `limiter/README.md`.
//!
//! Module map, each depending only on those listed after it:
//! - the exported wrappers: [`interpose`] (wrapper table, `dlsym`, `cuGetProcAddress`), then
//!   [`launch`] (launch and synchronise), [`graphs`] (graph memory), [`mempool`]
//!   (stream-ordered allocations),
//!   [`arrays`], [`contexts`], [`vmm`] (mappings), [`memory`] (plain allocations, memory
//!   reports), [`nvml`];
//! - the SM cap: [`watcher`] (refill thread) and [`sm`] (token buckets);
//! - the accounting: [`state`] (process-wide limiter), [`biased`] (the lock of its table of
//!   allocations), [`pools`] (watched memory pools),
//!   [`region`] (shared accounting file), [`limits`] and [`visible`] (pure parsing);
//! - [`driver`]: asking the real driver (entry points, queries), and [`sys`] (libc FFI).

pub mod arrays;
pub mod biased;
pub mod contexts;
pub mod driver;
pub mod graphs;
pub mod interpose;
pub mod launch;
pub mod limits;
pub mod memory;
pub mod mempool;
pub mod nvml;
pub mod pools;
pub mod region;
pub mod sm;
pub mod state;
pub mod sys;
pub mod visible;
pub mod vmm;
pub mod watcher;

/// Resolves glibc's `dlsym` at load time, before any caller can reach our `dlsym`.
extern "C" fn on_load() {
    let _ = sys::real_dlsym();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
