//! Which cgroup is a container's own: pure (the texts of `/proc/<pid>/cgroup` and
//! `/proc/self/mountinfo`, and whether a directory holds the container's process, in; a path or
//! a reason out). `container::intake` reads them, and `decide::enforce` chooses the backend of
//! a memory cap from what they say.
//!
//! The driver's limits (`nvmlDeviceSetMemoryLimits_v1`) name a cgroup v2 directory by its full
//! path. The container's init process, at createRuntime, has not run a line of the image yet,
//! so its `/proc/<pid>/cgroup` is where the runtime put it; `linux.cgroupsPath` (cgroupfs or
//! systemd form) must agree with it, so that a limit never lands on a cgroup the container
//! shares with others (the engine's slice, a user session, the root).

use std::path::{Path, PathBuf};

/// Where a container's processes are, as the kernel lists them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcCgroups {
    /// The unified (v2) hierarchy's path (`0::<path>`).
    pub unified: Option<String>,
    /// The v1 `memory` controller's path.
    pub memory_v1: Option<String>,
}

/// Parses `/proc/<pid>/cgroup`.
pub fn parse_proc_cgroup(text: &str) -> ProcCgroups {
    let mut out = ProcCgroups::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.unified = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            out.memory_v1 = Some(path.to_owned());
        }
    }
    out
}

/// The cgroup path `linux.cgroupsPath` asks for: systemd's `slice:prefix:name` form (runc's
/// `--systemd-cgroup`, podman, CRI engines with `SystemdCgroup`) expanded as systemd names
/// units, else the cgroupfs path itself (made absolute).
pub fn expected_path(cgroups_path: &str) -> Option<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    match parts.as_slice() {
        [slice, prefix, name] => {
            let unit = if name.ends_with(".slice") || name.ends_with(".scope") {
                (*name).to_owned()
            } else if prefix.is_empty() {
                format!("{name}.scope")
            } else {
                format!("{prefix}-{name}.scope")
            };
            let slice = if slice.is_empty() {
                "system.slice"
            } else {
                slice
            };
            Some(format!("{}/{unit}", expand_slice(slice)?))
        }
        [path] if !path.is_empty() => Some(if path.starts_with('/') {
            (*path).to_owned()
        } else {
            format!("/{path}")
        }),
        _ => None,
    }
}

/// `a-b.slice` → `/a.slice/a-b.slice` (systemd.slice(5)); `-.slice` is the root.
fn expand_slice(slice: &str) -> Option<String> {
    let stem = slice.strip_suffix(".slice")?;
    if stem == "-" {
        return Some(String::new());
    }
    if stem.is_empty() || stem.starts_with('-') || stem.ends_with('-') || stem.contains("--") {
        return None;
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Some(path)
}

/// Whether `path` (the kernel's) is the container's own cgroup: not the root; the one
/// `cgroups_path` asks for (or a child of it: crun puts the payload in `<scope>/container`);
/// without a `cgroups_path`, one whose last component names the container id (runc's default
/// cgroupfs path is `/<id>`).
pub fn is_own(path: &str, cgroups_path: Option<&str>, id: &str) -> bool {
    if path == "/" || path.is_empty() || path.contains("/../") || path.ends_with("/..") {
        return false;
    }
    match cgroups_path.and_then(expected_path) {
        Some(want) => {
            let want = want.trim_end_matches('/');
            !want.is_empty()
                && (path == want
                    || path.ends_with(&format!("/{}", want.trim_start_matches('/')))
                    || path.starts_with(&format!("{want}/")))
        }
        None => path
            .rsplit('/')
            .next()
            .is_some_and(|leaf| !id.is_empty() && leaf.contains(id)),
    }
}

/// The full path of cgroup v2 `path` under a mount of the unified hierarchy, from the host's
/// `/proc/self/mountinfo` (the first `cgroup2` mount whose root contains it).
pub fn unified_dir(mountinfo: &str, path: &str) -> Option<PathBuf> {
    crate::host::mounts::entries(mountinfo)
        .filter(|e| e.fstype == "cgroup2")
        .find_map(|e| {
            let rel = Path::new(path).strip_prefix(&e.root).ok()?;
            Some(e.mount_point.join(rel))
        })
}

/// Why the driver's limits cannot take a container's cgroup (then the limiter enforces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoDriverCgroup {
    /// The container is in no cgroup v2 of its own.
    NotOwn(String),
    /// The container's memory is accounted in a cgroup v1 hierarchy only.
    V1Only(String),
    /// No `cgroup2` mount on the host shows the container's cgroup.
    NotMounted(String),
    /// The host's mount table could not be read to find the container's cgroup.
    NoMountTable(String),
}

