//! Scale benchmark: the cost of `metrics`, `status` and one `gc` pass on a node with 8
//! simulated GPUs × 32 MPS isolation domains × 256 containers per GPU, as ratios to the same
//! operation on a node with 1 GPU, 1 domain and 1 container measured in the same run; and the
//! acquire p50/p99 with 1, 16, 64 and 256 clients on a GPU, as ratios to 1 client (target: 256
//! clients within 1.5x of 1).
//!
//! In-process (the library's own entry points), on the TEST-ONLY simulated NVML; the state dir
//! on tmpfs when it can be mounted (root), as /run/gpushare is. The MPS control program is left
//! out (`[mps] control` names none), so daemons are neither asked nor started: what is measured
//! is gpushare's own reading, locking and writing of the state.
//! Run: `cargo build --release -p gpushare-simdriver && cargo bench --bench scale`
//! (`BENCH_ROUNDS` sets the acquire rounds, default 200).

#[path = "common/reapers.rs"]
mod reapers;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpushare::config::Config;
use gpushare::decide::plan::{Plan, PlannedGpu};
use gpushare::host::acquire::Host;
use gpushare::host::procinfo::ProcId;
use gpushare::host::state::{Client, Domain, Record, StateDir};
use gpushare::vocab::{Inventory, Limits, Mode};

fn uuid(i: u32) -> String {
    format!("GPU-5a1e0000-0000-4000-8000-{i:012x}")
}

/// Writes `gpus` records of `domains` domains and `per_gpu` MPS clients each (all alive: this
/// process), replacing whatever was there.
fn populate(sd: &StateDir, gpus: u32, domains: usize, per_gpu: usize) {
    let _ = std::fs::remove_dir_all(sd.gpus_dir());
    sd.ensure().unwrap();
    let me = ProcId::of(std::process::id() as i32).unwrap();
    let limits = Limits {
        cores: 50,
        memory_mib: Some(1024),
    };
    for g in 0..gpus {
        let mut rec = Record::new(&uuid(g), g);
        for d in 0..domains {
            rec.domains
                .insert(format!("g-team{d}"), Domain::new(limits));
        }
        for c in 0..per_gpu {
            rec.clients.insert(
                format!("c{g}-{c:04}-{}", "f".repeat(48)),
                Client {
                    mode: Mode::Mps,
                    process: Some(me),
                    cores: 50,
                    memory: Some(1 << 30),
                    domain: Some(format!("g-team{}", c % domains)),
                    kube: gpushare::decide::kube::KubeLabels {
                        namespace: Some("team".into()),
                        pod: Some(format!("pod-{c}")),
                        container: Some("main".into()),
                    },
                    cap: None,
                },
            );
        }
        sd.save(&rec).unwrap();
    }
}

/// A 256 MiB cap (256 of them fit the simulated 80 GiB GPU), so that the records hold caps and
/// admission adds them up as it does on a node with capped shares.
fn bench_cap() -> gpushare::host::state::Cap {
    gpushare::host::state::Cap {
        bytes: 1 << 28,
        enforcement: gpushare::vocab::memcap::Enforcement {
            backend: gpushare::vocab::memcap::Backend::Limiter,
            cgroup: None,
            why: Some("bench".into()),
        },
    }
}

