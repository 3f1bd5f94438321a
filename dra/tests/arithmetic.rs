//! The allocation arithmetic, table-tested: for each GPU size, policy and sequence of claims,
//! what the scheduler allocates against the published device (its memory capacity and
//! request policy, summed here from the slice's own numbers), what the plugin admits at
//! prepare, and what the hook's admission (`admission::admit`, as the createRuntime hook runs
//! it against the shares already held) says must all agree. And the request the claim's CDI
//! spec hands the hook is the one the hook plans by.

mod common;

use common::*;
use gpushare::decide::admission;
use gpushare::vocab::{quantity, Inventory, Mode};
use gpushare_dra::slices::{self, GpuInfo};

/// A capacity's bytes as the API writes them (plain digits, or a binary suffix).
fn bytes(q: &str) -> u64 {
    let (n, mult) = match q.find(|c: char| !c.is_ascii_digit()) {
        None => (q, 1),
        Some(i) => (
            &q[..i],
            match &q[i..] {
                "Mi" => 1 << 20,
                "Gi" => 1 << 30,
                s => panic!("suffix {s}"),
            },
        ),
    };
    n.parse::<u64>().unwrap() * mult
}

/// (what, GPU GiB, policy, claims' consumed memory (None: names none), admitted)
type Row = (
    &'static str,
    u64,
    &'static str,
    Vec<Option<&'static str>>,
    Vec<bool>,
);

#[test]
fn scheduler_plugin_and_hook_admit_the_same_claims() {
    let rows: Vec<Row> = vec![
        (
            "fills exactly",
            8,
            "",
            vec![Some("4Gi"), Some("4Gi"), Some("1Mi")],
            vec![true, true, false],
        ),
        (
            "one claim naming no memory takes the GPU",
            8,
            "",
            vec![None, Some("1Gi")],
            vec![true, false],
        ),
        (
            "after a cap, the whole GPU does not fit",
            8,
            "",
            vec![Some("1Gi"), None],
            vec![true, false],
        ),
        (
            "overcommit 2: two whole GPUs",
            8,
            "[policy]\nmemory_overcommit = 2.0\n",
            vec![None, None, Some("1Mi")],
            vec![true, true, false],
        ),
        (
            "overcommit 1.5",
            8,
            "[policy]\nmemory_overcommit = 1.5\n",
            vec![Some("8Gi"), Some("4Gi"), Some("1Mi")],
            vec![true, true, false],
        ),
        (
            "overcommit 0.5 keeps headroom",
            8,
            "[policy]\nmemory_overcommit = 0.5\n",
            vec![Some("3Gi"), Some("1Gi"), Some("1Mi")],
            vec![true, true, false],
        ),
        (
            "odd sizes round the same way",
            3,
            "[policy]\nmemory_overcommit = 1.1\n",
            vec![Some("3Gi"), Some("307Mi"), Some("1Mi")],
            vec![true, true, false],
        ),
    ];
    for (what, gib, text, asks, want) in rows {
        let cfg = policy(text);
        let total = gib * GIB;
        let gpu = GpuInfo {
            index: 0,
            uuid: FakeGpus(vec![total]).gpus().unwrap()[0].uuid.clone(),
            memory: total,
        };
        // The scheduler's view: the device's capacity and its default.
        let dev = slices::device(&gpu, Mode::Mps, &cfg);
        let cap = &dev.capacity.as_ref().unwrap()[slices::MEMORY];
        let value = bytes(&cap.value.0);
        let policy = cap.request_policy.as_ref().unwrap();
        let default = bytes(&policy.default.as_ref().unwrap().0);
        let max = bytes(&policy.valid_range.as_ref().unwrap().max.as_ref().unwrap().0);
        let t = tempfile::tempdir().unwrap();
        let drv = driver(cfg.clone(), t.path(), vec![total]);
        let mut scheduled = 0u64;
        let mut held: Vec<(String, Option<u64>)> = Vec::new();
        for (i, (ask, want)) in asks.iter().zip(&want).enumerate() {
            let consumed = ask.map_or(default, bytes);
            let sched = consumed <= max && scheduled + consumed <= value;
            let name = format!("c{i}");
            // The scheduler writes the consumed capacity into the allocation (the default
            // when the claim names none, where the cluster counts capacity).
            let consumed_text = consumed.to_string();
            let c = claim(&name, "gpu-0-mps", Some(&consumed_text), None);
            let prepared = drv.prepare(&uid(&name), &c);
            let hook = admission::admit(
                0,
                &gpu.uuid,
                total,
                held.iter().map(|(n, m)| (n.as_str(), *m)),
                Some(consumed),
                cfg.policy.memory_overcommit,
                cfg.policy.uncapped,
            );
            assert_eq!(sched, *want, "{what}: claim {i}: scheduler");
            assert_eq!(
                prepared.is_ok(),
                *want,
                "{what}: claim {i}: plugin: {prepared:?}"
            );
            assert_eq!(hook.is_ok(), *want, "{what}: claim {i}: hook: {hook:?}");
            if sched {
                scheduled += consumed;
                held.push((name, Some(consumed)));
            }
        }
    }
}

