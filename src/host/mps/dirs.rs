//! A domain's directories on the host: `<state>/mps/<id>/{pipe,log,shm}`, the `owner` file
//! that says whose they are, and the capped tmpfs mounts of the two a tenant writes into.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::host::mps::MpsError;

/// The pipe directory's tmpfs: room for the daemon's four names and what its servers add,
/// never for a tenant's payload (1 MiB, 256 inodes).
pub const PIPE_TMPFS_OPTIONS: &str = "mode=0755,size=1m,nr_inodes=256";

/// The log directory's tmpfs: the daemon logs every command a tenant sends on the control
/// socket, so its log is capped here (4 MiB, 64 inodes), off the state directory's filesystem;
/// `serve` trims it long before it fills ([`crate::host::mps::spawn::trim_log`]).
pub const LOG_TMPFS_OPTIONS: &str = "mode=0755,size=4m,nr_inodes=64";

/// The directories of one isolation domain's daemon: `<state>/mps/<id>/{pipe,log,shm}`, and
/// the `owner` file that names the GPU and domain they belong to.
#[derive(Debug, Clone)]
pub struct MpsDirs {
    pub dir: PathBuf,
    pub pipe: PathBuf,
    pub log: PathBuf,
    pub shm: PathBuf,
    /// `<uuid> <domain>`, written to `owner` first thing by [`MpsDirs::prepare`].
    owner: Option<String>,
}

/// Name of the file in a domain's directory that says whose it is.
pub const OWNER_FILE: &str = "owner";

/// Prefix of a domain directory being made (`.new-<pid>-<nanos>`), renamed into place with its
/// owner file; one whose maker is gone is removed by `gc`.
pub const NEW_PREFIX: &str = ".new-";

