//! Two real runc containers with gpushare-hook in their config.json share GPU 0 through one
//! real MPS control daemon (TEST-ONLY simulated NVML for the inventory).

mod common;

use common::{daemons_under, runc, runc_bundle, Sandbox};
use serde_json::json;

struct Ctr<'a> {
    id: String,
    bundle: std::path::PathBuf,
    sb: &'a Sandbox,
}

impl Drop for Ctr<'_> {
    fn drop(&mut self) {
        let _ = runc(&["delete", "--force", &self.id], &self.bundle);
    }
}

fn start<'a>(sb: &'a Sandbox, name: &str) -> Ctr<'a> {
    let hook = common::hook_bin().display().to_string();
    let env: Vec<String> = sb.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
    let bundle = runc_bundle(&sb.path().join(name), |v| {
        v["process"]["args"] = json!(["sleep", "600"]);
        v["process"]["env"] = json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]);
        v["annotations"] = json!({"gpu.share": "mps", "gpu.share.cores": "50"});
        v["hooks"] = json!({
            "createRuntime": [{"path": hook, "args": ["gpushare-hook", "createRuntime"], "env": env}],
            "poststop": [{"path": hook, "args": ["gpushare-hook", "poststop"], "env": env}],
        });
    });
    let id = format!("gpushare-test-{}-{name}", std::process::id());
    let out = runc(&["create", &id], &bundle);
    assert!(
        out.status.success(),
        "runc create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = runc(&["start", &id], &bundle);
    assert!(
        out.status.success(),
        "runc start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ctr { id, bundle, sb }
}

fn stop(c: &Ctr<'_>) {
    let _ = runc(&["kill", &c.id, "KILL"], &c.bundle);
    for _ in 0..100 {
        let out = runc(&["state", &c.id], &c.bundle);
        if String::from_utf8_lossy(&out.stdout).contains("\"stopped\"") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = runc(&["delete", &c.id], &c.bundle);
    assert!(
        out.status.success(),
        "runc delete: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = c.sb;
}

#[test]
fn two_runc_containers_share_gpu0_through_one_daemon() {
    if !common::require(
        "runc + MPS",
        &["runc", "busybox", "nvidia-cuda-mps-control"],
    ) {
        return;
    }
    let sb = Sandbox::new(1);
    let a = start(&sb, "a");
    let b = start(&sb, "b");

    let st = sb.status();
    let clients: Vec<&str> = st["gpus"][0]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(clients, vec![a.id.as_str(), b.id.as_str()], "{st}");
    assert_eq!(st["gpus"][0]["domains"][0]["daemon"]["answers"], true);
    assert_eq!(daemons_under(&sb.state_dir()).len(), 1);

    stop(&a);
    let st = sb.status();
    assert_eq!(
        st["gpus"][0]["clients"].as_array().unwrap().len(),
        1,
        "{st}"
    );
    assert_eq!(
        st["gpus"][0]["domains"][0]["daemon"]["answers"], true,
        "daemon outlives the first container"
    );

    stop(&b);
    assert!(sb.status()["gpus"].as_array().unwrap().is_empty());
    assert!(
        daemons_under(&sb.state_dir()).is_empty(),
        "daemon gone after the last"
    );
    assert!(!sb.state_dir().join("mps").exists(), "directories gone");
    assert!(common::mounts_under(&sb.state_dir()).is_empty());
}
