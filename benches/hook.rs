//! Whole-process benchmark of `gpushare-hook`, against a floor process (this binary re-run with
//! `--floor`: reads the same stdin and exits) measured in the same run, alternating:
//! - the no-share fast path (target: within 3x the floor and under 2 ms),
//! - an MPS acquire with the daemon already running (target: under 10 ms),
//! - 32 concurrent acquires on one GPU (total time), cold and warm;
//! - the same with four MPS isolation domains on one GPU (`isolation = "group"`);
//! - createRuntime with a memory cap for the whole container, per backend: the limiter
//!   (preloaded in `timeslice` and `mps` mode) and the driver's cgroup limits (the simulated
//!   r615 NVML, on a cgroup v2 of the container's own), against the same mode uncapped;
//! - a timeslice and an MPS create on an idle GPU (50 ms after the last release): the GPU's
//!   reaper waits for the next client, the MPS daemon does not;
//! - a timeslice join (another timeslice container on the GPU) against the GPU's first client.
//!
//! Uses the TEST-ONLY simulated NVML and the real `nvidia-cuda-mps-control`.
//! Run: `scripts/bench-hook.sh` (or `cargo bench --bench hook` after `cargo build --release --workspace`).

#[allow(dead_code)]
#[path = "../tests/common/cgroup2.rs"]
mod cgroup2;
#[path = "common/reapers.rs"]
mod reapers;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    if std::env::args().any(|a| a == "--floor") {
        let mut buf = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut buf);
        return;
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(201);
    // `BENCH_HOOK` times another build (its simulated driver and limiter beside it), e.g. the
    // code before a change, in runs interleaved with this one's.
    let hook = std::env::var_os("BENCH_HOOK").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook")),
        PathBuf::from,
    );
    let sim = hook.parent().unwrap().join("libgpushare_simdriver.so");
    assert!(
        sim.exists(),
        "{} missing: cargo build --release --workspace first",
        sim.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("gpushare-bench-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    // Time copies written whole, as a package manager installs them (and as a `BENCH_HOOK` build
    // usually is): the very bytes the linker wrote start up measurably slower from the linker's
    // own file here (more page faults on the code: 164 against 146 for the same hook), which
    // would count against whichever build is timed from `target/`.
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for f in [&hook, &sim, &sim.with_file_name("libgpushare_limiter.so")] {
        std::fs::copy(f, bin.join(f.file_name().unwrap())).unwrap();
    }
    let hook = bin.join(hook.file_name().unwrap());
    let sim = bin.join("libgpushare_simdriver.so");
    // The state dir on tmpfs, as the default /run/gpushare is on a real node; the TEST-ONLY
    // simulated driver's state too: it writes (and fsyncs) a file where a real driver keeps the
    // limit in kernel memory behind an ioctl, and its disk writes are not gpushare's cost.
    let tmpfs = ["state", "sim"].iter().all(|dir| {
        std::fs::create_dir_all(d.join(dir)).unwrap();
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=0700", "gpushare-bench"])
            .arg(d.join(dir))
            .status()
            .is_ok_and(|s| s.success())
    });
    println!(
        "state dir on {}",
        if tmpfs {
            "tmpfs (as /run/gpushare), the simulated driver's state too"
        } else {
            "the temp dir's file system (tmpfs mount failed)"
        }
    );
    let limiter = sim.with_file_name("libgpushare_limiter.so");
    let policy = format!("[limit]\nlibrary = {limiter:?}\n");
    let base_config = format!(
        "state_dir = {:?}\nlog_file = {:?}\n[nvml]\nlibrary = {:?}\n{policy}",
        d.join("state"),
        d.join("log"),
        sim
    );
    std::fs::write(d.join("config.toml"), &base_config).unwrap();
    let env = [
        (
            "GPUSHARE_CONFIG",
            d.join("config.toml").display().to_string(),
        ),
        ("GPUSHARE_SIM_STATE", d.join("sim").display().to_string()),
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
    ];
    let bundle = |name: &str, config: &str| -> PathBuf {
        let b = d.join(name);
        std::fs::create_dir_all(b.join("rootfs/tmp")).unwrap();
        std::fs::write(b.join("config.json"), config).unwrap();
        b
    };
    // A realistic-size spec (podman's, captured on this machine) without and with a request.
    let fixture = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/podman-mps.json"),
    )
    .unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&fixture).unwrap();
    v["root"]["path"] = serde_json::json!("rootfs");
    let capped_mps_cfg = v.to_string();
    // The MPS cases without a memory cap, as measured before caps brought the limiter in.
    v["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("gpu.share.memory");
    let mps_cfg = v.to_string();
    let ann = v["annotations"].as_object_mut().unwrap();
    ann.remove("gpu.share");
    let plain_cfg = v.to_string();
    assert!(!plain_cfg.contains("gpu.share"), "fixture edit failed");
    let plain = bundle("plain", &plain_cfg);
    let mps = bundle("mps", &mps_cfg);
    let floor_exe = std::env::current_exe().unwrap();

    // A run of `exe`, timed; with `steps`, under `GPUSHARE_LOG=debug`, returning its stderr.
    let run_with = |exe: &Path, args: &[&str], stdin: &str, steps: bool| -> (Duration, String) {
        let t = Instant::now();
        let mut c = Command::new(exe)
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .envs(steps.then_some(("GPUSHARE_LOG", "debug")))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        let el = t.elapsed();
        assert!(
            out.status.success(),
            "{:?} failed: {}",
            args,
            String::from_utf8_lossy(&out.stderr)
        );
        (el, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let run = |exe: &Path, args: &[&str], stdin: &str| run_with(exe, args, stdin, false).0;
    let state = |id: &str, pid: u32, b: &Path| {
        format!(
            r#"{{"ociVersion":"1.0.2","id":"{id}","status":"creating","pid":{pid},"bundle":"{}"}}"#,
            b.display()
        )
    };
    // A stand-in container process, returned once it is in a mount namespace of its own.
    let sleeper = || {
        let c = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sleep", "600"])
            .spawn()
            .unwrap();
        let own = std::fs::read_link("/proc/self/ns/mnt").ok();
        // Its own namespace, and `sleep` running (not `unshare` still starting it beside the
        // measured run).
        while std::fs::read_link(format!("/proc/{}/ns/mnt", c.id())).ok() == own
            || std::fs::read_to_string(format!("/proc/{}/comm", c.id()))
                .ok()
                .as_deref()
                != Some("sleep\n")
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        c
    };

    // Keep the daemon warm with a holder client.
    let mut holder = sleeper();
    run(
        &hook,
        &["createRuntime"],
        &state("holder", holder.id(), &mps),
    );

    let mut floor = Vec::new();
    let mut cat = Vec::new();
    let mut fast = Vec::new();
    let mut acquire = Vec::new();
    // Each measured create gets a container process of its own, started before the clock, as
    // on a node: one process reused for every round collects each round's bind mounts in its
    // mount namespace (over a thousand by the end of the cap section), and every later bind
    // and read of its mount table pays for them.
    let created_with = |id: &str,
                        bundle: &Path,
                        cgroup: Option<&cgroup2::Cgroup2>,
                        steps: bool|
     -> (Duration, String) {
        let mut c = sleeper();
        if let Some(cg) = cgroup {
            assert!(
                cg.enter(c.id()),
                "cannot move the container into the bench cgroup"
            );
        }
        let took = run_with(&hook, &["createRuntime"], &state(id, c.id(), bundle), steps);
        // The container exits, then its poststop runs, as on a node; the GPU's reaper wakes on
        // the exit and looks 10 ms later (`reaper::SETTLE`): it is given time to be done before
        // the next measured run.
        let _ = c.kill();
        let _ = c.wait();
        run(&hook, &["poststop"], &state(id, 0, bundle));
        std::thread::sleep(Duration::from_millis(15));
        took
    };
    let created = |id: &str, bundle: &Path, cgroup: Option<&cgroup2::Cgroup2>| {
        created_with(id, bundle, cgroup, false).0
    };
    let plain_state = state("plain", 1, &plain);
    for i in 0..rounds {
        floor.push(run(&floor_exe, &["--floor"], &plain_state));
        cat.push(run(Path::new("/bin/cat"), &[], &plain_state));
        fast.push(run(&hook, &["createRuntime"], &plain_state));
        acquire.push(created(&format!("c{i}"), &mps, None));
    }
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (f, c, n, a) = (
        med(&mut floor),
        med(&mut cat),
        med(&mut fast),
        med(&mut acquire),
    );
    println!("gpushare-hook whole-process medians over {rounds} alternating rounds:");
    println!("  floor (read stdin, exit)        {:>8.3} ms", ms(f));
    println!("  cat (the same stdin)            {:>8.3} ms", ms(c));
    println!("  no-share fast path              {:>8.3} ms   ratio to floor {:.2}x (target <= 3x, < 2 ms), to cat {:.2}x (target <= 1.2x)", ms(n), n.as_secs_f64() / f.as_secs_f64(), n.as_secs_f64() / c.as_secs_f64());
    println!(
        "  mps acquire, daemon running     {:>8.3} ms   (target < 10 ms), ratio to the no-share fast path {:.2}x (target <= 1.5x)",
        ms(a),
        a.as_secs_f64() / n.as_secs_f64()
    );

    // 32 concurrent acquires on one GPU, daemon cold (first one starts it; the burst's releases
    // stop it again), then warm (a holder keeps it running); each repeated BURSTS times.
    let burst = |id: &dyn Fn(usize) -> String, bundle: &dyn Fn(usize) -> PathBuf| -> Duration {
        let kids: Vec<_> = (0..32).map(|_| sleeper()).collect();
        let states = kids
            .iter()
            .enumerate()
            .map(|(i, k)| state(&id(i), k.id(), &bundle(i)))
            .collect();
        let total = concurrent_acquires(&hook, &env, states);
        for i in 0..32 {
            run(&hook, &["poststop"], &state(&id(i), 0, &bundle(i)));
        }
        for mut k in kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        total
    };
    run(&hook, &["poststop"], &state("holder", 0, &mps));
    let one_gpu = |i: usize| format!("p{i}");
    let mut cold: Vec<Duration> = (0..BURSTS)
        .map(|_| burst(&one_gpu, &|_| mps.clone()))
        .collect();
    // A fresh holder: the old one's namespace still has the removed pipe dir mounted.
    let _ = holder.kill();
    let _ = holder.wait();
    holder = sleeper();
    run(
        &hook,
        &["createRuntime"],
        &state("holder", holder.id(), &mps),
    );
    let mut warm: Vec<Duration> = (0..BURSTS)
        .map(|_| burst(&one_gpu, &|_| mps.clone()))
        .collect();
    report_bursts("cold daemon", &mut cold);
    report_bursts("warm daemon", &mut warm);
    println!("    (target for the warm daemon: <= 60 ms total)");
    run(&hook, &["poststop"], &state("holder", 0, &mps));

    // Four isolation domains on one GPU (`isolation = "group"`): a warm acquire in one of
    // them, and 32 concurrent acquires spread over the four, cold and warm.
    std::fs::write(
        d.join("config.toml"),
        format!(
            "state_dir = {:?}\nlog_file = {:?}\n[nvml]\nlibrary = {:?}\n[mps]\nisolation = \"group\"\n{policy}",
            d.join("state"),
            d.join("log"),
            sim
        ),
    )
    .unwrap();
    let groups: Vec<PathBuf> = (0..4)
        .map(|g| {
            let mut v: serde_json::Value = serde_json::from_str(&mps_cfg).unwrap();
            v["annotations"]["gpu.share.group"] = serde_json::json!(format!("g{g}"));
            bundle(&format!("group{g}"), &v.to_string())
        })
        .collect();
    let holders: Vec<_> = (0..4).map(|_| sleeper()).collect();
    for (g, h) in holders.iter().enumerate() {
        run(
            &hook,
            &["createRuntime"],
            &state(&format!("h{g}"), h.id(), &groups[g]),
        );
    }
    let mut in_domain = Vec::new();
    for i in 0..rounds {
        in_domain.push(created(&format!("d{i}"), &groups[i % 4], None));
    }
    println!(
        "  mps acquire, 4 domains running  {:>8.3} ms   ratio to the no-share fast path {:.2}x",
        ms(med(&mut in_domain)),
        med(&mut in_domain).as_secs_f64() / n.as_secs_f64()
    );
    for (g, b) in groups.iter().enumerate() {
        run(&hook, &["poststop"], &state(&format!("h{g}"), 0, b));
    }
    let spread = |i: usize| format!("q{i}");
    let group_of = |i: usize| groups[i % 4].clone();
    let mut cold: Vec<Duration> = (0..BURSTS).map(|_| burst(&spread, &group_of)).collect();
    for (g, h) in holders.iter().enumerate() {
        run(
            &hook,
            &["createRuntime"],
            &state(&format!("h{g}"), h.id(), &groups[g]),
        );
    }
    let mut warm: Vec<Duration> = (0..BURSTS).map(|_| burst(&spread, &group_of)).collect();
    report_bursts("4 domains, cold", &mut cold);
    report_bursts("4 domains, warm", &mut warm);
    for (g, b) in groups.iter().enumerate() {
        run(&hook, &["poststop"], &state(&format!("h{g}"), 0, b));
    }
    for mut h in holders {
        let _ = h.kill();
        let _ = h.wait();
    }

    // Memory caps: createRuntime + poststop rounds per backend, alternating, against the same
    // mode uncapped, under the shipped isolation again (the section above set `group`, under
    // which a container naming no group gets a domain, and a cold daemon, of its own).
    // The driver case puts the container process in a cgroup v2 of its own
    // (`linux.cgroupsPath`), on a private cgroup2 mount. Every case's container is moved into
    // that cgroup before its create, as a runtime moves every container's process into a new
    // cgroup just before createRuntime: the move costs whichever process is spawned next
    // (+0.24 ms, 1.12x, for an uncapped timeslice create in one 41-round run), so moving only the
    // driver cases' containers charged that to the driver backend. Only a cgroupsPath naming it
    // makes it a cgroup of the container's own; the other cases keep their backend.
    std::fs::write(d.join("config.toml"), &base_config).unwrap();
    let cg = cgroup2::Cgroup2::new(&d.join("cg2"), "gpushare-bench");
    let with_ann = |base: &str, edit: &dyn Fn(&mut serde_json::Value)| -> String {
        let mut v: serde_json::Value = serde_json::from_str(base).unwrap();
        edit(&mut v);
        v.to_string()
    };
    let ts = |cap: bool, cgroup: bool| {
        with_ann(&plain_cfg, &|v| {
            v["annotations"]["gpu.share"] = serde_json::json!("timeslice");
            if cap {
                v["annotations"]["gpu.share.memory"] = serde_json::json!("1Gi");
            }
            if cgroup {
                v["linux"]["cgroupsPath"] = serde_json::json!("/gpushare-bench");
            }
        })
    };
    let glibc = |b: &Path| {
        for (host, inside) in [
            ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
            (
                "/lib/x86_64-linux-gnu/libc.so.6",
                "lib/x86_64-linux-gnu/libc.so.6",
            ),
            (
                "/lib/x86_64-linux-gnu/libpthread.so.0",
                "lib/x86_64-linux-gnu/libpthread.so.0",
            ),
            (
                "/lib/x86_64-linux-gnu/libdl.so.2",
                "lib/x86_64-linux-gnu/libdl.so.2",
            ),
        ] {
            let to = b.join("rootfs").join(inside);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(host, to).unwrap();
        }
        b.to_path_buf()
    };
    let cases: Vec<(&str, PathBuf, bool)> = vec![
        (
            "timeslice, uncapped",
            bundle("ts", &ts(false, false)),
            false,
        ),
        (
            "timeslice, 1Gi cap, limiter",
            glibc(&bundle("ts-lim", &ts(true, false))),
            false,
        ),
        (
            "timeslice, 1Gi cap, driver",
            glibc(&bundle("ts-drv", &ts(true, true))),
            true,
        ),
        ("mps warm, uncapped", mps.clone(), false),
        (
            "mps warm, 1Gi cap, limiter",
            glibc(&bundle("mps-lim", &capped_mps_cfg)),
            false,
        ),
        (
            "mps warm, 1Gi cap, driver",
            glibc(&bundle(
                "mps-drv",
                &with_ann(&capped_mps_cfg, &|v| {
                    v["linux"]["cgroupsPath"] = serde_json::json!("/gpushare-bench");
                }),
            )),
            true,
        ),
    ];
    let mut probe = sleeper();
    let have_cgroup = cg.as_ref().is_some_and(|c| c.enter(probe.id()));
    let _ = probe.kill();
    let _ = probe.wait();
    // timeslice and mps cannot share a GPU: the three timeslice cases first, then the three
    // mps ones with a holder keeping the daemon warm.
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    let mut steps: Vec<Vec<Vec<(String, f64)>>> = vec![Vec::new(); cases.len()];
    let mut mps_holder = None;
    for half in [0..3, 3..6] {
        if half.start == 3 {
            let h = sleeper();
            run(&hook, &["createRuntime"], &state("mh", h.id(), &mps));
            mps_holder = Some(h);
        }
        for i in 0..rounds {
            for k in half.clone() {
                let (_, b, driver) = &cases[k];
                if *driver && !have_cgroup {
                    continue;
                }
                let cgroup = cg.as_ref().filter(|_| have_cgroup);
                times[k].push(created(&format!("m{k}-{i}"), b, cgroup));
            }
        }
        // Where the time goes: the hook's own step lines, in runs apart from the timed ones.
        for k in half.clone() {
            let (_, b, driver) = &cases[k];
            if *driver && !have_cgroup {
                continue;
            }
            let cgroup = cg.as_ref().filter(|_| have_cgroup);
            steps[k] = (0..STEP_ROUNDS)
                .map(|i| step_times(&created_with(&format!("s{k}-{i}"), b, cgroup, true).1))
                .collect();
        }
    }
    println!("createRuntime with a memory cap, medians over {rounds} alternating rounds:");
    let base = [med(&mut times[0].clone()), med(&mut times[3].clone())];
    for (k, (label, _, _)) in cases.iter().enumerate() {
        if times[k].is_empty() {
            println!("  {label:<30}  not measured (no cgroup2 mount)");
            continue;
        }
        let m = med(&mut times[k]);
        let against = base[k / 3];
        println!(
            "  {label:<30} {:>8.3} ms   ratio to uncapped {:.2}x{}",
            ms(m),
            m.as_secs_f64() / against.as_secs_f64(),
            if k % 3 == 0 { "" } else { " (target <= 1.3x)" }
        );
    }
    println!(
        "where the time goes (GPUSHARE_LOG=debug step lines of {STEP_ROUNDS} creates per case; medians, ms from the hook's main, +ms from the step before):"
    );
    for (k, (label, _, _)) in cases.iter().enumerate() {
        if !steps[k].is_empty() {
            println!("  {label:<30} {}", step_medians(&steps[k]));
        }
    }
    run(&hook, &["poststop"], &state("mh", 0, &mps));
    if let Some(mut h) = mps_holder {
        let _ = h.kill();
        let _ = h.wait();
    }
    // A create on an idle GPU, as on a node where containers come seconds apart rather than
    // back to back: the GPU's reaper ended with the last release and is started anew, and
    // moving it out of the hook's cgroups waits for the kernel's RCU grace period, which a
    // migration made milliseconds before (as in the rounds above) would have paid.
    // The same for MPS: the domain's daemon stopped with its last client and is started anew.
    let idle_case = |label: &str, bundle: &Path, against: &str, baseline: Duration| {
        let mut idle = Vec::new();
        let mut idle_steps = Vec::new();
        for i in 0..rounds.min(2 * STEP_ROUNDS) {
            std::thread::sleep(Duration::from_millis(50));
            let (took, stderr) = created_with(&format!("idle-{i}"), bundle, None, i % 2 == 1);
            if i % 2 == 1 {
                idle_steps.push(step_times(&stderr));
            } else {
                idle.push(took);
            }
        }
        println!(
            "  {label:<30} {:>8.3} ms   (50 ms after the last release; {against} {:.3} ms)",
            ms(med(&mut idle)),
            ms(baseline)
        );
        println!("  {:<30} {}", "  where it goes", step_medians(&idle_steps));
    };
    idle_case(
        "timeslice, uncapped, idle GPU",
        &cases[0].1,
        "back to back",
        base[0],
    );
    idle_case("mps, uncapped, idle GPU", &mps, "a warm join", a);
    // A timeslice join (another timeslice container already on the GPU: the first client read
    // the compute mode, so a join loads no NVML) against the GPU's first client, alternating: a
    // holder container is started after each first client's round and stopped after each join
    // (untimed, each followed by the reaper's settle).
    let (mut join, mut first) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        first.push(created(&format!("tf-{i}"), &cases[0].1, None));
        let mut th = sleeper();
        run(
            &hook,
            &["createRuntime"],
            &state("th", th.id(), &cases[0].1),
        );
        std::thread::sleep(Duration::from_millis(15));
        join.push(created(&format!("tj-{i}"), &cases[0].1, None));
        let _ = th.kill();
        let _ = th.wait();
        run(&hook, &["poststop"], &state("th", 0, &cases[0].1));
        std::thread::sleep(Duration::from_millis(15));
    }
    let (join, first) = (med(&mut join), med(&mut first));
    println!(
        "  {:<30} {:>8.3} ms   (another timeslice container on the GPU; the GPU's first client {:.3} ms, alternating: {:.2}x)",
        "timeslice, uncapped, a join",
        ms(join),
        ms(first),
        join.as_secs_f64() / first.as_secs_f64()
    );
    drop(cg);
    let _ = holder.kill();
    let _ = holder.wait();
    reapers::remove_gpus_and_wait(&d.join("state"));
    for dir in ["state", "sim"] {
        let _ = Command::new("umount")
            .args(["-l", "-q"])
            .arg(d.join(dir))
            .status();
    }
}

/// Creates per case whose step lines are read.
const STEP_ROUNDS: usize = 21;

/// The `step="…" ms=…` lines of a hook's stderr (`gpushare::logging::step`), in order.
fn step_times(stderr: &str) -> Vec<(String, f64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("step=\"")?;
            let (name, rest) = rest.split_once('"')?;
            let ms = rest.split_once("ms=")?.1.split_whitespace().next()?;
            Some((name.to_owned(), ms.parse().ok()?))
        })
        .collect()
}

