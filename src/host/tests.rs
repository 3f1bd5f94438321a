//! Table tests of acquire, rollback, release and gc against the recording fakes: every row
//! names its case, sets the world up, acts, and checks records, daemons and compute modes.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use crate::config::Config;
use crate::decide::domain;
use crate::decide::plan::{Plan, PlannedGpu};
use crate::decide::request::Request;
use crate::host::acquire::{AcquireError, Host};
use crate::host::fakes::{uuid, Call, FakeControl, FakeInventory};
use crate::host::procinfo::ProcId;
use crate::host::state::{Domain, Record, StateDir};
use crate::vocab::{ComputeMode, Isolation, Limits, Mode};

use ComputeMode::{Default as DEFAULT, ExclusiveProcess as EXCLUSIVE};

/// The policy's limits in these tests: `default_cores = 50`, `max_memory = "1Gi"`.
const POLICY: Limits = Limits {
    cores: 50,
    memory_mib: Some(1024),
};

/// A compute-mode change: the GPU, the new mode, and what the record on disk said to restore.
type ModeChange = (u32, ComputeMode, Option<ComputeMode>);

/// A state directory, a policy and the fakes; compute modes per GPU index.
struct World {
    _dir: tempfile::TempDir,
    cfg: Config,
    inv: FakeInventory,
    ctl: FakeControl,
    /// A live process (this test binary), for clients that are still running.
    me: ProcId,
    /// For each successful compute-mode change: the GPU, the new mode, and the
    /// `restore_compute_mode` the GPU's record on disk held at that moment.
    at_set: Rc<RefCell<Vec<ModeChange>>>,
    /// When set, every record save after the next compute-mode change fails.
    block_saves_after_set: Rc<Cell<bool>>,
    /// GPU locks a row holds (another hook at work).
    held: RefCell<Vec<crate::host::state::GpuLock>>,
}

impl World {
    fn new(isolation: Isolation, modes: &[(u32, ComputeMode)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config {
            state_dir: dir.path().join("state"),
            lock_timeout_seconds: 5,
            ..Config::default()
        };
        cfg.mps.isolation = isolation;
        cfg.policy.default_cores = POLICY.cores;
        cfg.policy.max_memory = Some("1Gi".into());
        let inv = FakeInventory::new(modes);
        let at_set = Rc::new(RefCell::new(Vec::new()));
        let block = Rc::new(Cell::new(false));
        {
            let state = StateDir::new(&cfg.state_dir);
            let at_set = at_set.clone();
            let block = block.clone();
            inv.on_set(move |index, mode| {
                let on_disk = state
                    .load(&uuid(index))
                    .ok()
                    .flatten()
                    .and_then(|r| r.restore_compute_mode);
                at_set.borrow_mut().push((index, mode, on_disk));
                if block.get() {
                    block_saves(&state, index);
                }
            });
        }
        World {
            _dir: dir,
            cfg,
            inv,
            ctl: FakeControl::new(),
            me: ProcId::of(std::process::id() as i32).expect("own process"),
            at_set,
            block_saves_after_set: block,
            held: RefCell::new(Vec::new()),
        }
    }

    fn host(&self) -> Host<'_> {
        Host::with_control(&self.cfg, &self.inv, Box::new(&self.ctl))
    }

    fn state(&self) -> StateDir {
        StateDir::new(&self.cfg.state_dir)
    }

    /// Acquires `plan` for a container whose process is this (live) test process.
    fn acquire(&self, plan: &Plan) -> Result<(), AcquireError> {
        self.host().acquire(plan, Some(self.me), None)
    }

    /// Acquires `plan`, which must succeed (for setting a world up).
    fn given(&self, plan: &Plan) {
        if let Err(e) = self.acquire(plan) {
            panic!("setting up {}: {}", plan.container, crate::vocab::chain(&e));
        }
    }

    /// Holds GPU `index`'s lock (another hook at work) and makes waiting for it give up at once.
    fn hold_lock(&mut self, index: u32) {
        self.state().ensure().expect("state dir");
        let lock = self
            .state()
            .lock(
                &uuid(index),
                std::time::Duration::from_secs(1),
                "container other",
            )
            .expect("lock");
        self.held.borrow_mut().push(lock);
        self.cfg.lock_timeout_seconds = 0;
    }

    fn record(&self, index: u32) -> Option<Record> {
        self.state().load(&uuid(index)).expect("readable record")
    }

