//! `configure <engine> --remove`: what `configure` added, taken out again, and nothing else.
//! The gpushare entries whose binary is gpushare's leave the engine's main file (the
//! `runtimes.gpushare` entry, the hooks dirs configure added, a default runtime naming it);
//! files of gpushare's own (hook files, a drop-in left empty, an unused launcher) are deleted.
//! Hook files podman and CRI-O share stay while the other engine's file still uses them.
//! Pure but for reading the files; [`super::write`] does the writing (with a backup).

use std::path::{Path, PathBuf};

use serde_json::Value;
use toml_edit::{DocumentMut, Item, Table};

use super::engines::{
    CONTAINERD_FILE, CRIO_FILE, DOCKER_FILE, ETC_HOOKS_DIR, NVIDIA_FILE, OCI_HOOKS_DIR,
    PODMAN_FILE, PODMAN_HOOKS_DIR,
};
use super::{is_ours, launcher_path, Change, ConfigureError, Engine, Options, Order, Setup};

const HANDLER: &str = "gpushare";
/// The first lines of a launcher `configure` wrote.
const LAUNCHER_MARK: &str = "# Written by `gpushare-hook configure`";

/// One file to rewrite or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Rewritten without gpushare's part.
    Write(Change),
    /// gpushare's own file: deleted (its content kept in the backup).
    Delete { path: PathBuf, before: String },
    /// Left as it is, and why (a shared hook file still in use).
    Keep { path: PathBuf, why: String },
}

impl Edit {
    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            Edit::Write(c) => &c.path,
            Edit::Delete { path, .. } | Edit::Keep { path, .. } => path,
        }
    }

    /// Whether carrying it out changes anything.
    pub fn changes(&self) -> bool {
        match self {
            Edit::Write(c) => c.changes(),
            Edit::Delete { .. } => true,
            Edit::Keep { .. } => false,
        }
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

/// The edits that undo `configure engine` with the same options. Reads only.
///
/// # Errors
/// [`ConfigureError`] for a file that cannot be read or parsed (nothing is then changed).
pub fn plan(engine: Engine, setup: &Setup, opts: &Options) -> Result<Vec<Edit>, ConfigureError> {
    let main = |default: &str| opts.path.clone().unwrap_or_else(|| PathBuf::from(default));
    let (oci, podman) = match &opts.hooks_dir {
        Some(d) => (d.join("hooks.d"), d.join("hooks.d-podman")),
        None => (
            PathBuf::from(OCI_HOOKS_DIR),
            PathBuf::from(PODMAN_HOOKS_DIR),
        ),
    };
    let mut out = Vec::new();
    match engine {
        Engine::Docker => out.extend(docker(&main(DOCKER_FILE))?),
        Engine::Containerd => out.extend(containerd(&main(CONTAINERD_FILE))?),
        Engine::Crio => {
            let f = main(CRIO_FILE);
            out.extend(toml_file(&f, |doc| {
                let Some(rt) = table(doc.as_table_mut(), &["crio", "runtime"]) else {
                    return;
                };
                remove_runtime(rt, "runtimes", |t| {
                    str_at(t, "runtime_path").is_some_and(|p| is_ours(p, "gpushare-runtime"))
                });
                remove_dirs(rt, "hooks_dir", &[&oci], &[OCI_HOOKS_DIR]);
            })?);
            let other = uses_hooks(Path::new(PODMAN_FILE), &oci, &f);
            out.extend(hook_files(&[&oci], other.as_deref())?);
        }
        Engine::Podman => {
            let f = main(PODMAN_FILE);
            out.extend(toml_file(&f, |doc| {
                let Some(e) = table(doc.as_table_mut(), &["engine"]) else {
                    return;
                };
                if let Some(r) = e.get_mut("runtimes").and_then(Item::as_table_like_mut) {
                    let ours = r.get(HANDLER).and_then(Item::as_array).is_some_and(|a| {
                        a.iter()
                            .any(|v| v.as_str().is_some_and(|p| is_ours(p, "gpushare-runtime")))
                    });
                    if ours {
                        r.remove(HANDLER);
                    }
                    if r.is_empty() {
                        e.remove("runtimes");
                    }
                }
                remove_dirs(
                    e,
                    "hooks_dir",
                    &[&oci, &podman],
                    &[OCI_HOOKS_DIR, ETC_HOOKS_DIR],
                );
            })?);
            let other = uses_hooks(Path::new(CRIO_FILE), &oci, &f);
            out.extend(hook_files(&[&oci], other.as_deref())?);
            out.extend(hook_files(&[&podman], None)?);
        }
        Engine::NvidiaContainerRuntime => match opts.order {
            Order::GpushareFirst => {
                let policy = setup
                    .policy
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_PATH));
                let f = main(&policy.to_string_lossy());
                out.extend(toml_edit_only(&f, |doc| {
                    if let Some(rt) = table(doc.as_table_mut(), &["runtime"]) {
                        remove_from_array(rt, "next", |s| s == "nvidia-container-runtime");
                    }
                })?);
            }
            Order::NvidiaFirst => {
                let f = main(NVIDIA_FILE);
                out.extend(toml_edit_only(&f, |doc| {
                    if let Some(t) = table(doc.as_table_mut(), &["nvidia-container-runtime"]) {
                        remove_from_array(t, "runtimes", |s| is_ours(s, "gpushare-runtime"));
                    }
                })?);
            }
        },
    }
    if let Some(policy) = &setup.policy {
        out.extend(launcher(policy, &out)?);
    }
    Ok(out)
}

