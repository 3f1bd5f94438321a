//! `packaging/kubernetes/dra/` and what the plugin writes to and reads from the API server,
//! validated offline against Kubernetes' 1.37 schemas (`kubernetes-validate`, installed by
//! `scripts/install-deps.sh`): the manifests, the ResourceSlices the plugin publishes, and the
//! allocated claims it prepares. A missing validator fails the test under `CI=true` and is
//! reported loudly otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use gpushare_dra::slices::{self, GpuInfo};

/// The schemas' version: the newest `kubernetes-validate` ships.
const SCHEMAS: &str = "1.37.0";

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn python() -> Option<PathBuf> {
    let p = std::env::var_os("GS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("GS_ENGINES")
                .map_or_else(|| "/var/cache/gpushare-engines".into(), PathBuf::from)
                .join("venv/bin/python")
        });
    Command::new(&p)
        .args(["-c", "import kubernetes_validate"])
        .output()
        .is_ok_and(|o| o.status.success())
        .then_some(p)
}

fn skip(why: &str) {
    let msg = format!("SKIPPED: DRA manifests: {why}");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI=true requires it)");
    }
    eprintln!("\n******** {msg} ********\n");
}

fn validate(python: &Path, files: &[PathBuf]) -> Output {
    Command::new(python)
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--no-warn",
            "-k",
            SCHEMAS,
        ])
        .args(files)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn manifests() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [
        "packaging/kubernetes/dra",
        "packaging/kubernetes/dra/examples",
    ] {
        for e in std::fs::read_dir(repo(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The slices of a node with three GPUs, as the plugin publishes them.
fn published() -> Vec<serde_json::Value> {
    let gpus: Vec<GpuInfo> = [80u64, 40, 24]
        .iter()
        .enumerate()
        .map(|(i, g)| GpuInfo {
            index: i as u32,
            uuid: format!("GPU-{i:04}aaaa-0000-0000-0000-000000000000"),
            memory: g * GIB,
        })
        .collect();
    let cfg = policy("[policy]\nmemory_overcommit = 1.5\n");
    slices::slices(NODE, &gpus, &cfg, 1)
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap();
            v["apiVersion"] = "resource.k8s.io/v1".into();
            v["kind"] = "ResourceSlice".into();
            v
        })
        .collect()
}

#[test]
fn manifests_slices_and_claims_validate_against_the_schemas() {
    let files = manifests();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "daemonset.yaml",
        "rbac.yaml",
        "deviceclasses.yaml",
        "claim-mps-memory.yaml",
        "claim-limit.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    // Every example claim's config is one the plugin takes (checked as at prepare).
    for f in &files {
        let t = std::fs::read_to_string(f).unwrap();
        if t.contains("kind: ShareConfig") {
            assert!(
                t.contains("apiVersion: gpushare.io/v1alpha1"),
                "{}",
                f.display()
            );
            assert!(t.contains("driver: gpushare.io"), "{}", f.display());
        }
    }
    let t = tempfile::tempdir().unwrap();
    let mut generated = Vec::new();
    let slices = published();
    let kinds: Vec<(bool, bool)> = slices
        .iter()
        .map(|s| {
            (
                s["spec"].get("sharedCounters").is_some(),
                s["spec"].get("devices").is_some(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [(true, false), (false, true)],
        "counters and devices apart"
    );
    for (i, s) in slices.iter().enumerate() {
        let p = t.path().join(format!("slice-{i}.yaml"));
        std::fs::write(&p, serde_json::to_string_pretty(s).unwrap()).unwrap();
        generated.push(p);
    }
    // An allocated claim as the plugin reads it, with its status.
    let mut c = serde_json::to_value(claim(
        "w",
        "gpu-1-mps",
        Some("4Gi"),
        Some(config(serde_json::json!({"cores": 25}))),
    ))
    .unwrap();
    c["apiVersion"] = "resource.k8s.io/v1".into();
    c["kind"] = "ResourceClaim".into();
    c["spec"] = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpushare-mps", "capacity": {"requests": {"memory": "4Gi"}}}}]}});
    let p = t.path().join("claim.yaml");
    std::fs::write(&p, serde_json::to_string_pretty(&c).unwrap()).unwrap();
    generated.push(p);

    let Some(py) = python() else {
        skip("kubernetes-validate missing (scripts/install-deps.sh)");
        return;
    };
    let all: Vec<PathBuf> = files.iter().chain(&generated).cloned().collect();
    let out = validate(&py, &all);
    let said = text(&out);
    print!("{said}");
    assert!(out.status.success(), "do not validate:\n{said}");
    // namespace + daemonset, 3 classes, 3 rbac objects, 2 × (template + pod), 2 slices, 1 claim.
    assert_eq!(said.matches(" passed for resource ").count(), 15, "{said}");

    // The validator does refuse: a misspelt field of a slice's device and a wrong type.
    let mut bad_field = slices[1].clone();
    bad_field["spec"]["devices"][0]["allowMultipleAllocation"] = true.into();
    let mut bad_type = slices[0].clone();
    bad_type["spec"]["pool"]["generation"] = "one".into();
    for (what, bad) in [("misspelt field", bad_field), ("wrong type", bad_type)] {
        let p = t.path().join("bad.yaml");
        std::fs::write(&p, bad.to_string()).unwrap();
        let out = validate(&py, &[p]);
        assert!(!out.status.success(), "{what} passed: {}", text(&out));
    }
}
