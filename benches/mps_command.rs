//! Cost of one MPS control command as gpushare sends it (in-process, over the control socket,
//! after proving the listener is the recorded daemon) against the same command from NVIDIA's
//! client program, alternating, in one run.
//!
//! Needs root and `nvidia-cuda-mps-control`; the control daemon needs no GPU.
//! Run: `cargo bench --bench mps_command` (rounds: `BENCH_ROUNDS`, default 301).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpushare::host::mps::{protocol, Control, MpsControl, MpsDirs};

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
    dirs.prepare(64 << 20).expect("directories and their tmpfs");
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
    let proven = |pipe: &Path| -> Duration {
        let t = Instant::now();
        protocol::converse(pipe, daemon, &["get_server_list"], Duration::from_secs(5))
            .expect("answers");
        t.elapsed()
    };
    let limits = gpushare::vocab::Limits {
        cores: 50,
        memory_mib: Some(1024),
    };
    let refresh = |pipe: &Path| -> Duration {
        let t = Instant::now();
        control
            .refresh(pipe, daemon, &limits)
            .expect("defaults put back");
        t.elapsed()
    };
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(plain(&dirs.pipe));
        b.push(proven(&dirs.pipe));
        c.push(refresh(&dirs.pipe));
    }
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().count())
        .unwrap_or(0);
    let (pa, pb, pc) = (med(&mut a), med(&mut b), med(&mut c));
    println!(
        "daemon start until it answers, median of {}: {:.3} ms",
        starts.len(),
        starts[starts.len() / 2].as_secs_f64() * 1e3
    );
    println!("one get_server_list, medians over {rounds} alternating rounds ({mounts} mounts on the host):");
    println!("  NVIDIA's control client         {pa:>7.3} ms");
    println!(
        "  in-process, proven (gpushare)   {pb:>7.3} ms   {:+.3} ms, {:.2}x",
        pb - pa,
        pb / pa
    );
    println!("  a joining acquire's check (defaults set and read back, proven) {pc:>7.3} ms");
    control.stop(&dirs.pipe, Some(daemon));
    dirs.remove();
}