/// Docker: `runtimes.gpushare` (when it runs gpushare-runtime) and a `default-runtime` naming it.
fn docker(path: &Path) -> Result<Option<Edit>, ConfigureError> {
    let Some(text) = read(path)? else {
        return Ok(None);
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let mut v: Value = serde_json::from_str(&text).map_err(|source| ConfigureError::Json {
        path: path.to_owned(),
        source,
    })?;
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
    let mut s = serde_json::to_string_pretty(&v).expect("JSON value serialises");
    s.push('\n');
    Ok(Some(Edit::Write(Change {
        path: path.to_owned(),
        before: Some(text),
        after: s,
        mode: 0o644,
    })))
}

/// containerd: the `gpushare` handler in either layout, and a default runtime naming it.
fn containerd(path: &Path) -> Result<Option<Edit>, ConfigureError> {
    toml_edit_only(path, |doc| {
        for plugin in ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"] {
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

fn unchanged(path: &Path, text: String) -> Edit {
    Edit::Write(Change {
        path: path.to_owned(),
        before: Some(text.clone()),
        after: text,
        mode: 0o644,
    })
}

/// The standard or inline table at `keys`, if there is one.
fn table<'a>(root: &'a mut Table, keys: &[&str]) -> Option<&'a mut Table> {
    let mut cur = root;
    for k in keys {
        cur = cur.get_mut(k)?.as_table_mut()?;
    }
    Some(cur)
}

fn str_at<'a>(t: &'a dyn toml_edit::TableLike, key: &str) -> Option<&'a str> {
    t.get(key).and_then(Item::as_str)
}

/// Removes `HANDLER` from the table `key` of `t` when `ours` says it is gpushare's; an emptied
/// `key` goes too.
fn remove_runtime(t: &mut Table, key: &str, ours: impl Fn(&dyn toml_edit::TableLike) -> bool) {
    let Some(r) = t.get_mut(key).and_then(Item::as_table_like_mut) else {
        return;
    };
    if r.get(HANDLER)
        .and_then(Item::as_table_like)
        .is_some_and(ours)
    {
        r.remove(HANDLER);
    }
    if r.is_empty() {
        t.remove(key);
    }
}

/// Takes `ours` out of the array `key`; when what is left is exactly `defaults` (what
/// configure put there to keep the engine's defaults), the key goes.
fn remove_dirs(t: &mut Table, key: &str, ours: &[&Path], defaults: &[&str]) {
    let Some(a) = t.get_mut(key).and_then(Item::as_array_mut) else {
        return;
    };
    let ours: Vec<String> = ours
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| !defaults.contains(&p.as_str()))
        .collect();
    a.retain(|v| v.as_str().is_none_or(|s| !ours.iter().any(|o| o == s)));
    let left: Vec<&str> = a.iter().filter_map(|v| v.as_str()).collect();
    // Nothing left, or just the engine's own defaults: the key goes, and the engine's default
    // list is back (an empty list would mean no hooks at all).
    if left.is_empty() || left == defaults {
        t.remove(key);
    }
}

fn remove_from_array(t: &mut Table, key: &str, ours: impl Fn(&str) -> bool) {
    if let Some(a) = t.get_mut(key).and_then(Item::as_array_mut) {
        a.retain(|v| v.as_str().is_none_or(|s| !ours(s)));
        a.fmt();
    }
}

/// Whether a TOML document holds no value at all (only empty tables).
fn is_empty(t: &dyn toml_edit::TableLike) -> bool {
    t.iter().all(|(_, v)| match v {
        Item::Table(t) => is_empty(t),
        Item::Value(toml_edit::Value::InlineTable(t)) => is_empty(t),
        Item::None => true,
        _ => false,
    })
}

