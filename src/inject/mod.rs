//! Making a shared GPU usable inside the container: what is bound where ([`bindings`], pure),
//! the host-side files those binds need ([`prepare_host`]), and the hook-only way of binding
//! them into a created container's mount namespace ([`into_container`]).
//!
//! DESIGN "What the container sees": every path inside the rootfs is resolved inside the rootfs
//! (openat2 `RESOLVE_IN_ROOT`), never by joining strings; targets are created the same way;
//! mounts go onto an fd; the work happens in a forked single-threaded child that entered the
//! container's mount namespace; nothing from the image is ever a mount source.

pub mod created;
pub mod rootfs;

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use thiserror::Error;

use crate::config::Config;
use crate::mps::{MpsDirs, MpsError};
use crate::plan::{Plan, MPS_PIPE_IN_CONTAINER};
use crate::request::Mode;
use crate::state::{write_atomic, StateDir};
use crate::sys;
use rootfs::{Kind, Step, Target};

/// Where the limiter, its limits file and its shared directory appear in the container.
pub const LIMIT_DIR_IN_CONTAINER: &str = "/usr/local/gpushare";
/// The limits file (KEY=VALUE lines with the limiter's env names).
pub const LIMITS_IN_CONTAINER: &str = "/usr/local/gpushare/limits";
/// The per-container writable directory for the shared accounting region.
pub const SHARED_IN_CONTAINER: &str = "/usr/local/gpushare/shared";
/// The shared accounting file the limiter uses.
pub const SHARED_CACHE_IN_CONTAINER: &str = "/usr/local/gpushare/shared/cache";
/// The dynamic loader's preload list.
pub const PRELOAD_IN_CONTAINER: &str = "/etc/ld.so.preload";
/// Prefix of per-container directories made by a spec edit that did not know the id
/// (podman's precreate); the createRuntime hook renames them to the id.
pub const PENDING_PREFIX: &str = "pending-";

