//! Recording fakes of the doing layer's seams, for tests only: [`FakeInventory`] (compute
//! modes) and [`FakeControl`] (MPS control daemons). They model the world the real ones act on
//! (a compute mode per GPU, live daemons by pipe directory) and record every call, with
//! failures a test can inject.
//!
//! Daemons are `sleep` processes the fake spawns and owns, so that the code under test sees
//! real, live [`ProcId`]s; a test "kills a daemon" by killing its process, and every process
//! left is killed when the fake drops.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::host::mps::{MpsControl, MpsDirs, MpsError};
use crate::host::procinfo::ProcId;
use crate::vocab::{ComputeMode, Gpu, Inventory, InventoryError, Limits};

/// The UUID the fakes give GPU `index`.
pub(crate) fn uuid(index: u32) -> String {
    format!("GPU-{index}")
}

/// A callback run after a successful compute-mode change.
type OnSet = Box<dyn FnMut(u32, ComputeMode)>;

/// GPUs with a compute mode each; records every `set_compute_mode` (failed ones too).
pub(crate) struct FakeInventory {
    modes: RefCell<BTreeMap<u32, ComputeMode>>,
    sets: RefCell<Vec<(u32, ComputeMode)>>,
    fail_set: RefCell<BTreeSet<u32>>,
    on_set: RefCell<Option<OnSet>>,
    /// Each GPU's size (`None`: not reported).
    memory: Cell<Option<u64>>,
    /// The driver's cgroup memory limits: whether it has them, whether setting fails, and
    /// every set asked for (GPU, cgroup, soft, hard).
    driver_limits: Cell<bool>,
    fail_limits: Cell<bool>,
    limit_sets: RefCell<Vec<(u32, String, u64, u64)>>,
    mode_reads: Cell<usize>,
}

impl FakeInventory {
    /// GPUs `index → compute mode`.
    pub(crate) fn new(gpus: &[(u32, ComputeMode)]) -> Self {
        Self {
            modes: RefCell::new(gpus.iter().copied().collect()),
            sets: RefCell::new(Vec::new()),
            fail_set: RefCell::new(BTreeSet::new()),
            on_set: RefCell::new(None),
            memory: Cell::new(None),
            driver_limits: Cell::new(false),
            fail_limits: Cell::new(false),
            limit_sets: RefCell::new(Vec::new()),
            mode_reads: Cell::new(0),
        }
    }

    /// How many times a compute mode was read.
    pub(crate) fn mode_reads(&self) -> usize {
        self.mode_reads.get()
    }

    /// Every GPU reports `bytes` of memory.
    pub(crate) fn with_memory(self, bytes: u64) -> Self {
        self.memory.set(Some(bytes));
        self
    }

    /// The driver has cgroup memory limits (`fail`: and refuses every set).
    pub(crate) fn with_driver_limits(self, fail: bool) -> Self {
        self.driver_limits.set(true);
        self.fail_limits.set(fail);
        self
    }

    /// Every driver memory-limit set asked for: (GPU, cgroup, soft, hard).
    pub(crate) fn limit_sets(&self) -> Vec<(u32, String, u64, u64)> {
        self.limit_sets.borrow().clone()
    }

    /// The current compute mode of every GPU.
    pub(crate) fn modes(&self) -> Vec<(u32, ComputeMode)> {
        self.modes.borrow().iter().map(|(i, m)| (*i, *m)).collect()
    }

    /// Every `set_compute_mode` asked for, in order, failed ones included.
    pub(crate) fn sets(&self) -> Vec<(u32, ComputeMode)> {
        self.sets.borrow().clone()
    }

    pub(crate) fn clear_sets(&self) {
        self.sets.borrow_mut().clear();
    }

    /// Makes every `set_compute_mode` on GPU `index` fail (`false`: work again).
    pub(crate) fn fail_set(&self, index: u32, fail: bool) {
        if fail {
            self.fail_set.borrow_mut().insert(index);
        } else {
            self.fail_set.borrow_mut().remove(&index);
        }
    }

