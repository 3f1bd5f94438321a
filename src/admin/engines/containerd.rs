//! containerd: the CRI runtime handler `gpushare` in `/etc/containerd/config.toml` (the runc
//! v2 shim with `BinaryName`, passing the pods' `gpu.share*` annotations into the OCI spec), in
//! the version 2 (containerd 1.x) and 3 (2.x) layouts; doctor reads the file and asks the
//! running containerd (`ctr plugins ls`, `crictl info`, at `CONTAINERD_ADDRESS` when set).

use std::path::Path;

use serde_json::Value;
use toml_edit::Item;

use super::check::{
    advise, agree, ask, check, find_tool, first_line, not_configured, runtime_entry, Check, Verdict,
};
use super::edit::{
    copy_value, ensure_in_array, finish_toml, parse_toml, read, remove_runtime, set_str, table,
    table_at, toml_edit_only, HANDLER,
};
use super::setup::{is_ours, Change, ConfigureError, Edit, Options, Order, Setup};
use super::EngineDef;

/// containerd's config.
pub const CONTAINERD_FILE: &str = "/etc/containerd/config.toml";

/// The CRI plugin's ID by config version: 2 (containerd 1.x), 3 (containerd 2.x).
pub const CRI_PLUGINS: [(i64, &str); 2] = [
    (2, "io.containerd.grpc.v1.cri"),
    (3, "io.containerd.cri.v1.runtime"),
];

/// The CRI plugin's ID for config `version`.
fn cri_plugin_id(version: i64) -> Option<&'static str> {
    CRI_PLUGINS
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, id)| *id)
}

pub(super) struct Containerd;

impl EngineDef for Containerd {
    fn name(&self) -> &'static str {
        "containerd"
    }

    fn files(&self) -> &'static [&'static str] {
        &[CONTAINERD_FILE]
    }

    fn plan(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Change>, ConfigureError> {
        Ok(vec![plan(main, setup, opts.containerd_version)?])
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
        "restart containerd to load it: systemctl restart containerd (running containers keep running)"
    }

    fn doctor(&self) -> Vec<Check> {
        agree(file_check(Path::new(CONTAINERD_FILE)), live(), "containerd")
    }

    fn check_file(&self, path: &Path) -> Option<Check> {
        Some(file_check(path))
    }
}

/// The containerd config version a new file gets: 3 for containerd 2.x, else 2.
fn containerd_default_version() -> i64 {
    let out = std::process::Command::new("containerd")
        .arg("--version")
        .env("PATH", crate::host::mps::SAFE_PATH)
        .output();
    match out {
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains(" v2.") => 3,
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains(" 2.") => 3,
        _ => 2,
    }
}

/// The runtime containerd's CRI runs a pod on when it names none, and its shim.
const CONTAINERD_DEFAULT_RUNTIME: &str = "runc";
const RUNC_SHIM: &str = "io.containerd.runc.v2";

/// Keys of a CRI runtime table that are the handler's own, not copied from the default runtime.
const HANDLER_OWN_KEYS: &[&str] = &[
    "runtime_type",
    "runtime_path",
    "pod_annotations",
    "container_annotations",
    "options",
];

