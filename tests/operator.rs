//! What an operator meets with real podman: refusals shown to the user and logged, and a typo
//! in the policy file that stops nothing but the containers that ask (`tests/engines/
//! podman_refusals.sh`).

mod script;

#[test]
fn podman_refusals_are_shown_and_a_broken_policy_passes_plain_containers() {
    script::run_script("podman_refusals.sh");
}

mod common;

use common::{spec, FakeContainer, Sandbox};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One refusal is one log line, written for people: the container, the GPUs and the reason,
/// with no Rust debug text; an acquire's line has plain values.
#[test]
fn each_event_is_one_log_line_for_people() {
    if !common::require("log lines", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let big = sb.bundle(
        "big",
        &spec(
            serde_json::json!({"gpu.share": "mps", "gpu.share.memory": "1000Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("cbig", 1, &big));
    assert_eq!(out.status.code(), Some(1), "positive control: refused");
    // A refusal carried from precreate.
    let out = sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("ccarried", 1, &big),
        &[("GPUSHARE_REFUSED", "gpu.share: carried refusal")],
    );
    assert_eq!(out.status.code(), Some(1));
    let ok = sb.bundle(
        "ok",
        &spec(
            serde_json::json!({"gpu.share": "mps", "gpu.share.memory": "4Gi"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let a = FakeContainer::start();
    let out = sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("cok", a.pid(), &ok),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sb.hook(&["poststop"], &Sandbox::state_json("cok", 0, &ok));
    assert!(out.status.success(), "{}", text(&out.stderr));

    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    for id in ["cbig", "ccarried"] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(id)).collect();
        assert_eq!(lines.len(), 1, "{id}: one line: {log}");
        assert!(lines[0].contains("refused: "), "{id}: {log}");
    }
    // No line repeats the refusal without its container.
    let refusals = log.lines().filter(|l| l.contains("1000.0 GiB")).count();
    assert_eq!(refusals, 1, "{log}");
    let acquired = log.lines().find(|l| l.contains("acquired")).unwrap();
    assert!(
        acquired.contains("container=cok mode=mps gpus=0 memory=4.0 GiB"),
        "{acquired}"
    );
    assert!(
        !log.contains("Some(") && !log.contains("None") && !log.contains("[0]"),
        "debug text in the log: {log}"
    );
}

/// After a create that failed (or was killed half-way), gc names every path it removes.
#[test]
fn gc_reports_everything_it_removed() {
    let sb = Sandbox::new(1);
    sb.write_config("[mps]\ncontrol = \"/bin/false\"\nstart_timeout_seconds = 1\n");
    let b = sb.bundle(
        "b",
        &spec(
            serde_json::json!({"gpu.share": "mps"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let a = FakeContainer::start();
    let out = sb.hook(&["createRuntime"], &Sandbox::state_json("c1", a.pid(), &b));
    assert_eq!(
        out.status.code(),
        Some(1),
        "positive control: the create failed"
    );
    // What a create killed right after making the MPS root leaves: that directory, empty.
    std::fs::create_dir_all(sb.state_dir().join("mps")).unwrap();
    let before: Vec<String> = sb.snapshot().into_iter().map(|(p, _)| p).collect();
    assert!(
        before.contains(&"mps/".to_owned()),
        "positive control: {before:?}"
    );
    let out = sb.hook(&["gc"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    let after: Vec<String> = sb.snapshot().into_iter().map(|(p, _)| p).collect();
    let gone: Vec<&String> = before.iter().filter(|p| !after.contains(p)).collect();
    if gone.is_empty() {
        assert_eq!(report, "nothing to do\n");
    }
    for p in gone {
        let top = p.trim_end_matches('/');
        let named = report.lines().any(|l| {
            let full = sb.state_dir().join(top);
            full.ancestors()
                .take(top.matches('/').count() + 1)
                .any(|a| l.contains(&a.display().to_string()))
        });
        assert!(named, "{p} removed without a word: {report}");
    }
}
