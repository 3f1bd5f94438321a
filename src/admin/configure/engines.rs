//! What each engine needs, merged into its files as they are now (pure but for reading them).

use std::path::{Path, PathBuf};

use serde_json::Value;
use toml_edit::{Array, DocumentMut, Item, Table};

use super::{launcher_path, Change, ConfigureError, Engine, Options, Order, Setup};

const HOOK_CREATE: &str = include_str!("../../../hooks/oci/gpushare-createRuntime.json");
const HOOK_POSTSTOP: &str = include_str!("../../../hooks/oci/gpushare-poststop.json");
const HOOK_PRECREATE: &str =
    include_str!("../../../hooks/podman-precreate/gpushare-precreate.json");

/// Default files.
pub const DOCKER_FILE: &str = "/etc/docker/daemon.json";
pub const CONTAINERD_FILE: &str = "/etc/containerd/config.toml";
pub const CRIO_FILE: &str = "/etc/crio/crio.conf.d/10-gpushare.conf";
pub const PODMAN_FILE: &str = "/etc/containers/containers.conf.d/50-gpushare.conf";
pub const NVIDIA_FILE: &str = "/etc/nvidia-container-runtime/config.toml";
/// The hooks dir podman and CRI-O both read by default.
pub const OCI_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";
/// podman's other default hooks dir.
pub const ETC_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";
/// The podman-only dir for the precreate hook (CRI-O does not know the stage: a precreate file in
/// a dir CRI-O reads stops it at start-up).
pub const PODMAN_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d-podman";
/// The runtime handler's name.
const HANDLER: &str = "gpushare";

pub(super) fn plan(
    engine: Engine,
    setup: &Setup,
    opts: &Options,
) -> Result<Vec<Change>, ConfigureError> {
    let main = |default: &str| opts.path.clone().unwrap_or_else(|| PathBuf::from(default));
    let mut out = Vec::new();
    match engine {
        Engine::Docker => out.push(docker(&main(DOCKER_FILE), setup, opts.default_runtime)?),
        Engine::Containerd => out.push(containerd(
            &main(CONTAINERD_FILE),
            setup,
            opts.containerd_version,
        )?),
        Engine::Crio => {
            let (oci, _) = hooks_dirs(opts);
            out.push(crio(&main(CRIO_FILE), setup, &oci)?);
            out.extend(hook_files(setup, &oci, None)?);
        }
        Engine::Podman => {
            let (oci, podman) = hooks_dirs(opts);
            out.push(podman_conf(&main(PODMAN_FILE), setup, &oci, &podman)?);
            out.extend(hook_files(setup, &oci, Some(&podman))?);
        }
        Engine::NvidiaContainerRuntime => match opts.order {
            Order::GpushareFirst => {
                let policy = setup
                    .policy
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_PATH));
                out.push(nvidia_behind(&main(&policy.to_string_lossy()))?);
            }
            Order::NvidiaFirst => out.push(nvidia_in_front(&main(NVIDIA_FILE), setup)?),
        },
    }
    if let (Some(policy), true) = (&setup.policy, engine_runs_runtime(engine, opts.order)) {
        out.push(launcher(policy, &setup.runtime)?);
    }
    Ok(out)
}

/// Whether the engine's files name `gpushare-runtime` (and so need the launcher).
fn engine_runs_runtime(engine: Engine, order: Order) -> bool {
    match engine {
        Engine::Docker | Engine::Containerd | Engine::Crio | Engine::Podman => true,
        Engine::NvidiaContainerRuntime => order == Order::NvidiaFirst,
    }
}

fn hooks_dirs(opts: &Options) -> (PathBuf, PathBuf) {
    match &opts.hooks_dir {
        Some(d) => (d.join("hooks.d"), d.join("hooks.d-podman")),
        None => (
            PathBuf::from(OCI_HOOKS_DIR),
            PathBuf::from(PODMAN_HOOKS_DIR),
        ),
    }
}

