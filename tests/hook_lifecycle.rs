//! The hook's acquire/release lifecycle against the real `nvidia-cuda-mps-control` and the
//! TEST-ONLY simulated NVML: reference counting, compatibility, idempotency, stale clients,
//! dead and unrecorded daemons.

mod common;

use common::{daemons_under, spec, FakeContainer, Sandbox};
use serde_json::json;

fn mps_spec() -> serde_json::Value {
    spec(
        json!({"gpu.share": "mps", "gpu.share.cores": "40", "gpu.share.memory": "2Gi"}),
        &["NVIDIA_VISIBLE_DEVICES=0"],
    )
}

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn clients(st: &serde_json::Value, gpu: usize) -> Vec<String> {
    st["gpus"][gpu]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn two_mps_containers_share_one_daemon() {
    if !common::require("mps lifecycle", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &mps_spec());
    let (a, c) = (FakeContainer::start(), FakeContainer::start());

    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &b)));
    assert_eq!(
        sb.compute_mode(0),
        3,
        "EXCLUSIVE_PROCESS while the daemon runs"
    );
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cb", c.pid(), &b)));

    let st = sb.status();
    assert_eq!(st["gpus"].as_array().unwrap().len(), 1);
    assert_eq!(clients(&st, 0), vec!["ca", "cb"]);
    assert_eq!(st["gpus"][0]["domains"][0]["daemon"]["answers"], true);
    assert_eq!(st["gpus"][0]["clients"][0]["cores"], 40);
    assert_eq!(
        daemons_under(&sb.state_dir()).len(),
        1,
        "exactly one daemon"
    );
    let mps_dir = sb.domain_dir(0, "gpu");
    assert!(mps_dir.join("pipe/control").exists());
    assert!(
        common::mounts_under(&mps_dir)
            .iter()
            .any(|m| m.ends_with("/shm")),
        "shm tmpfs mounted"
    );

    // The first leaves: the daemon stays and still answers.
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &b)));
    let st = sb.status();
    assert_eq!(clients(&st, 0), vec!["cb"]);
    assert_eq!(st["gpus"][0]["domains"][0]["daemon"]["answers"], true);

    // The last leaves: daemon, directories and mounts are gone, compute mode restored.
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cb", 0, &b)));
    let st = sb.status();
    assert!(st["gpus"].as_array().unwrap().is_empty(), "{st}");
    assert!(daemons_under(&sb.state_dir()).is_empty());
    assert!(!mps_dir.exists(), "daemon directory removed");
    assert!(common::mounts_under(&sb.state_dir()).is_empty());
    assert_eq!(sb.compute_mode(0), 0, "DEFAULT after the daemon stops");
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    assert!(log.contains("acquired container=ca mode=mps"), "{log}");
}

#[test]
fn acquire_and_release_are_idempotent() {
    if !common::require("mps idempotency", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &mps_spec());
    let a = FakeContainer::start();
    let state = Sandbox::state_json("ca", a.pid(), &b);
    ok(&sb.hook(&["createRuntime"], &state));
    ok(&sb.hook(&["prestart"], &state));
    assert_eq!(clients(&sb.status(), 0), vec!["ca"]);
    assert_eq!(daemons_under(&sb.state_dir()).len(), 1);
    // Unknown container: nothing changes.
    let before = sb.snapshot();
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("other", 0, &b)));
    assert_eq!(sb.snapshot(), before);
    ok(&sb.hook(&["poststop"], &state));
    ok(&sb.hook(&["poststop"], &state));
    assert!(sb.status()["gpus"].as_array().unwrap().is_empty());
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

#[test]
fn timeslice_is_refused_on_an_mps_gpu_and_mps_on_a_timeslice_gpu() {
    if !common::require("mode compatibility", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let bm = sb.bundle("m", &mps_spec());
    let bt = sb.bundle(
        "t",
        &spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let (a, c) = (FakeContainer::start(), FakeContainer::start());
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("mps-user", a.pid(), &bm),
    ));
    let before = sb.snapshot();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("ts", c.pid(), &bt));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("serves mps to mps-user"), "{err}");
    assert_eq!(sb.snapshot(), before, "state unchanged");
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("mps-user", 0, &bm)));

    // Now timeslice takes the GPU; mps is refused while it is there.
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ts", c.pid(), &bt)));
    assert_eq!(sb.compute_mode(0), 0);
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("m2", a.pid(), &bm));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("serves timeslice to ts"));
    assert!(
        daemons_under(&sb.state_dir()).is_empty(),
        "no daemon started"
    );
}

