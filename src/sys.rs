//! The only module with `unsafe`: process set-up between fork and exec.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::unix::process::CommandExt;
use std::process::Command;

use libc::{
    CLOSE_RANGE_CLOEXEC, MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH, OPEN_TREE_CLOEXEC,
    OPEN_TREE_CLONE,
};

/// Mount attributes (`MOUNT_ATTR_*` of `linux/mount.h`), as `libc` exports them.
pub use libc::{
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NOSYMFOLLOW,
    MOUNT_ATTR_RDONLY,
};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

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
    // SAFETY: the closure runs in the forked child before exec. It only makes raw system calls
    // (setsid, unshare, mount, open_tree, mount_setattr, mkdir, move_mount, close, close_range)
    // on data prepared before the fork; it allocates nothing and takes no locks, so it is
    // async-signal-safe.
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

/// Whether `path` (a symlink is not followed) is the root of a mount, as `statx` says
/// (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8); `None` when it cannot say.
pub fn is_mount_root(path: &CStr) -> Option<bool> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // The raw system call, not glibc's `statx` wrapper (glibc 2.28): the binaries are built
    // for glibc 2.17 (.cargo/config.toml).
    // SAFETY: `path` is a valid C string and `stx` a writable buffer of the right type, both
    // living across the call; the arguments are those of statx(2).
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0u32,
            &mut stx as *mut libc::statx,
        )
    };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (r == 0 && stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0)
}

/// `/proc/self/fd/<fd>` written into `buf`, without allocating.
fn proc_fd_path(fd: libc::c_int, buf: &mut [u8; 32]) -> &CStr {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut n = fd.max(0) as u32;
    let mut digits = [0u8; 10];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[prefix.len() + i] = digits[len - 1 - i];
    }
    buf[prefix.len() + len] = 0;
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/")
}

const AT_RECURSIVE: libc::c_uint = libc::AT_RECURSIVE as libc::c_uint;

/// `open_tree(2)`; returns the raw descriptor. Makes only the system call.
fn open_tree_raw(dirfd: libc::c_int, path: &CStr, flags: libc::c_uint) -> nix::Result<libc::c_int> {
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) };
    nix::errno::Errno::result(fd).map(|fd| fd as libc::c_int)
}

