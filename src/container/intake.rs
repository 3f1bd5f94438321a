//! Reading untrusted input, capped: the OCI state on stdin, the bundle's `config.json`, and
//! the facts about the host the decision needs (the container's cgroup). The bytes go to
//! [`crate::decide::input`] to be parsed; nothing there reads a file.

use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::decide::enforce::CgroupFact;
use crate::decide::input;
use crate::decide::oci_state::State;
use crate::vocab::read_capped;

/// Largest OCI state accepted on stdin.
pub const MAX_STATE_BYTES: u64 = 1 << 20;
/// Largest `config.json` accepted.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Largest `/proc` file read for the container's cgroup.
const MAX_PROC_BYTES: u64 = 1 << 20;

/// Input that cannot be read.
#[derive(Debug, Error)]
pub enum IntakeError {
    #[error("cannot read the OCI state from stdin")]
    ReadState(#[source] std::io::Error),
    #[error(
        "the OCI state on stdin is larger than 1 MiB; the runtime must pass the container state"
    )]
    StateTooLarge,
    #[error("cannot read {path}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is larger than 16 MiB")]
    ConfigTooLarge { path: PathBuf },
    #[error(transparent)]
    Input(#[from] input::InputError),
}

/// Reads the OCI state a runtime passes to a hook, capped, and validates it
/// ([`input::parse_state`]).
///
/// # Errors
/// [`IntakeError`] for an unreadable, oversized or malformed state, or an unsafe container id.
pub fn read_state(r: impl Read) -> Result<State, IntakeError> {
    let buf = read_capped(r, MAX_STATE_BYTES)
        .map_err(IntakeError::ReadState)?
        .ok_or(IntakeError::StateTooLarge)?;
    Ok(input::parse_state(&buf)?)
}

/// Reads a `config.json` from `r`, capped; `path` names it in errors.
///
/// # Errors
/// [`IntakeError`] when it cannot be read or is too large.
pub fn read_config(r: impl Read, path: &Path) -> Result<Vec<u8>, IntakeError> {
    read_capped(r, MAX_CONFIG_BYTES)
        .map_err(|source| IntakeError::ReadConfig {
            path: path.to_owned(),
            source,
        })?
        .ok_or_else(|| IntakeError::ConfigTooLarge {
            path: path.to_owned(),
        })
}

/// Reads the raw bytes of `<bundle>/config.json`, capped.
///
/// # Errors
/// [`IntakeError`] when it cannot be read or is too large.
pub fn read_config_bytes(bundle: &Path) -> Result<Vec<u8>, IntakeError> {
    let path = bundle.join("config.json");
    let f = std::fs::File::open(&path).map_err(|source| IntakeError::ReadConfig {
        path: path.clone(),
        source,
    })?;
    read_config(f, &path)
}

/// The cgroup of the container whose init process is `pid` (at createRuntime still the
/// runtime's, not a line of the image run yet), as the driver's limits would need it: its own
/// cgroup v2 directory on the host, or why it has none. `cgroups_path`: the spec's
/// `linux.cgroupsPath`, which the cgroup must agree with.
pub fn cgroup_of(pid: Option<i32>, cgroups_path: Option<&str>, id: &str) -> CgroupFact {
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return CgroupFact::NotOwn("the runtime gave no container pid".into());
    };
    let read = |p: &str| {
        std::fs::File::open(p)
            .and_then(|f| read_capped(f, MAX_PROC_BYTES))
            .ok()
            .flatten()
    };
    let Some(proc_cgroup) = read(&format!("/proc/{pid}/cgroup")) else {
        return CgroupFact::NotOwn(format!("cannot read the cgroup of pid {pid}"));
    };
    let mountinfo =
        || read("/proc/self/mountinfo").map(|b| String::from_utf8_lossy(&b).into_owned());
    match crate::host::cgroup::driver_dir(
        &String::from_utf8_lossy(&proc_cgroup),
        |dir| holds(dir, pid),
        mountinfo,
        cgroups_path,
        id,
    ) {
        Ok(dir) => CgroupFact::Own(dir.display().to_string()),
        Err(why) => CgroupFact::NotOwn(why.to_string()),
    }
}

