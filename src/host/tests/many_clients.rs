//! A GPU with many clients: an acquire, and a poststop while the GPU's reaper runs, ask the
//! record's header, not the other clients' lines.

use super::world::{gpu_plan, plain, reaper_runs, World, DEFAULT};
use crate::host::fakes::uuid;
use crate::host::state::StateError;
use crate::vocab::{Isolation, Mode};

/// With the GPU's reaper running (as after any acquire on a node), an acquire and a poststop
/// leave the liveness of the other clients to it, and parse none of their lines: one that
/// cannot be read is carried over byte for byte, and only a full read (status, gc) refuses it.
#[test]
fn an_acquire_and_a_release_parse_no_other_clients_line() {
    let w = World::new(Isolation::Gpu, &[(0, DEFAULT)]);
    let state = w.state();
    for id in ["a", "b", "c"] {
        w.given(&plain(id, Mode::Limit, &[0]));
    }
    reaper_runs(&state, w.me, 0);
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

    // A poststop: a released by its line alone.
    assert_eq!(w.host().release("a"), Vec::<String>::new());
    let after = std::fs::read_to_string(&path).unwrap();
    assert!(line(&after, "a").is_none(), "a released: {after}");
    assert_eq!(
        line(&after, "b"),
        line(&bad, "b"),
        "b's line still as it was"
    );
    let rec = state.load_lazy(&uuid(0)).unwrap().unwrap();
    assert_eq!(rec.clients.len(), 3);
}

/// A poststop releases its own container and leaves clients whose process exited to the GPU's
/// reaper while one runs (it releases each as its process exits); without one, it drops them.
#[test]
fn a_poststop_leaves_exited_clients_to_a_running_reaper() {
    let w = World::new(Isolation::Gpu, &[(0, DEFAULT)]);
    let state = w.state();
    for id in ["a", "b"] {
        w.given(&plain(id, Mode::Limit, &[0]));
    }
    let dead = w.ctl.dead_process();
    w.host()
        .acquire(&plain("exited", Mode::Limit, &[0]), Some(dead), None)
        .expect("an acquire for a process that has exited meanwhile");
    let stamp = reaper_runs(&state, w.me, 0);

    w.host().release("a");
    assert_eq!(w.clients(0), ["b", "exited"], "left to the reaper");

    // The reaper gone: the next poststop drops the exited client too.
    std::fs::remove_file(&stamp).unwrap();
    assert!(!state.reaper_alive(&uuid(0)));
    w.host().release("b");
    assert!(w.clients(0).is_empty(), "{:?}", w.clients(0));
    assert!(w.record(0).is_none(), "nothing left to record");
}

/// A client whose process has exited, but that the running reaper has not released yet (it
/// takes the GPU's lock after the acquire that holds it), refuses nobody: an acquire that
/// would be refused for the clients it carries checks their processes first.
#[test]
fn an_exited_client_the_reaper_has_not_released_yet_refuses_nobody() {
    let w = World::new(Isolation::Gpu, &[(0, DEFAULT)]);
    let dead = w.ctl.dead_process();
    w.host()
        .acquire(&gpu_plan(&w, "gone"), Some(dead), None)
        .expect("an mps acquire for a process that has exited meanwhile");
    reaper_runs(&w.state(), w.me, 0);
    // Positive control: an acquire that nothing refuses leaves the exited client to the reaper.
    w.given(&gpu_plan(&w, "m2"));
    assert_eq!(w.clients(0), ["gone", "m2"], "left to the reaper");
    // A live mps client still refuses a limit container, and the refusal names only it.
    let e = w.acquire(&plain("c2", Mode::Limit, &[0])).unwrap_err();
    assert!(e.to_string().contains("serves mps to m2;"), "{e}");
    assert_eq!(w.clients(0), ["gone", "m2"], "a refusal changes nothing");

    w.host().release("m2");
    assert_eq!(w.clients(0), ["gone"], "left to the reaper");
    w.acquire(&plain("c2", Mode::Limit, &[0]))
        .expect("only an exited client is in the way");
    assert_eq!(w.clients(0), ["c2"]);
    assert!(w.ctl.live().is_empty(), "the mps daemon stopped");
}
