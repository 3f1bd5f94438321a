//! `gpushare-hook metrics`: the exposition passes `promtool check metrics` and names each
//! container with its Kubernetes labels, mode, domain, caps and backend; the node's counters
//! (requests, refusals by reason, daemon starts, the createRuntime histogram) come from the
//! hooks that ran before, and every event is a line of the event log.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{spec, FakeContainer, Sandbox};
use serde_json::json;

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The sample line of `name` whose labels include every `label="value"` of `want`.
fn sample<'a>(text: &'a str, name: &str, want: &[&str]) -> Option<&'a str> {
    text.lines().find(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            && want.iter().all(|w| l.contains(w))
    })
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn promtool_rejects_what_it_should() {
    // Positive control: promtool really lints (a counter without `_total` fails).
    if !common::require("promtool control", &["promtool"]) {
        return;
    }
    let (good, said) = promtool("# HELP x_seconds Bad.\n# TYPE x_seconds counter\nx_seconds 1\n");
    assert!(!good, "promtool accepted a badly named counter: {said}");
}

#[test]
fn metrics_pass_promtool_and_describe_each_share() {
    if !common::require("metrics", &["promtool", "nvidia-cuda-mps-control"]) {
        return;
    }
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    let sb = Sandbox::with_policy(2, &format!("[limit]\nlibrary = {limiter:?}\n"));
    // A limit container on GPU 0, with the names containerd's CRI plugin gives.
    let bl = sb.bundle(
        "l",
        &spec(
            json!({"gpu.share": "limit", "gpu.share.memory": "1Gi",
                   "io.kubernetes.cri.sandbox-namespace": "ml",
                   "io.kubernetes.cri.sandbox-name": "train-0",
                   "io.kubernetes.cri.container-name": "worker"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    // An MPS container on GPU 1, with the kubelet's names.
    let bm = sb.bundle(
        "m",
        &spec(
            json!({"gpu.share": "mps", "gpu.share.memory": "4Gi", "gpu.share.cores": "50",
                   "io.kubernetes.pod.namespace": "web",
                   "io.kubernetes.pod.name": "infer-1",
                   "io.kubernetes.container.name": "server"}),
            &["NVIDIA_VISIBLE_DEVICES=1"],
        ),
    );
    // Asks for mps on GPU 0, which serves limit: refused (busy).
    let bb = sb.bundle(
        "b",
        &spec(json!({"gpu.share": "mps"}), &["NVIDIA_VISIBLE_DEVICES=0"]),
    );
    // Asks for nothing: not counted.
    let bn = sb.bundle("n", &spec(json!({}), &[]));
    let (l, m, b, n) = (
        FakeContainer::start(),
        FakeContainer::start(),
        FakeContainer::start(),
        FakeContainer::start(),
    );
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cl", l.pid(), &bl)));
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cm", m.pid(), &bm)));
    let refused = sb.hook(&["createRuntime"], &Sandbox::state_json("cb", b.pid(), &bb));
    assert!(
        !refused.status.success(),
        "the busy request was not refused"
    );
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cn", n.pid(), &bn)));

    let out = sb.hook(&["metrics"], "");
    ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    let (good, said) = promtool(&text);
    assert!(good, "promtool check metrics failed: {said}\n{text}");

    let g0 = Sandbox::uuid(0);
    let g1 = Sandbox::uuid(1);
    let gpu0 = format!("gpu=\"{g0}\"");
    let gpu1 = format!("gpu=\"{g1}\"");
    let line = |name: &str, want: &[&str]| {
        sample(&text, name, want).unwrap_or_else(|| panic!("no {name} {want:?} in\n{text}"))
    };
    // Per container.
    line(
        "gpushare_container_info",
        &[
            r#"id="cl""#,
            &gpu0,
            r#"namespace="ml""#,
            r#"pod="train-0""#,
            r#"container="worker""#,
            r#"mode="limit""#,
            r#"backend="limiter""#,
        ],
    );
    line(
        "gpushare_container_info",
        &[
            r#"id="cm""#,
            &gpu1,
            r#"namespace="web""#,
            r#"pod="infer-1""#,
            r#"container="server""#,
            r#"mode="mps""#,
            r#"domain="gpu""#,
            r#"backend="mps_daemon""#,
        ],
    );
    assert_eq!(
        value(line("gpushare_container_memory_cap_bytes", &[r#"id="cl""#])),
        f64::from(1u32 << 30)
    );
    assert_eq!(
        value(line("gpushare_container_memory_cap_bytes", &[r#"id="cm""#])),
        (4u64 << 30) as f64
    );
    assert_eq!(
        value(line("gpushare_container_cores_ratio", &[r#"id="cm""#])),
        0.5
    );
    assert!(
        sample(&text, "gpushare_container_info", &[r#"id="cb""#]).is_none(),
        "refused container listed"
    );
    // Per GPU.
    line(
        "gpushare_gpu_info",
        &[&gpu0, r#"index="0""#, r#"mode="limit""#],
    );
    line(
        "gpushare_gpu_info",
        &[&gpu1, r#"index="1""#, r#"mode="mps""#],
    );
    line(
        "gpushare_gpu_compute_mode",
        &[&gpu1, r#"compute_mode="EXCLUSIVE_PROCESS""#],
    );
    assert_eq!(
        value(line("gpushare_gpu_memory_total_bytes", &[&gpu0])),
        (81920u64 << 20) as f64
    );
    assert_eq!(
        value(line("gpushare_gpu_memory_committed_bytes", &[&gpu1])),
        (4u64 << 30) as f64
    );
    // Per domain.
    let dom = [gpu1.as_str(), r#"domain="gpu""#];
    assert_eq!(value(line("gpushare_domain_daemon_up", &dom)), 1.0);
    assert_eq!(value(line("gpushare_domain_daemon_answering", &dom)), 1.0);
    assert_eq!(value(line("gpushare_domain_clients", &dom)), 1.0);
    assert_eq!(value(line("gpushare_domain_drift", &dom)), 0.0);
    assert_eq!(value(line("gpushare_domain_restarts_total", &dom)), 0.0);
    // Node-wide: three requests (the plain container is no request), one refusal.
    assert_eq!(value(line("gpushare_requests_total", &[])), 3.0);
    assert_eq!(
        value(line("gpushare_refusals_total", &[r#"reason="busy""#])),
        1.0
    );
    assert_eq!(
        value(line("gpushare_acquires_total", &[r#"mode="mps""#])),
        1.0
    );
    assert_eq!(
        value(line("gpushare_acquires_total", &[r#"mode="limit""#])),
        1.0
    );
    assert_eq!(value(line("gpushare_daemon_starts_total", &[])), 1.0);
    assert_eq!(
        value(line("gpushare_create_runtime_duration_seconds_count", &[])),
        3.0
    );
    line(
        "gpushare_create_runtime_duration_seconds_bucket",
        &[r#"le="+Inf""#],
    );

    // The event log: one JSON line per acquire, refusal and daemon start.
    let events = std::fs::read_to_string(sb.path().join("gpushare-events.jsonl")).unwrap();
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        ["acquire", "daemon_start", "acquire", "refusal"],
        "{events}"
    );
    assert!(events.contains(r#""k8s_pod":"infer-1""#), "{events}");

    // Releases are events and counted too.
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cm", m.pid(), &bm)));
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cn", n.pid(), &bn)));
    let text = String::from_utf8(sb.hook(&["metrics"], "").stdout).unwrap();
    assert_eq!(
        value(sample(&text, "gpushare_releases_total", &[]).unwrap()),
        1.0,
        "{text}"
    );
    assert_eq!(
        value(sample(&text, "gpushare_daemon_stops_total", &[]).unwrap()),
        1.0,
        "{text}"
    );
    assert!(
        sample(&text, "gpushare_container_info", &[r#"id="cm""#]).is_none(),
        "{text}"
    );
    let events = std::fs::read_to_string(sb.path().join("gpushare-events.jsonl")).unwrap();
    assert!(events.lines().count() == 6, "{events}");

    // `events` prints them for people, one line each.
    let out = sb.hook(&["events"], "");
    ok(&out);
    let human = String::from_utf8(out.stdout).unwrap();
    let kinds: Vec<&str> = human
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "acquire",
            "daemon_start",
            "acquire",
            "refusal",
            "daemon_stop",
            "release"
        ],
        "{human}"
    );
    assert!(human.contains(" reason=busy "), "{human}");
    assert!(human.contains(" k8s_pod=infer-1"), "{human}");
}