/// Whether `dir` is a cgroup v2 directory whose `cgroup.procs` lists process `pid` (its
/// `statfs` says cgroup2; the list is read capped, and a longer one is not taken).
fn holds(dir: &Path, pid: i32) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
    const MAX_PROCS_BYTES: u64 = 64 << 10;
    if !statfs(dir).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC) {
        return false;
    }
    std::fs::File::open(dir.join("cgroup.procs"))
        .and_then(|f| read_capped(f, MAX_PROCS_BYTES))
        .ok()
        .flatten()
        .is_some_and(|b| crate::host::cgroup::procs_list(&String::from_utf8_lossy(&b), pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_read_capped_then_parsed() {
        // Positive control: a state within the cap is read and parsed.
        let good =
            br#"{"ociVersion":"1.0.2","id":"abc-1","status":"creating","pid":42,"bundle":"/b"}"#;
        assert_eq!(read_state(&good[..]).unwrap().id(), "abc-1");
        let huge = format!("{{\"id\":\"a\",\"x\":\"{}\"}}", "x".repeat(2 << 20));
        let e = crate::vocab::chain(&read_state(huge.as_bytes()).unwrap_err());
        assert!(e.contains("larger than 1 MiB"), "{e}");
        let e = crate::vocab::chain(&read_state(&b"{nope"[..]).unwrap_err());
        assert!(e.contains("not valid JSON"), "{e}");
    }

    #[test]
    fn config_is_read_capped() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_config_bytes(dir.path()),
            Err(IntakeError::ReadConfig { .. })
        ));
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        assert_eq!(read_config_bytes(dir.path()).unwrap(), b"{}");
        let big = vec![b' '; MAX_CONFIG_BYTES as usize + 1];
        assert!(matches!(
            read_config(&big[..], Path::new("c")),
            Err(IntakeError::ConfigTooLarge { .. })
        ));
        let exact = vec![b' '; MAX_CONFIG_BYTES as usize];
        assert_eq!(
            read_config(&exact[..], Path::new("c")).unwrap().len(),
            exact.len()
        );
    }

    #[test]
    fn a_container_without_a_pid_or_a_readable_cgroup_has_none_of_its_own() {
        for pid in [None, Some(0), Some(-1)] {
            assert_eq!(
                cgroup_of(pid, None, "abc"),
                CgroupFact::NotOwn("the runtime gave no container pid".into()),
                "{pid:?}"
            );
        }
        // This test's own process: its cgroup is read (the reason is the cgroup's, not a
        // failed read), and it is never the one a container "abc" asks for.
        let me = i32::try_from(std::process::id()).unwrap();
        match cgroup_of(Some(me), Some("/docker/abc"), "abc") {
            CgroupFact::NotOwn(why) => assert!(!why.contains("cannot read"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A pid that does not exist: its cgroup cannot be read.
        match cgroup_of(Some(i32::MAX), None, "abc") {
            CgroupFact::NotOwn(why) => assert!(why.contains("cannot read"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// A container's cgroup under the unified hierarchy's usual mount is found by the process it
    /// holds; a `cgroup.procs` planted outside cgroupfs, listing the same process, is not taken.
    #[test]
    fn a_cgroup_is_taken_only_where_cgroupfs_lists_the_process() {
        let Some(own) = crate::host::tests::OwnCgroup::new("the cgroup.procs proof test", "holds")
        else {
            return;
        };
        let cg = own.dir.clone();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let moved = std::fs::write(cg.join("cgroup.procs"), pid.to_string());
        // Looked at while the child lives; asserted once it is gone (the cgroup guard kills
        // what is left in it if this panics first).
        let in_own = holds(&cg, pid);
        let me = i32::try_from(std::process::id()).unwrap();
        let me_in = holds(&cg, me);
        // A look-alike: the same list in a directory that is not cgroupfs.
        let fake = tempfile::tempdir().unwrap();
        std::fs::write(fake.path().join("cgroup.procs"), format!("{pid}\n")).unwrap();
        let planted_lists = crate::host::cgroup::procs_list(
            &std::fs::read_to_string(fake.path().join("cgroup.procs")).unwrap(),
            pid,
        );
        let planted_taken = holds(fake.path(), pid);
        // The whole look: the container's own cgroup, a directory that holds it.
        let fact = cgroup_of(Some(pid), Some(&own.unified), "abc");
        let fact_holds = matches!(&fact, CgroupFact::Own(dir) if holds(Path::new(dir), pid));
        let _ = child.kill();
        let _ = child.wait();
        moved.unwrap();
        assert!(in_own, "positive control: its cgroup holds it");
        assert!(!me_in, "this test's process is not in it");
        assert!(planted_lists);
        assert!(!planted_taken, "a planted cgroup.procs was taken");
        match fact {
            CgroupFact::Own(dir) => {
                assert!(fact_holds, "{dir}");
                assert!(dir.ends_with(&own.unified), "{dir}");
            }
            other => panic!("{other:?}"),
        }
    }
}
