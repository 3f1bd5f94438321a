//! The createRuntime side of injection: bind what the plan needs into the just-created
//! container, unless a spec edit (precreate or `gpushare-runtime`) already made them spec
//! mounts, which the runtime set up before this hook ran.

use std::path::{Path, PathBuf};

use super::{bindings, into_container, prepare_host, Binding, InjectError, SHARED_IN_CONTAINER};
use crate::config::Config;
use crate::decide::input::{MountView, SpecView};
use crate::decide::plan::Plan;
use crate::host::state::StateDir;
use crate::vocab::is_safe_name;
use crate::vocab::Mode;

fn spec_binds(mounts: &[MountView], b: &Binding) -> bool {
    mounts
        .iter()
        .any(|m| m.destination == b.target && m.source.as_deref() == Some(b.source.as_path()))
}

/// The per-container directory name a spec edit used in limit mode, from its `shared` mount.
fn edited_key(mounts: &[MountView], sd: &StateDir) -> Option<String> {
    let containers = sd.root().join("containers");
    mounts
        .iter()
        .filter(|m| m.destination == SHARED_IN_CONTAINER)
        .find_map(|m| {
            let src = m.source.as_deref()?;
            if src.file_name()? != "shared" {
                return None;
            }
            let dir = src.parent()?;
            (dir.parent()? == containers)
                .then(|| dir.file_name()?.to_str().map(str::to_owned))
                .flatten()
        })
        .filter(|k| is_safe_name(k))
}

/// Whether the spec mounts the runtime made still show the daemon's current directories. The
/// spec edit made them before the GPU lock was taken; a daemon that stopped (its last client
/// left) and was started again by our acquire in between has new directories, and the container
/// would hold the old, removed ones. Compared by device and inode through the container's mount
/// namespace (`/proc/<pid>/root`, before pivot_root). A read-only check: any doubt answers
/// "not current", which only leads to binding again safely.
fn spec_mounts_current(pid: i32, rootfs: &Path, wanted: &[Binding]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    wanted.iter().all(|b| {
        let inside = PathBuf::from(format!("/proc/{pid}/root{}{}", rootfs.display(), b.target));
        let host = id(&b.source);
        host.is_some() && id(&inside) == host
    })
}

/// Binds the plan's mounts into the created container whose init is `pid`, or does nothing
/// when the bundle's `config.json` already has them.
///
/// # Errors
/// [`InjectError`]; the caller undoes the acquire.
pub fn inject(
    plan: &Plan,
    cfg: &Config,
    spec: &SpecView,
    bundle: &Path,
    pid: Option<i32>,
    seen: Option<&super::libc_cache::Seen>,
) -> Result<(), InjectError> {
    if plan.mode == Mode::Timeslice && !plan.uses_limiter() {
        return Ok(());
    }
    let sd = StateDir::new(&cfg.state_dir);
    let mut key = plan.container.clone();
    if plan.uses_limiter() {
        if let Some(k) = edited_key(&spec.mounts, &sd) {
            key = k;
        }
    }
    let wanted = bindings(plan, cfg, &key);
    let rootfs = crate::decide::input::rootfs_of(spec, Some(bundle))
        .unwrap_or_else(|| bundle.join("rootfs"));
    if wanted.iter().all(|b| spec_binds(&spec.mounts, b))
        && (plan.mode != Mode::Mps || pid.is_none_or(|p| spec_mounts_current(p, &rootfs, &wanted)))
    {
        if key != plan.container && key.starts_with(crate::host::pending::PENDING_PREFIX) {
            // The mounts are made; from now on the files belong to the container id (poststop
            // removes them by id). A rename keeps the existing bind mounts working.
            let to = sd.container_dir(&plan.container);
            if !to.exists() {
                let _ = std::fs::rename(sd.container_dir(&key), to);
            }
        }
        return Ok(());
    }
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return Err(InjectError::Namespace {
            pid: 0,
            source: std::io::Error::other("the runtime gave no container pid"),
        });
    };
    let wanted = bindings(plan, cfg, &plan.container);
    prepare_host(plan, cfg, &plan.container, Some(&rootfs), seen)?;
    into_container(pid, &rootfs, &wanted)?;
    if key != plan.container && key.starts_with(crate::host::pending::PENDING_PREFIX) {
        // Bound anew from the container's own files: the spec edit's (and its tmpfs) go.
        let _ = crate::host::mounts::remove_container_dir(&sd.container_dir(&key));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_edited_key() {
        let sd = StateDir::new("/s");
        let m = |d: &str, s: &str| MountView {
            destination: d.into(),
            source: Some(s.into()),
        };
        let rows: Vec<(&str, Vec<MountView>, Option<&str>)> = vec![
            (
                "pending dir",
                vec![m(SHARED_IN_CONTAINER, "/s/containers/pending-ab/shared")],
                Some("pending-ab"),
            ),
            (
                "outside the state dir",
                vec![m(SHARED_IN_CONTAINER, "/x/containers/c/shared")],
                None,
            ),
            (
                "climbing name",
                vec![m(SHARED_IN_CONTAINER, "/s/containers/../shared")],
                None,
            ),
            ("other mount", vec![m("/x", "/s/containers/c/shared")], None),
        ];
        for (what, mounts, want) in rows {
            assert_eq!(edited_key(&mounts, &sd).as_deref(), want, "{what}");
        }
    }
}
