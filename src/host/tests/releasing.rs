//! Releasing containers (poststop): daemons stopped when their last client leaves, compute
//! modes put back, stale clients dropped; and releases whose steps fail.

use super::rows::*;
use super::world::*;
use crate::host::fakes::uuid;
use crate::vocab::Isolation;

rows! {
    run_release_row;
    a_client_that_is_not_the_last_leaves_the_daemon_running: ReleaseRow {
        what: "a client that is not the last leaves the daemon running",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.given(&gpu_plan(w, "c2"));
        },
        when: |w| w.host().release("c1"),
        says: Some(&[]),
        then: |w, what| {
            assert!(w.ctl.actions().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c2"], "{what}");
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
        },
    },
    the_last_client_stops_the_daemon_restores_the_compute_mode_removes_record_and: ReleaseRow {
        what: "the last client stops the daemon, restores the compute mode, removes record and directories",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.host().release("c1"),
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert!(w.ctl.live().is_empty(), "{what}");
            assert_eq!(w.inv.sets(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
            assert!(!w.cfg.state_dir.join("mps").exists(), "{what}");
        },
    },
    release_is_idempotent_a_second_one_and_one_for_an_unknown_container_change: ReleaseRow {
        what: "release is idempotent: a second one, and one for an unknown container, change nothing",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.given(&gpu_plan(w, "c2"));
            w.host().release("c1");
        },
        when: |w| {
            let mut said = w.host().release("c1");
            said.extend(w.host().release("unknown"));
            said
        },
        says: Some(&[]),
        then: |w, what| {
            assert!(w.ctl.actions().is_empty(), "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c2"], "{what}");
        },
    },
    group_isolation_the_last_client_of_a_domain_stops_only_that_domains_daemon_the: ReleaseRow {
        what: "group isolation: the last client of a domain stops only that domain's daemon; the mode stays while another runs",
        isolation: Isolation::Group,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            w.given(&group_plan(w, "c1", "a"));
            w.given(&group_plan(w, "c2", "b"));
        },
        when: |w| w.host().release("c1"),
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/g-a"], "{what}");
            assert_eq!(w.ctl.live(), ["GPU-0/g-b"], "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert!(!w.domain_dir(0, "g-a").exists(), "{what}");
            assert!(w.domain_dir(0, "g-b").exists(), "{what}");
            let rec = w.record(0).unwrap();
            assert_eq!(rec.domains.keys().collect::<Vec<_>>(), ["g-b"], "{what}");
            assert_eq!(rec.restore_compute_mode, Some(EXCLUSIVE), "{what}");
        },
    },
    group_isolation_the_last_daemon_on_the_gpu_going_restores_the_compute_mode: ReleaseRow {
        what: "group isolation: the last daemon on the GPU going restores the compute mode",
        isolation: Isolation::Group,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            w.given(&group_plan(w, "c1", "a"));
            w.given(&group_plan(w, "c2", "b"));
            w.host().release("c1");
        },
        when: |w| w.host().release("c2"),
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/g-b"], "{what}");
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    stale_clients_are_dropped_with_the_released_one_and_the_daemon_stops: ReleaseRow {
        what: "stale clients are dropped with the released one, and the daemon stops",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            let dead = w.ctl.dead_process();
            // `gone` was live when it joined; its process ended since.
            w.given(&gpu_plan(w, "gone"));
            w.given(&gpu_plan(w, "c2"));
            let mut rec = w.record(0).unwrap();
            rec.clients.get_mut("gone").unwrap().process = Some(dead);
            w.save(&rec);
        },
        when: |w| w.host().release("c2"),
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    the_reaper_releases_an_exited_client_stops_its_daemon_and_says_what_it_did: ReleaseRow {
        what: "the reaper releases an exited client, stops its daemon and says what it did",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            let dead = w.ctl.dead_process();
            w.given(&gpu_plan(w, "gone"));
            let mut rec = w.record(0).unwrap();
            rec.clients.get_mut("gone").unwrap().process = Some(dead);
            w.save(&rec);
        },
        when: |w| w.host().release_exited(&uuid(0)).expect("release step"),
        says: Some(&[
            "GPU-0: dropped client gone, whose process is gone",
            "GPU-0: stopped the MPS daemon of domain gpu (pid",
            "of domain gpu, which nothing uses",
        ]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    the_reaper_leaves_a_live_client_and_its_daemon_and_says_nothing: ReleaseRow {
        what: "the reaper leaves a live client and its daemon, and says nothing",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.host().release_exited(&uuid(0)).expect("release step"),
        says: Some(&[]),
        then: |w, what| {
            assert!(w.ctl.actions().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    a_client_on_two_gpus_is_released_from_both: ReleaseRow {
        what: "a client on two GPUs is released from both",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: |w| w.given(&mps(&w.cfg, "c1", &[0, 1], ASK)),
        when: |w| w.host().release("c1"),
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu", "stop GPU-1/gpu"], "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT), (1, DEFAULT)], "{what}");
            assert_eq!((w.record(0), w.record(1)), (None, None), "{what}");
        },
    },
    an_unreadable_record_is_a_warning_not_a_failure_and_is_left_as_it_is: ReleaseRow {
        what: "an unreadable record is a warning, not a failure, and is left as it is",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: |w| {
            w.given(&mps(&w.cfg, "c1", &[0, 1], ASK));
            std::fs::write(w.state().record_path(&uuid(1)), b"{not json").unwrap();
        },
        when: |w| w.host().release("c1"),
        says: Some(&["GPU-1.json is corrupt"]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert_eq!(w.ctl.live(), ["GPU-1/gpu"], "{what}");
            assert_eq!(std::fs::read(w.state().record_path(&uuid(1))).unwrap(), b"{not json", "{what}");
        },
    },
}

rows! {
    run_release_row;
    the_compute_mode_cannot_be_put_back_the_daemon_stops_the_mode_to_restore_stays: ReleaseRow {
        what: "the compute mode cannot be put back: the daemon stops, the mode to restore stays recorded, gc puts it back later",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.inv.fail_set(0, true);
        },
        when: |w| {
            let mut said = w.host().release("c1");
            let rec = w.record(0).expect("record kept");
            assert_eq!(rec.restore_compute_mode, Some(DEFAULT));
            assert!(rec.clients.is_empty() && rec.domains.is_empty());
            w.inv.fail_set(0, false);
            said.extend(w.host().gc().into_lines());
            said
        },
        says: Some(&["GPU-0: put back the compute mode no MPS daemon explains"]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    a_gpu_whose_lock_another_hook_holds_release_warns_and_changes_nothing: ReleaseRow {
        what: "a GPU whose lock another hook holds: release warns and changes nothing",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.hold_lock(0);
        },
        when: |w| w.host().release("c1"),
        says: Some(&["timed out after 0s waiting for the lock on GPU GPU-0, held by pid"]),
        then: |w, what| {
            assert!(w.ctl.calls().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
        },
    },
    a_client_without_a_process_no_pid_from_the_runtime_is_never_taken_for_stale: ReleaseRow {
        what: "a client without a process (no pid from the runtime) is never taken for stale",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.host().acquire(&gpu_plan(w, "nopid"), None, None).unwrap();
            w.given(&gpu_plan(w, "c2"));
        },
        when: |w| {
            let mut said = w.host().release("c2");
            said.extend(w.host().gc().into_lines());
            said
        },
        says: Some(&[]),
        then: |w, what| {
            assert_eq!(w.clients(0), ["nopid"], "{what}");
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
        },
    },
}