/// containerd: the CRI runtime handler `gpushare` (runc v2 shim with `BinaryName`), passing the
/// pods' `gpu.share*` annotations into the OCI spec. Version 2 (1.x) and 3 (2.x) layouts.
///
/// containerd replaces its built-in runtimes (`runc`) with the file's `runtimes` table as soon as
/// the file has one, and then refuses to load the CRI plugin when `default_runtime_name` names a
/// runtime the file lacks. So where the default runtime is only implicit (Debian's stock file, an
/// empty or new file) it is written out as containerd's own default is (`runtime_type =
/// "io.containerd.runc.v2"`). The handler then takes the default runtime's settings and options
/// (kubeadm's `SystemdCgroup = true`, a `base_runtime_spec`, …) when that runtime is a runc shim,
/// with `BinaryName` replaced by gpushare-runtime.
fn plan(path: &Path, setup: &Setup, version: Option<i64>) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let text = before.as_deref().unwrap_or("");
    let (mut doc, header) = parse_toml(path, text)?;
    let version = match doc.get("version") {
        Some(v) => v.as_integer().ok_or_else(|| ConfigureError::Shape {
            path: path.to_owned(),
            key: "version".into(),
            want: "number",
        })?,
        None if doc.is_empty() => {
            let v = version.unwrap_or_else(containerd_default_version);
            doc.insert("version", toml_edit::value(v));
            v
        }
        None => 1,
    };
    let plugin = match cri_plugin_id(version) {
        Some(id) => id,
        None if version == 1 => {
            return Err(ConfigureError::ContainerdV1 {
                path: path.to_owned(),
            })
        }
        None => {
            return Err(ConfigureError::ContainerdVersion {
                path: path.to_owned(),
                version,
            })
        }
    };
    let ctd = table_at(doc.as_table_mut(), &["plugins", plugin, "containerd"], path)?;
    if ctd.is_empty() {
        ctd.set_implicit(true);
    }
    let default_name = match ctd.get("default_runtime_name") {
        None => CONTAINERD_DEFAULT_RUNTIME.to_owned(),
        Some(v) => v
            .as_str()
            .ok_or_else(|| ConfigureError::Shape {
                path: path.to_owned(),
                key: format!("plugins.\"{plugin}\".containerd.default_runtime_name"),
                want: "string",
            })?
            .to_owned(),
    };
    let runtimes = table_at(ctd, &["runtimes"], path)?;
    if runtimes.is_empty() {
        runtimes.set_implicit(true);
    }
    if default_name == CONTAINERD_DEFAULT_RUNTIME && !runtimes.contains_key(&default_name) {
        let rt = table_at(runtimes, &[CONTAINERD_DEFAULT_RUNTIME], path)?;
        set_str(rt, "runtime_type", RUNC_SHIM);
    }
    let default_rt = match runtimes
        .get(&default_name)
        .filter(|_| default_name != HANDLER)
    {
        Some(item) => Some(
            item.clone()
                .into_table()
                .map_err(|_| ConfigureError::Shape {
                    path: path.to_owned(),
                    key: format!("plugins.\"{plugin}\".containerd.runtimes.{default_name}"),
                    want: "table",
                })?,
        ),
        None => None,
    };
    let rt = table_at(runtimes, &[HANDLER], path)?;
    set_str(rt, "runtime_type", RUNC_SHIM);
    ensure_in_array(rt, "pod_annotations", &[], &["gpu.share*"], path)?;
    ensure_in_array(rt, "container_annotations", &[], &["gpu.share*"], path)?;
    let default_rt = default_rt.filter(|d| {
        d.get("runtime_type")
            .and_then(Item::as_str)
            .is_none_or(|t| t == RUNC_SHIM)
    });
    if let Some(d) = &default_rt {
        for (k, v) in d.iter() {
            if !HANDLER_OWN_KEYS.contains(&k) && v.is_value() {
                copy_value(rt, k, v);
            }
        }
    }
    let opts = table_at(rt, &["options"], path)?;
    if let Some(d) = default_rt.as_ref().and_then(|d| d.get("options")) {
        let d = d.clone().into_table().map_err(|_| ConfigureError::Shape {
            path: path.to_owned(),
            key: format!("plugins.\"{plugin}\".containerd.runtimes.{default_name}.options"),
            want: "table",
        })?;
        for (k, v) in d.iter() {
            if k != "BinaryName" && v.is_value() {
                copy_value(opts, k, v);
            }
        }
    }
    set_str(opts, "BinaryName", &setup.runtime_entry().to_string_lossy());
    Ok(finish_toml(path, before, &header, &doc))
}

/// containerd: the `gpushare` handler in either layout, and a default runtime naming it.
fn remove(path: &Path) -> Result<Option<Edit>, ConfigureError> {
    toml_edit_only(path, |doc| {
        for (_, plugin) in CRI_PLUGINS {
            let Some(c) = table(doc.as_table_mut(), &["plugins", plugin, "containerd"]) else {
                continue;
            };
            if c.get("default_runtime_name").and_then(Item::as_str) == Some(HANDLER) {
                c.remove("default_runtime_name");
            }
            remove_runtime(c, "runtimes", |t| {
                t.get("options")
                    .and_then(Item::as_table_like)
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(Item::as_str)
                    .is_some_and(|p| is_ours(p, "gpushare-runtime"))
            });
            // configure defines the implicit default runtime (`runc`, the runc v2 shim, nothing
            // else) beside its handler, because containerd refuses a CRI config that names a
            // handler but leaves `runc` implicit; without the handler that entry says only what
            // containerd assumes anyway.
            let only_implicit_runc = c
                .get("runtimes")
                .and_then(Item::as_table_like)
                .and_then(|r| r.get("runc"))
                .and_then(Item::as_table_like)
                .is_some_and(|t| {
                    t.len() == 1
                        && t.get("runtime_type").and_then(Item::as_str)
                            == Some("io.containerd.runc.v2")
                });
            let default = c.get("default_runtime_name").and_then(Item::as_str);
            if only_implicit_runc && default.is_none_or(|n| n == "runc") {
                if let Some(r) = c.get_mut("runtimes").and_then(Item::as_table_like_mut) {
                    r.remove("runc");
                    if r.is_empty() {
                        c.remove("runtimes");
                    }
                }
            }
        }
    })
}

