//! Every failpoint in the code has a crash test: the names passed to `failpoint::hit` in `src/`
//! are listed, and each must appear in a test file next to `common::assert_killed_at`, the
//! assertion that the hook was SIGKILLed exactly there. A new failpoint without such a test
//! fails this test.

use std::collections::BTreeSet;
use std::path::Path;

const HIT: &str = "failpoint::hit(\"";

/// Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The failpoint names `failpoint::hit("…")` is called with in `text`.
fn points_in(text: &str) -> Vec<String> {
    text.match_indices(HIT)
        .map(|(i, _)| {
            let rest = &text[i + HIT.len()..];
            rest[..rest.find('"').expect("closing quote")].to_owned()
        })
        .collect()
}

/// Every string literal in `text` (no escapes needed for failpoint names).
fn literals(text: &str) -> BTreeSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_failpoint_is_reached_by_a_test_that_asserts_the_hook_died_there() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut src = Vec::new();
    rust_files(&root.join("src"), &mut src);
    let mut points = Vec::new();
    for f in &src {
        if f.ends_with("failpoint.rs") {
            continue;
        }
        points.extend(points_in(&std::fs::read_to_string(f).unwrap()));
    }
    // Positive control: the scan finds the failpoints the crash tests are known to use.
    for known in ["acquire-locked", "acquire-mode-recorded", "release-locked"] {
        assert!(
            points.iter().any(|p| p == known),
            "{known} not found in {points:?}"
        );
    }
    let unique: BTreeSet<&String> = points.iter().collect();
    assert_eq!(
        unique.len(),
        points.len(),
        "a failpoint name used twice: {points:?}"
    );

    let mut tests = Vec::new();
    rust_files(&root.join("tests"), &mut tests);
    let mut covered = BTreeSet::new();
    for f in &tests {
        let text = std::fs::read_to_string(f).unwrap();
        if text.contains("assert_killed_at(") && !f.ends_with("common/mod.rs") {
            covered.extend(literals(&text));
        }
    }
    let missing: Vec<&String> = unique
        .into_iter()
        .filter(|p| !covered.contains(*p))
        .collect();
    assert!(
        missing.is_empty(),
        "failpoints without a crash test (one that arms GPUSHARE_FAILPOINT with the name and \
         asserts `common::assert_killed_at`): {missing:?}"
    );
}

#[test]
fn the_scan_sees_a_new_failpoint_and_its_absence_from_the_tests() {
    // Negative control of the test above, on text: a point the tests do not name is missing.
    let code = "fn f() { crate::failpoint::hit(\"brand-new\"); failpoint::hit(\"old\") }";
    assert_eq!(points_in(code), ["brand-new", "old"]);
    let test = "common::assert_killed_at(&out, \"old\");";
    let covered = literals(test);
    assert!(covered.contains("old"));
    assert!(!covered.contains("brand-new"));
}
