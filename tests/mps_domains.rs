//! MPS isolation domains against the real `nvidia-cuda-mps-control` and the TEST-ONLY simulated
//! NVML: one daemon per domain, enforced limits, drift, what one domain's tenant can do to
//! another, concurrency and crashes with several domains on one GPU.

mod common;

use std::process::Output;
use std::sync::Arc;

use common::{daemons_under, spec, FakeContainer, Sandbox};
use serde_json::{json, Value};

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
}

fn group_spec(group: Option<&str>, extra: &[(&str, &str)]) -> Value {
    let mut ann = json!({"gpu.share": "mps"});
    if let Some(g) = group {
        ann["gpu.share.group"] = json!(g);
    }
    for (k, v) in extra {
        ann[*k] = json!(v);
    }
    spec(ann, &["NVIDIA_VISIBLE_DEVICES=0"])
}

fn domains(st: &Value) -> Vec<Value> {
    st["gpus"][0]["domains"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn domain<'a>(ds: &'a [Value], key: &str) -> &'a Value {
    ds.iter()
        .find(|d| d["key"] == key)
        .unwrap_or_else(|| panic!("no domain {key} in {ds:?}"))
}

fn pipe_of(sb: &Sandbox, key: &str) -> std::path::PathBuf {
    sb.domain_dir(0, key).join("pipe")
}

/// Runs NVIDIA's control client on `pipe` as a tenant would from inside its container.
fn control(pipe: &std::path::Path, cmd: &str) -> String {
    common::mps_client(pipe, cmd)
}

fn group_policy(gpus: usize) -> Sandbox {
    Sandbox::with_policy(gpus, "[mps]\nisolation = \"group\"\n")
}

#[test]
fn two_groups_on_one_gpu_get_two_daemons_and_stop_separately() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = group_policy(1);
    let ba = sb.bundle("a", &group_spec(Some("team-a"), &[]));
    let bb = sb.bundle("b", &group_spec(Some("team-b"), &[]));
    let procs: Vec<FakeContainer> = (0..4).map(|_| FakeContainer::start()).collect();
    for (i, (id, b)) in [("a1", &ba), ("a2", &ba), ("b1", &bb), ("b2", &bb)]
        .into_iter()
        .enumerate()
    {
        ok(&sb.hook(
            &["createRuntime"],
            &Sandbox::state_json(id, procs[i].pid(), b),
        ));
    }
    let st = sb.status();
    let ds = domains(&st);
    assert_eq!(ds.len(), 2, "{st}");
    assert_eq!(st["gpus"][0]["clients"].as_array().unwrap().len(), 4);
    for key in ["g-team-a", "g-team-b"] {
        let d = domain(&ds, key);
        assert_eq!(d["daemon"]["answers"], true, "{d}");
        assert_eq!(d["clients"].as_array().unwrap().len(), 2, "{d}");
    }
    assert_eq!(daemons_under(&sb.state_dir()).len(), 2);
    assert_eq!(
        sb.compute_mode(0),
        0,
        "DEFAULT: several daemons share the GPU"
    );

    // Each daemon's /dev/shm is its own domain's tmpfs.
    let pid_of = |key: &str| domain(&ds, key)["daemon"]["pid"].as_i64().unwrap();
    for key in ["g-team-a", "g-team-b"] {
        let shm = pipe_of(&sb, key).with_file_name("shm");
        std::fs::write(shm.join("marker"), key).unwrap();
    }
    for key in ["g-team-a", "g-team-b"] {
        let seen =
            std::fs::read_to_string(format!("/proc/{}/root/dev/shm/marker", pid_of(key))).unwrap();
        assert_eq!(seen, key, "the daemon of {key} sees its own shm");
    }

    // The last container of team-a stops only team-a's daemon.
    for id in ["a1", "a2"] {
        ok(&sb.hook(&["poststop"], &Sandbox::state_json(id, 0, &ba)));
    }
    let st = sb.status();
    let ds = domains(&st);
    assert_eq!(ds.len(), 1, "{st}");
    assert_eq!(domain(&ds, "g-team-b")["daemon"]["answers"], true);
    assert_eq!(daemons_under(&sb.state_dir()).len(), 1);
    assert!(
        !pipe_of(&sb, "g-team-a").exists(),
        "team-a's directories removed"
    );
    for id in ["b1", "b2"] {
        ok(&sb.hook(&["poststop"], &Sandbox::state_json(id, 0, &bb)));
    }
    assert!(sb.status()["gpus"].as_array().unwrap().is_empty());
    assert!(daemons_under(&sb.state_dir()).is_empty());
    assert!(common::mounts_under(&sb.state_dir()).is_empty());
}

