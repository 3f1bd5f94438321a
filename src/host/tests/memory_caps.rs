//! Memory caps in the doing layer, on the recording fakes: admission by the sum of caps, the
//! driver backend's limits set on acquire and cleared on release, gc and rollback, and a
//! refusal when the driver will not set them.

use std::path::PathBuf;

use crate::config::Config;
use crate::decide::plan::{Plan, PlannedGpu};
use crate::host::acquire::{AcquireError, Host};
use crate::host::fakes::{uuid, FakeControl, FakeInventory};
use crate::host::procinfo::ProcId;
use crate::host::state::StateDir;
use crate::vocab::memcap::{Backend, Enforcement, Uncapped, LIMIT_MAX};
use crate::vocab::{ComputeMode, Mode};

const GIB: u64 = 1 << 30;

struct World {
    dir: tempfile::TempDir,
    cfg: Config,
    inv: FakeInventory,
    ctl: FakeControl,
    me: ProcId,
}

impl World {
    fn new(gpus: u32, driver: Option<bool>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config {
            state_dir: dir.path().join("state"),
            lock_timeout_seconds: 5,
            ..Config::default()
        };
        let modes: Vec<(u32, ComputeMode)> = (0..gpus).map(|i| (i, ComputeMode::Default)).collect();
        let mut inv = FakeInventory::new(&modes).with_memory(80 * GIB);
        if let Some(fail) = driver {
            inv = inv.with_driver_limits(fail);
        }
        World {
            dir,
            cfg,
            inv,
            ctl: FakeControl::new(),
            me: ProcId::of(std::process::id() as i32).expect("own process"),
        }
    }

    fn host(&self) -> Host<'_> {
        Host::with_control(&self.cfg, &self.inv, Box::new(&self.ctl))
    }

    fn acquire(&self, plan: &Plan) -> Result<(), AcquireError> {
        self.host().acquire(plan, Some(self.me), None)
    }

    /// A cgroup directory of container `id` (it exists, as the container's would).
    fn cgroup(&self, id: &str) -> String {
        let p: PathBuf = self.dir.path().join("cgroup").join(id);
        std::fs::create_dir_all(&p).unwrap();
        p.display().to_string()
    }

    fn records(&self) -> Vec<Option<crate::host::state::Record>> {
        (0..2)
            .map(|i| StateDir::new(&self.cfg.state_dir).load(&uuid(i)).unwrap())
            .collect()
    }
}

fn plan(id: &str, mode: Mode, gpus: &[u32], cap: Option<u64>) -> Plan {
    Plan {
        container: id.to_owned(),
        mode,
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(o, &index)| PlannedGpu {
                index,
                uuid: uuid(index),
                ordinal: o as u32,
            })
            .collect(),
        memory: cap,
        cap,
        // No cgroup of its own: the limiter enforces a cap.
        enforcement: match cap {
            Some(_) => Enforcement {
                backend: Backend::Limiter,
                cgroup: None,
                why: Some("no cgroup of its own".into()),
            },
            None => crate::decide::enforce::uncapped(),
        },
        without_limiter: None,
        cores: 100,
        cores_explicit: false,
        timeslice: None,
        domain: None,
        uid: 0,
    }
}

fn driver(mut p: Plan, cgroup: &str) -> Plan {
    p.enforcement = Enforcement {
        backend: Backend::Driver,
        cgroup: Some(cgroup.to_owned()),
        why: None,
    };
    p
}

