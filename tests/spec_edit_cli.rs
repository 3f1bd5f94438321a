//! The spec edit through its two binaries, without an engine: `gpushare-hook precreate` (config
//! on stdin, config on stdout) and `gpushare-runtime` on a bundle with `[runtime] next` pointing
//! at a stand-in that records its argv.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin(name: &str) -> PathBuf {
    match name {
        "hook" => PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook")),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_gpushare-runtime")),
    }
}

struct World {
    dir: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        common::clean_up_under(self.dir.path());
    }
}

impl World {
    fn new(next: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sim = bin("hook")
            .parent()
            .unwrap()
            .join("libgpushare_simdriver.so");
        assert!(
            sim.exists(),
            "{} is missing: run `cargo build --workspace` before `cargo test`",
            sim.display()
        );
        let limiter = dir.path().join("libgpushare_limiter.so");
        std::fs::write(&limiter, b"not really a library").unwrap();
        std::fs::create_dir(dir.path().join("sim")).unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "state_dir = {:?}\nlog_file = {:?}\n[nvml]\nlibrary = {:?}\n[limit]\nlibrary = {:?}\n[runtime]\nnext = [{:?}]\nhook = \"/usr/bin/gpushare-hook\"\n",
                dir.path().join("state"),
                dir.path().join("log"),
                sim,
                limiter,
                next
            ),
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn run(&self, which: &str, args: &[&str], stdin: &[u8], cwd: &Path) -> Output {
        let mut child = Command::new(bin(which))
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("GPUSHARE_CONFIG", self.path().join("config.toml"))
            .env("GPUSHARE_SIM_STATE", self.path().join("sim"))
            .env("GPUSHARE_SIM_DEVICES", "81920,81920")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }
}

const MPS: &str = r#"{"ociVersion":"1.0.2","zz-unknown":{"keep":true},"process":{"args":["sh"],"env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=1"]},"root":{"path":"rootfs"},"annotations":{"gpu.share":"mps","gpu.share.cores":"40"}}"#;

#[test]
fn precreate_edits_or_returns_the_bytes_unchanged() {
    let w = World::new("runc");
    // Rows: (description, input, edited?)
    let rows: &[(&str, &[u8], bool)] = &[
        (
            "no request, odd formatting kept byte for byte",
            b"{ \"ociVersion\" : \"1.0.2\",\n  \"process\":{\"env\":[\"A=1\"]} }\n",
            false,
        ),
        (
            "share none",
            br#"{"annotations":{"gpu.share":"none"}}"#,
            false,
        ),
        ("mps", MPS.as_bytes(), true),
    ];
    for (what, input, edited) in rows {
        let out = w.run("hook", &["precreate"], input, w.path());
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !edited {
            assert_eq!(out.stdout, *input, "{what}");
            continue;
        }
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["zz-unknown"]["keep"], true, "{what}");
        let env: Vec<&str> = v["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(
            env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
            "{what}: {env:?}"
        );
        assert!(
            env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"),
            "{what}: {env:?}"
        );
        let dests: Vec<&str> = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(dests, ["/tmp/nvidia-mps", "/dev/shm"], "{what}");
        // The mount sources exist before the runtime mounts them.
        for m in v["mounts"].as_array().unwrap() {
            assert!(
                Path::new(m["source"].as_str().unwrap()).is_dir(),
                "{what}: {m}"
            );
        }
        let hook = &v["hooks"]["createRuntime"][0];
        assert_eq!(hook["path"], "/usr/bin/gpushare-hook");
        assert_eq!(
            hook["env"][1],
            format!("GPUSHARE_CONFIG={}", w.path().join("config.toml").display())
        );
        // Editing the edited config changes nothing.
        let again = w.run("hook", &["precreate"], &out.stdout, w.path());
        assert_eq!(again.stdout, out.stdout, "{what}: second edit");
        // ... and reserves under the same key: one reservation, not two.
        let mut reserved = Vec::new();
        for e in std::fs::read_dir(w.path().join("state/gpus")).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "json") {
                let rec: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                for d in rec["domains"].as_object().unwrap().values() {
                    reserved.extend(d["reserved"].as_object().unwrap().keys().cloned());
                }
            }
        }
        assert_eq!(reserved.len(), 1, "{what}: {reserved:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&reserved[0]),
            "{what}"
        );
    }
    // Undo the shm mount made by the mps row.
    for e in std::fs::read_dir(w.path().join("state/mps")).unwrap() {
        let _ = nix::mount::umount2(
            &e.unwrap().path().join("shm"),
            nix::mount::MntFlags::MNT_DETACH,
        );
    }
}

