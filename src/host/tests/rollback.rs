//! Acquires that fail part-way: every record, daemon, directory and compute mode is put back.

use super::rows::*;
use super::world::*;
use crate::host::fakes::uuid;
use crate::host::state::{Domain, Record};
use crate::vocab::{Isolation, Mode};

rows! {
    run_acquire_row;
    setting_the_compute_mode_fails_no_daemon_no_record_mode_as_it_was: AcquireRow {
        what: "setting the compute mode fails: no daemon, no record, mode as it was",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.inv.fail_set(0, true),
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("injected: cannot set the compute mode of GPU 0"),
        then: |w, what| {
            assert!(w.ctl.actions().is_empty(), "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    the_daemon_does_not_start_compute_mode_put_back_record_and_directories_gone: AcquireRow {
        what: "the daemon does not start: compute mode put back, record and directories gone",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.ctl.fail_start(true),
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("did not answer within"),
        then: |w, what| {
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE), (0, DEFAULT)], "{what}");
            assert!(!w.domain_dir(0, "gpu").exists(), "{what}");
        },
    },
    setting_the_daemons_defaults_fails_the_daemon_is_stopped_mode_put_back: AcquireRow {
        what: "setting the daemon's defaults fails: the daemon is stopped, mode put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.ctl.fail_set_defaults(true),
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("injected failure"),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/gpu", "set_defaults GPU-0/gpu", "stop GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE), (0, DEFAULT)], "{what}");
            assert!(!w.domain_dir(0, "gpu").exists(), "{what}");
        },
    },
    the_final_save_fails_the_daemon_is_stopped_no_record: AcquireRow {
        what: "the final save fails: the daemon is stopped, no record",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            w.state().ensure().unwrap();
            block_saves(&w.state(), 0);
        },
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("cannot write"),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/gpu", "set_defaults GPU-0/gpu", "stop GPU-0/gpu"],
                "{what}"
            );
        },
    },
    the_save_after_a_compute_mode_change_fails_mode_put_back_daemon_stopped_write: AcquireRow {
        what: "the save after a compute-mode change fails: mode put back, daemon stopped, write-ahead record removed",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.block_saves_after_set.set(true),
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("cannot write"),
        then: |w, what| {
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE), (0, DEFAULT)], "{what}");
            assert!(w.ctl.actions().contains(&"stop GPU-0/gpu".to_owned()), "{what}");
        },
    },
    a_joiner_whose_save_fails_leaves_the_first_clients_daemon_running: AcquireRow {
        what: "a joiner whose save fails leaves the first client's daemon running",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            block_saves(&w.state(), 0);
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: Some("cannot write"),
        then: |w, what| {
            assert!(!w.ctl.actions().iter().any(|a| a.starts_with("stop")), "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    restarting_a_dead_daemon_fails_the_record_still_names_the_dead_one: AcquireRow {
        what: "restarting a dead daemon fails: the record still names the dead one",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let d = w.daemon(0, "gpu").unwrap();
            w.ctl.kill(d);
            w.ctl.fail_start(true);
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: Some("did not answer"),
        then: |w, what| {
            assert_eq!(w.clients(0), ["c1"], "{what}");
            assert!(w.daemon(0, "gpu").is_some(), "{what}");
            assert!(w.domain_dir(0, "gpu").exists(), "{what}");
        },
    },
    the_second_gpus_compute_mode_cannot_be_set_the_first_gpus_daemon_mode_and_record: AcquireRow {
        what: "the second GPU's compute mode cannot be set: the first GPU's daemon, mode and record are undone",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: |w| w.inv.fail_set(1, true),
        when: |w| w.acquire(&mps(&w.cfg, "c1", &[0, 1], ASK)),
        err: Some("GPU 1"),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/gpu", "set_defaults GPU-0/gpu", "stop GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE), (1, EXCLUSIVE), (0, DEFAULT)], "{what}");
        },
    },
    the_second_gpus_daemon_does_not_start_a_daemon_the_first_gpu_already_had_keeps: AcquireRow {
        what: "the second GPU's daemon does not start: a daemon the first GPU already had keeps running",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.ctl.fail_start(true);
        },
        when: |w| w.acquire(&mps(&w.cfg, "c2", &[0, 1], ASK)),
        err: Some("did not answer"),
        then: |w, what| {
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
            assert_eq!(w.inv.sets(), [(1, EXCLUSIVE), (1, DEFAULT)], "{what}");
        },
    },
    timeslice_nvidia_smi_missing_is_refused_naming_it_the_compute_mode_put_back: AcquireRow {
        what: "timeslice: nvidia-smi missing is refused naming it, the compute mode put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| w.cfg.timeslice.smi = "/nonexistent/nvidia-smi".into(),
        when: |w| {
            let mut plan = plain("c1", Mode::Timeslice, &[0]);
            plan.timeslice = Some(crate::vocab::Timeslice::Long);
            w.acquire(&plan)
        },
        err: Some("\"/nonexistent/nvidia-smi\" not found"),
        then: |w, what| assert_eq!(w.inv.sets(), [(0, DEFAULT), (0, EXCLUSIVE)], "{what}"),
    },
    timeslice_nvidia_smi_failing_is_refused_the_compute_mode_put_back: AcquireRow {
        what: "timeslice: nvidia-smi failing is refused, the compute mode put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| w.cfg.timeslice.smi = "false".into(),
        when: |w| {
            let mut plan = plain("c1", Mode::Timeslice, &[0]);
            plan.timeslice = Some(crate::vocab::Timeslice::Short);
            w.acquire(&plan)
        },
        err: Some("--set-timeslice failed on GPU 0"),
        then: |w, what| assert_eq!(w.inv.sets(), [(0, DEFAULT), (0, EXCLUSIVE)], "{what}"),
    },
    a_gpu_whose_lock_another_hook_holds_timed_out_naming_the_holder_nothing_changed: AcquireRow {
        what: "a GPU whose lock another hook holds: timed out naming the holder, nothing changed",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.hold_lock(0),
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("held by pid"),
        then: |w, what| assert!(w.ctl.calls().is_empty(), "{what}"),
    },
    the_second_gpus_lock_is_held_the_first_gpu_is_rolled_back: AcquireRow {
        what: "the second GPU's lock is held: the first GPU is rolled back",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: |w| w.hold_lock(1),
        when: |w| w.acquire(&mps(&w.cfg, "c1", &[0, 1], ASK)),
        err: Some("waiting for the lock on GPU GPU-1"),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/gpu", "set_defaults GPU-0/gpu", "stop GPU-0/gpu"],
                "{what}"
            );
            // The first GPU's record, saved with the client, is put back: there was none.
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    a_corrupt_record_is_refused_with_what_to_do_and_left_as_it_is: AcquireRow {
        what: "a corrupt record is refused with what to do, and left as it is",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.state().ensure().unwrap();
            std::fs::write(w.state().record_path(&uuid(0)), b"{not json").unwrap();
        },
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("is corrupt; run `gpushare-hook gc`, which keeps it aside"),
        then: |w, what| assert!(w.ctl.calls().is_empty(), "{what}"),
    },
    group_isolation_a_second_domain_that_fails_to_start_leaves_the_first_domain: AcquireRow {
        what: "group isolation: a second domain that fails to start leaves the first domain alone",
        isolation: Isolation::Group,
        modes: ONE_GPU,
        given: |w| {
            w.given(&group_plan(w, "c1", "a"));
            w.ctl.fail_set_defaults(true);
        },
        when: |w| w.acquire(&group_plan(w, "c2", "b")),
        err: Some("injected failure"),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/g-b", "set_defaults GPU-0/g-b", "stop GPU-0/g-b"],
                "{what}"
            );
            assert!(w.domain_dir(0, "g-a").exists(), "{what}");
        },
    },
}

/// Rolling back an acquire that adopted a daemon must not take that daemon's directories
/// (its control socket) away from it.
#[test]
fn acquire_rollback_after_adoption() {
    run_acquire_row(AcquireRow {
        what: "an adopted daemon whose save fails is left running, with its directories",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            let mut rec = Record::new(&uuid(0), 0);
            rec.restore_compute_mode = Some(DEFAULT);
            rec.domains.insert("gpu".into(), Domain::new(POLICY));
            w.save(&rec);
            std::fs::create_dir_all(w.pipe(0, "gpu")).unwrap();
            w.ctl.add_daemon(&w.pipe(0, "gpu"), POLICY);
            block_saves(&w.state(), 0);
        },
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: Some("cannot write"),
        then: |w, what| assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}"),
    });
}
