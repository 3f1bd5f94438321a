//! Keeping an MPS daemon's tenants inside its directories: the pipe directory is mounted
//! into containers, so everything in it is hostile. This module empties it without following a
//! link and prepares the confined view in which the control daemon runs (the mounting itself
//! is in `sys`). gpushare's own control commands need no such view: they are spoken from this
//! process over a socket reached through a descriptor and proven by its peer's credentials
//! (`host::mps::protocol`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::sys;

/// Deepest directory nesting [`empty_dir`] descends into.
const MAX_DEPTH: usize = 32;
/// Passes over one directory before [`empty_dir`] leaves a tenant that keeps filling it.
const MAX_PASSES: usize = 64;
/// Names one pass of [`empty_dir`] reads: a directory a tenant keeps growing is never listed
/// to its end.
const MAX_NAMES_PER_PASS: usize = 4096;

/// Removes every entry of the directory `path`, which itself stays. `path` must not be a
/// symlink; no link inside is ever followed: every name is removed relative to a descriptor of
/// its directory (`unlinkat`), and subdirectories are opened with `openat2` refusing symlinks
/// and mount crossings, emptied the same way, then removed.
///
/// Best effort against a tenant: a directory that still has entries after many passes
/// (something keeps writing into it), or that nests deeper than a daemon ever would, is left
/// as it is. Returns how many names were left behind in `path` (0: it is empty).
///
/// # Errors
/// `ENOTDIR` (or `ELOOP`) when `path` is a symlink or not a directory; any other error of the
/// calls.
pub fn empty_dir(path: &Path) -> io::Result<usize> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    empty_at(fd, 0)
}

/// Empties the directory `fd`; returns how many names it still holds after the last pass.
fn empty_at(fd: OwnedFd, depth: usize) -> io::Result<usize> {
    let mut dir = Dir::from_fd(fd)?;
    // Subdirectories that could not be emptied are not tried again.
    let mut stuck: Vec<CString> = Vec::new();
    let mut left = 0;
    for _ in 0..MAX_PASSES {
        let names: Vec<CString> = dir
            .iter()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_owned())
            .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
            .filter(|n| !stuck.contains(n))
            .take(MAX_NAMES_PER_PASS)
            .collect();
        left = names.len() + stuck.len();
        if names.is_empty() {
            return Ok(left);
        }
        for name in names {
            if !remove_entry(&dir, &name, depth)? {
                stuck.push(name);
            }
        }
    }
    Ok(left)
}

