//! Tests of `counters`.

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
