//! A GPU with many clients: an acquire asks the record's header, not the other clients' lines.

use super::world::{plain, World, DEFAULT};
use crate::host::fakes::uuid;
use crate::host::state::StateError;
use crate::vocab::{Isolation, Mode};

/// With the GPU's reaper running (as after any acquire on a node), an acquire leaves the
/// liveness of the other clients to it, and parses none of their lines: one that cannot be
/// read is carried over byte for byte, and only a full read (status, gc) refuses it.
#[test]
fn an_acquire_parses_no_other_clients_line() {
    let w = World::new(Isolation::Gpu, &[(0, DEFAULT)]);
    let state = w.state();
    for id in ["a", "b", "c"] {
        w.given(&plain(id, Mode::Limit, &[0]));
    }
    // The GPU's reaper: this live process, by the stamp a reaper writes.
    let stamp = state.reaper_lock_path(&uuid(0));
    std::fs::create_dir_all(stamp.parent().unwrap()).unwrap();
    std::fs::write(&stamp, format!("{} {}\n", w.me.pid, w.me.start_time)).unwrap();
    assert!(state.reaper_alive(&uuid(0)));
    // b's line damaged in place, its size kept (the header's count and size still agree).
    let path = state.record_path(&uuid(0));
    let good = std::fs::read_to_string(&path).unwrap();
    let from = r#"["b",{"mode":"limit""#;
    let bad = good.replacen(from, r#"["b",{"mode":"LIMIT""#, 1);
    assert_ne!(bad, good, "b's line is there to damage");
    std::fs::write(&path, &bad).unwrap();
    // Positive control: a full read refuses the file.
    assert!(matches!(
        state.load(&uuid(0)),
        Err(StateError::Corrupt { .. })
    ));

    w.given(&plain("d", Mode::Limit, &[0]));

    let after = std::fs::read_to_string(&path).unwrap();
    let line = |text: &str, id: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("[\"{id}\",")))
            .map(str::to_owned)
    };
    assert_eq!(
        line(&after, "b"),
        line(&bad, "b"),
        "b's line carried over as it was"
    );
    assert!(line(&after, "d").is_some(), "d added: {after}");
    let rec = state.load_lazy(&uuid(0)).unwrap().unwrap();
    assert_eq!(rec.clients.len(), 4);
    assert_eq!(rec.clients.tally().limit, 4);
    match state.load(&uuid(0)) {
        Err(StateError::Corrupt { source, .. }) => {
            assert!(source.to_string().contains("LIMIT"), "{source}")
        }
        other => panic!("a full read still names b's line: {other:?}"),
    }
}
