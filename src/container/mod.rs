//! Getting a share into the container: the hook stages, the spec edit (podman's precreate and
//! the runtime wrapper) and the mounts into the container's rootfs.

pub mod error;
pub mod hook;
pub mod inject;
pub mod intake;
pub mod prepare;
pub mod runtime;
pub mod spec_edit;