impl MpsDirs {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            pipe: dir.join("pipe"),
            log: dir.join("log"),
            shm: dir.join("shm"),
            dir,
            owner: None,
        }
    }

    /// The directories of domain `domain` of GPU `uuid`, in `dir`.
    pub fn owned(dir: PathBuf, uuid: &str, domain: &str) -> Self {
        Self {
            owner: Some(format!("{uuid} {domain}")),
            ..Self::new(dir)
        }
    }

    /// The (uuid, domain) these directories belong to, when made with [`MpsDirs::owned`].
    pub fn owner(&self) -> Option<(&str, &str)> {
        self.owner.as_deref()?.split_once(' ')
    }

    /// The (uuid, domain) an `owner` file names.
    pub fn read_owner(dir: &Path) -> Option<(String, String)> {
        let text = std::fs::read_to_string(dir.join(OWNER_FILE)).ok()?;
        let (uuid, domain) = text.trim().split_once(' ')?;
        Some((uuid.to_owned(), domain.to_owned()))
    }

    /// Creates the directories and mounts the pipe directory's and the shm's tmpfs if they are
    /// not mounted yet (`shm_size` bytes caps the shm). Idempotent.
    ///
    /// # Errors
    /// [`MpsError`] when a directory or a mount cannot be made.
    pub fn prepare(&self, shm_size: u64) -> Result<(), MpsError> {
        use std::os::unix::fs::DirBuilderExt;
        let dirs_err = |path: &Path| {
            let path = path.to_owned();
            move |source| MpsError::Dirs { path, source }
        };
        match &self.owner {
            // Made with its owner file in place, by a rename: a directory under `mps/` always
            // says whose it is, even when its maker was killed half-way.
            Some(owner) if !self.dir.is_dir() => {
                let parent = self.dir.parent().unwrap_or(Path::new("/"));
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .recursive(true)
                    .create(parent)
                    .map_err(dirs_err(parent))?;
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let tmp = parent.join(format!("{NEW_PREFIX}{}-{stamp}", std::process::id()));
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&tmp)
                    .map_err(dirs_err(&tmp))?;
                let made = std::fs::write(tmp.join(OWNER_FILE), owner)
                    .and_then(|()| std::fs::rename(&tmp, &self.dir));
                if let Err(e) = made {
                    let _ = std::fs::remove_dir_all(&tmp);
                    // Someone else made it meanwhile: theirs stands.
                    if !self.dir.is_dir() {
                        return Err(dirs_err(&self.dir)(e));
                    }
                }
            }
            _ => std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(&self.dir)
                .map_err(dirs_err(&self.dir))?,
        }
        for d in [&self.pipe, &self.log, &self.shm] {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(d)
                .map_err(|source| MpsError::Dirs {
                    path: d.clone(),
                    source,
                })?;
        }
        // All three are written by tenants (the log through the daemon, which logs what they
        // send): each is a tmpfs of its own with a size and an inode cap, so that filling one
        // hurts only its domain and nothing lands on the state directory's filesystem; nothing
        // on them runs, opens as a device or gains privileges.
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        let shm_opts = shm_tmpfs_options(shm_size);
        for (path, opts) in [
            (&self.pipe, PIPE_TMPFS_OPTIONS),
            (&self.log, LOG_TMPFS_OPTIONS),
            (&self.shm, shm_opts.as_str()),
        ] {
            if !is_mount_point(path) {
                mount(Some("tmpfs"), path, Some("tmpfs"), flags, Some(opts)).map_err(|source| {
                    MpsError::Mount {
                        path: path.clone(),
                        source,
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Unmounts the shm tmpfs and removes the directory tree. Best effort, idempotent.
    pub fn remove(&self) {
        // The pipe and shm tmpfs, and anything else found mounted on a directory of the domain
        // in this mount namespace (a mount there would only keep the directory from going).
        for d in [&self.shm, &self.pipe, &self.log] {
            while is_mount_point(d) {
                if umount2(d.as_path(), MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
        }
        // The owner file goes last, so that a removal cut short leaves a directory that still
        // says whose it is (and `gc` finishes it under that GPU's lock).
        for d in [&self.pipe, &self.log, &self.shm] {
            let _ = std::fs::remove_dir_all(d);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove an MPS domain directory");
            }
        }
        // The shared `mps/` parent goes too once no domain uses it (fails harmlessly
        // otherwise).
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// The shm tmpfs's options for a cap of `shm_size` bytes: an inode cap too (one inode per
/// 16 KiB of the cap, at least 256), so that empty files cannot exhaust the host's memory.
pub fn shm_tmpfs_options(shm_size: u64) -> String {
    format!(
        "mode=1777,size={shm_size},nr_inodes={}",
        (shm_size / (16 << 10)).max(256)
    )
}

/// Whether `path` is a mount point: as `statx` says, or failing that as mountinfo says.
pub fn is_mount_point(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes());
    if let Some(root) = c.ok().and_then(|c| crate::sys::is_mount_root(&c)) {
        return root;
    }
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let found = crate::host::mounts::entries(&text).any(|e| e.mount_point == path);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mountinfo lines of the mounts at `at`.
    fn mounts_at(at: &Path) -> Vec<String> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        text.lines()
            .filter(|l| {
                crate::host::mounts::entries(l)
                    .next()
                    .is_some_and(|e| e.mount_point == at)
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_shm_cap_comes_with_an_inode_cap() {
        assert_eq!(
            shm_tmpfs_options(64 << 20),
            "mode=1777,size=67108864,nr_inodes=4096"
        );
        assert_eq!(
            shm_tmpfs_options(1 << 20),
            "mode=1777,size=1048576,nr_inodes=256",
            "at least 256"
        );
    }

    #[test]
    fn a_domain_is_made_with_its_owner_three_capped_tmpfs_once_and_removed_quietly() {
        if !crate::host::tests::can_mount("the MPS directory tests") {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let d = MpsDirs::owned(t.path().join("mps/abc"), "GPU-1", "g-x");
        // Whatever happens, nothing stays mounted.
        let _remove = crate::host::tests::RemoveOnDrop(&d);
        d.prepare(64 << 20).unwrap();
        assert_eq!(
            MpsDirs::read_owner(&d.dir),
            Some(("GPU-1".to_owned(), "g-x".to_owned()))
        );
        for (path, size) in [
            (&d.pipe, "size=1024k"),
            (&d.log, "size=4096k"),
            (&d.shm, "size=65536k"),
        ] {
            let lines = mounts_at(path);
            assert_eq!(lines.len(), 1, "{}: {lines:#?}", path.display());
            let (pre, post) = lines[0].split_once(" - ").unwrap();
            let opts: Vec<&str> = pre.split(' ').nth(5).unwrap().split(',').collect();
            for want in ["nosuid", "nodev", "noexec"] {
                assert!(opts.contains(&want), "{want}: {}", lines[0]);
            }
            assert!(
                post.starts_with("tmpfs ") && post.contains(size),
                "{}",
                lines[0]
            );
        }
        assert!(mounts_at(&d.shm)[0].contains("nr_inodes=4096"));
        // Again: nothing more is mounted, and the owner stays.
        d.prepare(64 << 20).unwrap();
        for path in [&d.pipe, &d.log, &d.shm] {
            assert_eq!(mounts_at(path).len(), 1, "{}", path.display());
        }
        let log = crate::host::tests::logged(|| {
            d.remove();
            d.remove();
        });
        assert!(!d.dir.exists());
        assert!(mounts_at(&d.shm).is_empty());
        assert!(log.is_empty(), "a second removal is quiet: {log}");
    }

    #[test]
    fn a_domain_directory_that_cannot_be_made_is_named_in_the_error() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("mps/abc");
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        // A file where the domain's directory goes: the rename of the made one fails.
        std::fs::write(&dir, b"").unwrap();
        let d = MpsDirs::owned(dir.clone(), "GPU-1", "gpu");
        match d.prepare(1 << 20) {
            Err(MpsError::Dirs { path, .. }) => assert_eq!(path, dir),
            other => panic!("{other:?}"),
        }
        let left: Vec<_> = std::fs::read_dir(t.path().join("mps"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["abc"], "the half-made directory is gone");
    }
}
