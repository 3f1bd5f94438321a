//! The MPS control daemon's sandbox: a mount namespace of its own, set up in the forked child
//! before exec, in which the host is read-only except the directories the daemon must write.

use std::ffi::{CStr, CString};
use std::os::unix::process::CommandExt;
use std::process::Command;

use libc::{OPEN_TREE_CLOEXEC, OPEN_TREE_CLONE};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::detach::close_inherited_on_exec;
use super::mount_api::{
    move_mount_raw, open_tree_raw, set_attrs, AT_RECURSIVE, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID, MOUNT_ATTR_NOSYMFOLLOW, MOUNT_ATTR_RDONLY,
};

/// What a sandboxed MPS control daemon may write, as C strings prepared before the fork: its
/// pipe and log directories (host paths, mounted on themselves), its shm tmpfs (mounted on
/// `/dev/shm`) and the ancestors of the pipe and log directories, outermost first, which are
/// made again inside the private `/tmp` when they lie under it. `binary_dir`: the directory of
/// the program to run when it lies under `/tmp`, mounted there again read-only.
#[derive(Debug)]
pub struct DaemonMounts {
    pub pipe: CString,
    pub log: CString,
    pub shm: CString,
    pub binary_dir: Option<CString>,
    pub make_dirs: Vec<CString>,
}

/// Mount attributes of every directory a tenant can write into, as the daemon sees it: no
/// symlink is followed (so a planted link leads nowhere), no device node opens, no set-uid.
const TENANT_DIR_ATTRS: u64 = MOUNT_ATTR_NOSYMFOLLOW | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID;

/// Arranges for `cmd` to start in a new session and a mount namespace of its own in which the
/// whole host is read-only except `/proc`, `m.pipe` and `m.log` (mounted writable on themselves),
/// the shm tmpfs `m.shm` on `/dev/shm` and a private tmpfs on `/tmp`; those writable mounts follow
/// no symlink and open no device node. Every inherited descriptor above stderr is closed on
/// exec. The caller sets stdio and env.
pub fn daemon_in_sandbox(cmd: &mut Command, m: DaemonMounts) {
    // SAFETY: pre_exec's closure runs in the forked child, where only async-signal-safe calls
    // are allowed (another thread may have held a lock at the fork). This one only makes raw
    // system calls (setsid, unshare, mount, open_tree, mount_setattr, mkdir, move_mount, close,
    // close_range) on C strings `m` prepared before the fork; it allocates nothing (nix takes a
    // `CStr` as it is) and takes no locks. Its mount changes stay in the child's new namespace.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            private_mount_namespace()?;
            // Detached writable copies of the three directories, taken before the host goes
            // read-only (and before `/tmp` is covered, should they lie under it).
            let pipe = writable_copy(&m.pipe, TENANT_DIR_ATTRS | MOUNT_ATTR_NOEXEC)?;
            let log = writable_copy(&m.log, TENANT_DIR_ATTRS | MOUNT_ATTR_NOEXEC)?;
            let shm = writable_copy(&m.shm, TENANT_DIR_ATTRS)?;
            let bin = match &m.binary_dir {
                Some(d) => {
                    let fd = open_tree_raw(libc::AT_FDCWD, d, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)?;
                    set_attrs(
                        fd,
                        c"",
                        libc::AT_EMPTY_PATH as libc::c_uint,
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                        0,
                    )?;
                    Some((fd, d))
                }
                None => None,
            };
            set_attrs(libc::AT_FDCWD, c"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0)?;
            // `/proc` stays writable (its own mount only): an MPS server's driver initialisation
            // writes there and fails with "OS call failed" on a read-only `/proc` (seen on an
            // H100 with driver 580, tests/gpu/sandbox-parts.sh). What a process may write under
            // `/proc` is decided by its credentials, and the daemon has no capabilities.
            // A host without `/proc` mounted has nothing to make writable.
            let _ = set_attrs(libc::AT_FDCWD, c"/proc", 0, 0, MOUNT_ATTR_RDONLY);
            mount(
                Some(c"tmpfs"),
                c"/tmp",
                Some(c"tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(c"mode=1777,size=64m"),
            )?;
            for d in &m.make_dirs {
                // Exists already (EEXIST) unless under the new `/tmp`.
                let _ = nix::unistd::mkdir(
                    d.as_c_str(),
                    nix::sys::stat::Mode::from_bits_truncate(0o755),
                );
            }
            if let Some((fd, d)) = bin {
                move_raw(fd, d)?;
            }
            move_raw(pipe, &m.pipe)?;
            move_raw(log, &m.log)?;
            move_raw(shm, c"/dev/shm")?;
            close_inherited_on_exec();
            Ok(())
        });
    }
}

/// Moves the calling process into a mount namespace of its own whose mounts propagate nowhere.
/// Async-signal-safe (two system calls).
fn private_mount_namespace() -> nix::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&CStr>,
        c"/",
        None::<&CStr>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&CStr>,
    )
}

/// A detached, writable copy of the directory at `path` with `attrs` set. Makes only system
/// calls; the descriptor is close-on-exec.
fn writable_copy(path: &CStr, attrs: u64) -> nix::Result<libc::c_int> {
    let fd = open_tree_raw(libc::AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)?;
    set_attrs(
        fd,
        c"",
        libc::AT_EMPTY_PATH as libc::c_uint,
        attrs,
        MOUNT_ATTR_RDONLY,
    )?;
    Ok(fd)
}

/// [`move_mount_raw`], then closes `tree`.
fn move_raw(tree: libc::c_int, target: &CStr) -> nix::Result<()> {
    let r = move_mount_raw(tree, target);
    // SAFETY: `tree` is a descriptor this child opened (`writable_copy`, `open_tree_raw`) and
    // nothing else holds, closed once here; close(2) is async-signal-safe.
    unsafe { libc::close(tree) };
    r
}