/// containerd: a CRI runtime (version 2 or 3 layout) whose `options.BinaryName` is ours, with
/// the gpu.share annotations passed through.
pub fn file_check(file: &Path) -> Check {
    let name = "containerd";
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(_) => {
            return not_configured(
                name,
                "containerd",
                "containerd",
                &format!("containerd: {} missing", file.display()),
            )
        }
    };
    let doc: toml::Table = match text.parse() {
        Ok(d) => d,
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!(
                    "containerd: {} is not valid TOML ({}); containerd will not start",
                    file.display(),
                    e.message()
                ),
            )
        }
    };
    let runtimes = CRI_PLUGINS
        .iter()
        .map(|(_, p)| p)
        .filter_map(|p| {
            doc.get("plugins")?
                .get(p)?
                .get("containerd")?
                .get("runtimes")?
                .as_table()
        })
        .flat_map(|t| t.iter())
        .find_map(|(k, rt)| {
            let bin = rt.get("options")?.get("BinaryName")?.as_str()?;
            is_ours(bin, "gpushare-runtime").then(|| (k.clone(), bin.to_owned(), rt.clone()))
        });
    let Some((handler, bin, rt)) = runtimes else {
        return not_configured(
            name,
            "containerd",
            "containerd",
            &format!(
                "containerd: no runtime with BinaryName gpushare-runtime in {}",
                file.display()
            ),
        );
    };
    let passes = rt
        .get("pod_annotations")
        .and_then(|a| a.as_array())
        .is_some_and(|a| {
            a.iter()
                .any(|v| v.as_str().is_some_and(|s| s.starts_with("gpu.share")))
        });
    match runtime_entry(Path::new(&bin)) {
        Err(e) => check(
            name,
            Verdict::Fail,
            advise(
                &format!("containerd: runtime {handler:?} in {}: {e}", file.display()),
                "containerd",
            ),
        ),
        Ok(d) if !passes => check(
            name,
            Verdict::Warn,
            format!("containerd: runtime {handler:?} {d}, but its pod_annotations lack gpu.share*: pods' requests do not reach it (`gpushare-hook configure containerd` adds them)"),
        ),
        Ok(d) => check(name, Verdict::Ok, format!("runtime {handler:?} {d}")),
    }
}

/// containerd's socket: `$CONTAINERD_ADDRESS`, else the default.
fn containerd_socket() -> String {
    std::env::var("CONTAINERD_ADDRESS")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/run/containerd/containerd.sock".into())
}

/// containerd: running, its CRI plugin loaded, and the gpushare handler in the runtime config
/// the CRI plugin reports.
pub fn live() -> Check {
    let name = "containerd daemon";
    let ctr = find_tool("ctr");
    if ctr.is_none() && find_tool("containerd").is_none() {
        return check(name, Verdict::Ok, "containerd not installed");
    }
    let sock = containerd_socket();
    if !Path::new(&sock).exists() {
        return check(
            name,
            Verdict::Warn,
            format!("containerd: not running (no socket at {sock}); only config.toml was checked, not what containerd loads"),
        );
    }
    let Some(ctr) = ctr else {
        return check(
            name,
            Verdict::Warn,
            "containerd: ctr is not installed; cannot ask containerd what it loaded",
        );
    };
    let o = match ask(&ctr, &["--address", &sock, "plugins", "ls"]) {
        Err(e) => return check(name, Verdict::Warn, format!("containerd: {e}")),
        Ok(o) if !o.status.success() => {
            return check(
                name,
                Verdict::Warn,
                format!("containerd: not running ({})", first_line(&o)),
            )
        }
        Ok(o) => o,
    };
    if let Some(c) = cri_plugin(&String::from_utf8_lossy(&o.stdout)) {
        return c;
    }
    let Some(crictl) = find_tool("crictl") else {
        return check(
            name,
            Verdict::Warn,
            format!("containerd runs with its CRI plugin; whether it has loaded the gpushare handler needs crictl (cri-tools), which is not installed: `crictl --runtime-endpoint unix://{sock} info` shows its runtimes"),
        );
    };
    let endpoint = format!("unix://{sock}");
    match ask(&crictl, &["--runtime-endpoint", &endpoint, "info"]) {
        Err(e) => check(name, Verdict::Warn, format!("containerd: {e}")),
        Ok(o) if !o.status.success() => check(
            name,
            Verdict::Warn,
            format!("containerd: crictl info failed ({})", first_line(&o)),
        ),
        Ok(o) => containerd_answer(&serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)),
    }
}

