//! A refused request leaves nothing, at once, at every stage: the spec edit (precreate) that
//! reserved the MPS directories and is then refused, and the createRuntime hook that is refused
//! after a spec edit reserved for it. Nothing means the state directory byte for byte as it
//! was, no mount under it, no daemon more. Real `nvidia-cuda-mps-control`, TEST-ONLY simulated
//! NVML, the hook run as a runtime runs it (no engine).
mod common;

use std::path::Path;
use std::process::Output;

use common::{daemons_under, spec, Cleanup, FakeContainer, Sandbox};
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
        let _c = Cleanup(sb.path().to_path_buf());
        let (cfg, _) = config(&sb, "good", ann.clone(), 0);
        let out = sb.hook(&["precreate"], &cfg.to_string());
        ok(&out);
        let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(reservation(&edited).is_some(), "{edited}");
        assert!(sb.domain_dir(0, "g-h").join("pipe").is_dir());
    }
    for (what, policy, spoil, words) in rows {
        let sb = Sandbox::with_policy(1, policy);
        let _c = Cleanup(sb.path().to_path_buf());
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
            "cannot take 41984Mi more",
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
        let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
