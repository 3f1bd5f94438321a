//! A refused request leaves nothing, at once, at every stage: the spec edit (precreate) that
//! reserved the MPS directories and is then refused, and the createRuntime hook that is refused
//! after a spec edit reserved for it. Nothing means the state directory byte for byte as it
//! was, no mount under it, no daemon more. Real `nvidia-cuda-mps-control`, TEST-ONLY simulated
//! NVML, the hook run as a runtime runs it (no engine).
mod common;

use std::path::Path;
use std::process::Output;

use common::{daemons_under, spec, FakeContainer, Sandbox};
use serde_json::{json, Value};

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn required() -> bool {
    common::require("refusals after a reservation", &["nvidia-cuda-mps-control"])
}

/// The state as a refusal must leave it: the files, the mounts under it, the daemons.
type World = (Vec<(String, Vec<u8>)>, Vec<String>, usize);

fn world(sb: &Sandbox) -> World {
    (
        sb.snapshot(),
        common::mounts_under(&sb.state_dir()),
        daemons_under(&sb.state_dir()).len(),
    )
}

/// A config as an engine hands it to precreate: the rootfs by absolute path.
fn config(sb: &Sandbox, name: &str, annotations: Value, uid: u32) -> (Value, std::path::PathBuf) {
    let mut v = spec(annotations, &["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]);
    let b = sb.bundle(name, &v);
    v["root"]["path"] = json!(b.join("rootfs"));
    v["process"]["user"] = json!({"uid": uid, "gid": uid});
    (v, b)
}

/// The reservation key a successful precreate put into the hook entry it added.
fn reservation(edited: &Value) -> Option<String> {
    edited["hooks"]["createRuntime"]
        .as_array()?
        .iter()
        .flat_map(|h| h["env"].as_array().cloned().unwrap_or_default())
        .find_map(|e| {
            e.as_str()?
                .strip_prefix("GPUSHARE_RESERVATION=")
                .map(str::to_owned)
        })
}

fn refused_line(edited: &Value) -> Option<String> {
    edited["hooks"]["createRuntime"][0]["env"]
        .as_array()?
        .iter()
        .find_map(|e| {
            e.as_str()?
                .strip_prefix("GPUSHARE_REFUSED=")
                .map(str::to_owned)
        })
}

/// A running mps share on GPU 0, domain `g`, 30% of the SMs, a 40Gi cap: what later requests
/// are refused against. Its files are part of the world a refusal must leave alone.
fn first(sb: &Sandbox) -> (FakeContainer, std::path::PathBuf) {
    let ann = json!({"gpu.share": "mps", "gpu.share.group": "g", "gpu.share.cores": "30", "gpu.share.memory": "40Gi"});
    let b = sb.bundle("a", &spec(ann, &["NVIDIA_VISIBLE_DEVICES=0"]));
    let c = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("a", c.pid(), &b)));
    (c, b)
}

#[test]
fn a_spec_edit_refused_after_reserving_leaves_nothing() {
    if !required() {
        return;
    }
    // (what, policy, how the image is spoiled, words of the refusal)
    type Row = (&'static str, &'static str, fn(&Path), &'static str);
    let rows: [Row; 2] = [
        (
            "the limiter is missing",
            "[limit]\nlibrary = \"/nonexistent/libgpushare_limiter.so\"\n[mps]\nisolation = \"group\"\n",
            |_| {},
            "is not a file",
        ),
        (
            "the image's /etc/ld.so.preload cannot be read",
            "[mps]\nisolation = \"group\"\n",
            |root| std::fs::create_dir_all(root.join("etc/ld.so.preload")).unwrap(),
            "/etc/ld.so.preload",
        ),
    ];
    let ann = json!({"gpu.share": "mps", "gpu.share.group": "h", "gpu.share.memory": "1Gi"});
    // Positive control: the same request on a sound image and node is edited and reserves.
    {
        let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"group\"\n");
        let (cfg, _) = config(&sb, "good", ann.clone(), 0);
        let out = sb.hook(&["precreate"], &cfg.to_string());
        ok(&out);
        let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(reservation(&edited).is_some(), "{edited}");
        assert!(sb.domain_dir(0, "g-h").join("pipe").is_dir());
    }
    for (what, policy, spoil, words) in rows {
        let sb = Sandbox::with_policy(1, policy);
        // A running share of another domain, so that the world is not empty.
        let b = sb.bundle(
            "a",
            &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
        );
        let _a = FakeContainer::start();
        ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("a", _a.pid(), &b)));
        let before = world(&sb);
        let (cfg, b) = config(&sb, "b", ann.clone(), 0);
        spoil(&b.join("rootfs"));
        let out = sb.hook(&["precreate"], &cfg.to_string());
        ok(&out);
        let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
        let line = refused_line(&edited).unwrap_or_else(|| panic!("{what}: not refused: {edited}"));
        assert!(line.contains(words), "{what}: {line}");
        assert_eq!(reservation(&edited), None, "{what}");
        assert_eq!(
            world(&sb),
            before,
            "{what}: the refusal left something: {line}"
        );
        assert!(!sb.domain_dir(0, "g-h").exists(), "{what}");
        // The refusal is the container's, once: its createRuntime fails with the line.
        let c = FakeContainer::start();
        let bb = sb.bundle("b2", &edited);
        let out = sb.hook_env(
            &["createRuntime"],
            &Sandbox::state_json("b", c.pid(), &bb),
            &[("GPUSHARE_REFUSED", line.as_str())],
        );
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert_eq!(world(&sb), before, "{what}");
    }
}