#[test]
fn stale_clients_are_dropped_and_dead_daemons_restarted() {
    if !common::require("stale clients", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &mps_spec());
    let mut gone = FakeContainer::start();
    let live = FakeContainer::start();
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("gone", gone.pid(), &b),
    ));
    // The daemon dies, then the container (the other way round, the reaper would stop the
    // daemon of the domain its last client left).
    let d = daemons_under(&sb.state_dir());
    assert_eq!(d.len(), 1);
    let _ = std::process::Command::new("kill")
        .args(["-9", &d[0].to_string()])
        .status();
    for _ in 0..500 {
        if daemons_under(&sb.state_dir()).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        daemons_under(&sb.state_dir()).is_empty(),
        "daemon did not die"
    );
    gone.kill();

    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("live", live.pid(), &b),
    ));
    // The GPU's reaper releases the exited client once the acquire frees the lock (or the
    // acquire drops it first): either way it is gone without another hook.
    common::wait_until(5, "the stale client dropped", || {
        clients(&sb.status(), 0) == ["live"]
    });
    let st = sb.status();
    assert_eq!(
        st["gpus"][0]["domains"][0]["daemon"]["answers"], true,
        "daemon restarted"
    );
    let now = daemons_under(&sb.state_dir());
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], d[0]);
}

#[test]
fn unrecorded_daemon_is_adopted_not_duplicated() {
    if !common::require("daemon adoption", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &mps_spec());
    let (a, c) = (FakeContainer::start(), FakeContainer::start());
    // Killed between starting the daemon and saving the record.
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("ca", a.pid(), &b),
        &[("GPUSHARE_FAILPOINT", "acquire-daemon-started")],
    );
    common::assert_killed_at(&out, "acquire-daemon-started");
    let orphan = daemons_under(&sb.state_dir());
    assert_eq!(orphan.len(), 1);
    // Only the write-ahead part was saved: the compute mode to restore, no daemon, no client.
    let st = sb.status();
    for g in st["gpus"].as_array().unwrap() {
        assert!(g["clients"].as_array().unwrap().is_empty(), "{st}");
        for d in g["domains"].as_array().unwrap() {
            assert!(d["daemon"].is_null(), "daemon never recorded: {st}");
        }
    }

    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cb", c.pid(), &b)));
    let st = sb.status();
    assert_eq!(
        st["gpus"][0]["domains"][0]["daemon"]["pid"], orphan[0],
        "adopted"
    );
    assert_eq!(daemons_under(&sb.state_dir()), orphan, "not duplicated");
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cb", 0, &b)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

/// Every MPS control daemon process whose pipe directory lies under `root`, found by its
/// environment: the test's own view, independent of the `daemon` files gpushare writes (which
/// `daemons_under` reads).
fn mps_processes_under(root: &std::path::Path) -> Vec<i32> {
    let want = format!("CUDA_MPS_PIPE_DIRECTORY={}/", root.display());
    common::pids_where(|pid| {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        comm.starts_with("nvidia-cuda-mps")
            && env
                .split(|b| *b == 0)
                .any(|v| v.starts_with(want.as_bytes()))
    })
}

/// Kills, on drop, the daemons `mps_processes_under` finds (a failing test's orphans).
struct KillOrphans(std::path::PathBuf);

