//! Deciding, pure: the container's spec and the admin policy in, a [`plan::Plan`] out. Nothing
//! here touches the host; tests compare plans as data and `--dry-run` prints them.

pub mod admission;
pub mod devices;
pub mod domain;
pub mod enforce;
pub mod front;
pub mod input;
pub mod oci_state;

pub mod kube;
pub mod plan;
pub mod profile;
pub mod request;
