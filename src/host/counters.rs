//! Node-wide counters kept in the state directory, so that they outlive the short-lived hook
//! processes that count. A hook appends what it counted as one line to `counters.log` (one
//! `write`, under a shared `flock` of that file: concurrent hooks never wait for each other);
//! readers add the lines up. When the log has grown past [`COMPACT_BYTES`], the writer that
//! notices folds it into `counters.json` under the log's exclusive `flock` and puts an empty log
//! in its place. A container that asks for nothing never touches them.
//!
//! Crash safety: `counters.json` names the log (inode) and how many of its bytes it already
//! holds, and is replaced (atomically) before the log is; a reader skips those bytes while that
//! log is current. Every line starts with a newline, so that a line torn by a failed write
//! (a full disk) ends there and costs only itself: lines that do not parse are passed over.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::state::{write_atomic, StateDir, StateError};

/// Upper bounds (seconds) of the createRuntime duration histogram's buckets.
pub const DURATION_BOUNDS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Largest counters file read back.
const MAX_BYTES: u64 = 4 << 20;
/// Largest part of the log read back (it is folded at [`COMPACT_BYTES`]).
const MAX_LOG_BYTES: u64 = 64 << 20;
/// Log size past which the writer that notices folds the log into `counters.json`.
pub const COMPACT_BYTES: u64 = 64 << 10;

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

    /// Adds `other`'s observations (one with another bucket layout is passed over).
    pub fn add(&mut self, other: &Histogram) {
        if other.buckets.len() != DURATION_BOUNDS.len() + 1 {
            return;
        }
        if self.buckets.len() != DURATION_BOUNDS.len() + 1 {
            *self = Histogram::default();
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.sum += other.sum;
        self.count += other.count;
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

impl Counters {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Counters) {
        fn add_map(a: &mut BTreeMap<String, u64>, b: &BTreeMap<String, u64>) {
            for (k, v) in b {
                *a.entry(k.clone()).or_default() += v;
            }
        }
        self.requests += other.requests;
        add_map(&mut self.acquires, &other.acquires);
        self.releases += other.releases;
        add_map(&mut self.refusals, &other.refusals);
        self.daemon_starts += other.daemon_starts;
        self.daemon_stops += other.daemon_stops;
        self.daemon_restarts += other.daemon_restarts;
        self.daemon_replacements += other.daemon_replacements;
        add_map(&mut self.domain_restarts, &other.domain_restarts);
        self.drifts += other.drifts;
        add_map(&mut self.gc_actions, &other.gc_actions);
        self.create_runtime_seconds
            .add(&other.create_runtime_seconds);
    }
}

/// `counters.json`: the folded counts, and which log bytes they already hold.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Folded {
    #[serde(flatten)]
    counters: Counters,
    /// The log (inode) whose first `bytes` bytes are in `counters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    log: Option<LogMark>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct LogMark {
    ino: u64,
    bytes: u64,
}

/// The folded counters file and the log.
fn paths(sd: &StateDir) -> (PathBuf, PathBuf) {
    (
        sd.root().join("counters.json"),
        sd.root().join("counters.log"),
    )
}