/// Removes `name` from `dir`: unlinks it, or empties and removes it if it is a directory. A
/// name that changed kind or vanished meanwhile is left for the next pass. Returns false for
/// a directory that could not be emptied (too deep, or still being filled).
fn remove_entry(dir: &Dir, name: &CString, depth: usize) -> io::Result<bool> {
    match unlinkat(dir.as_fd(), name.as_c_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(true),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(e.into()),
    }
    if depth >= MAX_DEPTH {
        return Ok(false);
    }
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let sub = match openat2(dir.as_fd(), name.as_c_str(), how) {
        Ok(fd) => fd,
        // Swapped for a link or a file, or gone, or raced (`EAGAIN`): the next pass sees what
        // it is now.
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR | Errno::EAGAIN) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    if empty_at(sub, depth + 1)? > 0 {
        return Ok(false);
    }
    match unlinkat(dir.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::ENOTDIR) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// The mounts of a sandboxed daemon serving `pipe` and logging into `log`, with `shm` as its
/// `/dev/shm` (see `sys::daemon_in_sandbox`), running `binary`.
///
/// # Errors
/// `InvalidInput` when a path holds a NUL byte or is not absolute.
pub(crate) fn daemon_mounts(
    pipe: &Path,
    log: &Path,
    shm: &Path,
    binary: &Path,
) -> io::Result<sys::DaemonMounts> {
    let mut make_dirs = Vec::new();
    // A program under `/tmp` (a stand-in, in tests) is shown again inside the private `/tmp`.
    let binary_dir = binary
        .parent()
        .filter(|d| d.starts_with("/tmp") && d != &Path::new("/tmp"));
    for d in binary_dir.into_iter().chain([pipe, log]) {
        if !d.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not absolute", d.display()),
            ));
        }
        let mut chain: Vec<&Path> = d.ancestors().filter(|a| a.parent().is_some()).collect();
        chain.reverse();
        for a in chain {
            let c = c_path(a)?;
            if !make_dirs.contains(&c) {
                make_dirs.push(c);
            }
        }
    }
    Ok(sys::DaemonMounts {
        pipe: c_path(pipe)?,
        log: c_path(log)?,
        shm: c_path(shm)?,
        binary_dir: binary_dir.map(c_path).transpose()?,
        make_dirs,
    })
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    fn tree(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in walk(root) {
            out.push(e.strip_prefix(root).unwrap().display().to_string());
        }
        out.sort();
        out
    }

    fn walk(p: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(p).unwrap().flatten() {
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }

    #[test]
    fn empty_dir_removes_links_files_and_nested_dirs_and_follows_nothing() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("file"), "keep").unwrap();
        std::fs::write(outside.join("sub/inner"), "keep").unwrap();
        let before = tree(&outside);

        let pipe = t.path().join("pipe");
        std::fs::create_dir_all(pipe.join("a/b/c")).unwrap();
        std::fs::write(pipe.join("a/b/c/f"), "x").unwrap();
        std::fs::write(pipe.join("control_lock"), "").unwrap();
        symlink(&outside, pipe.join("dirlink")).unwrap();
        symlink(outside.join("file"), pipe.join("log")).unwrap();
        symlink(&outside, pipe.join("a/b/up")).unwrap();
        symlink("../../outside", pipe.join("a/rel")).unwrap();
        symlink("/nonexistent", pipe.join("dangling")).unwrap();
        nix::unistd::mkfifo(&pipe.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(pipe.join("control")).unwrap();

        assert_eq!(empty_dir(&pipe).unwrap(), 0);
        assert!(pipe.is_dir(), "the directory itself stays");
        assert!(tree(&pipe).is_empty(), "{:?}", tree(&pipe));
        assert_eq!(tree(&outside), before, "nothing outside touched");
        assert_eq!(
            std::fs::read_to_string(outside.join("file")).unwrap(),
            "keep"
        );
        // Idempotent.
        assert_eq!(empty_dir(&pipe).unwrap(), 0);
    }

    #[test]
    fn empty_dir_refuses_a_symlinked_directory() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("f"), "keep").unwrap();
        symlink(&real, t.path().join("pipe")).unwrap();
        let e = empty_dir(&t.path().join("pipe")).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)),
            "{e}"
        );
        assert!(real.join("f").exists());
    }

    /// A FIFO in place of the directory is refused without being opened (an open for reading
    /// would wait for a writer).
    #[test]
    fn empty_dir_refuses_a_fifo_at_once() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("pipe");
        let f = fifo.clone();
        let got = crate::host::tests::beside_a_fifo(&fifo, move || {
            empty_dir(&f).map_err(|e| e.raw_os_error())
        });
        assert_eq!(
            got.expect("empty_dir waited on the FIFO"),
            Err(Some(libc::ENOTDIR))
        );
    }

    /// A file system mounted inside the directory is not crossed into: what it holds stays.
    #[test]
    fn empty_dir_never_crosses_into_a_mount_inside() {
        if !crate::host::tests::can_mount("the empty_dir mount-crossing test") {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let inner = t.path().join("pipe/m");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(t.path().join("pipe/f"), "x").unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &inner,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        std::fs::write(inner.join("keep"), "keep").unwrap();
        let res = empty_dir(&t.path().join("pipe"));
        let kept = inner.join("keep").exists();
        nix::mount::umount2(&inner, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(kept, "emptied across a mount ({res:?})");
        assert_eq!(res.map_err(|e| e.raw_os_error()), Err(Some(libc::EXDEV)));
    }

    #[test]
    fn a_daemon_under_tmp_has_its_program_s_directory_shown_again() {
        let m = |binary: &str| {
            daemon_mounts(
                Path::new("/run/g/pipe"),
                Path::new("/run/g/log"),
                Path::new("/run/g/shm"),
                Path::new(binary),
            )
            .unwrap()
            .binary_dir
            .map(|c| c.into_string().unwrap())
        };
        assert_eq!(
            m("/tmp/stand-in/nvidia-cuda-mps-control").as_deref(),
            Some("/tmp/stand-in")
        );
        assert_eq!(m("/tmp/nvidia-cuda-mps-control"), None, "not /tmp itself");
        assert_eq!(m("/usr/bin/nvidia-cuda-mps-control"), None);
    }

    #[test]
    fn empty_dir_leaves_absurd_nesting_and_says_so() {
        let t = tempfile::tempdir().unwrap();
        let mut p = t.path().join("pipe");
        std::fs::create_dir(&p).unwrap();
        let top = p.clone();
        std::fs::write(top.join("f"), "x").unwrap();
        for _ in 0..(MAX_DEPTH + 3) {
            p = p.join("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        assert_eq!(empty_dir(&top).unwrap(), 1, "only the deep tree is left");
        assert!(!top.join("f").exists());
    }

    #[test]
    fn empty_dir_leaves_a_tenant_that_keeps_writing_without_failing() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let t = tempfile::tempdir().unwrap();
        let pipe = t.path().join("pipe");
        std::fs::create_dir(&pipe).unwrap();
        std::fs::write(pipe.join("old"), "x").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, pipe) = (stop.clone(), pipe.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = symlink("/etc/shadow", pipe.join(format!("l{n}")));
                    n += 1;
                }
            })
        };
        while !pipe.join("l0").exists() && !pipe.join("l1").exists() {
            std::thread::yield_now();
        }
        let left = empty_dir(&pipe);
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(left.is_ok(), "{left:?}");
        assert!(!pipe.join("old").exists());
        // Once the tenant stops, the next call empties it.
        assert_eq!(empty_dir(&pipe).unwrap(), 0);
    }

    /// Runs `script` under `sh` with `setup` applied to its command; returns (success, output).
    fn sh(script: &str, setup: impl FnOnce(&mut std::process::Command)) -> (bool, String) {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", script])
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        setup(&mut cmd);
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// A temporary directory outside `/tmp` (which the daemon's sandbox covers); not under the
    /// repo's `target/`, which a `CARGO_TARGET_DIR` elsewhere leaves absent.
    fn tempdir_off_tmp() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("gpushare-sandbox-test-")
            .tempdir_in("/var/tmp")
            .unwrap()
    }

    #[test]
    fn daemon_sandbox_writes_only_its_own_directories() {
        daemon_sandbox_case(&tempdir_off_tmp());
    }

    #[test]
    fn daemon_sandbox_keeps_its_directories_when_they_lie_under_tmp() {
        daemon_sandbox_case(&tempfile::tempdir().unwrap());
    }

    fn daemon_sandbox_case(t: &tempfile::TempDir) {
        if !crate::host::tests::can_mount("mount namespace tests") {
            return;
        }
        let host = tempdir_off_tmp();
        let (pipe, log, shm, outside) = (
            t.path().join("mps/pipe"),
            t.path().join("mps/log"),
            t.path().join("mps/shm"),
            host.path().join("outside"),
        );
        for d in [&pipe, &log, &shm, &outside] {
            std::fs::create_dir_all(d).unwrap();
        }
        symlink(outside.join("via-link"), pipe.join("link")).unwrap();
        let tmp_marker = format!("gpushare-sandbox-test-{}", std::process::id());
        let script = format!(
            "set -u
             echo pipe > {pipe}/f && echo log > {log}/f && echo shm > /dev/shm/f || exit 10
             echo tmp > /tmp/{tmp_marker} || exit 11
             echo null > /dev/null || exit 12
             if echo x > {outside}/f 2>/dev/null; then exit 13; fi
             if echo x > {pipe}/link 2>/dev/null; then exit 14; fi
             if chmod 777 {pipe}/link 2>/dev/null; then exit 15; fi
             if mkdir {root}/new 2>/dev/null; then exit 16; fi
             if touch /etc/gpushare-sandbox-test 2>/dev/null; then exit 18; fi
             grep -q ' {pipe} .*nosymfollow' /proc/self/mountinfo || exit 17
             awk '$5 == \"/proc\" {{ split($6, o, \",\"); if (o[1] != \"rw\") exit 1 }}' /proc/self/mountinfo || exit 19
             awk '$5 == \"/\" {{ split($6, o, \",\"); if (o[1] != \"ro\") exit 1 }}' /proc/self/mountinfo || exit 20
             exit 0",
            pipe = pipe.display(),
            log = log.display(),
            outside = outside.display(),
            root = host.path().display(),
        );
        let mounts = daemon_mounts(&pipe, &log, &shm, Path::new("/bin/sh")).unwrap();
        let (ok, out) = sh(&script, |c| crate::sys::daemon_in_sandbox(c, mounts));
        assert!(ok, "{out}");
        assert_eq!(std::fs::read_to_string(pipe.join("f")).unwrap(), "pipe\n");
        assert_eq!(std::fs::read_to_string(log.join("f")).unwrap(), "log\n");
        assert_eq!(std::fs::read_to_string(shm.join("f")).unwrap(), "shm\n");
        assert!(
            !Path::new("/tmp").join(&tmp_marker).exists(),
            "/tmp is private"
        );
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        assert!(!host.path().join("new").exists());
    }
}
