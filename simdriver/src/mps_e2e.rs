//! TEST-ONLY: end-to-end tests of the simulated MPS client pinned device memory limit
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, mps.rs) in real processes: each client is this test
//! binary run again as `cgroup_e2e`'s command server (two GPUs of 4096 MiB, own state
//! directory), with the MPS variables in its environment.

use crate::cgroup_e2e::{scratch, Server};

const MIB: u64 = 1 << 20;

/// Asks `s` to allocate `mib` MiB on GPU 0 and returns the CUDA result.
fn alloc(s: &mut Server, mib: u64) -> u64 {
    s.ask(&format!("alloc {}", mib * MIB))[0]
}

/// `(result, free, total)` of `cuMemGetInfo_v2` in `s`.
fn info(s: &mut Server) -> (u64, u64, u64) {
    let a = s.ask("info");
    (a[0], a[1], a[2])
}

#[test]
fn mps_client_limit_caps_own_allocations_and_mem_info() {
    let state = scratch("mps-client");
    let mut s = Server::spawn(
        &state,
        &[
            ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/x"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=512M"),
        ],
    );
    assert_eq!(
        info(&mut s),
        (0, 512 * MIB, 4096 * MIB),
        "free is the limit, total the device's"
    );
    assert_eq!(alloc(&mut s, 400), 0, "400 MiB fits under 512 MiB");
    assert_eq!(info(&mut s), (0, 112 * MIB, 4096 * MIB));
    assert_eq!(alloc(&mut s, 200), 2, "600 MiB would pass the limit");
    assert_eq!(alloc(&mut s, 100), 0, "positive control: 500 MiB fits");
    assert_eq!(info(&mut s), (0, 12 * MIB, 4096 * MIB));
    assert_eq!(alloc(&mut s, 13), 2, "one MiB past the limit");
    assert_eq!(alloc(&mut s, 12), 0, "exactly up to the limit");
    drop(s);
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn mps_limit_without_pipe_directory_is_ignored() {
    let state = scratch("mps-nonclient");
    let mut s = Server::spawn(&state, &[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=512M")]);
    assert_eq!(alloc(&mut s, 800), 0, "not an MPS client: no limit");
    assert_eq!(info(&mut s), (0, 3296 * MIB, 4096 * MIB), "the whole GPU");
    drop(s);
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn mps_limit_on_another_gpu_leaves_gpu0_alone() {
    let state = scratch("mps-other");
    let mut s = Server::spawn(
        &state,
        &[
            ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/x"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "1=512M"),
        ],
    );
    assert_eq!(alloc(&mut s, 800), 0, "the limit is on GPU 1 only");
    drop(s);
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn malformed_mps_limit_is_ignored() {
    let state = scratch("mps-malformed");
    let mut s = Server::spawn(
        &state,
        &[
            ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/x"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "512M"),
        ],
    );
    assert_eq!(alloc(&mut s, 800), 0, "a malformed value limits nothing");
    drop(s);
    let _ = std::fs::remove_dir_all(&state);
}
