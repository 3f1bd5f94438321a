//! The doing side of the spec edit, shared by its two callers (`gpushare-hook precreate` and
//! `gpushare-runtime`): decide as createRuntime would, make the host-side mount sources exist
//! (runc sets up spec mounts before any hook runs), then apply [`crate::container::spec_edit::apply`].

use std::path::{Path, PathBuf};

use crate::config::{self, Config};
use crate::container::error::Error;
use crate::container::inject;
use crate::container::spec_edit::{self, Edit, HookCall};
use crate::decide::input::{self, rootfs_of};
use crate::decide::plan::Plan;
use crate::host::mps::SAFE_PATH;
use crate::vocab::Mode;
use crate::vocab::{Inventory, InventoryError};
use serde_json::Value;

/// Where the edit is asked for.
#[derive(Debug, Clone, Default)]
pub struct Context<'a> {
    /// The container id when the caller knows it (`gpushare-runtime`); `None` for precreate.
    pub id: Option<&'a str>,
    /// The bundle, to resolve a relative `root.path`.
    pub bundle: Option<&'a Path>,
    /// The policy file the caller loaded, passed on to the hook entries as `GPUSHARE_CONFIG`.
    pub config_path: Option<PathBuf>,
}

/// The edit for `plan` (pure): env, preload, mounts and hook entries.
pub fn edit_for(plan: &Plan, cfg: &Config, key: &str, config_path: Option<&Path>) -> Edit {
    let mut env = vec![format!("PATH={SAFE_PATH}")];
    if let Some(p) = config_path {
        env.push(format!("{}={}", config::ENV_PATH, p.display()));
    }
    if key.starts_with(crate::host::pending::PENDING_PREFIX) {
        // A precreate's pending key: the hook consumes the reservation made under it (mps),
        // and a later edit of this config reuses it.
        env.push(format!("{}={key}", crate::decide::front::RESERVATION_ENV));
    }
    Edit {
        env: inject::container_env(plan),
        preload: plan
            .uses_limiter()
            .then(|| inject::limiter_in_container(cfg)),
        mounts: inject::bindings(plan, cfg, key),
        owned: Some(cfg.state_dir.clone()),
        hook: Some(HookCall {
            path: cfg.runtime.hook.clone(),
            env,
        }),
    }
}

/// The pending key an earlier edit gave gpushare's createRuntime entry in `spec`, if any.
fn earlier_key(spec: &input::SpecView) -> Option<String> {
    let want = format!("{}=", crate::decide::front::RESERVATION_ENV);
    spec.hooks
        .create_runtime
        .iter()
        .filter(|h| {
            Path::new(&h.path).file_name() == Some("gpushare-hook".as_ref())
                && h.args.get(1).map(String::as_str) == Some("createRuntime")
        })
        .flat_map(|h| h.env.iter().rev())
        .find_map(|e| e.strip_prefix(&want))
        .filter(|k| {
            k.starts_with(crate::host::pending::PENDING_PREFIX) && crate::vocab::is_safe_name(k)
        })
        .map(str::to_owned)
}