fn read(path: &Path) -> Result<Option<String>, ConfigureError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigureError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn change(path: &Path, before: Option<String>, after: String, mode: u32) -> Change {
    Change {
        path: path.to_owned(),
        before,
        after,
        mode,
    }
}

/// Docker: `runtimes.gpushare.path` in daemon.json (and with `default_runtime`,
/// `"default-runtime": "gpushare"`); every other key kept in its order.
fn docker(path: &Path, setup: &Setup, default_runtime: bool) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let text = before.as_deref().unwrap_or("");
    let mut v: Value = if text.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(text).map_err(|source| ConfigureError::Json {
            path: path.to_owned(),
            source,
        })?
    };
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
        let mut s = serde_json::to_string_pretty(&v).expect("JSON value serialises");
        s.push('\n');
        s
    };
    Ok(change(path, before, after, 0o644))
}

/// A TOML file to merge into, and the text to keep in front of it: a file of only comments
/// keeps them as a header (toml_edit would put new tables in front of them).
fn parse_toml(path: &Path, text: &str) -> Result<(DocumentMut, String), ConfigureError> {
    let doc = text
        .parse::<DocumentMut>()
        .map_err(|source| ConfigureError::Toml {
            path: path.to_owned(),
            source,
        })?;
    if doc.as_table().is_empty() && !text.trim().is_empty() {
        let mut header = text.trim_end().to_owned();
        header.push('\n');
        return Ok((DocumentMut::new(), header));
    }
    Ok((doc, String::new()))
}

/// The table at `keys` under `root`, made (as a standard table, dotted parents implicit) when
/// missing.
fn table_at<'a>(
    root: &'a mut Table,
    keys: &[&str],
    path: &Path,
) -> Result<&'a mut Table, ConfigureError> {
    let mut cur = root;
    for (i, k) in keys.iter().enumerate() {
        let last = i + 1 == keys.len();
        let item = cur.entry(k).or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(!last);
            Item::Table(t)
        });
        if let Some(inline) = item.as_inline_table() {
            *item = Item::Table(inline.clone().into_table());
        }
        cur = item.as_table_mut().ok_or_else(|| ConfigureError::Shape {
            path: path.to_owned(),
            key: keys[..=i].join("."),
            want: "table",
        })?;
    }
    Ok(cur)
}

/// Sets `key` to the string `v` unless it already is (so an unchanged file stays byte for byte).
fn set_str(t: &mut Table, key: &str, v: &str) {
    if t.get(key).and_then(Item::as_str) != Some(v) {
        t.insert(key, toml_edit::value(v));
    }
}

/// Makes `key` an array holding every one of `vals` (after what it holds, or `initial` when it
/// is missing).
fn ensure_in_array(
    t: &mut Table,
    key: &str,
    initial: &[&str],
    vals: &[&str],
    path: &Path,
) -> Result<(), ConfigureError> {
    let a = array_mut(t, key, initial, path)?;
    for v in vals {
        if !a.iter().any(|x| x.as_str() == Some(v)) {
            a.push(*v);
        }
    }
    Ok(())
}

/// The array `key` of `t`, made from `initial` when missing.
///
/// # Errors
/// [`ConfigureError::Shape`] when `key` holds something else.
fn array_mut<'t>(
    t: &'t mut Table,
    key: &str,
    initial: &[&str],
    path: &Path,
) -> Result<&'t mut Array, ConfigureError> {
    if !t.contains_key(key) {
        t.insert(
            key,
            toml_edit::value(initial.iter().copied().collect::<Array>()),
        );
    }
    t.get_mut(key)
        .and_then(Item::as_array_mut)
        .ok_or_else(|| ConfigureError::Shape {
            path: path.to_owned(),
            key: key.to_owned(),
            want: "array",
        })
}

