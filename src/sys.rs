//! The only module with `unsafe`: process set-up between fork and exec.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::unix::process::CommandExt;
use std::process::Command;

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
/// whole host is read-only except `m.pipe` and `m.log` (mounted writable on themselves), the
/// shm tmpfs `m.shm` on `/dev/shm` and a private tmpfs on `/tmp`; those writable mounts follow
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

/// What a sandboxed control client sees: a read-only copy of `pipe` (a daemon's pipe
/// directory, which must not be a symlink) that follows no symlink, mounted at `at` inside an
/// empty tmpfs laid over `hide` (the state directory).
#[derive(Debug)]
pub struct ClientMounts {
    pub pipe: CString,
    pub hide: CString,
    pub at: CString,
}

/// Mount attributes of the client's copy of the pipe directory.
const CLIENT_PIPE_ATTRS: u64 = MOUNT_ATTR_RDONLY
    | MOUNT_ATTR_NOSYMFOLLOW
    | MOUNT_ATTR_NODEV
    | MOUNT_ATTR_NOSUID
    | MOUNT_ATTR_NOEXEC;

/// Arranges for `cmd` to start in a mount namespace of its own in which `m.hide` is an empty
/// tmpfs holding only the copy of `m.pipe` at `m.at`.
pub fn client_in_sandbox(cmd: &mut Command, m: ClientMounts) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // `enter_client_sandbox`, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || enter_client_sandbox(&m).map_err(std::io::Error::from));
    }
}

/// Makes the calling process's view the client sandbox `m` (see [`client_in_sandbox`]). Makes
/// only raw system calls (unshare, open, mount, mkdir, mount_setattr, close) on data prepared
/// before or on the stack; it allocates nothing and takes no locks, so it is async-signal-safe
/// and may run between fork and exec.
fn enter_client_sandbox(m: &ClientMounts) -> nix::Result<()> {
    private_mount_namespace()?;
    // SAFETY: `m.pipe` is a valid NUL-terminated string for the duration of the call.
    let dir = unsafe {
        libc::open(
            m.pipe.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    let dir = nix::errno::Errno::result(dir)?;
    mount(
        Some(c"tmpfs"),
        m.hide.as_c_str(),
        Some(c"tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(c"mode=0700,size=16k,nr_inodes=16"),
    )?;
    nix::unistd::mkdir(
        m.at.as_c_str(),
        nix::sys::stat::Mode::from_bits_truncate(0o700),
    )?;
    let mut buf = [0u8; 32];
    let src = proc_fd_path(dir, &mut buf);
    let r = mount(
        Some(src),
        m.at.as_c_str(),
        None::<&CStr>,
        MsFlags::MS_BIND,
        None::<&CStr>,
    );
    // SAFETY: `dir` was opened above and is owned here; close is async-signal-safe.
    unsafe { libc::close(dir) };
    r?;
    set_attrs(libc::AT_FDCWD, &m.at, 0, CLIENT_PIPE_ATTRS, 0)
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

/// A program for [`spawn_client_unwaited`], prepared before the fork: its path, arguments
/// (the first is its name) and environment (`NAME=value`).
#[derive(Debug)]
pub struct Exec {
    pub path: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
}

/// Starts `exec` in a session of its own, in the client sandbox `m`, with `input` on its
/// stdin and stdout and stderr on `/dev/null`, to be killed by `SIGALRM` after `seconds`, and
/// waits for nothing: neither its exec nor its exit (a failure between fork and exec ends the
/// child with 127, unseen). For a helper whose answer nobody needs; the caller is expected to
/// exit soon, which hands the child to init. Returns its pid.
///
/// # Errors
/// `input` longer than a pipe holds without a reader (`E2BIG`), or `pipe`, `open` or `fork`
/// failing.
pub fn spawn_client_unwaited(
    exec: &Exec,
    m: &ClientMounts,
    input: &[u8],
    seconds: u32,
) -> nix::Result<i32> {
    use std::os::fd::AsRawFd;
    // What POSIX guarantees a pipe holds before a reader comes.
    if input.len() > libc::PIPE_BUF {
        return Err(nix::errno::Errno::E2BIG);
    }
    let argv: Vec<*const libc::c_char> = exec
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: Vec<*const libc::c_char> = exec
        .envp
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut left = input;
    while !left.is_empty() {
        match nix::unistd::write(&write, left) {
            Ok(n) => left = &left[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    drop(write);
    let null = nix::fcntl::open(
        c"/dev/null",
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let (read, null) = (read.as_raw_fd(), null.as_raw_fd());
    // SAFETY: the child only makes async-signal-safe system calls on data prepared above
    // (descriptors, C strings and pointer arrays that outlive the fork in its copy of the
    // memory) and leaves by `execve` or `_exit`, running no destructor.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            // SAFETY: see above; every call here is async-signal-safe.
            unsafe {
                let ok = libc::dup2(read, 0) == 0
                    && libc::dup2(null, 1) == 1
                    && libc::dup2(null, 2) == 2
                    && libc::chdir(c"/".as_ptr()) == 0
                    && enter_client_sandbox(m).is_ok()
                    && libc::setsid() != -1;
                if ok {
                    // Rust ignores SIGPIPE, and an ignored signal stays ignored across exec.
                    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                    let mut none: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut none);
                    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                    libc::alarm(seconds);
                    close_inherited_on_exec();
                    libc::execve(exec.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
                }
                libc::_exit(127)
            }
        }
        nix::unistd::ForkResult::Parent { child } => Ok(child.as_raw()),
    }
}

/// Whether `path` (a symlink is not followed) is the root of a mount, as `statx` says
/// (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8); `None` when it cannot say.
pub fn is_mount_root(path: &CStr) -> Option<bool> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `stx` a writable buffer of the right type, both
    // living across the call.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut stx,
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

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const AT_RECURSIVE: libc::c_uint = 0x8000;

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
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
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
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
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

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

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
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
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

/// Mount attribute: read-only (`MOUNT_ATTR_RDONLY`).
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// Mount attribute: no set-uid (`MOUNT_ATTR_NOSUID`).
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// Mount attribute: no device nodes (`MOUNT_ATTR_NODEV`).
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
/// Mount attribute: no execution (`MOUNT_ATTR_NOEXEC`).
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
/// Mount attribute: symlinks are not followed (`MOUNT_ATTR_NOSYMFOLLOW`, Linux 5.14).
pub const MOUNT_ATTR_NOSYMFOLLOW: u64 = 0x0020_0000;

/// `open_tree(2)` with `OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE`: a detached copy of
/// the mount tree at `path` (a host path), which can later be attached in another mount
/// namespace with [`move_mount_onto`]. `attrs` (`MOUNT_ATTR_*`) are set on the copy.
///
/// # Errors
/// The system call's errno.
pub fn clone_tree(path: &std::ffi::CStr, attrs: u64) -> nix::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let fd = open_tree_raw(
        libc::AT_FDCWD,
        path,
        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE,
    )?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    if attrs != 0 {
        set_attrs(
            fd.as_raw_fd(),
            c"",
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            attrs,
            0,
        )?;
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