/// Edits the raw `config.json` bytes for a container that asks for sharing. `None`: nothing to
/// do (the caller leaves the file byte-for-byte alone).
///
/// # Errors
/// [`Error`] for bad input, a refused request, or host files that cannot be made.
pub fn edit_config(
    bytes: &[u8],
    ctx: &Context<'_>,
    cfg: &Config,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<Option<Vec<u8>>, Error> {
    let path = ctx
        .bundle
        .map_or_else(|| PathBuf::from("config.json"), |b| b.join("config.json"));
    if !crate::decide::front::may_ask(bytes, &Default::default()) {
        return Ok(None);
    }
    let mut spec = input::parse_spec(bytes, &path)?;
    // A gpushare CDI device in the spec: its profile stands among the annotations, as in the
    // hook it put there (`--profile`); an annotation that contradicts it is refused.
    if let Some(name) =
        crate::decide::profile::named(&spec.hooks.create_runtime, &spec.process.env)?
    {
        crate::decide::profile::find(cfg, &name)?.apply(&mut spec.annotations)?;
    }
    let key = match ctx.id {
        Some(id) => {
            crate::decide::input::check_id(id)?;
            id.to_owned()
        }
        // A config this edit already made keeps its key, so that editing it again reserves
        // under the key its hook entry names instead of leaving a second reservation behind.
        None => earlier_key(&spec).unwrap_or_else(crate::host::pending::pending_key),
    };
    // A capped mps or timeslice share in an image without glibc gets no limiter in the spec;
    // the hook, which knows what enforces the cap, serves or refuses it.
    let rootfs = rootfs_of(&spec, ctx.bundle);
    let seen = crate::container::inject::libc_cache::Seen::default();
    let image =
        || crate::container::inject::libc_cache::image_fact(cfg, rootfs.as_deref(), Some(&seen));
    let Some((mut plan, inventory)) = crate::decide::front::plan_for(
        &key,
        &spec,
        cfg,
        open_inventory,
        &|| crate::decide::enforce::CgroupFact::NotCreated,
        &image,
    )?
    else {
        return Ok(None);
    };
    // The mount sources must exist even when the config was edited before (a restart). MPS
    // directories are reserved under the GPU's lock, so that a release of the GPU's last
    // client before this container's hook runs does not remove them. A container joining a
    // running domain without naming a limit gets the domain's limits in its env.
    let host = crate::host::acquire::Host::new(cfg, inventory.as_ref());
    let mut reserved = Vec::new();
    let result = (|| -> Result<Option<Vec<u8>>, Error> {
        if plan.mode == Mode::Mps {
            if let Some(domain) = plan.domain.clone() {
                for gpu in plan.gpus.clone() {
                    let enforced = host.reserve(&gpu, &domain, &key)?;
                    reserved.push(gpu.clone());
                    if let Some(enforced) = enforced {
                        plan = plan.joining(&enforced);
                    }
                }
            }
        }
        let edit = edit_for(&plan, cfg, &key, ctx.config_path.as_deref());
        // Read as every entry point reads a config; the edited document keeps every other
        // member.
        let edited = input::deep_scope(bytes, || -> Result<Option<Vec<u8>>, Error> {
            let mut value = input::parse_config(bytes, &path)?;
            let before = value.clone();
            spec_edit::apply(&mut value, &edit)?;
            Ok((value != before)
                .then(|| serde_json::to_vec(&value).expect("JSON value serialises")))
        })?;
        inject::prepare_host(&plan, cfg, &key, rootfs.as_deref(), Some(&seen))?;
        Ok(edited)
    })();
    if result.is_err() {
        // A refused edit holds nothing: its reservations and the directories only they kept
        // go now (not when they expire), and so do the per-container files.
        for gpu in &reserved {
            host.unreserve(gpu, &key);
        }
        inject::remove_container_files(cfg, &key);
    }
    result
}

/// Hook-entry env that carries a precreate refusal to the createRuntime hook: podman drops a
/// precreate hook's stderr, runc shows a createRuntime hook's. Set only by precreate in the
/// entry it adds; a container that sets it in its own hook entries only refuses itself.
pub const REFUSED_ENV: &str = "GPUSHARE_REFUSED";
/// Hook-entry env beside [`REFUSED_ENV`]: the refusal's reason label, for the count and the
/// event the createRuntime hook writes.
pub const REFUSED_REASON_ENV: &str = "GPUSHARE_REFUSED_REASON";
/// Longest refusal message carried.
const MAX_REFUSAL: usize = 4096;

/// What precreate hands back to podman.
#[derive(Debug)]
pub enum Precreated {
    /// The config to use (edited, or the input bytes unchanged when nothing was asked).
    Config(Vec<u8>),
    /// The request was refused: the config marked with a createRuntime entry that fails with
    /// `message`, so that the user sees it.
    Refused { config: Vec<u8>, message: String },
}

/// Reads precreate's stdin (the container's `config.json`), capped.
///
/// # Errors
/// [`Error`] for unreadable or oversized input.
pub fn read_precreate_input(stdin: impl std::io::Read) -> Result<Vec<u8>, Error> {
    Ok(crate::container::intake::read_config(
        stdin,
        Path::new("<stdin>"),
    )?)
}

/// Whether the container asks for a share, judged without a policy (the policy file is
/// broken): the annotation, or the env fallback as the default policy reads it.
pub fn asks_without_policy(bytes: &[u8]) -> bool {
    if !crate::decide::front::may_ask(bytes, &Default::default()) {
        return false;
    }
    match crate::decide::input::parse_spec(bytes, Path::new("config.json")) {
        Ok(spec) => crate::decide::request::wants_share(
            &crate::decide::request::Sources {
                annotations: &spec.annotations,
                env: &spec.process.env,
            },
            crate::config::PolicyConfig::default().env_fallback,
        ),
        // Unparsable: the runtime reports that itself.
        Err(_) => false,
    }
}

/// `gpushare-hook precreate`: edits the config for a container that asks for a share; a refusal
/// (bad request, policy, host files) is carried to the createRuntime hook by [`mark_refused`].
///
/// # Errors
/// Only when even the refusal cannot be carried (the input is not a JSON object).
pub fn precreate(
    bytes: Vec<u8>,
    cfg: &Config,
    config_path: Option<PathBuf>,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<Precreated, Error> {
    let ctx = Context {
        config_path: config_path.clone(),
        ..Context::default()
    };
    match edit_config(&bytes, &ctx, cfg, open_inventory) {
        Ok(edited) => Ok(Precreated::Config(edited.unwrap_or(bytes))),
        Err(e) => {
            let message = crate::vocab::chain(&e);
            let config = mark_refused(
                &bytes,
                &cfg.runtime.hook,
                config_path.as_deref(),
                &message,
                e.reason(),
            )
            .map_err(|_| e)?;
            Ok(Precreated::Refused { config, message })
        }
    }
}

/// Adds, first among the createRuntime hooks, an entry that runs `hook createRuntime` with
/// [`REFUSED_ENV`] set to `message` (one line, capped), and `GPUSHARE_CONFIG` when the policy
/// file is not the default (so that the refusal is logged where the policy says).
///
/// # Errors
/// [`Error`] when `bytes` is not a JSON object.
pub fn mark_refused(
    bytes: &[u8],
    hook: &Path,
    config_path: Option<&Path>,
    message: &str,
    reason: &str,
) -> Result<Vec<u8>, Error> {
    // Read as every entry point reads a config (runc's rules, deep nesting on a deep stack).
    input::deep_scope(bytes, || {
        mark_parsed(bytes, hook, config_path, message, reason)
    })
}

fn mark_parsed(
    bytes: &[u8],
    hook: &Path,
    config_path: Option<&Path>,
    message: &str,
    reason: &str,
) -> Result<Vec<u8>, Error> {
    let mut v = input::parse_config(bytes, Path::new("<stdin>"))?;
    let mut line: String = message.replace(['\n', '\r', '\0'], " ");
    if line.len() > MAX_REFUSAL {
        let mut cut = MAX_REFUSAL;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    let mut env = vec![format!("PATH={SAFE_PATH}"), format!("{REFUSED_ENV}={line}")];
    env.push(format!("{REFUSED_REASON_ENV}={reason}"));
    if let Some(p) = config_path {
        env.push(format!("{}={}", config::ENV_PATH, p.display()));
    }
    let entry = serde_json::json!({
        "path": hook,
        "args": ["gpushare-hook", "createRuntime"],
        "env": env,
    });
    let not_object = || {
        Error::from(crate::container::spec_edit::SpecEditError::Shape(
            "the document",
        ))
    };
    let root = v.as_object_mut().ok_or_else(not_object)?;
    let hooks = root
        .entry("hooks")
        .or_insert_with(|| Value::Object(Default::default()));
    if !hooks.is_object() {
        *hooks = Value::Object(Default::default());
    }
    let list = hooks
        .as_object_mut()
        .ok_or_else(not_object)?
        .entry("createRuntime")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    list.as_array_mut().ok_or_else(not_object)?.insert(0, entry);
    let out = serde_json::to_vec(&v).expect("JSON value serialises");
    drop(v);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::plan::PlannedGpu;

    #[test]
    fn hook_entries_get_a_minimal_env() {
        let plan = Plan {
            container: "c".into(),
            mode: Mode::Mps,
            gpus: vec![PlannedGpu {
                index: 0,
                uuid: "GPU-0".into(),
                ordinal: 0,
            }],
            memory: None,
            cap: None,
            enforcement: crate::decide::enforce::uncapped(),
            without_limiter: None,
            cores: 100,
            cores_explicit: false,
            timeslice: None,
            domain: None,
            uid: 0,
        };
        let cfg = Config::default();
        let e = edit_for(&plan, &cfg, "c", Some(Path::new("/etc/g.toml")));
        let h = e.hook.unwrap();
        assert_eq!(
            h.env,
            vec![
                format!("PATH={SAFE_PATH}"),
                "GPUSHARE_CONFIG=/etc/g.toml".to_string()
            ]
        );
        assert_eq!(e.preload, None);
        assert_eq!(e.mounts.len(), 2);
    }

    #[test]
    fn refusals_are_carried_to_the_create_runtime_hook() {
        let rows: &[(&str, &str)] = &[
            ("no hooks", r#"{"ociVersion":"1.0.2","x":1}"#),
            (
                "existing hooks",
                r#"{"hooks":{"createRuntime":[{"path":"/other"}],"poststop":[]}}"#,
            ),
        ];
        for (what, input) in rows {
            let out = mark_refused(
                input.as_bytes(),
                Path::new("/h"),
                None,
                "bad\nrequest",
                "request",
            )
            .unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            let first = &v["hooks"]["createRuntime"][0];
            assert_eq!(first["path"], "/h", "{what}");
            assert_eq!(first["args"][1], "createRuntime", "{what}");
            assert_eq!(first["env"][1], "GPUSHARE_REFUSED=bad request", "{what}");
        }
        let v: Value = serde_json::from_slice(
            &mark_refused(
                rows[1].1.as_bytes(),
                Path::new("/h"),
                Some(Path::new("/c.toml")),
                "m",
                "request",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            v["hooks"]["createRuntime"][1]["path"], "/other",
            "kept after ours"
        );
        assert!(mark_refused(b"[1]", Path::new("/h"), None, "m", "request").is_err());
        assert!(mark_refused(b"nope", Path::new("/h"), None, "m", "request").is_err());
    }

    #[test]
    fn asking_is_judged_without_a_policy() {
        let rows: &[(&str, &str, bool)] = &[
            ("nothing", r#"{"process":{"env":["A=1"]}}"#, false),
            ("annotation", r#"{"annotations":{"gpu.share":"mps"}}"#, true),
            (
                "env fallback",
                r#"{"process":{"env":["GPU_SHARE=mps"]}}"#,
                true,
            ),
            (
                "mentioned only",
                r#"{"process":{"args":["echo","gpu.share"]}}"#,
                false,
            ),
            ("none", r#"{"annotations":{"gpu.share":"none"}}"#, false),
        ];
        for (what, input, want) in rows {
            assert_eq!(asks_without_policy(input.as_bytes()), *want, "{what}");
        }
    }
}
