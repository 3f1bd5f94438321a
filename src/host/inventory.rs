//! The real [`Inventory`]: NVML, loaded from the configured library; [`OnFirstUse`], which
//! loads it only when a call needs it; and [`Unavailable`], for when NVML cannot be loaded but
//! records must still be kept.

use nvml_wrapper_sys::bindings as nv;

use crate::config::Config;
use crate::sys::nvml::{Device, Nvml, NvmlError};
use crate::vocab::memcap::DriverLimits;
use crate::vocab::{is_safe_name, ComputeMode, Gpu, Inventory, InventoryError};

/// The real inventory, from the configured NVML library.
///
/// # Errors
/// [`InventoryError::Load`] when the library cannot be loaded.
pub fn open(cfg: &Config) -> Result<Box<dyn Inventory>, InventoryError> {
    Ok(Box::new(NvmlInventory::open(&cfg.nvml.library)?))
}

/// The inventory of a command that plans containers: NVML behind the GPU snapshot, so that a
/// join of a running daemon loads no NVML (see [`crate::host::snapshot`]).
///
/// # Errors
/// None itself: NVML is loaded on first need, and its errors come from the calls.
pub fn open_for_planning(cfg: &Config) -> Result<Box<dyn Inventory>, InventoryError> {
    let library = cfg.nvml.library.clone();
    let open: crate::host::snapshot::Opener =
        Box::new(move || NvmlInventory::open(&library).map(|n| Box::new(n) as Box<dyn Inventory>));
    Ok(Box::new(crate::host::snapshot::Snapshotted::new(
        &cfg.state_dir,
        &cfg.nvml.library,
        open,
    )))
}

/// The real inventory: NVML, loaded from a configured library path.
pub struct NvmlInventory {
    nvml: Nvml,
}

impl NvmlInventory {
    /// Loads and initialises NVML from `library` (a soname or a path).
    ///
    /// # Errors
    /// [`InventoryError::Load`] when the library is missing or `nvmlInit` fails.
    pub fn open(library: &str) -> Result<Self, InventoryError> {
        let nvml = Nvml::open(library).map_err(|source| InventoryError::Load {
            library: library.to_owned(),
            source,
        })?;
        Ok(Self { nvml })
    }

    /// GPU `index`'s handle.
    fn device(&self, index: u32) -> Result<Device<'_>, InventoryError> {
        Self::call("nvmlDeviceGetHandleByIndex", self.nvml.device(index))
    }

    /// The device, once the driver is known to export the memory limits, or why not.
    fn limits_on(&self, call: &'static str, index: u32) -> Result<Device<'_>, InventoryError> {
        if !self.nvml.has_memory_limits() {
            return Err(not_exported(call));
        }
        self.device(index)
    }

    fn call<T>(call: &'static str, r: Result<T, NvmlError>) -> Result<T, InventoryError> {
        r.map_err(|source| InventoryError::Call { call, source })
    }
}

impl Inventory for NvmlInventory {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        let count = Self::call("nvmlDeviceGetCount", self.nvml.device_count())?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count.min(1024) {
            let dev = self.device(index)?;
            let uuid = Self::call("nvmlDeviceGetUUID", self.nvml.uuid(dev))?;
            if !is_safe_name(&uuid) {
                return Err(InventoryError::BadUuid(uuid));
            }
            let minor = self.nvml.minor_number(dev).unwrap_or(index);
            out.push(Gpu { index, uuid, minor });
        }
        Ok(out)
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, InventoryError> {
        let dev = self.device(index)?;
        let m = Self::call("nvmlDeviceGetComputeMode", self.nvml.compute_mode(dev))?;
        Ok(match m {
            nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT => ComputeMode::Default,
            nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS => {
                ComputeMode::ExclusiveProcess
            }
            // PROHIBITED, and the retired EXCLUSIVE_THREAD: no process may share it.
            _ => ComputeMode::Prohibited,
        })
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), InventoryError> {
        let dev = self.device(index)?;
        let m = match mode {
            ComputeMode::Default => nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
            ComputeMode::ExclusiveProcess => {
                nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            }
            ComputeMode::Prohibited => nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
        };
        Self::call(
            "nvmlDeviceSetComputeMode",
            self.nvml.set_compute_mode(dev, m),
        )
    }

    fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
        let dev = self.device(index)?;
        Self::call("nvmlDeviceGetMemoryInfo", self.nvml.memory_total(dev))
    }

    /// Both functions exported (whether the driver takes a given cgroup is asked of it with
    /// [`Inventory::memory_limits`]).
    fn has_memory_limits(&self, _index: u32) -> bool {
        self.nvml.has_memory_limits()
    }

    fn set_memory_limits(
        &self,
        index: u32,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), InventoryError> {
        let dev = self.limits_on(SET_LIMITS, index)?;
        let ns = namespace_cstr(namespace, SET_LIMITS)?;
        let rc = self
            .nvml
            .set_memory_limits(dev, &ns, soft, hard)
            .ok_or_else(|| not_exported(SET_LIMITS))?;
        code(SET_LIMITS, rc)
    }

    fn memory_limits(&self, index: u32, namespace: &str) -> Result<DriverLimits, InventoryError> {
        let dev = self.limits_on(GET_LIMITS, index)?;
        let ns = namespace_cstr(namespace, GET_LIMITS)?;
        let (rc, soft, hard, used) = self
            .nvml
            .memory_limits(dev, &ns)
            .ok_or_else(|| not_exported(GET_LIMITS))?;
        code(GET_LIMITS, rc)?;
        Ok(DriverLimits { soft, hard, used })
    }
}

/// The error of a memory-limit call this driver's NVML does not export.
fn not_exported(call: &'static str) -> InventoryError {
    InventoryError::Code {
        call,
        code: NVML_ERROR_FUNCTION_NOT_FOUND,
        what: "this driver's NVML does not export it (r615 or later has it)",
    }
}

const SET_LIMITS: &str = "nvmlDeviceSetMemoryLimits_v1";
const GET_LIMITS: &str = "nvmlDeviceGetMemoryLimits_v1";
const NVML_ERROR_FUNCTION_NOT_FOUND: u32 = 13;

fn namespace_cstr(
    namespace: &str,
    call: &'static str,
) -> Result<std::ffi::CString, InventoryError> {
    std::ffi::CString::new(namespace).map_err(|_| InventoryError::Code {
        call,
        code: 2,
        what: "the cgroup path has a NUL byte",
    })
}

/// An NVML return code as a result, with nvml.h's meaning of the codes these calls return.
fn code(call: &'static str, rc: u32) -> Result<(), InventoryError> {
    let what = match rc {
        0 => return Ok(()),
        1 => "NVML is not initialised",
        2 => "invalid argument",
        3 => "not supported on this GPU or driver",
        4 => "no permission (setting limits needs root)",
        6 => "no such cgroup, or its cgroup has no dmem controller",
        13 => "not in this driver's NVML",
        15 => "the GPU is lost",
        _ => "driver error",
    };
    Err(InventoryError::Code {
        call,
        code: rc,
        what,
    })
}

/// The inventory of `poststop` and of each release step of a reaper (`reap`): NVML loaded at
/// the first call that needs it. A release that
/// only drops a client from a GPU other clients keep loads none (the real library takes about
/// 50 ms to load here, more on a node with GPUs); one that restores a compute mode or clears a
/// driver limit loads it then. After a failed load every call fails as [`Unavailable`]'s do,
/// and [`Inventory::unavailable`] says why.
pub fn open_on_first_use(cfg: &Config) -> Result<Box<dyn Inventory>, InventoryError> {
    Ok(Box::new(OnFirstUse::new(&cfg.nvml.library)))
}

/// See [`open_on_first_use`].
pub struct OnFirstUse {
    library: String,
    nvml: std::cell::OnceCell<Result<NvmlInventory, Unavailable>>,
}

impl OnFirstUse {
    pub fn new(library: &str) -> Self {
        Self {
            library: library.to_owned(),
            nvml: std::cell::OnceCell::new(),
        }
    }

    fn real(&self) -> Result<&NvmlInventory, InventoryError> {
        self.nvml
            .get_or_init(|| NvmlInventory::open(&self.library).map_err(Unavailable::new))
            .as_ref()
            .map_err(Unavailable::err)
    }
}

impl Inventory for OnFirstUse {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        self.real()?.gpus()
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, InventoryError> {
        self.real()?.compute_mode(index)
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), InventoryError> {
        self.real()?.set_compute_mode(index, mode)
    }

    fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
        self.real()?.memory_total(index)
    }

    fn has_memory_limits(&self, index: u32) -> bool {
        self.real().is_ok_and(|n| n.has_memory_limits(index))
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

    fn memory_limits(&self, index: u32, namespace: &str) -> Result<DriverLimits, InventoryError> {
        self.real()?.memory_limits(index, namespace)
    }

    fn unavailable(&self) -> Option<&InventoryError> {
        self.nvml.get()?.as_ref().err().map(Unavailable::why)
    }
}

/// An inventory for when NVML cannot be loaded: every call fails with
/// [`InventoryError::NotLoaded`], whose source is the load's own error. Lets a release still
/// clean records up.
pub struct Unavailable(std::sync::Arc<InventoryError>);

impl Unavailable {
    pub fn new(why: InventoryError) -> Self {
        Self(std::sync::Arc::new(why))
    }

    /// Why NVML could not be loaded.
    pub fn why(&self) -> &InventoryError {
        &self.0
    }

    fn err(&self) -> InventoryError {
        InventoryError::NotLoaded(self.0.clone())
    }
}

impl Inventory for Unavailable {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        Err(self.err())
    }

    fn compute_mode(&self, _index: u32) -> Result<ComputeMode, InventoryError> {
        Err(self.err())
    }

    fn set_compute_mode(&self, _index: u32, _mode: ComputeMode) -> Result<(), InventoryError> {
        Err(self.err())
    }

    /// Not "does not report sizes" (the default): why NVML is not there.
    fn memory_total(&self, _index: u32) -> Result<u64, InventoryError> {
        Err(self.err())
    }

    fn unavailable(&self) -> Option<&InventoryError> {
        Some(self.why())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_keeps_the_load_error_as_the_source_of_every_call() {
        let inv = Unavailable::new(InventoryError::BadUuid("../x".into()));
        let e = inv.gpus().unwrap_err();
        assert!(matches!(e, InventoryError::NotLoaded(_)), "{e:?}");
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(
            source.to_string(),
            InventoryError::BadUuid("../x".into()).to_string()
        );
        assert!(matches!(inv.why(), InventoryError::BadUuid(_)));
        let not_loaded = |r: Result<(), InventoryError>| {
            assert!(matches!(r, Err(InventoryError::NotLoaded(_))), "{r:?}");
        };
        not_loaded(inv.compute_mode(0).map(drop));
        not_loaded(inv.set_compute_mode(0, ComputeMode::Default));
        not_loaded(inv.memory_total(0).map(drop));
    }

    /// Nothing is loaded when the inventory is made; the first call loads, and a failed load
    /// fails every call after it, as [`Unavailable`] does, and is kept to be said.
    #[test]
    fn on_first_use_loads_at_the_first_call_and_keeps_a_failed_load() {
        let inv = OnFirstUse::new("/nonexistent/gpushare-test/libnvidia-ml.so.1");
        assert!(
            inv.unavailable().is_none(),
            "a load was tried before any call"
        );
        let e = inv.compute_mode(0).unwrap_err();
        assert!(matches!(e, InventoryError::NotLoaded(_)), "{e:?}");
        assert!(
            matches!(inv.unavailable(), Some(InventoryError::Load { .. })),
            "{:?}",
            inv.unavailable()
        );
        assert!(matches!(
            inv.set_compute_mode(0, ComputeMode::Default),
            Err(InventoryError::NotLoaded(_))
        ));
        assert!(matches!(
            inv.set_memory_limits(0, "/sys/fs/cgroup/c", 0, 1),
            Err(InventoryError::NotLoaded(_))
        ));
        assert!(!inv.has_memory_limits(0));
    }

    #[test]
    fn nvml_return_codes_say_what_they_mean() {
        assert!(code("x", 0).is_ok());
        for (rc, what) in [
            (1, "not initialised"),
            (2, "invalid argument"),
            (3, "not supported"),
            (4, "no permission"),
            (6, "no such cgroup"),
            (13, "not in this driver's NVML"),
            (15, "lost"),
            (999, "driver error"),
        ] {
            match code("nvmlX", rc) {
                Err(InventoryError::Code {
                    call,
                    code,
                    what: w,
                }) => {
                    assert_eq!((call, code), ("nvmlX", rc));
                    assert!(w.contains(what), "{rc}: {w}");
                }
                other => panic!("{rc}: {other:?}"),
            }
        }
        assert!(namespace_cstr("/a", "x").is_ok_and(|c| c.as_bytes() == b"/a"));
        assert!(matches!(
            namespace_cstr("/a\0b", "x"),
            Err(InventoryError::Code { code: 2, .. })
        ));
    }

    /// NVML as gpushare calls it, on the TEST-ONLY simulated driver (two GPUs of 80 and
    /// 40 GiB, as `GPUSHARE_SIM_DEVICES` sets them).
    #[test]
    fn nvml_inventory_on_the_simulated_driver() {
        let dir = tempfile::tempdir().unwrap();
        let lib = crate::host::tests::simulated_nvml_at(&dir.path().join("libnvidia-ml-sim.so"));
        let _one = crate::host::tests::SIMULATED_NVML
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The simulated driver reads these once, at its first call.
        std::env::set_var("GPUSHARE_SIM_STATE", dir.path().join("sim"));
        std::env::set_var("GPUSHARE_SIM_DEVICES", "81920,40960");
        let inv = NvmlInventory::open(&lib).expect("the simulated NVML");
        let gpus = inv.gpus().unwrap();
        assert_eq!(gpus.len(), 2, "{gpus:?}");
        for (i, g) in gpus.iter().enumerate() {
            assert_eq!(g.index, i as u32);
            assert!(g.uuid.starts_with("GPU-") && is_safe_name(&g.uuid), "{g:?}");
        }
        assert_ne!(gpus[0].uuid, gpus[1].uuid);
        assert_eq!(inv.memory_total(0).unwrap(), 81920 << 20);
        assert_eq!(inv.memory_total(1).unwrap(), 40960 << 20);
        // Compute modes are set and read back, and the GPUs keep their own.
        assert_eq!(inv.compute_mode(0).unwrap(), ComputeMode::Default);
        for m in [
            ComputeMode::ExclusiveProcess,
            ComputeMode::Prohibited,
            ComputeMode::Default,
        ] {
            inv.set_compute_mode(0, m).unwrap();
            assert_eq!(inv.compute_mode(0).unwrap(), m);
        }
        inv.set_compute_mode(1, ComputeMode::ExclusiveProcess)
            .unwrap();
        assert_eq!(inv.compute_mode(0).unwrap(), ComputeMode::Default);
        assert_eq!(inv.compute_mode(1).unwrap(), ComputeMode::ExclusiveProcess);
        assert!(inv.compute_mode(7).is_err(), "no GPU 7");
        assert!(inv.set_compute_mode(7, ComputeMode::Default).is_err());
        // The driver's cgroup memory limits: set, read back, cleared; refused where the
        // driver refuses.
        assert!(inv.has_memory_limits(0));
        // A cgroup v2 directory: the host's first cgroup2 mount.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let Some(cg) = crate::host::mounts::entries(&mountinfo)
            .find(|e| e.fstype == "cgroup2")
            .map(|e| e.mount_point.to_string_lossy().into_owned())
        else {
            assert!(
                std::env::var_os("CI").is_none(),
                "no cgroup2 mount on this host"
            );
            eprintln!("SKIPPED: the driver's cgroup memory limits: no cgroup2 mount on this host");
            return;
        };
        let cg = cg.as_str();
        inv.set_memory_limits(0, cg, 1 << 30, 2 << 30).unwrap();
        let l = inv.memory_limits(0, cg).unwrap();
        assert_eq!((l.soft, l.hard), (1 << 30, 2 << 30));
        assert_eq!(
            inv.memory_limits(1, cg).unwrap().hard,
            crate::vocab::memcap::LIMIT_MAX,
            "per GPU"
        );
        inv.set_memory_limits(0, cg, 0, crate::vocab::memcap::LIMIT_MAX)
            .unwrap();
        assert_eq!(
            inv.memory_limits(0, cg).unwrap().hard,
            crate::vocab::memcap::LIMIT_MAX
        );
        for (ns, rc) in [("relative", 2), ("/nonexistent/cgroup", 6)] {
            match inv.set_memory_limits(0, ns, 0, 1 << 30) {
                Err(InventoryError::Code { code, .. }) => assert_eq!(code, rc, "{ns}"),
                other => panic!("{ns}: {other:?}"),
            }
        }
        // A library without the r615 functions has no driver limits.
        let mut old = inv;
        old.nvml.forget_memory_limits();
        assert!(!old.has_memory_limits(0));
        assert!(matches!(
            old.set_memory_limits(0, cg, 0, 1),
            Err(InventoryError::Code { code: 13, .. })
        ));
    }
}
