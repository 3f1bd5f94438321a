//! The Grafana dashboard in packaging/grafana uses only metrics gpushare exports.

use gpushare::admin::metrics::NAMES;
use serde_json::Value;

/// Every `expr` and variable query of a dashboard.
fn expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => expressions(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| expressions(x, out)),
        _ => {}
    }
}

/// The metric names an expression uses that gpushare does not export (histogram series
/// count under their family).
fn unknown_metrics(expr: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("gpushare_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| NAMES.contains(f)))
            .unwrap_or(name);
        if !NAMES.contains(&family) {
            bad.push(name.to_owned());
        }
        rest = &tail[end..];
    }
    bad
}

#[test]
fn every_dashboard_expression_names_an_exported_metric() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/grafana/gpushare.json"
    );
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    expressions(&dash, &mut exprs);
    assert!(
        exprs.len() >= 12,
        "the dashboard has its queries: {exprs:?}"
    );
    for e in &exprs {
        assert!(e.contains("gpushare_"), "{e} uses no gpushare metric");
        let bad = unknown_metrics(e);
        assert!(
            bad.is_empty(),
            "{e} names {bad:?}, which gpushare does not export"
        );
    }
    // Positive control: the checker catches a name that is not exported.
    assert_eq!(
        unknown_metrics("rate(gpushare_requests_total[5m]) + gpushare_nope_total"),
        ["gpushare_nope_total"]
    );
    assert!(unknown_metrics("gpushare_create_runtime_duration_seconds_bucket").is_empty());
}

#[test]
fn every_dashboard_expression_is_promql() {
    if !std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool missing (CI requires it)"
        );
        eprintln!("\n******** SKIPPED: dashboard PromQL: promtool missing; run scripts/install-deps.sh ********\n");
        return;
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/grafana/gpushare.json"
    );
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    expressions(&dash, &mut exprs);
    // label_values() is Grafana's, not PromQL.
    exprs.retain(|e| !e.starts_with("label_values("));
    let check = |exprs: &[String]| {
        let dir = tempfile::tempdir().unwrap();
        let rules: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| serde_json::json!({"record": format!("dashboard:q{i}"), "expr": e}))
            .collect();
        // YAML is a superset of JSON.
        let file = dir.path().join("rules.yml");
        std::fs::write(
            &file,
            serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
        )
        .unwrap();
        let out = std::process::Command::new("promtool")
            .args(["check", "rules"])
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (good, said) = check(&exprs);
    assert!(good, "promtool check rules: {said}");
    // Positive control: a broken expression is caught.
    let (good, _) = check(&["sum(gpushare_requests_total".to_owned()]);
    assert!(!good, "promtool accepted broken PromQL");
}