#[test]
fn caps_add_up_to_the_gpu_and_a_refusal_names_the_holders_and_changes_nothing() {
    let w = World::new(1, None);
    w.acquire(&plan("a", Mode::Timeslice, &[0], Some(48 * GIB)))
        .unwrap();
    // Positive control: what still fits is admitted.
    w.acquire(&plan("b", Mode::Limit, &[0], Some(32 * GIB)))
        .unwrap();
    let before = w.records();
    let e = w
        .acquire(&plan("c", Mode::Timeslice, &[0], Some(GIB)))
        .unwrap_err();
    assert!(matches!(e, AcquireError::Overcommitted(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("GPU 0 (GPU-0, 80.0 GiB)") && text.contains("a 48.0 GiB, b 32.0 GiB"),
        "{text}"
    );
    assert_eq!(w.records(), before, "a refusal leaves the record as it was");
    // The record keeps each cap, with the limiter as backend when the hook named none.
    let rec = before[0].clone().unwrap();
    let cap = rec.clients["a"].cap.clone().unwrap();
    assert_eq!(
        (cap.bytes, cap.enforcement.backend),
        (48 * GIB, Backend::Limiter)
    );
}

#[test]
fn uncapped_shares_share_by_default_and_caps_still_count() {
    let w = World::new(1, None);
    assert_eq!(
        w.cfg.policy.uncapped,
        Uncapped::Share,
        "the shipped default"
    );
    for i in 0..32 {
        w.acquire(&plan(&format!("u{i}"), Mode::Timeslice, &[0], None))
            .unwrap();
    }
    // Caps are admitted against the GPU's memory, next to any number of uncapped shares.
    w.acquire(&plan("a", Mode::Timeslice, &[0], Some(80 * GIB)))
        .unwrap();
    let e = w
        .acquire(&plan("b", Mode::Timeslice, &[0], Some(GIB)))
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("a 80.0 GiB"), "{text}");
    assert!(text.contains("u0 uncapped (reserves nothing)"), "{text}");
    // Positive control: the record holds all of them.
    let rec = w.records()[0].clone().unwrap();
    assert_eq!(rec.clients.len(), 33);
}

#[test]
fn whole_gpu_counts_an_uncapped_share_as_the_gpu_unless_overcommitted() {
    let mut w = World::new(1, None);
    w.cfg.policy.uncapped = Uncapped::WholeGpu;
    w.acquire(&plan("a", Mode::Timeslice, &[0], None)).unwrap();
    let e = w
        .acquire(&plan("b", Mode::Timeslice, &[0], Some(GIB)))
        .unwrap_err();
    assert!(
        e.to_string().contains("a uncapped (counts as 80.0 GiB)"),
        "{e}"
    );
    let e = w
        .acquire(&plan("b", Mode::Timeslice, &[0], None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("uncapped = \"whole-gpu\""), "{e}");
    assert!(
        !e.contains("Ask for"),
        "asked for nothing, told to ask for less: {e}"
    );
    w.cfg.policy.memory_overcommit = 2.0;
    w.acquire(&plan("b", Mode::Timeslice, &[0], None)).unwrap();
    let e = w
        .acquire(&plan("c", Mode::Timeslice, &[0], Some(GIB)))
        .unwrap_err();
    assert!(e.to_string().contains("memory_overcommit = 2"), "{e}");
}

#[test]
fn the_driver_backend_sets_the_limit_on_acquire_and_clears_it_on_release() {
    let w = World::new(2, Some(false));
    let cg = w.cgroup("c1");
    w.acquire(&driver(
        plan("c1", Mode::Timeslice, &[0, 1], Some(8 * GIB)),
        &cg,
    ))
    .unwrap();
    assert_eq!(
        w.inv.limit_sets(),
        vec![(0, cg.clone(), 0, 8 * GIB), (1, cg.clone(), 0, 8 * GIB)],
        "soft 0 and hard = the cap, on the container's cgroup, on each GPU"
    );
    let rec = w.records()[0].clone().unwrap();
    let cap = rec.clients["c1"].cap.clone().unwrap();
    assert_eq!(cap.enforcement.backend, Backend::Driver);
    assert_eq!(cap.enforcement.cgroup.as_deref(), Some(cg.as_str()));
    let warnings = w.host().release("c1");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        &w.inv.limit_sets()[2..],
        &[(0, cg.clone(), 0, LIMIT_MAX), (1, cg.clone(), 0, LIMIT_MAX)],
        "release clears with soft 0 and hard NVML_DEVICE_MEMORY_LIMIT_MAX"
    );
    // A cgroup that is gone has no limits left: nothing to clear, no call.
    let cg2 = w.cgroup("c2");
    w.acquire(&driver(plan("c2", Mode::Timeslice, &[0], Some(GIB)), &cg2))
        .unwrap();
    std::fs::remove_dir(&cg2).unwrap();
    let n = w.inv.limit_sets().len();
    w.host().release("c2");
    assert_eq!(w.inv.limit_sets().len(), n);
}

#[test]
fn a_cgroup_whose_driver_limit_another_container_holds_is_refused() {
    let w = World::new(1, Some(false));
    let cg = w.cgroup("c1");
    w.acquire(&driver(plan("c1", Mode::Timeslice, &[0], Some(GIB)), &cg))
        .unwrap();
    // A second container put into the same cgroup (its linux.cgroupsPath names c1's): the
    // driver's limit there is c1's, which a second limit would replace.
    let e = w
        .acquire(&driver(
            plan("c2", Mode::Timeslice, &[0], Some(2 * GIB)),
            &cg,
        ))
        .unwrap_err();
    assert!(
        matches!(&e, AcquireError::CgroupTaken { other, .. } if other == "c1"),
        "{e:?}"
    );
    assert_eq!(
        w.inv.limit_sets(),
        vec![(0, cg.clone(), 0, GIB)],
        "c1's limit untouched"
    );
    // Positive control: a cgroup of its own is served.
    let cg3 = w.cgroup("c3");
    w.acquire(&driver(plan("c3", Mode::Timeslice, &[0], Some(GIB)), &cg3))
        .unwrap();
    let rec = w.records()[0].clone().unwrap();
    assert_eq!(rec.clients.keys().collect::<Vec<_>>(), ["c1", "c3"]);
}

#[test]
fn a_driver_that_refuses_the_limit_refuses_the_container_and_undoes_the_other_gpus() {
    let w = World::new(2, Some(true));
    let cg = w.cgroup("c1");
    let e = w
        .acquire(&driver(plan("c1", Mode::Limit, &[0, 1], Some(GIB)), &cg))
        .unwrap_err();
    assert!(
        matches!(e, AcquireError::DriverLimit { index: 0, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("would run uncapped"), "{e}");
    // Positive control: the set was really asked for.
    assert_eq!(w.inv.limit_sets()[0], (0, cg.clone(), 0, GIB));
    assert_eq!(w.records(), vec![None, None], "nothing recorded");

    // GPU 0 takes the limit, GPU 1 refuses a second container: GPU 0's limit is cleared.
    let w = World::new(2, Some(false));
    let cg = w.cgroup("c1");
    // GPU 1 is full: the second GPU's admission fails after GPU 0's limit was set. GPU 0
    // already serves a capped share of its own (the limiter's, no cgroup): that limit is not
    // this container's, so the rollback still clears this one.
    w.acquire(&plan("big", Mode::Limit, &[1], Some(80 * GIB)))
        .unwrap();
    w.acquire(&plan("small", Mode::Limit, &[0], Some(GIB)))
        .unwrap();
    let e = w
        .acquire(&driver(plan("c1", Mode::Limit, &[0, 1], Some(GIB)), &cg))
        .unwrap_err();
    assert!(matches!(e, AcquireError::Overcommitted(_)), "{e:?}");
    assert_eq!(
        w.inv.limit_sets(),
        vec![(0, cg.clone(), 0, GIB), (0, cg.clone(), 0, LIMIT_MAX)],
        "the rollback clears the limit it set"
    );
    assert_eq!(
        w.records()[0]
            .as_ref()
            .map(|r| r.clients.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["small".to_owned()]),
        "GPU 0's record is as it was"
    );
}

#[test]
fn gc_clears_the_limits_of_containers_that_are_gone() {
    let w = World::new(1, Some(false));
    let cg = w.cgroup("gone");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let proc = ProcId::of(child.id() as i32).unwrap();
    w.host()
        .acquire(
            &driver(plan("gone", Mode::Timeslice, &[0], Some(GIB)), &cg),
            Some(proc),
            None,
        )
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let out = w.host().gc();
    assert!(
        out.actions
            .iter()
            .any(|l| l.contains("cleared the driver's memory limit of gone")),
        "{out:?}"
    );
    assert_eq!(
        w.inv.limit_sets().last(),
        Some(&(0, cg.clone(), 0, LIMIT_MAX))
    );
}

/// A cap whose container has exited holds nothing, even while the GPU's reaper has not
/// released it yet (a container restarted at once asks for its memory again).
#[test]
fn an_exited_cap_the_reaper_has_not_released_yet_holds_nothing() {
    let w = World::new(1, None);
    w.host()
        .acquire(
            &plan("old", Mode::Limit, &[0], Some(60 * GIB)),
            Some(w.ctl.dead_process()),
            None,
        )
        .expect("an acquire for a process that has exited meanwhile");
    let state = StateDir::new(&w.cfg.state_dir);
    super::world::reaper_runs(&state, w.me, 0);
    w.acquire(&plan("live", Mode::Limit, &[0], Some(10 * GIB)))
        .unwrap();
    let rec = state.load(&uuid(0)).unwrap().unwrap();
    assert_eq!(rec.clients.len(), 2, "the exited one left to the reaper");
    // Positive control: a live cap still counts, and the refusal names only it.
    let e = w
        .acquire(&plan("big", Mode::Limit, &[0], Some(71 * GIB)))
        .unwrap_err();
    assert!(matches!(e, AcquireError::Overcommitted(_)), "{e:?}");
    assert!(
        e.to_string().contains("live 10.0 GiB") && !e.to_string().contains("old 60"),
        "{e}"
    );

    w.acquire(&plan("new", Mode::Limit, &[0], Some(60 * GIB)))
        .expect("only an exited cap is in the way");
    let rec = state.load(&uuid(0)).unwrap().unwrap();
    let mut ids: Vec<&String> = rec.clients.keys().collect();
    ids.sort();
    assert_eq!(ids, ["live", "new"]);
}