/// Opens the current log (`create`: making it when missing) with a shared `flock` (exclusive
/// with `exclusive`), checking it is still the file at `path` once locked: a fold may have put
/// a new one in its place meanwhile. `None` when there is none and `create` is false.
fn open_log(path: &Path, create: bool, exclusive: bool) -> std::io::Result<Option<File>> {
    loop {
        let f = match OpenOptions::new()
            .read(true)
            .append(create)
            .create(create)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if exclusive {
            f.lock()?;
        } else {
            f.lock_shared()?;
        }
        let held = f.metadata()?;
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.ino() == held.ino() && m.dev() == held.dev() => return Ok(Some(f)),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

fn read_folded(path: &Path) -> Folded {
    let mut buf = Vec::new();
    match File::open(path) {
        Ok(f) => {
            let _ = f.take(MAX_BYTES).read_to_end(&mut buf);
        }
        Err(_) => return Folded::default(),
    }
    serde_json::from_slice(&buf).unwrap_or_default()
}

/// The folded counts plus every whole line of the log `log` (locked by the caller) not yet
/// folded; also the log's length read.
fn total(folded_path: &Path, log: Option<&File>) -> std::io::Result<(Counters, Option<LogMark>)> {
    let folded = read_folded(folded_path);
    let mut c = folded.counters;
    let Some(mut log) = log else {
        return Ok((c, None));
    };
    let ino = log.metadata()?.ino();
    let skip = folded.log.filter(|m| m.ino == ino).map_or(0, |m| m.bytes);
    log.seek(SeekFrom::Start(skip))?;
    let mut buf = Vec::new();
    log.take(MAX_LOG_BYTES).read_to_end(&mut buf)?;
    add_lines(&mut c, &buf);
    Ok((
        c,
        Some(LogMark {
            ino,
            bytes: skip + buf.len() as u64,
        }),
    ))
}

/// Adds every line of `text` that parses as counters (a torn line is passed over).
fn add_lines(c: &mut Counters, text: &[u8]) {
    for line in text.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Ok(delta) = serde_json::from_slice::<Counters>(line) {
            c.add(&delta);
        }
    }
}

/// Reads the counters (all zero when there are none yet, or when the files are unreadable).
pub fn load(sd: &StateDir) -> Counters {
    let (folded, log_path) = paths(sd);
    // The log's shared lock keeps a fold from changing both files while they are read.
    let log = open_log(&log_path, false, false).ok().flatten();
    total(&folded, log.as_ref())
        .map(|(c, _)| c)
        .unwrap_or_default()
}

/// Counts what `f` counts: `f` is given zero counters and adds to them (every count is a sum),
/// and what it added is appended to the log. Where there is no state directory yet (nothing
/// was ever shared on the node, e.g. a first request refused before any acquire) nothing is
/// counted: a refusal leaves the node as it was (its event is still written).
///
/// # Errors
/// [`StateError`] when the state directory is unsafe, or the log cannot be opened, locked or
/// written.
pub fn update(sd: &StateDir, f: impl FnOnce(&mut Counters)) -> Result<(), StateError> {
    if !sd.root().exists() {
        return Ok(());
    }
    let mut delta = Counters::default();
    f(&mut delta);
    if delta == Counters::default() {
        return Ok(());
    }
    sd.ensure()?;
    let (folded, log_path) = paths(sd);
    let lock_err = |source| StateError::Lock {
        path: log_path.clone(),
        source,
    };
    let log = open_log(&log_path, true, false)
        .map_err(lock_err)?
        .expect("made when missing");
    // One write of a line that starts with a newline: it ends a torn line before it.
    let line = format!(
        "\n{}\n",
        serde_json::to_string(&delta).expect("counters serialise")
    );
    (&log)
        .write_all(line.as_bytes())
        .map_err(|source| StateError::Write {
            path: log_path.clone(),
            source,
        })?;
    let len = log.metadata().map(|m| m.len()).unwrap_or(0);
    drop(log);
    if len > COMPACT_BYTES {
        if let Err(e) = fold(&folded, &log_path) {
            tracing::debug!("cannot fold the counters log: {e}");
        }
    }
    Ok(())
}

/// Folds the log into `counters.json` and puts an empty log in its place, under the log's
/// exclusive lock (waiting for the writers that hold it shared; the few writers that queue
/// meanwhile then find the new log).
fn fold(folded: &Path, log_path: &Path) -> std::io::Result<()> {
    let Some(log) = open_log(log_path, false, true)? else {
        return Ok(());
    };
    if log.metadata()?.len() <= COMPACT_BYTES {
        return Ok(()); // folded by another writer meanwhile
    }
    let (counters, mark) = total(folded, Some(&log))?;
    let bytes = serde_json::to_vec(&Folded {
        counters,
        log: mark,
    })
    .expect("counters serialise");
    // First the counts with the log's mark (a crash here leaves a log whose marked part is
    // skipped), then an empty log in its place.
    write_atomic(folded, &bytes, 0o600)?;
    let dir = log_path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".counters.log.{}.tmp", std::process::id()));
    let res = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|_| std::fs::rename(&tmp, log_path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests;
