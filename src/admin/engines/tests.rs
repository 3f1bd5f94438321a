//! Tests across engines: doctor's reading of engines' files and of running engines' answers.

use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use super::check::{installed, Verdict, POLICY_FIX};
use super::{containerd, docker, podman};

#[test]
fn engine_files_are_parsed_not_grepped() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("gpushare-runtime");
    std::fs::write(&exe, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = t.path().join("daemon.json");
    let rows: &[(&str, String, Verdict, &str)] = &[
        (
            "word in a comment-like key",
            r#"{"x-gpushare": 1}"#.into(),
            Verdict::Warn,
            "no gpushare-runtime",
        ),
        (
            "invalid JSON",
            "{\"runtimes\": {".into(),
            Verdict::Fail,
            "not valid JSON",
        ),
        (
            "missing binary",
            r#"{"runtimes": {"gs": {"path": "/nonexistent/gpushare-runtime"}}}"#.into(),
            Verdict::Fail,
            "cannot be used",
        ),
        (
            "ours",
            format!(
                r#"{{"runtimes": {{"gs": {{"path": "{}"}}}}}}"#,
                exe.display()
            ),
            Verdict::Ok,
            "runs",
        ),
    ];
    for (what, text, verdict, needle) in rows {
        std::fs::write(&daemon, text).unwrap();
        let c = docker::file_check(&daemon);
        if *verdict == Verdict::Warn && !installed("dockerd") {
            assert_eq!(c.verdict, Verdict::Ok, "{what}: {c:?}");
            continue;
        }
        assert_eq!(c.verdict, *verdict, "{what}: {c:?}");
        assert!(c.detail.contains(needle), "{what}: {c:?}");
        assert!(
            c.detail.starts_with("docker") || c.verdict == Verdict::Ok,
            "{what}: names the engine: {c:?}"
        );
    }
    let conf = t.path().join("config.toml");
    std::fs::write(&conf, format!("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gs]\npod_annotations = [\"gpu.share*\"]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gs.options]\nBinaryName = \"{}\"\n", exe.display())).unwrap();
    assert_eq!(
        containerd::file_check(&conf).verdict,
        Verdict::Ok,
        "{:?}",
        containerd::file_check(&conf)
    );
    std::fs::write(&conf, "version = 2\n[plugins\n").unwrap();
    assert_eq!(containerd::file_check(&conf).verdict, Verdict::Fail);

    // podman: hooks dir from containers.conf; a hook whose binary is missing fails.
    let hooks = t.path().join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    let cc = t.path().join("containers.conf");
    std::fs::write(&cc, format!("[engine]\nhooks_dir = [{:?}]\n", hooks)).unwrap();
    let hook = |stage: &str, path: &str| {
        std::fs::write(
            hooks.join(format!("{stage}.json")),
            format!(r#"{{"version":"1.0.0","hook":{{"path":"{path}","env":["GPUSHARE_CONFIG=/nonexistent/p.toml"]}},"when":{{"always":true}},"stages":["{stage}"]}}"#),
        )
        .unwrap();
    };
    let ccs = cc.to_str().unwrap();
    hook("createRuntime", "/nonexistent/gpushare-hook");
    let c = podman::file_check(&[ccs]);
    assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
    assert!(c.detail.starts_with("podman: createRuntime hook"), "{c:?}");
    let real = t.path().join("gpushare-hook");
    std::fs::copy(&exe, &real).unwrap();
    hook("createRuntime", real.to_str().unwrap());
    let c = podman::file_check(&[ccs]);
    assert_eq!(c.verdict, Verdict::Fail, "policy file missing: {c:?}");
    assert!(c.detail.contains("/nonexistent/p.toml"), "{c:?}");

    // A policy file that does not load: fix it; `configure` would refuse it too.
    let broken = t.path().join("broken.toml");
    std::fs::write(&broken, "[polcy]\n").unwrap();
    let launcher = t.path().join("gpushare-runtime-broken");
    std::fs::write(
        &launcher,
        format!("#!/bin/sh\nGPUSHARE_CONFIG='{}'\n", broken.display()),
    )
    .unwrap();
    std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &daemon,
        format!(
            r#"{{"runtimes": {{"gs": {{"path": "{}"}}}}}}"#,
            launcher.display()
        ),
    )
    .unwrap();
    let c = docker::file_check(&daemon);
    assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
    assert!(c.detail.contains("unknown field `polcy`"), "{c:?}");
    assert!(c.detail.ends_with(POLICY_FIX), "{c:?}");
    assert!(
        !c.detail.contains("run `gpushare-hook configure docker`"),
        "{c:?}"
    );
}

