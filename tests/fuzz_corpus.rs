//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same functions and
//! property checks the cargo-fuzz targets run (`fuzz/src/lib.rs`), on stable, so that a
//! regression on a known input fails here without a nightly toolchain. `scripts/fuzz.sh` runs the
//! real fuzzing.

#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let r = std::panic::catch_unwind(|| f(&data));
        assert!(
            r.is_ok(),
            "{target}: {} fails its properties",
            path.display()
        );
        n += 1;
    }
    assert!(
        n >= 3,
        "{target}: only {n} corpus files in {}",
        dir.display()
    );
}

#[test]
fn oci_state_corpus() {
    replay("oci_state", checks::oci_state);
}

#[test]
fn config_json_corpus() {
    replay("config_json", checks::config_json);
}

#[test]
fn request_corpus() {
    replay("request", checks::request);
}

#[test]
fn policy_corpus() {
    replay("policy", checks::policy);
}

#[test]
fn state_record_corpus() {
    replay("state_record", checks::state_record);
}

#[test]
fn spec_edit_corpus() {
    replay("spec_edit", checks::spec_edit);
}