#[test]
fn container_isolation_gives_each_container_its_daemon() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"container\"\n");
    let b = sb.bundle("b", &group_spec(None, &[]));
    let procs: Vec<FakeContainer> = (0..3).map(|_| FakeContainer::start()).collect();
    for (i, p) in procs.iter().enumerate() {
        ok(&sb.hook(
            &["createRuntime"],
            &Sandbox::state_json(&format!("c{i}"), p.pid(), &b),
        ));
    }
    let ds = domains(&sb.status());
    let keys: Vec<&str> = ds.iter().map(|d| d["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["c-c0", "c-c1", "c-c2"]);
    assert_eq!(daemons_under(&sb.state_dir()).len(), 3);
    // A group means nothing here: refused, naming the policy.
    let bg = sb.bundle("g", &group_spec(Some("x"), &[]));
    let p = FakeContainer::start();
    let before = sb.snapshot();
    refused(
        &sb.hook(&["createRuntime"], &Sandbox::state_json("g", p.pid(), &bg)),
        "isolation = \"container\"",
    );
    assert_eq!(sb.snapshot(), before, "state unchanged");
    for i in 0..3 {
        ok(&sb.hook(&["poststop"], &Sandbox::state_json(&format!("c{i}"), 0, &b)));
    }
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

#[test]
fn gpu_isolation_refuses_a_group_naming_the_policy() {
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &group_spec(Some("team-a"), &[]));
    let p = FakeContainer::start();
    refused(
        &sb.hook(&["createRuntime"], &Sandbox::state_json("c", p.pid(), &b)),
        "needs [mps] isolation = \"group\"; this node's policy is isolation = \"gpu\"",
    );
    assert!(!sb.state_dir().exists(), "nothing made");
}

#[test]
fn requests_above_the_domain_limits_are_refused() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = group_policy(1);
    let creator = sb.bundle(
        "creator",
        &group_spec(
            Some("t"),
            &[("gpu.share.cores", "30"), ("gpu.share.memory", "1Gi")],
        ),
    );
    let p0 = FakeContainer::start();
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("creator", p0.pid(), &creator),
    ));
    let ds = domains(&sb.status());
    let d = domain(&ds, "g-t");
    assert_eq!(d["enforced"], json!({"cores": 30, "memory_mib": 1024}));
    assert_eq!(
        d["current"], d["enforced"],
        "the daemon's defaults are the limits"
    );
    assert_eq!(
        control(&pipe_of(&sb, "g-t"), "get_default_active_thread_percentage"),
        "30.0"
    );

    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);
    let rows: &[Row] = &[
        (
            "more cores",
            &[("gpu.share.cores", "50")],
            Some("asks for gpu.share.cores=50 but MPS domain g-t"),
        ),
        (
            "more memory",
            &[("gpu.share.memory", "2Gi")],
            Some("asks for gpu.share.memory 2.0 GiB but MPS domain g-t"),
        ),
        ("fewer cores (advisory)", &[("gpu.share.cores", "20")], None),
        ("nothing named", &[], None),
    ];
    let p = FakeContainer::start();
    for (i, (what, extra, err)) in rows.iter().enumerate() {
        let b = sb.bundle(&format!("j{i}"), &group_spec(Some("t"), extra));
        let id = format!("j{i}");
        let before = sb.snapshot();
        let out = sb.hook(&["createRuntime"], &Sandbox::state_json(&id, p.pid(), &b));
        match err {
            Some(needle) => {
                refused(&out, needle);
                assert_eq!(sb.snapshot(), before, "{what}: state unchanged");
            }
            None => {
                ok(&out);
                ok(&sb.hook(&["poststop"], &Sandbox::state_json(&id, 0, &b)));
            }
        }
    }
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("creator", 0, &creator)));
}

