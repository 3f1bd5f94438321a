//! gc: what dead containers and killed hooks left is dropped, dead daemons restarted, unreadable
//! records rebuilt, compute modes nothing explains put back.

use super::rows::*;
use super::world::*;
use crate::host::fakes::uuid;
use crate::host::state::{Domain, Record};
use crate::vocab::{Isolation, Mode};

rows! {
    run_release_row;
    nothing_to_do_a_live_daemon_with_a_live_client_is_left_alone: ReleaseRow {
        what: "nothing to do: a live daemon with a live client is left alone",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.host().gc().into_lines(),
        says: Some(&[]),
        then: |w, what| {
            // Asked for an answer (and its defaults put back), nothing else.
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    a_domain_whose_control_socket_another_process_holds_is_restarted_by_gc_which: ReleaseRow {
        what: "a domain whose control socket another process holds is restarted by gc, which says so",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.ctl.tamper(&w.pipe(0, "gpu"));
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: replaced the MPS daemon of domain gpu, which was tampered with"]),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["refresh GPU-0/gpu", "stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    a_live_daemon_that_does_not_answer_hung_is_replaced_for_its_clients: ReleaseRow {
        what: "a live daemon that does not answer (hung) is replaced for its clients",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.ctl.hang(&w.pipe(0, "gpu"), true);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: replaced the MPS daemon of domain gpu, which did not answer, for 1 client(s)"]),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["refresh GPU-0/gpu", "stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
            let d = w.ctl.daemon_on(&w.pipe(0, "gpu")).expect("a daemon");
            assert!(crate::host::mps::MpsControl::answers(&w.ctl, &w.pipe(0, "gpu"), d), "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    a_dead_daemon_that_still_has_clients_is_restarted: ReleaseRow {
        what: "a dead daemon that still has clients is restarted",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let d = w.daemon(0, "gpu").unwrap();
            w.ctl.kill(d);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: restarted the dead MPS daemon of domain gpu for 1 client(s)"]),
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.ctl.defaults_on(&w.pipe(0, "gpu")), Some(POLICY), "{what}");
            let d = w.daemon(0, "gpu").unwrap();
            assert_eq!(Some(d), w.ctl.daemon_on(&w.pipe(0, "gpu")), "{what}");
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    a_dead_daemon_whose_clients_are_gone_too_clients_dropped_daemon_forgotten_mode: ReleaseRow {
        what: "a dead daemon whose clients are gone too: clients dropped, daemon forgotten, mode put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            let dead = w.ctl.dead_process();
            w.given(&gpu_plan(w, "c1"));
            let mut rec = w.record(0).unwrap();
            rec.clients.get_mut("c1").unwrap().process = Some(dead);
            w.save(&rec);
            let d = w.daemon(0, "gpu").unwrap();
            w.ctl.kill(d);
        },
        when: |w| w.host().gc().into_lines(),
        // It also puts the compute mode back without saying so; see
        // gc_reports_an_unrecorded_daemon_it_stops.
        says: None,
        then: |w, what| {
            assert!(!w.ctl.actions().iter().any(|a| a.starts_with("start")), "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
            assert!(!w.cfg.state_dir.join("mps").exists(), "{what}");
        },
    },
    a_stale_client_is_dropped_the_daemon_stays_for_the_live_one: ReleaseRow {
        what: "a stale client is dropped; the daemon stays for the live one",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            let dead = w.ctl.dead_process();
            w.given(&gpu_plan(w, "c1"));
            w.given(&gpu_plan(w, "c2"));
            let mut rec = w.record(0).unwrap();
            rec.clients.get_mut("c1").unwrap().process = Some(dead);
            w.save(&rec);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: dropped client c1, whose process is gone"]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
            assert_eq!(w.clients(0), ["c2"], "{what}");
        },
    },
    an_unreadable_record_is_kept_aside_and_rebuilt_from_the_running_daemon_which_is: ReleaseRow {
        what: "an unreadable record is kept aside and rebuilt from the running daemon, which is not stopped",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            std::fs::write(w.state().record_path(&uuid(0)), b"{not json").unwrap();
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["rebuilt from 1 running daemon(s)"]),
        then: |w, what| {
            assert!(w.ctl.actions().is_empty(), "{what}");
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
            assert!(w.domain_dir(0, "gpu").exists(), "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            let rec = w.record(0).expect("rebuilt record");
            assert!(rec.domains["gpu"].daemon.is_some(), "{what}");
            // The daemon's GPU is in EXCLUSIVE_PROCESS (its acquire set it): DEFAULT is what
            // to put back once it stops.
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
            assert_eq!(rec.restore_compute_mode, Some(DEFAULT), "{what}");
            let aside = std::fs::read_dir(w.state().gpus_dir())
                .unwrap()
                .flatten()
                .find(|e| e.file_name().to_string_lossy().contains(".quarantined-"))
                .expect("kept aside");
            assert_eq!(std::fs::read(aside.path()).unwrap(), b"{not json", "{what}");
        },
    },
    a_compute_mode_no_daemon_explains_is_put_back: ReleaseRow {
        what: "a compute mode no daemon explains is put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            let mut rec = Record::new(&uuid(0), 0);
            rec.restore_compute_mode = Some(DEFAULT);
            w.save(&rec);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: put back the compute mode no MPS daemon explains"]),
        then: |w, what| {
            assert_eq!(w.inv.sets(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    exclusive_process_without_a_record_is_put_back_under_a_policy_that_sets_it: ReleaseRow {
        what: "EXCLUSIVE_PROCESS without a record (the record lost) is put back under a policy that sets it",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: nothing,
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: put back compute mode DEFAULT (was EXCLUSIVE_PROCESS with no gpushare MPS daemon and no record of it)"]),
        then: |w, what| {
            assert_eq!(w.inv.sets(), [(0, DEFAULT)], "{what}");
            assert!(w.ctl.actions().is_empty(), "{what}");
        },
    },
    exclusive_process_a_record_explains_is_left_as_it_is: ReleaseRow {
        what: "EXCLUSIVE_PROCESS a record explains (a daemon with a client) is left as it is",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.host().gc().into_lines(),
        says: Some(&[]),
        then: |w, what| {
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
        },
    },
    exclusive_process_a_client_without_a_daemon_explains_is_left_as_it_is: ReleaseRow {
        what: "EXCLUSIVE_PROCESS a client without a daemon (a timeslice share) explains is left as it is",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&plain("t1", Mode::Timeslice, &[0]));
            // Set since by someone else: the record's client explains it, gc cannot tell.
            crate::vocab::Inventory::set_compute_mode(&w.inv, 0, EXCLUSIVE).unwrap();
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&[]),
        then: |w, what| {
            let rec = w.record(0).expect("record");
            assert!(!rec.has_daemon() && rec.restore_compute_mode.is_none(), "{what}: only the client explains it");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
        },
    },
    an_unreadable_record_gc_cannot_rebuild_is_left_alone_with_the_gpus_compute_mode: ReleaseRow {
        what: "an unreadable record gc cannot rebuild (its lock held) is left alone with the GPU's compute mode, and said once",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            w.hold_lock(0);
            std::fs::write(w.state().record_path(&uuid(0)), b"{not json").unwrap();
        },
        when: |w| w.host().gc().into_lines(),
        // Not also a lock timeout from the compute-mode sweep: it skips an unreadable record's GPU.
        says: Some(&["GPU-0: record unreadable"]),
        then: |w, what| {
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
            assert_eq!(std::fs::read(w.state().record_path(&uuid(0))).unwrap(), b"{not json", "{what}");
        },
    },
    exclusive_process_under_a_policy_that_never_sets_it_is_left_with_a_note: ReleaseRow {
        what: "EXCLUSIVE_PROCESS under a policy that never sets it is left as it is, with a note",
        isolation: Isolation::Group,
        modes: ONE_GPU_EXCLUSIVE,
        given: nothing,
        when: |w| w.host().gc().into_lines(),
        says: Some(&["GPU-0: note: compute mode EXCLUSIVE_PROCESS, which this policy never sets"]),
        then: |w, what| {
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE)], "{what}");
        },
    },
    a_hook_killed_between_start_and_save_the_unrecorded_daemon_is_stopped_and_the: ReleaseRow {
        what: "a hook killed between start and save: the unrecorded daemon is stopped and the mode put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            let mut rec = Record::new(&uuid(0), 0);
            rec.restore_compute_mode = Some(DEFAULT);
            rec.domains.insert("gpu".into(), Domain::new(POLICY));
            w.save(&rec);
            w.ctl.add_daemon(&w.pipe(0, "gpu"), POLICY);
        },
        when: |w| w.host().gc().into_lines(),
        // What gc says about it: gc_reports_an_unrecorded_daemon_it_stops.
        says: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/gpu"], "{what}");
            assert!(w.ctl.live().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.record(0), None, "{what}");
        },
    },
    leftover_domain_directories_without_a_record_their_unrecorded_daemon_is_stopped: ReleaseRow {
        what: "leftover domain directories without a record: their unrecorded daemon is stopped, the directories removed",
        isolation: Isolation::Group,
        modes: ONE_GPU,
        given: |w| {
            w.state().ensure().unwrap();
            std::fs::create_dir_all(w.pipe(0, "g-x")).unwrap();
            let dir = w.domain_dir(0, "g-x");
            std::fs::write(dir.join("owner"), format!("{} g-x", uuid(0))).unwrap();
            w.ctl.add_daemon(&w.pipe(0, "g-x"), POLICY);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&["stopped unrecorded MPS daemon pid", "removed leftover"]),
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["stop GPU-0/g-x"], "{what}");
            assert!(w.ctl.live().is_empty(), "{what}");
            assert!(!w.cfg.state_dir.join("mps").exists(), "{what}");
        },
    },
    a_fresh_reservation_keeps_a_domains_directories: ReleaseRow {
        what: "a fresh reservation keeps a domain's directories",
        isolation: Isolation::Group,
        modes: ONE_GPU,
        given: |w| {
            std::fs::create_dir_all(w.pipe(0, "g-x")).unwrap();
            let mut rec = Record::new(&uuid(0), 0);
            let mut d = Domain::new(POLICY);
            d.reserved.insert("pending-1".into(), crate::host::state::now_seconds());
            rec.domains.insert("g-x".into(), d);
            w.save(&rec);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&[]),
        then: |w, what| {
            assert!(w.domain_dir(0, "g-x").exists(), "{what}");
            assert!(w.record(0).is_some(), "{what}");
        },
    },
    restarting_fails_said_so_the_clients_kept_the_compute_mode_put_back: ReleaseRow {
        what: "restarting fails: said so, the clients kept, the compute mode put back",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let d = w.daemon(0, "gpu").unwrap();
            w.ctl.kill(d);
            w.ctl.fail_start(true);
        },
        when: |w| w.host().gc().into_lines(),
        says: Some(&[
            "GPU-0: cannot restart the MPS daemon of domain gpu",
            // No daemon runs on the GPU any more.
            "GPU-0: put back the compute mode no MPS daemon explains",
        ]),
        then: |w, what| {
            assert_eq!(w.clients(0), ["c1"], "{what}");
            assert!(w.ctl.live().is_empty(), "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            assert_eq!(w.daemon(0, "gpu"), None, "{what}");
        },
    },
}

