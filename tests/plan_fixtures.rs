//! Plans made from real `config.json` files captured on this machine from podman (annotations),
//! containerd `ctr run --annotation` and Docker 20.10 (env fallback), compared as data.

mod common;

use std::path::Path;

use gpushare::config::Config;
use gpushare::decide::enforce::{self, CgroupFact, HostFacts};
use gpushare::decide::input::parse_spec;
use gpushare::decide::plan::{decide, Plan, PlannedGpu};
use gpushare::decide::request::{self, Sources};
use gpushare::vocab::Gpu;
use gpushare::vocab::Mode;

fn inventory() -> Vec<Gpu> {
    (0..2)
        .map(|i| Gpu {
            index: i,
            uuid: common::Sandbox::uuid(i as usize),
            minor: i,
        })
        .collect()
}

fn plan_of(fixture: &str, cfg: &Config) -> Option<Plan> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let spec = parse_spec(&std::fs::read(&path).unwrap(), &path).unwrap();
    let src = Sources {
        annotations: &spec.annotations,
        env: &spec.process.env,
    };
    let req = request::parse(&src, cfg).unwrap()?;
    // Planned as a spec edit does, before the container exists.
    let facts = HostFacts {
        cgroup: &|| CgroupFact::NotCreated,
        driver: &|_, _| panic!("the driver is not asked before the container exists"),
    };
    Some(decide("ctr", &req, &spec, &inventory(), &facts).unwrap())
}

fn gpu0() -> Vec<PlannedGpu> {
    vec![PlannedGpu {
        index: 0,
        uuid: common::Sandbox::uuid(0),
        ordinal: 0,
    }]
}

#[test]
fn plans_from_captured_engine_configs() {
    let cfg = Config::default();
    let rows: Vec<(&str, &str, Plan)> = vec![
        (
            "podman --annotation gpu.share=mps --annotation gpu.share.memory=4Gi",
            "podman-mps.json",
            Plan {
                container: "ctr".into(),
                mode: Mode::Mps,
                gpus: gpu0(),
                memory: Some(4 << 30),
                cap: Some(4 << 30),
                enforcement: enforce::not_created(),
                without_limiter: None,
                cores: 100,
                cores_explicit: false,
                timeslice: None,
                domain: None,
                uid: 0,
            },
        ),
        (
            "ctr run --annotation gpu.share=mps",
            "containerd-mps.json",
            Plan {
                container: "ctr".into(),
                mode: Mode::Mps,
                gpus: gpu0(),
                memory: None,
                cap: None,
                enforcement: enforce::uncapped(),
                without_limiter: None,
                cores: 100,
                cores_explicit: false,
                timeslice: None,
                domain: None,
                uid: 0,
            },
        ),
        (
            "docker run -e GPU_SHARE=mps -e GPU_SHARE_CORES=30",
            "docker-env-mps.json",
            Plan {
                container: "ctr".into(),
                mode: Mode::Mps,
                gpus: gpu0(),
                memory: None,
                cap: None,
                enforcement: enforce::uncapped(),
                without_limiter: None,
                cores: 30,
                cores_explicit: true,
                timeslice: None,
                domain: None,
                uid: 0,
            },
        ),
    ];
    for (what, fixture, want) in rows {
        assert_eq!(plan_of(fixture, &cfg), Some(want), "{what}");
    }
}

#[test]
fn docker_env_fallback_can_be_switched_off() {
    let mut cfg = Config::default();
    cfg.policy.env_fallback = false;
    assert_eq!(plan_of("docker-env-mps.json", &cfg), None);
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let sb = common::Sandbox::new(1);
    let text =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/podman-mps.json"))
            .unwrap();
    let b = sb.path().join("bundle");
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(b.join("config.json"), text).unwrap();
    let out = sb.hook(
        &["createRuntime", "--dry-run"],
        &common::Sandbox::state_json("podman-ctr", 1, &b),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["mode"], "mps");
    assert_eq!(plan["memory"], 4u64 << 30);
    assert_eq!(plan["gpus"][0]["uuid"], common::Sandbox::uuid(0));
    assert!(!sb.state_dir().exists(), "dry run wrote state");
}