#[test]
fn admin_defined_groups_enforce_the_policy_limits() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[mps]\nisolation = \"group\"\n[mps.groups.ops]\ncores = 25\nmemory = \"512Mi\"\n",
    );
    let b = sb.bundle("b", &group_spec(Some("ops"), &[]));
    let p = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("c", p.pid(), &b)));
    let ds = domains(&sb.status());
    assert_eq!(
        domain(&ds, "g-ops")["enforced"],
        json!({"cores": 25, "memory_mib": 512})
    );
    let pipe = pipe_of(&sb, "g-ops");
    assert_eq!(
        control(&pipe, "get_default_active_thread_percentage"),
        "25.0"
    );
    assert_eq!(
        control(&pipe, "get_default_device_pinned_mem_limit 0"),
        "512M"
    );
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("c", 0, &b)));
}

#[test]
fn a_tenant_reaches_only_its_own_domain_and_drift_is_put_back() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = group_policy(1);
    let ba = sb.bundle("a", &group_spec(Some("a"), &[("gpu.share.cores", "40")]));
    let bb = sb.bundle("b", &group_spec(Some("b"), &[("gpu.share.cores", "60")]));
    let (pa, pb, pc) = (
        FakeContainer::start(),
        FakeContainer::start(),
        FakeContainer::start(),
    );
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("a1", pa.pid(), &ba),
    ));
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("b1", pb.pid(), &bb),
    ));
    let (pipe_a, pipe_b) = (pipe_of(&sb, "g-a"), pipe_of(&sb, "g-b"));

    // Tenant a changes its daemon's defaults: b's are untouched; status shows a's drift.
    control(&pipe_a, "set_default_active_thread_percentage 100");
    control(&pipe_a, "set_default_device_pinned_mem_limit 0 99999M");
    assert_eq!(
        control(&pipe_b, "get_default_active_thread_percentage"),
        "60.0"
    );
    let st = sb.status();
    let ds = domains(&st);
    assert_eq!(domain(&ds, "g-a")["drift"], true, "{st}");
    assert_eq!(domain(&ds, "g-b")["drift"], false, "{st}");
    let human = String::from_utf8_lossy(&sb.hook(&["status"], "").stdout).into_owned();
    assert!(human.contains("DRIFT"), "{human}");

    // The next acquire in domain a puts them back (through a control client it does not wait
    // for).
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("a2", pc.pid(), &ba),
    ));
    let restored = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        control(&pipe_a, "get_default_active_thread_percentage") == "40.0"
    });
    assert!(restored, "defaults put back after the next acquire");
    assert_eq!(domain(&domains(&sb.status()), "g-a")["drift"], false);

    // Tenant a quits its daemon: b's keeps serving.
    let a_pid = domain(&domains(&sb.status()), "g-a")["daemon"]["pid"]
        .as_i64()
        .expect("a's daemon pid");
    control(&pipe_a, "quit");
    let b_pid = domain(&domains(&sb.status()), "g-b")["daemon"]["pid"].clone();
    assert_eq!(
        control(&pipe_b, "get_default_active_thread_percentage"),
        "60.0"
    );
    let st = sb.status();
    let ds = domains(&st);
    assert_eq!(domain(&ds, "g-b")["daemon"]["answers"], true);
    assert_eq!(domain(&ds, "g-b")["daemon"]["pid"], b_pid);
    // gc brings a's daemon back for its live clients, with its limits.
    common::wait_until(10, "domain a's daemon to exit after `quit`", || {
        common::process_gone(a_pid)
    });
    let out = sb.hook(&["gc"], "");
    ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("restarted the dead MPS daemon of domain g-a"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        control(&pipe_a, "get_default_active_thread_percentage"),
        "40.0"
    );

    for (id, b) in [("a1", &ba), ("a2", &ba), ("b1", &bb)] {
        ok(&sb.hook(&["poststop"], &Sandbox::state_json(id, 0, b)));
    }
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

#[test]
fn mixed_uids_in_one_domain_are_refused() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let root = sb.bundle("root", &group_spec(None, &[]));
    let mut user_spec = group_spec(None, &[]);
    user_spec["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    let user = sb.bundle("user", &user_spec);
    let (p0, p1) = (FakeContainer::start(), FakeContainer::start());
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("r", p0.pid(), &root),
    ));
    let before = sb.snapshot();
    refused(
        &sb.hook(
            &["createRuntime"],
            &Sandbox::state_json("u", p1.pid(), &user),
        ),
        "runs as uid 1000 but MPS domain gpu",
    );
    assert_eq!(sb.snapshot(), before);
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("r", 0, &root)));
    // Alone, the other uid is served.
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("u", p1.pid(), &user),
    ));
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("u", 0, &user)));
}

