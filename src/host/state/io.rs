//! Writing state files: atomically (a temp file, fsync, rename, fsync of the directory), and
//! sweeping the temp files of writers that were killed part-way.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through a temp file in the same directory, fsync, rename, and an
/// fsync of the directory.
///
/// # Errors
/// Any I/O error; the temp file is removed on failure.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomic_parts(path, &[bytes], mode)
}

/// [`write_atomic`] of `parts` one after the other.
///
/// # Errors
/// Any I/O error; the temp file is removed on failure.
pub fn write_atomic_parts(path: &Path, parts: &[&[u8]], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let res = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        for p in parts {
            f.write_all(p)?;
        }
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Removes temp files of record writes whose writer was killed (`.<name>.<pid>.tmp` of a pid
/// that no longer runs). Returns their paths.
pub fn sweep_temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_suffix(".tmp")
            .filter(|n| n.starts_with('.'))
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(_, pid)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() && fs::remove_file(e.path()).is_ok() {
            out.push(e.path());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_at_the_temp_name_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        let tmp = dir
            .path()
            .join(format!(".G.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        assert!(write_atomic(&dir.path().join("G.json"), b"new", 0o600).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(!dir.path().join("G.json").exists());
        // Positive control: without the link it is written.
        write_atomic(&dir.path().join("G.json"), b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(dir.path().join("G.json")).unwrap(), b"new");
    }

    #[test]
    fn temp_files_of_dead_writers_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        for n in [
            format!(".G.json.{dead}.tmp"),
            format!(".G.json.{me}.tmp"),
            "G.json".to_owned(),
        ] {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        let swept = sweep_temp_files(dir.path());
        assert_eq!(swept, vec![dir.path().join(format!(".G.json.{dead}.tmp"))]);
        assert!(
            dir.path().join(format!(".G.json.{me}.tmp")).exists(),
            "live writer kept"
        );
    }
}