impl std::fmt::Display for NoDriverCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoDriverCgroup::NotOwn(p) => write!(
                f,
                "the container has no cgroup v2 of its own (its unified cgroup is {p:?})"
            ),
            NoDriverCgroup::V1Only(p) => write!(
                f,
                "the node accounts memory in cgroup v1 ({p:?}); the driver's limits need cgroup v2"
            ),
            NoDriverCgroup::NotMounted(p) => {
                write!(f, "no cgroup2 mount shows the container's cgroup {p:?}")
            }
            NoDriverCgroup::NoMountTable(p) => write!(
                f,
                "cannot read /proc/self/mountinfo to find the container's cgroup {p:?}"
            ),
        }
    }
}

/// Where the unified hierarchy's root is mounted on most hosts: `/sys/fs/cgroup` on a cgroup v2
/// node, `/sys/fs/cgroup/unified` on a hybrid one.
pub const USUAL_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// Cgroup `path` (the kernel's, absolute) below mount point `root`; `None` for a path that is
/// not absolute or names `..`.
fn below(root: &str, path: &str) -> Option<PathBuf> {
    let rel = path.strip_prefix('/')?;
    let rel = Path::new(rel);
    if rel
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    Some(Path::new(root).join(rel))
}

/// Whether a `cgroup.procs` text lists process `pid`.
pub fn procs_list(procs: &str, pid: i32) -> bool {
    let pid = pid.to_string();
    procs.lines().any(|l| l.trim() == pid)
}

/// The directory the driver's limits are set on for a container, or why there is none.
/// `holds` says whether a directory is a cgroup v2 directory whose `cgroup.procs` lists the
/// container's process: the container's cgroup under one of the [`USUAL_ROOTS`] is taken when
/// it does (a process is in one cgroup v2 only, so that proves it, whatever the mount), without
/// reading the mount table. Else `mountinfo` gives the host's mount table (`None`: unreadable);
/// both are asked only for a container with a cgroup of its own (the mount table costs more
/// than the rest together, and grows with the node's mounts).
///
/// # Errors
/// [`NoDriverCgroup`]: the limiter enforces the cap instead.
pub fn driver_dir(
    proc_cgroup: &str,
    mut holds: impl FnMut(&Path) -> bool,
    mountinfo: impl FnOnce() -> Option<String>,
    cgroups_path: Option<&str>,
    id: &str,
) -> Result<PathBuf, NoDriverCgroup> {
    let p = parse_proc_cgroup(proc_cgroup);
    let unified = p.unified.unwrap_or_default();
    if !is_own(&unified, cgroups_path, id) {
        // A hybrid node that keeps memory in v1 and the unified hierarchy empty says so.
        return Err(match p.memory_v1 {
            Some(v1) => NoDriverCgroup::V1Only(v1),
            None => NoDriverCgroup::NotOwn(unified),
        });
    }
    if let Some(dir) = USUAL_ROOTS
        .iter()
        .filter_map(|root| below(root, &unified))
        .find(|dir| holds(dir))
    {
        return Ok(dir);
    }
    let Some(mountinfo) = mountinfo() else {
        return Err(NoDriverCgroup::NoMountTable(unified));
    };
    unified_dir(&mountinfo, &unified).ok_or(NoDriverCgroup::NotMounted(unified))
}

