//! The OCI hook files podman and CRI-O run gpushare-hook from: written from the shipped files
//! with this installation's hook path (and policy), taken out again, and read back by doctor.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::check::{executable, policy_of};
use super::edit::{change, read};
use super::setup::{is_ours, Change, ConfigureError, Edit, Options, Setup};

const HOOK_CREATE: &str = include_str!("../../../hooks/oci/gpushare-createRuntime.json");
const HOOK_POSTSTOP: &str = include_str!("../../../hooks/oci/gpushare-poststop.json");
const HOOK_PRECREATE: &str =
    include_str!("../../../hooks/podman-precreate/gpushare-precreate.json");

/// The hooks dir podman and CRI-O both read by default (packages' files: `configure` never
/// writes there).
pub const OCI_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";
/// podman's other default hooks dir, the operator's: where `configure` writes the
/// createRuntime and poststop hook files (the package ships them there as conffiles).
pub const ETC_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";
/// The podman-only dir for the precreate hook (CRI-O does not know the stage: a precreate file in
/// a dir CRI-O reads stops it at start-up).
pub const PODMAN_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d-podman";

/// The dirs `configure` writes hook files to: (the OCI dir both engines read, podman's own),
/// both under /etc.
pub fn dirs(opts: &Options) -> (PathBuf, PathBuf) {
    match &opts.hooks_dir {
        Some(d) => (d.join("hooks.d"), d.join("hooks.d-podman")),
        None => (
            PathBuf::from(ETC_HOOKS_DIR),
            PathBuf::from(PODMAN_HOOKS_DIR),
        ),
    }
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

/// The hook files to write: createRuntime and poststop in `oci`, precreate in `podman`.
pub(super) fn plan(
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
    let default_shared = (h == OCI_HOOKS_DIR || h == ETC_HOOKS_DIR) && text.contains("gpushare");
    (named || default_shared).then(|| format!("{} still uses it", other.display()))
}

/// Why the hook files in `hooks` stay when `engine` takes its own out: another engine that runs
/// hooks still names that dir in its file (not `editing`).
pub(super) fn still_used(engine: &str, hooks: &Path, editing: &Path) -> Option<String> {
    super::ENGINES
        .iter()
        .filter(|e| e.name() != engine && e.def().runs_hook())
        .flat_map(|e| e.def().files())
        .find_map(|f| uses_hooks(Path::new(f), hooks, editing))
}

/// gpushare's hook files in `dirs` (their `hook.path` is gpushare-hook): deleted, or kept
/// because `keep` says another engine uses them.
pub(super) fn remove(dirs: &[&Path], keep: Option<&str>) -> Result<Vec<Edit>, ConfigureError> {
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

/// One stage of one of our hook files: (stage, file, hook path, GPUSHARE_CONFIG of its env).
pub(super) type HookEntry = (String, PathBuf, String, Option<String>);

/// Our hook files in `dirs`, or a file that does not parse.
pub(super) fn ours(dirs: &[String]) -> Result<Vec<HookEntry>, String> {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        for e in rd.flatten() {
            let f = e.path();
            if f.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| format!("hook file {} is not valid JSON ({e})", f.display()))?;
            let Some(path) = v["hook"]["path"].as_str() else {
                continue;
            };
            if !is_ours(path, "gpushare-hook") {
                continue;
            }
            let env = v["hook"]["env"].as_array().and_then(|a| {
                a.iter().find_map(|x| {
                    x.as_str()?
                        .strip_prefix(&format!("{}=", crate::config::ENV_PATH))
                        .map(str::to_owned)
                })
            });
            for s in v["stages"].as_array().into_iter().flatten() {
                if let Some(s) = s.as_str() {
                    out.push((s.to_owned(), f.clone(), path.to_owned(), env.clone()));
                }
            }
        }
    }
    Ok(out)
}

/// Checks hook entries: each hook binary executable and each policy loadable.
pub(super) fn check_entries(engine: &str, hooks: &[HookEntry]) -> Result<String, String> {
    let mut policies = Vec::new();
    for (stage, file, path, env) in hooks {
        executable(Path::new(path))
            .map_err(|e| format!("{engine}: {stage} hook in {}: {e}", file.display()))?;
        let p = policy_of(env.as_deref())
            .map_err(|e| format!("{engine}: {stage} hook in {}: {e}", file.display()))?;
        if !policies.contains(&p) {
            policies.push(p);
        }
    }
    Ok(policies.join(", "))
}
