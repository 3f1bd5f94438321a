//! The host side of injection: the files and directories the binds need, made before the
//! runtime mounts them (spec edit) or the hook binds them (createRuntime), and removed after.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use super::{container_env, limiter_in_container, rootfs, InjectError, PRELOAD_IN_CONTAINER};
use crate::config::Config;
use crate::decide::plan::Plan;
use crate::host::pending::{sweep_pending, PENDING_MAX_AGE, PENDING_PREFIX};
use crate::host::state::{write_atomic, StateDir};
use crate::vocab::Mode;

/// The generated `/etc/ld.so.preload`: the image's own lines, then the limiter (once).
pub fn preload_text(image: Option<&[u8]>, limiter: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(img) = image {
        for line in img.split(|b| *b == b'\n') {
            if line.is_empty() || line == limiter.as_bytes() {
                continue;
            }
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    out.extend_from_slice(limiter.as_bytes());
    out.push(b'\n');
    out
}

/// Creates the host side of the bindings: the MPS directories and shm tmpfs, or the
/// per-container directory with the limits file, the generated preload list (the image's
/// `/etc/ld.so.preload` read safely from `rootfs`) and the writable `shared/`. Idempotent.
/// `seen`: what deciding found of the image's C library (checked again when it holds nothing).
///
/// # Errors
/// [`InjectError`]; a half-made per-container directory is removed.
pub fn prepare_host(
    plan: &Plan,
    cfg: &Config,
    key: &str,
    rootfs: Option<&Path>,
    seen: Option<&super::libc_cache::Seen>,
) -> Result<(), InjectError> {
    let sd = StateDir::new(&cfg.state_dir);
    if plan.mode == Mode::Mps {
        if let Some(gpu) = plan.gpus.first() {
            sd.mps_dirs(&gpu.uuid, plan.domain_key())
                .prepare(cfg.mps.shm_bytes())?;
        }
    }
    if !plan.uses_limiter() {
        return Ok(());
    }
    if !cfg.limit.library.is_file() {
        return Err(InjectError::NoLimiter(cfg.limit.library.clone()));
    }
    // An image the limiter cannot load into is refused before anything is written.
    if let Some(r) = rootfs {
        super::libc_cache::check_seen(&sd, r, seen).map_err(|e| match e {
            e @ super::libc::LibcError::Read { .. } => InjectError::Libc(e),
            e => super::libc::refuse(e, cfg, plan.mode).into(),
        })?;
    }
    let image = match rootfs {
        Some(r) => rootfs::read_image_file(r, PRELOAD_IN_CONTAINER).map_err(|source| {
            InjectError::Image {
                what: PRELOAD_IN_CONTAINER,
                source,
            }
        })?,
        None => None,
    };
    let dir = sd.container_dir(key);
    if key.starts_with(PENDING_PREFIX) {
        sweep_pending(&sd, PENDING_MAX_AGE);
    }
    let res = write_container_dir(&sd, &dir, plan, cfg, image.as_deref());
    if res.is_err() {
        let _ = crate::host::mounts::remove_container_dir(&dir);
    }
    res
}

fn write_container_dir(
    sd: &StateDir,
    dir: &Path,
    plan: &Plan,
    cfg: &Config,
    image_preload: Option<&[u8]>,
) -> Result<(), InjectError> {
    let host = |path: &Path| {
        let path = path.to_owned();
        move |source| InjectError::Host { path, source }
    };
    sd.ensure().map_err(|e| InjectError::Host {
        path: sd.root().to_owned(),
        source: std::io::Error::other(crate::vocab::chain(&e)),
    })?;
    let parent = sd.root().join("containers");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&parent)
        .map_err(host(&parent))?;
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(host(dir)(e)),
        _ => {}
    }
    let shared = dir.join("shared");
    match std::fs::DirBuilder::new().mode(0o1777).create(&shared) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(host(&shared)(e)),
        _ => {}
    }
    crate::host::mounts::mount_shared(&shared).map_err(host(&shared))?;
    // DirBuilder's mode is filtered by the umask; the shared dir must be writable by any user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777))
        .map_err(host(&shared))?;
    let mut limits = String::from("# gpushare limits for this container\n");
    for (k, v) in container_env(plan)
        .into_iter()
        .filter(|(k, _)| k.starts_with("CUDA_DEVICE_"))
    {
        limits.push_str(&format!("{k}={v}\n"));
    }
    let lp = dir.join("limits");
    write_atomic(&lp, limits.as_bytes(), 0o644).map_err(host(&lp))?;
    let pp = dir.join("ld.so.preload");
    let text = preload_text(image_preload, &limiter_in_container(cfg));
    write_atomic(&pp, &text, 0o644).map_err(host(&pp))
}

/// Removes the per-container host files of `id`. Idempotent, best effort.
pub fn remove_container_files(cfg: &Config, id: &str) {
    if crate::vocab::is_safe_name(id) {
        let _ = crate::host::mounts::remove_container_dir(
            &StateDir::new(&cfg.state_dir).container_dir(id),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_keeps_image_lines() {
        let rows: &[(&str, Option<&[u8]>, &str)] = &[
            ("no image file", None, "/l.so\n"),
            (
                "image line kept",
                Some(b"/usr/lib/a.so\n"),
                "/usr/lib/a.so\n/l.so\n",
            ),
            ("no trailing newline", Some(b"/a.so"), "/a.so\n/l.so\n"),
            ("ours not twice", Some(b"/l.so\n/a.so\n"), "/a.so\n/l.so\n"),
        ];
        for (what, img, want) in rows {
            assert_eq!(
                String::from_utf8(preload_text(*img, "/l.so")).unwrap(),
                *want,
                "{what}"
            );
        }
    }
}
