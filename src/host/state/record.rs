//! The per-GPU record: which containers use the GPU, its MPS isolation domains and their
//! daemons, what to put back when it is free. The model only; [`super::StateDir`] reads and
//! writes it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::clients::{Client, Clients};
use crate::host::procinfo::ProcId;
use crate::vocab::{ComputeMode, Limits, Mode};

/// Version of the record layout (see [`super::layout`]).
pub const RECORD_VERSION: u32 = 3;

/// An MPS control daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Daemon {
    pub process: ProcId,
}

/// One MPS isolation domain on a GPU: its daemon, the limits that daemon enforces, and the
/// spec edits that reserved its directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Domain {
    pub daemon: Option<Daemon>,
    /// The daemon's defaults as gpushare set them: the domain's enforced limits.
    pub limits: Limits,
    /// The uid its clients run as (one per daemon when the driver has no multi-user server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Spec edits that made the domain's directories a mount source for a container whose
    /// hook has not run yet, by key, with the time (seconds since the epoch). While one is
    /// fresh the directories stay even when the daemon stops, so that container's mounts keep
    /// working.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, u64>,
}

impl Domain {
    pub fn new(limits: Limits) -> Self {
        Self {
            daemon: None,
            limits,
            uid: None,
            reserved: BTreeMap::new(),
        }
    }
}

/// Everything recorded about one GPU (stored as [`super::layout`] says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub version: u32,
    pub uuid: String,
    pub index: u32,
    /// The compute mode to put back once no daemon of gpushare's runs on the GPU. Written
    /// (and saved) before gpushare changes the mode, so a hook killed in between leaves a
    /// record that says what to restore.
    pub restore_compute_mode: Option<ComputeMode>,
    /// MPS isolation domains by key.
    pub domains: BTreeMap<String, Domain>,
    /// Clients by container id; a domain's reference count is the number of its clients.
    pub clients: Clients,
}

/// How long a spec edit's reservation of a GPU's MPS directories lasts.
pub const RESERVATION_SECONDS: u64 = 120;

fn fresh(at: u64, now: u64) -> bool {
    now.saturating_sub(at) < RESERVATION_SECONDS && at <= now + 60
}

/// Seconds since the epoch.
pub fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Record {
    pub fn new(uuid: &str, index: u32) -> Self {
        Self {
            version: RECORD_VERSION,
            uuid: uuid.to_owned(),
            index,
            restore_compute_mode: None,
            domains: BTreeMap::new(),
            clients: Clients::default(),
        }
    }

    /// Drops reservations older than [`RESERVATION_SECONDS`] (or from the future).
    pub fn prune_reservations(&mut self, now: u64) -> Vec<(String, String)> {
        let mut dropped = Vec::new();
        for (domain, d) in &mut self.domains {
            d.reserved.retain(|key, at| {
                let keep = fresh(*at, now);
                if !keep {
                    dropped.push((domain.clone(), key.clone()));
                }
                keep
            });
        }
        dropped
    }

    /// Removes `key`'s reservations in every domain.
    pub fn unreserve(&mut self, key: &str) {
        for d in self.domains.values_mut() {
            d.reserved.remove(key);
        }
    }

    /// The ids of the clients of domain `key`.
    pub fn domain_clients(&self, key: &str) -> Vec<String> {
        self.clients
            .iter()
            .filter(|(_, c)| c.domain.as_deref() == Some(key))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether domain `key` has clients (by the tally: no client is parsed).
    pub fn domain_in_use(&self, key: &str) -> bool {
        self.clients
            .tally()
            .domains
            .get(key)
            .is_some_and(|n| *n > 0)
    }

    /// Whether a container uses, or is about to mount, the directories of domain `key`.
    pub fn dirs_in_use(&self, key: &str, now: u64) -> bool {
        self.domain_in_use(key)
            || self
                .domains
                .get(key)
                .is_some_and(|d| d.reserved.values().any(|at| fresh(*at, now)))
    }

    /// Whether any domain has a recorded daemon.
    pub fn has_daemon(&self) -> bool {
        self.domains.values().any(|d| d.daemon.is_some())
    }

    /// The mode the GPU currently serves (that of its clients), if any.
    pub fn serving(&self) -> Option<Mode> {
        if self.has_daemon() || self.clients.tally().mps > 0 {
            return Some(Mode::Mps);
        }
        self.clients.first_mode()
    }

    /// Drops clients whose process is gone (reading every client, each removed by its line);
    /// returns them.
    pub fn drop_stale(&mut self) -> Vec<(String, Client)> {
        let stale: Vec<String> = self
            .clients
            .processes()
            .into_iter()
            .filter(|(_, p)| p.is_some_and(|p| !p.is_alive()))
            .map(|(id, _)| id)
            .collect();
        stale
            .into_iter()
            .filter_map(|id| self.clients.remove(&id).map(|c| (id, c)))
            .collect()
    }

    /// Forgets domains with no client, no daemon and no reservation.
    pub fn tidy(&mut self) {
        let tally = self.clients.tally();
        self.domains.retain(|k, d| {
            tally.domains.contains_key(k) || d.daemon.is_some() || !d.reserved.is_empty()
        });
    }

    /// Whether there is nothing to keep (then the record file is removed).
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty() && self.domains.is_empty() && self.restore_compute_mode.is_none()
    }
}

