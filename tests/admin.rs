//! Admin commands: doctor, status (human and JSON), gc on an empty state, version.

mod common;

use common::Sandbox;

#[test]
fn doctor_reports_each_dependency() {
    let sb = Sandbox::new(2);
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    with_built_hook(&sb, "");
    let policy = std::fs::read_to_string(sb.config_path()).unwrap();
    sb.write_config(&format!(
        "[limit]\nlibrary = {limiter:?}\n{}",
        &policy[policy.find("[runtime]").unwrap()..]
    ));
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
    if common::require("doctor's mps control check", &["nvidia-cuda-mps-control"]) {
        assert_eq!(find("mps control")["verdict"], "ok", "{text}");
        assert_eq!(out.status.code(), Some(0), "{text}");
    } else {
        assert_eq!(find("mps control")["verdict"], "fail", "{text}");
    }

    // A control binary that is not there fails the check (the policy allows mps).
    sb.write_config(&format!(
        "[limit]\nlibrary = {limiter:?}\n[runtime]\nhook = {:?}\n\
         [mps]\ncontrol = \"/nonexistent/nvidia-cuda-mps-control\"\n",
        common::hook_bin()
    ));
    let out = sb.hook(&["doctor", "--json"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mps = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "mps control")
        .unwrap_or_else(|| panic!("no mps control check: {text}"));
    assert_eq!(mps["verdict"], "fail", "{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");

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

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether this test may do what only root can (mount, run as another user); else a loud skip,
/// a failure under CI.
fn root(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let msg = format!("SKIPPED: {what}: needs root");
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{msg} (CI=true)"
    );
    eprintln!("\n******** {msg} ********\n");
    false
}

/// The policy of a sandbox whose `[runtime] hook` is the built binary (so the runtime is the
/// built wrapper), with `extra` after it.
fn with_built_hook(sb: &Sandbox, extra: &str) {
    sb.write_config(&format!(
        "[runtime]\nhook = {:?}\n{extra}",
        common::hook_bin()
    ));
}

#[test]
fn configure_docker_merges_atomically_with_backup_and_hands_on_the_policy() {
    let sb = Sandbox::new(1);
    with_built_hook(&sb, "next = [\"/nonexistent/next-runtime\"]\n");
    let f = sb.path().join("daemon.json");
    let fs = f.to_str().unwrap();
    let original =
        "{\n  \"log-level\": \"warn\",\n  \"runtimes\": {\"x\": {\"path\": \"/x\"}}\n}\n";
    std::fs::write(&f, original).unwrap();

    // --dry-run: a diff, nothing written.
    let out = sb.hook(&["configure", "docker", "--path", fs, "--dry-run"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    assert!(
        o.contains(&format!("--- {fs}")) && o.contains("+      \"path\":"),
        "{o}"
    );
    assert!(o.contains("dry run: nothing was written"), "{o}");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), original);
    let launcher = sb.path().join("gpushare-runtime-config");
    assert!(!launcher.exists(), "dry run wrote the launcher");

    // The real run: which policy, which runtime, what was written, what to restart.
    let out = sb.hook(&["configure", "docker", "--path", fs], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    let cfg = sb.config_path().display().to_string();
    assert!(
        o.contains(&format!("config {cfg} ($GPUSHARE_CONFIG)")),
        "{o}"
    );
    let runtime = common::hook_bin().with_file_name("gpushare-runtime");
    assert!(o.contains(&format!("runtime {}", runtime.display())), "{o}");
    assert!(
        o.contains(&format!("written {fs} (backup {fs}.bak-")),
        "{o}"
    );
    // dockerd reloads its runtimes on SIGHUP: no restart, no container stopped.
    assert!(
        o.contains("systemctl reload docker") && o.contains("SIGHUP"),
        "{o}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
    assert_eq!(v["log-level"], "warn");
    assert_eq!(v["runtimes"]["x"]["path"], "/x");
    assert_eq!(
        v["runtimes"]["gpushare"]["path"],
        launcher.display().to_string()
    );
    let backups: Vec<_> = std::fs::read_dir(sb.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("daemon.json.bak-")
        })
        .collect();
    assert_eq!(backups.len(), 1);
    assert_eq!(
        std::fs::read_to_string(backups[0].path()).unwrap(),
        original
    );

    // The launcher runs the wrapper with this policy: its own version first, then the wrapper
    // looks for the policy's next runtime.
    let out = std::process::Command::new(&launcher)
        .arg("--version")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(text(&out.stdout).starts_with("gpushare-runtime version "));
    assert!(
        text(&out.stderr).contains("/nonexistent/next-runtime"),
        "the launcher did not hand on the policy: {}",
        text(&out.stderr)
    );

    // A second run changes nothing, and says so.
    let before = std::fs::read(&f).unwrap();
    let out = sb.hook(&["configure", "docker", "--path", fs], "");
    assert!(text(&out.stdout).contains("nothing to change: docker is already configured"));
    assert_eq!(std::fs::read(&f).unwrap(), before);

    // Invalid JSON: refused with one line, the file untouched.
    std::fs::write(&f, "{\"a\": 1,,}").unwrap();
    let out = sb.hook(&["configure", "docker", "--path", fs], "");
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains("is not valid JSON") && e.lines().count() == 1,
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "{\"a\": 1,,}");
}

#[test]
fn configure_containerd_v3_and_help() {
    let sb = Sandbox::new(1);
    let f = sb.path().join("config.toml.containerd");
    let fs = f.to_str().unwrap();
    let out = sb.hook(
        &[
            "configure",
            "containerd",
            "--path",
            fs,
            "--containerd-version",
            "3",
            "--allow-missing",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("created {fs}")));
    let doc: toml::Table = std::fs::read_to_string(&f).unwrap().parse().unwrap();
    let rt = &doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpushare"];
    assert_eq!(rt["pod_annotations"][0].as_str(), Some("gpu.share*"));
    assert!(rt["options"]["BinaryName"]
        .as_str()
        .unwrap()
        .ends_with("/gpushare-runtime-config"));
    let help = text(&sb.hook(&["configure", "--help"], "").stdout);
    for flag in ["--path <FILE>", "--dry-run", "--hooks-dir", "--order"] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
    let help = text(&sb.hook(&["status", "--help"], "").stdout);
    assert!(
        help.contains("--json") && help.contains("Print JSON"),
        "{help}"
    );
}

#[test]
fn broken_policy_precreate_passes_plain_containers_and_marks_requests() {
    // Its gpushare logs to the host's default files (see `common::host_lock_shared`).
    let _host = common::host_lock_shared();
    let sb = Sandbox::new(1);
    std::fs::write(
        sb.config_path(),
        "state_dir = \"/run/x\"\n[polcy]\nmodes = []\n",
    )
    .unwrap();
    // Plain: the same bytes back.
    let plain = r#"{"ociVersion":"1.0.2","process":{"env":["A=1"],"args":["sh"]}}"#;
    let out = sb.hook(&["precreate"], plain);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), plain);
    // Asking: the config comes back with a first createRuntime entry carrying the error.
    let asks = r#"{"ociVersion":"1.0.2","annotations":{"gpu.share":"mps"}}"#;
    let out = sb.hook(&["precreate"], asks);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let env = v["hooks"]["createRuntime"][0]["env"].to_string();
    assert!(
        env.contains("GPUSHARE_REFUSED=config ") && env.contains("unknown field `polcy`"),
        "{env}"
    );
    // Other commands fail with the parser's position and its own diagnostic.
    let out = sb.hook(&["configure", "docker", "--print"], "");
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    let first = e.lines().next().unwrap();
    assert!(
        first.contains("is not valid TOML for gpushare: line 2, column 2: unknown field `polcy`"),
        "{e}"
    );
    assert!(
        e.lines().count() >= 4 && e.contains("[polcy]") && e.contains('^'),
        "{e}"
    );
    // doctor reports it as a failed check, with the diagnostic, and runs the rest.
    let out = sb.hook(&["doctor"], "");
    assert_eq!(out.status.code(), Some(1));
    let o = text(&out.stdout);
    assert!(o.starts_with("FAIL  config "), "{o}");
    assert!(o.contains("state dir"), "{o}");
    // createRuntime with a refusal from precreate fails with it, before reading any policy.
    let st = Sandbox::state_json("c1", 1, sb.path());
    let out = sb.hook_env(
        &["createRuntime"],
        &st,
        &[("GPUSHARE_REFUSED", "no: because")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "gpushare-hook: no: because\n");
}

