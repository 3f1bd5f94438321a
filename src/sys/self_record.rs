//! A child that records itself before it becomes the program it runs: between fork and exec it
//! writes its own pid and start time to a file, so that no moment exists in which the program
//! runs and nobody knows it (its launcher may be SIGKILLed right after the spawn).

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Arranges for `cmd`'s child to write `"<pid> <start time>\n"` (the start time as
/// `/proc/<pid>/stat` gives it, in clock ticks since boot) to `tmp`, then rename it to `path`,
/// before exec. Register it before any step that makes the file system read-only for the
/// child. A failure to write fails the spawn.
pub fn record_self_on_exec(cmd: &mut Command, tmp: CString, path: CString) {
    // SAFETY: pre_exec's closure runs in the forked child, where only async-signal-safe calls
    // are allowed (another thread may have held a lock at the fork). This one makes raw system
    // calls only (getpid, open, read, write, close, rename) on C strings prepared before the
    // fork and on buffers on its own stack; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            let mut line = [0u8; 48];
            let n = own_line(&mut line)?;
            write_file(&tmp, &line[..n])?;
            if libc::rename(tmp.as_ptr(), path.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Fills `out` with `"<pid> <start time>\n"` of the calling process; returns its length.
fn own_line(out: &mut [u8; 48]) -> std::io::Result<usize> {
    let mut stat = [0u8; 1024];
    let len = read_file(c"/proc/self/stat", &mut stat)?;
    let start = start_time_in(&stat[..len]).ok_or(std::io::ErrorKind::InvalidData)?;
    // SAFETY: getpid(2) takes no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    // `itoa` formats into a buffer on the stack: nothing is allocated.
    let (mut a, mut b) = (itoa::Buffer::new(), itoa::Buffer::new());
    let mut n = 0;
    for piece in [
        a.format(pid).as_bytes(),
        b" ",
        b.format(start).as_bytes(),
        b"\n",
    ] {
        out[n..n + piece.len()].copy_from_slice(piece);
        n += piece.len();
    }
    Ok(n)
}

/// Field 22 (start time) of a `/proc/<pid>/stat` line, counted after the last `)` (the command
/// name may hold spaces and parentheses).
fn start_time_in(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let field = stat[close + 1..]
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty())
        .nth(19)?;
    let mut v: u64 = 0;
    for b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

fn read_file(path: &std::ffi::CStr, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `path` is a NUL-terminated C string; the flags ask for nothing but reading.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `buf` is valid for `buf.len()` bytes; `fd` was opened above.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: `path` is a NUL-terminated C string; O_NOFOLLOW refuses a link planted at it.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `bytes` is valid for `bytes.len()` bytes; `fd` was opened above.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if usize::try_from(n).ok() != Some(bytes.len()) {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_whatever_the_command_name() {
        let line =
            b"4242 (a b) c)) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2\n";
        assert_eq!(start_time_in(line), Some(987_654));
        assert_eq!(start_time_in(b"1 (x) S 1"), None, "too short");
        assert_eq!(start_time_in(b"no parenthesis"), None);
    }

    #[test]
    fn a_spawned_child_records_its_own_pid_and_start_time_before_exec() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon");
        let tmp = dir.path().join(".daemon.tmp");
        let c = |p: &std::path::Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("5");
        record_self_on_exec(&mut cmd, c(&tmp), c(&path));
        let mut child = cmd.spawn().unwrap();
        // Written before exec, so present as soon as spawn returns.
        let text = std::fs::read_to_string(&path).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        // Read here with proc(5)'s own description, not the code's parser: field 22, the
        // fields counted after the command name's closing parenthesis.
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        let start = after_comm.split_whitespace().nth(22 - 3).unwrap();
        assert_eq!(text, format!("{} {start}\n", child.id()));
        assert!(!tmp.exists(), "renamed into place");
    }
}