#[test]
fn answers_of_running_engines() {
    // Docker's `info` answer (the shape of `docker info --format '{{json .Runtimes}}'`).
    let c = docker::docker_answer(
        &json!({"runtimes": {"runc": {"path": "runc"}, "io.containerd.runc.v2": {"path": "runc"}}, "default": "runc"}),
    );
    assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
    assert!(c.detail.contains("has no gpushare runtime"), "{c:?}");
    let c = docker::docker_answer(
        &json!({"runtimes": {"gpushare": {"path": "/usr/bin/gpushare-runtime"}}, "default": "runc"}),
    );
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");

    // `ctr plugins ls` rows, 1.x layout.
    let table = "TYPE                                  ID                       PLATFORMS      STATUS\nio.containerd.grpc.v1                 cri                      linux/amd64    ok\n";
    assert!(containerd::cri_plugin(table).is_none());
    let c = containerd::cri_plugin(&table.replace("    ok", "    error")).unwrap();
    assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
    assert!(containerd::cri_plugin("TYPE ID PLATFORMS STATUS\n").is_some());

    // `crictl info` (containerd 1.7 layout: config.containerd.runtimes).
    let info = json!({"config": {"containerd": {"defaultRuntimeName": "runc", "runtimes": {
        "runc": {"runtimeType": "io.containerd.runc.v2", "options": {"SystemdCgroup": true}},
        "gpushare": {"runtimeType": "io.containerd.runc.v2", "options": {"BinaryName": "/usr/bin/gpushare-runtime"}}}}}});
    assert_eq!(containerd::containerd_answer(&info).verdict, Verdict::Ok);
    let mut without = info.clone();
    without["config"]["containerd"]["runtimes"]
        .as_object_mut()
        .unwrap()
        .remove("gpushare");
    assert_eq!(
        containerd::containerd_answer(&without).verdict,
        Verdict::Warn
    );
}

#[test]
fn a_running_engine_with_gpushare_and_a_file_without_it_do_not_contradict() {
    use super::check::{agree, check};
    let file = check(
        "docker",
        Verdict::Warn,
        "docker: /etc/docker/daemon.json missing; run `gpushare-hook configure docker`",
    );
    let loaded = check(
        "docker daemon",
        Verdict::Ok,
        "dockerd has loaded runtime \"gpushare\"",
    );
    let c = agree(file.clone(), loaded.clone(), "docker");
    assert_eq!(c[0].verdict, Verdict::Ok, "{c:?}");
    assert!(c[0].detail.contains("daemon.json missing"), "{c:?}");
    // Not loaded: the warning stands.
    let down = check("docker daemon", Verdict::Warn, "docker: not running");
    assert_eq!(agree(file, down, "docker")[0].verdict, Verdict::Warn);
    // Another warning about the file (pods' annotations) is not hidden by a loaded handler.
    let ann = check(
        "containerd",
        Verdict::Warn,
        "containerd: runtime \"gpushare\" runs x, but its pod_annotations lack gpu.share*: pods' requests do not reach it (`gpushare-hook configure containerd` adds them)",
    );
    let ok = check("containerd daemon", Verdict::Ok, "loaded");
    assert_eq!(agree(ann, ok, "containerd")[0].verdict, Verdict::Warn);
    let _ = loaded;
}