/// The verdict on `ctr plugins ls`'s table when the CRI plugin is not up; `None` when it is.
/// containerd 1.x lists `io.containerd.grpc.v1 cri`; 2.x also `io.containerd.cri.v1 runtime`.
pub(super) fn cri_plugin(table: &str) -> Option<Check> {
    let name = "containerd daemon";
    let row = table.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri")
            .then(|| f[f.len() - 1].to_owned())
    });
    match row.as_deref() {
        Some("ok") => None,
        Some(status) => Some(check(
            name,
            Verdict::Fail,
            format!("containerd: its CRI plugin did not load (status {status}): no pod runs; see `journalctl -u containerd` (often a config.toml error)"),
        )),
        None => Some(check(
            name,
            Verdict::Fail,
            "containerd: runs without a CRI plugin (is \"cri\" in disabled_plugins?): no pod runs",
        )),
    }
}

/// The verdict on `crictl info`'s JSON: a runtime whose `options.BinaryName` is ours anywhere
/// in a `runtimes` table of the config containerd runs with (pure).
pub(super) fn containerd_answer(v: &Value) -> Check {
    let name = "containerd daemon";
    let mut found = None;
    find_runtimes(v, &mut |k, rt| {
        let bin = rt["options"]["BinaryName"].as_str().unwrap_or("");
        if found.is_none() && is_ours(bin, "gpushare-runtime") {
            found = Some((k.to_owned(), bin.to_owned()));
        }
    });
    match found {
        Some((k, bin)) => check(
            name,
            Verdict::Ok,
            format!("containerd has loaded handler {k:?} ({bin})"),
        ),
        None => check(
            name,
            Verdict::Warn,
            "containerd: the running containerd has no gpushare handler; run `gpushare-hook configure containerd`, then `systemctl restart containerd`",
        ),
    }
}