/// Median of `rounds` runs of `f`.
fn median(rounds: usize, mut f: impl FnMut()) -> Duration {
    let mut v: Vec<Duration> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let sim = Path::new(env!("CARGO_BIN_EXE_gpushare-hook"))
        .parent()
        .unwrap()
        .join("libgpushare_simdriver.so");
    assert!(
        sim.exists(),
        "{} missing: cargo build --release -p gpushare-simdriver",
        sim.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("gpushare-scale-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::create_dir_all(d.join("sim")).unwrap();
    let tmpfs = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=0700", "gpushare-scale"])
        .arg(d.join("state"))
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    std::env::set_var("GPUSHARE_SIM_DEVICES", ["81920"; 8].join(","));
    std::env::set_var("GPUSHARE_SIM_STATE", d.join("sim"));
    let cfg = Config::parse(
        &format!(
            "state_dir = {:?}\nlog_file = {:?}\n[nvml]\nlibrary = {:?}\n[mps]\ncontrol = \"/nonexistent/nvidia-cuda-mps-control\"\nisolation = \"group\"\n",
            d.join("state"),
            d.join("log"),
            sim
        ),
        Path::new("bench.toml"),
    )
    .unwrap();
    let sd = StateDir::new(&cfg.state_dir);
    let inv = gpushare::host::inventory::open(&cfg).expect("the simulated NVML");
    let inv: &dyn Inventory = inv.as_ref();
    println!(
        "state dir on {}",
        if tmpfs {
            "tmpfs (as /run/gpushare)"
        } else {
            "the temp dir's file system"
        }
    );

    // metrics / status / gc: small node against the big one.
    let ops: [(&str, &dyn Fn()); 3] = [
        ("metrics", &|| {
            let _ = gpushare::admin::metrics::render(
                &cfg,
                Some(inv),
                gpushare::admin::metrics::Format::Text,
            );
        }),
        ("status", &|| {
            let _ = gpushare::admin::status::status(&cfg, Some(inv));
        }),
        ("gc pass", &|| {
            let _ = gpushare::admin::gc::gc(&cfg, inv);
        }),
    ];
    let few = (rounds / 10).max(5);
    let mut table = BTreeMap::new();
    for (name, op) in &ops {
        populate(&sd, 1, 1, 1);
        let small = median(few, op);
        populate(&sd, 8, 32, 256);
        let big = median(few, op);
        table.insert(*name, (small, big));
    }
    println!(
        "node of 8 GPUs x 32 domains x 256 containers per GPU (2048) against 1 x 1 x 1, medians:"
    );
    for (name, (small, big)) in &table {
        println!(
            "  {name:<8} {:>9.3} ms -> {:>9.3} ms   ratio {:>7.1}x",
            ms(*small),
            ms(*big),
            big.as_secs_f64() / small.as_secs_f64()
        );
    }

    // Acquire with N clients already on the GPU (limit mode: no daemon involved).
    let host = Host::new(&cfg, inv);
    let me = ProcId::of(std::process::id() as i32).unwrap();
    let plan = Plan {
        container: "bench-probe".into(),
        mode: Mode::Limit,
        gpus: vec![PlannedGpu {
            index: 0,
            uuid: uuid(0),
            ordinal: 0,
        }],
        memory: Some(1 << 30),
        cap: Some(1 << 30),
        // No cgroup of its own: the limiter enforces the cap.
        enforcement: gpushare::vocab::memcap::Enforcement {
            backend: gpushare::vocab::memcap::Backend::Limiter,
            cgroup: None,
            why: Some("no cgroup of its own".into()),
        },
        without_limiter: None,
        cores: 100,
        cores_explicit: false,
        timeslice: None,
        domain: None,
        uid: 0,
    };
    // On a node, the hook starts a reaper for the GPU after an acquire, and an acquire then
    // leaves exited clients to it (`StateDir::reaper_alive`): measured with a stand-in reaper
    // (this process's pid and start time in the reaper's lock file), and without one (a reaper
    // that was killed: every client's liveness is checked).
    for reaper in [true, false] {
        let stamp = sd.reaper_lock_path(&uuid(0));
        let _ = std::fs::remove_file(&stamp);
        if reaper {
            std::fs::create_dir_all(stamp.parent().unwrap()).unwrap();
            std::fs::write(&stamp, format!("{} {}\n", me.pid, me.start_time)).unwrap();
        }
        let mut results = Vec::new();
        for n in [1usize, 16, 64, 256] {
            let _ = std::fs::remove_dir_all(sd.gpus_dir());
            sd.ensure().unwrap();
            let mut rec = Record::new(&uuid(0), 0);
            for c in 0..n - 1 {
                // Capped (see `bench_cap`).
                rec.clients.insert(
                    format!("other-{c:04}-{}", "f".repeat(48)),
                    Client {
                        mode: Mode::Limit,
                        process: Some(me),
                        cores: 100,
                        memory: Some(1 << 28),
                        domain: None,
                        kube: Default::default(),
                        cap: Some(bench_cap()),
                    },
                );
            }
            if n > 1 {
                sd.save(&rec).unwrap();
            }
            // Where the time goes: the liveness check of every client (`drop_stale`, one
            // /proc/<pid>/stat read each) and reading and writing the record, in full (status,
            // gc, release) and as an acquire reads it (the header; the lines carried as bytes).
            let alive = median(rounds, || {
                let mut r = rec.clone();
                let _ = r.drop_stale();
            });
            let io = median(rounds, || {
                if let Ok(Some(r)) = sd.load(&uuid(0)) {
                    sd.save(&r).unwrap();
                }
            });
            let lazy = median(rounds, || {
                if let Ok(Some(r)) = sd.load_lazy(&uuid(0)) {
                    sd.save(&r).unwrap();
                }
            });
            let mut times: Vec<Duration> = (0..rounds)
                .map(|_| {
                    let t = Instant::now();
                    host.acquire(&plan, Some(me), None).expect("acquire");
                    let e = t.elapsed();
                    host.release("bench-probe");
                    e
                })
                .collect();
            times.sort();
            let p = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
            results.push((n, p(0.5), p(0.99), alive, io, lazy));
        }
        let (_, base50, base99, _, _, _) = results[0];
        println!(
            "acquire with N clients on the GPU, {} ({rounds} rounds each):",
            if reaper {
                "the GPU's reaper running (as after any acquire on a node)"
            } else {
                "no reaper (killed): every client's liveness checked"
            }
        );
        for (n, p50, p99, alive, io, lazy) in &results {
            println!(
                "  N={n:<4} p50 {:>7.3} ms ({:>5.2}x)   p99 {:>7.3} ms ({:>5.2}x)   liveness of N clients {:>6.3} ms, record load+save {:>6.3} ms (as an acquire: {:>6.3} ms)",
                ms(*p50),
                p50.as_secs_f64() / base50.as_secs_f64(),
                ms(*p99),
                p99.as_secs_f64() / base99.as_secs_f64(),
                ms(*alive),
                ms(*io),
                ms(*lazy)
            );
        }
        let (_, p50, _, _, _, _) = results[3];
        let ratio = p50.as_secs_f64() / base50.as_secs_f64();
        println!(
            "  acquire p50 with 256 clients is {ratio:.2}x that with 1 (target <= 1.5x): {}",
            if ratio <= 1.5 { "met" } else { "NOT met" }
        );
    }
    // The same, end to end: the createRuntime hook process for a timeslice container (no
    // mounts, no daemon), then its poststop, with N-1 timeslice clients already on GPU 0.
    let policy = d.join("bench.toml");
    std::fs::write(
        &policy,
        format!(
            // The shipped policy: the uncapped probe reserves nothing beside the capped clients.
            "state_dir = {:?}\nlog_file = {:?}\n[nvml]\nlibrary = {:?}\n",
            d.join("state"),
            d.join("log"),
            sim
        ),
    )
    .unwrap();
    let bundle = d.join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion":"1.0.2","process":{"args":["sh"],"cwd":"/","env":["GPU_SHARE=timeslice","NVIDIA_VISIBLE_DEVICES=0"]},"root":{"path":"rootfs"}}"#,
    )
    .unwrap();
    let state_json = format!(
        r#"{{"ociVersion":"1.0.2","id":"bench-e2e","status":"creating","pid":{},"bundle":{:?}}}"#,
        me.pid, bundle
    );
    let hook = |stage: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpushare-hook"))
            .arg(stage)
            .env("GPUSHARE_CONFIG", &policy)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state_json.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{stage}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let e2e_rounds = (rounds / 4).max(20);
    // The bench holds GPU 0's reaper lock itself, so the hooks start no real reaper: with its
    // own pid and start time in it, it stands in for a running reaper; with a dead pid in it,
    // for none.
    let stamp = sd.reaper_lock_path(&uuid(0));
    std::fs::create_dir_all(stamp.parent().unwrap()).unwrap();
    let held = nix::fcntl::Flock::lock(
        std::fs::File::create(&stamp).unwrap(),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .map_err(|(_, e)| e)
    .expect("GPU 0's reaper lock");
    for reaper in [true, false] {
        let text = if reaper {
            format!("{} {}\n", me.pid, me.start_time)
        } else {
            "0 0\n".to_owned()
        };
        std::fs::write(&stamp, text).unwrap();
        let mut results = Vec::new();
        for n in [1usize, 16, 64, 256] {
            let _ = std::fs::remove_dir_all(sd.gpus_dir());
            sd.ensure().unwrap();
            let mut rec = Record::new(&uuid(0), 0);
            for c in 0..n - 1 {
                rec.clients.insert(
                    format!("other-{c:04}-{}", "f".repeat(48)),
                    Client {
                        mode: Mode::Timeslice,
                        process: Some(me),
                        cores: 100,
                        memory: Some(1 << 28),
                        domain: None,
                        kube: Default::default(),
                        cap: Some(bench_cap()),
                    },
                );
            }
            if n > 1 {
                sd.save(&rec).unwrap();
            }
            let mut times: Vec<Duration> = (0..e2e_rounds)
                .map(|_| {
                    let t = Instant::now();
                    hook("createRuntime");
                    let e = t.elapsed();
                    hook("poststop");
                    e
                })
                .collect();
            times.sort();
            let p = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
            results.push((n, p(0.5), p(0.99)));
        }
        let (_, base50, base99) = results[0];
        println!(
            "createRuntime hook end to end with N clients on the GPU, {} ({e2e_rounds} rounds each):",
            if reaper { "the GPU's reaper running" } else { "no reaper" }
        );
        for (n, p50, p99) in &results {
            println!(
                "  N={n:<4} p50 {:>7.3} ms ({:>5.2}x)   p99 {:>7.3} ms ({:>5.2}x)",
                ms(*p50),
                p50.as_secs_f64() / base50.as_secs_f64(),
                ms(*p99),
                p99.as_secs_f64() / base99.as_secs_f64(),
            );
        }
        let (_, p50, _) = results[3];
        let ratio = p50.as_secs_f64() / base50.as_secs_f64();
        println!(
            "  hook acquire p50 with 256 clients is {ratio:.2}x that with 1 (target <= 1.5x): {}",
            if ratio <= 1.5 { "met" } else { "NOT met" }
        );
    }
    drop(held);
    reapers::remove_gpus_and_wait(&d.join("state"));
    if tmpfs {
        // Detached if something still holds it, so that no mount is left behind.
        let umount = |lazy: bool| {
            std::process::Command::new("umount")
                .args(lazy.then_some("--lazy"))
                .arg(d.join("state"))
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !umount(false) && !umount(true) {
            eprintln!("could not unmount {}", d.join("state").display());
        }
    }
}
