//! Reading the small files the hook reads on every acquire (`/proc/<pid>/stat`, the boot id,
//! the inventory snapshot) in one `read` where they fit: the standard library's `read_to_end`
//! on a file that reports no size (every `/proc` file) probes with reads of 32, 32, 64, 128…
//! bytes, six system calls for a process's stat line, and sizes a regular file with a `statx`
//! first.

use std::io::Read;
use std::path::Path;

/// The first read's size: every file this is used for fits (a stat line is under 400 bytes, a
/// snapshot of 16 GPUs about 2 KiB).
const FIRST_READ: usize = 4096;

/// The bytes of the file at `path`, at most `cap` of them (what is beyond is not read).
///
/// # Errors
/// What opening or reading it fails with.
pub fn read(path: impl AsRef<Path>, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?.take(cap);
    let mut buf = vec![0; FIRST_READ.min(usize::try_from(cap).unwrap_or(usize::MAX))];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if len as u64 >= cap {
                break;
            }
            buf.resize(len * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// [`read`], as text; bytes that are not UTF-8 are an error.
///
/// # Errors
/// What opening or reading it fails with, or `InvalidData`.
pub fn read_text(path: impl AsRef<Path>, cap: u64) -> std::io::Result<String> {
    String::from_utf8(read(path, cap)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_files_small_and_large_and_the_cap() {
        let t = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 4095, 4096, 4097, 20_000] {
            let p = t.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            assert_eq!(read(&p, 1 << 20).unwrap(), data, "{len} bytes");
            assert_eq!(
                read(&p, 100).unwrap(),
                &data[..len.min(100)],
                "{len} bytes, cap 100"
            );
        }
        assert_eq!(
            read(t.path().join("none"), 10).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        // A read that fails (a directory opens, and cannot be read) is an error, not retried.
        assert_eq!(
            read(t.path(), 10).unwrap_err().raw_os_error(),
            Some(libc::EISDIR)
        );
    }

    #[test]
    fn a_proc_stat_line_is_read_whole() {
        let text = read_text("/proc/self/stat", 4096).unwrap();
        assert!(text.ends_with('\n'), "{text}");
        assert!(
            text.starts_with(&format!("{} (", std::process::id())),
            "{text}"
        );
    }
}
