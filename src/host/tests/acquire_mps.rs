//! Acquiring mps shares: daemons started, joined, checked, adopted and replaced; domain
//! admission; compute modes; isolation levels.

use super::logged;
use super::rows::*;
use super::world::*;
use crate::host::fakes::{uuid, Call};
use crate::host::procinfo::ProcId;
use crate::host::state::{Domain, Record};
use crate::vocab::{Isolation, Limits};

rows! {
    run_acquire_row;
    first_client_starts_a_daemon_with_the_domains_limits_compute_mode_recorded_then: AcquireRow {
        what: "first client starts a daemon with the domain's limits, compute mode recorded then set",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: nothing,
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["start GPU-0/gpu", "set_defaults GPU-0/gpu"], "{what}");
            assert!(w.ctl.calls().contains(&crate::host::fakes::Call::SetDefaults {
                at: "GPU-0/gpu".into(),
                limits: POLICY
            }), "{what}");
            assert_eq!(w.ctl.defaults_on(&w.pipe(0, "gpu")), Some(POLICY), "{what}");
            assert_eq!(w.inv.sets(), [(0, EXCLUSIVE)], "{what}");
            // Write-ahead: the record said what to restore before the mode changed.
            assert_eq!(*w.at_set.borrow(), [(0, EXCLUSIVE, Some(DEFAULT))], "{what}");
            let rec = w.record(0).expect("record");
            assert_eq!(rec.restore_compute_mode, Some(DEFAULT), "{what}");
            let d = &rec.domains["gpu"];
            assert_eq!(d.limits, POLICY, "{what}");
            assert_eq!(d.uid, Some(1000), "{what}");
            assert_eq!(d.daemon.as_ref().map(|d| d.process), w.ctl.daemon_on(&w.pipe(0, "gpu")), "{what}");
            assert_eq!(rec.clients["c1"].domain.as_deref(), Some("gpu"), "{what}");
            assert_eq!(rec.clients["c1"].process, Some(w.me), "{what}");
            // It named no limit: it is listed with its domain's, in bytes.
            assert_eq!(rec.clients["c1"].cores, POLICY.cores, "{what}");
            assert_eq!(rec.clients["c1"].memory, Some(1 << 30), "{what}");
        },
    },
    first_client_on_a_gpu_already_exclusive_no_mode_change_nothing_to_restore: AcquireRow {
        what: "first client on a GPU already exclusive: no mode change, nothing to restore",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: nothing,
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["start GPU-0/gpu", "set_defaults GPU-0/gpu"], "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.record(0).unwrap().restore_compute_mode, None, "{what}");
        },
    },
    exclusive_compute_mode_false_the_compute_mode_is_left_alone: AcquireRow {
        what: "exclusive_compute_mode = false: the compute mode is left alone",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.cfg.mps.exclusive_compute_mode = false,
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["start GPU-0/gpu", "set_defaults GPU-0/gpu"], "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
        },
    },
    second_client_joins_no_start_one_refresh_with_the_domains_limits: AcquireRow {
        what: "second client joins: no start, one refresh with the domain's limits",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
            assert!(w.ctl.calls().contains(&crate::host::fakes::Call::Refresh {
                at: "GPU-0/gpu".into(),
                limits: POLICY
            }), "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
        },
    },
    the_same_container_acquired_twice_is_one_client: AcquireRow {
        what: "the same container acquired twice is one client",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
            assert_eq!(w.clients(0), ["c1"], "{what}");
        },
    },
    defaults_a_tenant_changed_are_put_back_by_the_next_acquire_in_the_domain: AcquireRow {
        what: "defaults a tenant changed are put back by the next acquire in the domain",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.ctl.drift(&w.pipe(0, "gpu"), Limits { cores: 100, memory_mib: None });
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.defaults_on(&w.pipe(0, "gpu")), Some(POLICY), "{what}");
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
        },
    },
    a_dead_daemon_is_stopped_and_a_new_one_started_for_the_next_client: AcquireRow {
        what: "a dead daemon is stopped and a new one started for the next client",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let d = w.daemon(0, "gpu").unwrap();
            w.ctl.kill(d);
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            let d = w.daemon(0, "gpu").unwrap();
            assert!(d.is_alive(), "{what}");
            assert_eq!(Some(d), w.ctl.daemon_on(&w.pipe(0, "gpu")), "{what}");
            // The GPU is still exclusive from the first start: no second change.
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
        },
    },
    a_live_daemon_that_does_not_answer_in_time_is_replaced_by_a_joining_acquire: AcquireRow {
        what: "a live daemon that does not answer in time is replaced by a joining acquire",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            w.ctl.hang(&w.pipe(0, "gpu"), true);
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["refresh GPU-0/gpu", "stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
        },
    },
    a_domain_whose_control_socket_another_process_holds_is_tampered_with_its_daemon: AcquireRow {
        what: "a domain whose control socket another process holds is tampered with: its daemon is restarted, the other process is left alone",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let tenant = w.ctl.tamper(&w.pipe(0, "gpu"));
            std::fs::write(w.pipe(0, "gpu").join("tenant-pid"), tenant.pid.to_string()).unwrap();
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["refresh GPU-0/gpu", "stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            // The stop named only the recorded daemon.
            let old = w.ctl.calls().into_iter().find_map(|c| match c {
                Call::Stop { daemon, .. } => daemon,
                _ => None,
            });
            let tenant: i32 = std::fs::read_to_string(w.pipe(0, "gpu").join("tenant-pid"))
                .map_or(0, |t| t.parse().unwrap());
            assert_ne!(old, Some(tenant), "{what}");
            assert!(ProcId::of(tenant).is_some_and(|p| p.is_alive()), "{what}: the tenant's process is not signalled");
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
        },
    },
    an_unrecorded_answering_daemon_hook_killed_between_start_and_save_is_adopted_not: AcquireRow {
        what: "an unrecorded answering daemon (hook killed between start and save) is adopted, not duplicated",
        isolation: Isolation::Gpu,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| {
            // The write-ahead record such a hook leaves, and its daemon.
            let mut rec = Record::new(&uuid(0), 0);
            rec.restore_compute_mode = Some(DEFAULT);
            rec.domains.insert("gpu".into(), Domain::new(POLICY));
            w.save(&rec);
            w.ctl.add_daemon(&w.pipe(0, "gpu"), POLICY);
        },
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["set_defaults GPU-0/gpu"], "{what}");
            assert_eq!(w.daemon(0, "gpu"), w.ctl.daemon_on(&w.pipe(0, "gpu")), "{what}");
            assert!(w.daemon(0, "gpu").is_some(), "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
            assert_eq!(w.record(0).unwrap().restore_compute_mode, Some(DEFAULT), "{what}");
        },
    },
    an_unrecorded_daemon_that_does_not_answer_is_stopped_and_a_new_one_started: AcquireRow {
        what: "an unrecorded daemon that does not answer is stopped and a new one started",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.ctl.add_daemon(&w.pipe(0, "gpu"), POLICY);
            w.ctl.hang(&w.pipe(0, "gpu"), true);
        },
        when: |w| w.acquire(&gpu_plan(w, "c1")),
        err: None,
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["set_defaults GPU-0/gpu", "stop GPU-0/gpu", "start GPU-0/gpu", "set_defaults GPU-0/gpu"],
                "{what}"
            );
            assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}");
        },
    },
    a_stale_client_process_gone_is_dropped_by_the_next_acquire: AcquireRow {
        what: "a stale client (process gone) is dropped by the next acquire",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            let dead = w.ctl.dead_process();
            w.host().acquire(&gpu_plan(w, "gone"), Some(dead), None).unwrap();
        },
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(w.clients(0), ["c2"], "{what}");
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
        },
    },
    admission_a_request_below_the_domains_enforced_limits_joins: AcquireRow {
        what: "admission: a request below the domain's enforced limits joins",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| {
            let ask = Ask { cores: Some(40), memory_mib: Some(512), ..ASK };
            w.acquire(&mps(&w.cfg, "c2", &[0], ask))
        },
        err: None,
        then: |w, what| {
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
            assert_eq!(w.record(0).unwrap().domains["gpu"].limits, POLICY, "{what}");
        },
    },
    admission_a_request_equal_to_the_domains_enforced_limits_joins: AcquireRow {
        what: "admission: a request equal to the domain's enforced limits joins",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| {
            let ask = Ask { cores: Some(50), memory_mib: Some(1024), ..ASK };
            w.acquire(&mps(&w.cfg, "c2", &[0], ask))
        },
        err: None,
        then: |w, what| assert_eq!(w.clients(0), ["c1", "c2"], "{what}"),
    },
    admission_more_cores_than_the_domain_enforces_is_refused: AcquireRow {
        what: "admission: more cores than the domain enforces is refused",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { cores: Some(60), ..ASK })),
        err: Some("asks for gpu.share.cores=60 but MPS domain gpu on GPU GPU-0 enforces 50%"),
        then: |w, what| assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}"),
    },
    admission_more_memory_than_the_domain_enforces_is_refused: AcquireRow {
        what: "admission: more memory than the domain enforces is refused",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { memory_mib: Some(2048), ..ASK })),
        err: Some("asks for gpu.share.memory 2.0 GiB but MPS domain gpu on GPU GPU-0 enforces 1.0 GiB"),
        then: no_check,
    },
    admission_a_groups_limits_are_its_creators_a_joiner_above_them_is_refused: AcquireRow {
        what: "admission: a group's limits are its creator's; a joiner above them is refused",
        isolation: Isolation::Group,
        modes: ONE_GPU,
        given: |w| {
            let ask = Ask { cores: Some(30), group: Some("a"), ..ASK };
            w.given(&mps(&w.cfg, "c1", &[0], ask));
        },
        when: |w| {
            let ask = Ask { cores: Some(40), group: Some("a"), ..ASK };
            w.acquire(&mps(&w.cfg, "c2", &[0], ask))
        },
        err: Some("enforces 30%"),
        then: no_check,
    },
    a_second_uid_is_refused_without_a_multi_user_server: AcquireRow {
        what: "a second uid is refused without a multi-user server",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { uid: 1001, ..ASK })),
        err: Some("runs as uid 1001 but MPS domain gpu on GPU GPU-0 serves uid 1000"),
        then: no_check,
    },
    a_second_uid_joins_with_a_multi_user_server_which_was_started_as_one: AcquireRow {
        what: "a second uid joins with a multi-user server, which was started as one",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.cfg.mps.multiuser = true;
            w.given(&gpu_plan(w, "c1"));
            assert!(w.ctl.calls().contains(&crate::host::fakes::Call::Start {
                at: "GPU-0/gpu".into(),
                multiuser: true
            }));
        },
        when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { uid: 1001, ..ASK })),
        err: None,
        then: |w, what| assert_eq!(w.clients(0), ["c1", "c2"], "{what}"),
    },
    group_isolation_two_domains_on_one_gpu_get_two_daemons_compute_mode_default: AcquireRow {
        what: "group isolation: two domains on one GPU get two daemons, compute mode DEFAULT",
        isolation: Isolation::Group,
        modes: ONE_GPU_EXCLUSIVE,
        given: |w| w.given(&group_plan(w, "c1", "a")),
        when: |w| w.acquire(&group_plan(w, "c2", "b")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.actions(), ["start GPU-0/g-b", "set_defaults GPU-0/g-b"], "{what}");
            assert_eq!(w.ctl.live(), ["GPU-0/g-a", "GPU-0/g-b"], "{what}");
            assert_eq!(w.inv.modes(), [(0, DEFAULT)], "{what}");
            let rec = w.record(0).unwrap();
            assert_eq!(rec.restore_compute_mode, Some(EXCLUSIVE), "{what}");
            assert_eq!(rec.domain_clients("g-a"), ["c1"], "{what}");
            assert_eq!(rec.domain_clients("g-b"), ["c2"], "{what}");
            assert_ne!(w.daemon(0, "g-a"), w.daemon(0, "g-b"), "{what}");
        },
    },
    container_isolation_each_container_its_own_daemon: AcquireRow {
        what: "container isolation: each container its own daemon",
        isolation: Isolation::Container,
        modes: ONE_GPU,
        given: |w| w.given(&gpu_plan(w, "c1")),
        when: |w| w.acquire(&gpu_plan(w, "c2")),
        err: None,
        then: |w, what| {
            assert_eq!(w.ctl.live(), ["GPU-0/c-c1", "GPU-0/c-c2"], "{what}");
            assert!(w.inv.sets().is_empty(), "{what}");
        },
    },
    two_gpus_a_daemon_on_each_in_index_order: AcquireRow {
        what: "two GPUs: a daemon on each, in index order",
        isolation: Isolation::Gpu,
        modes: TWO_GPUS,
        given: nothing,
        when: |w| w.acquire(&mps(&w.cfg, "c1", &[1, 0], ASK)),
        err: None,
        then: |w, what| {
            assert_eq!(
                w.ctl.actions(),
                ["start GPU-0/gpu", "set_defaults GPU-0/gpu", "start GPU-1/gpu", "set_defaults GPU-1/gpu"],
                "{what}"
            );
            assert_eq!(w.inv.modes(), [(0, EXCLUSIVE), (1, EXCLUSIVE)], "{what}");
        },
    },
    a_daemon_left_running_without_clients_keeps_its_limits_for_the_next: AcquireRow {
        what: "a policy domain whose daemon runs with no client left: the next container joins it with the limits the daemon has, not newer ones",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let mut rec = w.record(0).expect("record");
            rec.clients.clear();
            w.save(&rec);
        },
        when: |w| w.acquire(&with_domain_limits(gpu_plan(w, "c2"), NEWER)),
        err: None,
        then: |w, what| {
            let rec = w.record(0).expect("record");
            assert_eq!(rec.domains["gpu"].limits, POLICY, "{what}");
            assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"], "{what}");
        },
    },
    a_domain_with_clients_but_no_recorded_daemon_keeps_its_limits: AcquireRow {
        what: "a domain with a live client but no daemon in the record: a new daemon gets the domain's limits, not the newcomer's",
        isolation: Isolation::Gpu,
        modes: ONE_GPU,
        given: |w| {
            w.given(&gpu_plan(w, "c1"));
            let mut rec = w.record(0).expect("record");
            rec.domains.get_mut("gpu").expect("domain").daemon = None;
            w.save(&rec);
        },
        when: |w| w.acquire(&with_domain_limits(gpu_plan(w, "c2"), NEWER)),
        err: None,
        then: |w, what| {
            let rec = w.record(0).expect("record");
            assert_eq!(rec.domains["gpu"].limits, POLICY, "{what}");
            assert_eq!(w.clients(0), ["c1", "c2"], "{what}");
        },
    },
}

