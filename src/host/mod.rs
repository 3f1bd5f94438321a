//! Doing on the host: the state directory and its locks, the GPUs' compute modes, MPS daemons,
//! and the acquire/release/gc that carry a plan out. [`handle::Host`] is what they work
//! through; its methods live with their concern (`acquire`, `daemon`, `driver_limit`,
//! `reservation`, `release`, `gc_sweep`).

pub mod account;
pub mod acquire;
pub mod cgroup;
pub mod counters;
pub mod daemon;
pub mod driver_limit;
pub mod events;
pub mod gc_sweep;
pub mod handle;
pub mod inventory;
pub mod lockfile;
pub mod mounts;
pub mod mps;
pub mod multiuser;
pub mod pending;
pub mod procinfo;
pub mod reaper;
pub mod release;
pub mod reservation;
pub mod sandbox;
pub mod small_file;
pub mod snapshot;
pub mod state;
pub mod step;
pub mod timeslice;

#[cfg(test)]
pub(crate) mod fakes;
#[cfg(test)]
pub(crate) mod tests;