/// Injection that failed; the caller undoes the acquire.
#[derive(Debug, Error)]
pub enum InjectError {
    #[error(transparent)]
    Mps(#[from] MpsError),
    #[error("cannot write {path}")]
    Host {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("limiter library {0} is not a file; install gpushare's limiter or set [limit] library in the config")]
    NoLimiter(PathBuf),
    #[error("cannot read {what} in the image; fix or remove it in the image")]
    Image {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open {path} for a bind mount")]
    Source {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot enter the mount namespace of container process {pid}")]
    Namespace {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {step} {target} inside the container's rootfs {rootfs} (a symlink or a file of the wrong type in the image?); the container is refused")]
    Target {
        step: &'static str,
        target: String,
        rootfs: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("the helper that mounts into the container failed ({0})")]
    Child(String),
}

/// One host path bound to one path inside the container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Binding {
    /// Host path: always under the state dir or the configured limiter, never in the image.
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: String,
    pub dir: bool,
    pub readonly: bool,
}

/// The limiter's path inside the container.
pub fn limiter_in_container(cfg: &Config) -> String {
    let name = cfg
        .limit
        .library
        .file_name()
        .map_or_else(|| "libgpushare_limiter.so".into(), |n| n.to_string_lossy());
    format!("{LIMIT_DIR_IN_CONTAINER}/{name}")
}

/// What the container gets bound for `plan` (DESIGN "What the container sees"); `key` names the
/// per-container directory (the container id, or a pending name).
pub fn bindings(plan: &Plan, cfg: &Config, key: &str) -> Vec<Binding> {
    let sd = StateDir::new(&cfg.state_dir);
    match plan.mode {
        Mode::Mps => {
            let Some(gpu) = plan.gpus.first() else {
                return Vec::new();
            };
            let dirs = MpsDirs::new(sd.mps_dir(&gpu.uuid));
            vec![
                Binding {
                    source: dirs.pipe,
                    target: MPS_PIPE_IN_CONTAINER.into(),
                    dir: true,
                    readonly: false,
                },
                Binding {
                    source: dirs.shm,
                    target: "/dev/shm".into(),
                    dir: true,
                    readonly: false,
                },
            ]
        }
        Mode::Limit => {
            let dir = sd.container_dir(key);
            vec![
                Binding {
                    source: cfg.limit.library.clone(),
                    target: limiter_in_container(cfg),
                    dir: false,
                    readonly: true,
                },
                Binding {
                    source: dir.join("limits"),
                    target: LIMITS_IN_CONTAINER.into(),
                    dir: false,
                    readonly: true,
                },
                Binding {
                    source: dir.join("shared"),
                    target: SHARED_IN_CONTAINER.into(),
                    dir: true,
                    readonly: false,
                },
                Binding {
                    source: dir.join("ld.so.preload"),
                    target: PRELOAD_IN_CONTAINER.into(),
                    dir: false,
                    readonly: true,
                },
            ]
        }
        Mode::Timeslice => Vec::new(),
    }
}

/// The env the container gets: the plan's, plus the limiter's shared cache in limit mode.
/// (`LD_PRELOAD` is appended separately by the spec edit.)
pub fn container_env(plan: &Plan) -> Vec<(String, String)> {
    let mut env = plan.container_env();
    if plan.mode == Mode::Limit {
        env.push((
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            SHARED_CACHE_IN_CONTAINER.into(),
        ));
    }
    env
}

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

/// Binds `list` into the container whose init process is `pid` and whose rootfs (as the
/// engine gave it, a host path) is `rootfs`. Sources are cloned as detached mount trees on the
/// host first; a forked child then enters the container's mount namespace, resolves each
/// target inside the rootfs (creating it if missing) and moves the clone onto it.
///
/// # Errors
/// [`InjectError`]; the mounts already made live only in the container's namespace, which the
/// runtime tears down when the hook fails.
pub fn into_container(pid: i32, rootfs: &Path, list: &[Binding]) -> Result<(), InjectError> {
    if list.is_empty() {
        return Ok(());
    }
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|source| InjectError::Namespace { pid, source })?;
    let root_c = CString::new(rootfs.as_os_str().as_bytes()).map_err(|_| InjectError::Target {
        step: "open",
        target: "/".into(),
        rootfs: rootfs.to_owned(),
        source: Errno::EINVAL,
    })?;
    let mut prepared: Vec<(OwnedFd, Target)> = Vec::with_capacity(list.len());
    for b in list {
        let src =
            CString::new(b.source.as_os_str().as_bytes()).map_err(|_| InjectError::Source {
                path: b.source.clone(),
                source: Errno::EINVAL,
            })?;
        let mut attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
        if b.readonly {
            attrs |= sys::MOUNT_ATTR_RDONLY;
        }
        let tree = sys::clone_tree(&src, attrs).map_err(|source| InjectError::Source {
            path: b.source.clone(),
            source,
        })?;
        let kind = if b.dir { Kind::Dir } else { Kind::File };
        prepared.push((tree, Target::new(&b.target, kind)));
    }
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| InjectError::Child(e.to_string()))?;
    let outcome = sys::in_forked_child(|| {
        // Async-signal-safe from here on: system calls on prepared data only.
        let report = |idx: usize, step: u8, e: Errno| {
            let mut msg = [0u8; 9];
            msg[..4].copy_from_slice(&(idx as u32).to_le_bytes());
            msg[4] = step;
            msg[5..].copy_from_slice(&(e as i32).to_le_bytes());
            let _ = nix::unistd::write(&wr, &msg);
            1
        };
        if let Err(e) = setns(ns.as_fd(), CloneFlags::CLONE_NEWNS) {
            return report(0, 0, e);
        }
        let root = match rootfs::open_root(&root_c) {
            Ok(r) => r,
            Err(e) => return report(0, 1, e),
        };
        for (i, (tree, target)) in prepared.iter().enumerate() {
            let fd = match rootfs::ensure_target(&root, target) {
                Ok(fd) => fd,
                Err((Step::Resolve, e)) => return report(i, 2, e),
                Err((Step::Create, e)) => return report(i, 3, e),
                Err((Step::Kind, e)) => return report(i, 4, e),
            };
            if let Err(e) = sys::move_mount_onto(tree.as_fd(), fd.as_fd()) {
                return report(i, 5, e);
            }
        }
        0
    })
    .map_err(|e| InjectError::Child(e.to_string()))?;
    drop(wr);
    if outcome.is_ok() {
        return Ok(());
    }
    let mut msg = [0u8; 9];
    let got = nix::unistd::read(&rd, &mut msg).unwrap_or(0);
    if got != msg.len() {
        return Err(InjectError::Child(format!("exit {outcome:?}")));
    }
    let idx = u32::from_le_bytes(msg[..4].try_into().expect("4 bytes")) as usize;
    let errno = Errno::from_raw(i32::from_le_bytes(msg[5..].try_into().expect("4 bytes")));
    if msg[4] == 0 {
        return Err(InjectError::Namespace {
            pid,
            source: std::io::Error::from(errno),
        });
    }
    let step = match msg[4] {
        1 => "open",
        2 => "resolve",
        3 => "create",
        4 => "use (wrong file type)",
        _ => "bind-mount onto",
    };
    let target = if msg[4] == 1 {
        "/".to_owned()
    } else {
        list.get(idx).map_or_else(String::new, |b| b.target.clone())
    };
    Err(InjectError::Target {
        step,
        target,
        rootfs: rootfs.to_owned(),
        source: errno,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlannedGpu;

    fn plan(mode: Mode) -> Plan {
        Plan {
            container: "c1".into(),
            mode,
            gpus: vec![PlannedGpu {
                index: 0,
                uuid: "GPU-0".into(),
                ordinal: 0,
            }],
            memory: Some(1 << 30),
            cores: 50,
            timeslice: None,
        }
    }

    #[test]
    fn bindings_per_mode() {
        let mut cfg = Config {
            state_dir: "/s".into(),
            ..Config::default()
        };
        cfg.limit.library = "/lib/libx.so".into();
        let mps = bindings(&plan(Mode::Mps), &cfg, "c1");
        assert_eq!(mps[0].source, Path::new("/s/mps/GPU-0/pipe"));
        assert_eq!(mps[0].target, "/tmp/nvidia-mps");
        assert_eq!(mps[1].source, Path::new("/s/mps/GPU-0/shm"));
        assert_eq!(mps[1].target, "/dev/shm");
        let lim = bindings(&plan(Mode::Limit), &cfg, "c1");
        let t: Vec<_> = lim
            .iter()
            .map(|b| (b.target.as_str(), b.readonly))
            .collect();
        assert_eq!(
            t,
            vec![
                ("/usr/local/gpushare/libx.so", true),
                ("/usr/local/gpushare/limits", true),
                ("/usr/local/gpushare/shared", false),
                ("/etc/ld.so.preload", true),
            ]
        );
        assert!(lim[2].source.starts_with("/s/containers/c1"));
        assert!(bindings(&plan(Mode::Timeslice), &cfg, "c1").is_empty());
    }

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
        for d in ["pending-old", "c1"] {
            std::fs::create_dir_all(c.join(d)).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::create_dir_all(c.join("pending-new")).unwrap();
        let removed = sweep_pending(&sd, std::time::Duration::from_millis(10));
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
