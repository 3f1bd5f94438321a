//! The GPU list NVML last gave, kept in `<state>/inventory.json`, so that a container joining a
//! running MPS daemon is planned without loading NVML, whose initialisation takes tens of
//! milliseconds on a real node (about 50 ms for `libnvidia-ml.so.1` merely to report that no
//! driver is loaded, on a machine without a GPU).
//!
//! [`Snapshotted`] answers `gpus` and `memory_total` from the snapshot while its key matches:
//! this boot, this NVML library setting and, where the driver's proc files exist, this driver
//! version and this set of GPUs by PCI address. Anything that reads or changes a GPU's state
//! (compute modes) opens NVML, as does a missing or stale snapshot, which is written again
//! once the request has succeeded ([`Inventory::remember`]). Once NVML is open, a snapshot that was used is compared with what NVML lists; a
//! difference drops the snapshot and refuses the request with "retry".

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::vocab::{ComputeMode, Gpu, Inventory, InventoryError};

/// The snapshot's file name in the state directory.
pub const SNAPSHOT_FILE: &str = "inventory.json";

/// Layout version of the snapshot file.
const VERSION: u32 = 1;

/// Largest snapshot file read (16 GPUs take about 2 KiB).
const MAX_BYTES: u64 = 256 * 1024;

#[derive(Debug, Serialize, Deserialize)]
struct Snapshot {
    version: u32,
    key: String,
    gpus: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    index: u32,
    uuid: String,
    minor: u32,
    memory_total: Option<u64>,
}

impl Entry {
    fn gpu(&self) -> Gpu {
        Gpu {
            index: self.index,
            uuid: self.uuid.clone(),
            minor: self.minor,
        }
    }
}

/// Where the driver's proc files are; a seam for tests.
const DRIVER_PROC: &str = "/proc/driver/nvidia";