    /// Runs `f` after every successful `set_compute_mode` (to look at, or change, the world
    /// at that moment).
    pub(crate) fn on_set(&self, f: impl FnMut(u32, ComputeMode) + 'static) {
        *self.on_set.borrow_mut() = Some(Box::new(f));
    }
}

impl Inventory for FakeInventory {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        Ok(self
            .modes
            .borrow()
            .keys()
            .map(|&index| Gpu {
                index,
                uuid: uuid(index),
                minor: index,
            })
            .collect())
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, InventoryError> {
        self.mode_reads.set(self.mode_reads.get() + 1);
        self.modes
            .borrow()
            .get(&index)
            .copied()
            .ok_or_else(|| InventoryError::Unavailable(format!("no GPU {index}")))
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), InventoryError> {
        self.sets.borrow_mut().push((index, mode));
        if self.fail_set.borrow().contains(&index) {
            return Err(InventoryError::Unavailable(format!(
                "injected: cannot set the compute mode of GPU {index}"
            )));
        }
        match self.modes.borrow_mut().get_mut(&index) {
            Some(m) => *m = mode,
            None => return Err(InventoryError::Unavailable(format!("no GPU {index}"))),
        }
        if let Some(f) = self.on_set.borrow_mut().as_mut() {
            f(index, mode);
        }
        Ok(())
    }

    fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
        self.memory
            .get()
            .ok_or_else(|| InventoryError::Unavailable(format!("no size for GPU {index}")))
    }

    fn has_memory_limits(&self, _index: u32) -> bool {
        self.driver_limits.get()
    }

    fn set_memory_limits(
        &self,
        index: u32,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), InventoryError> {
        self.limit_sets
            .borrow_mut()
            .push((index, namespace.to_owned(), soft, hard));
        if !self.driver_limits.get() || self.fail_limits.get() {
            return Err(InventoryError::Unavailable(
                "injected: the driver refuses memory limits".into(),
            ));
        }
        Ok(())
    }
}

/// One call on [`FakeControl`]; `at` is `<uuid>/<domain>`, read from the pipe directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Start { at: String, multiuser: bool },
    Answers { at: String },
    Refresh { at: String, limits: Limits },
    SetDefaults { at: String, limits: Limits },
    Defaults { at: String },
    Stop { at: String, daemon: Option<i32> },
    FindDaemon { at: String },
}

impl Call {
    /// The call's name, as in the trait.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Call::Start { .. } => "start",
            Call::Answers { .. } => "answers",
            Call::Refresh { .. } => "refresh",
            Call::SetDefaults { .. } => "set_defaults",
            Call::Defaults { .. } => "defaults",
            Call::Stop { .. } => "stop",
            Call::FindDaemon { .. } => "find_daemon",
        }
    }
}

thread_local! {
    /// `<uuid>/<domain>` of the domain directories this test has named.
    static LABELS: RefCell<std::collections::HashMap<std::path::PathBuf, String>> =
        RefCell::new(std::collections::HashMap::new());
}

/// Remembers whose domain directories `dirs` are, for [`at`].
pub(crate) fn name(dirs: &MpsDirs) {
    if let Some((uuid, domain)) = dirs.owner() {
        let label = format!("{uuid}/{domain}");
        LABELS.with(|l| l.borrow_mut().insert(dirs.dir.clone(), label));
    }
}

/// `<uuid>/<domain>` of a pipe directory `…/mps/<id>/pipe` (from what [`name`] was told, or
/// the directory's owner file; `mps/<id>` otherwise).
pub(crate) fn at(pipe: &Path) -> String {
    let dir = pipe.parent().unwrap_or(pipe);
    if let Some(l) = LABELS.with(|l| l.borrow().get(dir).cloned()) {
        return l;
    }
    match MpsDirs::read_owner(dir) {
        Some((uuid, domain)) => format!("{uuid}/{domain}"),
        None => format!(
            "mps/{}",
            dir.file_name().unwrap_or_default().to_string_lossy()
        ),
    }
}

