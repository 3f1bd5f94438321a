//! The only module with `unsafe`, one file per concern: the mount API's system calls
//! ([`mount_api`]), the MPS daemon's sandbox set up between fork and exec ([`mount_namespace`]),
//! detached children ([`detach`]), process descriptors ([`pidfd`]), dropping privileges before
//! exec ([`privileges`]), a child that records itself before exec ([`self_record`]), a process
//! entry without Rust's runtime set-up ([`entry`]), a child born in a cgroup
//! ([`into_cgroup`]), inspecting a library by loading it
//! ([`dlopen`]) and NVML, loaded by hand ([`nvml`]). Every `unsafe` block says,
//! in its SAFETY comment, what makes that call safe. Callers use the re-exports below
//! (`crate::sys::name`).
#![allow(unsafe_code)]

pub mod detach;
pub mod dlopen;
pub mod entry;
pub mod into_cgroup;
pub mod mount_api;
pub mod mount_namespace;
pub mod nvml;
pub mod pidfd;
pub mod privileges;
pub mod self_record;

pub use detach::detached;
pub use dlopen::missing_symbols;
pub use into_cgroup::{reap, spawn_into_cgroup_if_alone, try_reap, IntoCgroupError};
pub use mount_api::{
    clone_tree, is_mount_root, move_mount_onto, umount_fd_detach, SyscallError, MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};
pub use mount_namespace::{daemon_in_sandbox, DaemonMounts};
pub use pidfd::{pidfd_open, pidfd_send_signal};
pub use privileges::drop_privileges_on_exec;
pub use self_record::record_self_on_exec;