#[test]
fn a_create_runtime_refused_after_a_reservation_leaves_nothing() {
    if !required() {
        return;
    }
    // (what, annotations, uid, how the image is spoiled, words of the refusal)
    type Row = (&'static str, Value, u32, fn(&Path), &'static str);
    let rows: [Row; 4] = [
        (
            "above the domain's limits",
            json!({"gpu.share": "mps", "gpu.share.group": "g", "gpu.share.cores": "80"}),
            0,
            |_| {},
            "gpu.share.cores=80",
        ),
        (
            "another user's domain",
            json!({"gpu.share": "mps", "gpu.share.group": "g"}),
            1000,
            |_| {},
            "uid",
        ),
        (
            "memory caps over the GPU's",
            json!({"gpu.share": "mps", "gpu.share.group": "g", "gpu.share.memory": "41Gi"}),
            0,
            |_| {},
            "41.0 GiB",
        ),
        (
            // The spec edit cannot know what will enforce the cap; the hook finds the limiter
            // would (the container has no cgroup of its own), which the image cannot load.
            "a cap in an image without glibc that only the limiter could enforce",
            json!({"gpu.share": "mps", "gpu.share.group": "g", "gpu.share.memory": "1Gi"}),
            0,
            |root| {
                std::fs::remove_dir_all(root).unwrap();
                std::fs::create_dir_all(root.join("tmp")).unwrap();
            },
            "no C library",
        ),
    ];
    for (what, ann, uid, spoil, words) in rows {
        let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"group\"\n");
        let (_a, _ab) = first(&sb);
        let before = world(&sb);
        assert_eq!(
            before.2, 1,
            "positive control: the first share's daemon runs"
        );
        let (cfg, _) = config(&sb, "b", ann, uid);
        let out = sb.hook(&["precreate"], &cfg.to_string());
        ok(&out);
        let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
        let key =
            reservation(&edited).unwrap_or_else(|| panic!("{what}: no reservation: {edited}"));
        // Positive control: the spec edit reserved (the record changed).
        assert_ne!(world(&sb).0, before.0, "{what}: precreate reserved nothing");
        let mut edited = edited;
        edited["root"]["path"] = json!("rootfs");
        let bb = sb.bundle("b2", &edited);
        spoil(&bb.join("rootfs"));
        let c = FakeContainer::start();
        let out = sb.hook_env(
            &["createRuntime"],
            &Sandbox::state_json("b", c.pid(), &bb),
            &[("GPUSHARE_RESERVATION", key.as_str())],
        );
        assert_eq!(out.status.code(), Some(1), "{what}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(words), "{what}: {err}");
        assert_eq!(
            world(&sb),
            before,
            "{what}: the refusal left something: {err}"
        );
    }
}

#[test]
fn a_create_runtime_refused_for_another_mode_after_a_reservation_leaves_nothing() {
    if !required() {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle(
        "a",
        &spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let a = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("a", a.pid(), &b)));
    let before = world(&sb);
    let (cfg, _) = config(&sb, "b", json!({"gpu.share": "mps"}), 0);
    let out = sb.hook(&["precreate"], &cfg.to_string());
    ok(&out);
    let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = reservation(&edited).expect("reserved");
    assert!(
        sb.domain_dir(0, "gpu").join("pipe").is_dir(),
        "positive control: reserved dirs"
    );
    let bb = sb.bundle("b2", &edited);
    let c = FakeContainer::start();
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("b", c.pid(), &bb),
        &[("GPUSHARE_RESERVATION", key.as_str())],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("serves timeslice"), "{err}");
    assert_eq!(world(&sb), before, "the refusal left something: {err}");
}