#[test]
fn memory_above_the_gpu_is_refused_in_human_units() {
    let sb = Sandbox::new(1);
    let b = sb.bundle(
        "b",
        &common::spec(
            serde_json::json!({"gpu.share": "limit", "gpu.share.memory": "100Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let out = sb.hook(
        &["createRuntime", "--dry-run"],
        &Sandbox::state_json("c1", 1, &b),
    );
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains("asks for 100.0 GiB but GPU 0") && e.contains("has 80.0 GiB in all"),
        "{e}"
    );
}

#[test]
fn doctor_fails_a_read_only_state_dir_and_an_exclusive_gpu_without_daemon() {
    if !root("doctor read-only state dir") {
        return;
    }
    let sb = Sandbox::new(1);
    let ro = sb.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
        .arg(&ro)
        .status()
        .unwrap();
    assert!(st.success(), "mount");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(ro.clone());
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    sb.write_config(&format!("[limit]\nlibrary = {limiter:?}\n"));
    let policy = std::fs::read_to_string(sb.config_path()).unwrap().replace(
        &format!("state_dir = {:?}", sb.state_dir()),
        &format!("state_dir = {:?}", ro.join("state")),
    );
    std::fs::write(sb.config_path(), policy).unwrap();
    // The simulated driver keeps compute modes in its state dir (3: EXCLUSIVE_PROCESS).
    std::fs::write(sb.sim_state().join("compute_mode.0"), "3").unwrap();
    let out = sb.hook(&["doctor", "--json"], "");
    assert_eq!(out.status.code(), Some(1));
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let find = |n: &str| {
        checks
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|c| c["name"] == n)
            .unwrap()
            .clone()
    };
    let sd = find("state dir");
    assert_eq!(sd["verdict"], "fail", "{sd}");
    assert!(
        sd["detail"]
            .as_str()
            .unwrap()
            .contains("read-only filesystem"),
        "{sd}"
    );
    let g = find("gpu 0");
    assert_eq!(g["verdict"], "fail", "{g}");
    assert!(
        g["detail"]
            .as_str()
            .unwrap()
            .contains("EXCLUSIVE_PROCESS with no gpushare MPS daemon"),
        "{g}"
    );
    for n in [
        "podman",
        "docker",
        "containerd",
        "cri-o",
        "hook",
        "runtime",
        "next runtime",
    ] {
        let _ = find(n);
    }
}

#[test]
fn status_and_gc_as_non_root_say_the_state_dir_cannot_be_read() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !root("status as non-root") {
        return;
    }
    let sb = Sandbox::new(1);
    std::fs::set_permissions(sb.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sb.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir_all(sb.state_dir().join("gpus")).unwrap();
    std::fs::set_permissions(sb.state_dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(common::hook_bin())
            .args(args)
            .env_clear()
            .envs(sb.env())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    for args in [&["status"][..], &["gc"][..]] {
        let out = run(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let o = text(&out.stdout);
        assert!(
            o.contains("cannot read the state dir") && o.contains("ermission denied"),
            "{args:?}: {o}"
        );
        assert!(!o.contains("no GPU is shared"), "{o}");
    }
    let out = run(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("run as root"), "{v}");
}

#[test]
fn doctor_fails_a_dead_daemon_with_live_clients_and_the_log_tells_the_story() {
    if !common::require("dead daemon", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle(
        "b",
        &common::spec(
            serde_json::json!({"gpu.share": "mps", "gpu.share.memory": "4Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let c = common::FakeContainer::start();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("c1", c.pid(), &b));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let d = common::daemons_under(&sb.state_dir());
    assert_eq!(d.len(), 1);
    let st = sb.status();
    assert_eq!(st["gpus"][0]["clients"][0]["id"], "c1");
    let human = text(&sb.hook(&["status"], "").stdout);
    assert!(human.contains("memory 4.0 GiB"), "{human}");
    let _ = std::process::Command::new("kill")
        .args(["-9", &d[0].to_string()])
        .status();
    for _ in 0..500 {
        if common::daemons_under(&sb.state_dir()).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = sb.hook(&["doctor", "--json"], "");
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let g = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gpu 0")
        .unwrap()
        .clone();
    assert_eq!(g["verdict"], "fail", "{g}");
    assert!(
        g["detail"]
            .as_str()
            .unwrap()
            .contains("is dead while 1 client(s) live"),
        "{g}"
    );
    assert_eq!(out.status.code(), Some(1));
    let out = sb.hook(&["poststop"], &Sandbox::state_json("c1", c.pid(), &b));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    for want in [
        "acquired",
        "container=c1",
        "memory=4.0 GiB",
        "MPS daemon started on GPU 0",
        "released",
        "MPS daemon stopped on GPU 0",
    ] {
        assert!(log.contains(want), "{want:?} not in the log:\n{log}");
    }
    let out = sb.hook(&["gc"], "");
    assert_eq!(text(&out.stdout), "nothing to do\n");
}

#[test]
fn configure_print_shows_sections_for_installers_and_writes_nothing() {
    let sb = Sandbox::new(1);
    let out = sb.hook(
        &[
            "configure",
            "crio",
            "--print",
            "--policy-at",
            "/etc/gpushare/config.toml",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    let heads: Vec<&str> = o.lines().filter(|l| l.starts_with("# ---- ")).collect();
    assert_eq!(
        heads,
        [
            "# ---- /etc/crio/crio.conf.d/10-gpushare.conf",
            "# ---- /etc/containers/oci/hooks.d/gpushare-createRuntime.json",
            "# ---- /etc/containers/oci/hooks.d/gpushare-poststop.json",
        ],
        "{o}"
    );
    // The policy will be at the default path on the node: nothing handed on, no launcher.
    assert!(
        !o.contains("GPUSHARE_CONFIG") && !o.contains("gpushare-runtime-"),
        "{o}"
    );
    let out = sb.hook(&["configure", "docker", "--print"], "");
    let o = text(&out.stdout);
    assert!(
        o.starts_with("# ---- /etc/docker/daemon.json (merge)\n{"),
        "{o}"
    );
    let launcher = sb.path().join("gpushare-runtime-config");
    assert!(
        o.contains(&format!("# ---- {}\n#!/bin/sh", launcher.display())),
        "{o}"
    );
    assert!(!launcher.exists(), "--print wrote the launcher");
}