/// A daemon serving a pipe directory.
struct FakeDaemon {
    process: ProcId,
    defaults: Limits,
}

/// The defaults of a freshly started daemon: no limit.
const NO_LIMITS: Limits = Limits {
    cores: 100,
    memory_mib: None,
};

/// MPS control daemons by pipe directory; records every call.
pub(crate) struct FakeControl {
    binary: PathBuf,
    calls: RefCell<Vec<Call>>,
    daemons: RefCell<BTreeMap<PathBuf, FakeDaemon>>,
    children: RefCell<Vec<Child>>,
    hung: RefCell<BTreeSet<PathBuf>>,
    /// Pipes whose control socket a tenant's process holds now (renamed over the daemon's).
    tampered: RefCell<BTreeMap<PathBuf, ProcId>>,
    fail_start: Cell<bool>,
    fail_set_defaults: Cell<bool>,
}

impl FakeControl {
    pub(crate) fn new() -> Self {
        Self {
            binary: PathBuf::from("/fake/nvidia-cuda-mps-control"),
            calls: RefCell::new(Vec::new()),
            daemons: RefCell::new(BTreeMap::new()),
            children: RefCell::new(Vec::new()),
            hung: RefCell::new(BTreeSet::new()),
            tampered: RefCell::new(BTreeMap::new()),
            fail_start: Cell::new(false),
            fail_set_defaults: Cell::new(false),
        }
    }

    /// A live process owned by the fake (killed when it drops).
    pub(crate) fn spawn_process(&self) -> ProcId {
        let child = Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let pid = i32::try_from(child.id()).expect("pid fits i32");
        self.children.borrow_mut().push(child);
        ProcId::of(pid).expect("a child just spawned is in /proc")
    }