/// The refusal events of the event log (next to the sandbox's log file), as (container,
/// reason).
fn refusal_events(sb: &Sandbox) -> Vec<(String, String)> {
    std::fs::read_to_string(sb.path().join("gpushare-events.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v["event"] == "refusal")
        .map(|v| {
            (
                v["container"].as_str().unwrap_or("").to_owned(),
                v["reason"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// `gpushare_refusals_total` by reason, as `metrics` prints it.
fn refusals_total(sb: &Sandbox) -> Vec<(String, f64)> {
    let out = sb.hook(&["metrics"], "");
    ok(&out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("gpushare_refusals_total{"))
        .filter_map(|l| {
            let reason = l.split("reason=\"").nth(1)?.split('"').next()?;
            let value = l.rsplit(' ').next()?.parse().ok()?;
            Some((reason.to_owned(), value))
        })
        .collect()
}

#[test]
fn every_refusal_is_counted_and_written_once_whichever_stage_refused_it() {
    let sb = Sandbox::new(1);
    // A node that has shared before (counters live in its state directory).
    let b = sb.bundle(
        "ok",
        &spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = FakeContainer::start();
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("c-ok", c.pid(), &b),
    ));
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("c-ok", 0, &b)));
    assert_eq!(
        refusals_total(&sb),
        [],
        "positive control: nothing counted yet"
    );
    let bad = json!({"gpu.share": "mps", "gpu.share.memory": "lots"});
    // Stage 1: precreate refuses, and carries the refusal to the container's createRuntime
    // hook, which reports it.
    let (cfg, _) = config(&sb, "pre", bad.clone(), 0);
    let out = sb.hook(&["precreate"], &cfg.to_string());
    ok(&out);
    let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(refused_line(&edited).is_some(), "positive control: refused");
    assert_eq!(refusal_events(&sb), [], "precreate only carries it");
    let entry_env: Vec<(String, String)> = edited["hooks"]["createRuntime"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let env: Vec<(&str, &str)> = entry_env
        .iter()
        .filter(|(k, _)| k.starts_with("GPUSHARE_REFUSED"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let b = sb.bundle("pre", &edited);
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("c-pre", 1, &b),
        &env,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        refusal_events(&sb),
        [("c-pre".to_owned(), "request".to_owned())]
    );

    // Stage 2: gpushare-runtime refuses; no hook of the container runs.
    let (_, b) = config(&sb, "rt", bad.clone(), 0);
    let out = std::process::Command::new(common::hook_bin().with_file_name("gpushare-runtime"))
        .args(["create", "--bundle", b.to_str().unwrap(), "c-rt"])
        .env_clear()
        .envs(sb.env())
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Stage 3: the createRuntime hook alone (hooks-only, CRI-O's hooks dir, CDI).
    let b = sb.bundle("hook", &spec(bad, &["NVIDIA_VISIBLE_DEVICES=0"]));
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("c-hook", 1, &b));
    assert_eq!(out.status.code(), Some(1));
    // Stage 1 again, for another reason, found after the request was read: no C library for
    // limit mode in the image.
    let (cfg, b) = config(&sb, "nolibc", json!({"gpu.share": "limit"}), 0);
    std::fs::remove_dir_all(b.join("rootfs")).unwrap();
    std::fs::create_dir_all(b.join("rootfs/tmp")).unwrap();
    let out = sb.hook(&["precreate"], &cfg.to_string());
    let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
    let line = refused_line(&edited).expect("refused");
    assert!(line.contains("no C library"), "{line}");
    let reason = edited["hooks"]["createRuntime"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix("GPUSHARE_REFUSED_REASON="))
        .expect("the reason travels with the refusal")
        .to_owned();
    let b = sb.bundle("nolibc2", &edited);
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("c-nolibc", 1, &b),
        &[
            ("GPUSHARE_REFUSED", line.as_str()),
            ("GPUSHARE_REFUSED_REASON", reason.as_str()),
        ],
    );
    assert_eq!(out.status.code(), Some(1));

    let want: Vec<(String, String)> = [
        ("c-pre", "request"),
        ("c-rt", "request"),
        ("c-hook", "request"),
        ("c-nolibc", "inject"),
    ]
    .iter()
    .map(|(c, r)| ((*c).to_owned(), (*r).to_owned()))
    .collect();
    assert_eq!(refusal_events(&sb), want, "one event per refusal");
    let mut totals = refusals_total(&sb);
    totals.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        totals,
        [("inject".to_owned(), 1.0), ("request".to_owned(), 3.0)],
        "one count per refusal"
    );
}
