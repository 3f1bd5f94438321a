//! One memory cap for the whole container, in every mode, on the TEST-ONLY simulated driver:
//! the limiter's container-wide account across processes in `mps` and `timeslice` mode, the
//! driver backend (NVML's r615 cgroup limits, set on the container's own cgroup v2 and cleared
//! on poststop and by gc), a driver that refuses, a driver without the functions, and admission
//! by the sum of caps.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

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
    let over = run(&mut in_container(
        &sb,
        &probe,
        &simlib,
        &id,
        &["direct", "try", "0", "600"],
        extra_env,
    ));
    assert_eq!(
        value(&over, "RESULT").as_deref(),
        Some("2"),
        "600 MiB more is over the container's cap: {over}"
    );
    let under = run(&mut in_container(
        &sb,
        &probe,
        &simlib,
        &id,
        &["direct", "try", "0", "300"],
        extra_env,
    ));
    assert_eq!(
        value(&under, "RESULT").as_deref(),
        Some("0"),
        "positive control: 300 MiB fits: {under}"
    );
    let info = run(&mut in_container(
        &sb,
        &probe,
        &simlib,
        &id,
        &["direct", "cap", "0", "64"],
        extra_env,
    ));
    assert_eq!(
        value(&info, "MEMINFO_TOTAL"),
        Some((1u64 << 30).to_string()),
        "cuMemGetInfo reports the cap: {info}"
    );
    let nvml = run(&mut in_container(
        &sb,
        &probe,
        &simlib,
        &id,
        &["nvml"],
        extra_env,
    ));
    assert_eq!(
        value(&nvml, "NVML0_TOTAL"),
        Some((1u64 << 30).to_string()),
        "nvidia-smi's NVML reports the cap: {nvml}"
    );
    // status shows the container's use from the limiter's account: the holder's 600 MiB.
    let st = sb.status();
    assert_eq!(client(&st, &id)["cap"]["used"], 600 * MIB, "{st}");
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

/// cgroup v2 mounted privately (this node's /sys/fs/cgroup may be v1), with a child cgroup
/// named after the container; everything moved back and removed on drop.
struct Cgroup2 {
    mnt: PathBuf,
    dir: PathBuf,
}

impl Cgroup2 {
    fn new(sb: &Sandbox, id: &str) -> Option<Self> {
        let mnt = sb.path().join("cg2");
        std::fs::create_dir_all(&mnt).unwrap();
        let st = Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(&mnt)
            .status()
            .ok()?;
        if !st.success() {
            return None;
        }
        let dir = mnt.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        Some(Cgroup2 { mnt, dir })
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .expect("move into the cgroup");
    }
}

impl Drop for Cgroup2 {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write(self.mnt.join("cgroup.procs"), p);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
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
    let Some(cg) = Cgroup2::new(&sb, id) else {
        common::require(
            "memory caps (mount -t cgroup2)",
            &["/nonexistent/cgroup2-mount"],
        );
        return;
    };
    let b = sb.bundle(
        id,
        &spec(
            json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    cg.enter(c.pid());
    let ns = cg.dir.display().to_string();
    // --dry-run says which backend, on which cgroup.
    let dry = sb.hook(
        &["createRuntime", "--dry-run"],
        &Sandbox::state_json(id, c.pid(), &b),
    );
    ok(&dry);
    let plan: Value = serde_json::from_slice(&dry.stdout).expect("plan JSON");
    assert_eq!(plan["enforcement"]["backend"], "driver", "{plan}");
    assert_eq!(plan["enforcement"]["cgroup"], ns.as_str(), "{plan}");

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
    let bare = |mib: &str| {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} direct try 0 {mib}",
                cg.dir.display(),
                probe.display()
            ))
            .env_clear()
            .envs(sb.env())
            .env("LD_LIBRARY_PATH", &simlib);
        run(&mut cmd)
    };
    assert_eq!(
        value(&bare("1500"), "RESULT").as_deref(),
        Some("2"),
        "over the driver's cap"
    );
    assert_eq!(
        value(&bare("500"), "RESULT").as_deref(),
        Some("0"),
        "positive control: under it"
    );

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
fn gc_clears_the_driver_limit_of_a_container_that_is_gone() {
    let sb = sandbox("");
    let id = "drv-gone";
    let Some(cg) = Cgroup2::new(&sb, id) else {
        common::require(
            "memory caps (mount -t cgroup2)",
            &["/nonexistent/cgroup2-mount"],
        );
        return;
    };
    if !limiter().exists() {
        panic!("{} missing: cargo build --workspace", limiter().display());
    }
    let b = sb.bundle(
        id,
        &spec(
            json!({"gpu.share": "limit", "gpu.share.memory": "2Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    cg.enter(c.pid());
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json(id, c.pid(), &b)));
    assert_eq!(driver_log(&sb).len(), 1);
    drop(c); // killed: no poststop
    let out = sb.hook(&["gc"], "");
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("cleared the driver's memory limit of {id}")),
        "{text}"
    );
    let sets = driver_log(&sb);
    assert_eq!(sets.len(), 2, "{sets:?}");
    assert_eq!(sets[1]["hard"].as_u64(), Some(u64::MAX));
}

#[test]
fn a_driver_that_refuses_the_limit_refuses_the_container_and_changes_nothing() {
    let sb = sandbox("");
    let id = "drv-refused";
    let Some(cg) = Cgroup2::new(&sb, id) else {
        common::require(
            "memory caps (mount -t cgroup2)",
            &["/nonexistent/cgroup2-mount"],
        );
        return;
    };
    let b = sb.bundle(
        id,
        &spec(
            json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    cg.enter(c.pid());
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
    let Some(cg) = Cgroup2::new(&sb, id) else {
        common::require(
            "memory caps (mount -t cgroup2)",
            &["/nonexistent/cgroup2-mount"],
        );
        return;
    };
    let b = sb.bundle(
        id,
        &spec(
            json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    cg.enter(c.pid());
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

#[test]
fn admission_counts_caps_and_uncapped_shares_and_names_the_holders() {
    let sb = sandbox("[policy]\nmemory_overcommit = 1.0\n");
    let specs = [
        (
            "a",
            json!({"gpu.share": "timeslice", "gpu.share.memory": "48Gi"}),
        ),
        (
            "b",
            json!({"gpu.share": "timeslice", "gpu.share.memory": "32Gi"}),
        ),
        (
            "c",
            json!({"gpu.share": "timeslice", "gpu.share.memory": "1Gi"}),
        ),
        ("d", json!({"gpu.share": "timeslice"})),
    ];
    let procs: Vec<FakeContainer> = specs.iter().map(|_| FakeContainer::start()).collect();
    let mut outs = Vec::new();
    for ((id, ann), c) in specs.iter().zip(&procs) {
        let b = sb.bundle(id, &spec(ann.clone(), &["NVIDIA_VISIBLE_DEVICES=0"]));
        outs.push(sb.hook(&["createRuntime"], &Sandbox::state_json(id, c.pid(), &b)));
    }
    ok(&outs[0]);
    ok(&outs[1]);
    for (i, out) in outs.iter().enumerate().skip(2) {
        assert_eq!(out.status.code(), Some(1), "{}", specs[i].0);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("GPU 0 (")
                && err.contains("81920Mi")
                && err.contains("a 49152Mi, b 32768Mi"),
            "{err}"
        );
    }
    let st = sb.status();
    let ids: Vec<&str> = st["gpus"][0]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
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