#[test]
fn thirty_two_parallel_acquires_across_four_groups() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Arc::new(group_policy(1));
    let bundles: Vec<_> = (0..4)
        .map(|g| sb.bundle(&format!("g{g}"), &group_spec(Some(&format!("g{g}")), &[])))
        .collect();
    let procs: Vec<FakeContainer> = (0..32).map(|_| FakeContainer::start()).collect();
    let run = |stage: &'static str, pid: bool| {
        let hs: Vec<_> = (0..32)
            .map(|i| {
                let sb = Arc::clone(&sb);
                let st = Sandbox::state_json(
                    &format!("c{i}"),
                    if pid { procs[i].pid() } else { 0 },
                    &bundles[i % 4],
                );
                std::thread::spawn(move || sb.hook(&[stage], &st))
            })
            .collect();
        for h in hs {
            ok(&h.join().unwrap());
        }
    };
    run("createRuntime", true);
    let st = sb.status();
    let ds = domains(&st);
    assert_eq!(ds.len(), 4, "{st}");
    for d in &ds {
        assert_eq!(d["clients"].as_array().unwrap().len(), 8, "{d}");
        assert_eq!(d["daemon"]["answers"], true, "{d}");
    }
    assert_eq!(
        daemons_under(&sb.state_dir()).len(),
        4,
        "exactly one daemon per domain"
    );
    run("poststop", false);
    assert!(sb.status()["gpus"].as_array().unwrap().is_empty());
    assert!(daemons_under(&sb.state_dir()).is_empty());
    assert!(common::mounts_under(&sb.state_dir()).is_empty());
}

/// One crash case of [`sigkilled_hooks_with_domains_then_gc_match_the_live_containers`]: a
/// container `stay` runs on GPU 0, then a `victim`'s hook is armed with `point`.
struct Crash {
    point: &'static str,
    isolation: &'static str,
    /// The GPU the victim asks for, and the compute mode that GPU has before (if not GPU 0).
    victim_gpu: usize,
    mode_before: u32,
    /// Whether the victim's acquire passes `point` (false: a negative control, the hook must
    /// finish untouched).
    reached: bool,
    why: &'static str,
}

const CRASHES: &[Crash] = &[
    Crash {
        point: "acquire-locked",
        isolation: "gpu",
        victim_gpu: 0,
        mode_before: 0,
        reached: true,
        why: "every acquire takes the lock",
    },
    Crash {
        point: "acquire-mode-recorded",
        isolation: "gpu",
        victim_gpu: 1,
        mode_before: 0,
        reached: true,
        why: "first client of a DEFAULT GPU: EXCLUSIVE_PROCESS written ahead",
    },
    Crash {
        point: "acquire-daemon-started",
        isolation: "gpu",
        victim_gpu: 1,
        mode_before: 0,
        reached: true,
        why: "first client of a GPU starts its daemon",
    },
    Crash {
        point: "acquire-saved",
        isolation: "gpu",
        victim_gpu: 0,
        mode_before: 0,
        reached: true,
        why: "a join saves the record",
    },
    Crash {
        point: "acquire-mode-recorded",
        isolation: "gpu",
        victim_gpu: 0,
        mode_before: 0,
        reached: false,
        why: "a join of an EXCLUSIVE_PROCESS GPU changes no mode",
    },
    Crash {
        point: "acquire-daemon-started",
        isolation: "gpu",
        victim_gpu: 0,
        mode_before: 0,
        reached: false,
        why: "a join starts no daemon",
    },
    Crash {
        point: "acquire-locked",
        isolation: "group",
        victim_gpu: 0,
        mode_before: 0,
        reached: true,
        why: "every acquire takes the lock",
    },
    Crash {
        point: "acquire-mode-recorded",
        isolation: "group",
        victim_gpu: 1,
        mode_before: 3,
        reached: true,
        why: "a group domain wants DEFAULT on a GPU left in EXCLUSIVE_PROCESS",
    },
    Crash {
        point: "acquire-daemon-started",
        isolation: "group",
        victim_gpu: 0,
        mode_before: 0,
        reached: true,
        why: "a new group on a GPU starts its own daemon",
    },
    Crash {
        point: "acquire-saved",
        isolation: "group",
        victim_gpu: 0,
        mode_before: 0,
        reached: true,
        why: "a new domain is saved",
    },
    Crash {
        point: "acquire-mode-recorded",
        isolation: "group",
        victim_gpu: 0,
        mode_before: 0,
        reached: false,
        why: "the GPU is already DEFAULT",
    },
];

