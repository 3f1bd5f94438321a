//! Mount tables: the one mountinfo parser, and who has a host directory mounted (the processes,
//! one per mount namespace, whose mount table binds it), used to rebuild a record from what
//! really runs.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of a mountinfo file (proc(5)), its paths unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `major:minor` of the filesystem.
    pub dev: String,
    /// The path within the filesystem that is the root of this mount.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// The filesystem type (after the ` - ` separator).
    pub fstype: String,
}

/// The options of the tmpfs on a container's `shared` directory (the limiter's accounting
/// file, about 73 KiB, written from inside the container): 1 MiB and 64 inodes, mounted nosuid,
/// nodev, noexec, so that a tenant's writes there land on a capped tmpfs of their own, never
/// on the state directory's filesystem.
pub const SHARED_TMPFS_OPTIONS: &str = "mode=1777,size=1m,nr_inodes=64";

/// Mounts the capped tmpfs ([`SHARED_TMPFS_OPTIONS`]) on `shared` unless one is there.
///
/// # Errors
/// The mount's error (the hook needs CAP_SYS_ADMIN).
pub fn mount_shared(shared: &Path) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    if crate::host::mps::is_mount_point(shared) {
        return Ok(());
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("tmpfs"),
        shared,
        Some("tmpfs"),
        flags,
        Some(SHARED_TMPFS_OPTIONS),
    )
    .map_err(|e| std::io::Error::other(format!("cannot mount a capped tmpfs on it: {e}")))
}

/// Removes a per-container directory `dir`: the tmpfs on its `shared` is detached first (a
/// mount there would keep the directory from going).
///
/// # Errors
/// [`std::fs::remove_dir_all`]'s.
pub fn remove_container_dir(dir: &Path) -> std::io::Result<()> {
    use nix::mount::{umount2, MntFlags};
    let shared = dir.join("shared");
    while crate::host::mps::is_mount_point(&shared) {
        if umount2(&shared, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).is_err() {
            break;
        }
    }
    std::fs::remove_dir_all(dir)
}

/// The lines of a mountinfo file that parse; a malformed line is skipped.
pub fn entries(mountinfo: &str) -> impl Iterator<Item = Entry> + '_ {
    mountinfo.lines().filter_map(parse_line)
}

