//! The spec edit: one pure function that changes a raw `config.json` value so that env
//! injection works (docs/design.md "Why env needs the spec edit"). Its two callers are
//! `gpushare-hook precreate` and `gpushare-runtime`, through [`crate::container::prepare`].
//!
//! Works on the raw [`serde_json::Value`] so that unknown fields are preserved; applying the same
//! edit twice gives the same value.

use std::path::PathBuf;

use serde_json::{json, Map, Value};
use thiserror::Error;

use crate::container::inject::Binding;

/// A `config.json` this edit cannot work on.
#[derive(Debug, Error)]
pub enum SpecEditError {
    #[error("config.json: {0} is not of the type the OCI runtime spec gives it")]
    Shape(&'static str),
}

/// The hook entries added for `createRuntime` and `poststop`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookCall {
    pub path: PathBuf,
    /// The hook's whole environment (explicit and minimal).
    pub env: Vec<String>,
}

/// Everything the edit adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edit {
    /// Set (replacing a same-named entry) in `process.env`.
    pub env: Vec<(String, String)>,
    /// Appended to `LD_PRELOAD` unless already listed.
    pub preload: Option<String>,
    /// Added to `mounts` as bind mounts, after the existing ones (so they win).
    pub mounts: Vec<Binding>,
    /// gpushare's state dir: an existing mount onto one of `mounts`' targets whose source is
    /// under it but is not ours (a bundle reused under another id) is dropped.
    pub owned: Option<PathBuf>,
    pub hook: Option<HookCall>,
}

impl Edit {
    /// A full edit (MPS env, a preload, a pipe mount, the state dir, a hook call with a
    /// reservation): the one fixture of this module's tests and of the spec-edit fuzz target.
    #[doc(hidden)]
    pub fn example() -> Self {
        Self {
            env: vec![
                ("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/nvidia-mps".into()),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "30".into()),
            ],
            preload: Some("/usr/local/gpushare/l.so".into()),
            mounts: vec![Binding {
                source: "/run/gpushare/mps/GPU-0/pipe".into(),
                target: "/tmp/nvidia-mps".into(),
                dir: true,
                readonly: false,
            }],
            owned: Some("/run/gpushare".into()),
            hook: Some(HookCall {
                path: "/usr/bin/gpushare-hook".into(),
                env: vec![
                    "PATH=/usr/bin:/bin".into(),
                    "GPUSHARE_RESERVATION=pending-00".into(),
                ],
            }),
        }
    }
}

fn object<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &'static str,
) -> Result<&'a mut Map<String, Value>, SpecEditError> {
    parent
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or(SpecEditError::Shape(what))
}

fn array<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &'static str,
) -> Result<&'a mut Vec<Value>, SpecEditError> {
    parent
        .entry(key.to_owned())
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or(SpecEditError::Shape(what))
}

fn set_env(env: &mut Vec<Value>, key: &str, value: &str) -> Result<(), SpecEditError> {
    let want = format!("{key}={value}");
    let prefix = format!("{key}=");
    for e in env.iter_mut() {
        let s = e.as_str().ok_or(SpecEditError::Shape("process.env"))?;
        if s.starts_with(&prefix) {
            if s != want {
                *e = Value::String(want);
            }
            return Ok(());
        }
    }
    env.push(Value::String(want));
    Ok(())
}

fn append_preload(env: &mut Vec<Value>, lib: &str) -> Result<(), SpecEditError> {
    for e in env.iter_mut() {
        let s = e.as_str().ok_or(SpecEditError::Shape("process.env"))?;
        if let Some(old) = s.strip_prefix("LD_PRELOAD=") {
            if old
                .split(|c: char| c == ':' || c.is_ascii_whitespace())
                .any(|p| p == lib)
            {
                return Ok(());
            }
            *e = Value::String(if old.trim().is_empty() {
                format!("LD_PRELOAD={lib}")
            } else {
                format!("LD_PRELOAD={old}:{lib}")
            });
            return Ok(());
        }
    }
    env.push(Value::String(format!("LD_PRELOAD={lib}")));
    Ok(())
}

fn mount_value(b: &Binding) -> Value {
    let mut options = vec!["rbind", "nosuid", "nodev"];
    // A runtime remounts a bind with exactly these flags: without `noexec` a directory the
    // tenant can write would run what it writes, whatever the host mount says.
    if b.noexec() {
        options.push("noexec");
    }
    options.push(if b.readonly { "ro" } else { "rw" });
    json!({
        "destination": b.target,
        "type": "bind",
        "source": b.source,
        "options": options,
    })
}

