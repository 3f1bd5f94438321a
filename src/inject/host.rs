//! The host side of injection: the files and directories the binds need, made before the
//! runtime mounts them (spec edit) or the hook binds them (createRuntime), and removed after.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::{
    container_env, limiter_in_container, rootfs, InjectError, PENDING_PREFIX, PRELOAD_IN_CONTAINER,
};
use crate::config::Config;
use crate::mps::MpsDirs;
use crate::plan::Plan;
use crate::request::Mode;
use crate::state::{write_atomic, StateDir};

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
///
/// # Errors
/// [`InjectError`]; a half-made per-container directory is removed.
pub fn prepare_host(
    plan: &Plan,
    cfg: &Config,
    key: &str,
    rootfs: Option<&Path>,
) -> Result<(), InjectError> {
    let sd = StateDir::new(&cfg.state_dir);
    match plan.mode {
        Mode::Mps => {
            if let Some(gpu) = plan.gpus.first() {
                MpsDirs::new(sd.mps_dir(&gpu.uuid)).prepare()?;
            }
            Ok(())
        }
        Mode::Limit => {
            if !cfg.limit.library.is_file() {
                return Err(InjectError::NoLimiter(cfg.limit.library.clone()));
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
                let _ = std::fs::remove_dir_all(&dir);
            }
            res
        }
        Mode::Timeslice => Ok(()),
    }
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
        source: std::io::Error::other(crate::error::chain(&e)),
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
    // DirBuilder's mode is filtered by the umask; the shared dir must be writable by any user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777))
        .map_err(host(&shared))?;
    let mut limits = String::from("# gpushare limits for this container\n");
    for (k, v) in container_env(plan) {
        limits.push_str(&format!("{k}={v}\n"));
    }
    let lp = dir.join("limits");
    write_atomic(&lp, limits.as_bytes(), 0o644).map_err(host(&lp))?;
    let pp = dir.join("ld.so.preload");
    let text = preload_text(image_preload, &limiter_in_container(cfg));
    write_atomic(&pp, &text, 0o644).map_err(host(&pp))
}

/// How long a precreate-made directory may wait for its createRuntime hook before it counts as
/// left behind by a create that failed.
pub const PENDING_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes `pending-*` per-container directories older than `max_age` (their create never
/// reached createRuntime, which renames them to the container id). Best effort.
pub fn sweep_pending(sd: &StateDir, max_age: std::time::Duration) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(sd.root().join("containers")) else {
        return removed;
    };
    for e in rd.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > max_age);
        if old
            && e.file_name().to_string_lossy().starts_with(PENDING_PREFIX)
            && std::fs::remove_dir_all(e.path()).is_ok()
        {
            removed.push(e.path());
        }
    }
    removed
}

/// Removes the per-container host files of `id`. Idempotent, best effort.
pub fn remove_container_files(cfg: &Config, id: &str) {
    if crate::state::is_safe_name(id) {
        let _ = std::fs::remove_dir_all(StateDir::new(&cfg.state_dir).container_dir(id));
    }
}

/// A fresh unguessable name for a per-container directory whose container id is not known yet.
pub fn pending_key() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    if !ok {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b[..16].copy_from_slice(&(t ^ u128::from(std::process::id())).to_le_bytes());
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{PENDING_PREFIX}{hex}")
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

    #[test]
    fn old_pending_dirs_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::new(t.path());
        let c = t.path().join("containers");
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for d in ["pending-old", "c1", "pending-new"] {
            std::fs::create_dir_all(c.join(d)).unwrap();
        }
        for d in ["pending-old", "c1"] {
            std::fs::File::open(c.join(d))
                .unwrap()
                .set_modified(two_hours_ago)
                .unwrap();
        }
        let removed = sweep_pending(&sd, PENDING_MAX_AGE);
        assert_eq!(removed, vec![c.join("pending-old")]);
        assert!(c.join("c1").is_dir() && c.join("pending-new").is_dir());
    }

    #[test]
    fn pending_keys_are_safe_and_distinct() {
        let (a, b) = (pending_key(), pending_key());
        assert!(crate::state::is_safe_name(&a) && a.starts_with(PENDING_PREFIX));
        assert_ne!(a, b);
    }
}
