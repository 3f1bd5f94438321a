//! Concurrency and crash safety: 32 parallel hooks on one GPU and on four; SIGKILLed hooks at
//! chosen points followed by `gc`.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{daemons_under, spec, FakeContainer, Sandbox};
use serde_json::json;

const N: usize = 32;

fn run_parallel(sb: &Arc<Sandbox>, jobs: Vec<(Vec<&'static str>, String)>) {
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|(args, stdin)| {
            let sb = Arc::clone(sb);
            std::thread::spawn(move || sb.hook(&args, &stdin))
        })
        .collect();
    for h in handles {
        let out = h.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn parallel_acquire_release(gpus: usize) {
    let sb = Arc::new(Sandbox::new(gpus));
    let bundles: Vec<_> = (0..gpus)
        .map(|g| {
            let env = format!("NVIDIA_VISIBLE_DEVICES={g}");
            sb.bundle(
                &format!("g{g}"),
                &spec(json!({"gpu.share": "mps"}), &[env.as_str()]),
            )
        })
        .collect();
    let containers: Vec<FakeContainer> = (0..N).map(|_| FakeContainer::start()).collect();
    let jobs = (0..N)
        .map(|i| {
            let st = Sandbox::state_json(&format!("c{i}"), containers[i].pid(), &bundles[i % gpus]);
            (vec!["createRuntime"], st)
        })
        .collect();
    run_parallel(&sb, jobs);

    let st = sb.status();
    let gpus_st = st["gpus"].as_array().unwrap();
    assert_eq!(gpus_st.len(), gpus);
    for g in gpus_st {
        assert_eq!(g["clients"].as_array().unwrap().len(), N / gpus, "{g}");
        assert_eq!(g["domains"][0]["daemon"]["answers"], true);
    }
    assert_eq!(
        daemons_under(&sb.state_dir()).len(),
        gpus,
        "exactly one daemon per GPU"
    );

    let jobs = (0..N)
        .map(|i| {
            (
                vec!["poststop"],
                Sandbox::state_json(&format!("c{i}"), 0, &bundles[i % gpus]),
            )
        })
        .collect();
    run_parallel(&sb, jobs);
    assert!(sb.status()["gpus"].as_array().unwrap().is_empty());
    assert!(daemons_under(&sb.state_dir()).is_empty(), "no daemon left");
    assert!(
        common::mounts_under(&sb.state_dir()).is_empty(),
        "no mount left"
    );
    assert!(!sb.state_dir().join("mps").exists());
    for g in 0..gpus {
        assert_eq!(sb.compute_mode(g), 0);
    }
}

#[test]
fn thirty_two_parallel_hooks_on_one_gpu() {
    if common::require("concurrency", &["nvidia-cuda-mps-control"]) {
        parallel_acquire_release(1);
    }
}

#[test]
fn thirty_two_parallel_hooks_on_four_gpus() {
    if common::require("concurrency", &["nvidia-cuda-mps-control"]) {
        parallel_acquire_release(4);
    }
}

/// After `gc`, records list exactly the live containers and every GPU has at most one daemon,
/// which exists only if it has clients; no mount is left for GPUs without a daemon.
fn assert_consistent(sb: &Sandbox, live: &[&str]) {
    let st = sb.status();
    let mut ids: Vec<String> = Vec::new();
    for g in st["gpus"].as_array().unwrap() {
        for c in g["clients"].as_array().unwrap() {
            assert_eq!(c["alive"], true, "{c}");
            ids.push(c["id"].as_str().unwrap().to_owned());
        }
        assert_eq!(
            g["domains"][0]["daemon"].is_null(),
            g["clients"].as_array().unwrap().is_empty(),
            "{g}"
        );
    }
    ids.sort();
    assert_eq!(ids, live);
    let daemons = daemons_under(&sb.state_dir());
    let with_daemon = st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["domains"][0]["daemon"].is_null())
        .count();
    assert_eq!(
        daemons.len(),
        with_daemon,
        "daemons {daemons:?} vs records {st}"
    );
    if with_daemon == 0 {
        assert!(common::mounts_under(&sb.state_dir()).is_empty());
    }
}

fn killed_at(sb: &Sandbox, args: &[&str], stdin: &str, point: &str) {
    let out = sb.hook_env(args, stdin, &[("GPUSHARE_FAILPOINT", point)]);
    common::assert_killed_at(&out, point);
}

fn gc(sb: &Sandbox) {
    let out = sb.hook(&["gc"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigkilled_hooks_then_gc_leave_consistent_state() {
    if !common::require("crash safety", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let acquire_points = ["acquire-locked", "acquire-daemon-started", "acquire-saved"];
    for point in acquire_points {
        // First client killed mid-acquire, with and without a container that stays.
        for keep_one in [false, true] {
            if keep_one && point == "acquire-daemon-started" {
                continue; // only the first client starts a daemon
            }
            let sb = Sandbox::new(1);
            let b = sb.bundle(
                "b",
                &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
            );
            let stay = FakeContainer::start();
            if keep_one {
                let out = sb.hook(
                    &["createRuntime"],
                    &Sandbox::state_json("stay", stay.pid(), &b),
                );
                assert!(out.status.success());
            }
            let mut victim = FakeContainer::start();
            killed_at(
                &sb,
                &["createRuntime"],
                &Sandbox::state_json("victim", victim.pid(), &b),
                point,
            );
            // The runtime then fails the container: its process goes away.
            victim.kill();
            gc(&sb);
            let live: &[&str] = if keep_one { &["stay"] } else { &[] };
            assert_consistent(&sb, live);
            // And the GPU is still usable afterwards.
            let again = FakeContainer::start();
            let out = sb.hook(
                &["createRuntime"],
                &Sandbox::state_json("again", again.pid(), &b),
            );
            assert!(
                out.status.success(),
                "{point}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(daemons_under(&sb.state_dir()).len(), 1, "{point}");
        }
    }
    for point in ["release-locked", "release-daemon-stopped"] {
        let sb = Sandbox::new(1);
        let b = sb.bundle(
            "b",
            &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
        );
        let mut only = FakeContainer::start();
        let out = sb.hook(
            &["createRuntime"],
            &Sandbox::state_json("only", only.pid(), &b),
        );
        assert!(out.status.success());
        // The poststop is killed while the container's process still runs (else the reaper
        // would have released it first and the poststop would find nothing to do).
        killed_at(
            &sb,
            &["poststop"],
            &Sandbox::state_json("only", 0, &b),
            point,
        );
        only.kill();
        gc(&sb);
        assert_consistent(&sb, &[]);
        assert!(
            !Path::new(&sb.state_dir().join("mps")).exists(),
            "{point}: dirs left"
        );
        // A repeated poststop after the crash is a no-op.
        let out = sb.hook(&["poststop"], &Sandbox::state_json("only", 0, &b));
        assert!(out.status.success());
    }
}

/// Eighty containers on one GPU, with ids as engines make them (64 hex digits): their lines
/// outgrow the record's own file, so they go to a base file, and the record's file holds the
/// changes since. The GPU's reaper releases the containers whose process exits, poststop the
/// rest, and nothing is left: no record, no base file.
#[test]
fn eighty_containers_on_one_gpu_keep_their_lines_in_a_base_file_and_leave_nothing() {
    const MANY: usize = 80;
    let sb = Arc::new(Sandbox::new(1));
    let bundle = sb.bundle(
        "ts",
        &spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let id = |i: usize| format!("{:064x}", 0x5a1e_0000 + i);
    let mut containers: Vec<FakeContainer> = (0..MANY).map(|_| FakeContainer::start()).collect();
    for batch in (0..MANY).collect::<Vec<_>>().chunks(16) {
        let jobs = batch
            .iter()
            .map(|&i| {
                let st = Sandbox::state_json(&id(i), containers[i].pid(), &bundle);
                (vec!["createRuntime"], st)
            })
            .collect();
        run_parallel(&sb, jobs);
    }
    let clients = |sb: &Sandbox| -> Vec<String> {
        let st = sb.status();
        let mut ids: Vec<String> = st["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["clients"].as_array().unwrap().clone())
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(clients(&sb), (0..MANY).map(id).collect::<Vec<_>>());
    let gpus_dir = sb.state_dir().join("gpus");
    let bases = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&gpus_dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "lines"))
            .collect()
    };
    let found = bases();
    assert_eq!(found.len(), 1, "one base file: {found:?}");
    let base_len = std::fs::metadata(&found[0]).unwrap().len();
    let record_len = std::fs::metadata(sb.record_path(0)).unwrap().len();
    assert!(
        base_len > 8 << 10,
        "the lines are in the base: {base_len} bytes"
    );
    assert!(
        record_len < 12 << 10,
        "the record's file holds the header and the changes: {record_len} bytes"
    );
    let header = sb.record_header(0);
    assert_eq!(header["tally"]["count"], MANY, "{header}");
    assert_eq!(
        header["base"]["file"].as_str(),
        found[0].file_name().and_then(|n| n.to_str()),
        "{header}"
    );

    // Ten processes exit: the GPU's reaper releases them.
    for c in containers.iter_mut().take(10) {
        c.kill();
    }
    common::wait_until(20, "the reaper releases the ten", || {
        clients(&sb).len() == MANY - 10
    });
    assert_eq!(clients(&sb), (10..MANY).map(id).collect::<Vec<_>>());

    // The rest end with poststop.
    for batch in (10..MANY).collect::<Vec<_>>().chunks(16) {
        let jobs = batch
            .iter()
            .map(|&i| (vec!["poststop"], Sandbox::state_json(&id(i), 0, &bundle)))
            .collect();
        run_parallel(&sb, jobs);
    }
    assert!(clients(&sb).is_empty());
    assert!(!sb.record_path(0).exists(), "no record left");
    assert!(bases().is_empty(), "no base file left: {:?}", bases());
}

/// A hook killed between a fold's two writes (the new base file, then the record naming it):
/// the record still names what it named before and reads whole, without the killed container;
/// the base it does not name goes at the next fold, and nothing is left once the GPU is free.
/// Killed twice: as the lines first leave the record's file, and at a fold of one base into
/// the next.
#[test]
fn a_hook_killed_between_a_folds_two_writes_leaves_a_whole_record() {
    let sb = Sandbox::new(1);
    let bundle = sb.bundle(
        "ts",
        &spec(
            json!({"gpu.share": "timeslice"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let gpus_dir = sb.state_dir().join("gpus");
    let bases = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&gpus_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".lines"))
            .collect();
        v.sort();
        v
    };
    let named = || {
        sb.record_path(0)
            .exists()
            .then(|| {
                sb.record_header(0)["base"]["file"]
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten()
    };
    let listed = || -> Vec<String> {
        let st = sb.status();
        let mut ids: Vec<String> = st["gpus"][0]["clients"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| c["id"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    };
    let id = |i: usize| format!("{:064x}", 0xc0de_0000 + i);
    let mut containers: Vec<FakeContainer> = Vec::new();
    let mut live: Vec<String> = Vec::new();
    // Creates containers until one is killed at the failpoint (armed) or a fold names a new
    // base (unarmed); returns the killed container's id.
    let create_until = |armed: bool,
                        containers: &mut Vec<FakeContainer>,
                        live: &mut Vec<String>|
     -> Option<String> {
        for _ in 0..200 {
            let i = containers.len();
            containers.push(FakeContainer::start());
            let st = Sandbox::state_json(&id(i), containers[i].pid(), &bundle);
            let before = named();
            let out = if armed {
                sb.hook_env(
                    &["createRuntime"],
                    &st,
                    &[("GPUSHARE_FAILPOINT", "save-base-written")],
                )
            } else {
                sb.hook(&["createRuntime"], &st)
            };
            if armed && !out.status.success() {
                common::assert_killed_at(&out, "save-base-written");
                return Some(id(i));
            }
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            live.push(id(i));
            if !armed && named().is_some() && named() != before {
                return None;
            }
        }
        panic!("no fold in 200 creates");
    };

    // 1. The lines first leave the record's file: killed after the new base is written.
    let killed = create_until(true, &mut containers, &mut live).expect("killed at the first fold");
    assert_eq!(named(), None, "the record still holds its lines itself");
    assert_eq!(
        bases().len(),
        1,
        "the new base, which nothing names: {:?}",
        bases()
    );
    let mut want = live.clone();
    want.sort();
    assert_eq!(listed(), want, "every container but {killed}");
    // The next save folds again: the base it names, and no other.
    assert!(create_until(false, &mut containers, &mut live).is_none());
    assert_eq!(bases(), [named().unwrap()], "the unnamed base went");

    // 2. A fold of one base into the next, killed between its writes.
    let kept = named().unwrap();
    let killed = create_until(true, &mut containers, &mut live).expect("killed at the next fold");
    assert_eq!(
        named().as_deref(),
        Some(kept.as_str()),
        "still the base it named"
    );
    assert_eq!(bases().len(), 2, "{:?}", bases());
    let mut want = live.clone();
    want.sort();
    assert_eq!(listed(), want, "every container but {killed}");

    // gc removes the base nothing names, and says so.
    let orphan: Vec<String> = bases().into_iter().filter(|b| *b != kept).collect();
    let out = sb.hook(&["gc"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("removed {}", gpus_dir.join(&orphan[0]).display()))
            && said.contains("a base file its record does not name"),
        "{said}"
    );
    assert_eq!(bases(), std::slice::from_ref(&kept));
    assert_eq!(listed(), want, "gc kept every container");

    // Once the GPU is free, no record and no base file is left.
    for c in &live {
        let out = sb.hook(&["poststop"], &Sandbox::state_json(c, 0, &bundle));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(listed().is_empty());
    assert!(!sb.record_path(0).exists());
    assert!(bases().is_empty(), "{:?}", bases());
}
