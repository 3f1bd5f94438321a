//! nvidia-container-runtime chained with gpushare-runtime, in either order: gpushare in front
//! (`[runtime] next` of the policy file starts with nvidia-container-runtime) or NVIDIA in
//! front (its `[nvidia-container-runtime] runtimes` in `/etc/nvidia-container-runtime/config.toml`
//! starts with gpushare-runtime).

use std::path::{Path, PathBuf};

use super::edit::{
    finish_toml, parse_toml, put_first, read, remove_from_array, table, table_at, toml_edit_only,
};
use super::setup::{is_ours, Change, ConfigureError, Edit, Options, Order, Setup};
use super::EngineDef;

/// NVIDIA's runtime config.
pub const NVIDIA_FILE: &str = "/etc/nvidia-container-runtime/config.toml";

pub(super) struct NvidiaContainerRuntime;

impl EngineDef for NvidiaContainerRuntime {
    fn name(&self) -> &'static str {
        "nvidia-container-runtime"
    }

    fn files(&self) -> &'static [&'static str] {
        &[NVIDIA_FILE]
    }

    fn main_file(&self, setup: &Setup, opts: &Options) -> PathBuf {
        let default = match opts.order {
            Order::GpushareFirst => setup
                .policy
                .clone()
                .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_PATH)),
            Order::NvidiaFirst => PathBuf::from(NVIDIA_FILE),
        };
        opts.path.clone().unwrap_or(default)
    }

    fn plan(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Change>, ConfigureError> {
        Ok(vec![match opts.order {
            Order::GpushareFirst => behind(main)?,
            Order::NvidiaFirst => in_front(main, setup)?,
        }])
    }

    fn remove(
        &self,
        main: &Path,
        _setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Edit>, ConfigureError> {
        let edit = match opts.order {
            Order::GpushareFirst => toml_edit_only(main, |doc| {
                if let Some(rt) = table(doc.as_table_mut(), &["runtime"]) {
                    remove_from_array(rt, "next", |s| s == "nvidia-container-runtime");
                }
            })?,
            Order::NvidiaFirst => toml_edit_only(main, |doc| {
                if let Some(t) = table(doc.as_table_mut(), &["nvidia-container-runtime"]) {
                    remove_from_array(t, "runtimes", |s| is_ours(s, "gpushare-runtime"));
                }
            })?,
        };
        Ok(edit.into_iter().collect())
    }

    fn runs_runtime(&self, order: Order) -> bool {
        order == Order::NvidiaFirst
    }

    fn restart(&self, order: Order) -> &'static str {
        match order {
            Order::GpushareFirst => "nothing to restart: gpushare-runtime reads the policy at every call; register gpushare-runtime with the engine (gpushare-hook configure docker|containerd|crio)",
            Order::NvidiaFirst => "nothing to restart: nvidia-container-runtime reads its config.toml at every call",
        }
    }
}

/// gpushare in front: `[runtime] next` of the policy file starts with nvidia-container-runtime.
fn behind(policy: &Path) -> Result<Change, ConfigureError> {
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
fn in_front(path: &Path, setup: &Setup) -> Result<Change, ConfigureError> {
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
