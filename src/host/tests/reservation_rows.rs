//! Reservations a spec edit makes for the MPS directories it mounts: kept, consumed, expired.

use super::rows::*;
use super::world::*;
use crate::host::fakes::uuid;
use crate::host::state::{Daemon, Domain, Record};
use crate::vocab::Isolation;

/// Reservations mount the domain's shm tmpfs ([`Host::reserve`] calls `MpsDirs::prepare`),
/// which needs root (CAP_SYS_ADMIN).
fn can_mount() -> bool {
    super::can_mount("reservation tests (the shm tmpfs)")
}

/// Reserves the directories of `id`'s domain on GPU 0 under `key`, as a spec edit does.
fn reserve(w: &World, id: &str, key: &str) {
    let plan = gpu_plan(w, id);
    w.host()
        .reserve(&plan.gpus[0], plan.domain.as_ref().unwrap(), key)
        .expect("reserve");
}

/// A reservation row, run where the shm tmpfs can be mounted (see [`can_mount`]).
fn run_reservation_row(row: ReleaseRow) {
    if can_mount() {
        run_release_row(row);
    }
}

rows! {
    run_reservation_row;
    a_spec_edits_reservation_keeps_the_directories_and_shm_when_the_last_client: ReleaseRow {
        what: "a spec edit's reservation keeps the directories (and shm) when the last client leaves",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            reserve(w, "c2", "pending-1");
        },
        when: |w| w.host().release("c1"),
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert!(w.domain_dir(0, "gpu").exists(), "{what}");
            let shm = w.host().mps_dirs(&uuid(0), "gpu").shm;
            assert!(crate::host::mps::is_mount_point(&shm), "{what}");
            let rec = w.record(0).unwrap();
            assert!(rec.domains["gpu"].reserved.contains_key("pending-1"), "{what}");
            assert_eq!(rec.domains["gpu"].daemon, None, "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
        },
    },
    an_acquire_consumes_the_reservation_made_under_its_key_and_starts_the_daemon_in: ReleaseRow {
        what: "an acquire consumes the reservation made under its key and starts the daemon in the reserved directories",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| reserve(w, "c1", "pending-1"),
        when: |w| {
            w.host()
                .acquire(&gpu_plan(w, "c1"), Some(w.me), Some("pending-1"))
                .unwrap();
            Vec::new()
        },
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["start GPU-0/gpu", "set_defaults GPU-0/gpu"], "{what}");
            let rec = w.record(0).unwrap();
            assert!(rec.domains["gpu"].reserved.is_empty(), "{what}");
            assert_eq!(rec.domain_clients("gpu"), ["c1"], "{what}");
        },
    },
    a_reservation_under_the_container_id_is_consumed_too: ReleaseRow {
        what: "a reservation under the container id is consumed too",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| reserve(w, "c1", "c1"),
        when: |w| {
            w.acquire(&gpu_plan(w, "c1")).unwrap();
            Vec::new()
        },
        says: Some(&[]),
        then: |w, what| {
            assert!(w.record(0).unwrap().domains["gpu"].reserved.is_empty(), "{what}");
        },
    },
    a_refused_acquire_drops_its_reservation_and_the_directories_only_it_kept: ReleaseRow {
        what: "a refused acquire drops its reservation and the directories only it kept",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            reserve(w, "c1", "pending-1");
            w.ctl.fail_start(true);
        },
        when: |w| {
            let res = w.host().acquire(&gpu_plan(w, "c1"), Some(w.me), Some("pending-1"));
            assert!(res.is_err(), "the daemon cannot start: the acquire fails");
            Vec::new()
        },
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.record(0), None, "{what}: the reservation stays");
            assert!(!w.domain_dir(0, "gpu").exists(), "{what}: the directories stay");
            let shm = w.host().mps_dirs(&uuid(0), "gpu").shm;
            assert!(!crate::host::mps::is_mount_point(&shm), "{what}");
        },
    },
    a_refused_acquire_keeps_a_reservation_made_under_another_key: ReleaseRow {
        what: "a refused acquire keeps a reservation made under another key (the positive control of the row above)",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            reserve(w, "c1", "pending-2");
            w.ctl.fail_start(true);
        },
        when: |w| {
            let res = w.host().acquire(&gpu_plan(w, "c1"), Some(w.me), Some("pending-1"));
            assert!(res.is_err(), "the daemon cannot start: the acquire fails");
            Vec::new()
        },
        says: Some(&[]),
        then: |w, what| {
            let rec = w.record(0).expect("record");
            assert!(rec.domains["gpu"].reserved.contains_key("pending-2"), "{what}");
            assert!(w.domain_dir(0, "gpu").exists(), "{what}");
        },
    },
    a_refused_acquire_leaves_the_directories_of_another_domain_whose_daemon_runs: ReleaseRow {
        what: "a refused acquire leaves the directories of another domain whose daemon runs, even with no client",
        isolation: Isolation::Group,
        modes: ONE_GPU,
        given: |w| {
            std::fs::create_dir_all(w.pipe(0, "g-a")).unwrap();
            let process = w.ctl.add_daemon(&w.pipe(0, "g-a"), POLICY);
            let mut rec = Record::new(&uuid(0), 0);
            let mut d = Domain::new(POLICY);
            d.daemon = Some(Daemon { process });
            rec.domains.insert("g-a".into(), d);
            w.save(&rec);
            let plan = group_plan(w, "c2", "b");
            w.host()
                .reserve(&plan.gpus[0], plan.domain.as_ref().unwrap(), "pending-1")
                .expect("reserve");
            w.ctl.fail_start(true);
        },
        when: |w| {
            let res = w.host().acquire(&group_plan(w, "c2", "b"), Some(w.me), Some("pending-1"));
            assert!(res.is_err(), "the daemon cannot start: the acquire fails");
            Vec::new()
        },
        says: Some(&[]),
        then: |w, what| {
            assert!(!w.domain_dir(0, "g-b").exists(), "{what}: the refused domain's directories stay");
            assert!(w.domain_dir(0, "g-a").exists(), "{what}: a running daemon's directories removed");
            let rec = w.record(0).expect("record");
            assert!(rec.domains["g-a"].daemon.is_some(), "{what}");
            assert!(!rec.domains.contains_key("g-b"), "{what}");
        },
    },
    a_refused_spec_edit_is_forgotten_its_reservation_and_directories_dropped: ReleaseRow {
        what: "a refused spec edit is forgotten: its reservation and directories dropped",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| reserve(w, "c1", "pending-1"),
        when: |w| {
            w.host().forget("pending-1");
            Vec::new()
        },
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.record(0), None, "{what}");
            assert!(!w.domain_dir(0, "gpu").exists(), "{what}");
        },
    },
    an_expired_reservation_is_dropped_by_gc_its_directories_removed_and_shm: ReleaseRow {
        what: "an expired reservation is dropped by gc, its directories removed and shm unmounted",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            reserve(w, "c1", "pending-1");
            let mut rec = w.record(0).unwrap();
            let old = crate::host::state::now_seconds() - crate::host::state::RESERVATION_SECONDS - 1;
            rec.domains.get_mut("gpu").unwrap().reserved.insert("pending-1".into(), old);
            w.save(&rec);
        },
        when: |w| w.host().gc().into_lines(),
        says: None,
        then: |w, what| {
            let shm = w.host().mps_dirs(&uuid(0), "gpu").shm;
            assert!(!crate::host::mps::is_mount_point(&shm), "{what}");
            assert!(!w.cfg.state_dir.join("mps").exists(), "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
}

/// What a spec edit learns from its reservation: the limits a live domain already enforces (it
/// has a daemon, or clients), and nothing for a domain that only holds reservations.
#[test]
fn a_reservation_returns_the_limits_of_a_live_domain_only() {
    if !can_mount() {
        return;
    }
    let reserved = |edit: fn(&mut Record)| {
        let w = World::new(Isolation::Gpu, ONE_GPU);
        w.given(&gpu_plan(&w, "c1"));
        let mut rec = w.record(0).expect("record");
        edit(&mut rec);
        w.save(&rec);
        let plan = gpu_plan(&w, "c2");
        let host = w.host();
        let enforced = host
            .reserve(&plan.gpus[0], plan.domain.as_ref().unwrap(), "pending-1")
            .expect("reserve");
        enforced
    };
    assert_eq!(reserved(|_| {}), Some(POLICY), "a daemon and a client");
    assert_eq!(
        reserved(|r| r.clients.clear()),
        Some(POLICY),
        "a daemon, no client"
    );
    assert_eq!(
        reserved(|r| r.domains.get_mut("gpu").unwrap().daemon = None),
        Some(POLICY),
        "a client, no daemon recorded"
    );
    assert_eq!(
        reserved(|r| {
            r.clients.clear();
            r.domains.get_mut("gpu").unwrap().daemon = None;
        }),
        None,
        "neither"
    );
}