/// What a snapshot is valid for: this boot, the NVML `library` setting, and the driver's
/// version and GPUs (PCI addresses) as its proc files under `driver_proc` list them, where
/// they exist.
fn key_for(library: &str, driver_proc: &Path) -> String {
    let boot = crate::host::small_file::read_text("/proc/sys/kernel/random/boot_id", 64)
        .unwrap_or_default();
    let driver = std::fs::read_to_string(driver_proc.join("version")).unwrap_or_default();
    let mut gpus: Vec<String> = std::fs::read_dir(driver_proc.join("gpus"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    gpus.sort();
    format!(
        "boot={};library={library};driver={};gpus={}",
        boot.trim(),
        driver.lines().next().unwrap_or("").trim(),
        gpus.join(",")
    )
}

/// Opens the real inventory; owned, so that [`Snapshotted`] can be boxed as an [`Inventory`].
pub type Opener = Box<dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>>;

/// An [`Inventory`] that answers from the snapshot where it can and opens the real one (once)
/// where it must; see the module's text.
pub struct Snapshotted {
    path: PathBuf,
    key: String,
    /// The valid snapshot read at construction, if any.
    snapshot: Option<Vec<Entry>>,
    open: Opener,
    real: OnceCell<Box<dyn Inventory>>,
    /// What NVML listed, to save if the request succeeds.
    learned: std::cell::RefCell<Option<Snapshot>>,
}

impl Snapshotted {
    /// Reads the snapshot in `state_dir` for the NVML `library` setting; `open` opens NVML.
    pub fn new(state_dir: &Path, library: &str, open: Opener) -> Self {
        Self::with_driver_proc(state_dir, library, open, Path::new(DRIVER_PROC))
    }

    fn with_driver_proc(state_dir: &Path, library: &str, open: Opener, proc: &Path) -> Self {
        let path = state_dir.join(SNAPSHOT_FILE);
        let key = key_for(library, proc);
        let snapshot = read(&path)
            .filter(|s| s.version == VERSION && s.key == key && !s.gpus.is_empty())
            .map(|s| s.gpus);
        Self {
            path,
            key,
            snapshot,
            open,
            real: OnceCell::new(),
            learned: std::cell::RefCell::new(None),
        }
    }

    /// Whether answers come from a snapshot.
    pub fn from_snapshot(&self) -> bool {
        self.snapshot.is_some()
    }

    /// The real inventory, opened on first use; a snapshot in use must list what it lists.
    fn real(&self) -> Result<&dyn Inventory, InventoryError> {
        if let Some(r) = self.real.get() {
            return Ok(r.as_ref());
        }
        let r = (self.open)()?;
        if let Some(snap) = &self.snapshot {
            let live = r.gpus()?;
            let saw: Vec<Gpu> = snap.iter().map(Entry::gpu).collect();
            if live != saw {
                let _ = std::fs::remove_file(&self.path);
                return Err(InventoryError::Changed {
                    path: self.path.display().to_string(),
                });
            }
        }
        Ok(self.real.get_or_init(|| r).as_ref())
    }

    /// The snapshot of `gpus` as `real` reports them.
    fn learn(&self, real: &dyn Inventory, gpus: &[Gpu]) -> Snapshot {
        Snapshot {
            version: VERSION,
            key: self.key.clone(),
            gpus: gpus
                .iter()
                .map(|g| Entry {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    minor: g.minor,
                    memory_total: real.memory_total(g.index).ok(),
                })
                .collect(),
        }
    }
}

/// Removes the snapshot in `state_dir` when it cannot be read or lists other GPUs than
/// `real` does now (for `gc`); says what it did. Nothing is done when `real` cannot answer.
pub fn drop_if_stale(state_dir: &Path, real: &dyn Inventory) -> Option<String> {
    let path = state_dir.join(SNAPSHOT_FILE);
    if !path.exists() {
        return None;
    }
    let why = match read(&path) {
        None => "it could not be read",
        Some(s) => {
            let live = real.gpus().ok()?;
            if s.gpus.iter().map(Entry::gpu).eq(live) {
                return None;
            }
            "NVML lists other GPUs now"
        }
    };
    std::fs::remove_file(&path).ok()?;
    Some(format!(
        "removed the saved GPU list {}: {why}",
        path.display()
    ))
}

fn read(path: &Path) -> Option<Snapshot> {
    let bytes = crate::host::small_file::read(path, MAX_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

impl Inventory for Snapshotted {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        if let Some(s) = &self.snapshot {
            return Ok(s.iter().map(Entry::gpu).collect());
        }
        let real = self.real()?;
        let gpus = real.gpus()?;
        if !gpus.is_empty() {
            *self.learned.borrow_mut() = Some(self.learn(real, &gpus));
        }
        Ok(gpus)
    }

    /// Saves what NVML listed; best effort (a later request tries again).
    fn remember(&self) {
        let Some(snap) = self.learned.borrow_mut().take() else {
            return;
        };
        let bytes = serde_json::to_vec_pretty(&snap).expect("snapshot serialises");
        if let Err(e) = crate::host::state::write_atomic(&self.path, &bytes, 0o600) {
            tracing::debug!(path = %self.path.display(), error = %e, "cannot save the GPU snapshot");
        }
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, InventoryError> {
        self.real()?.compute_mode(index)
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), InventoryError> {
        self.real()?.set_compute_mode(index, mode)
    }

    fn has_memory_limits(&self, index: u32) -> bool {
        self.real().is_ok_and(|r| r.has_memory_limits(index))
    }

    fn set_memory_limits(
        &self,
        index: u32,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), InventoryError> {
        self.real()?.set_memory_limits(index, namespace, soft, hard)
    }

    fn memory_limits(
        &self,
        index: u32,
        namespace: &str,
    ) -> Result<crate::vocab::memcap::DriverLimits, InventoryError> {
        self.real()?.memory_limits(index, namespace)
    }

    fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
        if let Some(e) = self
            .snapshot
            .as_ref()
            .and_then(|s| s.iter().find(|e| e.index == index))
        {
            return e.memory_total.ok_or_else(|| {
                InventoryError::Unavailable("NVML did not report this GPU's memory".into())
            });
        }
        self.real()?.memory_total(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A fake NVML: `gpus` GPUs of 80 GiB, counting how often it is opened.
    struct Fake {
        gpus: Vec<Gpu>,
    }

    impl Inventory for Fake {
        fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
            Ok(self.gpus.clone())
        }
        fn compute_mode(&self, _index: u32) -> Result<ComputeMode, InventoryError> {
            Ok(ComputeMode::Default)
        }
        fn set_compute_mode(&self, _index: u32, _mode: ComputeMode) -> Result<(), InventoryError> {
            Ok(())
        }
        /// 80 GiB, and 1 GiB more for each index above 0.
        fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
            Ok(u64::from(80 + index) << 30)
        }
        /// GPU 0 only.
        fn has_memory_limits(&self, index: u32) -> bool {
            index == 0
        }
        fn set_memory_limits(
            &self,
            index: u32,
            _namespace: &str,
            _soft: u64,
            _hard: u64,
        ) -> Result<(), InventoryError> {
            if index == 0 {
                Ok(())
            } else {
                Err(InventoryError::Unavailable("no limits on this GPU".into()))
            }
        }
    }

    fn gpus(uuids: &[&str]) -> Vec<Gpu> {
        uuids
            .iter()
            .enumerate()
            .map(|(i, u)| Gpu {
                index: i as u32,
                uuid: (*u).to_owned(),
                minor: i as u32,
            })
            .collect()
    }

    /// An opener of a fake listing `list` (shared, so a test can change it), counting opens.
    fn opener(list: Rc<std::cell::RefCell<Vec<Gpu>>>, opens: Rc<Cell<u32>>) -> Opener {
        Box::new(move || {
            opens.set(opens.get() + 1);
            Ok(Box::new(Fake {
                gpus: list.borrow().clone(),
            }) as Box<dyn Inventory>)
        })
    }

    struct World {
        dir: tempfile::TempDir,
        proc: PathBuf,
        list: Rc<std::cell::RefCell<Vec<Gpu>>>,
        opens: Rc<Cell<u32>>,
    }

    impl World {
        fn new(uuids: &[&str]) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let proc = dir.path().join("proc");
            std::fs::create_dir_all(proc.join("gpus/0000:01:00.0")).unwrap();
            std::fs::write(proc.join("version"), "NVRM version: 535.1\n").unwrap();
            Self {
                dir,
                proc,
                list: Rc::new(std::cell::RefCell::new(gpus(uuids))),
                opens: Rc::new(Cell::new(0)),
            }
        }
        /// The GPUs of a request that succeeded.
        fn remembered(&self, library: &str) -> Vec<Gpu> {
            let inv = self.inv(library);
            let g = inv.gpus().unwrap();
            inv.remember();
            g
        }
        fn inv(&self, library: &str) -> Snapshotted {
            Snapshotted::with_driver_proc(
                self.dir.path(),
                library,
                opener(self.list.clone(), self.opens.clone()),
                &self.proc,
            )
        }
    }

    #[test]
    fn the_second_plan_needs_no_nvml_and_a_gpu_change_needs_it_again() {
        let w = World::new(&["GPU-a", "GPU-b"]);
        let first = w.inv("libnvidia-ml.so.1");
        assert!(!first.from_snapshot());
        assert_eq!(first.gpus().unwrap(), gpus(&["GPU-a", "GPU-b"]));
        assert_eq!(w.opens.get(), 1);
        assert!(
            !w.inv("libnvidia-ml.so.1").from_snapshot(),
            "kept only once remembered"
        );
        first.remember();

        let second = w.inv("libnvidia-ml.so.1");
        assert!(second.from_snapshot());
        assert_eq!(second.gpus().unwrap(), gpus(&["GPU-a", "GPU-b"]));
        assert_eq!(second.memory_total(0).unwrap(), 80 << 30);
        assert_eq!(
            second.memory_total(1).unwrap(),
            81 << 30,
            "each GPU its own"
        );
        assert_eq!(w.opens.get(), 1, "answered without opening NVML");
        // Compute modes always come from NVML.
        second.compute_mode(0).unwrap();
        assert_eq!(w.opens.get(), 2);

        // Another library setting, another driver version, another PCI set: not used.
        assert!(!w.inv("/opt/other/libnvidia-ml.so.1").from_snapshot());
        std::fs::write(w.proc.join("version"), "NVRM version: 550.2\n").unwrap();
        assert!(!w.inv("libnvidia-ml.so.1").from_snapshot());
        w.remembered("libnvidia-ml.so.1");
        assert!(w.inv("libnvidia-ml.so.1").from_snapshot(), "written again");
        std::fs::create_dir(w.proc.join("gpus/0000:02:00.0")).unwrap();
        assert!(!w.inv("libnvidia-ml.so.1").from_snapshot());
    }

    #[test]
    fn sixteen_gpus_fit_a_snapshot() {
        let uuids: Vec<String> = (0..16)
            .map(|i| format!("GPU-5a1e{i:04x}-0000-4000-8000-000000000000"))
            .collect();
        let refs: Vec<&str> = uuids.iter().map(String::as_str).collect();
        let w = World::new(&refs);
        assert_eq!(w.remembered("libnvidia-ml.so.1").len(), 16);
        let again = w.inv("libnvidia-ml.so.1");
        assert!(again.from_snapshot(), "the snapshot of 16 GPUs read back");
        assert_eq!(again.gpus().unwrap().len(), 16);
        assert_eq!(w.opens.get(), 1);
    }

    #[test]
    fn driver_limits_are_always_nvml_s() {
        let w = World::new(&["GPU-a", "GPU-b"]);
        w.remembered("libnvidia-ml.so.1");
        let inv = w.inv("libnvidia-ml.so.1");
        assert!(inv.from_snapshot());
        assert!(inv.has_memory_limits(0));
        assert!(!inv.has_memory_limits(1));
        inv.set_memory_limits(0, "/sys/fs/cgroup/x", 0, 1).unwrap();
        assert!(inv.set_memory_limits(1, "/sys/fs/cgroup/x", 0, 1).is_err());
        assert!(w.opens.get() >= 2, "asked of NVML");
    }

    #[test]
    fn a_snapshot_that_nvml_contradicts_is_dropped_and_the_request_refused() {
        let w = World::new(&["GPU-a", "GPU-b"]);
        w.remembered("lib");
        // The GPUs change without the key changing (a driver without proc files).
        *w.list.borrow_mut() = gpus(&["GPU-b", "GPU-a"]);
        let inv = w.inv("lib");
        assert!(inv.from_snapshot());
        let e = inv.set_compute_mode(0, ComputeMode::Default).unwrap_err();
        assert!(e.to_string().contains("retry"), "{e}");
        assert!(!w.dir.path().join(SNAPSHOT_FILE).exists());
        // The next one reads NVML and saves what it lists now.
        assert_eq!(w.remembered("lib"), gpus(&["GPU-b", "GPU-a"]));
        assert!(w.inv("lib").from_snapshot());
    }

    #[test]
    fn gc_drops_a_stale_or_unreadable_snapshot_and_keeps_a_good_one() {
        let w = World::new(&["GPU-a", "GPU-b"]);
        w.remembered("lib");
        let path = w.dir.path().join(SNAPSHOT_FILE);
        let nvml = Fake {
            gpus: gpus(&["GPU-a", "GPU-b"]),
        };
        assert_eq!(drop_if_stale(w.dir.path(), &nvml), None);
        assert!(path.exists());
        let other = Fake {
            gpus: gpus(&["GPU-a"]),
        };
        let said = drop_if_stale(w.dir.path(), &other).unwrap();
        assert!(said.contains("other GPUs"), "{said}");
        assert!(!path.exists());
        std::fs::write(&path, "{").unwrap();
        assert!(drop_if_stale(w.dir.path(), &nvml)
            .unwrap()
            .contains("could not be read"));
        assert_eq!(drop_if_stale(w.dir.path(), &nvml), None, "nothing left");
    }

    #[test]
    fn unreadable_snapshots_are_ignored() {
        let w = World::new(&["GPU-a"]);
        for bad in [
            &b"{"[..],
            b"[]",
            b"{\"version\":2,\"key\":\"x\",\"gpus\":[]}",
            &[0xff, 0xfe][..],
        ] {
            std::fs::write(w.dir.path().join(SNAPSHOT_FILE), bad).unwrap();
            let inv = w.inv("lib");
            assert!(!inv.from_snapshot());
            assert_eq!(inv.gpus().unwrap(), gpus(&["GPU-a"]));
        }
        // No GPUs listed: nothing is saved (and an empty snapshot is never used).
        let empty = World::new(&[]);
        assert!(empty.remembered("lib").is_empty());
        assert!(!empty.dir.path().join(SNAPSHOT_FILE).exists());
    }
}