/// A daemon gc restarts must enforce the domain's limits; one whose defaults cannot be set
/// must not be left serving the clients without them.
#[test]
fn gc_restart_that_cannot_set_defaults_leaves_no_unlimited_daemon() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.given(&gpu_plan(&w, "c1"));
    let d = w.daemon(0, "gpu").unwrap();
    w.ctl.kill(d);
    w.ctl.fail_set_defaults(true);
    let said = w.host().gc().into_lines();
    assert!(
        said.iter().any(|l| l.contains("cannot restart")),
        "{said:#?}"
    );
    let pipe = w.pipe(0, "gpu");
    assert!(
        w.ctl.daemon_on(&pipe).is_none() || w.ctl.defaults_on(&pipe) == Some(POLICY),
        "a daemon runs without the domain's limits: {:?}",
        w.ctl.defaults_on(&pipe)
    );
}

/// Clients whose daemon gc could not restart once are retried by the next gc.
#[test]
fn gc_retries_a_failed_restart() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.given(&gpu_plan(&w, "c1"));
    let d = w.daemon(0, "gpu").unwrap();
    w.ctl.kill(d);
    w.ctl.fail_start(true);
    let first = w.host().gc().into_lines();
    assert!(
        first.iter().any(|l| l.contains("cannot restart")),
        "{first:#?}"
    );
    w.ctl.fail_start(false);
    let second = w.host().gc().into_lines();
    assert!(
        second.iter().any(|l| l.contains("restarted")),
        "second gc: {second:#?}"
    );
    assert_eq!(w.ctl.live(), ["GPU-0/gpu"]);
}

