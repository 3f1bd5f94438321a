//! `gpushare-hook cdi generate` and the hook's `--profile` (the CDI device's request), on the
//! TEST-ONLY simulated driver. The generated spec is validated against a CDI JSON schema
//! written by hand from the published specification (tests/fixtures/cdi/schema.json).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

const VENV_PYTHON: &str = "/var/cache/gpushare-engines/venv/bin/python";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cdi")
        .join(name)
}

/// Runs the schema validator on `files`; `None` (after a loud SKIPPED, or a panic under CI)
/// when the validator's Python environment is missing.
fn validate(files: &[&Path]) -> Option<(bool, String)> {
    if !Path::new(VENV_PYTHON).exists() {
        let msg = format!(
            "SKIPPED: CDI schema check: {VENV_PYTHON} missing; run scripts/install-deps.sh"
        );
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("\n******** {msg} ********\n");
        return None;
    }
    let out = Command::new(VENV_PYTHON)
        .arg(fixture("validate.py"))
        .args(files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), text))
}

fn text(out: &std::process::Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const PROFILES: &str = "[profiles.small]\nmode = \"mps\"\ncores = 25\nmemory = \"1Gi\"\n\
                        [profiles.capped]\nmode = \"limit\"\nmemory = \"512Mi\"\n";

#[test]
fn generate_writes_a_valid_spec_once_and_a_second_run_changes_nothing() {
    let sb = common::Sandbox::with_policy(1, PROFILES);
    let dir = sb.path().join("cdi");
    let out = sb.hook(&["cdi", "generate", "--output", dir.to_str().unwrap()], "");
    assert!(out.status.success(), "{}", text(&out));
    let first = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(first.contains(": written"), "{first}");
    for d in ["mps", "timeslice", "limit", "small", "capped"] {
        assert!(
            first.contains(&format!("gpushare.io/share={d}")),
            "{d}: {first}"
        );
    }
    let path = dir.join("gpushare.io-share.json");
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "gpushare.io/share");
    // The hooks run this very hook binary with the sandbox's policy handed on.
    let small = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "small")
        .unwrap();
    let hook = &small["containerEdits"]["hooks"][0];
    assert_eq!(
        hook["args"],
        json!(["gpushare-hook", "createRuntime", "--profile", "small"])
    );
    assert_eq!(
        hook["env"][0],
        format!("GPUSHARE_CONFIG={}", sb.config_path().display())
    );

    let again = sb.hook(
        &[
            "cdi",
            "generate",
            "--output",
            dir.to_str().unwrap(),
            "--json",
        ],
        "",
    );
    assert!(again.status.success(), "{}", text(&again));
    let report: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report["outcome"], "unchanged", "{report}");

    let Some((ok, why)) = validate(&[&path]) else {
        return;
    };
    assert!(ok, "the generated spec fails the CDI schema: {why}");
    // Negative control: the validator rejects what the specification does not allow.
    let mut broken = spec.clone();
    broken["devices"][0]["containerEdits"]["hooks"][0]["hookName"] = json!("createruntime");
    broken["devices"][1]["name"] = json!("-bad");
    let bad = sb.path().join("broken.json");
    std::fs::write(&bad, serde_json::to_vec(&broken).unwrap()).unwrap();
    let (ok, why) = validate(&[&bad]).unwrap();
    assert!(
        !ok && why.contains("createruntime") && why.contains("-bad"),
        "{why}"
    );
}