/// Each step's median time over runs (those that logged it), in the order of the first run.
fn step_medians(runs: &[Vec<(String, f64)>]) -> String {
    let mut out = Vec::new();
    let mut before = 0.0;
    for (name, _) in runs.first().into_iter().flatten() {
        let mut at: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.iter().find(|(n, _)| n == name).map(|(_, ms)| *ms))
            .collect();
        at.sort_by(f64::total_cmp);
        let m = at[at.len() / 2];
        out.push(format!("{name} {m:.2} (+{:.2})", m - before));
        before = m;
    }
    out.join(", ")
}

/// Bursts of 32 concurrent acquires measured per case (each burst's total is one sample).
const BURSTS: usize = 7;

/// Prints the median total of a case's bursts, with the fastest and slowest.
fn report_bursts(label: &str, totals: &mut [Duration]) {
    totals.sort();
    let m = totals[totals.len() / 2];
    println!(
        "  32 concurrent acquires ({label})  {:>8.3} ms total, {:.3} ms per container (median of {} bursts, {:.1}-{:.1} ms)",
        ms(m),
        ms(m) / 32.0,
        totals.len(),
        ms(totals[0]),
        ms(totals[totals.len() - 1]),
    );
}

/// Runs one `createRuntime` per state at once; the time until all have finished.
fn concurrent_acquires(
    hook: &Path,
    env: &[(&'static str, String); 3],
    states: Vec<String>,
) -> Duration {
    let t = Instant::now();
    let handles: Vec<_> = states
        .into_iter()
        .map(|st| {
            let hook = hook.to_owned();
            let env = env.clone();
            std::thread::spawn(move || {
                let mut c = Command::new(&hook)
                    .arg("createRuntime")
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                c.stdin.take().unwrap().write_all(st.as_bytes()).unwrap();
                assert!(c.wait().unwrap().success());
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    t.elapsed()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