#[test]
fn the_hook_plans_the_claims_request_from_its_cdi_spec() {
    let t = tempfile::tempdir().unwrap();
    // A group needs isolation = "group"; under the default (one domain a GPU) the claim is
    // refused at prepare with the hook's own words, and nothing is written.
    let c = claim(
        "w",
        "gpu-0-mps",
        Some("4Gi"),
        Some(config(
            serde_json::json!({"cores": "30", "group": "team-a"}),
        )),
    );
    let default = driver(policy(""), &t.path().join("default"), vec![8 * GIB]);
    let e = default.prepare(&uid("w"), &c).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "gpushare.io config: gpu.share.group \"team-a\" needs [mps] isolation = \"group\""
        ),
        "{e}"
    );
    assert!(!default.spec_path(&uid("w")).exists());
    let cfg = policy("[mps]\nisolation = \"group\"\n");
    let drv = driver(cfg.clone(), t.path(), vec![8 * GIB]);
    let c = claim(
        "w",
        "gpu-0-mps",
        Some("4Gi"),
        Some(config(
            serde_json::json!({"cores": "30", "group": "team-a"}),
        )),
    );
    let p = drv.prepare(&uid("w"), &c).unwrap();
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(drv.spec_path(&uid("w"))).unwrap()).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let hook = &edits["hooks"][0];
    let args: Vec<String> = serde_json::from_value(hook["args"].clone()).unwrap();
    assert_eq!(args[3], p.profile);
    // The container as the runtime leaves it after the CDI edits (NVIDIA's device gives the
    // GPU; the claim's device gives env and hooks).
    let bundle = t.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let mut env = vec![
        "PATH=/bin".to_owned(),
        "NVIDIA_VISIBLE_DEVICES=0".to_owned(),
    ];
    env.extend(serde_json::from_value::<Vec<String>>(edits["env"].clone()).unwrap());
    let config_json = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["true"], "cwd": "/", "env": env},
        "root": {"path": "rootfs"},
        "hooks": {"createRuntime": [hook]},
        "linux": {},
    });
    std::fs::write(bundle.join("config.json"), config_json.to_string()).unwrap();
    let state = serde_json::json!({
        "ociVersion": "1.0.2", "id": "ctr-w", "status": "created", "pid": 0,
        "bundle": bundle,
    });
    let open = || Ok(Box::new(FakeGpus(vec![8 * GIB])) as Box<dyn Inventory>);
    let out = gpushare::container::hook::create_runtime(
        state.to_string().as_bytes(),
        &cfg,
        true,
        Some(&args[3]),
        None,
        &open,
    )
    .unwrap();
    let gpushare::container::hook::Outcome::Done(plan) = out else {
        panic!("the hook planned nothing")
    };
    assert_eq!(plan.mode, Mode::Mps);
    assert_eq!(plan.memory, Some(4 * GIB));
    assert_eq!((plan.cores, plan.cores_explicit), (30, true));
    assert_eq!(plan.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0]);
    assert_eq!(
        plan.domain.as_ref().and_then(|d| d.group.as_deref()),
        Some("team-a"),
        "{plan:?}"
    );
    // What the container cannot change: an annotation asking for more is refused.
    let mut with_ann = config_json.clone();
    with_ann["annotations"] = serde_json::json!({"gpu.share.memory": "8Gi"});
    std::fs::write(bundle.join("config.json"), with_ann.to_string()).unwrap();
    let e = gpushare::container::hook::create_runtime(
        state.to_string().as_bytes(),
        &cfg,
        true,
        Some(&args[3]),
        None,
        &open,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("asks for gpu.share.memory=\"8Gi\""),
        "{e}"
    );
    let _ = quantity::MIN_MEMORY;
}