/// `mount_setattr(2)` setting `set` and clearing `clr`. Makes only the system call.
fn set_attrs(
    dirfd: libc::c_int,
    path: &CStr,
    flags: libc::c_uint,
    set: u64,
    clr: u64,
) -> nix::Result<()> {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is a valid C string and `attr` lives across the call; its size is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    nix::errno::Errno::result(r).map(drop)
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

/// `move_mount(2)` of the detached tree `tree` onto the path `target`. Makes only the system
/// call.
fn move_mount_raw(tree: libc::c_int, target: &CStr) -> nix::Result<()> {
    move_mount_at(tree, libc::AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)
}

/// `move_mount(2)` of the detached tree `tree` onto `to_path` relative to `to_dirfd` (with
/// `MOVE_MOUNT_T_EMPTY_PATH` in `flags`: onto what `to_dirfd` is open on). Makes only the
/// system call.
fn move_mount_at(
    tree: libc::c_int,
    to_dirfd: libc::c_int,
    to_path: &CStr,
    flags: libc::c_uint,
) -> nix::Result<()> {
    // SAFETY: both paths are valid C strings for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            to_dirfd,
            to_path.as_ptr(),
            flags,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// [`move_mount_raw`], then closes `tree`.
fn move_raw(tree: libc::c_int, target: &CStr) -> nix::Result<()> {
    let r = move_mount_raw(tree, target);
    // SAFETY: `tree` is a descriptor this child opened and owns; close is async-signal-safe.
    unsafe { libc::close(tree) };
    r
}

/// Marks every descriptor above 2 close-on-exec, so that a long-lived child holds none of the
/// pipes its launcher was given (runc waits for a hook's stdout and stderr to close).
fn close_inherited_on_exec() {
    // SAFETY: close_range only changes descriptor flags; an unsupported kernel returns ENOSYS,
    // which leaves the descriptors as they are.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// A system call that failed: its name, the flags it was given and the errno (what libpathrs'
/// errors carry). The path it was given is named by the caller's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call}(flags {flags:#x}) failed")]
pub struct SyscallError {
    pub call: &'static str,
    pub flags: u64,
    #[source]
    pub errno: nix::errno::Errno,
}

impl SyscallError {
    /// Whether the same call may succeed if made again (interrupted, or a transient shortage).
    pub fn is_retry(&self) -> bool {
        matches!(
            self.errno,
            nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN
        )
    }
}

/// `open_tree(2)` with `OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE`: a detached copy of
/// the mount tree at `path` (a host path), which can later be attached in another mount
/// namespace with [`move_mount_onto`]. `attrs` (`MOUNT_ATTR_*`) are set on the copy.
///
/// # Errors
/// [`SyscallError`]: `open_tree` or `mount_setattr`, its flags and errno.
pub fn clone_tree(path: &std::ffi::CStr, attrs: u64) -> Result<std::os::fd::OwnedFd, SyscallError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE;
    let fd = open_tree_raw(libc::AT_FDCWD, path, flags).map_err(|errno| SyscallError {
        call: "open_tree",
        flags: u64::from(flags),
        errno,
    })?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    if attrs != 0 {
        set_attrs(
            fd.as_raw_fd(),
            c"",
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            attrs,
            0,
        )
        .map_err(|errno| SyscallError {
            call: "mount_setattr",
            flags: attrs,
            errno,
        })?;
    }
    Ok(fd)
}

/// `move_mount(2)` of the detached tree `tree` onto the object `target` is open on (an
/// `O_PATH` descriptor resolved inside the container's root). Makes only the system call, so it
/// may be used in a forked child.
///
/// # Errors
/// The system call's errno.
pub fn move_mount_onto(
    tree: std::os::fd::BorrowedFd<'_>,
    target: std::os::fd::BorrowedFd<'_>,
) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    move_mount_at(
        tree.as_raw_fd(),
        target.as_raw_fd(),
        c"",
        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
    )
}

/// Detaches the mount whose root `fd` (an `O_PATH` descriptor) is open on, through
/// `/proc/self/fd/<fd>`. Allocation-free, so it may be used in a forked child.
///
/// # Errors
/// The system call's errno.
pub fn umount_fd_detach(fd: std::os::fd::BorrowedFd<'_>) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 32];
    let path = proc_fd_path(fd.as_raw_fd(), &mut buf);
    // SAFETY: `path` is a NUL-terminated C string that lives across the call.
    let r = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    nix::errno::Errno::result(r).map(drop)
}

/// `pidfd_open(2)`: a descriptor that refers to the process `pid` is now, and to no other
/// process later, whatever reuses the pid.
///
/// # Errors
/// The system call's errno (`ESRCH` when there is no such process).
pub fn pidfd_open(pid: i32) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain system call with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = nix::errno::Errno::result(fd)?;
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `pidfd_send_signal(2)`: sends `signal` to the process `pidfd` refers to.
///
/// # Errors
/// The system call's errno (`ESRCH` when it has exited).
pub fn pidfd_send_signal(pidfd: &std::os::fd::OwnedFd, signal: libc::c_int) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `pidfd` is an open descriptor; a null info pointer is allowed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// Arranges for `cmd` to exec with only the capabilities in `keep` (a mask of `CAP_*` bits) in
/// its bounding, permitted and effective sets, none inheritable or ambient, and NoNewPrivs, so
/// that it can never gain more. Runs after any `pre_exec` set up before it (a sandbox that
/// needs `CAP_SYS_ADMIN` for its mounts).
pub fn drop_privileges_on_exec(cmd: &mut Command, keep: u64) {
    // SAFETY: the closure runs in the forked child before exec and only makes raw system calls
    // (prctl, capset) on data on its stack; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || drop_privileges(keep).map_err(std::io::Error::from));
    }
}

