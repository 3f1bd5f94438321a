//! One memory cap for the whole container, in every mode, on the TEST-ONLY simulated driver:
//! the limiter's container-wide account across processes in `mps` and `timeslice` mode, the
//! driver backend (NVML's r615 cgroup limits, set on the container's own cgroup v2 and cleared
//! on poststop and by gc), a driver that refuses, a driver without the functions, and admission
//! by the sum of caps.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::cgroup2::Cgroup2;
use common::{spec, FakeContainer, Sandbox};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn limiter() -> PathBuf {
    common::simdriver().with_file_name("libgpushare_limiter.so")
}

fn sandbox(extra: &str) -> Sandbox {
    Sandbox::with_policy(1, &format!("[limit]\nlibrary = {:?}\n{extra}", limiter()))
}

/// The probe and the simulated libcuda, or a loud skip.
fn probe(sb: &Sandbox) -> Option<(PathBuf, PathBuf)> {
    if !common::require("memory caps (cuprobe)", &["cc", "unshare"]) {
        return None;
    }
    if !Path::new("/usr/include/cuda.h").exists() {
        common::require("memory caps (cuda.h)", &["/usr/include/cuda.h"]);
        return None;
    }
    common::build_probe(sb.path())
}

/// A process of container `id` as the hook set it up: the limiter preloaded with the limits
/// file's env and the container's accounting file (their host paths), `extra` env on top.
fn in_container(
    sb: &Sandbox,
    probe: &Path,
    simlib: &Path,
    id: &str,
    args: &[&str],
    extra: &[(&str, String)],
) -> Command {
    let cdir = sb.state_dir().join("containers").join(id);
    let limits = std::fs::read_to_string(cdir.join("limits")).expect("the limits file");
    let mut cmd = Command::new(probe);
    cmd.args(args)
        .env_clear()
        .envs(sb.env())
        .env("LD_LIBRARY_PATH", simlib)
        .env("LD_PRELOAD", limiter())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in limits.lines().filter_map(|l| l.split_once('=')) {
        cmd.env(k, v);
    }
    cmd.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", cdir.join("shared/cache"));
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

fn value(out: &str, key: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("probe");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A probe holding `mib` until dropped.
struct Holder(Child);

impl Holder {
    fn start(mut cmd: Command) -> Self {
        use std::io::BufRead;
        let mut child = cmd.spawn().expect("holder");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "HELD=1", "the holder allocated");
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client<'a>(status: &'a Value, id: &str) -> &'a Value {
    status["gpus"][0]["clients"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("{id} not in status: {status}"))
}

/// The cap holds for the container's processes together: one holds 600 MiB of a 1 GiB cap,
/// another is refused 600 MiB and given 300 MiB; both see the cap as the GPU's size.
fn cap_holds_across_processes(mode: &str, extra_env: &[(&str, String)]) {
    let sb = sandbox("");
    let Some((probe, simlib)) = probe(&sb) else {
        return;
    };
    let id = format!("{mode}-capped");
    let b = sb.bundle(
        &id,
        &spec(
            json!({"gpu.share": mode, "gpu.share.memory": "1Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json(&id, c.pid(), &b)));
    let st = sb.status();
    let cap = &client(&st, &id)["cap"];
    assert_eq!(cap["bytes"], 1u64 << 30, "{st}");
    // This node has no r615 driver limits for a cgroup of the container's own.
    assert_eq!(cap["backend"], "limiter", "{st}");
    assert!(cap["why"].as_str().is_some_and(|w| !w.is_empty()), "{st}");
    let limits =
        std::fs::read_to_string(sb.state_dir().join(format!("containers/{id}/limits"))).unwrap();
    assert!(
        limits.contains("CUDA_DEVICE_MEMORY_LIMIT_0=1073741824"),
        "{limits}"
    );
    assert!(
        !limits.contains("CUDA_DEVICE_SM_LIMIT"),
        "no SM limit outside limit mode: {limits}"
    );

    let hold = in_container(
        &sb,
        &probe,
        &simlib,
        &id,
        &["direct", "hold", "0", "600"],
        extra_env,
    );
    let _h = Holder::start(hold);
    // status shows the container's use from the limiter's account: the holder's 600 MiB
    // (read before other processes come and go: the limiter reclaims an exited process's
    // share of the account lazily).
    let st = sb.status();
    assert_eq!(client(&st, &id)["cap"]["used"], 600 * MIB, "{st}");
    let probe_run = |args: &[&str], env: &[(&str, String)]| {
        run(&mut in_container(&sb, &probe, &simlib, &id, args, env))
    };
    let over = probe_run(&["direct", "try", "0", "600"], extra_env);
    assert_eq!(
        value(&over, "RESULT").as_deref(),
        Some("2"),
        "600 MiB more is over the container's cap: {over}"
    );
    let under = probe_run(&["direct", "try", "0", "300"], extra_env);
    assert_eq!(
        value(&under, "RESULT").as_deref(),
        Some("0"),
        "positive control: 300 MiB fits: {under}"
    );
    let info = probe_run(&["direct", "cap", "0", "64"], extra_env);
    assert_eq!(
        value(&info, "MEMINFO_TOTAL"),
        Some((1u64 << 30).to_string()),
        "cuMemGetInfo reports the cap: {info}"
    );
    let nvml = probe_run(&["nvml"], extra_env);
    assert_eq!(
        value(&nvml, "NVML0_TOTAL"),
        Some((1u64 << 30).to_string()),
        "nvidia-smi's NVML reports the cap: {nvml}"
    );
    if mode == "mps" {
        // Beneath the cap, MPS's own per-process limit: a process whose client limit is 300 MiB
        // gets no more, though the container still has 424 MiB left under its cap.
        let mut own = extra_env.to_vec();
        own.retain(|(k, _)| *k != "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
        own.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=300M".into()));
        let r = probe_run(&["direct", "try", "0", "350"], &own);
        assert_eq!(
            value(&r, "RESULT").as_deref(),
            Some("2"),
            "above the process's own MPS limit: {r}"
        );
        let r = probe_run(&["direct", "try", "0", "250"], &own);
        assert_eq!(
            value(&r, "RESULT").as_deref(),
            Some("0"),
            "positive control: within both: {r}"
        );
    }
    ok(&sb.hook(&["poststop"], &Sandbox::state_json(&id, c.pid(), &b)));
}

#[test]
fn mps_cap_holds_for_the_whole_container_through_the_limiter() {
    if !common::require("mps cap", &["nvidia-cuda-mps-control"]) {
        return;
    }
    // The MPS client env the spec edit gives (the pinned limit per process stays beneath).
    cap_holds_across_processes(
        "mps",
        &[
            ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps".into()),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1024M".into()),
        ],
    );
}

#[test]
fn timeslice_takes_a_memory_cap_for_the_whole_container() {
    cap_holds_across_processes("timeslice", &[]);
}

/// A container of the driver tests: a bundle asking for `ann`, a stand-in process in a cgroup
/// v2 of its own named after `id`; `None` (said loudly) where cgroup2 cannot be mounted.
fn in_own_cgroup(sb: &Sandbox, id: &str, ann: Value) -> Option<(Cgroup2, PathBuf, FakeContainer)> {
    let Some(cg) = Cgroup2::new(&sb.path().join("cg2"), id) else {
        common::require(
            "memory caps (mount -t cgroup2)",
            &["/nonexistent/cgroup2-mount"],
        );
        return None;
    };
    let b = sb.bundle(id, &spec(ann, &["NVIDIA_VISIBLE_DEVICES=0"]));
    let c = FakeContainer::start();
    assert!(
        cg.enter(c.pid()),
        "move the container process into its cgroup"
    );
    Some((cg, b, c))
}

fn driver_log(sb: &Sandbox) -> Vec<Value> {
    std::fs::read_to_string(sb.sim_state().join("nvml-memory-limits.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .filter(|v: &Value| v["call"] == "set")
        .collect()
}

#[test]
fn the_driver_backend_caps_the_containers_cgroup_even_without_the_preload() {
    let sb = sandbox("");
    let Some((probe, simlib)) = probe(&sb) else {
        return;
    };
    let id = "drv-1";
    let Some((cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    // --dry-run says which backend, on which cgroup.
    let dry = sb.hook(
        &["createRuntime", "--dry-run"],
        &Sandbox::state_json(id, c.pid(), &b),
    );
    ok(&dry);
    let plan: Value = serde_json::from_slice(&dry.stdout).expect("plan JSON");
    assert_eq!(plan["enforcement"]["backend"], "driver", "{plan}");
    assert!(
        plan["enforcement"]["cgroup"]
            .as_str()
            .is_some_and(|p| cg.is(p)),
        "{plan}"
    );
    let ns = plan["enforcement"]["cgroup"].as_str().unwrap().to_owned();

    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json(id, c.pid(), &b)));
    let sets = driver_log(&sb);
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!(sets[0]["namespace"], ns.as_str());
    assert_eq!(
        (sets[0]["soft"].as_u64(), sets[0]["hard"].as_u64()),
        (Some(0), Some(1 << 30))
    );
    assert_eq!(sets[0]["result"], 0);
    let st = sb.status();
    let cap = &client(&st, id)["cap"];
    assert_eq!(
        (cap["backend"].as_str(), cap["cgroup"].as_str()),
        (Some("driver"), Some(ns.as_str())),
        "{st}"
    );

    // A root tenant that drops the preload: a process in the container's cgroup with no
    // limiter at all is still held to the cap by the (simulated) driver.
    let bare = |args: &str| {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} direct {args}",
                cg.dir.display(),
                probe.display()
            ))
            .env_clear()
            .envs(sb.env())
            .env("LD_LIBRARY_PATH", &simlib)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        cmd
    };
    assert_eq!(
        value(&run(&mut bare("try 0 1500")), "RESULT").as_deref(),
        Some("2"),
        "over the driver's cap"
    );
    assert_eq!(
        value(&run(&mut bare("try 0 500")), "RESULT").as_deref(),
        Some("0"),
        "positive control: under it"
    );
    // status and metrics read the container's use from the driver (NVML's currentUsed of its
    // cgroup): a process holding 300 MiB there, no limiter account at all.
    let holder = Holder::start(bare("hold 0 300"));
    let st = sb.status();
    assert_eq!(client(&st, id)["cap"]["used"], 300 * MIB, "{st}");
    let m = sb.hook(&["metrics"], "");
    ok(&m);
    let text = String::from_utf8_lossy(&m.stdout);
    let used: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.starts_with("gpushare_container_device_memory_used_bytes{")
                && l.contains(&format!("id=\"{id}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    #[allow(clippy::cast_precision_loss)]
    let want = (300 * MIB) as f64;
    assert_eq!(used, [want], "{text}");
    drop(holder);

    ok(&sb.hook(&["poststop"], &Sandbox::state_json(id, c.pid(), &b)));
    let sets = driver_log(&sb);
    assert_eq!(sets.len(), 2, "{sets:?}");
    assert_eq!(sets[1]["namespace"], ns.as_str());
    assert_eq!(
        (sets[1]["soft"].as_u64(), sets[1]["hard"].as_u64()),
        (Some(0), Some(u64::MAX)),
        "cleared"
    );
}

#[test]
fn a_gone_container_has_its_driver_limit_cleared_once_by_the_reaper_or_gc() {
    let sb = sandbox("");
    let id = "drv-gone";
    let Some((_cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "limit", "gpu.share.memory": "2Gi"}),
    ) else {
        return;
    };
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json(id, c.pid(), &b)));
    assert_eq!(driver_log(&sb).len(), 1);
    // Killed: no poststop. The GPU's reaper releases a client as its process exits; gc does
    // what is left. Either way the limit is cleared once, and gc then finds nothing more.
    drop(c);
    let out = sb.hook(&["gc"], "");
    ok(&out);
    let cleared = || {
        driver_log(&sb)
            .iter()
            .filter(|v| v["hard"].as_u64() == Some(u64::MAX))
            .count()
    };
    for _ in 0..200 {
        if cleared() > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert_eq!(cleared(), 1, "{:?}", driver_log(&sb));
    let again = sb.hook(&["gc"], "");
    ok(&again);
    assert_eq!(cleared(), 1, "a second gc clears nothing more");
    assert!(sb.status()["gpus"]
        .as_array()
        .is_none_or(|g| g.is_empty() || g[0]["clients"].as_array().is_none_or(|c| c.is_empty())));
}

#[test]
fn a_driver_that_refuses_the_limit_refuses_the_container_and_changes_nothing() {
    let sb = sandbox("");
    let id = "drv-refused";
    let Some((_cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    let before = sb.snapshot();
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json(id, c.pid(), &b),
        &[("GPUSHARE_SIM_FAIL", "nvmlDeviceSetMemoryLimits_v1=999")],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("would run uncapped"), "{err}");
    // Positive control: the driver was asked, and said no.
    let sets = driver_log(&sb);
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!(sets[0]["result"], 999);
    assert_eq!(sb.snapshot(), before, "state as it was");
}

#[test]
fn a_driver_without_cgroup_limits_leaves_the_cap_to_the_limiter_and_says_why() {
    let sb = sandbox("");
    let id = "old-driver";
    let Some((_cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    let old = [("GPUSHARE_SIM_MEMORY_LIMITS", "0")];
    let dry = sb.hook_env(
        &["createRuntime", "--dry-run"],
        &Sandbox::state_json(id, c.pid(), &b),
        &old,
    );
    ok(&dry);
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(plan["enforcement"]["backend"], "limiter", "{plan}");
    assert!(
        plan["enforcement"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("does not take limits")),
        "{plan}"
    );
    assert!(
        driver_log(&sb).is_empty(),
        "no set on a driver without the functions"
    );
}

/// Runs createRuntime for each (id, annotations) on GPU 0, each with a live process of its own.
fn create_all(sb: &Sandbox, specs: &[(&str, Value)]) -> (Vec<FakeContainer>, Vec<Output>) {
    let procs: Vec<FakeContainer> = specs.iter().map(|_| FakeContainer::start()).collect();
    let mut outs = Vec::new();
    for ((id, ann), c) in specs.iter().zip(&procs) {
        let b = sb.bundle(id, &spec(ann.clone(), &["NVIDIA_VISIBLE_DEVICES=0"]));
        outs.push(sb.hook(&["createRuntime"], &Sandbox::state_json(id, c.pid(), &b)));
    }
    (procs, outs)
}

fn client_ids(st: &Value) -> Vec<String> {
    st["gpus"][0]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_shipped_policy_lets_uncapped_shares_share_a_gpu_and_admits_caps_against_its_memory() {
    // No policy key of this feature is set: the shipped default.
    let sb = sandbox("");
    let specs: Vec<(&str, Value)> = vec![
        ("u0", json!({"gpu.share": "mps"})),
        ("u1", json!({"gpu.share": "mps"})),
        ("u2", json!({"gpu.share": "mps"})),
        ("a", json!({"gpu.share": "mps", "gpu.share.memory": "48Gi"})),
        ("b", json!({"gpu.share": "mps", "gpu.share.memory": "32Gi"})),
        ("c", json!({"gpu.share": "mps", "gpu.share.memory": "1Gi"})),
        ("u9", json!({"gpu.share": "mps"})),
    ];
    let (_procs, outs) = create_all(&sb, &specs);
    for (i, out) in outs.iter().enumerate() {
        if specs[i].0 == "c" {
            continue;
        }
        ok(out);
    }
    let c = &outs[specs.iter().position(|(i, _)| *i == "c").unwrap()];
    assert_eq!(c.status.code(), Some(1));
    let err = String::from_utf8_lossy(&c.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for want in [
        "GPU 0 (",
        "80.0 GiB",
        "a 48.0 GiB, b 32.0 GiB",
        "u0 uncapped (reserves nothing)",
        "memory_overcommit = 1, uncapped = \"share\"",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    let st = sb.status();
    assert_eq!(client_ids(&st), ["a", "b", "u0", "u1", "u2", "u9"], "{st}");
    let m = &st["gpus"][0]["memory"];
    assert_eq!(
        (
            m["committed"].as_u64(),
            m["allowed"].as_u64(),
            m["total"].as_u64()
        ),
        (Some(80 << 30), Some(80 << 30), Some(80 << 30)),
        "uncapped shares reserve nothing: {st}"
    );
    let human = sb.hook(&["status"], "");
    ok(&human);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("client u9")
            && text.contains("uncapped: reserves no GPU memory, no guarantee"),
        "{text}"
    );
    let metrics = sb.hook(&["metrics"], "");
    ok(&metrics);
    let m = String::from_utf8_lossy(&metrics.stdout);
    let info = |id: &str| {
        m.lines()
            .find(|l| {
                l.starts_with("gpushare_container_info{") && l.contains(&format!("id=\"{id}\""))
            })
            .unwrap_or_else(|| panic!("no info line for {id}: {m}"))
            .to_owned()
    };
    assert!(info("u9").contains("memory=\"uncapped\""), "{}", info("u9"));
    assert!(info("a").contains("memory=\"capped\""), "{}", info("a"));
    let doctor = sb.hook(&["doctor", "--json"], "");
    let d = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        d.contains("an uncapped share reserves nothing (uncapped: no guarantee"),
        "doctor says what an uncapped share gets: {d}"
    );
}

#[test]
fn whole_gpu_refuses_an_uncapped_share_naming_the_key_and_the_holders() {
    let sb = sandbox("[policy]\nuncapped = \"whole-gpu\"\n");
    let specs = [
        (
            "a",
            json!({"gpu.share": "timeslice", "gpu.share.memory": "8Gi"}),
        ),
        ("d", json!({"gpu.share": "timeslice"})),
    ];
    let (_procs, outs) = create_all(&sb, &specs);
    ok(&outs[0]);
    assert_eq!(outs[1].status.code(), Some(1));
    let err = String::from_utf8_lossy(&outs[1].stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for want in [
        "uncapped = \"whole-gpu\"",
        "a 8.0 GiB",
        "uncapped = \"share\"",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert!(
        !err.contains("Ask for"),
        "asked for nothing, told to ask for less: {err}"
    );
    assert_eq!(client_ids(&sb.status()), ["a"]);
}

#[test]
fn uncapped_refuse_turns_away_a_share_without_a_cap() {
    let sb = sandbox("[policy]\nuncapped = \"refuse\"\n");
    let b = sb.bundle(
        "u",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let c = FakeContainer::start();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("u", c.pid(), &b));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uncapped = \"refuse\""), "{err}");
    // Positive control: a bad value of the key is refused by the policy check, naming it.
    let bad = sandbox("[policy]\nmemory_overcommit = 0.0\n");
    let out = bad.hook(&["createRuntime"], &Sandbox::state_json("u", c.pid(), &b));
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory_overcommit"));
}

#[test]
fn a_hook_killed_after_setting_the_driver_limit_leaves_no_client_and_a_retry_works() {
    let sb = sandbox("");
    let id = "drv-killed";
    let Some((_cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    let state = Sandbox::state_json(id, c.pid(), &b);
    let out = sb.hook_env(
        &["createRuntime"],
        &state,
        &[("GPUSHARE_FAILPOINT", "acquire-driver-limit-set")],
    );
    common::assert_killed_at(&out, "acquire-driver-limit-set");
    // The limit was set (the failpoint comes after it) but no client was recorded: the
    // container never started, and its limit goes with its cgroup.
    assert_eq!(driver_log(&sb).len(), 1);
    let st = sb.status();
    assert!(
        st["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["clients"].as_array().unwrap().is_empty()),
        "{st}"
    );
    // The runtime's retry sets it again and records the client.
    ok(&sb.hook(&["createRuntime"], &state));
    assert_eq!(driver_log(&sb).len(), 2);
    assert_eq!(client(&sb.status(), id)["cap"]["backend"], "driver");
    ok(&sb.hook(&["poststop"], &state));
}

/// An image without a C library: its files are only what the test puts there.
fn strip_libc(bundle: &Path) {
    let root = bundle.join("rootfs");
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
}

#[test]
fn a_cap_in_an_image_without_glibc_is_served_where_the_driver_enforces_it() {
    let sb = sandbox("");
    let id = "nolibc-drv";
    let Some((_cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    strip_libc(&b);
    let state = Sandbox::state_json(id, c.pid(), &b);
    let dry = sb.hook(&["createRuntime", "--dry-run"], &state);
    ok(&dry);
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(plan["enforcement"]["backend"], "driver", "{plan}");
    assert!(
        plan["without_limiter"]
            .as_str()
            .is_some_and(|w| w.contains("no C library")),
        "{plan}"
    );
    ok(&sb.hook(&["createRuntime"], &state));
    // Positive control: the driver was asked for the cap, and the record says it enforces it.
    let sets = driver_log(&sb);
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!(sets[0]["hard"].as_u64(), Some(1 << 30));
    let st = sb.status();
    assert_eq!(client(&st, id)["cap"]["backend"], "driver", "{st}");
    assert!(
        !sb.state_dir().join("containers").join(id).exists(),
        "no limiter files for an image that cannot load it"
    );
    ok(&sb.hook(&["poststop"], &state));
}

#[test]
fn a_cap_in_an_image_without_glibc_is_refused_where_only_the_limiter_could_enforce_it() {
    let sb = sandbox("");
    let id = "nolibc-lim";
    let Some((_cg, b, c)) = in_own_cgroup(
        &sb,
        id,
        json!({"gpu.share": "mps", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    strip_libc(&b);
    let old = [("GPUSHARE_SIM_MEMORY_LIMITS", "0")];
    let state = Sandbox::state_json(id, c.pid(), &b);
    let before = sb.snapshot();
    let out = sb.hook_env(&["createRuntime"], &state, &old);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for want in [
        "no C library",
        "the driver cannot enforce the cap",
        "does not take limits",
        "glibc 2.17 or newer",
        "without gpu.share.memory",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert_eq!(
        sb.snapshot(),
        before,
        "a refusal leaves the state as it was"
    );
    // What it suggests is served: the same container without the cap.
    let b2 = sb.bundle(
        "nolibc-lim2",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    strip_libc(&b2);
    let c2 = FakeContainer::start();
    ok(&sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("nolibc-lim2", c2.pid(), &b2),
        &old,
    ));
}

/// A container whose `linux.cgroupsPath` names another container's cgroup (the runtime puts
/// it there, so the cgroup passes as its own) is refused: the other's driver limit is neither
/// replaced nor, at its release, cleared. And `status` never reports a driver cap the driver
/// does not hold.
#[test]
fn a_cgroup_another_container_holds_is_refused_and_status_tells_the_truth() {
    let sb = sandbox("");
    let victim = "drv-victim";
    let Some((cg, vb, vc)) = in_own_cgroup(
        &sb,
        victim,
        json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
    ) else {
        return;
    };
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json(victim, vc.pid(), &vb),
    ));
    assert_eq!(
        driver_log(&sb).len(),
        1,
        "positive control: the victim's cap is set"
    );
    // The attacker names the victim's cgroup, and its process is in it.
    let evil = "drv-evil";
    let mut spec = spec(
        json!({"gpu.share": "timeslice", "gpu.share.memory": "2Gi"}),
        &["NVIDIA_VISIBLE_DEVICES=0"],
    );
    spec["linux"]["cgroupsPath"] = json!(format!("/{victim}"));
    let eb = sb.bundle(evil, &spec);
    let ec = FakeContainer::start();
    assert!(
        cg.enter(ec.pid()),
        "the attacker's process is in the victim's cgroup"
    );
    let dry = sb.hook(
        &["createRuntime", "--dry-run"],
        &Sandbox::state_json(evil, ec.pid(), &eb),
    );
    ok(&dry);
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert!(
        plan["enforcement"]["cgroup"]
            .as_str()
            .is_some_and(|p| cg.is(p)),
        "positive control: the attacker's cgroup passes as its own: {plan}"
    );
    let out = sb.hook(
        &["createRuntime"],
        &Sandbox::state_json(evil, ec.pid(), &eb),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("container {victim}")), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let sets = driver_log(&sb);
    assert_eq!(
        sets.len(),
        1,
        "the victim's limit was not touched: {sets:?}"
    );
    let st = sb.status();
    let cap = &client(&st, victim)["cap"];
    assert_eq!(cap["backend"], "driver", "{st}");
    assert!(cap.get("not_enforced").is_none(), "{st}");
    // The driver no longer holds the victim's limit (its cgroup's limits went): status says so.
    for e in std::fs::read_dir(sb.sim_state().join("memlimits.0")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let st = sb.status();
    let why = client(&st, victim)["cap"]["not_enforced"]
        .as_str()
        .unwrap_or_else(|| panic!("status claims a cap the driver does not hold: {st}"))
        .to_owned();
    assert!(why.contains("is none, not the cap"), "{why}");
    ok(&sb.hook(&["poststop"], &Sandbox::state_json(victim, vc.pid(), &vb)));
}