impl Drop for KillOrphans {
    fn drop(&mut self) {
        for pid in mps_processes_under(&self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// A hook SIGKILLed right after it spawned the daemon, before it could write anything: the
/// daemon recorded itself between fork and exec, so the next acquire adopts it and the last
/// release stops it; none is left running that nobody knows.
#[test]
fn a_daemon_whose_hook_is_killed_right_after_the_spawn_is_adopted_then_stopped() {
    if !common::require("daemon adoption", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let _k = KillOrphans(sb.path().to_owned());
    let b = sb.bundle("b", &mps_spec());
    let (a, c) = (FakeContainer::start(), FakeContainer::start());
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("ca", a.pid(), &b),
        &[("GPUSHARE_FAILPOINT", "mps-spawned")],
    );
    common::assert_killed_at(&out, "mps-spawned");
    let running = mps_processes_under(sb.path());
    assert_eq!(running.len(), 1, "positive control: the daemon was spawned");
    assert_eq!(
        daemons_under(&sb.state_dir()),
        running,
        "recorded by itself"
    );
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cb", c.pid(), &b)));
    let st = sb.status();
    assert_eq!(
        st["gpus"][0]["domains"][0]["daemon"]["pid"], running[0],
        "adopted: {st}"
    );
    assert_eq!(mps_processes_under(sb.path()), running, "not duplicated");
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cb", 0, &b)));
    let t0 = std::time::Instant::now();
    while !mps_processes_under(sb.path()).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "a daemon left running after the last release: {:?}",
            mps_processes_under(sb.path())
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn timeslice_length_goes_through_nvidia_smi() {
    let sb = Sandbox::new(2);
    // A stand-in nvidia-smi that records its arguments.
    let smi = sb.path().join("fake-smi");
    let args_file = sb.path().join("smi-args");
    std::fs::write(
        &smi,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", args_file.display()),
    )
    .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&smi).unwrap().permissions(),
        0o755,
    );
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    sb.write_config(&format!("[timeslice]\nsmi = {:?}\n", smi));
    let b = sb.bundle(
        "t",
        &spec(
            json!({"gpu.share": "timeslice", "gpu.share.timeslice": "long"}),
            &["NVIDIA_VISIBLE_DEVICES=1"],
        ),
    );
    let a = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ts", a.pid(), &b)));
    let args = std::fs::read_to_string(&args_file).unwrap();
    assert_eq!(args.trim(), "compute-policy -i 1 --set-timeslice 3");

    // Missing nvidia-smi: a clear error, nothing recorded.
    sb.write_config("[timeslice]\nsmi = \"/nonexistent/nvidia-smi\"\n");
    // GPU 0 set to EXCLUSIVE_PROCESS by hand: the refused acquire must leave it so.
    std::fs::write(sb.sim_state().join("compute_mode.0"), "3").unwrap();
    let b = sb.bundle(
        "t0",
        &spec(
            json!({"gpu.share": "timeslice", "gpu.share.timeslice": "short"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    let before = sb.snapshot();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("ts2", c.pid(), &b));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not found, needed for gpu.share.timeslice"),
        "{err}"
    );
    assert_eq!(sb.snapshot(), before);
    assert_eq!(
        sb.compute_mode(0),
        3,
        "compute mode restored after the refusal"
    );
}

#[test]
fn container_that_asks_for_nothing_touches_nothing() {
    let sb = Sandbox::new(1);
    // NVML that would fail if loaded proves it is not loaded.
    sb.write_config("[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n");
    let b = sb.bundle(
        "n",
        &spec(json!({"other": "x"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("plain", 1, &b));
    ok(&out);
    assert!(out.stderr.is_empty() && out.stdout.is_empty());
    assert!(!sb.state_dir().exists(), "no state written");
    let out = sb.hook(&["poststop"], &Sandbox::state_json("plain", 0, &b));
    ok(&out);
    assert!(!sb.state_dir().exists());
    // Bytes that are not UTF-8 in a string, which runc's Go decoder takes (it replaces them):
    // still nothing asked, so let through.
    let config = b.join("config.json");
    let text = std::fs::read(&config).unwrap();
    let at = text
        .windows(3)
        .position(|w| w == b"\"x\"")
        .expect("the spec's \"x\"")
        + 1;
    let mut bytes = text.clone();
    bytes[at] = 0xff;
    std::fs::write(&config, &bytes).unwrap();
    assert!(
        std::str::from_utf8(&bytes).is_err(),
        "positive control: not UTF-8"
    );
    // The poststop above went the whole way, which opens the log.
    let _ = std::fs::remove_file(sb.log_path());
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("bytes", 1, &b));
    ok(&out);
    assert!(out.stderr.is_empty() && out.stdout.is_empty());
    assert!(!sb.state_dir().exists(), "no state written");
    // Let through at the first look: the policy was not read, nor logging set up.
    assert!(!sb.log_path().exists(), "it went the whole way");
}

#[test]
fn daemon_leaves_the_callers_cgroup() {
    if !common::require("cgroup escape", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &mps_spec());
    let a = FakeContainer::start();
    // The hook runs inside a scope of its own, as under a runtime's per-container cgroup
    // (cgroup v1's pids hierarchy, or v2's root).
    let scope = common::TestCgroup::new(&format!("gpushare-test-{}", std::process::id()));
    let root_line = if scope.controllers.is_empty() {
        "0::/".to_owned()
    } else {
        format!(":{}:/", scope.controllers)
    };
    let state = Sandbox::state_json("ca", a.pid(), &b);
    let (out, _) = sb.hook_in_cgroup(&scope.dir, &["createRuntime"], &state);
    ok(&out);
    let d = daemons_under(&sb.state_dir());
    assert_eq!(d.len(), 1);
    let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", d[0])).unwrap();
    assert!(
        cg.lines().any(|l| l.ends_with(root_line.as_str())),
        "daemon still in a scope: {cg}"
    );
    // The scope can end (it is empty) while the daemon goes on.
    std::fs::remove_dir(&scope.dir).expect("scope empty after the hook exits");
    assert_eq!(
        sb.status()["gpus"][0]["domains"][0]["daemon"]["answers"],
        true
    );
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &b)));
}

fn mps_query(sb: &Sandbox, cmd: &str) -> String {
    common::mps_client(&sb.domain_dir(0, "gpu").join("pipe"), cmd)
}

#[test]
fn daemon_settings_follow_the_policy() {
    if !common::require("daemon settings", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[mps]\nexclusive_compute_mode = false\n[policy]\ndefault_cores = 60\nmax_memory = \"8Gi\"\n",
    );
    let b = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let a = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &b)));
    let d = daemons_under(&sb.state_dir());
    assert_eq!(d.len(), 1);
    let pid = d[0];