    fn save(&self, rec: &Record) {
        let s = self.state();
        s.ensure().expect("state dir");
        s.save(rec).expect("save record");
    }

    fn pipe(&self, index: u32, key: &str) -> PathBuf {
        let dirs = self.host().mps_dirs(&uuid(index), key);
        crate::host::fakes::name(&dirs);
        dirs.pipe
    }

    fn domain_dir(&self, index: u32, key: &str) -> PathBuf {
        let dirs = self.host().mps_dirs(&uuid(index), key);
        crate::host::fakes::name(&dirs);
        dirs.dir
    }

    /// The recorded daemon of domain `key` on GPU `index`.
    fn daemon(&self, index: u32, key: &str) -> Option<ProcId> {
        self.record(index)?
            .domains
            .get(key)?
            .daemon
            .as_ref()
            .map(|d| d.process)
    }

    /// Client ids on GPU `index`.
    fn clients(&self, index: u32) -> Vec<String> {
        self.record(index)
            .map(|r| r.clients.into_keys().collect())
            .unwrap_or_default()
    }

    /// Forgets what the fakes recorded so far.
    fn clear(&self) {
        self.ctl.clear_calls();
        self.inv.clear_sets();
        self.at_set.borrow_mut().clear();
    }

    /// Everything a failed operation must leave as it was.
    fn snapshot(&self) -> Snapshot {
        let mut records = BTreeMap::new();
        if let Ok(rd) = std::fs::read_dir(self.state().gpus_dir()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".json") {
                    records.insert(name, std::fs::read_to_string(e.path()).unwrap_or_default());
                }
            }
        }
        let mut dirs = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.cfg.state_dir.join("mps")) {
            for d in rd.flatten() {
                dirs.push(crate::host::fakes::at(&d.path().join("pipe")));
            }
        }
        dirs.sort();
        Snapshot {
            records,
            live: self.ctl.live(),
            modes: self.inv.modes(),
            dirs,
        }
    }
}