/// Limits a policy changed to since the domain's daemon started.
const NEWER: Limits = Limits {
    cores: 30,
    memory_mib: Some(512),
};

/// `plan` as a front half that read a newer policy would make it.
fn with_domain_limits(
    mut plan: crate::decide::plan::Plan,
    limits: Limits,
) -> crate::decide::plan::Plan {
    plan.domain.as_mut().expect("an mps plan").limits = limits;
    plan
}

/// A group domain whose only client is gone (its process ended, no poststop yet) still has
/// its daemon; the next container of the group creates the domain anew, so its request sets
/// the limits (DESIGN: "the request of the container that created it").
#[test]
fn acquire_group_left_by_a_stale_creator_takes_the_next_creators_limits() {
    run_acquire_row(AcquireRow {
        what: "the next creator of a group whose last client is stale sets its limits",
        isolation: Isolation::Group,
        modes: ONE_GPU,
        given: |w| {
            let ask = Ask {
                cores: Some(30),
                group: Some("a"),
                ..ASK
            };
            w.given(&mps(&w.cfg, "c1", &[0], ask));
            let mut rec = w.record(0).unwrap();
            rec.clients.get_mut("c1").unwrap().process = Some(w.ctl.dead_process());
            w.save(&rec);
        },
        when: |w| {
            let ask = Ask {
                cores: Some(60),
                group: Some("a"),
                ..ASK
            };
            w.acquire(&mps(&w.cfg, "c2", &[0], ask))
        },
        err: None,
        then: |w, what| {
            let want = Limits {
                cores: 60,
                memory_mib: Some(1024),
            };
            let rec = w.record(0).unwrap();
            assert_eq!(rec.domains["g-a"].limits, want, "{what}");
            assert_eq!(w.ctl.defaults_on(&w.pipe(0, "g-a")), Some(want), "{what}");
            assert_eq!(w.clients(0), ["c2"], "{what}");
        },
    });
}

