//! Who has a host directory mounted: the processes (one per mount namespace) whose mount table
//! binds it. Used to rebuild a record from what really runs.

use std::collections::BTreeMap;
use std::path::Path;

/// One line of a mountinfo file: (major:minor, root within the filesystem, mount point).
fn entries(mountinfo: &str) -> impl Iterator<Item = (&str, String, String)> {
    mountinfo.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        Some((*f.get(2)?, unescape(f.get(3)?), unescape(f.get(4)?)))
    })
}

/// Undoes mountinfo's octal escapes of space, tab, newline and backslash.
pub fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Where `path` lives as seen in `mountinfo` (the caller's own): the device and the path
/// within that filesystem, from the mount with the longest mount point that contains it.
pub fn locate(mountinfo: &str, path: &Path) -> Option<(String, String)> {
    let path = path.to_str()?;
    entries(mountinfo)
        .filter(|(_, _, mp)| path == mp || mp == "/" || path.starts_with(&format!("{mp}/")))
        .max_by_key(|(_, _, mp)| mp.len())
        .map(|(dev, root, mp)| {
            let rest = if mp == "/" { path } else { &path[mp.len()..] };
            let inner = format!("{}{}", root.trim_end_matches('/'), rest);
            let inner = if inner.is_empty() {
                "/".to_owned()
            } else {
                inner
            };
            (dev.to_owned(), inner)
        })
}

/// Whether a mount table binds the filesystem path (`dev`, `inner`) somewhere.
pub fn binds(mountinfo: &str, dev: &str, inner: &str) -> bool {
    entries(mountinfo).any(|(d, root, _)| d == dev && root == inner)
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
        if binds(&mi, &dev, &inner) {
            by_ns.insert(ns, pid);
        }
    }
    by_ns.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
                got.as_ref().map(|(d, i)| (d.as_str(), i.as_str())),
                *want,
                "{what}"
            );
        }
        let container = "\
100 99 0:50 / / rw - overlay overlay rw
101 100 0:25 /gpushare/mps/abc/pipe /tmp/nvidia-mps rw - tmpfs tmpfs rw
";
        assert!(binds(container, "0:25", "/gpushare/mps/abc/pipe"));
        assert!(!binds(container, "0:25", "/gpushare/mps/other/pipe"));
        assert!(!binds(container, "0:99", "/gpushare/mps/abc/pipe"));
    }
}