/// Puts `v` first in the array `key` (removing it from further down), unless it is first.
fn put_first(
    t: &mut Table,
    key: &str,
    v: &str,
    rest: &[&str],
    path: &Path,
) -> Result<(), ConfigureError> {
    let a = array_mut(t, key, rest, path)?;
    if a.get(0).and_then(|x| x.as_str()) != Some(v) {
        a.retain(|x| x.as_str() != Some(v));
        a.insert(0, v);
        a.fmt();
    }
    Ok(())
}

fn finish_toml(path: &Path, before: Option<String>, header: &str, doc: &DocumentMut) -> Change {
    let after = format!("{header}{doc}");
    change(path, before, after, 0o644)
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
fn containerd(path: &Path, setup: &Setup, version: Option<i64>) -> Result<Change, ConfigureError> {
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
    let plugin = match version {
        2 => "io.containerd.grpc.v1.cri",
        3 => "io.containerd.cri.v1.runtime",
        1 => {
            return Err(ConfigureError::ContainerdV1 {
                path: path.to_owned(),
            })
        }
        v => {
            return Err(ConfigureError::ContainerdVersion {
                path: path.to_owned(),
                version: v,
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

/// Sets `key` of `t` to the value `v` unless it already holds that value (compared without
/// formatting, so that a second run leaves the file byte for byte).
fn copy_value(t: &mut Table, key: &str, v: &Item) {
    let same = match (t.get(key).and_then(Item::as_value), v.as_value()) {
        (Some(a), Some(b)) => a.to_string().trim() == b.to_string().trim(),
        _ => false,
    };
    if !same {
        if let Some(val) = v.as_value() {
            let mut val = val.clone();
            val.decor_mut().clear();
            t.insert(key, Item::Value(val));
        }
    }
}

/// CRI-O: the drop-in with the hooks dir and the runtime handler `gpushare`.
///
/// Written to what CRI-O v1.37.0 accepts (`pkg/config/config.go`, `RuntimeHandler.Validate`):
/// a handler whose `allowed_annotations` names anything outside CRI-O's own list
/// (`pkg/annotations/v2/annotations.go`, `AllAllowedAnnotations`) is dropped with a warning, so
/// the handler lists none. Our `gpu.share*` keys need no allow-listing: CRI-O filters only its own
/// annotations and copies the pod's annotations into every container's spec
/// (`internal/factory/container/container.go`). `allowed_annotations` entries naming our keys,
/// left by an earlier version, are taken out.
///
/// `hooks_dir` holds only the dir our `oci/` hook files go to (CRI-O creates a listed dir that is
/// missing and reads every file in it), never the podman-only precreate dir.
fn crio(path: &Path, setup: &Setup, oci_hooks: &Path) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let (mut doc, header) = parse_toml(path, before.as_deref().unwrap_or(""))?;
    let rt = table_at(doc.as_table_mut(), &["crio", "runtime"], path)?;
    let oci = oci_hooks.to_string_lossy();
    ensure_in_array(rt, "hooks_dir", &[], &[&oci], path)?;
    let h = table_at(rt, &["runtimes", HANDLER], path)?;
    set_str(h, "runtime_path", &setup.runtime_entry().to_string_lossy());
    set_str(h, "runtime_type", "oci");
    set_str(h, "runtime_root", "/run/runc");
    crio_drop_our_annotations(h, path)?;
    Ok(finish_toml(path, before, &header, &doc))
}

/// Takes our annotation keys out of the handler's `allowed_annotations` (CRI-O refuses the
/// handler for them), and the key itself when nothing else is left in it.
fn crio_drop_our_annotations(h: &mut Table, path: &Path) -> Result<(), ConfigureError> {
    if !h.contains_key("allowed_annotations") {
        return Ok(());
    }
    let ours = crate::decide::request::annotation_keys();
    let a = array_mut(h, "allowed_annotations", &[], path)?;
    if a.iter()
        .any(|v| v.as_str().is_some_and(|s| ours.contains(&s)))
    {
        a.retain(|v| !v.as_str().is_some_and(|s| ours.contains(&s)));
        a.fmt();
    }
    if a.is_empty() {
        h.remove("allowed_annotations");
    }
    Ok(())
}

/// podman: both hooks dirs in `[engine] hooks_dir` (podman's defaults kept, as setting the key
/// replaces them) and the named runtime `gpushare`.
fn podman_conf(
    path: &Path,
    setup: &Setup,
    oci_hooks: &Path,
    podman_hooks: &Path,
) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let (mut doc, header) = parse_toml(path, before.as_deref().unwrap_or(""))?;
    let engine = table_at(doc.as_table_mut(), &["engine"], path)?;
    ensure_in_array(
        engine,
        "hooks_dir",
        &[OCI_HOOKS_DIR, ETC_HOOKS_DIR],
        &[
            &oci_hooks.to_string_lossy(),
            &podman_hooks.to_string_lossy(),
        ],
        path,
    )?;
    let runtimes = table_at(engine, &["runtimes"], path)?;
    let entry = setup.runtime_entry().display().to_string();
    let want = [entry.as_str()];
    let is = runtimes
        .get(HANDLER)
        .and_then(Item::as_array)
        .is_some_and(|a| {
            a.iter()
                .map(|v| v.as_str())
                .eq(want.iter().map(|s| Some(*s)))
        });
    if !is {
        runtimes.insert(HANDLER, toml_edit::value(Array::from_iter(want)));
    }
    Ok(finish_toml(path, before, &header, &doc))
}

/// gpushare in front: `[runtime] next` of the policy file starts with nvidia-container-runtime.
fn nvidia_behind(policy: &Path) -> Result<Change, ConfigureError> {
    let before = read(policy)?;
    let (mut doc, header) = parse_toml(policy, before.as_deref().unwrap_or(""))?;
    let rt = table_at(doc.as_table_mut(), &["runtime"], policy)?;
    put_first(
        rt,
        "next",
        "nvidia-container-runtime",
        &["runc", "crun"],
        policy,
    )?;
    Ok(finish_toml(policy, before, &header, &doc))
}

/// NVIDIA in front: its `[nvidia-container-runtime] runtimes` starts with gpushare-runtime.
fn nvidia_in_front(path: &Path, setup: &Setup) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let (mut doc, header) = parse_toml(path, before.as_deref().unwrap_or(""))?;
    let t = table_at(doc.as_table_mut(), &["nvidia-container-runtime"], path)?;
    put_first(
        t,
        "runtimes",
        &setup.runtime_entry().to_string_lossy(),
        &["runc", "crun"],
        path,
    )?;
    Ok(finish_toml(path, before, &header, &doc))
}

/// A hook file with this installation's hook path, and `GPUSHARE_CONFIG` in its env for a
/// non-default policy file.
fn hook_json(text: &str, setup: &Setup) -> String {
    let mut v: Value = serde_json::from_str(text).expect("shipped hook files are JSON");
    v["hook"]["path"] = Value::String(setup.hook.display().to_string());
    if let (Some(p), Some(env)) = (&setup.policy, v["hook"]["env"].as_array_mut()) {
        env.push(format!("{}={}", crate::config::ENV_PATH, p.display()).into());
    }
    let mut s = serde_json::to_string_pretty(&v).expect("JSON value serialises");
    s.push('\n');
    s
}

fn hook_files(
    setup: &Setup,
    oci: &Path,
    podman: Option<&Path>,
) -> Result<Vec<Change>, ConfigureError> {
    let mut rows = vec![
        (oci.join("gpushare-createRuntime.json"), HOOK_CREATE),
        (oci.join("gpushare-poststop.json"), HOOK_POSTSTOP),
    ];
    if let Some(p) = podman {
        rows.push((p.join("gpushare-precreate.json"), HOOK_PRECREATE));
    }
    rows.into_iter()
        .map(|(path, text)| {
            let before = read(&path)?;
            let after = hook_json(text, setup);
            // An existing file with the same content in another layout stays as it is.
            let same = before
                .as_deref()
                .and_then(|b| serde_json::from_str::<Value>(b).ok())
                .is_some_and(|b| serde_json::from_str::<Value>(&after).ok() == Some(b));
            let after = if same {
                before.clone().unwrap_or(after)
            } else {
                after
            };
            Ok(change(&path, before, after, 0o644))
        })
        .collect()
}

/// Shell single quoting.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The launcher that runs `gpushare-runtime` with a non-default policy file.
fn launcher(policy: &Path, runtime: &Path) -> Result<Change, ConfigureError> {
    let path = launcher_path(policy);
    let before = read(&path)?;
    let after = format!(
        "#!/bin/sh\n# Written by `gpushare-hook configure`: gpushare-runtime with the policy file {}.\n{}={}\nexport {}\nexec {} \"$@\"\n",
        policy.display(),
        crate::config::ENV_PATH,
        sh_quote(&policy.to_string_lossy()),
        crate::config::ENV_PATH,
        sh_quote(&runtime.to_string_lossy()),
    );
    Ok(change(&path, before, after, 0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(policy: Option<&str>) -> Setup {
        Setup {
            hook: "/opt/gs/bin/gpushare-hook".into(),
            runtime: "/opt/gs/bin/gpushare-runtime".into(),
            policy: policy.map(PathBuf::from),
            source: "test".into(),
        }
    }

    fn plan_text(
        engine: Engine,
        file: &Path,
        text: Option<&str>,
        s: &Setup,
    ) -> Result<Vec<Change>, ConfigureError> {
        if let Some(t) = text {
            std::fs::write(file, t).unwrap();
        }
        let t = file.parent().unwrap().join("hooks");
        plan(
            engine,
            s,
            &Options {
                path: Some(file.to_owned()),
                hooks_dir: Some(t),
                containerd_version: Some(2),
                ..Options::default()
            },
        )
    }

    /// Applies a plan, then plans again: the second plan changes nothing.
    fn apply_and_replan(engine: Engine, file: &Path, s: &Setup) -> String {
        for c in plan_text(engine, file, None, s).unwrap() {
            super::super::apply(&c).unwrap();
        }
        let again = plan_text(engine, file, None, s).unwrap();
        assert!(
            again.iter().all(|c| !c.changes()),
            "{engine:?}: second run changes {again:?}"
        );
        std::fs::read_to_string(file).unwrap()
    }

    #[test]
    fn docker_merge_keeps_other_keys_and_refuses_bad_json() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("daemon.json");
        let s = setup(None);
        std::fs::write(&f, "{\"log-driver\": \"journald\", \"runtimes\": {\"other\": {\"path\": \"/x\"}}, \"zz\": 1}").unwrap();
        let text = apply_and_replan(Engine::Docker, &f, &s);
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
        let e = plan_text(Engine::Docker, &f, Some(bad), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::Json { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), bad);
        let e = plan_text(Engine::Docker, &f, Some("[1]"), &s).unwrap_err();
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
            for c in plan(Engine::Docker, &s, &opts).unwrap() {
                super::super::apply(&c).unwrap();
            }
            assert!(plan(Engine::Docker, &s, &opts)
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
            let text = apply_and_replan(Engine::Containerd, &f, &s);
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
        let e = plan_text(Engine::Containerd, &f, Some("root = \"/x\"\n"), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::ContainerdV1 { .. }), "{e}");
        let e = plan_text(Engine::Containerd, &f, Some("version = 2\n[plugins\n"), &s).unwrap_err();
        assert!(matches!(e, ConfigureError::Toml { .. }), "{e}");
        // A new file gets the version asked for.
        std::fs::remove_file(&f).unwrap();
        let c = plan_text(Engine::Containerd, &f, None, &s).unwrap();
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

    /// Files as users have them (tests/fixtures/containerd): the default runtime is defined, the
    /// handler gets its options, a second run changes nothing, version 1 is refused.
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
            let after = apply_and_replan(Engine::Containerd, &f, &s);
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
            let e = plan_text(Engine::Containerd, &f, Some(&text), &s).unwrap_err();
            assert!(matches!(e, ConfigureError::ContainerdV1 { .. }), "{e}");
            assert!(e.to_string().contains("version 1"), "{e}");
            assert_eq!(std::fs::read_to_string(&f).unwrap(), text);
        }
        let e = plan_text(Engine::Containerd, &f, Some("version = 4\n"), &s).unwrap_err();
        assert!(
            matches!(e, ConfigureError::ContainerdVersion { version: 4, .. }),
            "{e}"
        );
        // A handler option the admin set and the default lacks stays; one the default has follows it.
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\nSystemdCgroup = true\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpushare.options]\nSystemdCgroup = false\nRoot = \"/x\"\n";
        std::fs::write(&f, text).unwrap();
        let after = apply_and_replan(Engine::Containerd, &f, &s);
        let doc: toml::Table = after.parse().unwrap();
        let o = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["gpushare"]
            ["options"];
        assert_eq!(o["SystemdCgroup"].as_bool(), Some(true), "{after}");
        assert_eq!(o["Root"].as_str(), Some("/x"), "{after}");
    }

    #[test]
    fn podman_crio_and_nvidia_chaining() {
        let t = tempfile::tempdir().unwrap();
        let s = setup(None);
        let f = t.path().join("containers.conf");
        std::fs::write(&f, "[engine]\n# keep me\ncgroup_manager = \"cgroupfs\"\n").unwrap();
        let text = apply_and_replan(Engine::Podman, &f, &s);
        let doc: toml::Table = text.parse().unwrap();
        let dirs: Vec<&str> = doc["engine"]["hooks_dir"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            dirs[..2],
            [OCI_HOOKS_DIR, ETC_HOOKS_DIR],
            "podman's defaults kept"
        );
        assert!(dirs[2].ends_with("hooks/hooks.d") && dirs[3].ends_with("hooks/hooks.d-podman"));
        assert!(text.contains("# keep me"));
        let pre: Value = serde_json::from_str(
            &std::fs::read_to_string(
                t.path()
                    .join("hooks/hooks.d-podman/gpushare-precreate.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(pre["hook"]["path"], "/opt/gs/bin/gpushare-hook");

        let f = t.path().join("10-gpushare.conf");
        let text = apply_and_replan(Engine::Crio, &f, &s);
        let doc: toml::Table = text.parse().unwrap();
        assert_eq!(
            doc["crio"]["runtime"]["runtimes"]["gpushare"]["runtime_path"].as_str(),
            Some("/opt/gs/bin/gpushare-runtime")
        );
        assert!(
            !t.path()
                .join("hooks/hooks.d/gpushare-precreate.json")
                .exists(),
            "CRI-O never gets the precreate hook"
        );

        let f = t.path().join("policy.toml");
        std::fs::write(&f, "# policy\n[runtime]\nnext = [\"runc\"]\n").unwrap();
        let text = apply_and_replan(Engine::NvidiaContainerRuntime, &f, &s);
        assert!(
            text.contains("next = [\"nvidia-container-runtime\", \"runc\"]"),
            "{text}"
        );
        crate::config::Config::parse(&text, &f).unwrap();

        let f = t.path().join("nvidia.toml");
        std::fs::write(
            &f,
            "[nvidia-container-runtime]\nruntimes = [\"docker-runc\", \"runc\"]\n",
        )
        .unwrap();
        let c = plan(
            Engine::NvidiaContainerRuntime,
            &s,
            &Options {
                path: Some(f.clone()),
                order: Order::NvidiaFirst,
                ..Options::default()
            },
        )
        .unwrap();
        assert!(
            c[0].after.contains(
                "runtimes = [\"/opt/gs/bin/gpushare-runtime\", \"docker-runc\", \"runc\"]"
            ),
            "{}",
            c[0].after
        );
    }
}