/// gc returns "a line per thing it did": stopping a daemon the record misses and putting the
/// compute mode back are two such things.
#[test]
fn gc_reports_an_unrecorded_daemon_it_stops() {
    let w = World::new(Isolation::Gpu, ONE_GPU_EXCLUSIVE);
    let mut rec = Record::new(&uuid(0), 0);
    rec.restore_compute_mode = Some(DEFAULT);
    rec.domains.insert("gpu".into(), Domain::new(POLICY));
    w.save(&rec);
    let daemon = w.ctl.add_daemon(&w.pipe(0, "gpu"), POLICY);
    let said = w.host().gc().into_lines();
    assert!(!daemon.is_alive(), "the daemon was stopped");
    assert!(
        said.iter()
            .any(|l| l.contains("MPS daemon") && l.contains(&daemon.pid.to_string())),
        "no line about stopping pid {}: {said:#?}",
        daemon.pid
    );
    assert!(
        said.iter().any(|l| l.contains("compute mode")),
        "no line about the compute mode: {said:#?}"
    );
}

/// A domain directory being made (`.new-<pid>-…`, renamed into place once complete) is removed
/// by gc once the process making it is gone, and left while it lives.
#[test]
fn gc_removes_a_half_made_domain_directory_only_once_its_maker_is_gone() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    let root = w.state().mps_root();
    // A pid that is no process: beyond the kernel's largest.
    let gone = root.join(format!("{}{}-1", crate::host::mps::NEW_PREFIX, i32::MAX));
    let live = root.join(format!(
        "{}{}-1",
        crate::host::mps::NEW_PREFIX,
        std::process::id()
    ));
    for d in [&gone, &live] {
        std::fs::create_dir_all(d.join("pipe")).unwrap();
    }
    let said = w.host().gc().into_lines();
    assert!(
        !gone.exists(),
        "the dead maker's directory is removed: {said:#?}"
    );
    assert!(live.exists(), "the live maker's directory is left");
    assert_eq!(
        said.iter()
            .filter(|l| l.contains("of a killed acquire"))
            .count(),
        1,
        "one line, for the one it removed: {said:#?}"
    );
}