#[test]
fn sigkilled_hooks_with_domains_then_gc_match_the_live_containers() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    for c in CRASHES {
        let case = format!(
            "{}/{} on GPU {} ({})",
            c.point, c.isolation, c.victim_gpu, c.why
        );
        let sb = Sandbox::with_policy(2, &format!("[mps]\nisolation = \"{}\"\n", c.isolation));
        if c.mode_before != 0 {
            std::fs::write(
                sb.sim_state()
                    .join(format!("compute_mode.{}", c.victim_gpu)),
                c.mode_before.to_string(),
            )
            .unwrap();
        }
        assert_eq!(sb.compute_mode(c.victim_gpu), c.mode_before, "{case}");
        let group = (c.isolation == "group").then_some("s");
        let stay_b = sb.bundle("stay", &group_spec(group, &[]));
        let mut victim_spec = group_spec((c.isolation == "group").then_some("v"), &[]);
        victim_spec["process"]["env"] = json!([format!("NVIDIA_VISIBLE_DEVICES={}", c.victim_gpu)]);
        let victim_b = sb.bundle("victim", &victim_spec);
        let stay = FakeContainer::start();
        ok(&sb.hook(
            &["createRuntime"],
            &Sandbox::state_json("stay", stay.pid(), &stay_b),
        ));
        let daemons_before = daemons_under(&sb.state_dir()).len();
        let mut victim = FakeContainer::start();
        let out = sb.hook_env(
            &["createRuntime"],
            &Sandbox::state_json("victim", victim.pid(), &victim_b),
            &[("GPUSHARE_FAILPOINT", c.point)],
        );
        if !c.reached {
            ok(&out);
        } else {
            common::assert_killed_at(&out, c.point);
            // Where it died, as seen from outside.
            let rec = |i: usize| -> Value { sb.record_header(i) };
            match c.point {
                "acquire-mode-recorded" => {
                    assert!(
                        !rec(c.victim_gpu)["restore_compute_mode"].is_null(),
                        "{case}: the mode to restore is saved first"
                    );
                    assert_eq!(
                        sb.compute_mode(c.victim_gpu),
                        c.mode_before,
                        "{case}: and the mode not changed yet"
                    );
                }
                "acquire-daemon-started" => assert_eq!(
                    daemons_under(&sb.state_dir()).len(),
                    daemons_before + 1,
                    "{case}: the victim's daemon runs"
                ),
                _ => {}
            }
        }
        // The runtime then fails the container: its process goes away.
        victim.kill();
        ok(&sb.hook(&["gc"], ""));
        let st = sb.status();
        let gpus = st["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), 1, "{case}: only stay's GPU has a record: {st}");
        let ids: Vec<&str> = gpus[0]["clients"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["stay"], "{case}: {st}");
        let ds = domains(&st);
        assert_eq!(ds.len(), 1, "{case}: one domain left: {st}");
        assert_eq!(
            daemons_under(&sb.state_dir()).len(),
            1,
            "{case}: one daemon per live domain"
        );
        assert_eq!(ds[0]["daemon"]["answers"], true, "{case}");
        if c.victim_gpu != 0 {
            assert_eq!(
                sb.compute_mode(c.victim_gpu),
                c.mode_before,
                "{case}: the victim's GPU mode restored"
            );
        }
        ok(&sb.hook(&["poststop"], &Sandbox::state_json("stay", 0, &stay_b)));
        assert!(daemons_under(&sb.state_dir()).is_empty(), "{case}");
        assert!(sb.status()["gpus"].as_array().unwrap().is_empty(), "{case}");
        assert_eq!(sb.compute_mode(0), 0, "{case}: mode restored");
    }
}