/// Whether `mounts` already binds `b.source` at `b.target`.
pub fn has_mount(mounts: &[Value], b: &Binding) -> bool {
    mounts.iter().any(|m| {
        m.get("destination").and_then(Value::as_str) == Some(b.target.as_str())
            && m.get("source").and_then(Value::as_str) == b.source.to_str()
    })
}

/// The env entries of a hook call that the hook must see even when the runtime's entry for it
/// was made by someone else (podman's hooks.d): the reservation the edit made.
const CARRIED_ENV: &[&str] = &[crate::decide::front::RESERVATION_ENV];

/// Whether the hook entry `h` runs gpushare's hook for `stage`: the configured path, or any
/// path to a program named `gpushare-hook` (hooks.d may name another install path).
fn is_our_entry(h: &Value, path: &str, stage: &str) -> bool {
    let hp = h.get("path").and_then(Value::as_str);
    let ours = hp == Some(path)
        || hp
            .is_some_and(|p| std::path::Path::new(p).file_name() == Some("gpushare-hook".as_ref()));
    ours && h
        .get("args")
        .and_then(Value::as_array)
        .and_then(|a| a.get(1))
        .and_then(Value::as_str)
        == Some(stage)
}

fn add_hook(hooks: &mut Vec<Value>, call: &HookCall, stage: &str) -> Result<(), SpecEditError> {
    let path = call.path.to_string_lossy();
    let mut present = false;
    for h in hooks.iter_mut().filter(|h| is_our_entry(h, &path, stage)) {
        present = true;
        // An entry made by hooks.d: give it what this edit's own entry would carry, so that
        // the hook consumes the reservation made for this container.
        let carried: Vec<(&str, &str)> = call
            .env
            .iter()
            .filter_map(|e| e.split_once('='))
            .filter(|(k, _)| stage == "createRuntime" && CARRIED_ENV.contains(k))
            .collect();
        if carried.is_empty() {
            continue;
        }
        let entry = h
            .as_object_mut()
            .ok_or(SpecEditError::Shape("a hook entry"))?;
        let env = array(entry, "env", "a hook entry's env")?;
        for (k, v) in carried {
            set_env(env, k, v).map_err(|_| SpecEditError::Shape("a hook entry's env"))?;
        }
    }
    if !present {
        hooks.push(json!({
            "path": path,
            "args": ["gpushare-hook", stage],
            "env": call.env,
        }));
    }
    Ok(())
}

/// Applies `edit` to the raw config `spec`. Unknown fields are preserved; applying the same edit
/// again changes nothing; an empty edit changes nothing.
///
/// # Errors
/// [`SpecEditError`] when a part the edit touches has the wrong JSON type.
pub fn apply(spec: &mut Value, edit: &Edit) -> Result<(), SpecEditError> {
    if *edit == Edit::default() {
        return Ok(());
    }
    let root = spec
        .as_object_mut()
        .ok_or(SpecEditError::Shape("the document"))?;
    if !edit.env.is_empty() || edit.preload.is_some() {
        let process = object(root, "process", "process")?;
        let env = array(process, "env", "process.env")?;
        for (k, v) in &edit.env {
            set_env(env, k, v)?;
        }
        if let Some(lib) = &edit.preload {
            append_preload(env, lib)?;
        }
    }
    if !edit.mounts.is_empty() {
        let mounts = array(root, "mounts", "mounts")?;
        if let Some(owned) = &edit.owned {
            mounts.retain(|m| {
                let dest = m.get("destination").and_then(Value::as_str);
                let src = m
                    .get("source")
                    .and_then(Value::as_str)
                    .map(std::path::Path::new);
                let stale = edit.mounts.iter().any(|b| {
                    dest == Some(b.target.as_str())
                        && src.is_some_and(|s| s.starts_with(owned) && s != b.source)
                });
                !stale
            });
        }
        for b in &edit.mounts {
            if !has_mount(mounts, b) {
                mounts.push(mount_value(b));
            }
        }
    }
    if let Some(call) = &edit.hook {
        let hooks = object(root, "hooks", "hooks")?;
        add_hook(
            array(hooks, "createRuntime", "hooks.createRuntime")?,
            call,
            "createRuntime",
        )?;
        add_hook(
            array(hooks, "poststop", "hooks.poststop")?,
            call,
            "poststop",
        )?;
    }
    Ok(())
}

