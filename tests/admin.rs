//! Admin commands: doctor, status (human and JSON), gc on an empty state, version.

mod common;

use common::Sandbox;

#[test]
fn doctor_reports_each_dependency() {
    let sb = Sandbox::new(2);
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    sb.write_config(&format!("[limit]\nlibrary = {limiter:?}\n"));
    let out = sb.hook(&["doctor", "--json"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let find = |name: &str| {
        checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {text}"))
            .clone()
    };
    assert_eq!(find("nvml")["verdict"], "ok", "{text}");
    assert!(find("nvml")["detail"]
        .as_str()
        .unwrap()
        .contains("2 GPU(s)"));
    assert_eq!(find("gpu 1")["verdict"], "ok");
    assert!(find("gpu 0")["detail"]
        .as_str()
        .unwrap()
        .contains("compute mode DEFAULT"));
    assert_eq!(find("limiter")["verdict"], "ok");
    if common::have("nvidia-cuda-mps-control") {
        assert_eq!(find("mps control")["verdict"], "ok");
        assert_eq!(out.status.code(), Some(0), "{text}");
    }

    // A missing NVML is a failure, with exit 1, and the human form says FAIL.
    sb.write_config(&format!(
        "[limit]\nlibrary = {limiter:?}\n[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n"
    ));
    let out = sb.hook(&["doctor"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("nvml")),
        "{text}"
    );
    assert!(!sb.state_dir().exists(), "doctor is read-only");
}

#[test]
fn status_gc_and_version_on_an_empty_node() {
    let sb = Sandbox::new(1);
    let st = sb.status();
    assert!(st["gpus"].as_array().unwrap().is_empty());
    let out = sb.hook(&["status"], "");
    assert!(String::from_utf8_lossy(&out.stdout).contains("no GPU is shared"));
    let out = sb.hook(&["gc", "--json"], "");
    assert!(out.status.success());
    let gc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc --json");
    assert_eq!(gc["actions"], serde_json::json!([]), "nothing to do");
    let out = sb.hook(&["version"], "");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("gpushare-hook 0."));
    let out = sb.hook(&["no-such-command"], "");
    assert_eq!(out.status.code(), Some(2), "usage error");
}