    // Defaults set through the control socket.
    assert_eq!(
        mps_query(&sb, "get_default_active_thread_percentage"),
        "60.0"
    );
    // The daemon's environment.
    let env = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap())
        .replace('\0', "\n");
    assert!(
        env.lines()
            .any(|l| l == format!("CUDA_VISIBLE_DEVICES={}", Sandbox::uuid(0))),
        "{env}"
    );
    assert!(
        env.lines()
            .any(|l| l.starts_with("CUDA_MPS_LOG_DIRECTORY=")),
        "{env}"
    );
    assert!(
        !env.contains("GPUSHARE_CONFIG"),
        "the daemon's env is minimal: {env}"
    );
    // Compute mode left alone when exclusive_compute_mode = false.
    assert_eq!(sb.compute_mode(0), 0);
    // Its /dev/shm is the per-GPU tmpfs: a file written on the host side is seen there, and the
    // host's own /dev/shm is not.
    let shm = sb.domain_dir(0, "gpu").join("shm");
    std::fs::write(shm.join("marker"), "from-host").unwrap();
    let seen = std::fs::read_to_string(format!("/proc/{pid}/root/dev/shm/marker")).unwrap();
    assert_eq!(seen, "from-host");
    let ns_self = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let ns_daemon = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(ns_self, ns_daemon, "daemon in a mount namespace of its own");
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &b)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

#[test]
fn multiuser_daemon_flag_is_passed_and_its_failure_explained() {
    if !common::require("multi-user MPS", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nmultiuser = true\nstart_timeout_seconds = 5\n");
    let b = sb.bundle("b", &mps_spec());
    let a = FakeContainer::start();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &b));
    let help = std::process::Command::new("nvidia-cuda-mps-control")
        .arg("-h")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let flag = gpushare::host::multiuser::multiuser_flag(&help);
    if let Some(flag) = flag {
        // A driver whose control program lists a multi-user option: the daemon gets it.
        ok(&out);
        let d = daemons_under(&sb.state_dir());
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", d[0])).unwrap();
        assert!(cmdline.split(|b| *b == 0).any(|a| a == flag.as_bytes()));
        ok(&sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &b)));
    } else {
        // Driver 535 (Debian 12) lists none: refused before any daemon starts, with the reason
        // and the fix, in one line.
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("has no multi-user MPS option"), "{err}");
        assert!(err.contains("[mps] multiuser = false"), "{err}");
        assert!(daemons_under(&sb.state_dir()).is_empty());
        assert_eq!(sb.compute_mode(0), 0, "compute mode restored");
        assert!(sb.status()["gpus"].as_array().unwrap().is_empty());
    }
}