    /// Kills (and reaps) a process the fake owns; other processes are left alone.
    pub(crate) fn kill(&self, p: ProcId) {
        let mut children = self.children.borrow_mut();
        if let Some(i) = children
            .iter()
            .position(|c| i32::try_from(c.id()) == Ok(p.pid))
        {
            let mut c = children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A process that has exited: it was spawned, identified and killed.
    pub(crate) fn dead_process(&self) -> ProcId {
        let p = self.spawn_process();
        self.kill(p);
        p
    }

    /// A daemon serving `pipe` that no record names (a hook killed between start and save).
    pub(crate) fn add_daemon(&self, pipe: &Path, defaults: Limits) -> ProcId {
        let process = self.spawn_process();
        self.daemons
            .borrow_mut()
            .insert(pipe.to_owned(), FakeDaemon { process, defaults });
        process
    }

    /// The live daemon serving `pipe`, if any (answering or not).
    pub(crate) fn daemon_on(&self, pipe: &Path) -> Option<ProcId> {
        self.daemons
            .borrow()
            .get(pipe)
            .map(|d| d.process)
            .filter(ProcId::is_alive)
    }

    /// `<uuid>/<domain>` of every pipe a live daemon serves.
    pub(crate) fn live(&self) -> Vec<String> {
        self.daemons
            .borrow()
            .iter()
            .filter(|(_, d)| d.process.is_alive())
            .map(|(p, _)| at(p))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// The defaults of the daemon on `pipe`, as the daemon has them.
    pub(crate) fn defaults_on(&self, pipe: &Path) -> Option<Limits> {
        self.daemons.borrow().get(pipe).map(|d| d.defaults)
    }

    /// A tenant changes the defaults of the daemon on `pipe` through the control socket.
    pub(crate) fn drift(&self, pipe: &Path, limits: Limits) {
        if let Some(d) = self.daemons.borrow_mut().get_mut(pipe) {
            d.defaults = limits;
        }
    }

    /// The daemon on `pipe` stays alive but stops answering (`false`: answers again).
    pub(crate) fn hang(&self, pipe: &Path, hung: bool) {
        if hung {
            self.hung.borrow_mut().insert(pipe.to_owned());
        } else {
            self.hung.borrow_mut().remove(pipe);
        }
    }

    /// A tenant's own process takes the control socket of `pipe` (the daemon lives on, out of
    /// reach); it stays until a start empties the pipe directory.
    pub(crate) fn tamper(&self, pipe: &Path) -> ProcId {
        let p = self.spawn_process();
        self.tampered.borrow_mut().insert(pipe.to_owned(), p);
        p
    }

    /// What talking to `daemon` on `pipe` meets, as the real protocol proves it: the socket's
    /// listener must be `daemon` (else tampered), alive (else unreachable) and answering (else
    /// no answer).
    fn reach(&self, pipe: &Path, daemon: ProcId) -> Result<(), MpsError> {
        let listener = self
            .tampered
            .borrow()
            .get(pipe)
            .copied()
            .or_else(|| self.daemon_on(pipe));
        match listener {
            None => Err(MpsError::Unreachable {
                pipe: pipe.to_owned(),
                source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            }),
            Some(l) if l != daemon => Err(MpsError::Tampered {
                pipe: pipe.to_owned(),
                expected: daemon.pid,
                found: format!("listener pid {}", l.pid),
            }),
            Some(_) if self.hung.borrow().contains(pipe) => Err(MpsError::NoAnswer {
                pipe: pipe.to_owned(),
                millis: 500,
            }),
            Some(_) => Ok(()),
        }
    }

    /// Makes `start` fail (`false`: work again).
    pub(crate) fn fail_start(&self, fail: bool) {
        self.fail_start.set(fail);
    }

    /// Makes `set_defaults` fail (`false`: work again).
    pub(crate) fn fail_set_defaults(&self, fail: bool) {
        self.fail_set_defaults.set(fail);
    }

    /// Every call so far, in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    /// The names of the calls that change something (start, set_defaults, refresh, stop), in
    /// order, each with its `at`.
    pub(crate) fn actions(&self) -> Vec<String> {
        self.calls
            .borrow()
            .iter()
            .filter_map(|c| match c {
                Call::Start { at, .. }
                | Call::SetDefaults { at, .. }
                | Call::Refresh { at, .. }
                | Call::Stop { at, .. } => Some(format!("{} {at}", c.name())),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn clear_calls(&self) {
        self.calls.borrow_mut().clear();
    }

    fn record(&self, c: Call) {
        self.calls.borrow_mut().push(c);
    }

    fn not_answering(pipe: &Path, command: &str) -> MpsError {
        MpsError::Command {
            command: command.to_owned(),
            output: format!("no daemon answers on {}", pipe.display()),
        }
    }
}

impl Drop for FakeControl {
    fn drop(&mut self) {
        for mut c in self.children.get_mut().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl MpsControl for FakeControl {
    fn binary(&self) -> &Path {
        &self.binary
    }

    fn start(
        &self,
        uuid: &str,
        dirs: &MpsDirs,
        multiuser: bool,
        ready_timeout: Duration,
    ) -> Result<ProcId, MpsError> {
        name(dirs);
        self.record(Call::Start {
            at: at(&dirs.pipe),
            multiuser,
        });
        if self.fail_start.get() {
            return Err(MpsError::NotReady {
                uuid: uuid.to_owned(),
                seconds: ready_timeout.as_secs(),
                log: dirs.log.join("control.log"),
            });
        }
        // The start empties the pipe directory: a tenant's socket there goes.
        self.tampered.borrow_mut().remove(&dirs.pipe);
        if self.daemon_on(&dirs.pipe).is_some() {
            // A second daemon cannot take a control socket a live one holds.
            return Err(MpsError::Exited {
                binary: self.binary.clone(),
                status: "exit status: 1".into(),
                hint: "; a daemon already serves this pipe directory",
                log: dirs.log.join("control.log"),
            });
        }
        // The directories, as the real start makes them (without the shm tmpfs), owner first.
        std::fs::create_dir_all(&dirs.dir).map_err(|source| MpsError::Dirs {
            path: dirs.dir.clone(),
            source,
        })?;
        if let Some((uuid, domain)) = dirs.owner() {
            let _ = std::fs::write(dirs.dir.join("owner"), format!("{uuid} {domain}"));
        }
        for d in [&dirs.pipe, &dirs.log, &dirs.shm] {
            std::fs::create_dir_all(d).map_err(|source| MpsError::Dirs {
                path: d.clone(),
                source,
            })?;
        }
        let process = self.spawn_process();
        self.daemons.borrow_mut().insert(
            dirs.pipe.clone(),
            FakeDaemon {
                process,
                defaults: NO_LIMITS,
            },
        );
        Ok(process)
    }

    fn answers(&self, pipe: &Path, daemon: ProcId) -> bool {
        self.record(Call::Answers { at: at(pipe) });
        self.reach(pipe, daemon).is_ok()
    }

    fn refresh(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
        self.record(Call::Refresh {
            at: at(pipe),
            limits: *limits,
        });
        self.reach(pipe, daemon)?;
        if let Some(d) = self.daemons.borrow_mut().get_mut(pipe) {
            d.defaults = *limits;
        }
        Ok(())
    }

    fn set_defaults(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
        self.record(Call::SetDefaults {
            at: at(pipe),
            limits: *limits,
        });
        if self.fail_set_defaults.get() {
            return Err(MpsError::Command {
                command: "set_default_active_thread_percentage".into(),
                output: "injected failure".into(),
            });
        }
        self.reach(pipe, daemon)?;
        if let Some(d) = self.daemons.borrow_mut().get_mut(pipe) {
            d.defaults = *limits;
        }
        Ok(())
    }

    fn defaults(&self, pipe: &Path, daemon: ProcId) -> Result<Limits, MpsError> {
        self.record(Call::Defaults { at: at(pipe) });
        self.reach(pipe, daemon)?;
        self.defaults_on(pipe)
            .ok_or_else(|| Self::not_answering(pipe, "get_default_active_thread_percentage"))
    }

    fn stop(&self, pipe: &Path, daemon: Option<ProcId>) {
        self.record(Call::Stop {
            at: at(pipe),
            daemon: daemon.map(|p| p.pid),
        });
        // `quit` goes only to the daemon given, proven on the socket; the process given is
        // signalled when it lingers. Nothing else is touched.
        if let Some(p) = daemon {
            self.kill(p);
        }
        if self.daemon_on(pipe).is_none() {
            self.daemons.borrow_mut().remove(pipe);
            self.hung.borrow_mut().remove(pipe);
        }
    }

    fn find_daemon(&self, pipe: &Path) -> Option<ProcId> {
        self.record(Call::FindDaemon { at: at(pipe) });
        self.daemon_on(pipe)
    }
}

/// The doing layer holds its control in a box; tests keep the fake and lend it.
impl MpsControl for &FakeControl {
    fn binary(&self) -> &Path {
        MpsControl::binary(*self)
    }
    fn start(
        &self,
        uuid: &str,
        dirs: &MpsDirs,
        multiuser: bool,
        ready_timeout: Duration,
    ) -> Result<ProcId, MpsError> {
        MpsControl::start(*self, uuid, dirs, multiuser, ready_timeout)
    }
    fn answers(&self, pipe: &Path, daemon: ProcId) -> bool {
        MpsControl::answers(*self, pipe, daemon)
    }
    fn refresh(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
        MpsControl::refresh(*self, pipe, daemon, limits)
    }
    fn set_defaults(&self, pipe: &Path, daemon: ProcId, limits: &Limits) -> Result<(), MpsError> {
        MpsControl::set_defaults(*self, pipe, daemon, limits)
    }
    fn defaults(&self, pipe: &Path, daemon: ProcId) -> Result<Limits, MpsError> {
        MpsControl::defaults(*self, pipe, daemon)
    }
    fn stop(&self, pipe: &Path, daemon: Option<ProcId>) {
        MpsControl::stop(*self, pipe, daemon);
    }
    fn find_daemon(&self, pipe: &Path) -> Option<ProcId> {
        MpsControl::find_daemon(*self, pipe)
    }
}