/// An MPS control that counts [`MpsControl::flush`] calls and does the rest with the fake.
/// (The fake and NVIDIA's control send everything at once, so their `flush` does nothing; a
/// control that defers what it sends, as the real one once did, depends on `Host::flush`.)
struct CountsFlushes<'a> {
    fake: &'a crate::host::fakes::FakeControl,
    flushes: std::rc::Rc<std::cell::Cell<u32>>,
}

impl crate::host::mps::MpsControl for CountsFlushes<'_> {
    fn binary(&self) -> &std::path::Path {
        self.fake.binary()
    }
    fn start(
        &self,
        uuid: &str,
        dirs: &crate::host::mps::MpsDirs,
        multiuser: bool,
        ready_timeout: std::time::Duration,
    ) -> Result<ProcId, crate::host::mps::MpsError> {
        self.fake.start(uuid, dirs, multiuser, ready_timeout)
    }
    fn answers(&self, pipe: &std::path::Path, daemon: ProcId) -> bool {
        self.fake.answers(pipe, daemon)
    }
    fn refresh(
        &self,
        pipe: &std::path::Path,
        daemon: ProcId,
        limits: &Limits,
    ) -> Result<(), crate::host::mps::MpsError> {
        self.fake.refresh(pipe, daemon, limits)
    }
    fn set_defaults(
        &self,
        pipe: &std::path::Path,
        daemon: ProcId,
        limits: &Limits,
    ) -> Result<(), crate::host::mps::MpsError> {
        self.fake.set_defaults(pipe, daemon, limits)
    }
    fn defaults(
        &self,
        pipe: &std::path::Path,
        daemon: ProcId,
    ) -> Result<Limits, crate::host::mps::MpsError> {
        self.fake.defaults(pipe, daemon)
    }
    fn flush(&self) {
        self.flushes.set(self.flushes.get() + 1);
    }
    fn stop(&self, pipe: &std::path::Path, daemon: Option<ProcId>) {
        self.fake.stop(pipe, daemon);
    }
    fn find_daemon(&self, pipe: &std::path::Path) -> Option<ProcId> {
        self.fake.find_daemon(pipe)
    }
}