/// One mountinfo line: `id parent major:minor root mount-point options [optional...] - fstype
/// source super-options`.
fn parse_line(line: &str) -> Option<Entry> {
    let (pre, post) = line.split_once(" - ")?;
    let f: Vec<&str> = pre.split(' ').collect();
    if f.len() < 6 {
        return None;
    }
    Some(Entry {
        dev: f[2].to_owned(),
        root: PathBuf::from(std::ffi::OsString::from_vec(unescape(f[3]))),
        mount_point: PathBuf::from(std::ffi::OsString::from_vec(unescape(f[4]))),
        fstype: post.split(' ').next()?.to_owned(),
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash, any `\ooo`);
/// a backslash not followed by three octal digits stays as it is.
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)) && d[0] <= b'3');
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Where `path` lives as seen in `mountinfo` (the caller's own): the device and the path
/// within that filesystem, from the mount with the longest mount point that contains it.
pub fn locate(mountinfo: &str, path: &Path) -> Option<(String, PathBuf)> {
    entries(mountinfo)
        .filter(|e| path.starts_with(&e.mount_point))
        .max_by_key(|e| e.mount_point.as_os_str().len())
        .map(|e| {
            let rest = path.strip_prefix(&e.mount_point).unwrap_or(path);
            let inner = if rest.as_os_str().is_empty() {
                e.root.clone()
            } else {
                e.root.join(rest)
            };
            (e.dev, inner)
        })
}

/// Whether a mount table binds the filesystem path (`dev`, `inner`) somewhere other than at
/// `host_at`, where the host itself mounts it: a mount namespace cloned from the host (any
/// process that unshared one after the directory's own tmpfs was mounted) carries a copy of
/// that mount at the same place, and is no container that was given the directory.
pub fn binds(mountinfo: &str, dev: &str, inner: &Path, host_at: &Path) -> bool {
    entries(mountinfo).any(|e| e.dev == dev && e.root == inner && e.mount_point != host_at)
}

/// The lowest pid of every other mount namespace that binds `dir` (a container that has it
/// mounted), by namespace; the namespaces of the processes in `skip` (the daemon, whose own
/// sandbox binds its directories) are not counted.
pub fn holders_of(dir: &Path, skip: &[i32]) -> Vec<i32> {
    let Ok(own) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let Some((dev, inner)) = locate(&own, dir) else {
        return Vec::new();
    };
    let own_ns = std::fs::read_link("/proc/self/ns/mnt").ok();
    let skipped: Vec<std::path::PathBuf> = skip
        .iter()
        .filter_map(|p| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok())
        .collect();
    let mut by_ns: BTreeMap<std::path::PathBuf, i32> = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        if Some(&ns) == own_ns.as_ref()
            || skipped.contains(&ns)
            || by_ns.get(&ns).is_some_and(|p| *p < pid)
        {
            continue;
        }
        let Ok(mi) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        if binds(&mi, &dev, &inner, dir) {
            by_ns.insert(ns, pid);
        }
    }
    by_ns.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::tests::{can_mount, Binder};

    /// Detaches whatever is still mounted at the path when dropped (a failed test leaves
    /// nothing behind).
    struct Detach(PathBuf);

    impl Drop for Detach {
        fn drop(&mut self) {
            while crate::host::mps::is_mount_point(&self.0) {
                if nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
        }
    }

    /// The mountinfo lines of the mounts at `at`.
    fn mounts_at(at: &Path) -> Vec<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| parse_line(l).is_some_and(|e| e.mount_point == at))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_shared_tmpfs_is_capped_mounted_once_and_removed_even_while_in_use() {
        if !can_mount("the shared-tmpfs and mount-holder tests") {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("c1");
        let shared = dir.join("shared");
        std::fs::create_dir_all(&shared).unwrap();
        let _detach = Detach(shared.clone());
        mount_shared(&shared).unwrap();
        mount_shared(&shared).unwrap();
        let lines = mounts_at(&shared);
        assert_eq!(lines.len(), 1, "mounted once: {lines:#?}");
        let (pre, post) = lines[0].split_once(" - ").unwrap();
        let options: Vec<&str> = pre.split(' ').nth(5).unwrap().split(',').collect();
        for want in ["nosuid", "nodev", "noexec"] {
            assert!(options.contains(&want), "{want}: {}", lines[0]);
        }
        assert!(post.starts_with("tmpfs "), "{}", lines[0]);
        for want in ["size=1024k", "nr_inodes=64"] {
            assert!(post.contains(want), "{want}: {}", lines[0]);
        }
        // (The kernel lists no mode for tmpfs's default, 1777.)
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&shared).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777);
        // A file held open in it keeps a plain unmount busy; the directory still goes.
        let held = std::fs::File::create(shared.join("cache")).unwrap();
        remove_container_dir(&dir).unwrap();
        assert!(!dir.exists());
        assert!(mounts_at(&shared).is_empty());
        drop(held);
    }

    #[test]
    fn a_directory_is_held_by_the_namespaces_that_bind_it_elsewhere() {
        if !can_mount("the shared-tmpfs and mount-holder tests") {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (dir, at) = (t.path().join("dir"), t.path().join("at"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&at).unwrap();
        assert!(holders_of(&dir, &[]).is_empty(), "nobody yet");
        let b = Binder::start(&dir, &at);
        let pid = b.0.id() as i32;
        // The namespace's lowest pid: the shell that became `sleep` (no other process is in it).
        assert_eq!(holders_of(&dir, &[]), [pid]);
        assert!(
            holders_of(&at, &[]).is_empty(),
            "not mounted anywhere itself"
        );
        assert!(
            holders_of(&dir, &[pid]).is_empty(),
            "a skipped process's namespace"
        );
        // A second process in the same namespace: still one holder, the lowest pid.
        let mut joined = std::process::Command::new("nsenter")
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .args(["sleep", "60"])
            .spawn()
            .expect("nsenter");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{}/ns/mnt", joined.id())).ok()
            != std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
        {
            assert!(std::time::Instant::now() < deadline, "nsenter did not join");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let holders = holders_of(&dir, &[]);
        let _ = joined.kill();
        let _ = joined.wait();
        assert_eq!(holders, [pid.min(joined.id() as i32)]);
        drop(b);
    }

    #[test]
    fn only_three_octal_digits_below_400_are_an_escape() {
        assert_eq!(unescape(r"a\040b"), b"a b");
        assert_eq!(unescape(r"a\134b"), b"a\\b");
        assert_eq!(unescape(r"\400"), br"\400", "above a byte");
        assert_eq!(unescape(r"\3x7"), br"\3x7", "not all octal");
        assert_eq!(unescape(r"end\04"), br"end\04", "too short");
    }

    const HOST: &str = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:25 / /run rw - tmpfs tmpfs rw
31 30 0:26 / /run/gpushare/mps/abc/shm rw - tmpfs tmpfs rw
";

    #[test]
    fn locating_and_matching_binds() {
        type Row<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>);
        let rows: &[Row] = &[
            (
                "under a tmpfs",
                "/run/gpushare/mps/abc/pipe",
                Some(("0:25", "/gpushare/mps/abc/pipe")),
            ),
            ("on the root fs", "/var/lib/x", Some(("8:1", "/var/lib/x"))),
            (
                "a mount point itself",
                "/run/gpushare/mps/abc/shm",
                Some(("0:26", "/")),
            ),
        ];
        for (what, path, want) in rows {
            let got = locate(HOST, Path::new(path));
            assert_eq!(
                got.as_ref().map(|(d, i)| (d.as_str(), i.to_str().unwrap())),
                *want,
                "{what}"
            );
        }
        let container = "\
100 99 0:50 / / rw - overlay overlay rw
101 100 0:25 /gpushare/mps/abc/pipe /tmp/nvidia-mps rw - tmpfs tmpfs rw
";
        let p = |s: &str| PathBuf::from(s);
        let host_at = p("/run/gpushare/mps/abc/pipe");
        assert!(binds(
            container,
            "0:25",
            &p("/gpushare/mps/abc/pipe"),
            &host_at
        ));
        assert!(!binds(
            container,
            "0:25",
            &p("/gpushare/mps/other/pipe"),
            &host_at
        ));
        assert!(!binds(
            container,
            "0:99",
            &p("/gpushare/mps/abc/pipe"),
            &host_at
        ));
        // A namespace cloned from the host: the pipe directory's own tmpfs at the host's place.
        let cloned = "\
200 199 8:1 / / rw - ext4 /dev/sda1 rw
201 200 0:27 / /run/gpushare/mps/abc/pipe rw - tmpfs tmpfs rw
";
        assert!(
            !binds(cloned, "0:27", &p("/"), &host_at),
            "a copy of the host's mount"
        );
        let given = "\
300 299 0:50 / / rw - overlay overlay rw
301 300 0:27 / /tmp/nvidia-mps ro - tmpfs tmpfs rw
";
        assert!(
            binds(given, "0:27", &p("/"), &host_at),
            "a container given it"
        );
    }

    #[test]
    fn escaped_and_odd_lines() {
        let text = "\
36 35 98:0 /mnt\\040with\\011tab /a\\134b\\012c rw,noatime master:1 - ext3 /dev/root rw
37 35 0:30 / /sys/fs/cgroup rw shared:9 unbindable - cgroup2 cgroup2 rw
garbage line without separator
38 35 0:31 / /odd\\9x\\ rw - tmpfs tmpfs rw
39 35 0:32 /x
";
        let got: Vec<Entry> = entries(text).collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].root, PathBuf::from("/mnt with\ttab"));
        assert_eq!(got[0].mount_point, PathBuf::from("/a\\b\nc"));
        assert_eq!(got[0].fstype, "ext3");
        assert_eq!(got[1].fstype, "cgroup2", "optional fields are skipped");
        assert_eq!(
            got[2].mount_point,
            PathBuf::from("/odd\\9x\\"),
            "a backslash without three octal digits stays"
        );
        assert_eq!(unescape("\\101\\40"), b"A\\40".to_vec());
        assert_eq!(unescape("\\377"), vec![0xff]);
    }
}
