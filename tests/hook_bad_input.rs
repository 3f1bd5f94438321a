//! Bad input, each case: one line on stderr, exit 1, state exactly as it was.

mod common;

use common::{spec, FakeContainer, Sandbox};
use serde_json::{json, Value};

/// Runs createRuntime with `stdin` and checks the refusal contract; returns stderr.
fn refused(sb: &Sandbox, stdin: &str, env: &[(&str, &str)]) -> String {
    let before = sb.snapshot();
    let out = sb.hook_env(&["createRuntime"], stdin, env);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "must be refused: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "exactly one line: {err:?}"
    );
    assert!(err.starts_with("gpushare-hook: "), "{err}");
    assert_eq!(sb.snapshot(), before, "state unchanged after: {err}");
    err
}

/// A sandbox that already serves one mps client, so "unchanged" is checked against real state.
fn busy_sandbox(gpus: usize) -> (Sandbox, FakeContainer) {
    let sb = Sandbox::new(gpus);
    let c = FakeContainer::start();
    let b = sb.bundle(
        "base",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let out = sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("base", c.pid(), &b),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (sb, c)
}

#[test]
fn bad_requests_are_refused_with_one_line() {
    if !common::require("bad input", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let (sb, _base) = busy_sandbox(2);
    sb.write_config("[policy]\nmax_memory = \"8Gi\"\n");
    let c = FakeContainer::start();
    let rows: Vec<(&str, Value, Vec<&str>, &str)> = vec![
        (
            "unknown mode",
            json!({"gpu.share": "turbo"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "valid modes are mps, timeslice, limit, none",
        ),
        (
            "bad quantity",
            json!({"gpu.share": "mps", "gpu.share.memory": "12XB"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "12XB",
        ),
        (
            "zero memory",
            json!({"gpu.share": "mps", "gpu.share.memory": "0"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "below the minimum of 1Mi",
        ),
        (
            "cores with a sign",
            json!({"gpu.share": "mps", "gpu.share.cores": "+50"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "no sign, space or leading zero",
        ),
        (
            "memory with a sign",
            json!({"gpu.share": "mps", "gpu.share.memory": "+4Gi"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "no sign, space or leading zero",
        ),
        (
            "visible devices in capitals",
            json!({"gpu.share": "mps"}),
            vec!["NVIDIA_VISIBLE_DEVICES=ALL"],
            "give all, none, void or",
        ),
        (
            "visible devices with a space",
            json!({"gpu.share": "limit"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0, 1"],
            "entry \" 1\" is not valid",
        ),
        (
            "cores 0",
            json!({"gpu.share": "mps", "gpu.share.cores": "0"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "1 to 100",
        ),
        (
            "cores 101",
            json!({"gpu.share": "mps", "gpu.share.cores": "101"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "1 to 100",
        ),
        (
            "memory above policy",
            json!({"gpu.share": "mps", "gpu.share.memory": "9Gi"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "maximum",
        ),
        (
            "device outside assignment",
            json!({"gpu.share": "mps", "gpu.share.devices": "1"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "was not given",
        ),
        (
            "two GPUs in mps",
            json!({"gpu.share": "mps"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0,1"],
            "gpu.share=timeslice",
        ),
        (
            "no GPU",
            json!({"gpu.share": "mps"}),
            vec![],
            "was given no GPU",
        ),
        (
            "unknown GPU",
            json!({"gpu.share": "limit"}),
            vec!["NVIDIA_VISIBLE_DEVICES=7"],
            "does not exist",
        ),
        (
            "unknown key",
            json!({"gpu.share": "mps", "gpu.share.speed": "9"}),
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            "unknown annotation",
        ),
        (
            "env fallback bad",
            json!({}),
            vec!["NVIDIA_VISIBLE_DEVICES=0", "GPU_SHARE=fast"],
            "GPU_SHARE: unknown mode",
        ),
    ];
    for (what, ann, env, want) in rows {
        let b = sb.bundle(what.replace(' ', "-").as_str(), &spec(ann, &env));
        let err = refused(&sb, &Sandbox::state_json("new", c.pid(), &b), &[]);
        assert!(err.contains(want), "{what}: {err}");
    }
}

#[test]
fn malformed_state_and_config_are_refused() {
    let (sb, _base) = busy_sandbox(1);
    let good = sb.bundle(
        "good",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let huge_cfg = sb.path().join("bundles/huge");
    std::fs::create_dir_all(&huge_cfg).unwrap();
    let f = std::fs::File::create(huge_cfg.join("config.json")).unwrap();
    f.set_len(17 << 20).unwrap();
    let broken = sb.path().join("bundles/broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("config.json"),
        "{\"annotations\": {\"gpu.share\": ",
    )
    .unwrap();
    let rows: Vec<(&str, String, &str)> = vec![
        ("not json", "{oops".into(), "not valid JSON"),
        (
            "oversized stdin",
            format!("{{\"id\":\"x\",\"pad\":\"{}\"}}", "a".repeat(2 << 20)),
            "larger than 1 MiB",
        ),
        (
            "unsafe id",
            json!({"id": "../../etc/passwd", "pid": 1, "bundle": good}).to_string(),
            "not a safe name",
        ),
        (
            "id with slash",
            json!({"id": "a/b", "pid": 1, "bundle": good}).to_string(),
            "not a safe name",
        ),
        (
            "missing bundle dir",
            json!({"id": "x", "pid": 1, "bundle": "/nonexistent"}).to_string(),
            "cannot read /nonexistent/config.json",
        ),
        (
            "oversized config",
            json!({"id": "x", "pid": 1, "bundle": huge_cfg}).to_string(),
            "larger than 16 MiB",
        ),
        (
            "broken config",
            json!({"id": "x", "pid": 1, "bundle": broken}).to_string(),
            "not a valid OCI config",
        ),
        (
            "negative pid",
            json!({"id": "x", "pid": -5, "bundle": good}).to_string(),
            "no valid pid",
        ),
        (
            "dead pid",
            json!({"id": "x", "pid": 999_999_999, "bundle": good}).to_string(),
            "no valid pid",
        ),
    ];
    for (what, stdin, want) in rows {
        let err = refused(&sb, &stdin, &[]);
        assert!(err.contains(want), "{what}: {err}");
    }
}

#[test]
fn missing_or_failing_drivers_and_binaries_are_refused() {
    let (sb, _base) = busy_sandbox(1);
    let c = FakeContainer::start();
    let b = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let state = Sandbox::state_json("new", c.pid(), &b);
    let lib = common::simdriver();

    sb.write_config("[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n");
    let err = refused(&sb, &state, &[]);
    assert!(err.contains("cannot load NVML"), "{err}");

    // Without the GPU list a previous request saved, planning needs NVML. (With it, a join of
    // the running daemon needs none: tests/hook_lifecycle.rs.)
    sb.write_config("");
    let _ = std::fs::remove_file(sb.state_dir().join("inventory.json"));
    let err = refused(&sb, &state, &[("GPUSHARE_SIM_FAIL", "nvmlInit_v2")]);
    assert!(err.contains("cannot load NVML"), "{err}");
    let err = refused(&sb, &state, &[("GPUSHARE_SIM_FAIL", "nvmlDeviceGetUUID")]);
    assert!(err.contains("nvmlDeviceGetUUID"), "{err}");

    sb.write_config("[mps]\ncontrol = \"/nonexistent/nvidia-cuda-mps-control\"\n");
    let err = refused(&sb, &state, &[]);
    assert!(err.contains("install nvidia-cuda-mps"), "{err}");

    // A daemon that never answers: start fails, times out, is cleaned away.
    let hang = sb.path().join("hang-mps");
    std::fs::write(&hang, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sb2 = Sandbox::with_policy(
        1,
        &format!("[mps]\ncontrol = {hang:?}\nstart_timeout_seconds = 1\n"),
    );
    let b2 = sb2.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let err = refused(&sb2, &Sandbox::state_json("new", c.pid(), &b2), &[]);
    assert!(err.contains("did not answer"), "{err}");
    assert_eq!(sb2.compute_mode(0), 0, "compute mode restored");
    assert!(
        common::mounts_under(sb2.path()).is_empty(),
        "no leftover mount"
    );
    let _ = lib;
}

#[test]
fn lock_timeout_names_the_holder() {
    let sb = Sandbox::with_policy(1, "lock_timeout_seconds = 1\n");
    let c = FakeContainer::start();
    let b = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "limit"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    // Hold the GPU's lock from outside, as a stuck hook would; the file names a holder that is
    // gone, which the message must not believe.
    std::fs::create_dir_all(sb.state_dir().join("gpus")).unwrap();
    let lock_path = sb
        .state_dir()
        .join("gpus")
        .join(format!("{}.lock", Sandbox::uuid(0)));
    std::fs::write(&lock_path, "pid 4242 (container stuck-one)\n").unwrap();
    let f = std::fs::File::open(&lock_path).unwrap();
    f.lock().unwrap();
    let err = refused(&sb, &Sandbox::state_json("new", c.pid(), &b), &[]);
    assert!(err.contains("timed out"), "{err}");
    assert!(
        err.contains(&format!("held by pid {} (", std::process::id())),
        "the process really holding the lock: {err}"
    );
    assert!(!err.contains("stuck-one"), "{err}");
    drop(f);
}

#[test]
fn bad_policy_file_is_refused() {
    // Its gpushare logs to the host's default files (see `common::host_lock_shared`).
    let _host = common::host_lock_shared();
    let sb = Sandbox::new(1);
    std::fs::write(sb.config_path(), "[policy]\nmax_cores = 500\n").unwrap();
    let b = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let err = refused(&sb, &Sandbox::state_json("x", 1, &b), &[]);
    assert!(err.contains("config.toml"), "{err}");
}

#[test]
fn a_broken_policy_lets_a_container_that_asks_for_nothing_through() {
    // Its gpushare logs to the host's default files (see `common::host_lock_shared`).
    let _host = common::host_lock_shared();
    // As precreate and gpushare-runtime do: a policy that does not load refuses only the
    // containers that ask for a share.
    let sb = Sandbox::new(1);
    std::fs::write(sb.config_path(), "[policy]\nmax_cores = 500\n").unwrap();
    let plain = sb.bundle("plain", &spec(json!({}), &["NVIDIA_VISIBLE_DEVICES=0"]));
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("plain", 1, &plain));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Positive control: the same policy refuses a container that asks, naming the file.
    let asks = sb.bundle(
        "asks",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let err = refused(&sb, &Sandbox::state_json("asks", 1, &asks), &[]);
    assert!(err.contains("config.toml"), "{err}");
}

#[test]
fn missing_cap_sys_admin_is_named() {
    if !common::require("capability check", &["capsh"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let c = FakeContainer::start();
    let b = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    let stdin = Sandbox::state_json("new", c.pid(), &b);
    let mut cmd = std::process::Command::new("capsh");
    cmd.args([
        "--drop=cap_sys_admin",
        "--",
        "-c",
        "exec \"$0\" createRuntime",
    ])
    .arg(common::hook_bin())
    .env_clear()
    .envs(sb.env())
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("lacks CAP_SYS_ADMIN"), "{err}");
    assert!(sb.snapshot().is_empty(), "nothing written");
}

#[test]
fn a_container_process_in_the_hooks_own_mount_namespace_is_refused_and_nothing_lands_on_the_host() {
    if !common::require("host namespace", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    // A process that never left the host's mount namespace (a spec without a mount namespace,
    // or a pid that is not the container's).
    let mut host = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("h", host.id(), &b));
    let _ = host.kill();
    let _ = host.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    assert!(err.contains("own mount namespace"), "{err}");
    assert!(
        common::mounts_under(sb.path()).is_empty(),
        "nothing mounted on the host: {:?}",
        common::mounts_under(sb.path())
    );
    assert!(common::daemons_under(&sb.state_dir()).is_empty());
    let st = sb.status();
    assert!(
        st["gpus"].as_array().is_none_or(|g| g.is_empty())
            || st["gpus"][0]["clients"]
                .as_array()
                .is_some_and(|c| c.is_empty()),
        "{st}"
    );
}