/// The work of [`drop_privileges_on_exec`], async-signal-safe.
fn drop_privileges(keep: u64) -> nix::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    nix::errno::Errno::result(r)?;
    for cap in 0..64u32 {
        if keep & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        // EINVAL: past the last capability this kernel knows.
        if r != 0 && nix::errno::Errno::last() != nix::errno::Errno::EINVAL {
            return Err(nix::errno::Errno::last());
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    for (i, d) in data.iter_mut().enumerate() {
        let word = (keep >> (32 * i)) as u32;
        d.effective = word;
        d.permitted = word;
    }
    // SAFETY: `header` and `data` are valid, properly laid out v3 capability structures that
    // live across the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    nix::errno::Errno::result(r)?;
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    nix::errno::Errno::result(r).map(drop)
}

/// Arranges for `cmd` to start in a session of its own with every inherited descriptor above
/// stderr closed on exec: a helper that outlives the hook which starts it (the reaper) holds
/// none of the runtime's pipes. The caller sets stdio.
pub fn detached(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only makes two raw system
    // calls (setsid, close_range); it allocates nothing and takes no locks, so it is
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            close_inherited_on_exec();
            Ok(())
        });
    }
}

/// Loads the shared library at `path` (`RTLD_NOW | RTLD_LOCAL`: every dependency and
/// undefined symbol resolved, nothing made visible to this process) and returns which of
/// `symbols` it does not define, then unloads it. `Err`: `dlerror`'s text.
///
/// # Errors
/// The library cannot be loaded.
pub fn missing_symbols(path: &std::path::Path, symbols: &[&CStr]) -> Result<Vec<String>, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} has a NUL byte", path.display()))?;
    let last_error = || {
        // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
        // on this thread; it is copied at once.
        let e = unsafe { libc::dlerror() };
        if e.is_null() {
            "dlopen failed".to_owned()
        } else {
            // SAFETY: checked non-NULL above; NUL-terminated per dlerror's contract.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: `c` is a NUL-terminated path that lives across the call; RTLD_LOCAL keeps the
    // library's symbols (its `dlsym` included) out of this process's global scope.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(last_error());
    }
    let missing = symbols
        .iter()
        .filter(|s| {
            // SAFETY: `handle` is the live handle from dlopen above; `s` is NUL-terminated.
            unsafe { libc::dlsym(handle, s.as_ptr()) }.is_null()
        })
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    // SAFETY: `handle` came from dlopen and is closed once; no symbol from it is kept.
    unsafe { libc::dlclose(handle) };
    Ok(missing)
}