/// Env names a spec edit sets in `process.env` (DESIGN "What the container sees"); a name ending
/// in `_` is a prefix (`CUDA_DEVICE_MEMORY_LIMIT_<i>`).
const SHARE_ENV: [&str; 6] = [
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
];

fn is_share_env(name: &str) -> bool {
    SHARE_ENV.iter().any(|s| match s.strip_suffix('_') {
        Some(_) => name.starts_with(s) && name.len() > s.len(),
        None => name == *s,
    })
}

/// Whether `config` holds the createRuntime entry a spec edit adds (`gpushare-hook
/// createRuntime`): the container was given a share by gpushare-runtime or precreate.
pub fn was_edited(config: &Value) -> bool {
    config
        .pointer("/hooks/createRuntime")
        .and_then(Value::as_array)
        .is_some_and(|hooks| {
            hooks.iter().any(|h| {
                h.get("args").and_then(Value::as_array).is_some_and(|a| {
                    a.first().and_then(Value::as_str) == Some("gpushare-hook")
                        && a.get(1).and_then(Value::as_str) == Some("createRuntime")
                })
            })
        })
}

/// The env part of the edit that was applied to `config` (an edited container's
/// `config.json`): its share variables as they stand there, and the limiter it preloads
/// (an `LD_PRELOAD` entry under `limit_dir`). `None` when `config` was not edited
/// ([`was_edited`]): such a container's processes are left alone. Used to give processes
/// exec'd into a running container (`runc exec --process`) the env of its main process.
pub fn applied_env(config: &Value, limit_dir: &str) -> Option<Edit> {
    if !was_edited(config) {
        return None;
    }
    let env = config.pointer("/process/env").and_then(Value::as_array);
    let entries = env.into_iter().flatten().filter_map(Value::as_str);
    let mut edit = Edit::default();
    let dir = format!("{}/", limit_dir.trim_end_matches('/'));
    for kv in entries {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        if is_share_env(k) {
            edit.env.retain(|(old, _)| old != k);
            edit.env.push((k.to_owned(), v.to_owned()));
        } else if k == "LD_PRELOAD" {
            edit.preload = v
                .split(|c: char| c == ':' || c.is_ascii_whitespace())
                .find(|p| p.starts_with(&dir))
                .map(str::to_owned);
        }
    }
    Some(edit)
}

