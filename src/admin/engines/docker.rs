//! Docker: the runtime `gpushare` in `/etc/docker/daemon.json` (`runtimes.gpushare.path`, and
//! on request `"default-runtime"`), every other key kept in its order; doctor reads the file and
//! asks the running dockerd (`docker info`, at `DOCKER_HOST` when set) what it has loaded.

use std::path::Path;

use serde_json::Value;

use super::check::{
    advise, agree, ask, check, find_tool, first_line, not_configured, resolve, runtime_entry,
    Check, Verdict,
};
use super::edit::{change, json_text, parse_json, read, unchanged, HANDLER};
use super::setup::{is_ours, Change, ConfigureError, Edit, Options, Order, Setup};
use super::EngineDef;

/// Docker's daemon config.
pub const DOCKER_FILE: &str = "/etc/docker/daemon.json";

pub(super) struct Docker;

impl EngineDef for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn files(&self) -> &'static [&'static str] {
        &[DOCKER_FILE]
    }

    fn plan(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Change>, ConfigureError> {
        Ok(vec![plan(main, setup, opts.default_runtime)?])
    }

    fn remove(
        &self,
        main: &Path,
        _setup: &Setup,
        _opts: &Options,
    ) -> Result<Vec<Edit>, ConfigureError> {
        Ok(remove(main)?.into_iter().collect())
    }

    fn restart(&self, _order: Order) -> &'static str {
        "reload Docker to load it: systemctl reload docker (a SIGHUP to dockerd reloads its runtimes; running containers keep running)"
    }

    fn doctor(&self) -> Vec<Check> {
        agree(file_check(Path::new(DOCKER_FILE)), live(), "docker")
    }

    fn check_file(&self, path: &Path) -> Option<Check> {
        Some(file_check(path))
    }
}

/// Docker: `runtimes.gpushare.path` in daemon.json (and with `default_runtime`,
/// `"default-runtime": "gpushare"`); every other key kept in its order.
fn plan(path: &Path, setup: &Setup, default_runtime: bool) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let text = before.as_deref().unwrap_or("");
    let mut v = parse_json(path, text)?;
    let shape = |key: &str| ConfigureError::Shape {
        path: path.to_owned(),
        key: key.to_owned(),
        want: "JSON object",
    };
    let root = v.as_object_mut().ok_or_else(|| shape("the top level"))?;
    let runtimes = root
        .entry("runtimes")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or_else(|| shape("\"runtimes\""))?;
    let entry = runtimes
        .entry(HANDLER)
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or_else(|| shape("\"runtimes\".\"gpushare\""))?;
    let want = Value::String(setup.runtime_entry().display().to_string());
    if entry.get("path") != Some(&want) {
        entry.insert("path".into(), want);
    }
    let handler = Value::String(HANDLER.into());
    if default_runtime && root.get("default-runtime") != Some(&handler) {
        root.insert("default-runtime".into(), handler);
    }
    let after = if before.is_some() && v == serde_json::from_str::<Value>(text).unwrap_or_default()
    {
        // Unchanged: keep the file byte for byte.
        text.to_owned()
    } else {
        json_text(&v)
    };
    Ok(change(path, before, after, 0o644))
}

/// Docker: `runtimes.gpushare` (when it runs gpushare-runtime) and a `default-runtime` naming it.
fn remove(path: &Path) -> Result<Option<Edit>, ConfigureError> {
    let Some(text) = read(path)? else {
        return Ok(None);
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let mut v = parse_json(path, &text)?;
    let Some(root) = v.as_object_mut() else {
        return Err(ConfigureError::Shape {
            path: path.to_owned(),
            key: "the top level".into(),
            want: "JSON object",
        });
    };
    let mut changed = false;
    if let Some(r) = root.get_mut("runtimes").and_then(Value::as_object_mut) {
        let ours = r
            .get(HANDLER)
            .and_then(|e| e["path"].as_str())
            .is_some_and(|p| is_ours(p, "gpushare-runtime"));
        if ours {
            r.remove(HANDLER);
            changed = true;
        }
        if r.is_empty() {
            root.remove("runtimes");
        }
    }
    if root.get("default-runtime").and_then(Value::as_str) == Some(HANDLER) {
        root.remove("default-runtime");
        changed = true;
    }
    if !changed {
        return Ok(Some(unchanged(path, text)));
    }
    if root.is_empty() {
        // Nothing but gpushare's entries was in it (configure created it): it goes.
        return Ok(Some(Edit::Delete {
            path: path.to_owned(),
            before: text,
        }));
    }
    Ok(Some(Edit::Write(Change {
        path: path.to_owned(),
        before: Some(text),
        after: json_text(&v),
        mode: 0o644,
    })))
}

/// Docker: `runtimes.<name>.path` in daemon.json naming gpushare-runtime.
pub fn file_check(file: &Path) -> Check {
    let name = "docker";
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(_) => {
            return not_configured(
                name,
                "dockerd",
                "docker",
                &format!("docker: {} missing", file.display()),
            )
        }
    };
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!(
                    "docker: {} is not valid JSON ({e}); dockerd will not start",
                    file.display()
                ),
            )
        }
    };
    let entry = v["runtimes"].as_object().and_then(|r| {
        r.iter().find_map(|(k, e)| {
            let p = e["path"].as_str()?;
            is_ours(p, "gpushare-runtime").then(|| (k.clone(), p.to_owned()))
        })
    });
    let Some((runtime, path)) = entry else {
        return not_configured(
            name,
            "dockerd",
            "docker",
            &format!(
                "docker: no gpushare-runtime in \"runtimes\" of {}",
                file.display()
            ),
        );
    };
    let path = resolve(&path);
    match runtime_entry(&path) {
        Ok(d) => check(name, Verdict::Ok, format!("runtime {runtime:?} {d}")),
        Err(e) => check(
            name,
            Verdict::Fail,
            advise(
                &format!("docker: runtime {runtime:?} in {}: {e}", file.display()),
                "docker",
            ),
        ),
    }
}

