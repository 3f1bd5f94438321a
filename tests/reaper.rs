//! A share ends when its container's process ends, even when the engine runs poststop only at
//! removal (CRI-O runs `runc delete`, and the poststop hooks, at RemoveContainer): a runc
//! container that has exited but is not deleted is released by the reaper within seconds.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{daemons_under, runc, runc_bundle, Sandbox};
use serde_json::{json, Value};

struct Ctr {
    id: String,
    bundle: PathBuf,
    /// Touching `go/go` here makes the container's process exit.
    go: PathBuf,
}

impl Drop for Ctr {
    fn drop(&mut self) {
        let _ = runc(&["delete", "--force", &self.id], &self.bundle);
    }
}

/// A runc container with gpushare's hooks in its config.json, whose process runs until `go/go`
/// appears.
fn start(sb: &Sandbox, name: &str, annotations: Value) -> Ctr {
    start_with(sb, name, annotations, &[])
}

/// [`start`], with more environment for its hooks (and the reaper they start).
fn start_with(sb: &Sandbox, name: &str, annotations: Value, extra: &[(&str, &str)]) -> Ctr {
    let hook = common::hook_bin().display().to_string();
    let env: Vec<String> = sb
        .env()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain(extra.iter().map(|(k, v)| format!("{k}={v}")))
        .collect();
    let go = sb.path().join(format!("{name}-go"));
    std::fs::create_dir_all(&go).unwrap();
    let bundle = runc_bundle(&sb.path().join(name), |v| {
        v["process"]["args"] = json!(["sh", "-c", "while [ ! -e /go/go ]; do sleep 0.05; done"]);
        v["process"]["env"] = json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]);
        v["annotations"] = annotations;
        v["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/go", "type": "bind", "source": go, "options": ["rbind", "rw"]
        }));
        v["hooks"] = json!({
            "createRuntime": [{"path": hook, "args": ["gpushare-hook", "createRuntime"], "env": env}],
            "poststop": [{"path": hook, "args": ["gpushare-hook", "poststop"], "env": env}],
        });
    });
    let id = format!("gpushare-reaper-{}-{name}", std::process::id());
    let c = Ctr { id, bundle, go };
    for step in ["create", "start"] {
        let out = runc(&[step, &c.id], &c.bundle);
        assert!(
            out.status.success(),
            "runc {step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    c
}

fn runc_status(c: &Ctr) -> String {
    let out = runc(&["state", &c.id], &c.bundle);
    serde_json::from_slice::<Value>(&out.stdout)
        .map(|v| v["status"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

fn clients(st: &Value) -> Vec<String> {
    st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["clients"].as_array().cloned().unwrap_or_default())
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Reapers started for this sandbox (`gpushare-hook --config <sandbox>/config.toml reap …`).
fn reapers(sb: &Sandbox) -> Vec<i32> {
    let cfg = sb.config_path().display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.contains(") Z ") {
            continue;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.contains(&&b"reap"[..]) && args.contains(&cfg.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// Waits for `cond` until `secs` pass; panics with `what` and the last status.
fn wait_for(sb: &Sandbox, secs: u64, what: &str, cond: impl Fn(&Value) -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        let st = sb.status();
        if cond(&st) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{what} not within {secs}s; status: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills the reapers of this sandbox (test clean-up: they were started by the hooks this test
/// ran).
struct KillReapers<'a>(&'a Sandbox);

impl Drop for KillReapers<'_> {
    fn drop(&mut self) {
        for pid in reapers(self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// Whether runc, busybox and NVIDIA's MPS control daemon are here (a loud SKIPPED otherwise).
fn can_run_mps() -> bool {
    common::require(
        "reaper with runc + MPS",
        &["runc", "busybox", "nvidia-cuda-mps-control"],
    )
}

/// Waits until exactly one reaper of this sandbox runs (the GPU's).
fn wait_one_reaper(sb: &Sandbox) {
    let t0 = Instant::now();
    while reapers(sb).len() != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "reapers: {:?}",
            reapers(sb)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_stopped(c: &Ctr) {
    let t0 = Instant::now();
    while runc_status(c) != "stopped" {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "container {} did not stop: {}",
            c.id,
            runc_status(c)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(c: &Ctr) {
    std::fs::write(c.go.join("go"), "").unwrap();
    wait_stopped(c);
}

#[test]
fn an_exited_container_that_is_not_deleted_loses_its_share_and_its_daemon() {
    if !can_run_mps() {
        return;
    }
    let sb = Sandbox::new(1);
    let _k = KillReapers(&sb);
    let a = start(&sb, "mps-a", json!({"gpu.share": "mps"}));
    let b = start(&sb, "mps-b", json!({"gpu.share": "mps"}));

    // Positive control: both listed, the daemon runs, one reaper watches the GPU.
    let st = sb.status();
    assert_eq!(clients(&st), [a.id.clone(), b.id.clone()], "{st}");
    assert_eq!(daemons_under(&sb.state_dir()).len(), 1);
    wait_one_reaper(&sb);

    // a's process ends; runc keeps it (stopped, not deleted: no poststop has run).
    finish(&a);
    let took = wait_for(&sb, 10, "a released", |st| clients(st) == [b.id.clone()]);
    assert_eq!(runc_status(&a), "stopped", "a is not deleted");
    assert_eq!(
        daemons_under(&sb.state_dir()).len(),
        1,
        "the daemon stays for b"
    );
    eprintln!("a released {took:?} after runc saw it stop");

    // b's ends too: the daemon goes; the reaper stays for the GPU's next client.
    let reaper = reapers(&sb);
    finish(&b);
    wait_for(&sb, 10, "b released", |st| clients(st).is_empty());
    let t0 = Instant::now();
    while !daemons_under(&sb.state_dir()).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "daemons {:?} after the last client ended",
            daemons_under(&sb.state_dir()),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Given the time to end, had it not stayed (it ends within milliseconds of its last
    // release step otherwise).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        reapers(&sb),
        reaper,
        "the idle GPU's reaper stays, the same one"
    );
    assert_eq!(runc_status(&b), "stopped", "b is not deleted");
    // The poststop of the later delete finds nothing left to do and does not fail.
    for c in [&a, &b] {
        let out = runc(&["delete", &c.id], &c.bundle);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The processes that loaded NVML, one line each (`GPUSHARE_SIM_INIT_LOG` of the TEST-ONLY
/// simulated driver: pid and command line), and how many of them were reapers.
fn nvml_loads(log: &Path) -> (String, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let by_reapers = text
        .lines()
        .filter(|l| l.split(' ').any(|a| a == "reap"))
        .count();
    (text, by_reapers)
}

/// A reaper loads NVML only for a release step that needs it. Dropping a client of a GPU whose
/// daemon stays needs none (the real library takes about 50 ms to load); the last client's
/// release puts the GPU's compute mode back, and loads it then.
#[test]
fn a_reaper_loads_nvml_only_for_a_release_that_needs_it() {
    if !can_run_mps() {
        return;
    }
    let sb = Sandbox::new(1);
    let _k = KillReapers(&sb);
    let log = sb.path().join("nvml-loads");
    let env = [("GPUSHARE_SIM_INIT_LOG", log.to_str().unwrap())];
    let a = start_with(&sb, "mps-a", json!({"gpu.share": "mps"}), &env);
    let b = start_with(&sb, "mps-b", json!({"gpu.share": "mps"}), &env);
    wait_one_reaper(&sb);
    // Positive control: the log sees loads (the first acquire's, which sets the compute mode).
    let (text, by_reapers) = nvml_loads(&log);
    assert!(text.contains("createRuntime"), "no load logged: {text:?}");
    assert_ne!(
        sb.compute_mode(0),
        0,
        "MPS put the GPU in another compute mode"
    );
    assert_eq!(by_reapers, 0, "a waiting reaper loaded NVML: {text}");

    // a's process ends: the reaper drops it, and the daemon stays for b.
    finish(&a);
    wait_for(&sb, 10, "a released", |st| clients(st) == [b.id.clone()]);
    let (text, by_reapers) = nvml_loads(&log);
    assert_eq!(
        by_reapers, 0,
        "the reaper loaded NVML to drop a client: {text}"
    );

    // b's ends: its release puts the compute mode back, through NVML.
    finish(&b);
    wait_for(&sb, 10, "b released", |st| clients(st).is_empty());
    common::wait_until(10, "the compute mode put back", || sb.compute_mode(0) == 0);
    let (text, by_reapers) = nvml_loads(&log);
    assert_eq!(by_reapers, 1, "the last release's load: {text}");
}

#[test]
fn a_killed_reaper_loses_nothing() {
    if !common::require("reaper with runc", &["runc", "busybox"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let _k = KillReapers(&sb);
    let share = json!({"gpu.share": "timeslice"});
    let a = start(&sb, "killed-a", share.clone());
    let t0 = Instant::now();
    let pid = loop {
        if let [p] = reapers(&sb)[..] {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no reaper started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Killed (it was started by the hook this test ran): a's exit now goes unseen by it.
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    while Path::new(&format!("/proc/{pid}/stat")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "reaper {pid} survived kill -9"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    finish(&a);
    assert_eq!(
        clients(&sb.status()),
        std::slice::from_ref(&a.id),
        "positive control: nobody released a"
    );
    // The next acquire starts a new reaper, which releases a.
    let b = start(&sb, "killed-b", share);
    wait_for(&sb, 10, "a released after the next acquire", |st| {
        clients(st) == [b.id.clone()]
    });
    finish(&b);
    wait_for(&sb, 10, "b released", |st| clients(st).is_empty());
    // And gc, had no acquire come, drops what is left: here nothing.
    let out = sb.hook(&["gc"], "");
    assert!(out.status.success());
}

#[test]
fn a_reaper_whose_directory_is_removed_exits_instead_of_spinning() {
    let sb = Sandbox::new(1);
    let b = sb.bundle(
        "t",
        &common::spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = common::FakeContainer::start();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("t", c.pid(), &b));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Positive control: the acquire started the GPU's reaper, which waits on the live client.
    let t0 = Instant::now();
    while reapers(&sb).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no reaper started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = reapers(&sb)[0];
    // The state dir's gpus/ goes (an uninstall, an admin's rm -rf, a test's temp dir removed
    // while a release recreates the state dir) while the state dir stays. The reaper is
    // stopped meanwhile, so that it cannot recreate a lock file in the directory being removed:
    // it wakes to find the directory gone.
    let signal = |sig: &str| {
        let st = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    std::fs::remove_dir_all(sb.state_dir().join("gpus")).unwrap();
    signal("-CONT");
    let t0 = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the reaper (pid {pid}) is still running 10 s after its directory went"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Process `pid`'s cgroup in the hierarchy whose controller list is `controllers` ("" for v2).
fn cgroup_of(pid: i32, controllers: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, c, path) = (f.next()?, f.next()?, f.next()?);
        (c.split(',').any(|x| x == controllers) || (controllers.is_empty() && c.is_empty()))
            .then(|| path.to_owned())
    })
}

/// A reaper does not stay in the cgroup of the hook that started it (a scope that ends with one
/// container must not take the reaper of a GPU others use): the hook moves it to the root of
/// every hierarchy before it exits, so the scope is empty as soon as the hook is done.
#[test]
fn a_reaper_leaves_the_cgroup_of_the_hook_that_started_it() {
    if !common::require("reaper leaving cgroups", &["sh", "cat"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let _k = KillReapers(&sb);
    let name = format!("gpushare-test-reaper-{}", std::process::id());
    let cg = common::TestCgroup::new(&name);
    let b = sb.bundle(
        "cg",
        &common::spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = common::FakeContainer::start();
    // The hook runs in the test's cgroup, as a runtime's hook runs in the runtime's scope.
    let (out, hook_cgroup) = sb.hook_in_cgroup(
        &cg.dir,
        &["createRuntime"],
        &Sandbox::state_json("cg", c.pid(), &b),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Positive control: the hook (and so the reaper it forked) was in the test's cgroup.
    assert!(
        hook_cgroup.contains(&format!("/{name}\n")),
        "the hook did not run in {name}: {hook_cgroup}"
    );
    // The scope is empty the moment the hook is done (a scope may end then).
    assert_eq!(
        std::fs::read_to_string(cg.dir.join("cgroup.procs")).unwrap(),
        "",
        "a process of gpushare's left in the hook's cgroup"
    );
    let [reaper] = reapers(&sb)[..] else {
        panic!("not one reaper: {:?}", reapers(&sb));
    };
    assert_eq!(cgroup_of(reaper, cg.controllers).as_deref(), Some("/"));
    let out = sb.hook(&["poststop"], &Sandbox::state_json("cg", 0, &b));
    assert!(out.status.success());
}

/// A reaper whose binary was replaced (a package upgrade renames the new one over it) or removed
/// does not stay on an idle GPU: it ends at the next change of the record, or within a few
/// seconds without one, so that the next acquire starts one of the new binary.
#[test]
fn a_reaper_whose_binary_was_replaced_does_not_stay_idle() {
    let sb = Sandbox::new(1);
    let _k = KillReapers(&sb);
    let bin = sb.state_dir().with_file_name("old-gpushare-hook");
    std::fs::copy(common::hook_bin(), &bin).unwrap();
    let uuid = Sandbox::uuid(0);
    let reap = || {
        std::process::Command::new(&bin)
            .args(["--config"])
            .arg(sb.config_path())
            .args(["reap", &uuid])
            .envs(sb.env())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // The record changes under the reaper: what an acquire or a release of another GPU's
    // client does not do, and a release on this one does (here: the record written empty).
    let wake = || {
        let rec = sb.record_path(0);
        std::fs::create_dir_all(rec.parent().unwrap()).unwrap();
        std::fs::write(&rec, b"").unwrap();
        std::fs::remove_file(&rec).unwrap();
    };
    // A state dir as an acquire leaves it, with no client on the GPU.
    std::fs::create_dir_all(sb.record_path(0).parent().unwrap()).unwrap();
    let mut r = reap();
    let ended = |r: &mut std::process::Child, within: Duration| {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if r.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    // Positive control: with its binary in place it stays, through a wake-up.
    std::thread::sleep(Duration::from_millis(300));
    wake();
    assert!(
        !ended(&mut r, Duration::from_millis(500)),
        "it did not stay"
    );
    std::fs::remove_file(&bin).unwrap();
    wake();
    assert!(
        ended(&mut r, Duration::from_secs(10)),
        "it stayed with its binary replaced"
    );
    // Without a wake-up too: an idle reaper looks at its binary every few seconds.
    std::fs::copy(common::hook_bin(), &bin).unwrap();
    let mut r = reap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !ended(&mut r, Duration::from_millis(300)),
        "it did not stay"
    );
    std::fs::remove_file(&bin).unwrap();
    assert!(
        ended(&mut r, Duration::from_secs(10)),
        "it stayed, unwoken, with its binary removed"
    );
}