fn find_runtimes(v: &Value, f: &mut impl FnMut(&str, &Value)) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "runtimes" {
                    if let Some(rts) = x.as_object() {
                        for (name, rt) in rts {
                            f(name, rt);
                        }
                    }
                }
                find_runtimes(x, f);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| find_runtimes(x, f)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::engines::testing::{apply_and_replan, plan_text, setup, CONTAINERD};

    #[test]
    fn containerd_v2_and_v3_with_binary_name_and_annotations() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("config.toml");
        let s = setup(Some("/etc/gs/test.toml"));
        let rows = [
            ("version 2", 2, "io.containerd.grpc.v1.cri"),
            ("version 3", 3, "io.containerd.cri.v1.runtime"),
        ];
        for (what, v, plugin) in rows {
            std::fs::write(
                &f,
                format!("# my comment\nversion = {v}\nroot = \"/var/lib/containerd\"\n"),
            )
            .unwrap();
            let text = apply_and_replan(CONTAINERD, &f, &s);
            assert!(text.starts_with("# my comment\nversion"), "{what}: {text}");
            let doc: toml::Table = text.parse().unwrap();
            let rt = &doc["plugins"][plugin]["containerd"]["runtimes"]["gpushare"];
            assert_eq!(
                rt["runtime_type"].as_str(),
                Some("io.containerd.runc.v2"),
                "{what}"
            );
            assert_eq!(
                rt["pod_annotations"].as_array().unwrap()[0].as_str(),
                Some("gpu.share*"),
                "{what}"
            );
            assert_eq!(
                rt["options"]["BinaryName"].as_str(),
                Some("/etc/gs/gpushare-runtime-test"),
                "{what}: launcher for a non-default policy"
            );
            assert_eq!(doc["root"].as_str(), Some("/var/lib/containerd"));
        }
        let e = plan_text(CONTAINERD, &f, Some("root = \"/x\"\n"), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::ContainerdV1 { .. }), "{e}");
        let e = plan_text(CONTAINERD, &f, Some("version = 2\n[plugins\n"), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::Toml { .. }), "{e}");
        // A new file gets the version asked for.
        std::fs::remove_file(&f).unwrap();
        let c = plan_text(CONTAINERD, &f, None, &s).unwrap();
        assert!(c[0].after.starts_with("version = 2\n"), "{}", c[0].after);
        // The launcher hands the policy on.
        let l = c
            .iter()
            .find(|c| c.path.ends_with("gpushare-runtime-test"))
            .unwrap();
        assert!(
            l.after.contains("GPUSHARE_CONFIG='/etc/gs/test.toml'"),
            "{}",
            l.after
        );
        assert_eq!(l.mode, 0o755);
    }

    #[test]
    fn containerd_stock_and_kubeadm_files() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("config.toml");
        let s = setup(None);
        let fixture = |name: &str| {
            std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/containerd")
                    .join(name),
            )
            .unwrap()
        };
        // (what, file text or None for no file, plugin, SystemdCgroup on the handler)
        let rows: Vec<(&str, Option<String>, &str, Option<bool>)> = vec![
            (
                "Debian 12 stock",
                Some(fixture("debian12-stock.toml")),
                "io.containerd.grpc.v1.cri",
                None,
            ),
            (
                "Debian 13 stock",
                Some(fixture("debian13-stock.toml")),
                "io.containerd.grpc.v1.cri",
                None,
            ),
            (
                "kubeadm SystemdCgroup",
                Some(fixture("kubeadm-systemd-cgroup.toml")),
                "io.containerd.grpc.v1.cri",
                Some(true),
            ),
            (
                "containerd 2 version 3",
                Some(fixture("containerd2-v3.toml")),
                "io.containerd.cri.v1.runtime",
                None,
            ),
            (
                "empty file",
                Some(String::new()),
                "io.containerd.grpc.v1.cri",
                None,
            ),
            ("no file", None, "io.containerd.grpc.v1.cri", None),
        ];
        for (what, text, plugin, systemd) in rows {
            let _ = std::fs::remove_file(&f);
            if let Some(text) = &text {
                std::fs::write(&f, text).unwrap();
            }
            let after = apply_and_replan(CONTAINERD, &f, &s);
            let doc: toml::Table = after.parse().unwrap();
            let ctd = &doc["plugins"][plugin]["containerd"];
            let default = ctd
                .get("default_runtime_name")
                .and_then(|v| v.as_str())
                .unwrap_or("runc");
            assert_eq!(
                ctd["runtimes"][default]["runtime_type"].as_str(),
                Some("io.containerd.runc.v2"),
                "{what}: the default runtime is defined: {after}"
            );
            let h = &ctd["runtimes"]["gpushare"];
            assert_eq!(
                h["options"]["BinaryName"].as_str(),
                Some("/opt/gs/bin/gpushare-runtime"),
                "{what}"
            );
            assert_eq!(
                h["options"].get("SystemdCgroup").and_then(|v| v.as_bool()),
                systemd,
                "{what}: the default runtime's options: {after}"
            );
            if let Some(text) = &text {
                let kept: toml::Table = text.parse().unwrap();
                for k in kept.keys() {
                    assert!(doc.contains_key(k), "{what}: {k} kept");
                }
                if let Some(v) = kept.get("version") {
                    assert_eq!(doc.get("version"), Some(v), "{what}: version kept");
                }
            }
        }
        // version 1 (written or implied): refused, the file left as it was.
        for text in [fixture("version1.toml"), "root = \"/x\"\n".to_owned()] {
            std::fs::write(&f, &text).unwrap();
            let e = plan_text(CONTAINERD, &f, Some(&text), &s).unwrap_err();
            assert!(matches!(e, ConfigureError::ContainerdV1 { .. }), "{e}");
            assert!(e.to_string().contains("version 1"), "{e}");
            assert_eq!(std::fs::read_to_string(&f).unwrap(), text);
        }
        let e = plan_text(CONTAINERD, &f, Some("version = 4\n"), &s).unwrap_err();
        assert!(
            matches!(e, ConfigureError::ContainerdVersion { version: 4, .. }),
            "{e}"
        );
        // A handler option the admin set and the default lacks stays; one the default has follows it.
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\nSystemdCgroup = true\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpushare.options]\nSystemdCgroup = false\nRoot = \"/x\"\n";
        std::fs::write(&f, text).unwrap();
        let after = apply_and_replan(CONTAINERD, &f, &s);
        let doc: toml::Table = after.parse().unwrap();
        let o = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["gpushare"]
            ["options"];
        assert_eq!(o["SystemdCgroup"].as_bool(), Some(true), "{after}");
        assert_eq!(o["Root"].as_str(), Some("/x"), "{after}");
    }
}
