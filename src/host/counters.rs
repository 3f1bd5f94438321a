//! Node-wide counters kept in the state directory (`counters.json`), so that they outlive the
//! short-lived hook processes that count. A read-modify-write happens under `counters.lock`
//! (an `flock` held for that write only); a container that asks for nothing never touches
//! them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::host::state::{write_atomic, StateDir, StateError};

/// Upper bounds (seconds) of the createRuntime duration histogram's buckets.
pub const DURATION_BOUNDS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Largest counters file read back.
const MAX_BYTES: u64 = 4 << 20;

/// A histogram as stored: per-bucket (not cumulative) counts, the last one for `+Inf`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: vec![0; DURATION_BOUNDS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    /// Counts one observation of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        if self.buckets.len() != DURATION_BOUNDS.len() + 1 {
            *self = Histogram::default();
        }
        let i = DURATION_BOUNDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(DURATION_BOUNDS.len());
        self.buckets[i] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// `(upper bound, count)` pairs for the exposition, the last with an infinite bound.
    pub fn pairs(&self) -> Vec<(f64, u64)> {
        DURATION_BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().copied().chain(std::iter::repeat(0)))
            .collect()
    }
}

/// Everything counted on the node since the state directory was made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    /// createRuntime hooks of containers that asked for a share (acquired or refused).
    pub requests: u64,
    /// Shares acquired, by mode.
    pub acquires: BTreeMap<String, u64>,
    pub releases: u64,
    /// Refused requests by reason.
    pub refusals: BTreeMap<String, u64>,
    pub daemon_starts: u64,
    pub daemon_stops: u64,
    /// Dead daemons started afresh for their clients.
    pub daemon_restarts: u64,
    /// Live daemons that did not answer, stopped and replaced.
    pub daemon_replacements: u64,
    /// Restarts and replacements by domain (`<uuid>/<domain key>`).
    pub domain_restarts: BTreeMap<String, u64>,
    /// Domains seen with defaults other than gpushare set.
    pub drifts: u64,
    /// gc actions by kind.
    pub gc_actions: BTreeMap<String, u64>,
    /// Durations of createRuntime hooks that acquired or refused a share.
    pub create_runtime_seconds: Histogram,
}

/// The counters file and its lock.
fn paths(sd: &StateDir) -> (std::path::PathBuf, std::path::PathBuf) {
    (
        sd.root().join("counters.json"),
        sd.root().join("counters.lock"),
    )
}

/// Reads the counters (all zero when there are none yet, or when the file is unreadable).
pub fn load(sd: &StateDir) -> Counters {
    let (path, _) = paths(sd);
    let mut buf = Vec::new();
    match File::open(&path) {
        Ok(f) => {
            let _ = f.take(MAX_BYTES).read_to_end(&mut buf);
        }
        Err(_) => return Counters::default(),
    }
    serde_json::from_slice(&buf).unwrap_or_default()
}

/// Applies `f` to the stored counters under their lock. Where there is no state directory yet
/// (nothing was ever shared on the node, e.g. a first request refused before any acquire)
/// nothing is counted: a refusal leaves the node as it was (its event is still written).
///
/// # Errors
/// [`StateError`] when the state directory is unsafe, or the lock or the file cannot be
/// written.
pub fn update(sd: &StateDir, f: impl FnOnce(&mut Counters)) -> Result<(), StateError> {
    if !sd.root().exists() {
        return Ok(());
    }
    sd.ensure()?;
    let (path, lock_path) = paths(sd);
    let lock = crate::host::lockfile::open(&lock_path).map_err(|source| StateError::Lock {
        path: lock_path.clone(),
        source,
    })?;
    lock.lock().map_err(|source| StateError::Lock {
        path: lock_path.clone(),
        source,
    })?;
    let mut c = load(sd);
    f(&mut c);
    let bytes = serde_json::to_vec(&c).expect("counters serialise");
    write_atomic(&path, &bytes, 0o600).map_err(|source| StateError::Write { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let mut h = Histogram::default();
        for s in [0.001, 0.005, 0.02, 100.0] {
            h.observe(s);
        }
        let p = h.pairs();
        assert_eq!(p.len(), DURATION_BOUNDS.len() + 1);
        assert_eq!(p[0], (0.005, 2), "le is inclusive");
        assert_eq!(p[2], (0.025, 1));
        assert_eq!(p.last(), Some(&(f64::INFINITY, 1)));
        assert_eq!(h.count, 4);
        assert!((h.sum - 100.026).abs() < 1e-9);
    }

    #[test]
    fn updates_add_up_across_writers() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("s"));
        assert_eq!(load(&sd), Counters::default(), "none yet");
        update(&sd, |c| c.requests += 1).unwrap();
        assert!(!sd.root().exists(), "no state dir is made for counters");
        sd.ensure().unwrap();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10 {
                        update(&sd, |c| {
                            c.requests += 1;
                            *c.refusals.entry("busy".into()).or_default() += 1;
                        })
                        .unwrap();
                    }
                });
            }
        });
        let c = load(&sd);
        assert_eq!(c.requests, 80, "no update lost");
        assert_eq!(c.refusals["busy"], 80);
    }

    #[test]
    fn a_corrupt_file_starts_from_zero() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        std::fs::write(dir.path().join("counters.json"), b"{oops").unwrap();
        assert_eq!(load(&sd), Counters::default());
        update(&sd, |c| c.releases += 1).unwrap();
        assert_eq!(load(&sd).releases, 1);
    }
}