/// The first of `others` (container id, the cgroup its driver limit is set on) whose cgroup is
/// `cgroup`, or one above or below it: the driver's limit on one would replace, or bound, the
/// other's. A container whose `linux.cgroupsPath` names another container's cgroup is put into
/// it by the runtime, so that its cgroup passes as its own.
pub fn claimed_by<'a>(
    cgroup: &str,
    others: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<&'a str> {
    let nested = |a: &str, b: &str| {
        let (a, b) = (a.trim_end_matches('/'), b.trim_end_matches('/'));
        a == b || b.starts_with(&format!("{a}/")) || a.starts_with(&format!("{b}/"))
    };
    others
        .into_iter()
        .find(|(_, theirs)| nested(cgroup, theirs))
        .map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_of_another_client_is_claimed() {
        let others = [
            ("victim", "/sys/fs/cgroup/system.slice/victim.scope"),
            ("b", "/sys/fs/cgroup/b"),
        ];
        let rows = [
            ("/sys/fs/cgroup/system.slice/victim.scope", Some("victim")),
            ("/sys/fs/cgroup/system.slice/victim.scope/", Some("victim")),
            (
                "/sys/fs/cgroup/system.slice/victim.scope/sub",
                Some("victim"),
            ),
            ("/sys/fs/cgroup/system.slice", Some("victim")),
            ("/sys/fs/cgroup/system.slice/victim.scope2", None),
            ("/sys/fs/cgroup/bb", None),
            ("/sys/fs/cgroup/own", None),
        ];
        for (cg, want) in rows {
            assert_eq!(claimed_by(cg, others), want, "{cg}");
        }
    }

    #[test]
    fn proc_cgroup_of_v2_hybrid_and_v1() {
        let v2 = parse_proc_cgroup("0::/system.slice/docker-abc.scope\n");
        assert_eq!(
            v2.unified.as_deref(),
            Some("/system.slice/docker-abc.scope")
        );
        assert_eq!(v2.memory_v1, None);
        let hybrid = parse_proc_cgroup(
            "9:name=systemd:/\n4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n",
        );
        assert_eq!(hybrid.memory_v1.as_deref(), Some("/docker/abc"));
        assert_eq!(hybrid.unified.as_deref(), Some("/"));
        assert_eq!(parse_proc_cgroup("garbage\n"), ProcCgroups::default());
        // Only hierarchy 0 with no controllers is the unified one.
        assert_eq!(parse_proc_cgroup("3::/x\n").unified, None);
        assert_eq!(parse_proc_cgroup("0:cpu:/x\n").unified, None);
    }

    #[test]
    fn why_the_driver_cannot_take_a_cgroup_is_said_for_each_case() {
        for (e, want) in [
            (
                NoDriverCgroup::NotOwn("/".into()),
                "no cgroup v2 of its own (its unified cgroup is \"/\")",
            ),
            (
                NoDriverCgroup::V1Only("/docker/abc".into()),
                "accounts memory in cgroup v1 (\"/docker/abc\"); the driver's limits need cgroup v2",
            ),
            (
                NoDriverCgroup::NotMounted("/x".into()),
                "no cgroup2 mount shows the container's cgroup \"/x\"",
            ),
        ] {
            let text = e.to_string();
            assert!(text.contains(want), "{text}");
        }
    }

    #[test]
    fn cgroups_path_forms() {
        let rows = [
            // runc/containerd with SystemdCgroup, Docker's systemd driver.
            ("system.slice:docker:abc", Some("/system.slice/docker-abc.scope")),
            // kubelet's pod slices.
            (
                "kubepods-besteffort-pod12.slice:cri-containerd:abc",
                Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/cri-containerd-abc.scope"),
            ),
            // podman.
            ("machine.slice:libpod:abc", Some("/machine.slice/libpod-abc.scope")),
            (":runc:abc", Some("/system.slice/runc-abc.scope")),
            // A name that is already a unit (crun, systemd's own scopes and slices).
            ("machine.slice::abc.scope", Some("/machine.slice/abc.scope")),
            ("machine.slice:x:inner.slice", Some("/machine.slice/inner.slice")),
            ("-.slice:x:abc", Some("/x-abc.scope")),
            // cgroupfs.
            ("/docker/abc", Some("/docker/abc")),
            ("kubepods/besteffort/pod12/abc", Some("/kubepods/besteffort/pod12/abc")),
            // Malformed.
            ("bad--name.slice:x:abc", None),
            ("-bad.slice:x:abc", None),
            (".slice:x:abc", None),
            ("bad-.slice:x:abc", None),
            ("noslice:x:abc", None),
            ("a:b", None),
            ("", None),
        ];
        for (raw, want) in rows {
            assert_eq!(expected_path(raw).as_deref(), want, "{raw}");
        }
    }

    #[test]
    fn own_cgroup_table() {
        let rows = [
            (
                "/system.slice/docker-abc.scope",
                Some("system.slice:docker:abc"),
                "abc",
                true,
            ),
            // crun's payload sub-cgroup.
            (
                "/machine.slice/libpod-abc.scope/container",
                Some("machine.slice:libpod:abc"),
                "abc",
                true,
            ),
            // The engine's slice, not the container's scope.
            (
                "/system.slice",
                Some("system.slice:docker:abc"),
                "abc",
                false,
            ),
            // A nested cgroup namespace shows the path below its root.
            ("/outer/docker/abc", Some("/docker/abc"), "abc", true),
            ("/docker/abcd", Some("/docker/abc"), "abc", false),
            // runc's default cgroupfs path is /<id>.
            ("/abc", None, "abc", true),
            ("/user.slice/session-1.scope", None, "abc", false),
            ("/", Some("/"), "abc", false),
            ("/", None, "abc", false),
            ("/docker/../abc", None, "abc", false),
        ];
        for (path, cp, id, want) in rows {
            assert_eq!(is_own(path, cp, id), want, "{path} {cp:?}");
        }
    }

    #[test]
    fn driver_dir_from_mountinfo() {
        // No usual root proves it: the mount table says where the cgroup is.
        let no = |_: &Path| false;
        let mi = || {
            Some("30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n".to_owned())
        };
        assert_eq!(
            driver_dir(
                "0::/system.slice/docker-abc.scope\n",
                no,
                mi,
                Some("system.slice:docker:abc"),
                "abc"
            ),
            Ok(PathBuf::from(
                "/sys/fs/cgroup/system.slice/docker-abc.scope"
            ))
        );
        // Hybrid, memory in v1 and the container in the unified root: nothing of its own.
        assert!(matches!(
            driver_dir(
                "4:memory:/docker/abc\n0::/\n",
                no,
                mi,
                Some("/docker/abc"),
                "abc"
            ),
            Err(NoDriverCgroup::V1Only(_))
        ));
        // Hybrid with a unified scope of its own: the driver is asked (it may answer no).
        assert!(driver_dir(
            "4:memory:/docker/abc\n0::/docker/abc\n",
            no,
            mi,
            Some("/docker/abc"),
            "abc"
        )
        .is_ok());
        // The root cgroup is never the container's.
        assert!(matches!(
            driver_dir("0::/\n", no, mi, None, "abc"),
            Err(NoDriverCgroup::NotOwn(_))
        ));
        // No cgroup2 mount.
        let v1only = || Some("30 1 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n".to_owned());
        assert!(matches!(
            driver_dir("0::/abc\n", no, v1only, None, "abc"),
            Err(NoDriverCgroup::NotMounted(_))
        ));
        // A mount of a sub-tree (a cgroup namespace's view): the path below its root.
        let sub = || Some("31 1 0:26 /kubepods /mnt/cg rw - cgroup2 cgroup2 rw\n".to_owned());
        assert_eq!(
            driver_dir(
                "0::/kubepods/pod1/abc\n",
                no,
                sub,
                Some("/kubepods/pod1/abc"),
                "abc"
            ),
            Ok(PathBuf::from("/mnt/cg/pod1/abc"))
        );
        // An unreadable mount table is said as such.
        assert_eq!(
            driver_dir("0::/abc\n", no, || None, None, "abc"),
            Err(NoDriverCgroup::NoMountTable("/abc".into()))
        );
    }

    /// The usual roots and the mount table are looked at only for a container with a cgroup of
    /// its own.
    #[test]
    fn the_mount_table_is_read_only_for_a_cgroup_of_its_own() {
        let (reads, looks) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let mi = || {
            reads.set(reads.get() + 1);
            Some("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n".to_owned())
        };
        let no = |_: &Path| {
            looks.set(looks.get() + 1);
            false
        };
        for not_own in ["0::/\n", "4:memory:/docker/abc\n0::/\n", "0::/other\n"] {
            assert!(driver_dir(not_own, no, mi, Some("/docker/abc"), "abc").is_err());
        }
        assert_eq!(
            (reads.get(), looks.get()),
            (0, 0),
            "looked for a container without a cgroup of its own"
        );
        // Positive control: the container's own cgroup asks both usual roots, then reads the
        // mount table, once.
        assert!(driver_dir("0::/docker/abc\n", no, mi, Some("/docker/abc"), "abc").is_ok());
        assert_eq!((reads.get(), looks.get()), (1, 2));
    }

    /// A usual root whose directory holds the container's process is taken without the mount
    /// table; one that does not is passed over.
    #[test]
    fn a_usual_root_that_holds_the_process_spares_the_mount_table() {
        let reads = std::cell::Cell::new(0);
        let mi = || {
            reads.set(reads.get() + 1);
            Some("30 1 0:26 / /mnt/elsewhere rw - cgroup2 cgroup2 rw\n".to_owned())
        };
        let asked = std::cell::RefCell::new(Vec::new());
        let hybrid = |dir: &Path| {
            asked.borrow_mut().push(dir.to_path_buf());
            dir.starts_with("/sys/fs/cgroup/unified")
        };
        assert_eq!(
            driver_dir("0::/docker/abc\n", hybrid, mi, Some("/docker/abc"), "abc"),
            Ok(PathBuf::from("/sys/fs/cgroup/unified/docker/abc"))
        );
        assert_eq!(
            *asked.borrow(),
            [
                PathBuf::from("/sys/fs/cgroup/docker/abc"),
                PathBuf::from("/sys/fs/cgroup/unified/docker/abc")
            ]
        );
        assert_eq!(reads.get(), 0, "the mount table was read");
        // A cgroup v2 node: the first root holds it.
        assert_eq!(
            driver_dir(
                "0::/docker/abc\n",
                |_: &Path| true,
                mi,
                Some("/docker/abc"),
                "abc"
            ),
            Ok(PathBuf::from("/sys/fs/cgroup/docker/abc"))
        );
        // Neither holds it: the mount table's answer, read once (the positive control).
        assert_eq!(
            driver_dir(
                "0::/docker/abc\n",
                |_: &Path| false,
                mi,
                Some("/docker/abc"),
                "abc"
            ),
            Ok(PathBuf::from("/mnt/elsewhere/docker/abc"))
        );
        assert_eq!(reads.get(), 1);
    }

    #[test]
    fn a_cgroup_path_below_a_root_names_no_parent_and_procs_lists_whole_lines() {
        assert_eq!(
            below("/sys/fs/cgroup", "/a/b.scope"),
            Some(PathBuf::from("/sys/fs/cgroup/a/b.scope"))
        );
        assert_eq!(below("/sys/fs/cgroup", "/a/../b"), None);
        assert_eq!(below("/sys/fs/cgroup", "a/b"), None);
        assert!(procs_list("12\n345\n", 345));
        assert!(!procs_list("12\n3456\n", 345));
        assert!(!procs_list("", 345));
    }
}
