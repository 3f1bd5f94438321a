//! The world a row runs in: a state directory, a policy and the recording fakes (compute modes
//! per GPU index), with what a row reads back; and the plans rows acquire.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use crate::config::Config;
use crate::decide::domain;
use crate::decide::plan::{Plan, PlannedGpu};
use crate::decide::request::Request;
use crate::host::acquire::{AcquireError, Host};
use crate::host::fakes::{uuid, FakeControl, FakeInventory};
use crate::host::procinfo::ProcId;
use crate::host::state::{Record, StateDir};
use crate::vocab::{ComputeMode, Isolation, Limits, Mode};

pub(super) use ComputeMode::{Default as DEFAULT, ExclusiveProcess as EXCLUSIVE};

/// The policy's limits in these tests: `default_cores = 50`, `max_memory = "1Gi"`.
pub(super) const POLICY: Limits = Limits {
    cores: 50,
    memory_mib: Some(1024),
};

/// A compute-mode change: the GPU, the new mode, and what the record on disk said to restore.
pub(super) type ModeChange = (u32, ComputeMode, Option<ComputeMode>);

/// A state directory, a policy and the fakes; compute modes per GPU index.
pub(super) struct World {
    pub(super) _dir: tempfile::TempDir,
    pub(super) cfg: Config,
    pub(super) inv: FakeInventory,
    pub(super) ctl: FakeControl,
    /// A live process (this test binary), for clients that are still running.
    pub(super) me: ProcId,
    /// For each successful compute-mode change: the GPU, the new mode, and the
    /// `restore_compute_mode` the GPU's record on disk held at that moment.
    pub(super) at_set: Rc<RefCell<Vec<ModeChange>>>,
    /// When set, every record save after the next compute-mode change fails.
    pub(super) block_saves_after_set: Rc<Cell<bool>>,
    /// GPU locks a row holds (another hook at work).
    pub(super) held: RefCell<Vec<crate::host::state::GpuLock>>,
}

impl World {
    pub(super) fn new(isolation: Isolation, modes: &[(u32, ComputeMode)]) -> Self {
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

    pub(super) fn host(&self) -> Host<'_> {
        Host::with_control(&self.cfg, &self.inv, Box::new(&self.ctl))
    }

    pub(super) fn state(&self) -> StateDir {
        StateDir::new(&self.cfg.state_dir)
    }

    /// Acquires `plan` for a container whose process is this (live) test process.
    pub(super) fn acquire(&self, plan: &Plan) -> Result<(), AcquireError> {
        self.host().acquire(plan, Some(self.me), None)
    }

    /// Acquires `plan`, which must succeed (for setting a world up).
    pub(super) fn given(&self, plan: &Plan) {
        if let Err(e) = self.acquire(plan) {
            panic!("setting up {}: {}", plan.container, crate::vocab::chain(&e));
        }
    }

    /// Holds GPU `index`'s lock (another hook at work) and makes waiting for it give up at once.
    pub(super) fn hold_lock(&mut self, index: u32) {
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

    pub(super) fn record(&self, index: u32) -> Option<Record> {
        self.state().load(&uuid(index)).expect("readable record")
    }

    pub(super) fn save(&self, rec: &Record) {
        let s = self.state();
        s.ensure().expect("state dir");
        s.save(rec).expect("save record");
    }

    pub(super) fn pipe(&self, index: u32, key: &str) -> PathBuf {
        let dirs = self.host().mps_dirs(&uuid(index), key);
        crate::host::fakes::name(&dirs);
        dirs.pipe
    }

    pub(super) fn domain_dir(&self, index: u32, key: &str) -> PathBuf {
        let dirs = self.host().mps_dirs(&uuid(index), key);
        crate::host::fakes::name(&dirs);
        dirs.dir
    }

    /// The recorded daemon of domain `key` on GPU `index`.
    pub(super) fn daemon(&self, index: u32, key: &str) -> Option<ProcId> {
        self.record(index)?
            .domains
            .get(key)?
            .daemon
            .as_ref()
            .map(|d| d.process)
    }

    /// Client ids on GPU `index`.
    pub(super) fn clients(&self, index: u32) -> Vec<String> {
        self.record(index)
            .map(|r| r.clients.into_keys().collect())
            .unwrap_or_default()
    }

    /// Forgets what the fakes recorded so far.
    pub(super) fn clear(&self) {
        self.ctl.clear_calls();
        self.inv.clear_sets();
        self.at_set.borrow_mut().clear();
    }

    /// Everything a failed operation must leave as it was.
    pub(super) fn snapshot(&self) -> Snapshot {
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
pub(super) fn block_saves(state: &StateDir, index: u32) {
    let tmp = state
        .gpus_dir()
        .join(format!(".{}.json.{}.tmp", uuid(index), std::process::id()));
    std::fs::create_dir_all(tmp.join("x")).expect("block saves");
}

/// Makes GPU `index`'s reaper "run": the stamp a reaper writes into its lock file, naming the
/// live process `me`. Returns the stamp's path (remove it to stop the "reaper").
pub(super) fn reaper_runs(state: &StateDir, me: ProcId, index: u32) -> PathBuf {
    let stamp = state.reaper_lock_path(&uuid(index));
    std::fs::create_dir_all(stamp.parent().expect("a directory")).expect("reaper dir");
    std::fs::write(&stamp, format!("{} {}\n", me.pid, me.start_time)).expect("stamp");
    assert!(state.reaper_alive(&uuid(index)));
    stamp
}

#[derive(Debug, PartialEq)]
pub(super) struct Snapshot {
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
pub(super) struct Ask {
    pub(super) cores: Option<u8>,
    pub(super) memory_mib: Option<u64>,
    pub(super) group: Option<&'static str>,
    pub(super) uid: u32,
}

pub(super) const ASK: Ask = Ask {
    cores: None,
    memory_mib: None,
    group: None,
    uid: 1000,
};

pub(super) fn planned_gpus(gpus: &[u32]) -> Vec<PlannedGpu> {
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
pub(super) fn mps(cfg: &Config, id: &str, gpus: &[u32], ask: Ask) -> Plan {
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
pub(super) fn plain(id: &str, mode: Mode, gpus: &[u32]) -> Plan {
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

pub(super) fn gpu_plan(w: &World, id: &str) -> Plan {
    mps(&w.cfg, id, &[0], ASK)
}

pub(super) fn group_plan(w: &World, id: &str, group: &'static str) -> Plan {
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

pub(super) const ONE_GPU: &[(u32, ComputeMode)] = &[(0, DEFAULT)];
pub(super) const ONE_GPU_EXCLUSIVE: &[(u32, ComputeMode)] = &[(0, EXCLUSIVE)];
pub(super) const TWO_GPUS: &[(u32, ComputeMode)] = &[(0, DEFAULT), (1, DEFAULT)];
