//! A cgroup v2 of a test's own: the unified hierarchy mounted privately (this node's
//! /sys/fs/cgroup may be v1 or hybrid) with one child cgroup; processes moved back to the root
//! and everything removed on drop. Used by the tests and the hook benchmark.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Cgroup2 {
    pub mnt: PathBuf,
    pub dir: PathBuf,
}

impl Cgroup2 {
    /// Mounts cgroup2 at `mnt` and makes the child `name`; `None` where that cannot be done.
    pub fn new(mnt: &Path, name: &str) -> Option<Self> {
        std::fs::create_dir_all(mnt).ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            return None;
        }
        let dir = mnt.join(name);
        let made = Self {
            mnt: mnt.to_path_buf(),
            dir,
        };
        std::fs::create_dir_all(&made.dir).ok()?;
        Some(made)
    }

    /// Moves process `pid` into the child cgroup.
    pub fn enter(&self, pid: u32) -> bool {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).is_ok()
    }

    /// Whether `path` is the child cgroup (the hierarchy may be mounted elsewhere too, e.g. at
    /// /sys/fs/cgroup/unified on a hybrid node).
    pub fn is(&self, path: &str) -> bool {
        use std::os::unix::fs::MetadataExt;
        let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
        id(Path::new(path)).is_some() && id(Path::new(path)) == id(&self.dir)
    }
}

impl Drop for Cgroup2 {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write(self.mnt.join("cgroup.procs"), p);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}
