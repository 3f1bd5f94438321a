//! One GPU, several modes: which share modes can serve together, and what an acquire does
//! with what another mode left.

use super::rows::*;
use super::world::*;
use crate::host::acquire::Host;
use crate::vocab::{Isolation, Mode};

rows! {
    run_acquire_row;
    mps_gpu_a_limit_container_is_busy: AcquireRow {
        what: "mps GPU: a limit container is busy",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&plain("c2", Mode::Limit, &[0])),
        err: Some("GPU 0 (GPU-0) serves mps to c1; limit cannot share it with them"),
        then: no_check,
    },
    mps_gpu_a_timeslice_container_is_busy: AcquireRow {
        what: "mps GPU: a timeslice container is busy",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&plain("c2", Mode::Timeslice, &[0])),
        err: Some("serves mps to c1; timeslice cannot"),
        then: no_check,
    },
    limit_gpu_an_mps_container_is_busy: AcquireRow {
        what: "limit GPU: an mps container is busy",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&plain("c1", Mode::Limit, &[0])),
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: Some("serves limit to c1; mps cannot"),
        then: |w, what| assert!(w.ctl.calls().is_empty(), "{what}"),
    },
    busy_on_the_second_gpu_the_first_gpu_is_rolled_back: AcquireRow {
        what: "busy on the second GPU: the first GPU is rolled back",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: |w| w.given(&plain("c1", Mode::Limit, &[1])),
        when: |w| w.acquire(&mps(&w.cfg, "c2", &[0, 1], ASK)),
        err: Some("serves limit to c1"),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/gpu", "set_defaults GPU-0/gpu", "stop GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE), (0, DEFAULT)], "{what}");
        },
    },
    without_the_mps_control_program_timeslice_and_limit_still_serve: AcquireRow {
        what: "no nvidia-cuda-mps-control installed: timeslice and limit containers are served, an mps one is refused before anything changes",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.cfg.mps.control = "/nonexistent/nvidia-cuda-mps-control".into();
            let host = Host::new(&w.cfg, &w.inv);
            for plan in [plain("t1", Mode::Timeslice, &[0]), plain("l1", Mode::Limit, &[0])] {
                if let Err(e) = host.acquire(&plan, Some(w.me), None) {
                    panic!("{}: {}", plan.container, crate::vocab::chain(&e));
                }
            }
        },
        when: |w| Host::new(&w.cfg, &w.inv).acquire(&gpu_plan(w, "m1"), Some(w.me), None),
        err: Some("nvidia-cuda-mps-control"),
        then: |w, what| {
            assert_eq!(w.clients(0), ["l1", "t1"], "{what}");
            assert!(w.inv.sets().is_empty(), "{what}: no compute mode changed for the refused one");
        },
    },
    timeslice_and_limit_containers_share_a_gpu: AcquireRow {
        what: "timeslice and limit containers share a GPU",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&plain("c1", Mode::Timeslice, &[0])),
        when: |w| w.acquire(&plain("c2", Mode::Limit, &[0])),
        err: None,
        then: |w, what| {
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
            assert!(w.ctl.calls().is_empty(), "{what}");
        },
    },
    a_gpu_whose_only_mps_client_is_stale_serves_a_limit_container: AcquireRow {
        what: "a GPU whose only mps client is stale serves a limit container",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            let dead = w.ctl.dead_process();
            w.host().acquire(&gpu_plan(w, "gone"), Some(dead), None).unwrap();
        },
        when: |w| w.acquire(&plain("c2", Mode::Limit, &[0])),
        err: None,
        then: |w, what| {
            assert_eq!(w.clients(0), ["c2"], "{what}");
            assert!(w.ctl.live().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            assert!(!w.domain_dir(0, "gpu").exists(), "{what}");
        },
    },
    a_leftover_daemon_without_clients_is_stopped_and_the_gpu_put_in_default_for_a: AcquireRow {
        what: "a leftover daemon without clients is stopped and the GPU put in DEFAULT for a limit container",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            // A release killed after dropping the client: daemon recorded, no client.
            w.given(&gpu_plan(w, "c1"));
            let mut rec = w.record(0).unwrap();
            rec.clients.clear();
            w.save(&rec);
        },
        when: |w| w.acquire(&plain("c2", Mode::Limit, &[0])),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert!(w.ctl.live().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            let rec = w.record(0).unwrap();
            assert!(rec.domains.is_empty(), "{what}");
            assert_eq!(rec.restore_compute_mode, None, "{what}");
        },
    },
    limit_on_an_exclusive_gpu_default_while_it_serves_recorded_for_rollback_only: AcquireRow {
        what: "limit on an exclusive GPU: DEFAULT while it serves, recorded for rollback only",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: nothing,
        when: |w| w.acquire(&plain("c1", Mode::Limit, &[0])),
        err: None,
        then: |w, what| {
            assert_eq!(w.inv.sets(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
}

/// The first timeslice or limit container on a GPU reads its compute mode and puts the default
/// back; the next ones join without reading it again (NVML is not loaded for it), as a join of
/// a running MPS domain does not. Once the GPU has no client, the next first one reads it again.
#[test]
fn a_plain_join_reads_no_compute_mode_its_first_client_set() {
    use crate::vocab::Inventory;
    let w = World::new(Isolation::Gpu, &[(0, EXCLUSIVE)]);
    w.acquire(&plain("c1", Mode::Timeslice, &[0])).unwrap();
    assert_eq!(w.inv.mode_reads(), 1, "the first client reads the mode");
    assert_eq!(w.inv.sets(), [(0, DEFAULT)], "and puts the default");
    w.acquire(&plain("c2", Mode::Limit, &[0])).unwrap();
    w.acquire(&plain("c3", Mode::Timeslice, &[0])).unwrap();
    assert_eq!(w.inv.mode_reads(), 1, "the joins read no mode");
    assert_eq!(w.inv.sets(), [(0, DEFAULT)]);
    assert_eq!(w.clients(0), ["c1", "c2", "c3"]);
    for c in ["c1", "c2", "c3"] {
        assert!(w.host().release(c).is_empty(), "{c}");
    }
    // Changed while the GPU had no client: the next first client reads it and puts it back.
    w.inv.set_compute_mode(0, EXCLUSIVE).unwrap();
    w.acquire(&plain("c4", Mode::Timeslice, &[0])).unwrap();
    assert_eq!(w.inv.mode_reads(), 2, "a first client again");
    assert_eq!(w.inv.modes(), [(0, DEFAULT)]);
}
