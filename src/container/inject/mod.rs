//! Making a shared GPU usable inside the container: what is bound where ([`bindings`], pure),
//! the host-side files those binds need ([`prepare_host`]), and the hook-only way of binding
//! them into a created container's mount namespace ([`into_container`]).
//!
//! docs/design.md "What the container sees": every path inside the rootfs is resolved inside the rootfs
//! (openat2 `RESOLVE_IN_ROOT`), never by joining strings; targets are created the same way;
//! mounts go onto an fd; the work happens on the hook's thread while it is in the container's
//! mount namespace, and the thread is put back before anything else; nothing from the image is
//! ever a mount source.

pub mod created;
pub mod host;
pub mod libc;
pub mod libc_cache;
pub mod rootfs;

pub use host::{preload_text, prepare_host, remove_container_files};

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use thiserror::Error;

use crate::config::Config;
use crate::decide::plan::{Plan, MPS_PIPE_IN_CONTAINER};
use crate::host::mps::MpsError;
use crate::host::state::StateDir;
use crate::sys;
use crate::vocab::Mode;
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
        source: crate::sys::SyscallError,
    },
    #[error("bind mount source {0} holds a NUL byte")]
    NulInSource(PathBuf),
    #[error("container process {pid} is in gpushare's own mount namespace, so its mounts would land on the host; run it with a mount namespace of its own (a runtime gives one before createRuntime)")]
    HostNamespace { pid: i32 },
    #[error("cannot enter the mount namespace of container process {pid}")]
    Namespace {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {step} {target} inside the container's rootfs {rootfs}; the image has a symlink or a file of the wrong type on that path: fix the image")]
    Target {
        step: &'static str,
        target: String,
        rootfs: PathBuf,
        #[source]
        source: Errno,
    },
    #[error(transparent)]
    Libc(#[from] libc::LibcError),
    #[error(transparent)]
    LimiterImage(#[from] libc::LimiterRefused),
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

impl Binding {
    /// Whether the bind runs nothing (`noexec`, with `nosuid` and `nodev` as every bind): every
    /// directory gpushare binds is one a tenant can write (the MPS pipe directory, the domain's
    /// `/dev/shm`, the limiter's shared directory); the files are read-only, and the limiter
    /// must stay mappable as code.
    pub fn noexec(&self) -> bool {
        self.dir
    }
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

/// What the container gets bound for `plan` (docs/design.md "What the container sees"); `key` names the
/// per-container directory (the container id, or a pending name).
pub fn bindings(plan: &Plan, cfg: &Config, key: &str) -> Vec<Binding> {
    let sd = StateDir::new(&cfg.state_dir);
    let mut out = Vec::new();
    if plan.mode == Mode::Mps {
        let Some(gpu) = plan.gpus.first() else {
            return Vec::new();
        };
        let dirs = sd.mps_dirs(&gpu.uuid, plan.domain_key());
        out.push(Binding {
            source: dirs.pipe,
            target: MPS_PIPE_IN_CONTAINER.into(),
            dir: true,
            readonly: cfg.mps.pipe_readonly,
        });
        out.push(Binding {
            source: dirs.shm,
            target: "/dev/shm".into(),
            dir: true,
            readonly: false,
        });
    }
    if plan.uses_limiter() {
        let dir = sd.container_dir(key);
        out.extend([
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
        ]);
    }
    out
}

/// The env the container gets: the plan's, plus the limiter's shared cache in limit mode.
/// (`LD_PRELOAD` is appended separately by the spec edit.)
pub fn container_env(plan: &Plan) -> Vec<(String, String)> {
    let mut env = plan.container_env();
    if plan.uses_limiter() {
        env.push((
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            SHARED_CACHE_IN_CONTAINER.into(),
        ));
    }
    env
}

/// Binds `list` into the container whose init process is `pid` and whose rootfs (as the
/// engine gave it, a host path) is `rootfs`. Sources are cloned as detached mount trees on the
/// host first; the thread then enters the container's mount namespace, resolves each
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
    if same_file(&ns, Path::new("/proc/thread-self/ns/mnt")) {
        return Err(InjectError::HostNamespace { pid });
    }
    let root_c = CString::new(rootfs.as_os_str().as_bytes()).map_err(|_| InjectError::Target {
        step: "open",
        target: "/".into(),
        rootfs: rootfs.to_owned(),
        source: Errno::EINVAL,
    })?;
    let mut prepared: Vec<(OwnedFd, Target)> = Vec::with_capacity(list.len());
    for b in list {
        let src = CString::new(b.source.as_os_str().as_bytes())
            .map_err(|_| InjectError::NulInSource(b.source.clone()))?;
        let mut attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
        if b.noexec() {
            attrs |= sys::MOUNT_ATTR_NOEXEC;
        }
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
    // Which binding failed (its index), at which step, with which errno.
    type Failure = (usize, &'static str, Errno);
    let outcome = in_mount_namespace(ns.as_fd(), || -> Result<(), Failure> {
        let root = rootfs::open_root(&root_c).map_err(|e| (0, "open", e))?;
        for (i, (tree, target)) in prepared.iter().enumerate() {
            let step = |(step, e): (Step, Errno)| {
                let step = match step {
                    Step::Resolve => "resolve",
                    Step::Create => "create",
                    Step::Kind => "use (wrong file type)",
                };
                (i, step, e)
            };
            let fd = rootfs::ensure_target(&root, target).map_err(step)?;
            match sys::move_mount_onto(tree.as_fd(), fd.as_fd()) {
                Ok(()) => {}
                // The target is a mount over a removed directory (a spec mount of a daemon
                // directory that was replaced since): detach it and bind onto what is below.
                Err(Errno::ENOENT) => {
                    sys::umount_fd_detach(fd.as_fd()).map_err(|e| (i, "bind-mount onto", e))?;
                    drop(fd);
                    let fd = rootfs::ensure_target(&root, target).map_err(step)?;
                    sys::move_mount_onto(tree.as_fd(), fd.as_fd())
                        .map_err(|e| (i, "bind-mount onto", e))?;
                }
                Err(e) => return Err((i, "bind-mount onto", e)),
            }
        }
        Ok(())
    })
    .map_err(|source| InjectError::Namespace {
        pid,
        source: source.into(),
    })?;
    outcome.map_err(|(i, step, source)| InjectError::Target {
        step,
        target: if step == "open" {
            "/".to_owned()
        } else {
            list.get(i).map_or_else(String::new, |b| b.target.clone())
        },
        rootfs: rootfs.to_owned(),
        source,
    })
}

/// Whether the open file `f` and the file at `path` are the same (device and inode).
fn same_file(f: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Runs `work` on the calling thread inside the mount namespace `ns`, then puts the thread back
/// into the namespace, root and working directory it had. The thread first unshares its
/// filesystem attributes (as `setns` requires), so no other thread of the process moves; a
/// thread of its own cost more than the binds it makes (0.05-0.09 ms to start and join here).
/// A thread that cannot be put back ends the process: it must not go on, in a tenant's mount
/// namespace, to write the host's state.
///
/// # Errors
/// The errno of opening where the thread is, of `unshare` or of `setns`; the thread is where
/// it was.
fn in_mount_namespace<T>(
    ns: std::os::fd::BorrowedFd<'_>,
    work: impl FnOnce() -> T,
) -> Result<T, Errno> {
    use nix::fcntl::OFlag;
    let here = |path: &str, how: OFlag| {
        nix::fcntl::open(path, how | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
    };
    let home = Home {
        // setns takes no O_PATH descriptor.
        ns: here("/proc/thread-self/ns/mnt", OFlag::O_RDONLY)?,
        root: here("/", OFlag::O_PATH)?,
        cwd: here(".", OFlag::O_PATH)?,
    };
    nix::sched::unshare(CloneFlags::CLONE_FS)?;
    setns(ns, CloneFlags::CLONE_NEWNS)?;
    let _back = home;
    Ok(work())
}

/// Where a thread was before [`in_mount_namespace`] moved it; dropping it (after `work`, or
/// while a panic unwinds through it) moves the thread back.
struct Home {
    ns: OwnedFd,
    root: OwnedFd,
    cwd: OwnedFd,
}

impl Drop for Home {
    fn drop(&mut self) {
        // setns makes the namespace's root the thread's root: the same as before unless the
        // process was in a chroot, which is then entered again.
        let same_root = || -> nix::Result<bool> {
            let (a, b) = (
                nix::sys::stat::fstat(&self.root)?,
                nix::sys::stat::stat("/")?,
            );
            Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
        };
        let back = setns(self.ns.as_fd(), CloneFlags::CLONE_NEWNS)
            .and_then(|()| same_root())
            .and_then(|same| match same {
                true => Ok(()),
                false => nix::unistd::fchdir(&self.root).and_then(|()| nix::unistd::chroot(".")),
            })
            .and_then(|()| nix::unistd::fchdir(&self.cwd));
        if let Err(e) = back {
            eprintln!("gpushare: cannot return to the host's mount namespace after binding into a container: {e}");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::plan::PlannedGpu;

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
            cap: Some(1 << 30),
            enforcement: crate::decide::enforce::not_created(),
            without_limiter: None,
            cores: 50,
            cores_explicit: true,
            timeslice: None,
            domain: None,
            uid: 0,
        }
    }

    /// The thread that binds enters the container's mount namespace and comes back to its own,
    /// with its working directory; no other thread of the process moves.
    #[test]
    fn binding_moves_only_the_calling_thread_and_puts_it_back() {
        if !crate::host::tests::can_mount("the mount-namespace round trip") {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (dir, at) = (t.path().join("dir"), t.path().join("at"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(dir.join("marker"), "x").unwrap();
        let binder = crate::host::tests::Binder::start(&dir, &at);
        let ns = std::fs::File::open(format!("/proc/{}/ns/mnt", binder.0.id())).unwrap();
        let ns_of = |p: &str| std::fs::read_link(p).unwrap();
        // A thread of the test's own, so that its working directory is its alone.
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(CloneFlags::CLONE_FS).unwrap();
                std::env::set_current_dir(&dir).unwrap();
                let before = ns_of("/proc/thread-self/ns/mnt");
                let (inside, seen, leader) = in_mount_namespace(ns.as_fd(), || {
                    (
                        ns_of("/proc/thread-self/ns/mnt"),
                        at.join("marker").exists(),
                        ns_of("/proc/self/ns/mnt"),
                    )
                })
                .unwrap();
                // Positive control: inside, the thread saw the binder's namespace and bind.
                assert_ne!(inside, before);
                assert!(
                    seen,
                    "the bind of the binder's namespace was not seen inside"
                );
                assert_eq!(leader, before, "the process's main thread moved");
                assert_eq!(ns_of("/proc/thread-self/ns/mnt"), before, "not put back");
                assert!(!at.join("marker").exists(), "still sees the binder's bind");
                assert_eq!(
                    std::env::current_dir().unwrap(),
                    dir,
                    "working directory lost"
                );
            });
        });
        drop(binder);
    }

    #[test]
    fn bindings_per_mode() {
        let mut cfg = Config {
            state_dir: "/s".into(),
            ..Config::default()
        };
        cfg.limit.library = "/lib/libx.so".into();
        let mps = bindings(&plan(Mode::Mps), &cfg, "c1");
        let dir = Path::new("/s/mps").join(crate::host::state::domain_dir_name("GPU-0", "gpu"));
        assert_eq!(mps[0].source, dir.join("pipe"));
        assert_eq!(mps[0].target, "/tmp/nvidia-mps");
        assert_eq!(mps[1].source, dir.join("shm"));
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
        // A memory cap brings the limiter to timeslice and mps too; without one, nothing.
        let capped = |mode| {
            let p = plan(mode);
            bindings(&p, &cfg, "c1")
                .iter()
                .map(|b| b.target.clone())
                .collect::<Vec<_>>()
        };
        let limiter_targets: Vec<String> = lim.iter().map(|b| b.target.clone()).collect();
        assert_eq!(capped(Mode::Timeslice), limiter_targets);
        assert_eq!(capped(Mode::Mps)[2..], limiter_targets[..]);
        let uncapped = |mode| Plan {
            cap: None,
            ..plan(mode)
        };
        assert!(bindings(&uncapped(Mode::Timeslice), &cfg, "c1").is_empty());
        assert_eq!(bindings(&uncapped(Mode::Mps), &cfg, "c1").len(), 2);
    }
}