/// `Host::flush` (called once the container is set up, and by the reaper) hands the control
/// its turn to send what it deferred: once per call, and never during the acquire itself.
#[test]
fn host_flush_lets_the_control_send_what_it_deferred() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.given(&gpu_plan(&w, "c1"));
    let flushes = std::rc::Rc::new(std::cell::Cell::new(0));
    let ctl = CountsFlushes {
        fake: &w.ctl,
        flushes: flushes.clone(),
    };
    let host = crate::host::acquire::Host::with_control(&w.cfg, &w.inv, Box::new(ctl));
    w.clear();
    // c2 joins the running daemon, which is asked to put its defaults back.
    host.acquire(&gpu_plan(&w, "c2"), Some(w.me), None)
        .expect("acquire");
    assert_eq!(w.ctl.actions(), ["refresh GPU-0/gpu"]);
    assert_eq!(flushes.get(), 0, "flushed under the GPU's lock");
    host.flush();
    assert_eq!(flushes.get(), 1, "Host::flush did not reach the control");
}

/// The operator's evidence that a domain was tampered with is the node log: an error that names
/// the GPU, the domain and its containers, and says the daemon is restarted.
#[test]
fn a_tampered_daemon_s_replacement_is_logged_as_an_error_with_its_containers() {
    let w = World::new(Isolation::Gpu, ONE_GPU);
    w.given(&gpu_plan(&w, "c1"));
    w.ctl.tamper(&w.pipe(0, "gpu"));
    w.clear();
    let log = logged(|| w.acquire(&gpu_plan(&w, "c2")).expect("acquire"));
    // Positive control: the daemon really was replaced.
    assert_eq!(
        w.ctl.actions(),
        [
            "refresh GPU-0/gpu",
            "stop GPU-0/gpu",
            "start GPU-0/gpu",
            "set_defaults GPU-0/gpu"
        ]
    );
    let line = log
        .lines()
        .find(|l| l.contains("tampered with"))
        .unwrap_or_else(|| panic!("no line about the tampering in:\n{log}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("MPS domain gpu of GPU 0"), "{line}");
    assert!(line.contains("restarting its daemon"), "{line}");
    assert!(line.contains("containers=c1"), "{line}");
}