/// A TOML file of gpushare's (a drop-in): edited by `f`, deleted when nothing is left.
fn toml_file(
    path: &Path,
    f: impl FnOnce(&mut DocumentMut),
) -> Result<Option<Edit>, ConfigureError> {
    Ok(match toml_edit_only(path, f)? {
        Some(Edit::Write(c))
            if c.changes()
                && is_empty(
                    c.after
                        .parse::<DocumentMut>()
                        .expect("printed TOML parses")
                        .as_table(),
                ) =>
        {
            Some(Edit::Delete {
                path: c.path,
                before: c.before.unwrap_or_default(),
            })
        }
        other => other,
    })
}

/// A TOML file edited by `f`; kept byte for byte when `f` changes nothing.
fn toml_edit_only(
    path: &Path,
    f: impl FnOnce(&mut DocumentMut),
) -> Result<Option<Edit>, ConfigureError> {
    let Some(text) = read(path)? else {
        return Ok(None);
    };
    let mut doc = text
        .parse::<DocumentMut>()
        .map_err(|source| ConfigureError::Toml {
            path: path.to_owned(),
            source,
        })?;
    let was = doc.to_string();
    f(&mut doc);
    let now = doc.to_string();
    if now == was {
        return Ok(Some(unchanged(path, text)));
    }
    Ok(Some(Edit::Write(Change {
        path: path.to_owned(),
        before: Some(text),
        after: now,
        mode: 0o644,
    })))
}

/// The other engine's file that still names `hooks` (so its hook files stay), unless it is
/// the file being edited.
fn uses_hooks(other: &Path, hooks: &Path, editing: &Path) -> Option<String> {
    if other == editing {
        return None;
    }
    let text = std::fs::read_to_string(other).ok()?;
    let doc: toml::Table = text.parse().ok()?;
    let dirs = doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .or_else(|| doc.get("engine"))
        .and_then(|t| t.get("hooks_dir"))
        .and_then(|d| d.as_array())?;
    let h = hooks.to_string_lossy();
    let named = dirs.iter().any(|d| d.as_str() == Some(&*h));
    let default_shared = h == OCI_HOOKS_DIR && text.contains("gpushare");
    (named || default_shared).then(|| format!("{} still uses it", other.display()))
}

/// gpushare's hook files in `dirs` (their `hook.path` is gpushare-hook): deleted, or kept
/// because `keep` says another engine uses them.
fn hook_files(dirs: &[&Path], keep: Option<&str>) -> Result<Vec<Edit>, ConfigureError> {
    let mut out = Vec::new();
    for d in dirs {
        for name in [
            "gpushare-createRuntime.json",
            "gpushare-poststop.json",
            "gpushare-precreate.json",
        ] {
            let path = d.join(name);
            let Some(text) = read(&path)? else { continue };
            let ours = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| {
                    v["hook"]["path"]
                        .as_str()
                        .map(|p| is_ours(p, "gpushare-hook"))
                })
                .unwrap_or(false);
            if !ours {
                continue;
            }
            out.push(match keep {
                Some(why) if name != "gpushare-precreate.json" => Edit::Keep {
                    path,
                    why: why.to_owned(),
                },
                _ => Edit::Delete { path, before: text },
            });
        }
    }
    Ok(out)
}

/// The launcher for a non-default policy: deleted when no engine file names it any more.
fn launcher(policy: &Path, edits: &[Edit]) -> Result<Option<Edit>, ConfigureError> {
    let path = launcher_path(policy);
    let Some(text) = read(&path)? else {
        return Ok(None);
    };
    if !text
        .lines()
        .nth(1)
        .is_some_and(|l| l.starts_with(LAUNCHER_MARK))
    {
        return Ok(None);
    }
    let needle = path.to_string_lossy().into_owned();
    let edited = |f: &Path| edits.iter().find(|e| e.path() == f);
    for f in [
        DOCKER_FILE,
        CONTAINERD_FILE,
        CRIO_FILE,
        PODMAN_FILE,
        NVIDIA_FILE,
    ] {
        let f = Path::new(f);
        let still = match edited(f) {
            Some(Edit::Write(c)) => c.after.contains(&needle),
            Some(Edit::Delete { .. }) => false,
            Some(Edit::Keep { .. }) | None => {
                std::fs::read_to_string(f).is_ok_and(|t| t.contains(&needle))
            }
        };
        if still {
            return Ok(Some(Edit::Keep {
                path,
                why: format!("{} still runs it", f.display()),
            }));
        }
    }
    Ok(Some(Edit::Delete { path, before: text }))
}
