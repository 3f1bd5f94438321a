//! The rows of the tables: what one acquire case and one release or gc case are, and how one
//! row is run (as its own `#[test]`, made by `rows!` in the module above).

use super::world::*;
use crate::host::acquire::AcquireError;
use crate::vocab::{ComputeMode, Isolation};

/// One acquire case: `given` builds the world (policy, earlier containers, injected faults);
/// the fakes' recordings are cleared; `when` acts. A row with `err` must fail with a message
/// containing it and leave records, daemons, directories and compute modes as they were;
/// `then` checks the rest.
pub(super) struct AcquireRow {
    pub(super) what: &'static str,
    pub(super) isolation: Isolation,
    pub(super) modes: &'static [(u32, ComputeMode)],
    pub(super) given: fn(&mut World),
    pub(super) when: fn(&World) -> Result<(), AcquireError>,
    pub(super) err: Option<&'static str>,
    pub(super) then: fn(&World, &str),
}

pub(super) fn nothing(_: &mut World) {}
pub(super) fn no_check(_: &World, _: &str) {}

/// Runs one acquire row; a failed check panics, naming the row.
pub(super) fn run_acquire_row(row: AcquireRow) {
    let what = row.what;
    let mut w = World::new(row.isolation, row.modes);
    (row.given)(&mut w);
    w.clear();
    let before = w.snapshot();
    let res = (row.when)(&w);
    match (row.err, res) {
        (None, Ok(())) => {}
        (None, Err(e)) => panic!("{what}: unexpected error: {}", crate::vocab::chain(&e)),
        (Some(want), Ok(())) => panic!("{what}: succeeded, expected an error with {want:?}"),
        (Some(want), Err(e)) => {
            let msg = crate::vocab::chain(&e);
            assert!(msg.contains(want), "{what}: error {msg:?} lacks {want:?}");
            assert_eq!(
                w.snapshot(),
                before,
                "{what}: state changed by a failed acquire"
            );
        }
    }
    (row.then)(&w, what);
}

/// One release or gc case: `given` builds the world; the fakes' recordings are cleared;
/// `when` acts and returns its warnings or report, which must contain each of `says`, in
/// order; `then` checks the rest.
pub(super) struct ReleaseRow {
    pub(super) what: &'static str,
    pub(super) isolation: Isolation,
    pub(super) modes: &'static [(u32, ComputeMode)],
    pub(super) given: fn(&mut World),
    pub(super) when: fn(&World) -> Vec<String>,
    /// `None`: not checked by this row.
    pub(super) says: Option<&'static [&'static str]>,
    pub(super) then: fn(&World, &str),
}

/// Runs one release or gc row; a failed check panics, naming the row.
pub(super) fn run_release_row(row: ReleaseRow) {
    let what = row.what;
    let mut w = World::new(row.isolation, row.modes);
    (row.given)(&mut w);
    w.clear();
    let said = (row.when)(&w);
    if let Some(says) = row.says {
        assert_eq!(said.len(), says.len(), "{what}: said {said:#?}");
        for (line, want) in said.iter().zip(says) {
            assert!(line.contains(want), "{what}: {line:?} lacks {want:?}");
        }
    }
    (row.then)(&w, what);
}