/// Applies the env part of `edit` (env and preload) to a runtime `process` object, as `runc
/// exec --process FILE` reads it. Unknown fields are preserved; applying twice changes nothing.
///
/// # Errors
/// [`SpecEditError`] when the process or its env has the wrong JSON type.
pub fn apply_to_process(process: &mut Value, edit: &Edit) -> Result<(), SpecEditError> {
    if edit.env.is_empty() && edit.preload.is_none() {
        return Ok(());
    }
    let process = process
        .as_object_mut()
        .ok_or(SpecEditError::Shape("the process"))?;
    let env = array(process, "env", "process.env")?;
    for (k, v) in &edit.env {
        set_env(env, k, v)?;
    }
    if let Some(lib) = &edit.preload {
        append_preload(env, lib)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit() -> Edit {
        Edit::example()
    }

    #[test]
    fn edits_env_mounts_and_hooks_keeping_the_rest() {
        let mut v: Value = serde_json::from_str(
            r#"{"ociVersion":"1.0.2","x-unknown":{"keep":[1,2]},
                "process":{"args":["sh"],"env":["PATH=/bin","LD_PRELOAD=/a.so","CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=99"],"user":{"uid":0}},
                "mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
                "hooks":{"prestart":[{"path":"/x"}]}}"#,
        )
        .unwrap();
        apply(&mut v, &edit()).unwrap();
        assert_eq!(v["x-unknown"], json!({"keep":[1,2]}));
        assert_eq!(v["process"]["user"], json!({"uid":0}));
        assert_eq!(
            v["process"]["env"],
            json!([
                "PATH=/bin",
                "LD_PRELOAD=/a.so:/usr/local/gpushare/l.so",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
            ])
        );
        assert_eq!(v["mounts"].as_array().unwrap().len(), 2);
        assert_eq!(
            v["mounts"][1]["options"],
            json!(["rbind", "nosuid", "nodev", "noexec", "rw"])
        );
        assert_eq!(v["hooks"]["prestart"], json!([{"path":"/x"}]));
        assert_eq!(
            v["hooks"]["createRuntime"],
            json!([{"path":"/usr/bin/gpushare-hook","args":["gpushare-hook","createRuntime"],"env":["PATH=/usr/bin:/bin","GPUSHARE_RESERVATION=pending-00"]}])
        );
        assert_eq!(v["hooks"]["poststop"][0]["args"][1], "poststop");
        // The same bundle edited for another container: the stale mount is replaced.
        let mut other = edit();
        other.owned = Some("/run/gpushare".into());
        other.mounts[0].source = "/run/gpushare/mps/GPU-1/pipe".into();
        apply(&mut v, &other).unwrap();
        assert_eq!(v["mounts"].as_array().unwrap().len(), 2);
        assert_eq!(v["mounts"][1]["source"], "/run/gpushare/mps/GPU-1/pipe");
        // Key order of the original document is kept (preserve_order).
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            ["ociVersion", "x-unknown", "process", "mounts", "hooks"]
        );
    }

    #[test]
    fn idempotent_and_empty_edit_is_a_no_op() {
        let rows: &[(&str, &str)] = &[
            ("minimal", r#"{"process":{"args":["sh"]}}"#),
            ("no process", r#"{"ociVersion":"1.0.2"}"#),
            ("empty LD_PRELOAD", r#"{"process":{"env":["LD_PRELOAD="]}}"#),
        ];
        for (what, text) in rows {
            let mut once: Value = serde_json::from_str(text).unwrap();
            apply(&mut once, &edit()).unwrap();
            let mut twice = once.clone();
            apply(&mut twice, &edit()).unwrap();
            assert_eq!(
                serde_json::to_string(&once).unwrap(),
                serde_json::to_string(&twice).unwrap(),
                "{what}"
            );
            let mut untouched: Value = serde_json::from_str(text).unwrap();
            apply(&mut untouched, &Edit::default()).unwrap();
            assert_eq!(
                untouched,
                serde_json::from_str::<Value>(text).unwrap(),
                "{what}"
            );
        }
    }

    #[test]
    fn an_entry_from_hooks_d_gets_the_reservation() {
        let mut e = edit();
        let hook = e.hook.as_mut().unwrap();
        hook.env.push("GPUSHARE_RESERVATION=pending-ab".into());
        let rows: &[(&str, &str)] = &[
            ("same path", "/usr/bin/gpushare-hook"),
            ("another install path", "/usr/local/bin/gpushare-hook"),
        ];
        for (what, path) in rows {
            let mut v = json!({"hooks":{"createRuntime":[
                {"path":"/x","args":["x","createRuntime"]},
                {"path":path,"args":["gpushare-hook","createRuntime"],"env":["PATH=/bin","GPUSHARE_RESERVATION=stale"],"timeout":5}
            ],"poststop":[{"path":path,"args":["gpushare-hook","poststop"]}]}});
            apply(&mut v, &e).unwrap();
            let cr = &v["hooks"]["createRuntime"];
            assert_eq!(cr.as_array().unwrap().len(), 2, "{what}: no second entry");
            assert_eq!(
                cr[1],
                json!({"path":path,"args":["gpushare-hook","createRuntime"],"env":["PATH=/bin","GPUSHARE_RESERVATION=pending-ab"],"timeout":5}),
                "{what}"
            );
            assert_eq!(
                cr[0],
                json!({"path":"/x","args":["x","createRuntime"]}),
                "{what}"
            );
            assert_eq!(
                v["hooks"]["poststop"],
                json!([{"path":path,"args":["gpushare-hook","poststop"]}]),
                "{what}: poststop untouched"
            );
            let once = v.clone();
            apply(&mut v, &e).unwrap();
            assert_eq!(v, once, "{what}: idempotent");
        }
        let mut v = json!({"hooks":{"createRuntime":[{"path":"/usr/bin/gpushare-hook","args":["gpushare-hook","createRuntime"],"env":"x"}]}});
        assert!(apply(&mut v, &e).is_err());
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let rows: &[(&str, &str)] = &[
            ("not an object", "[1]"),
            ("env not an array", r#"{"process":{"env":"A=1"}}"#),
            ("env entry not a string", r#"{"process":{"env":[1]}}"#),
            ("mounts not an array", r#"{"mounts":{}}"#),
            ("hooks not an object", r#"{"hooks":[]}"#),
        ];
        for (what, text) in rows {
            let mut v: Value = serde_json::from_str(text).unwrap();
            assert!(apply(&mut v, &edit()).is_err(), "{what}");
        }
    }

    #[test]
    fn exec_processes_get_the_env_of_the_main_process() {
        let mut config: Value = serde_json::from_str(
            r#"{"process":{"args":["sh"],"env":["PATH=/bin","GPU_SHARE=limit","LD_PRELOAD=/a.so"]}}"#,
        )
        .unwrap();
        // Not edited by gpushare: nothing to hand on, even with share-like names in its env.
        assert_eq!(applied_env(&config, "/usr/local/gpushare"), None);
        let limit = Edit {
            env: vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "1073741824".into()),
                ("CUDA_DEVICE_SM_LIMIT".into(), "30".into()),
                (
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
                    "/usr/local/gpushare/shared/cache".into(),
                ),
            ],
            preload: Some("/usr/local/gpushare/libgpushare_limiter.so".into()),
            hook: edit().hook,
            ..Edit::default()
        };
        apply(&mut config, &limit).unwrap();
        let got = applied_env(&config, "/usr/local/gpushare").unwrap();
        assert_eq!(got.env, limit.env);
        assert_eq!(got.preload, limit.preload);
        assert!(got.mounts.is_empty() && got.hook.is_none());

        // (description, process before, env after)
        let rows: Vec<(&str, Value, Vec<&str>)> = vec![
            (
                "containerd's exec: the stored spec's env, unedited",
                json!({"args":["nvidia-smi"],"env":["PATH=/bin","GPU_SHARE=limit","LD_PRELOAD=/a.so"],"cwd":"/"}),
                vec![
                    "PATH=/bin",
                    "GPU_SHARE=limit",
                    "LD_PRELOAD=/a.so:/usr/local/gpushare/libgpushare_limiter.so",
                    "CUDA_DEVICE_MEMORY_LIMIT_0=1073741824",
                    "CUDA_DEVICE_SM_LIMIT=30",
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/gpushare/shared/cache",
                ],
            ),
            (
                "a tenant's own value is replaced, no env at all is created",
                json!({"args":["sh"],"env":["CUDA_DEVICE_SM_LIMIT=100"]}),
                vec![
                    "CUDA_DEVICE_SM_LIMIT=30",
                    "CUDA_DEVICE_MEMORY_LIMIT_0=1073741824",
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/gpushare/shared/cache",
                    "LD_PRELOAD=/usr/local/gpushare/libgpushare_limiter.so",
                ],
            ),
            (
                "no env key",
                json!({"args":["sh"]}),
                vec![
                    "CUDA_DEVICE_MEMORY_LIMIT_0=1073741824",
                    "CUDA_DEVICE_SM_LIMIT=30",
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/gpushare/shared/cache",
                    "LD_PRELOAD=/usr/local/gpushare/libgpushare_limiter.so",
                ],
            ),
        ];
        for (what, mut p, want) in rows {
            apply_to_process(&mut p, &got).unwrap();
            let once = p.clone();
            apply_to_process(&mut p, &got).unwrap();
            assert_eq!(p, once, "{what}: not idempotent");
            assert_eq!(p["env"], json!(want), "{what}");
            assert!(p["args"].is_array(), "{what}: args kept");
        }

        // MPS: the pipe dir and limits; an LD_PRELOAD outside the limiter's dir is not ours.
        let mut mps: Value =
            serde_json::from_str(r#"{"process":{"env":["LD_PRELOAD=/a.so"]}}"#).unwrap();
        apply(&mut mps, &edit()).unwrap();
        let got = applied_env(&mps, "/usr/local/gpushare").unwrap();
        assert_eq!(got.env, edit().env);
        let got_other = applied_env(&mps, "/opt/other").unwrap();
        assert_eq!(got_other.preload, None);
        let mut p = json!({"env":["A=1"]});
        apply_to_process(&mut p, &got_other).unwrap();
        assert_eq!(
            p["env"],
            json!([
                "A=1",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"
            ])
        );
        // An empty edit leaves even a malformed process alone; a malformed one with an edit fails.
        let mut bad = json!({"env":"x"});
        apply_to_process(&mut bad, &Edit::default()).unwrap();
        assert!(apply_to_process(&mut bad, &got).is_err());
        assert!(apply_to_process(&mut json!([1]), &got).is_err());
    }
}