#[test]
fn gc_removes_what_gone_limit_containers_left() {
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    let sb = Sandbox::with_policy(1, &format!("[limit]\nlibrary = {limiter:?}\n"));
    let b = sb.bundle(
        "b",
        &spec(
            json!({"gpu.share": "limit", "gpu.share.memory": "1Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let mut gone = FakeContainer::start();
    let live = FakeContainer::start();
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("gone", gone.pid(), &b),
    ));
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("live", live.pid(), &b),
    ));
    let containers = sb.state_dir().join("containers");
    assert!(containers.join("gone").is_dir() && containers.join("live").is_dir());
    // The runtime died with the container: no poststop ever comes.
    gone.kill();
    let out = sb.hook(&["gc"], "");
    ok(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("containers/gone"), "{report}");
    assert!(!containers.join("gone").exists());
    assert!(
        containers.join("live").is_dir(),
        "a live container keeps its files"
    );
    assert_eq!(clients(&sb.status(), 0), vec!["live"]);
}

#[test]
fn spec_edit_reservation_keeps_mount_sources_across_a_last_release() {
    if !common::require("reservation", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let ba = sb.bundle("a", &mps_spec());
    let a = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &ba)));

    // B's spec is edited (podman precreate) while A still runs.
    let b_spec = serde_json::to_string(&mps_spec()).unwrap();
    let out = sb.hook(&["precreate"], &b_spec);
    ok(&out);
    let edited: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hook_env: Vec<String> = edited["hooks"]["createRuntime"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let key = hook_env
        .iter()
        .find_map(|e| e.strip_prefix("GPUSHARE_RESERVATION="))
        .expect("reservation key in the hook entry's env")
        .to_owned();
    let rec = sb.record_header(0);
    assert!(rec["domains"]["gpu"]["reserved"][&key].is_u64(), "{rec}");

    // A, the last client, leaves before B's hook runs: the daemon stops, its directories stay.
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &ba)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
    let dir = sb.domain_dir(0, "gpu");
    assert!(dir.join("pipe").is_dir(), "pipe dir kept for B's mount");
    assert!(
        common::mounts_under(&dir)
            .iter()
            .any(|m| m.ends_with("/shm")),
        "shm kept"
    );

    // B's hook starts a new daemon in the same directories and consumes the reservation.
    let bb = sb.bundle("b", &edited);
    let b = FakeContainer::start();
    ok(&sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("cb", b.pid(), &bb),
        &[("GPUSHARE_RESERVATION", &key)],
    ));
    let st = sb.status();
    assert_eq!(st["gpus"][0]["domains"][0]["daemon"]["answers"], true);
    let rec = sb.record_header(0);
    // Positive control: the domain is still there (B is its client), so a missing key below
    // means the reservation was consumed, not that the record moved.
    assert!(rec["domains"]["gpu"]["daemon"].is_object(), "{rec}");
    assert!(
        rec["domains"]["gpu"]["reserved"].get(&key).is_none(),
        "reservation consumed: {rec}"
    );

    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cb", 0, &bb)));
    assert!(!dir.exists(), "directories removed after the last client");
    assert!(
        common::mounts_under(&sb.state_dir()).is_empty(),
        "{:?}",
        common::mounts_under(&sb.state_dir())
    );
}

#[test]
fn a_join_of_a_running_daemon_loads_no_nvml_and_a_start_still_does() {
    if !common::require("mps lifecycle", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(2);
    let b0 = sb.bundle("b0", &mps_spec());
    let b1 = sb.bundle(
        "b1",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=1"]),
    );
    let (a, c, d) = (
        FakeContainer::start(),
        FakeContainer::start(),
        FakeContainer::start(),
    );
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &b0)));
    let snap = sb.state_dir().join("inventory.json");
    assert!(snap.is_file(), "the first plan saves the GPU list");

    // NVML now fails as soon as it is loaded: a join of GPU 0's running daemon does not load it.
    let broken = [("GPUSHARE_SIM_FAIL", "nvmlInit_v2")];
    ok(&sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("cb", c.pid(), &b0),
        &broken,
    ));
    assert_eq!(clients(&sb.status(), 0), vec!["ca", "cb"]);
    // Starting GPU 1's daemon changes its compute mode: that needs NVML, and says so.
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("cd", d.pid(), &b1),
        &broken,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot load NVML"), "{err}");
    assert_eq!(daemons_under(&sb.state_dir()).len(), 1, "nothing started");
    assert_eq!(sb.compute_mode(1), 0, "GPU 1 untouched");
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cd", d.pid(), &b1)));
    assert_eq!(daemons_under(&sb.state_dir()).len(), 2);

    // A snapshot the driver contradicts (here: GPUs swapped) is dropped and the request
    // refused with "retry"; the retry plans from NVML again.
    let text = std::fs::read_to_string(&snap).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let gpus = v["gpus"].as_array_mut().unwrap();
    let (u0, u1) = (gpus[0]["uuid"].clone(), gpus[1]["uuid"].clone());
    gpus[0]["uuid"] = u1;
    gpus[1]["uuid"] = u0;
    std::fs::write(&snap, v.to_string()).unwrap();
    for id in ["ca", "cb", "cd"] {
        let bundle = if id == "cd" { &b1 } else { &b0 };
        ok(&sb.hook(&["poststop"], &Sandbox::state_json(id, 0, bundle)));
    }
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("ce", a.pid(), &b0));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("retry"), "{err}");
    assert!(!snap.exists(), "dropped");
    assert!(daemons_under(&sb.state_dir()).is_empty());
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ce", a.pid(), &b0)));
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("ce", 0, &b0)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