/// `nvmlSetMemoryLimits_v1_t` (CUDA 13.4 `nvml.h`): no version field; the `_v1` suffix is
/// the version. 24 bytes on x86_64.
#[repr(C)]
struct SetMemoryLimitsV1 {
    name_space: *const libc::c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`: the same with `currentUsed` [out]. 32 bytes on x86_64.
#[repr(C)]
struct GetMemoryLimitsV1 {
    name_space: *const libc::c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type SetMemoryLimitsFn =
    unsafe extern "C" fn(*mut libc::c_void, *const SetMemoryLimitsV1) -> libc::c_uint;
type GetMemoryLimitsFn =
    unsafe extern "C" fn(*mut libc::c_void, *mut GetMemoryLimitsV1) -> libc::c_uint;

/// NVML's cgroup memory limits (r615 and later), looked up in the NVML library the inventory
/// loaded; `None` from [`NvmlMemoryLimits::open`] when it does not export both functions.
pub struct NvmlMemoryLimits {
    handle: *mut libc::c_void,
    set: SetMemoryLimitsFn,
    get: GetMemoryLimitsFn,
}

impl NvmlMemoryLimits {
    /// Looks both functions up in `library` (the soname or path NVML was loaded from, so the
    /// same, already initialised, library is found).
    pub fn open(library: &str) -> Option<Self> {
        let c = CString::new(library).ok()?;
        // SAFETY: `c` is NUL-terminated and lives across the call. NVML is already loaded by
        // nvml-wrapper from the same name, so this only takes another reference to it.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: `handle` is live; the names are NUL-terminated.
        let set = unsafe { libc::dlsym(handle, c"nvmlDeviceSetMemoryLimits_v1".as_ptr()) };
        // SAFETY: as above.
        let get = unsafe { libc::dlsym(handle, c"nvmlDeviceGetMemoryLimits_v1".as_ptr()) };
        if set.is_null() || get.is_null() {
            // SAFETY: `handle` came from dlopen above and is closed once; nothing from it is kept.
            unsafe { libc::dlclose(handle) };
            return None;
        }
        Some(Self {
            handle,
            // SAFETY: NVML declares the symbol with exactly this signature (nvml.h, r615).
            set: unsafe { std::mem::transmute::<*mut libc::c_void, SetMemoryLimitsFn>(set) },
            // SAFETY: as above.
            get: unsafe { std::mem::transmute::<*mut libc::c_void, GetMemoryLimitsFn>(get) },
        })
    }

    /// `nvmlDeviceSetMemoryLimits_v1` on `device`: the NVML return code.
    pub fn set(
        &self,
        device: &nvml_wrapper::Device<'_>,
        namespace: &CStr,
        soft: u64,
        hard: u64,
    ) -> u32 {
        let limits = SetMemoryLimitsV1 {
            name_space: namespace.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: the handle is only passed back to the NVML it came from, which is loaded
        // while `device` borrows it.
        let dev = unsafe { device.handle() }.cast::<libc::c_void>();
        // SAFETY: `limits` and the string it points to live across the call; NVML reads them.
        unsafe { (self.set)(dev, &limits) }
    }

    /// `nvmlDeviceGetMemoryLimits_v1` on `device`: the return code and (soft, hard, used).
    pub fn get(&self, device: &nvml_wrapper::Device<'_>, namespace: &CStr) -> (u32, u64, u64, u64) {
        let mut limits = GetMemoryLimitsV1 {
            name_space: namespace.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: as in `set`.
        let dev = unsafe { device.handle() }.cast::<libc::c_void>();
        // SAFETY: `limits` is a valid, writable struct of the documented layout for the call.
        let rc = unsafe { (self.get)(dev, &mut limits) };
        (
            rc,
            limits.soft_limit,
            limits.hard_limit,
            limits.current_used,
        )
    }
}

impl Drop for NvmlMemoryLimits {
    fn drop(&mut self) {
        // SAFETY: `handle` came from dlopen in `open` and is closed once, here; the function
        // pointers die with `self`.
        unsafe { libc::dlclose(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limit_structs_have_nvml_layout() {
        assert_eq!(std::mem::size_of::<SetMemoryLimitsV1>(), 24);
        assert_eq!(std::mem::size_of::<GetMemoryLimitsV1>(), 32);
        assert_eq!(std::mem::offset_of!(GetMemoryLimitsV1, hard_limit), 16);
        assert_eq!(std::mem::offset_of!(GetMemoryLimitsV1, current_used), 24);
    }

    #[test]
    fn a_failed_clone_names_the_call_its_flags_and_errno() {
        let e = clone_tree(c"/nonexistent/gpushare-clone-source", 0).unwrap_err();
        assert_eq!(e.call, "open_tree");
        assert_eq!(e.errno, nix::errno::Errno::ENOENT);
        assert_eq!(
            e.flags,
            u64::from(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
        );
        assert!(e.to_string().starts_with("open_tree(flags 0x"), "{e}");
        assert!(!e.is_retry());
        let again = SyscallError {
            errno: nix::errno::Errno::EINTR,
            ..e
        };
        assert!(again.is_retry());
    }
}