/// A domain directory's `owner` file is written by whoever can write there: gc reads a GPU id
/// from it only when it is a safe name, and otherwise leaves the directory alone (it takes no
/// lock, and says nothing).
#[test]
fn gc_leaves_a_domain_directory_whose_owner_names_no_safe_gpu_id() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    let dir = w.state().mps_root().join("planted");
    std::fs::create_dir_all(dir.join("pipe")).unwrap();
    std::fs::write(dir.join(crate::host::mps::OWNER_FILE), "../../escape gpu").unwrap();
    let said = w.host().gc().into_lines();
    assert!(said.is_empty(), "{said:#?}");
    assert!(dir.join("pipe").exists(), "left alone");
    assert!(
        !w.state().root().join("escape.lock").exists()
            && !w.state().gpus_dir().join("../../escape.lock").exists(),
        "no lock file taken outside the GPUs' directory"
    );
}

/// Per-container directories: gc removes the one of a container that is no client of any GPU,
/// keeps a client's and a young `pending-*` one (a precreate whose create has not come yet).
#[test]
fn gc_removes_the_directory_of_a_container_that_is_gone_and_keeps_the_others() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.given(&plain("live", Mode::Limit, &[0]));
    let sd = w.state();
    let pending = format!("{}young", crate::host::pending::PENDING_PREFIX);
    for id in ["live", "gone", pending.as_str()] {
        std::fs::create_dir_all(sd.container_dir(id)).unwrap();
        std::fs::write(sd.container_dir(id).join("limits"), "x").unwrap();
    }
    let said = w.host().gc().into_lines();
    assert!(!sd.container_dir("gone").exists(), "{said:#?}");
    assert!(
        sd.container_dir("live").exists(),
        "a client's directory is kept"
    );
    assert!(
        sd.container_dir(&pending).exists(),
        "a young pending directory is kept"
    );
    assert_eq!(
        said.iter()
            .filter(|l| l.contains("of a container that is gone"))
            .count(),
        1,
        "{said:#?}"
    );
}