impl Drop for World {
    /// Unmounts every tmpfs a reservation mounted under the state directory (pipe and shm),
    /// even when a row failed, so that the temp directory can go.
    fn drop(&mut self) {
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        for e in crate::host::mounts::entries(&info) {
            if e.mount_point.starts_with(&self.cfg.state_dir) {
                let _ = nix::mount::umount2(&e.mount_point, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// Makes every later save of GPU `index`'s record fail: a directory where the temp file goes.
/// (Read-only permissions do not stop root, which these tests run as.)
fn block_saves(state: &StateDir, index: u32) {
    let tmp = state
        .gpus_dir()
        .join(format!(".{}.json.{}.tmp", uuid(index), std::process::id()));
    std::fs::create_dir_all(tmp.join("x")).expect("block saves");
}

#[derive(Debug, PartialEq)]
struct Snapshot {
    /// Record files by name, as written.
    records: BTreeMap<String, String>,
    /// `<uuid>/<domain>` of every live daemon.
    live: Vec<String>,
    modes: Vec<(u32, ComputeMode)>,
    /// `<uuid>/<domain>` of every domain directory.
    dirs: Vec<String>,
}

/// What an mps container asks for.
#[derive(Clone, Copy)]
struct Ask {
    cores: Option<u8>,
    memory_mib: Option<u64>,
    group: Option<&'static str>,
    uid: u32,
}

const ASK: Ask = Ask {
    cores: None,
    memory_mib: None,
    group: None,
    uid: 1000,
};

fn planned_gpus(gpus: &[u32]) -> Vec<PlannedGpu> {
    gpus.iter()
        .enumerate()
        .map(|(ordinal, &index)| PlannedGpu {
            index,
            uuid: uuid(index),
            ordinal: ordinal as u32,
        })
        .collect()
}

/// The plan of an mps container `id` on `gpus`, its domain chosen as the front half does.
fn mps(cfg: &Config, id: &str, gpus: &[u32], ask: Ask) -> Plan {
    let req = Request {
        mode: Mode::Mps,
        devices: None,
        memory: ask.memory_mib.map(|m| m << 20),
        cores: ask.cores.unwrap_or(cfg.policy.default_cores),
        cores_explicit: ask.cores.is_some(),
        timeslice: None,
        group: ask.group.map(str::to_owned),
    };
    let planned = domain::choose(id, &req, &Default::default(), cfg).expect("domain");
    Plan {
        container: id.to_owned(),
        mode: Mode::Mps,
        gpus: planned_gpus(gpus),
        memory: req.memory,
        cap: req.memory,
        // No cgroup of its own: the limiter enforces a cap.
        enforcement: match req.memory {
            Some(_) => crate::vocab::memcap::Enforcement {
                backend: crate::vocab::memcap::Backend::Limiter,
                cgroup: None,
                why: Some("no cgroup of its own".into()),
            },
            None => crate::decide::enforce::uncapped(),
        },
        without_limiter: None,
        cores: req.cores,
        cores_explicit: req.cores_explicit,
        timeslice: None,
        domain: Some(planned),
        uid: ask.uid,
    }
}

/// The plan of a `timeslice` (without a slice length) or `limit` container.
fn plain(id: &str, mode: Mode, gpus: &[u32]) -> Plan {
    Plan {
        container: id.to_owned(),
        mode,
        gpus: planned_gpus(gpus),
        memory: None,
        cap: None,
        enforcement: crate::decide::enforce::uncapped(),
        without_limiter: None,
        cores: 100,
        cores_explicit: false,
        timeslice: None,
        domain: None,
        uid: 1000,
    }
}

fn gpu_plan(w: &World, id: &str) -> Plan {
    mps(&w.cfg, id, &[0], ASK)
}

fn group_plan(w: &World, id: &str, group: &'static str) -> Plan {
    mps(
        &w.cfg,
        id,
        &[0],
        Ask {
            group: Some(group),
            ..ASK
        },
    )
}

/// One acquire case: `given` builds the world (policy, earlier containers, injected faults);
/// the fakes' recordings are cleared; `when` acts. A row with `err` must fail with a message
/// containing it and leave records, daemons, directories and compute modes as they were;
/// `then` checks the rest.
struct AcquireRow {
    what: &'static str,
    isolation: Isolation,
    modes: &'static [(u32, ComputeMode)],
    given: fn(&mut World),
    when: fn(&World) -> Result<(), AcquireError>,
    err: Option<&'static str>,
    then: fn(&World, &str),
}

const ONE_GPU: &[(u32, ComputeMode)] = &[(0, DEFAULT)];
const ONE_GPU_EXCLUSIVE: &[(u32, ComputeMode)] = &[(0, EXCLUSIVE)];
const TWO_GPUS: &[(u32, ComputeMode)] = &[(0, DEFAULT), (1, DEFAULT)];

fn nothing(_: &mut World) {}
fn no_check(_: &World, _: &str) {}

fn run_acquire_rows(rows: Vec<AcquireRow>) {
    for row in rows {
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
}

#[test]
fn acquire_mps() {
    run_acquire_rows(vec![
        AcquireRow {
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
            },
        },
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
            what: "admission: more cores than the domain enforces is refused",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.given(&gpu_plan(w, "c1")),
            when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { cores: Some(60), ..ASK })),
            err: Some("asks for gpu.share.cores=60 but MPS domain gpu on GPU GPU-0 enforces 50%"),
            then: |w, what| assert_eq!(w.ctl.live(), ["GPU-0/gpu"], "{what}"),
        },
        AcquireRow {
            what: "admission: more memory than the domain enforces is refused",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.given(&gpu_plan(w, "c1")),
            when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { memory_mib: Some(2048), ..ASK })),
            err: Some("asks for gpu.share.memory 2.0 GiB but MPS domain gpu on GPU GPU-0 enforces 1.0 GiB"),
            then: no_check,
        },
        AcquireRow {
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
        AcquireRow {
            what: "a second uid is refused without a multi-user server",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.given(&gpu_plan(w, "c1")),
            when: |w| w.acquire(&mps(&w.cfg, "c2", &[0], Ask { uid: 1001, ..ASK })),
            err: Some("runs as uid 1001 but MPS domain gpu on GPU GPU-0 serves uid 1000"),
            then: no_check,
        },
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
    ]);
}

#[test]
fn acquire_mode_conflicts() {
    run_acquire_rows(vec![
        AcquireRow {
            what: "mps GPU: a limit container is busy",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.given(&gpu_plan(w, "c1")),
            when: |w| w.acquire(&plain("c2", Mode::Limit, &[0])),
            err: Some("GPU 0 (GPU-0) serves mps to c1; limit cannot share it with them"),
            then: no_check,
        },
        AcquireRow {
            what: "mps GPU: a timeslice container is busy",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.given(&gpu_plan(w, "c1")),
            when: |w| w.acquire(&plain("c2", Mode::Timeslice, &[0])),
            err: Some("serves mps to c1; timeslice cannot"),
            then: no_check,
        },
        AcquireRow {
            what: "limit GPU: an mps container is busy",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.given(&plain("c1", Mode::Limit, &[0])),
            when: |w| w.acquire(&gpu_plan(w, "c2")),
            err: Some("serves limit to c1; mps cannot"),
            then: |w, what| assert!(w.ctl.calls().is_empty(), "{what}"),
        },
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
    ]);
}

#[test]
fn acquire_rollback() {
    run_acquire_rows(vec![
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
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
        AcquireRow {
            what: "a GPU whose lock another hook holds: timed out naming the holder, nothing changed",
            isolation: Isolation::Gpu,
            modes: ONE_GPU,
            given: |w| w.hold_lock(0),
            when: |w| w.acquire(&gpu_plan(w, "c1")),
            err: Some("held by pid"),
            then: |w, what| assert!(w.ctl.calls().is_empty(), "{what}"),
        },
        AcquireRow {
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
            },
        },
        AcquireRow {
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
        AcquireRow {
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
    ]);
}

/// Rolling back an acquire that adopted a daemon must not take that daemon's directories
/// (its control socket) away from it.
#[test]
fn acquire_rollback_after_adoption() {
    run_acquire_rows(vec![AcquireRow {
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
    }]);
}

/// A group domain whose only client is gone (its process ended, no poststop yet) still has
/// its daemon; the next container of the group creates the domain anew, so its request sets
/// the limits (DESIGN: "the request of the container that created it").
#[test]
fn acquire_group_left_by_a_stale_creator_takes_the_next_creators_limits() {
    run_acquire_rows(vec![AcquireRow {
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
    }]);
}

/// One release or gc case: `given` builds the world; the fakes' recordings are cleared;
/// `when` acts and returns its warnings or report, which must contain each of `says`, in
/// order; `then` checks the rest.
struct ReleaseRow {
    what: &'static str,
    isolation: Isolation,
    modes: &'static [(u32, ComputeMode)],
    given: fn(&mut World),
    when: fn(&World) -> Vec<String>,
    /// `None`: not checked by this row.
    says: Option<&'static [&'static str]>,
    then: fn(&World, &str),
}

fn run_release_rows(rows: Vec<ReleaseRow>) {
    for row in rows {
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
}

#[test]
fn release() {
    run_release_rows(vec![
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
    ]);
}

#[test]
fn release_when_things_fail() {
    run_release_rows(vec![
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
    ]);
}

#[test]
fn gc() {
    run_release_rows(vec![
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
                let aside = std::fs::read_dir(w.state().gpus_dir())
                    .unwrap()
                    .flatten()
                    .find(|e| e.file_name().to_string_lossy().contains(".quarantined-"))
                    .expect("kept aside");
                assert_eq!(std::fs::read(aside.path()).unwrap(), b"{not json", "{what}");
            },
        },
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
    ]);
}