#[test]
fn gc_quarantines_an_unreadable_record_and_rebuilds_it_without_stopping_anything() {
    if !common::require("record rebuild", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &group_spec(None, &[("gpu.share.cores", "40")]));
    let (mut p1, mut p2) = (FakeContainer::start(), FakeContainer::start());
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("c1", p1.pid(), &b)));
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("c2", p2.pid(), &b)));
    let daemon = daemons_under(&sb.state_dir());
    assert_eq!(daemon.len(), 1);
    let rec = sb.record_path(0);
    for damage in ["truncated", "foreign version"] {
        match damage {
            "truncated" => {
                let text = std::fs::read(&rec).unwrap();
                std::fs::write(&rec, &text[..text.len() / 2]).unwrap();
            }
            _ => sb.edit_record_header(0, |v| v["version"] = json!(99)),
        }
        let out = sb.hook(&["gc"], "");
        ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("moved to"), "{damage}: {text}");
        assert!(
            text.contains("rebuilt from 1 running daemon(s) and 2 container(s)"),
            "{damage}: {text}"
        );
        assert_eq!(
            daemons_under(&sb.state_dir()),
            daemon,
            "{damage}: daemon untouched"
        );
        let st = sb.status();
        let ids: Vec<&str> = st["gpus"][0]["clients"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 2, "{damage}: {st}");
        assert!(ids.iter().all(|i| i.starts_with("rebuilt-")), "{st}");
        assert_eq!(domains(&st)[0]["enforced"]["cores"], 100, "{st}");
        assert_eq!(
            sb.compute_mode(0),
            3,
            "still EXCLUSIVE_PROCESS for the live clients"
        );
    }
    let kept = std::fs::read_dir(sb.state_dir().join("gpus"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".quarantined-")
        })
        .count();
    assert!(kept >= 1, "the bad records are kept for inspection");
    // When the containers end, gc stops the daemon and puts the compute mode back.
    p1.kill();
    p2.kill();
    ok(&sb.hook(&["gc"], ""));
    assert!(daemons_under(&sb.state_dir()).is_empty());
    assert_eq!(sb.compute_mode(0), 0);
}

#[test]
fn sigkilled_releases_with_domains_then_gc_leave_the_other_domain_running() {
    if !common::require("mps domains", &["nvidia-cuda-mps-control"]) {
        return;
    }
    for point in ["release-locked", "release-daemon-stopped"] {
        let sb = group_policy(1);
        let stay_b = sb.bundle("stay", &group_spec(Some("s"), &[]));
        let gone_b = sb.bundle("gone", &group_spec(Some("g"), &[]));
        let stay = FakeContainer::start();
        let mut gone = FakeContainer::start();
        ok(&sb.hook(
            &["createRuntime"],
            &Sandbox::state_json("stay", stay.pid(), &stay_b),
        ));
        ok(&sb.hook(
            &["createRuntime"],
            &Sandbox::state_json("gone", gone.pid(), &gone_b),
        ));
        // The poststop is killed while the container's process still runs (else the reaper
        // would have released it first and the poststop would find nothing to do).
        let out = sb.hook_env(
            &["poststop"],
            &Sandbox::state_json("gone", 0, &gone_b),
            &[("GPUSHARE_FAILPOINT", point)],
        );
        common::assert_killed_at(&out, point);
        gone.kill();
        ok(&sb.hook(&["gc"], ""));
        let st = sb.status();
        let ds = domains(&st);
        assert_eq!(ds.len(), 1, "{point}: {st}");
        assert_eq!(domain(&ds, "g-s")["daemon"]["answers"], true, "{point}");
        assert_eq!(daemons_under(&sb.state_dir()).len(), 1, "{point}");
        assert!(
            !pipe_of(&sb, "g-g").exists(),
            "{point}: the gone domain's dirs removed"
        );
        // A repeated poststop after the crash is a no-op.
        ok(&sb.hook(&["poststop"], &Sandbox::state_json("gone", 0, &gone_b)));
        ok(&sb.hook(&["poststop"], &Sandbox::state_json("stay", 0, &stay_b)));
        assert!(daemons_under(&sb.state_dir()).is_empty(), "{point}");
        assert!(common::mounts_under(&sb.state_dir()).is_empty(), "{point}");
    }
}