/// The name of a domain's directory: 16 base32 characters (80 bits) of SHA-256 over the GPU
/// and the domain, so that a tenant choosing a group name cannot aim at another domain's
/// directory.
pub fn domain_dir_name(uuid: &str, domain: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{uuid}/{domain}").as_bytes());
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut bits: u128 = 0;
    for b in &digest[..10] {
        bits = (bits << 8) | u128::from(*b);
    }
    (0..16)
        .rev()
        .map(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::state::StateDir;
    use crate::vocab::is_safe_name;

    #[test]
    fn safe_names() {
        for ok in [
            "abc",
            "a-b_c.d",
            "GPU-5a1e0000-0000-4000-8000-000000000000",
            "k8s:pod",
        ] {
            assert!(is_safe_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a b",
            "a\0b",
            &"x".repeat(129),
            "é",
        ] {
            assert!(!is_safe_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_reservation_is_fresh_for_its_seconds_and_not_from_the_future() {
        let now = 1_000_000;
        assert!(fresh(now - RESERVATION_SECONDS + 1, now));
        assert!(
            !fresh(now - RESERVATION_SECONDS, now),
            "exactly its seconds old"
        );
        assert!(fresh(now + 60, now), "a clock a minute ahead");
        assert!(!fresh(now + 61, now), "from the future");
    }

    #[test]
    fn exited_clients_are_dropped_by_their_lines() {
        let me = ProcId::of(std::process::id() as i32).unwrap();
        let gone = ProcId {
            start_time: me.start_time + 1,
            ..me
        };
        let mut r = Record::new("G", 0);
        for (id, p) in [("a", me), ("b", gone), ("c", me)] {
            r.clients
                .insert(id.into(), Client::plain(Mode::Limit, Some(p), 100));
        }
        // As stored and read back, lazily.
        let enc = r.clients.encoded();
        let mut read = Record::new("G", 0);
        read.clients = Clients::from_lines(enc.changes.to_vec(), enc.tally.into_owned());
        let dropped: Vec<String> = read.drop_stale().into_iter().map(|(id, _)| id).collect();
        assert_eq!(dropped, ["b"]);
        assert!(
            !read.clients.is_parsed(),
            "removed by its line, nothing kept parsed"
        );
        assert_eq!(read.clients.len(), 2);
        assert_eq!(read.clients.keys().collect::<Vec<_>>(), ["a", "c"]);
    }

    #[test]
    fn a_gpu_with_a_daemon_serves_mps_even_without_clients() {
        let mut r = Record::new("G", 0);
        assert_eq!(r.serving(), None);
        let mut d = Domain::new(Limits {
            cores: 100,
            memory_mib: None,
        });
        d.daemon = Some(Daemon {
            process: ProcId {
                pid: 1,
                start_time: 1,
            },
        });
        r.domains.insert("gpu".into(), d);
        assert_eq!(r.serving(), Some(Mode::Mps));
    }

    #[test]
    fn domain_dir_names_are_short_distinct_and_stable() {
        let a = domain_dir_name("GPU-1", "gpu");
        assert_eq!(a.len(), 16);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)));
        assert_eq!(a, domain_dir_name("GPU-1", "gpu"), "stable");
        // RFC 4648 base32, lower case, of the first 80 bits of SHA-256 (as Python's
        // `base64.b32encode(hashlib.sha256(b"GPU-1/gpu").digest()[:10]).lower()` says).
        assert_eq!(a, "w3nvoyz3s2pkw4fe");
        assert_eq!(
            domain_dir_name("GPU-5a1e0000-0000-4000-8000-000000000000", "g-team"),
            "7e2suuth5gdxdnbh"
        );
        assert_ne!(a, domain_dir_name("GPU-2", "gpu"), "per GPU");
        assert_ne!(a, domain_dir_name("GPU-1", "g-gpu"), "per domain");
        // The longest domain key (a 128-byte container id) keeps the deepest socket path of the
        // default state dir well under the 108-byte limit.
        let long = format!("c-{}", "f".repeat(128));
        let p = StateDir::new("/run/gpushare")
            .mps_dirs("GPU-1", &long)
            .pipe
            .join("control_privileged");
        assert!(p.as_os_str().len() < 108, "{}", p.display());
    }
}