#[test]
fn a_bad_profile_writes_nothing_and_names_the_key() {
    let sb = common::Sandbox::with_policy(1, "[profiles.big]\nmode = \"mps\"\ncores = 200\n");
    let dir = sb.path().join("cdi");
    let out = sb.hook(&["cdi", "generate", "--output", dir.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[profiles.big] cores"), "{err}");
    assert!(!dir.exists(), "nothing written");
}

/// A bundle whose container has GPU 0 as a device node (as NVIDIA's CDI device gives it), the
/// CDI device's env and hook entry for `profile`, and `annotations`.
fn cdi_bundle(sb: &common::Sandbox, name: &str, profiles: &[&str], annotations: Value) -> PathBuf {
    let mut spec = common::spec(annotations, &[]);
    let env: Vec<String> = profiles
        .iter()
        .map(|p| format!("GPUSHARE_PROFILE={p}"))
        .collect();
    spec["process"]["env"] = json!(env);
    spec["linux"] =
        json!({"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]});
    let hooks: Vec<Value> = profiles
        .iter()
        .map(|p| json!({"path": common::hook_bin(), "args": ["gpushare-hook", "createRuntime", "--profile", p]}))
        .collect();
    spec["hooks"] = json!({"createRuntime": hooks});
    sb.bundle(name, &spec)
}

#[test]
fn the_hook_takes_the_request_from_its_profile() {
    let sb = common::Sandbox::with_policy(1, PROFILES);
    let b = cdi_bundle(&sb, "small", &["small"], json!({}));
    let out = sb.hook(
        &["createRuntime", "--dry-run", "--profile", "small"],
        &common::Sandbox::state_json("cdi-small", 1, &b),
    );
    assert!(out.status.success(), "{}", text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&plan["mode"], &plan["cores"], &plan["memory"]),
        (&json!("mps"), &json!(25), &json!(1u64 << 30)),
        "{plan}"
    );
    assert_eq!(plan["gpus"][0]["uuid"], common::Sandbox::uuid(0));
    // Negative control: the same bundle without --profile asks for nothing.
    let out = sb.hook(
        &["createRuntime", "--dry-run"],
        &common::Sandbox::state_json("cdi-small", 1, &b),
    );
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        text(&out)
    );
    assert!(!sb.state_dir().exists(), "dry runs wrote state");
}

#[test]
fn profile_refusals_say_what_to_change() {
    let sb = common::Sandbox::with_policy(1, PROFILES);
    let rows: [(&str, Vec<&str>, Value, &str, &str); 3] = [
        (
            "an annotation that contradicts the device",
            vec!["small"],
            json!({"gpu.share": "limit"}),
            "small",
            "gpu.share=\"limit\" but its CDI device gpushare.io/share=small sets gpu.share=\"mps\"",
        ),
        (
            "two gpushare devices",
            vec!["small", "capped"],
            json!({}),
            "small",
            "several gpushare devices (small, capped)",
        ),
        (
            "a profile the policy no longer has",
            vec!["gone"],
            json!({}),
            "gone",
            "names no profile of this node's policy (known: mps, timeslice, limit, capped, small)",
        ),
    ];
    for (what, devices, annotations, profile, line) in rows {
        let b = cdi_bundle(&sb, profile, &devices, annotations);
        let out = sb.hook(
            &["createRuntime", "--profile", profile],
            &common::Sandbox::state_json("cdi-refused", 1, &b),
        );
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(line), "{what}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
        assert!(
            !sb.state_dir().join("gpus").exists(),
            "{what}: state left as it was"
        );
    }
}

#[test]
fn status_lists_the_profiles_and_why_one_is_refused() {
    let sb = common::Sandbox::with_policy(
        1,
        "[policy]\nmax_cores = 50\ndefault_cores = 50\n\
         [profiles.small]\nmode = \"mps\"\ncores = 25\nmemory = \"1Gi\"\n\
         [profiles.big]\nmode = \"mps\"\ncores = 80\n",
    );
    let out = sb.hook(&["status"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("profiles (CDI gpushare.io/share=<name>): mps, timeslice, limit, small (mps, cores 25%, memory 1.0 GiB)"),
        "{text}"
    );
    assert!(
        text.contains("profile big refused: profile big is not a request"),
        "{text}"
    );
    assert!(text.contains("above"), "{text}");
    let json = sb.status();
    let names: Vec<&str> = json["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mps", "timeslice", "limit", "big", "small"]);
}

/// The gpushare createRuntime hook entries of an edited config: (args, env).
fn our_entries(v: &Value) -> Vec<(Vec<String>, Vec<String>)> {
    let strings = |a: &Value| -> Vec<String> {
        a.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    v["hooks"]["createRuntime"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["args"][0] == "gpushare-hook" && h["args"][1] == "createRuntime")
        .map(|h| (strings(&h["args"]), strings(&h["env"])))
        .collect()
}

#[test]
fn the_spec_edit_composes_a_cdi_device_with_annotations() {
    let t = tempfile::tempdir().unwrap();
    let next = t.path().join("fake-runc");
    std::fs::write(&next, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sb = common::Sandbox::with_policy(
        1,
        &format!(
            "{PROFILES}[mps]\nisolation = \"group\"\n[runtime]\nnext = [{:?}]\n",
            next.display().to_string()
        ),
    );
    let runtime = common::hook_bin().with_file_name("gpushare-runtime");
    // (what, device, annotations, Ok(env entry the edit sets) or Err(words of the refusal))
    type Row = (
        &'static str,
        &'static str,
        Value,
        Result<&'static str, &'static str>,
    );
    let rows: [Row; 6] = [
        (
            "a memory cap refines the mps device",
            "mps",
            json!({"gpu.share.memory": "8Gi"}),
            Ok("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"),
        ),
        (
            "cores refine the mps device",
            "mps",
            json!({"gpu.share": "mps", "gpu.share.cores": "40"}),
            Ok("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"),
        ),
        (
            "a group refines a profile, which the annotations repeat",
            "small",
            json!({"gpu.share": "mps", "gpu.share.cores": "25", "gpu.share.group": "team"}),
            Ok("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"),
        ),
        (
            "another mode",
            "mps",
            json!({"gpu.share": "limit"}),
            Err("gpu.share=\"limit\" but its CDI device gpushare.io/share=mps sets gpu.share=\"mps\""),
        ),
        (
            "another cap than the profile's",
            "small",
            json!({"gpu.share.memory": "2Gi"}),
            Err("gpu.share.memory=\"2Gi\" but its CDI device gpushare.io/share=small sets gpu.share.memory=\"1Gi\""),
        ),
        (
            "a refinement above the policy",
            "mps",
            json!({"gpu.share.cores": "101"}),
            Err("gpu.share.cores"),
        ),
    ];
    for (i, (what, device, annotations, want)) in rows.into_iter().enumerate() {
        let b = cdi_bundle(&sb, &format!("b{i}"), &[device], annotations);
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
        config["root"]["path"] = json!(b.join("rootfs"));
        std::fs::write(b.join("config.json"), config.to_string()).unwrap();

        // podman: precreate, with the package's hooks installed.
        let out = sb.hook(&["precreate"], &config.to_string());
        assert!(out.status.success(), "{what}: {}", text(&out));
        let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
        let entries = our_entries(&edited);
        let refused = entries
            .iter()
            .flat_map(|(_, env)| env.iter())
            .find_map(|e| e.strip_prefix("GPUSHARE_REFUSED="));
        // gpushare-runtime (Docker's and containerd's CDI): the same edit of the bundle.
        let run = Command::new(&runtime)
            .args([
                "create",
                "--bundle",
                b.to_str().unwrap(),
                &format!("cdi-{i}"),
            ])
            .env_clear()
            .envs(sb.env())
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap();
        let run_err = String::from_utf8_lossy(&run.stderr).into_owned();
        match want {
            Ok(env) => {
                assert_eq!(refused, None, "{what}: refused: {edited}");
                assert_eq!(
                    entries.len(),
                    1,
                    "{what}: the device's entry only: {entries:?}"
                );
                let (args, henv) = &entries[0];
                assert_eq!(args[2..], ["--profile", device], "{what}");
                assert!(
                    henv.iter().any(|e| e.starts_with("GPUSHARE_RESERVATION=")),
                    "{what}: the device's entry carries the reservation: {henv:?}"
                );
                let penv = edited["process"]["env"].to_string();
                assert!(penv.contains(env), "{what}: {penv}");
                assert!(edited["mounts"].to_string().contains("/dev/shm"), "{what}");
                assert!(run.status.success(), "{what}: {run_err}");
                let v: Value =
                    serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
                assert!(v["process"]["env"].to_string().contains(env), "{what}: {v}");
                assert_eq!(our_entries(&v).len(), 1, "{what}: {v}");
            }
            Err(words) => {
                let line = refused.unwrap_or_else(|| panic!("{what}: not refused: {edited}"));
                assert!(line.contains(words), "{what}: {line}");
                assert!(!run.status.success(), "{what}: gpushare-runtime served it");
                assert!(run_err.contains(words), "{what}: {run_err}");
                assert_eq!(run_err.trim_end().lines().count(), 1, "{what}: {run_err}");
            }
        }
    }
    // The edited container starts: its device's hook takes the request and the reservation.
    let b = cdi_bundle(&sb, "run", &["mps"], json!({"gpu.share.memory": "8Gi"}));
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    config["root"]["path"] = json!(b.join("rootfs"));
    let out = sb.hook(&["precreate"], &config.to_string());
    let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
    std::fs::write(b.join("config.json"), edited.to_string()).unwrap();
    let (args, henv) = our_entries(&edited).remove(0);
    let c = common::FakeContainer::start();
    let reservation: Vec<(&str, &str)> = henv.iter().filter_map(|e| e.split_once('=')).collect();
    let out = sb.hook_env(
        &args[1..].iter().map(String::as_str).collect::<Vec<_>>(),
        &common::Sandbox::state_json("cdi-run", c.pid(), &b),
        &reservation,
    );
    assert!(out.status.success(), "{}", text(&out));
    let st = sb.status();
    let client = &st["gpus"][0]["clients"][0];
    assert_eq!(
        (&client["id"], &client["cap"]["bytes"]),
        (&json!("cdi-run"), &json!(8u64 << 30)),
        "{st}"
    );
    assert!(out.stderr.is_empty() || out.status.success());
    let out = sb.hook(
        &["poststop"],
        &common::Sandbox::state_json("cdi-run", 0, &b),
    );
    assert!(out.status.success(), "{}", text(&out));
}
