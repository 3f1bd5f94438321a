//! gpushare: share NVIDIA GPUs between OCI containers.
//!
//! The library owns everything; the binaries in `src/bin` only parse arguments, set up
//! logging, call one function here and map the result to an exit code.
//!
//! Layers, lowest first; a module only uses modules of its own or a lower layer:
//! - [`vocab`]: the shared words (modes, GPUs and compute modes, safe names, sizes);
//! - [`config`]: the admin policy file;
//! - [`decide`]: pure deciding, spec + policy + GPU list in, a [`decide::plan::Plan`] out;
//! - [`host`]: doing on the host (state, locks, compute modes, MPS daemons, acquire/release);
//! - [`container`]: getting the share into the container (hook stages, spec edit, wrapper);
//! - [`admin`]: the admin commands;
//! - [`cli`] and [`commands`]: the command line and one function per command, for the binaries.
//!
//! `sys` holds the crate's `unsafe` code and is private to the crate.
#![deny(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod commands;
pub mod config;
pub mod container;
pub mod decide;
pub mod failpoint;
pub mod host;
pub mod logging;
pub(crate) mod sys;
pub mod vocab;

pub use container::error::Error;
/// For the binaries' `#![no_main]` entries: what Rust's runtime set-up would have done that
/// they still need (see `sys::entry`).
pub use sys::entry::prepare as prepare_process;
/// For a process that ends soon after its last use of NVML (a hook stage, the runtime wrapper,
/// which execs the next runtime): NVML's unload is left to the process's end (see `sys::nvml`).
pub use sys::nvml::leave_loaded_until_exit as leave_nvml_to_exit;

/// Version string printed by `gpushare-hook version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