#[test]
fn precreate_carries_refusals_to_the_create_runtime_hook() {
    // podman drops a precreate hook's stderr: a refusal comes back as the config with a first
    // createRuntime entry that fails with the one-line message (runc shows its stderr).
    let w = World::new("runc");
    let rows: &[(&str, &str, &str)] = &[
        (
            "unknown mode",
            r#"{"annotations":{"gpu.share":"warp"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#,
            "unknown mode",
        ),
        ("no gpu", r#"{"annotations":{"gpu.share":"mps"}}"#, "no GPU"),
    ];
    for (what, input, want) in rows {
        let out = w.run("hook", &["precreate"], input.as_bytes(), w.path());
        assert_eq!(out.status.code(), Some(0), "{what}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let entry = &v["hooks"]["createRuntime"][0];
        assert_eq!(entry["args"][1], "createRuntime", "{what}");
        let refused = entry["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e.as_str()?.strip_prefix("GPUSHARE_REFUSED="))
            .next()
            .unwrap_or_else(|| panic!("{what}: no refusal in {entry}"));
        assert!(
            refused.contains(want) && !refused.contains('\n'),
            "{what}: {refused}"
        );
    }
    // Input that is not a config cannot carry anything: refused with one line.
    let out = w.run("hook", &["precreate"], b"{gpu.share", w.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a valid OCI config"), "{err}");
    assert!(!w.path().join("state/containers").exists());
}

#[test]
fn runtime_wrapper_edits_the_bundle_and_execs_next_with_argv_unchanged() {
    let t = tempfile::tempdir().unwrap();
    let next = t.path().join("fake-runc");
    let argv_file = t.path().join("argv");
    std::fs::write(
        &next,
        format!("#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > {}\necho \"guard=$GPUSHARE_RUNTIME_WRAPPED\" >> {}\n", argv_file.display(), argv_file.display()),
    )
    .unwrap();
    std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let w = World::new(next.to_str().unwrap());
    let bundle = w.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    common::glibc_rootfs(&bundle.join("rootfs"));
    let limit = r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0","LD_PRELOAD=/mine.so"]},"root":{"path":"rootfs"},"annotations":{"gpu.share":"limit","gpu.share.memory":"2Gi"}}"#;
    std::fs::write(bundle.join("config.json"), limit).unwrap();
    let b = bundle.to_str().unwrap();
    let args = [
        "--root",
        "/r",
        "--log",
        "/dev/null",
        "create",
        "--bundle",
        b,
        "--pid-file",
        "/p",
        "c-7",
    ];
    let out = w.run("runtime", &args, b"", w.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let argv = std::fs::read_to_string(&argv_file).unwrap();
    let mut want: Vec<String> = vec![next.display().to_string()];
    want.extend(args.iter().map(|s| s.to_string()));
    // The loop guard names this very call.
    want.push(format!(
        "guard=gpushare-runtime\u{1f}{}",
        args.join("\u{1f}")
    ));
    assert_eq!(argv.lines().collect::<Vec<_>>(), want);
    let v: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let env = v["process"]["env"].to_string();
    assert!(
        env.contains("LD_PRELOAD=/mine.so:/usr/local/gpushare/libgpushare_limiter.so"),
        "{env}"
    );
    assert!(
        env.contains("CUDA_DEVICE_MEMORY_LIMIT_0=2147483648"),
        "{env}"
    );
    assert!(
        env.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/gpushare/shared/cache"),
        "{env}"
    );
    let cdir = w.path().join("state/containers/c-7");
    assert_eq!(
        std::fs::read_to_string(cdir.join("ld.so.preload")).unwrap(),
        "/usr/local/gpushare/libgpushare_limiter.so\n"
    );
    assert!(std::fs::read_to_string(cdir.join("limits"))
        .unwrap()
        .contains("CUDA_DEVICE_MEMORY_LIMIT_0=2147483648"));
    assert!(cdir.join("shared").is_dir());

    // Other commands go straight through, config untouched.
    let before = std::fs::read(bundle.join("config.json")).unwrap();
    let out = w.run("runtime", &["delete", "--force", "c-7"], b"", &bundle);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(&argv_file).unwrap().lines().nth(1),
        Some("delete")
    );
    assert_eq!(std::fs::read(bundle.join("config.json")).unwrap(), before);

    // A container id that cannot be a file name is refused before anything is written.
    let out = w.run("runtime", &["create", "--bundle", b, "../x"], b"", w.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a safe name"));
}

#[test]
fn broken_policy_fails_only_containers_that_ask() {
    // Its gpushare logs to the host's default files (see `common::host_lock_shared`).
    let _host = common::host_lock_shared();
    let w = World::new("runc");
    std::fs::write(w.path().join("config.toml"), "state_dir = [not toml").unwrap();
    let bundle = w.path().join("b");
    std::fs::create_dir_all(&bundle).unwrap();
    let b = bundle.to_str().unwrap();
    // A container that asks for sharing: refused, naming the policy file.
    std::fs::write(bundle.join("config.json"), MPS).unwrap();
    let out = w.run("runtime", &["create", "--bundle", b, "c1"], b"", w.path());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("gpushare-runtime: config ") && err.contains("not valid TOML"),
        "{err}"
    );
    // Other commands reach the next runtime (runc answers, not the wrapper).
    let out = w.run(
        "runtime",
        &["state", "gpushare-no-such-container"],
        b"",
        w.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("gpushare-runtime:"), "{err}");
    assert!(
        err.contains("does not exist") || err.contains("not exist"),
        "{err}"
    );
}

/// What one entry point made of a config: the memory cap it planned or edited in, or its error.
fn memory_seen(out: &Output, edited: Option<&[u8]>) -> Result<u64, String> {
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.lines().count(), 1, "{err}");
        return Err(err);
    }
    let bytes = edited.unwrap_or(&out.stdout).to_vec();
    // Deeply nested documents need a deep stack to parse and drop.
    let (memory, env) = std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || {
            let mut de = serde_json::Deserializer::from_slice(&bytes);
            de.disable_recursion_limit();
            let v: Value = serde::Deserialize::deserialize(&mut de).unwrap();
            // precreate carries a refusal to the createRuntime hook in the config it prints.
            let refused = v["hooks"]["createRuntime"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|h| h["env"].as_array().cloned().unwrap_or_default())
                .find_map(|e| Some(e.as_str()?.strip_prefix("GPUSHARE_REFUSED=")?.to_owned()));
            if let Some(r) = refused {
                return (None, Value::String(r));
            }
            (v.get("memory").cloned(), v["process"]["env"].clone())
        })
        .unwrap()
        .join()
        .unwrap();
    if let Value::String(refusal) = env {
        return Err(refusal);
    }
    if let Some(m) = memory {
        return Ok(m.as_u64().unwrap());
    }
    let env = env.as_array().unwrap();
    let cap = env
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_0="))
        .unwrap_or_else(|| panic!("no memory cap in {env:?}"));
    Ok(cap.parse().unwrap())
}

#[test]
fn every_entry_point_reads_a_config_as_runc_does() {
    let t = tempfile::tempdir().unwrap();
    let next = t.path().join("fake-runc");
    std::fs::write(&next, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let w = World::new(next.to_str().unwrap());
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let env = r#"{"env":["NVIDIA_VISIBLE_DEVICES=0"]}"#;
    let ann = r#"{"gpu.share":"limit","gpu.share.memory":"2Gi"}"#;
    // Rows: (what, config, Ok(memory cap) or Err(part of the one-line message)).
    let rows: Vec<(&str, String, Result<u64, &str>)> = vec![
        (
            "9,999 nested arrays in an unknown member (Go's 10,000 levels)",
            format!(
                r#"{{"x-deep":{},"process":{env},"annotations":{ann}}}"#,
                nested(9_999)
            ),
            Ok(2 << 30),
        ),
        (
            "10,000 nested arrays in an unknown member (past Go's limit)",
            format!(
                r#"{{"x-deep":{},"process":{env},"annotations":{ann}}}"#,
                nested(10_000)
            ),
            Err("deeper than 10000 levels"),
        ),
        (
            "annotations twice: merged",
            format!(
                r#"{{"annotations":{{"gpu.share":"limit"}},"process":{env},"annotations":{{"gpu.share.memory":"3Gi"}}}}"#
            ),
            Ok(3 << 30),
        ),
        (
            "annotations twice: the later value wins",
            format!(
                r#"{{"annotations":{ann},"process":{env},"annotations":{{"gpu.share.memory":"4Gi"}}}}"#
            ),
            Ok(4 << 30),
        ),
        (
            "process twice: merged, env from the first",
            format!(r#"{{"process":{env},"annotations":{ann},"process":{{"args":["sh"]}}}}"#),
            Ok(2 << 30),
        ),
        (
            "process twice: the later env replaces",
            format!(r#"{{"process":{{"env":["A=1"]}},"annotations":{ann},"process":{env}}}"#),
            Ok(2 << 30),
        ),
        (
            "field names in another case",
            format!(r#"{{"Process":{{"ENV":["NVIDIA_VISIBLE_DEVICES=0"]}},"ANNOTATIONS":{ann}}}"#),
            Ok(2 << 30),
        ),
        (
            "trailing bytes after the document",
            format!(r#"{{"process":{env},"annotations":{ann}}} trailing"#),
            Ok(2 << 30),
        ),
        (
            "annotations of the wrong type",
            format!(r#"{{"process":{env},"annotations":["gpu.share"]}}"#),
            Err("not a valid OCI config"),
        ),
    ];
    let bundle = w.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    common::glibc_rootfs(&bundle.join("rootfs"));
    let b = bundle.to_str().unwrap();
    for (i, (what, config, want)) in rows.into_iter().enumerate() {
        let config = config.replace(r#""process":"#, r#""root":{"path":"rootfs"},"process":"#);
        std::fs::write(bundle.join("config.json"), &config).unwrap();
        let state = format!(
            r#"{{"ociVersion":"1.0.2","id":"c{i}","status":"creating","pid":1,"bundle":"{b}"}}"#
        );
        let hook = w.run(
            "hook",
            &["createRuntime", "--dry-run"],
            state.as_bytes(),
            w.path(),
        );
        let pre = w.run("hook", &["precreate"], config.as_bytes(), w.path());
        let id = format!("c{i}");
        let wrap = w.run("runtime", &["create", "--bundle", b, &id], b"", w.path());
        let edited = std::fs::read(bundle.join("config.json")).unwrap();
        let seen = [
            ("createRuntime", memory_seen(&hook, None)),
            ("precreate", memory_seen(&pre, None)),
            ("runtime", memory_seen(&wrap, Some(&edited))),
        ];
        for (entry, got) in &seen {
            match (got, &want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{what}: {entry}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "{what}: {entry}: {g}"),
                _ => panic!("{what}: {entry}: got {got:?}, want {want:?}"),
            }
        }
        if want.is_ok() {
            // The edit keeps the unknown member, as deep as it was.
            let v = String::from_utf8_lossy(&edited);
            assert_eq!(
                v.contains("x-deep"),
                config.contains("x-deep"),
                "{what}: unknown member kept"
            );
            if config.contains("x-deep") {
                assert!(v.contains(&nested(9_999)), "{what}: depth kept");
            }
        }
    }
}

#[test]
fn a_failed_create_leaves_no_per_container_directory() {
    let t = tempfile::tempdir().unwrap();
    let next = t.path().join("fake-runc");
    let log = t.path().join("next.log");
    // Exits with $NEXT_RC; records its blocked-signal mask; on SIGTERM records it and exits 143
    // (next.log.trap says the handler is in place).
    std::fs::write(
        &next,
        format!(
            "#!/bin/sh\ngrep SigBlk /proc/self/status > {log}\ntrap 'echo TERM >> {log}; kill $! 2>/dev/null; exit 143' TERM\ntouch {log}.trap\n\
             [ -n \"$NEXT_SLEEP\" ] && {{ sleep \"$NEXT_SLEEP\" & wait $!; }}\necho 'next says no' >&2\nexit $(cat {rc})\n",
            log = log.display(),
            rc = t.path().join("rc").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let w = World::new(next.to_str().unwrap());
    let bundle = w.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    common::glibc_rootfs(&bundle.join("rootfs"));
    let limit = r#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"root":{"path":"rootfs"},"annotations":{"gpu.share":"limit","gpu.share.memory":"2Gi"}}"#;
    let b = bundle.to_str().unwrap();
    let cdir = |id: &str| w.path().join("state/containers").join(id);
    // Rows: (what, next's exit status, directory there before, directory there after).
    let rows: &[(&str, &str, bool, bool)] = &[
        ("create fails", "1", false, false),
        ("create succeeds", "0", false, true),
        ("create fails, directory already there", "1", true, true),
    ];
    for (i, (what, rc, before, after)) in rows.iter().enumerate() {
        std::fs::write(bundle.join("config.json"), limit).unwrap();
        std::fs::write(t.path().join("rc"), rc).unwrap();
        let id = format!("x{i}");
        if *before {
            std::fs::create_dir_all(cdir(&id)).unwrap();
        }
        let out = w.run("runtime", &["create", "--bundle", b, &id], b"", w.path());
        assert_eq!(out.status.code(), Some(rc.parse().unwrap()), "{what}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.trim(),
            "next says no",
            "{what}: the next runtime's own stderr only"
        );
        assert_eq!(cdir(&id).exists(), *after, "{what}");
        let blocked = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            blocked.trim(),
            "SigBlk:\t0000000000000000",
            "{what}: the next runtime starts with no signal blocked"
        );
    }
    // A signal sent to the wrapper reaches the next runtime, whose status becomes the wrapper's.
    std::fs::write(bundle.join("config.json"), limit).unwrap();
    std::fs::write(t.path().join("rc"), "0").unwrap();
    let trap = log.with_extension("log.trap");
    let _ = std::fs::remove_file(&trap); // left by the runs above
    let mut child = Command::new(bin("runtime"))
        .args(["create", "--bundle", b, "x9"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("GPUSHARE_CONFIG", w.path().join("config.toml"))
        .env("GPUSHARE_SIM_STATE", w.path().join("sim"))
        .env("GPUSHARE_SIM_DEVICES", "81920,81920")
        .env("NEXT_SLEEP", "30")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !trap.exists() || !cdir("x9").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after 20s waiting for the next runtime to install its TERM handler ({})",
            trap.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert!(std::fs::read_to_string(&log).unwrap().contains("TERM"));
    assert!(
        !cdir("x9").exists(),
        "a create ended by a signal leaves nothing"
    );
}