/// The lock timeout is the policy's: an acquire waits for a GPU lock another hook holds for a
/// moment, and gets it.
#[test]
fn an_acquire_waits_for_a_lock_held_for_a_moment() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.state().ensure().unwrap();
    let held = w
        .state()
        .lock(
            &uuid(0),
            std::time::Duration::from_secs(1),
            "container other",
        )
        .expect("lock");
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(held);
    });
    let t = std::time::Instant::now();
    w.acquire(&plain("c1", Mode::Timeslice, &[0]))
        .expect("acquired once the lock was let go");
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(250),
        "it waited"
    );
    releaser.join().unwrap();
    assert_eq!(w.clients(0), ["c1"]);
}

/// Releasing a container touches only the GPUs that list it: a daemon another GPU's record
/// holds without clients is gc's to stop, not this release's.
#[test]
fn a_release_touches_only_the_gpus_that_list_the_container() {
    let w = World::new(Isolation::Gpu, TWO_GPUS);
    w.given(&gpu_plan(&w, "c1"));
    w.given(&mps(&w.cfg, "c2", &[1], ASK));
    let mut rec = w.record(1).expect("GPU 1's record");
    rec.clients.clear();
    w.save(&rec);
    w.clear();
    let warnings = w.host().release("c1");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        w.ctl.actions(),
        ["stop GPU-0/gpu"],
        "only GPU 0's daemon is stopped"
    );
    assert_eq!(w.ctl.live(), ["GPU-1/gpu"]);
}

/// A rebuilt record lists, as clients of the domain, the containers that have its pipe
/// directory mounted: here a process of this test's own, in a mount namespace of its own with
/// the pipe bound elsewhere (as a container has it).
#[test]
fn a_rebuilt_record_lists_the_containers_that_have_the_pipe_mounted() {
    if !super::can_mount("the gc rebuild test with a mount holder") {
        return;
    }
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.given(&gpu_plan(&w, "c1"));
    let at = tempfile::tempdir().unwrap();
    let holder = super::Binder::start(&w.pipe(0, "gpu"), at.path());
    std::fs::write(w.state().record_path(&uuid(0)), b"{not json").unwrap();
    let lines = w.host().gc().into_lines();
    let pid = holder.0.id();
    drop(holder);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("rebuilt from 1 running daemon(s) and 1 container(s)")),
        "{lines:#?}"
    );
    let rec = w.record(0).expect("rebuilt record");
    let rebuilt = format!("rebuilt-{pid}");
    assert_eq!(w.clients(0), [rebuilt.as_str()]);
    let c = &rec.clients[&rebuilt];
    assert_eq!(c.mode, Mode::Mps);
    assert_eq!(c.domain.as_deref(), Some("gpu"));
    assert_eq!(c.process.map(|p| p.pid), Some(pid as i32));
}
