//! Cost of one MPS control command as gpushare sends it (the control client in a mount
//! namespace of its own that shows it only the daemon's pipe directory) against the same
//! command from a plain client process waited for as before (polling with backoff), alternating,
//! in one run.
//!
//! Needs root and `nvidia-cuda-mps-control`; the control daemon needs no GPU.
//! Run: `cargo bench --bench mps_command` (rounds: `BENCH_ROUNDS`, default 301).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpushare::host::mps::{Control, MpsDirs};

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(301);
    let control = Control::new("nvidia-cuda-mps-control").expect("nvidia-cuda-mps-control");
    let dir = tempfile::Builder::new()
        .prefix("gpushare-bench-cmd-")
        .tempdir()
        .unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let dirs = MpsDirs::new(state.join("mps").join("GPU-bench"));
    // Daemon starts (sandbox, emptied pipe dir, until it answers), then one kept running.
    let mut starts = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        let d = control
            .start("GPU-bench", &dirs, false, Duration::from_secs(10))
            .expect("daemon starts");
        starts.push(t.elapsed());
        control.stop(&dirs.pipe, Some(d));
    }
    starts.sort();
    let daemon = control
        .start("GPU-bench", &dirs, false, Duration::from_secs(10))
        .expect("daemon starts");

    let plain = |pipe: &Path| -> Duration {
        let t = Instant::now();
        let mut c = Command::new(control.binary())
            .env_clear()
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(b"get_server_list\n")
            .unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        t.elapsed()
    };
    let sandboxed = |pipe: &Path| -> Duration {
        let t = Instant::now();
        control
            .command(pipe, "get_server_list", Duration::from_secs(5))
            .expect("answers");
        t.elapsed()
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(plain(&dirs.pipe));
        b.push(sandboxed(&dirs.pipe));
    }
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().count())
        .unwrap_or(0);
    let (pa, pb) = (med(&mut a), med(&mut b));
    println!(
        "daemon start until it answers, median of {}: {:.3} ms",
        starts.len(),
        starts[starts.len() / 2].as_secs_f64() * 1e3
    );
    println!("one get_server_list, medians over {rounds} alternating rounds ({mounts} mounts on the host):");
    println!("  plain control client, as before {pa:>7.3} ms");
    println!(
        "  sandboxed (as gpushare sends) {pb:>7.3} ms   +{:.3} ms, {:.2}x",
        pb - pa,
        pb / pa
    );
    control.stop(&dirs.pipe, Some(daemon));
    dirs.remove();
}
