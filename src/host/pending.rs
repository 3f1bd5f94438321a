//! Per-container directories whose container id is not known yet (`pending-*`, made by
//! podman's precreate): their names, and the sweep of abandoned ones.

use std::path::PathBuf;

use crate::host::state::StateDir;

/// Prefix of the per-container directories a spec edit makes before the id is known.
pub const PENDING_PREFIX: &str = "pending-";

/// How long a precreate-made directory may wait for its createRuntime hook before it counts as
/// left behind by a create that failed: as long as the MPS reservation a spec edit makes
/// ([`crate::host::state::RESERVATION_SECONDS`]). podman runs precreate when it starts the
/// container, right before the runtime's `create`, so a live container's hook has long run.
pub const PENDING_MAX_AGE: std::time::Duration =
    std::time::Duration::from_secs(crate::host::state::RESERVATION_SECONDS);

/// Removes `pending-*` per-container directories older than `max_age` (their create never
/// reached createRuntime, which renames them to the container id). Best effort.
pub fn sweep_pending(sd: &StateDir, max_age: std::time::Duration) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(sd.root().join("containers")) else {
        return removed;
    };
    for e in rd.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > max_age);
        if old
            && e.file_name().to_string_lossy().starts_with(PENDING_PREFIX)
            && crate::host::mounts::remove_container_dir(&e.path()).is_ok()
        {
            removed.push(e.path());
        }
    }
    removed
}

/// A fresh unguessable name for a per-container directory whose container id is not known yet.
pub fn pending_key() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    if !ok {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b[..16].copy_from_slice(&(t ^ u128::from(std::process::id())).to_le_bytes());
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{PENDING_PREFIX}{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_keys_are_random_not_the_clock() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let (a, b) = (pending_key(), pending_key());
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        assert_ne!(a, b);
        for k in [a, b] {
            let hex = k.strip_prefix(PENDING_PREFIX).expect("the prefix");
            assert_eq!(hex.len(), 32, "{k}");
            let mut bytes = [0u8; 16];
            for (i, byte) in bytes.iter_mut().enumerate() {
                *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
            }
            // What the fallback without /dev/urandom would make of this moment.
            let clock = u128::from_le_bytes(bytes) ^ u128::from(std::process::id());
            assert!(!(before..=after).contains(&clock), "{k} is the clock");
        }
    }

    #[test]
    fn old_pending_dirs_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::new(t.path());
        let c = t.path().join("containers");
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for d in ["pending-old", "c1", "pending-new"] {
            std::fs::create_dir_all(c.join(d)).unwrap();
        }
        for d in ["pending-old", "c1"] {
            std::fs::File::open(c.join(d))
                .unwrap()
                .set_modified(two_hours_ago)
                .unwrap();
        }
        let removed = sweep_pending(&sd, PENDING_MAX_AGE);
        assert_eq!(removed, vec![c.join("pending-old")]);
        assert!(c.join("c1").is_dir() && c.join("pending-new").is_dir());
    }

    #[test]
    fn pending_keys_are_safe_and_distinct() {
        let (a, b) = (pending_key(), pending_key());
        assert!(crate::vocab::is_safe_name(&a) && a.starts_with(PENDING_PREFIX));
        assert_ne!(a, b);
    }
}
