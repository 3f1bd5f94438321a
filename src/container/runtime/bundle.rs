//! Editing the bundle: `config.json` for create/run, the process file for exec.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Args, RuntimeError};
use crate::config::Config;
use crate::container::error::Error;
use crate::container::prepare::{self, Context};
use crate::container::spec_edit;
use crate::vocab::{Inventory, InventoryError};

/// For create/run: edits the bundle's `config.json` in place (temp file + rename), keeping its
/// mode; returns whether it changed.
///
/// # Errors
/// [`Error`] for bad input, a refused request, or a file that cannot be written.
pub fn edit_bundle(
    args: &Args,
    cfg: &Config,
    config_path: Option<PathBuf>,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<bool, Error> {
    let bundle = bundle_dir(args)?;
    let bytes = crate::container::intake::read_config_bytes(&bundle)?;
    let ctx = Context {
        id: args.id.as_deref(),
        bundle: Some(&bundle),
        config_path,
    };
    let Some(edited) = prepare::edit_config(&bytes, &ctx, cfg, open_inventory)? else {
        return Ok(false);
    };
    let path = bundle.join("config.json");
    let mode = std::fs::metadata(&path).map_or(0o644, |m| m.mode() & 0o7777);
    crate::host::state::write_atomic(&path, &edited, mode)
        .map_err(|source| RuntimeError::Write { path, source })?;
    Ok(true)
}

/// The bundle directory of create/run: `--bundle`/`-b`, else the working directory.
fn bundle_dir(args: &Args) -> Result<PathBuf, Error> {
    let bundle = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().map_err(|source| RuntimeError::Bundle { source })?,
    };
    Ok(std::path::absolute(&bundle).unwrap_or(bundle))
}

/// Whether the bundle's `config.json` may ask for sharing (cheap byte scan; an unreadable
/// config is left to the next runtime to report).
pub fn bundle_may_ask(args: &Args) -> bool {
    bundle_dir(args)
        .ok()
        .and_then(|b| crate::container::intake::read_config_bytes(&b).ok())
        .is_some_and(|bytes| crate::decide::front::may_ask(&bytes, &Default::default()))
}

/// For `exec --process FILE`: when the container was given a share (its `config.json` was
/// edited), adds the share's env as it stands in that `config.json` to the process file
/// (temp file + rename, mode kept); returns whether the file changed. The container's bundle
/// comes from `<next runtime> [global flags] state <id>`. Anything that is not the exec of a
/// share container (no process file, an unknown container, an unreadable or unedited config)
/// is left alone for the next runtime to handle.
///
/// # Errors
/// A share container's process file that cannot be read, parsed or written.
pub fn edit_exec_process(argv: &[OsString], args: &Args, next: &Path) -> Result<bool, Error> {
    let (Some(file), Some(id), Some(at)) = (&args.process, &args.id, args.command_at) else {
        return Ok(false);
    };
    let Some(bundle) = bundle_of(next, &argv[..at], id) else {
        return Ok(false);
    };
    let Ok(bytes) = crate::container::intake::read_config_bytes(&bundle) else {
        return Ok(false);
    };
    if !bytes.windows(13).any(|w| w == b"gpushare-hook") {
        return Ok(false);
    }
    let Ok(config) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(false);
    };
    let Some(edit) =
        spec_edit::applied_env(&config, crate::container::inject::LIMIT_DIR_IN_CONTAINER)
    else {
        return Ok(false);
    };
    let read = std::fs::File::open(file)
        .and_then(|f| {
            crate::vocab::read::read_capped(f, crate::container::intake::MAX_CONFIG_BYTES)
        })
        .map_err(|source| RuntimeError::ReadProcess {
            path: file.clone(),
            source,
        })?;
    let mut process: serde_json::Value = read
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| RuntimeError::BadProcess(file.clone()))?;
    let before = process.clone();
    spec_edit::apply_to_process(&mut process, &edit)?;
    if process == before {
        return Ok(false);
    }
    let mode = std::fs::metadata(file).map_or(0o600, |m| m.mode() & 0o7777);
    let bytes = serde_json::to_vec(&process).expect("JSON value serialises");
    crate::host::state::write_atomic(file, &bytes, mode).map_err(|source| RuntimeError::Write {
        path: file.clone(),
        source,
    })?;
    Ok(true)
}

/// The bundle of container `id` as the next runtime reports it (`state`), with the same global
/// flags (`--root` above all); `None` when it cannot say.
fn bundle_of(next: &Path, global: &[OsString], id: &str) -> Option<PathBuf> {
    let out = std::process::Command::new(next)
        .args(global)
        .arg("state")
        .arg(id)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let b = PathBuf::from(v.get("bundle")?.as_str()?);
    b.is_absolute().then_some(b)
}