#[test]
fn a_bad_config_gets_the_annotations_own_one_line_error() {
    let cfg = policy("[policy]\nmax_memory = \"40Gi\"\n");
    // (what, allocated device, consumed, config fields, the annotation a container would
    // write instead (None: no annotation says it), the claim's refusal)
    type Row = (
        &'static str,
        &'static str,
        Option<&'static str>,
        serde_json::Value,
        Option<(&'static str, &'static str)>,
        &'static str,
    );
    let rows: Vec<Row> = vec![
        (
            "memory not a quantity",
            "gpu-0-mps",
            None,
            serde_json::json!({"memory": "lots"}),
            Some(("gpu.share.memory", "lots")),
            "",
        ),
        (
            "cores out of range",
            "gpu-0-mps",
            Some("4Gi"),
            serde_json::json!({"cores": 101}),
            Some(("gpu.share.cores", "101")),
            "",
        ),
        (
            "above the node's maximum",
            "gpu-0-limit",
            Some("48Gi"),
            serde_json::json!({}),
            Some(("gpu.share.memory", "48Gi")),
            "",
        ),
        (
            "bad group name",
            "gpu-0-mps",
            Some("4Gi"),
            serde_json::json!({"group": "Team A"}),
            Some(("gpu.share.group", "Team A")),
            "",
        ),
        (
            "unknown time slice",
            "gpu-0-timeslice",
            None,
            serde_json::json!({"timeslice": "forever"}),
            Some(("gpu.share.timeslice", "forever")),
            "",
        ),
        (
            "cores mean nothing to timeslice",
            "gpu-0-timeslice",
            None,
            serde_json::json!({"cores": 10}),
            Some(("gpu.share.cores", "10")),
            "",
        ),
        (
            "another mode than the device's",
            "gpu-0-mps",
            Some("4Gi"),
            serde_json::json!({"mode": "limit"}),
            None,
            "mode limit does not match the allocated device gpu-0-mps (mps)",
        ),
        (
            "mode none, no capacity counted",
            "gpu-0-mps",
            None,
            serde_json::json!({"mode": "none"}),
            None,
            "mode asks for no share",
        ),
        (
            "an unknown field",
            "gpu-0-mps",
            Some("4Gi"),
            serde_json::json!({"colour": "red"}),
            None,
            "unknown field \"colour\"; valid fields are mode, memory, cores, timeslice, group",
        ),
        (
            "more memory than counted",
            "gpu-0-mps",
            Some("4Gi"),
            serde_json::json!({"memory": "8Gi"}),
            None,
            "memory 8Gi is more than the 4Gi the scheduler counted",
        ),
    ];
    for (what, device, consumed, fields, annotation, want) in rows {
        let t = tempfile::tempdir().unwrap();
        let drv = driver(cfg.clone(), t.path(), vec![80 * GIB]);
        let c = claim("x", device, consumed, Some(config(fields)));
        let e = drv.prepare(&uid("x"), &c).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{what}: one line: {e}");
        assert!(e.starts_with("gpushare.io config: "), "{what}: {e}");
        assert!(
            !drv.spec_path(&uid("x")).exists(),
            "{what}: nothing written"
        );
        assert!(drv.prepared().is_empty(), "{what}: nothing held");
        match annotation {
            // The container's own annotation, as the hook reads it, gets the same words.
            Some((key, value)) => {
                let mode = slices::parse_device_name(device).unwrap().1;
                let ann = std::collections::HashMap::from([
                    ("gpu.share".to_owned(), mode.as_str().to_owned()),
                    (key.to_owned(), value.to_owned()),
                ]);
                let hook = gpushare::decide::request::parse(
                    &gpushare::decide::request::Sources {
                        annotations: &ann,
                        env: &[],
                    },
                    &cfg,
                )
                .unwrap_err()
                .to_string();
                assert_eq!(e, format!("gpushare.io config: {hook}"), "{what}");
            }
            None => assert!(e.contains(want), "{what}: {e}"),
        }
    }
}