/// Docker: `docker info` answers with the runtimes dockerd has loaded and its default.
pub fn live() -> Check {
    let name = "docker daemon";
    let Some(cli) = find_tool("docker") else {
        return match find_tool("dockerd") {
            None => check(name, Verdict::Ok, "docker not installed"),
            Some(_) => check(
                name,
                Verdict::Warn,
                "docker: dockerd is installed but the docker CLI is not; cannot ask it what it loaded",
            ),
        };
    };
    let format = r#"{"runtimes":{{json .Runtimes}},"default":{{json .DefaultRuntime}}}"#;
    let o = match ask(&cli, &["info", "--format", format]) {
        Err(e) => return check(name, Verdict::Warn, format!("docker: {e}")),
        Ok(o) => o,
    };
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    if !o.status.success() || !v["runtimes"].is_object() {
        return check(
            name,
            Verdict::Warn,
            format!(
                "docker: not running ({}); only daemon.json was checked, not what dockerd loads",
                first_line(&o)
            ),
        );
    }
    docker_answer(&v)
}

/// The verdict on `docker info`'s `{"runtimes": …, "default": …}` (pure).
pub(super) fn docker_answer(v: &Value) -> Check {
    let name = "docker daemon";
    let default = v["default"].as_str().unwrap_or("?");
    let runtimes = v["runtimes"].as_object().cloned().unwrap_or_default();
    let ours = runtimes.iter().find_map(|(k, e)| {
        let p = e["path"].as_str()?;
        is_ours(p, "gpushare-runtime").then(|| (k.clone(), p.to_owned()))
    });
    match ours {
        Some((k, p)) => check(
            name,
            Verdict::Ok,
            format!("dockerd has loaded runtime {k:?} ({p}); default runtime {default}"),
        ),
        None => check(
            name,
            Verdict::Warn,
            format!(
                "docker: the running dockerd has no gpushare runtime (it has {}; default {default}); run `gpushare-hook configure docker`, then `systemctl reload docker`",
                runtimes.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::engines::testing::{apply, apply_and_replan, plan_text, setup, DOCKER};

    #[test]
    fn docker_merge_keeps_other_keys_and_refuses_bad_json() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("daemon.json");
        let s = setup(None);
        std::fs::write(&f, "{\"log-driver\": \"journald\", \"runtimes\": {\"other\": {\"path\": \"/x\"}}, \"zz\": 1}").unwrap();
        let text = apply_and_replan(DOCKER, &f, &s);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["log-driver"], "journald");
        assert_eq!(v["runtimes"]["other"]["path"], "/x");
        assert_eq!(
            v["runtimes"]["gpushare"]["path"],
            "/opt/gs/bin/gpushare-runtime"
        );
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["log-driver", "runtimes", "zz"], "order kept");
        let bad = "{\"a\": 1,}";
        let e = plan_text(DOCKER, &f, Some(bad), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::Json { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), bad);
        let e = plan_text(DOCKER, &f, Some("[1]"), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::Shape { .. }), "{e}");
        assert!(v.get("default-runtime").is_none(), "not asked for");
    }

    #[test]
    fn docker_default_runtime_on_request() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("daemon.json");
        let s = setup(None);
        let opts = Options {
            path: Some(f.clone()),
            default_runtime: true,
            ..Options::default()
        };
        for before in [
            "{\"features\": {\"cdi\": true}}",
            "{\"default-runtime\": \"runc\"}",
        ] {
            std::fs::write(&f, before).unwrap();
            for c in crate::admin::engines::plan(DOCKER, &s, &opts).unwrap() {
                apply(&c).unwrap();
            }
            assert!(crate::admin::engines::plan(DOCKER, &s, &opts)
                .unwrap()
                .iter()
                .all(|c| !c.changes()));
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
            assert_eq!(v["default-runtime"], "gpushare", "{before}");
            assert_eq!(
                v["runtimes"]["gpushare"]["path"],
                "/opt/gs/bin/gpushare-runtime"
            );
        }
    }
}