/// A poststop that only drops a client from a domain another client keeps loads no NVML; the
/// last one, whose release stops the daemon and must put the compute mode back, loads it, and
/// says when it cannot.
#[test]
fn a_poststop_loads_nvml_only_when_its_release_needs_it() {
    if !common::require("mps lifecycle", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b0 = sb.bundle("b0", &mps_spec());
    let (a, c) = (FakeContainer::start(), FakeContainer::start());
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &b0)));
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cb", c.pid(), &b0)));
    let mps_mode = sb.compute_mode(0);
    assert_ne!(mps_mode, 0, "MPS put the GPU in another compute mode");

    // NVML fails as soon as it is loaded.
    let broken = [("GPUSHARE_SIM_FAIL", "nvmlInit_v2")];
    let out = sb.hook_env(&["poststop"], &Sandbox::state_json("ca", 0, &b0), &broken);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("NVML"),
        "a join's poststop loaded NVML: {err}"
    );
    assert_eq!(clients(&sb.status(), 0), vec!["cb"]);
    assert_eq!(
        daemons_under(&sb.state_dir()).len(),
        1,
        "the domain's daemon stays"
    );

    // Positive control: the last client's release needs NVML for the compute mode, and the
    // broken NVML is met and said.
    let out = sb.hook_env(&["poststop"], &Sandbox::state_json("cb", 0, &b0), &broken);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVML unavailable, compute modes not restored")
            && err.contains("cannot load NVML"),
        "{err}"
    );
    assert!(
        daemons_under(&sb.state_dir()).is_empty(),
        "the daemon stopped"
    );
    assert!(clients(&sb.status(), 0).is_empty());
    assert_eq!(sb.compute_mode(0), mps_mode, "not restored without NVML");
}

#[test]
fn a_create_under_debug_logging_says_when_each_step_was_done() {
    let sb = Sandbox::new(1);
    let b = sb.bundle(
        "b",
        &spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    let steps = |out: &std::process::Output| -> Vec<(String, f64)> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(|l| {
                let (_, rest) = l.split_once("step=\"")?;
                let (name, rest) = rest.split_once('"')?;
                let ms = rest.split_once("ms=")?.1.trim().parse().ok()?;
                Some((name.to_owned(), ms))
            })
            .collect()
    };
    let state = Sandbox::state_json("cs", c.pid(), &b);
    let out = sb.hook_env(&["createRuntime"], &state, &[("GPUSHARE_LOG", "debug")]);
    ok(&out);
    let got = steps(&out);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "spec parsed",
            "planned",
            "record loaded",
            "GPU set up",
            "record saved",
            "acquired",
            "mounts made",
            "events written",
            "reaper checked"
        ],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        got.windows(2).all(|w| w[0].1 <= w[1].1) && got[0].1 > 0.0,
        "times from the hook's start, in order: {got:?}"
    );
    ok(&sb.hook(&["poststop"], &state));
    // Without debug logging, no step line.
    let state = Sandbox::state_json("cq", c.pid(), &b);
    let out = sb.hook(&["createRuntime"], &state);
    ok(&out);
    assert!(
        steps(&out).is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(&sb.hook(&["poststop"], &state));
}
