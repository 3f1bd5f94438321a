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
    fn histograms_add_bucket_by_bucket() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.observe(0.001);
        b.observe(0.001);
        b.observe(7.0);
        a.add(&b);
        assert_eq!(a.count, 3);
        assert_eq!(a.pairs()[0], (0.005, 2));
        assert_eq!(a.pairs()[10], (10.0, 1));
        assert!((a.sum - 7.002).abs() < 1e-9);
        let odd = Histogram {
            buckets: vec![5],
            sum: 1.0,
            count: 5,
        };
        a.add(&odd);
        assert_eq!(a.count, 3, "another layout is passed over");
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
                            c.create_runtime_seconds.observe(0.002);
                        })
                        .unwrap();
                    }
                });
            }
        });
        let c = load(&sd);
        assert_eq!(c.requests, 80, "no update lost");
        assert_eq!(c.refusals["busy"], 80);
        assert_eq!(c.create_runtime_seconds.count, 80);
        assert_eq!(c.create_runtime_seconds.pairs()[0], (0.005, 80));
    }

    /// Concurrent writers (each update opens the log afresh: its own open file description
    /// and `flock`, as a hook process has) across several folds: nothing is lost or counted
    /// twice.
    #[test]
    fn concurrent_writers_across_folds_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path().join("s"));
        sd.ensure().unwrap();
        let (folded, log) = paths(&sd);
        // Each line is about 300 bytes: 4 x 300 updates are several times COMPACT_BYTES.
        let per = 300u64;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..per {
                        update(&sd, |c| {
                            c.releases += 1;
                            *c.gc_actions.entry("drop_client".into()).or_default() += 2;
                        })
                        .unwrap();
                    }
                });
            }
        });
        let c = load(&sd);
        assert_eq!(c.releases, 4 * per);
        assert_eq!(c.gc_actions["drop_client"], 8 * per);
        // Positive control: the log was folded (the counts are in counters.json) and is small
        // again.
        let f = read_folded(&folded);
        assert!(f.counters.releases > 0, "folded at least once: {f:?}");
        assert!(std::fs::metadata(&log).unwrap().len() <= COMPACT_BYTES + 4096);
    }

    #[test]
    fn a_torn_line_costs_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        update(&sd, |c| c.releases += 1).unwrap();
        // A writer that died part-way through its line (no newline at its end).
        let (_, log) = paths(&sd);
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"\n{\"releases\":100,\"acq").unwrap();
        assert_eq!(load(&sd).releases, 1, "the torn last line is passed over");
        update(&sd, |c| c.releases += 1).unwrap();
        assert_eq!(load(&sd).releases, 2, "the next line is whole");
    }

    #[test]
    fn a_crash_between_fold_steps_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        for _ in 0..3 {
            update(&sd, |c| c.daemon_starts += 1).unwrap();
        }
        let (folded, log_path) = paths(&sd);
        // The fold's first step done (counts and mark written), its second (a new log) not.
        let log = open_log(&log_path, false, true).unwrap().unwrap();
        let (counters, mark) = total(&folded, Some(&log)).unwrap();
        drop(log);
        write_atomic(
            &folded,
            &serde_json::to_vec(&Folded {
                counters,
                log: mark,
            })
            .unwrap(),
            0o600,
        )
        .unwrap();
        assert_eq!(
            load(&sd).daemon_starts,
            3,
            "the marked part is not counted twice"
        );
        update(&sd, |c| c.daemon_starts += 1).unwrap();
        assert_eq!(load(&sd).daemon_starts, 4);
        // A fold from there also counts each line once.
        fold(&folded, &log_path).unwrap(); // under COMPACT_BYTES: nothing to do
        assert_eq!(load(&sd).daemon_starts, 4);
    }

    #[test]
    fn an_old_counters_file_is_read_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        std::fs::write(
            dir.path().join("counters.json"),
            br#"{"requests":5,"acquires":{"mps":5}}"#,
        )
        .unwrap();
        update(&sd, |c| *c.acquires.entry("mps".into()).or_default() += 1).unwrap();
        let c = load(&sd);
        assert_eq!((c.requests, c.acquires["mps"]), (5, 6));
    }

    /// Counters with every count set to `n` (and one histogram observation).
    fn every_count(n: u64) -> Counters {
        let map = |k: &str| BTreeMap::from([(k.to_owned(), n)]);
        let mut c = Counters {
            requests: n,
            acquires: map("mps"),
            releases: n,
            refusals: map("busy"),
            daemon_starts: n,
            daemon_stops: n,
            daemon_restarts: n,
            daemon_replacements: n,
            domain_restarts: map("GPU-0/gpu"),
            drifts: n,
            gc_actions: map("stale"),
            create_runtime_seconds: Histogram::default(),
        };
        c.create_runtime_seconds.observe(0.002);
        c
    }

    #[test]
    fn adding_sums_every_count() {
        let mut a = every_count(2);
        a.add(&every_count(3));
        let mut want = every_count(5);
        want.create_runtime_seconds.observe(0.002);
        assert_eq!(a, want);
    }

    #[test]
    fn one_small_update_is_appended_not_folded() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        update(&sd, |c| c.requests += 1).unwrap();
        let (folded, log) = paths(&sd);
        assert!(!folded.exists(), "folded at once");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.lines().filter(|l| !l.is_empty()).count(), 1, "{text}");
        assert_eq!(load(&sd).requests, 1);
    }

    /// A log of exactly `len` bytes whose only counted line adds 1 request.
    fn log_of(path: &Path, len: usize) {
        let line = "\n{\"requests\":1}\n";
        let mut text = " ".repeat(len - line.len());
        text.push_str(line);
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn the_log_is_folded_only_once_past_its_size() {
        let line = format!(
            "\n{}\n",
            serde_json::to_string(&Counters {
                requests: 1,
                ..Counters::default()
            })
            .unwrap()
        );
        for (len, folded) in [(COMPACT_BYTES, false), (COMPACT_BYTES + 1, true)] {
            let dir = tempfile::tempdir().unwrap();
            let sd = StateDir::new(dir.path());
            sd.ensure().unwrap();
            let (folded_path, log) = paths(&sd);
            // What the update appends brings the log to `len` bytes.
            log_of(&log, len as usize - line.len());
            update(&sd, |c| c.requests += 1).unwrap();
            assert_eq!(folded_path.exists(), folded, "{len} bytes");
            assert_eq!(load(&sd).requests, 2, "{len} bytes");
        }
    }

    #[test]
    fn a_fold_makes_its_new_log_only_where_nothing_is() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        let (folded, log) = paths(&sd);
        log_of(&log, COMPACT_BYTES as usize + 100);
        // A link planted where the fold makes the new log is not followed.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        let tmp = dir
            .path()
            .join(format!(".counters.log.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        assert!(fold(&folded, &log).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(load(&sd).requests, 1, "counted once");
        // Positive control: with the link gone the fold puts an empty log in place.
        let _ = std::fs::remove_file(&tmp);
        fold(&folded, &log).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert_eq!(load(&sd).requests, 1, "counted once");
    }

    #[test]
    fn the_log_is_opened_only_where_it_is_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("counters.log");
        assert!(open_log(&log, false, false).unwrap().is_none(), "none yet");
        // A link planted in its place is not followed, when reading or when making the log.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, &log).unwrap();
        for create in [false, true] {
            assert!(open_log(&log, create, false).is_err(), "create {create}");
        }
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"",
            "the target is untouched"
        );
        // Positive control: a file there opens.
        std::fs::remove_file(&log).unwrap();
        std::fs::write(&log, b"").unwrap();
        assert!(open_log(&log, false, false).unwrap().is_some());
    }

    /// A log that a fold took away while this opener waited for its lock is passed over for
    /// the file now at the path (here: none, so a reader gets none and a writer makes one).
    #[test]
    fn a_log_removed_while_waiting_for_its_lock_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("counters.log");
        for create in [false, true] {
            std::fs::write(&log, b"old").unwrap();
            let held = File::open(&log).unwrap();
            held.lock().unwrap();
            let got = std::thread::scope(|s| {
                let opener = s.spawn(|| open_log(&log, create, false));
                // Positive control: the opener is blocked on the lock before the log goes.
                std::thread::sleep(std::time::Duration::from_millis(100));
                assert!(
                    !opener.is_finished(),
                    "the opener did not wait for the lock"
                );
                std::fs::remove_file(&log).unwrap();
                held.unlock().unwrap();
                opener.join().unwrap()
            });
            let got = got.unwrap_or_else(|e| panic!("create {create}: {e}"));
            assert_eq!(got.is_some(), create, "create {create}");
            assert_eq!(log.exists(), create, "create {create}");
            if let Some(f) = got {
                assert_eq!(
                    f.metadata().unwrap().len(),
                    0,
                    "the new log, not the old one"
                );
            }
        }
    }

    #[test]
    fn nothing_counted_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        sd.ensure().unwrap();
        update(&sd, |_| {}).unwrap();
        assert!(!paths(&sd).1.exists());
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
