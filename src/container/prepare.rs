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
        preload: (plan.mode == Mode::Limit).then(|| inject::limiter_in_container(cfg)),
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
    let spec = input::parse_spec(bytes, &path)?;
    let key = match ctx.id {
        Some(id) => {
            crate::decide::input::check_id(id)?;
            id.to_owned()
        }
        // A config this edit already made keeps its key, so that editing it again reserves
        // under the key its hook entry names instead of leaving a second reservation behind.
        None => earlier_key(&spec).unwrap_or_else(crate::host::pending::pending_key),
    };
    let Some((plan, inventory)) = crate::decide::front::plan_for(&key, &spec, cfg, open_inventory)?
    else {
        return Ok(None);
    };
    let edit = edit_for(&plan, cfg, &key, ctx.config_path.as_deref());
    // Read as every entry point reads a config; the edited document keeps every other member.
    let edited = input::deep_scope(bytes, || -> Result<Option<Vec<u8>>, Error> {
        let mut value = input::parse_config(bytes, &path)?;
        let before = value.clone();
        spec_edit::apply(&mut value, &edit)?;
        Ok((value != before).then(|| serde_json::to_vec(&value).expect("JSON value serialises")))
    })?;
    // The mount sources must exist even when the config was edited before (a restart). MPS
    // directories are reserved under the GPU's lock, so that a release of the GPU's last
    // client before this container's hook runs does not remove them.
    if plan.mode == Mode::Mps {
        let host = crate::host::acquire::Host::new(cfg, inventory.as_ref());
        for gpu in &plan.gpus {
            host.reserve(gpu, &key)?;
        }
    }
    let rootfs = rootfs_of(&spec, ctx.bundle);
    inject::prepare_host(&plan, cfg, &key, rootfs.as_deref())?;
    Ok(edited)
}

/// `gpushare-hook precreate`: the config on `stdin`, the config to use returned (the input
/// bytes unchanged when the container asks for nothing).
///
/// # Errors
/// [`Error`] as [`edit_config`], or unreadable input.
pub fn precreate(
    stdin: impl std::io::Read,
    cfg: &Config,
    config_path: Option<PathBuf>,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<Vec<u8>, Error> {
    let bytes = crate::vocab::read_capped(stdin, crate::decide::input::MAX_CONFIG_BYTES)
        .map_err(|source| crate::decide::input::InputError::ReadConfig {
            path: "<stdin>".into(),
            source,
        })?
        .ok_or(crate::decide::input::InputError::ConfigTooLarge {
            path: "<stdin>".into(),
        })?;
    let ctx = Context {
        config_path,
        ..Context::default()
    };
    Ok(edit_config(&bytes, &ctx, cfg, open_inventory)?.unwrap_or(bytes))
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
            cores: 100,
            timeslice: None,
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
}