/// Reservations mount the domain's shm tmpfs ([`Host::reserve`] calls `MpsDirs::prepare`),
/// which needs root (CAP_SYS_ADMIN).
fn can_mount() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "reservation tests need root to mount the shm tmpfs, and CI=true"
    );
    eprintln!("SKIPPED: reservation tests need root to mount the shm tmpfs");
    false
}

/// Reserves the directories of `id`'s domain on GPU 0 under `key`, as a spec edit does.
fn reserve(w: &World, id: &str, key: &str) {
    let plan = gpu_plan(w, id);
    w.host()
        .reserve(&plan.gpus[0], plan.domain.as_ref().unwrap(), key)
        .expect("reserve");
}

#[test]
fn reservations() {
    if !can_mount() {
        return;
    }
    run_release_rows(vec![
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
        ReleaseRow {
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
    ]);
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

/// The fake's own rules, which the rows above rely on.
const NO_DEFAULTS_PROBE: Limits = Limits {
    cores: 7,
    memory_mib: None,
};

/// The contract every [`MpsControl`] keeps, run on the fake and, where MPS is installed, on the
/// real [`crate::host::mps::Control`]: `hang(p, true)` makes daemon `p` stay alive but stop
/// answering (the fake's switch; SIGSTOP for a real one).
///
/// `known`: the clauses an implementation is known to break today, left out of its run.
/// Clauses of [`control_contract`] an implementation may be known to break; the fake and the
/// real `Control` keep them all (the real one refused no second start and lost refreshes while
/// it ran NVIDIA's client detached; it speaks the protocol itself now).
#[derive(Clone, Copy)]
struct Known {
    /// A start on a pipe a live daemon serves fails and leaves that daemon serving.
    second_start_refused: bool,
    /// `refresh` then `flush` puts the defaults back.
    refresh_lands: bool,
}

const ALL_CLAUSES: Known = Known {
    second_start_refused: true,
    refresh_lands: true,
};

fn control_contract(
    ctl: &dyn crate::host::mps::MpsControl,
    uuid: &str,
    dirs: &crate::host::mps::MpsDirs,
    hang: &dyn Fn(ProcId, bool),
    known: Known,
) {
    let t = std::time::Duration::from_secs(10);
    let pipe = &dirs.pipe;
    // Nothing before a start (whoever is named as the daemon: here this very process).
    let nobody = ProcId::of(std::process::id() as i32).expect("this process");
    assert_eq!(ctl.find_daemon(pipe), None, "no daemon before start");
    assert!(!ctl.answers(pipe, nobody), "nothing answers before start");
    assert!(
        ctl.defaults(pipe, nobody).is_err(),
        "no defaults without a daemon"
    );
    assert!(
        ctl.refresh(pipe, nobody, &POLICY).is_err(),
        "no socket accepts"
    );
    // A started daemon is live, found, answers; a second start on its pipe fails and leaves
    // the first serving.
    let p = ctl.start(uuid, dirs, false, t).expect("start");
    assert!(p.is_alive());
    assert_eq!(ctl.find_daemon(pipe), Some(p));
    assert!(ctl.answers(pipe, p));
    // Only the daemon it was started as is believed: the same socket, named as another
    // process's, does not answer.
    assert!(
        !ctl.answers(pipe, nobody),
        "a daemon proven to be another process"
    );
    if known.second_start_refused {
        assert!(
            ctl.start(uuid, dirs, false, t).is_err(),
            "a second daemon on one pipe"
        );
        assert_eq!(ctl.find_daemon(pipe), Some(p), "the first still serves");
        assert!(ctl.answers(pipe, p), "the first still answers");
    }
    // Defaults set are read back; refresh (flushed) puts back what a tenant changed.
    ctl.set_defaults(pipe, p, &POLICY).expect("set_defaults");
    assert_eq!(ctl.defaults(pipe, p).expect("defaults"), POLICY);
    ctl.set_defaults(pipe, p, &NO_DEFAULTS_PROBE)
        .expect("set_defaults");
    assert_eq!(ctl.defaults(pipe, p).expect("defaults"), NO_DEFAULTS_PROBE);
    ctl.refresh(pipe, p, &POLICY)
        .expect("refresh of a live daemon");
    ctl.flush();
    if known.refresh_lands {
        let deadline = std::time::Instant::now() + 2 * t;
        let mut last = Vec::new();
        loop {
            let r = ctl.defaults(pipe, p);
            if r.as_ref().ok() == Some(&POLICY) {
                break;
            }
            last.push(format!("{r:?}"));
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {:?} waiting for refresh to put the defaults back; read: {last:#?}",
                2 * t
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    // A hung daemon is still found, but it does not answer, so a joiner's refresh fails (within
    // its deadline) instead of handing the daemon on; stop kills the process it is given.
    hang(p, true);
    assert_eq!(ctl.find_daemon(pipe), Some(p), "a hung daemon is found");
    assert!(!ctl.answers(pipe, p), "a hung daemon does not answer");
    assert!(
        ctl.refresh(pipe, p, &POLICY).is_err(),
        "a hung daemon fails refresh"
    );
    ctl.stop(pipe, Some(p));
    // (SIGKILL lands a moment after `stop` returns.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p.is_alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "stop did not kill the hung daemon it was given ({p:?}) within 5s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(ctl.find_daemon(pipe), None);
    assert!(!ctl.answers(pipe, p));
    assert!(ctl.set_defaults(pipe, p, &POLICY).is_err());
    // Stop is idempotent.
    ctl.stop(pipe, None);
    ctl.stop(pipe, Some(p));
}

#[test]
fn the_fake_control_keeps_the_contract() {
    let w = World::new(Isolation::Gpu, TWO_GPUS);
    let dirs = w.host().mps_dirs(&uuid(0), "gpu");
    let pipe = dirs.pipe.clone();
    let h = w.host();
    let ctl = h.control().unwrap();
    control_contract(
        ctl,
        &uuid(0),
        &dirs,
        &|_, on| w.ctl.hang(&pipe, on),
        ALL_CLAUSES,
    );
    ctl.flush();
}

#[test]
fn the_real_control_keeps_the_contract() {
    let Some(bin) = crate::host::mps::find_binary("nvidia-cuda-mps-control") else {
        let msg = "SKIPPED: the real MPS control contract: nvidia-cuda-mps-control missing; run scripts/install-deps.sh";
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{msg} (CI requires it)"
        );
        eprintln!("\n******** {msg} ********\n");
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        let msg = "SKIPPED: the real MPS control contract needs root (it mounts the daemon's shm)";
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{msg} (CI requires it)"
        );
        eprintln!("\n******** {msg} ********\n");
        return;
    }
    let ctl = crate::host::mps::Control::new(&bin.display().to_string()).expect("control");
    let dir = tempfile::Builder::new()
        .prefix("gpushare-contract-")
        .tempdir()
        .unwrap();
    let dirs = crate::host::mps::MpsDirs::owned(dir.path().join("mps").join("d"), &uuid(0), "gpu");
    /// Stops whatever daemon is left and removes the directories, even when the contract fails.
    struct Clean<'a>(&'a crate::host::mps::Control, &'a crate::host::mps::MpsDirs);
    impl Drop for Clean<'_> {
        fn drop(&mut self) {
            if let Some(p) = crate::host::mps::MpsControl::find_daemon(self.0, &self.1.pipe) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            self.1.remove();
        }
    }
    let _clean = Clean(&ctl, &dirs);
    dirs.prepare(64 << 20)
        .expect("the domain's directories and mounts");
    let signal = |p: ProcId, on: bool| {
        let sig = if on {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), sig).unwrap();
    };
    control_contract(&ctl, &uuid(0), &dirs, &signal, ALL_CLAUSES);
}

#[test]
fn fakes_behave_like_the_world_they_model() {
    let w = World::new(Isolation::Gpu, TWO_GPUS);
    let pipe = w.pipe(0, "gpu");
    // A started daemon is live, found, answers; a second start on its pipe fails.
    let dirs = w.host().mps_dirs(&uuid(0), "gpu");
    let h = w.host();
    let ctl = h.control().unwrap();
    let p = ctl
        .start(&uuid(0), &dirs, false, std::time::Duration::from_secs(1))
        .unwrap();
    assert!(p.is_alive());
    assert_eq!(ctl.find_daemon(&pipe), Some(p));
    assert!(ctl.answers(&pipe, p));
    assert!(ctl
        .start(&uuid(0), &dirs, false, std::time::Duration::from_secs(1))
        .is_err());
    ctl.set_defaults(&pipe, p, &POLICY).unwrap();
    assert_eq!(ctl.defaults(&pipe, p).unwrap(), POLICY);
    // Another process on the socket is no answer from the daemon: tampered.
    let other = w.ctl.spawn_process();
    assert!(!ctl.answers(&pipe, other));
    assert!(ctl.defaults(&pipe, other).unwrap_err().is_tampered());
    // A hung daemon is found but does not answer, and its defaults are not put back.
    w.ctl.hang(&pipe, true);
    assert!(!ctl.answers(&pipe, p));
    w.ctl.drift(&pipe, NO_DEFAULTS_PROBE);
    assert!(ctl.refresh(&pipe, p, &POLICY).is_err());
    assert_eq!(w.ctl.defaults_on(&pipe), Some(NO_DEFAULTS_PROBE));
    ctl.stop(&pipe, None);
    assert!(
        p.is_alive(),
        "nothing is signalled without a recorded daemon"
    );
    ctl.stop(&pipe, Some(p));
    assert!(!p.is_alive());
    assert_eq!(ctl.find_daemon(&pipe), None);
    // The inventory records failed sets and keeps the mode.
    w.inv.fail_set(1, true);
    assert!(crate::vocab::Inventory::set_compute_mode(&w.inv, 1, EXCLUSIVE).is_err());
    assert_eq!(w.inv.modes(), [(0, DEFAULT), (1, DEFAULT)]);
    assert_eq!(w.inv.sets(), [(1, EXCLUSIVE)]);
    // A dead process is dead.
    assert!(!w.ctl.dead_process().is_alive());
}
