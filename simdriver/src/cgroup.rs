//! TEST-ONLY: cgroup v2 look-ups for the simulated r615 memory limits: which cgroup v2
//! directory a process is in (`/proc/self/cgroup`'s `0::` line joined to a cgroup2 mount from
//! `/proc/self/mountinfo`), a directory's identity (`st_dev`, `st_ino`, the same through every
//! mount point of one hierarchy), and the pids a cgroup holds (`cgroup.procs`).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `CGROUP2_SUPER_MAGIC` from `linux/magic.h`.
const CGROUP2_MAGIC: i64 = 0x6367_7270;

/// Identity of a directory: `(st_dev, st_ino)`.
pub type DirId = (u64, u64);

/// The path of the `0::` (cgroup v2) line of a `/proc/<pid>/cgroup` text.
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut k = 0;
    while k < b.len() {
        let oct = b
            .get(k + 1..k + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(o) if b[k] == b'\\' => {
                out.push(
                    o.iter()
                        .fold(0u8, |acc, c| acc.wrapping_mul(8) + (c - b'0')),
                );
                k += 4;
            }
            _ => {
                out.push(b[k]);
                k += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(root, mount point)` of every cgroup2 mount in a `/proc/<pid>/mountinfo` text.
pub fn cgroup2_mounts(mountinfo: &str) -> Vec<(String, String)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut f = pre.split_whitespace();
            let root = f.nth(3)?;
            let point = f.next()?;
            Some((unescape(root), unescape(point)))
        })
        .collect()
}

/// Where cgroup `path` (as `/proc/<pid>/cgroup` names it) lies under a mount of `root` at
/// `point`; `None` when the mount does not show it.
pub fn join(root: &str, point: &str, path: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        path.strip_prefix('/')?
    } else {
        let rest = path.strip_prefix(root)?;
        if !rest.is_empty() && !rest.starts_with('/') {
            return None;
        }
        rest.trim_start_matches('/')
    };
    Some(Path::new(point).join(rel))
}

/// The `(st_dev, st_ino)` of directory `dir`.
pub fn dir_id(dir: &Path) -> Option<DirId> {
    let m = fs::metadata(dir).ok()?;
    m.is_dir().then(|| (m.dev(), m.ino()))
}

/// Whether `dir` is a directory on a cgroup2 file system.
pub fn is_cgroup2(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: all-zero bytes are a valid `statfs` (plain integers).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is a valid, writable `statfs`.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == CGROUP2_MAGIC
}

/// The pids listed in `dir/cgroup.procs` (empty if unreadable).
pub fn procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The cgroup `path` and every ancestor up to the hierarchy root, innermost first, each as
/// reachable through one of `mounts` with its identity. Ancestors no mount shows are left out.
pub fn chain(path: &str, mounts: &[(String, String)]) -> Vec<(PathBuf, DirId)> {
    let mut out = Vec::new();
    let mut p = path.trim_end_matches('/').to_owned();
    loop {
        let at = if p.is_empty() { "/" } else { p.as_str() };
        let found = mounts.iter().find_map(|(root, point)| {
            let dir = join(root, point, at)?;
            Some((dir.clone(), dir_id(&dir)?))
        });
        out.extend(found);
        match p.rfind('/') {
            Some(k) if !p.is_empty() => p.truncate(k),
            _ => break,
        }
    }
    out
}

/// This process's cgroup v2 directory and its ancestors ([`chain`]), innermost first.
///
/// `/proc/self/cgroup` is read on every call (a process may be moved to another cgroup);
/// mountinfo is parsed again only when that path changed or in a forked child.
pub fn own_chain() -> Vec<(PathBuf, DirId)> {
    type Cached = (u32, String, Vec<(PathBuf, DirId)>);
    static CACHE: Mutex<Option<Cached>> = Mutex::new(None);
    let Ok(text) = fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    let Some(path) = unified_path(&text) else {
        return Vec::new();
    };
    let pid = std::process::id();
    let mut g = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, cached_path, chain)) = g.as_ref() {
        if *p == pid && cached_path == path {
            return chain.clone();
        }
    }
    let mounts = cgroup2_mounts(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let c = chain(path, &mounts);
    *g = Some((pid, path.to_owned(), c.clone()));
    c
}

/// Pids in cgroup `dir` and all cgroups below it.
pub fn procs_below(dir: &Path) -> Vec<u32> {
    let mut out = procs(dir);
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(procs_below(&e.path()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unified_line() {
        let cases: &[(&str, Option<&str>)] = &[
            ("0::/\n", Some("/")),
            ("4:memory:/x\n0::/a/b\n", Some("/a/b")),
            ("4:memory:/x\n", None),
            ("0::garbage\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(unified_path(text), *want, "{text:?}");
        }
    }

    #[test]
    fn mountinfo_parse() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 23 0:38 /kube /tmp/my\\040mnt rw shared:5 - cgroup2 none rw
";
        assert_eq!(
            cgroup2_mounts(text),
            vec![
                ("/".to_owned(), "/sys/fs/cgroup/unified".to_owned()),
                ("/kube".to_owned(), "/tmp/my mnt".to_owned()),
            ]
        );
    }

    #[test]
    fn join_paths() {
        let cases: &[(&str, &str, &str, Option<&str>)] = &[
            ("/", "/sys/fs/cgroup", "/a/b", Some("/sys/fs/cgroup/a/b")),
            ("/", "/sys/fs/cgroup", "/", Some("/sys/fs/cgroup/")),
            ("/kube", "/m", "/kube/pod", Some("/m/pod")),
            ("/kube", "/m", "/kube", Some("/m/")),
            ("/kube", "/m", "/kubelet/x", None),
            ("/kube", "/m", "/other", None),
        ];
        for (root, point, path, want) in cases {
            assert_eq!(
                join(root, point, path),
                want.map(PathBuf::from),
                "{root} {point} {path}"
            );
        }
    }

    #[test]
    fn chain_walks_up_to_the_root() {
        let tmp = std::env::temp_dir().join(format!("gpushare-sim-chain-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("a/b")).unwrap();
        let mounts = vec![("/".to_owned(), tmp.display().to_string())];
        let got: Vec<PathBuf> = chain("/a/b", &mounts).into_iter().map(|c| c.0).collect();
        let _ = std::fs::remove_dir_all(&tmp);
        assert_eq!(got, vec![tmp.join("a/b"), tmp.join("a"), tmp.join("")]);
    }
}
