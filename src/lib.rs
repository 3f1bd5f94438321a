//! gpushare: share NVIDIA GPUs between OCI containers.
//!
//! The library owns everything; the binaries in `src/bin` only parse arguments, set up
//! logging, call one function here and map the result to an exit code. Deciding (pure:
//! [`request`], [`devices`], [`plan`]) is kept apart from doing ([`state`], [`mps`],
//! [`acquire`], [`sys`]).
#![deny(unsafe_code)]

pub mod acquire;
pub mod admin;
pub mod config;
pub mod configure;
pub mod devices;
pub mod doctor;
pub mod error;
pub mod failpoint;
pub mod hook;
pub mod inject;
pub mod input;
pub mod inventory;
pub mod logging;
pub mod mps;
pub mod plan;
pub mod prepare;
pub mod procinfo;
pub mod quantity;
pub mod release;
pub mod request;
pub mod runtime;
pub mod spec_edit;
pub mod state;
pub mod sys;
pub mod timeslice;

pub use error::Error;

/// Version string printed by `gpushare-hook version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
