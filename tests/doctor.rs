//! `doctor` tries what it checks: each case here was once reported "ok" while it did not work.
//! And `status`, `gc`, `poststop` and `doctor` on a broken policy file.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{spec, FakeContainer, Sandbox};
use serde_json::{json, Value};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `doctor --json` with `extra_env`: (verdict, detail) of each check by name.
fn doctor(sb: &Sandbox, extra_env: &[(&str, &str)]) -> Vec<(String, String, String)> {
    checks(&sb.hook_env(&["doctor", "--json"], "", extra_env))
}

/// The (name, verdict, detail) of each check `doctor --json` printed.
fn checks(out: &std::process::Output) -> Vec<(String, String, String)> {
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", text(&out.stderr)));
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["verdict"].as_str().unwrap().to_owned(),
                c["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn find<'a>(checks: &'a [(String, String, String)], name: &str) -> &'a (String, String, String) {
    checks
        .iter()
        .find(|c| c.0 == name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:?}"))
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_state_dir_that_cannot_be_made_is_not_ok() {
    // /proc lets root pass access(2) but refuses mkdir: only a real probe finds out.
    let sb = Sandbox::with_policy(1, "");
    let policy = std::fs::read_to_string(sb.config_path()).unwrap();
    let broken = policy.replacen(
        &format!("state_dir = {:?}", sb.state_dir()),
        "state_dir = \"/proc/gpushare\"",
        1,
    );
    assert_ne!(
        broken, policy,
        "positive control: the state_dir line was replaced"
    );
    std::fs::write(sb.config_path(), broken).unwrap();
    let c = doctor(&sb, &[]);
    let s = find(&c, "state dir");
    assert_eq!(s.1, "fail", "{s:?}");
    assert!(s.2.contains("/proc/gpushare"), "{s:?}");

    // A state dir that can be made: ok, and the probe leaves nothing behind.
    sb.write_config("");
    let c = doctor(&sb, &[]);
    let s = find(&c, "state dir");
    assert_eq!(s.1, "ok", "{s:?}");
    assert!(
        s.2.contains("a probe was created there and removed"),
        "{s:?}"
    );
    assert!(
        !sb.state_dir().exists(),
        "doctor leaves no state dir behind"
    );
}

#[test]
fn programs_that_are_not_what_they_should_be_are_not_ok() {
    let sb = Sandbox::new(1);
    let lib = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib64/libz.so.1",
        "/lib64/libz.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file())
    .expect("libz.so.1 (zlib) is on every Linux");
    // An nvidia-smi that cannot reach the driver, as NVIDIA's prints it (exit 9).
    let smi = sb.path().join("nvidia-smi");
    script(
        &smi,
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\"\nexit 9",
    );
    let log_dir = sb.path().join("a-file");
    std::fs::write(&log_dir, "").unwrap();
    sb.write_config(&format!(
        "[mps]\ncontrol = \"/usr/bin/true\"\n[limit]\nlibrary = {lib:?}\n[timeslice]\nsmi = {smi:?}\n"
    ));
    let policy = std::fs::read_to_string(sb.config_path()).unwrap();
    let moved = policy.replacen(
        &format!("log_file = {:?}", sb.log_path()),
        &format!("log_file = {:?}", log_dir.join("gpushare.log")),
        1,
    );
    assert_ne!(
        moved, policy,
        "positive control: the log_file line was replaced"
    );
    std::fs::write(sb.config_path(), moved).unwrap();
    let c = doctor(&sb, &[]);
    let m = find(&c, "mps control");
    assert_eq!(m.1, "fail", "mps mode is allowed: {m:?}");
    assert!(
        m.2.contains("does not answer as nvidia-cuda-mps-control"),
        "{m:?}"
    );
    let l = find(&c, "limiter");
    assert_eq!(l.1, "fail", "{l:?}");
    assert!(l.2.contains("does not define cuMemAlloc_v2"), "{l:?}");
    let n = find(&c, "nvidia-smi");
    assert_ne!(n.1, "ok", "{n:?}");
    assert!(
        n.2.contains("couldn't communicate with the NVIDIA driver"),
        "{n:?}"
    );
    let f = find(&c, "log file");
    assert_ne!(f.1, "ok", "{f:?}");
    assert!(f.2.contains("cannot be opened for appending"), "{f:?}");

    // Positive controls: the real ones pass.
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    script(&smi, "echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'");
    sb.write_config(&format!(
        "[limit]\nlibrary = {limiter:?}\n[timeslice]\nsmi = {smi:?}\n"
    ));
    let c = doctor(&sb, &[]);
    assert_eq!(find(&c, "limiter").1, "ok", "{c:?}");
    assert_eq!(find(&c, "nvidia-smi").1, "ok", "{c:?}");
    assert_eq!(find(&c, "log file").1, "ok", "{c:?}");
    if common::require("doctor mps control", &["nvidia-cuda-mps-control"]) {
        assert_eq!(find(&c, "mps control").1, "ok", "{c:?}");
    }
}

#[test]
fn the_next_runtime_is_found_on_path_as_the_runtime_finds_it() {
    let sb = Sandbox::new(1);
    let bin = sb.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    script(&bin.join("my-runc"), "echo 'my-runc version 1.0'");
    sb.write_config("[runtime]\nnext = [\"my-runc\"]\n");
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let c = doctor(&sb, &[("PATH", &path)]);
    let n = find(&c, "next runtime");
    assert_eq!(n.1, "ok", "{n:?}");
    assert!(n.2.contains("my-runc version 1.0"), "{n:?}");
    // Off $PATH it is not found, and doctor says where it looked.
    let c = doctor(&sb, &[]);
    let n = find(&c, "next runtime");
    assert_eq!(n.1, "fail", "{n:?}");
    assert!(n.2.contains("$PATH"), "{n:?}");
}

/// gpushare-runtime's `--version` prints its own line, then the next runtime's answer and exit
/// status. Without a next runtime it exits 1 after its own line: doctor reports that once, as the
/// next runtime's failure, not also as the runtime's.
#[test]
fn a_missing_next_runtime_is_reported_once() {
    let sb = Sandbox::new(1);
    let dir = sb.path().join("install");
    std::fs::create_dir(&dir).unwrap();
    let hook = dir.join("gpushare-hook");
    std::fs::copy(common::hook_bin(), &hook).unwrap();
    // gpushare-runtime as it answers where no next runtime is installed.
    script(
        &dir.join("gpushare-runtime"),
        "echo 'gpushare-runtime version 0.1.0'\necho 'gpushare-runtime: no next runtime found among [\"runc\", \"crun\"] ([runtime] next)' >&2\nexit 1",
    );
    sb.write_config("[runtime]\nnext = [\"no-such-runtime\"]\n");
    let out = std::process::Command::new(&hook)
        .args(["doctor", "--json"])
        .env_clear()
        .envs(sb.env())
        .output()
        .unwrap();
    let c = checks(&out);
    // Positive control: the runtime doctor ran is the one beside this copy of the hook.
    let r = find(&c, "runtime");
    assert!(r.2.contains(&dir.display().to_string()), "{r:?}");
    assert_eq!(r.1, "ok", "{r:?}");
    assert!(r.2.contains("gpushare-runtime version 0.1.0"), "{r:?}");
    let n = find(&c, "next runtime");
    assert_eq!(n.1, "fail", "{n:?}");
    assert!(n.2.contains("no-such-runtime"), "{n:?}");
}

#[test]
fn engines_that_do_not_run_are_said_not_to_run() {
    let sb = Sandbox::new(1);
    let bin = sb.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    // The docker CLI as it answers when dockerd is down (docker 20.10 to 28).
    script(
        &bin.join("docker"),
        "echo null\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?' >&2\nexit 1",
    );
    script(&bin.join("ctr"), "exit 0");
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let sock = sb.path().join("no-containerd.sock");
    let sock = sock.to_str().unwrap();
    let env = [("PATH", path.as_str()), ("CONTAINERD_ADDRESS", sock)];
    let c = doctor(&sb, &env);
    let d = find(&c, "docker daemon");
    assert_eq!(d.1, "warn", "{d:?}");
    assert!(
        d.2.starts_with("docker: not running (Cannot connect"),
        "{d:?}"
    );
    let k = find(&c, "containerd daemon");
    assert_eq!(k.1, "warn", "{k:?}");
    assert!(k.2.contains("not running (no socket at"), "{k:?}");

    // Positive control: a dockerd that answers with our runtime loaded.
    script(
        &bin.join("docker"),
        r#"echo '{"runtimes":{"runc":{"path":"runc"},"gpushare":{"path":"/usr/bin/gpushare-runtime"}},"default":"runc"}'"#,
    );
    let c = doctor(&sb, &env);
    let d = find(&c, "docker daemon");
    assert_eq!(d.1, "ok", "{d:?}");
    assert!(
        d.2.contains("dockerd has loaded runtime \"gpushare\""),
        "{d:?}"
    );
    // The daemon's file check does not warn about what the running dockerd has loaded (it was
    // configured from another file, `configure --path`): never an ok and a warning about one
    // thing.
    let f = find(&c, "docker");
    assert_ne!(f.1, "warn", "{f:?} beside {d:?}");
}

fn mps_spec() -> Value {
    spec(
        json!({"gpu.share": "mps", "gpu.share.cores": "40"}),
        &["NVIDIA_VISIBLE_DEVICES=0"],
    )
}

#[test]
fn a_broken_policy_keeps_status_gc_and_poststop_working_and_doctor_to_the_point() {
    // Its gpushare logs to the host's default files (see `common::host_lock_shared`).
    let _host = common::host_lock_shared();
    if !common::require("broken policy", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let b = sb.bundle("b", &mps_spec());
    let a = FakeContainer::start();
    let st = Sandbox::state_json("ca", a.pid(), &b);
    let out = sb.hook(&["createRuntime"], &st);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sb.status()["gpus"][0]["clients"][0]["id"], "ca");

    // A typo in a table name: the file does not load.
    let good = std::fs::read_to_string(sb.config_path()).unwrap();
    std::fs::write(sb.config_path(), format!("{good}[polcy]\nmax_cores = 50\n")).unwrap();
    let out = sb.hook(&["status", "--json"], "");
    assert!(out.status.success(), "status runs: {}", text(&out.stderr));
    let e = text(&out.stderr);
    assert!(
        e.starts_with("gpushare-hook: warning: config ") && e.contains("unknown field `polcy`"),
        "{e}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["gpus"][0]["clients"][0]["id"], "ca",
        "the live share is shown: {v}"
    );
    let out = sb.hook(&["gc"], "");
    assert!(out.status.success(), "gc runs: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );

    // doctor: the diagnosis and the fix; NVML from the file's [nvml] (no knock-on failure).
    let c = doctor(&sb, &[]);
    let cfg = find(&c, "config");
    assert_eq!(cfg.1, "fail");
    assert!(cfg.2.contains("fix the file"), "{cfg:?}");
    let n = find(&c, "nvml");
    assert_eq!(n.1, "ok", "no spurious NVML failure: {n:?}");
    assert_eq!(find(&c, "gpu 0").1, "ok", "{c:?}");
    assert!(
        !c.iter()
            .any(|c| c.2.contains("run `gpushare-hook configure") && c.2.contains("polcy")),
        "no advice to run configure, which refuses the same file: {c:?}"
    );

    // poststop releases the share (and its daemon) on the broken file.
    let out = sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &b));
    assert!(out.status.success(), "poststop: {}", text(&out.stderr));
    std::fs::write(sb.config_path(), &good).unwrap();
    let st = sb.status();
    assert!(st["gpus"].as_array().unwrap().is_empty(), "released: {st}");
    assert!(common::daemons_under(&sb.state_dir()).is_empty());
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    assert!(
        log.contains("poststop releases with what it could read"),
        "{log}"
    );
}

/// `[runtime] hook` naming a wrapper elsewhere (an operator's script that sets env, then runs
/// gpushare-hook) does not move where doctor looks for gpushare-runtime.
#[test]
fn a_hook_wrapper_elsewhere_does_not_hide_the_runtime() {
    let sb = Sandbox::new(1);
    let wrap = sb.path().join("wrap");
    std::fs::create_dir(&wrap).unwrap();
    let hook = wrap.join("gpushare-hook");
    script(
        &hook,
        &format!("exec {} \"$@\"", common::hook_bin().display()),
    );
    sb.write_config(&format!("[runtime]\nhook = {:?}\n", hook));
    let c = doctor(&sb, &[]);
    let h = find(&c, "hook");
    assert_eq!(h.1, "ok", "the wrapper runs: {h:?}");
    let r = find(&c, "runtime");
    assert_eq!(r.1, "ok", "{r:?}");
    let beside = common::hook_bin().with_file_name("gpushare-runtime");
    assert!(r.2.starts_with(&beside.display().to_string()), "{r:?}");
}

/// The simulated driver is named as what it is: TEST-ONLY, never mistaken for a GPU.
#[test]
fn doctor_says_the_simulated_driver_is_test_only() {
    let sb = Sandbox::new(1);
    let c = doctor(&sb, &[]);
    let n = find(&c, "nvml");
    assert_eq!(
        n.1, "ok",
        "positive control: the simulated NVML answers: {n:?}"
    );
    let d = find(&c, "driver");
    assert_eq!(d.1, "warn", "{d:?}");
    assert!(d.2.starts_with("TEST-ONLY: "), "{d:?}");
    assert!(d.2.contains("libgpushare_simdriver"), "{d:?}");
}

/// doctor checks the file `configure --path` wrote, from configure's record, and does not warn
/// that the usual file lacks gpushare when the file configure wrote has it.
#[test]
fn doctor_checks_what_configure_wrote_wherever_it_wrote_it() {
    let sb = Sandbox::new(1);
    sb.write_config(&format!("[runtime]\nhook = {:?}\n", common::hook_bin()));
    let f = sb.path().join("elsewhere/daemon.json");
    let fs = f.to_str().unwrap();
    let out = sb.hook(&["configure", "docker", "--path", fs], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c = doctor(&sb, &[]);
    let w = find(&c, "docker (configured)");
    assert_eq!(w.1, "ok", "{w:?}");
    assert!(w.2.contains("runs"), "{w:?}");
    let d = find(&c, "docker");
    assert_ne!(d.1, "warn", "{d:?} beside {w:?}");
    // Taken out again: no longer recorded, no longer checked.
    let out = sb.hook(&["configure", "docker", "--path", fs, "--remove"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c = doctor(&sb, &[]);
    assert!(!c.iter().any(|x| x.0 == "docker (configured)"), "{c:?}");
}
