//! The process-wide limiter: limits read once, the shared region, this process's slot and the
//! allocations it has counted. `None` (inert) when no limit is configured.
#![forbid(unsafe_code)]

use crate::limits::{self, Limits, MAX_DEVICES};
use crate::region::{self, Region};
use crate::sm::Sm;
use crate::{cuda, sys};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Kinds of counted objects (device pointers and `cuMemCreate` handles live apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Ptr,
    Handle,
}

/// What one counted allocation holds.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    slot: usize,
    dev: usize,
    size: u64,
}

/// A reservation made before calling the driver.
#[derive(Debug, Clone, Copy)]
pub struct Ticket(Counted);

pub struct Limiter {
    pub limits: Limits,
    pub region: &'static Region,
    region_path: Option<PathBuf>,
    pub sm: Sm,
    allocs: Mutex<HashMap<(Kind, u64), Counted>>,
    /// Region device entry per CUDA ordinal (`u32::MAX`: not yet known).
    ord_dev: [AtomicU32; MAX_DEVICES],
    footprint_done: [AtomicBool; MAX_DEVICES],
}

static LIMITER: OnceLock<Option<Limiter>> = OnceLock::new();
static OWN_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
static SLOT_WARNED: AtomicBool = AtomicBool::new(false);

/// The limiter, initialised on first use; `None` when inert.
#[inline]
pub fn get() -> Option<&'static Limiter> {
    match LIMITER.get() {
        Some(l) => l.as_ref(),
        None => LIMITER.get_or_init(init).as_ref(),
    }
}

/// Reads the limits: env when it has any limit key, else the limits file.
pub fn read_limits() -> (Limits, Vec<String>) {
    // vars_os: `vars()` panics on a non-UTF-8 variable anywhere in the environment.
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
        .filter(|(k, _)| k.starts_with("CUDA_DEVICE_"))
        .map(|(k, v)| (k, v.to_string_lossy().into_owned()))
        .collect();
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut warnings = Vec::new();
    if !limits::env_has_limits(env.iter().map(|(k, _)| k.as_str())) {
        // A set-uid/set-gid program does not let its caller choose which files it opens.
        let file = sys::env("GPUSHARE_LIMITS_FILE")
            .filter(|s| !s.is_empty() && !sys::is_secure())
            .unwrap_or_else(|| limits::DEFAULT_LIMITS_FILE.to_owned());
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                let (p, w) = limits::parse_file(&text);
                pairs = p;
                warnings.extend(w.into_iter().map(|w| format!("{file}: {w}")));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warnings.push(format!("limits file {file}: {e}; no limits applied")),
        }
    }
    let secure = sys::is_secure();
    pairs.extend(
        env.into_iter()
            .filter(|(k, _)| !(secure && k == limits::KEY_CACHE)),
    );
    let (l, w) = limits::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    warnings.extend(w);
    (l, warnings)
}

fn shared_path(limits: &Limits) -> PathBuf {
    if let Some(p) = &limits.shared_cache {
        return p.clone();
    }
    let default = Path::new(limits::DEFAULT_SHARED_CACHE);
    if default.parent().is_some_and(Path::is_dir) {
        default.to_path_buf()
    } else {
        PathBuf::from(limits::FALLBACK_SHARED_CACHE)
    }
}

extern "C" fn after_fork_child() {
    OWN_SLOT.store(usize::MAX, Ordering::SeqCst);
    crate::sm::after_fork_child();
}

fn init() -> Option<Limiter> {
    let (limits, warnings) = read_limits();
    for w in &warnings {
        sys::warn(w);
    }
    if limits.is_empty() {
        return None;
    }
    let path = shared_path(&limits);
    let (region, region_path) = match region::open(&path) {
        Ok(r) => (r, Some(path)),
        Err(e) => {
            sys::warn(&format!(
                "shared accounting file {}: {e}; counting this process's memory alone",
                path.display()
            ));
            (region::private(), None)
        }
    };
    sys::at_fork_child(after_fork_child);
    Some(Limiter {
        sm: Sm::new(&limits),
        limits,
        region,
        region_path,
        allocs: Mutex::new(HashMap::new()),
        ord_dev: [const { AtomicU32::new(u32::MAX) }; MAX_DEVICES],
        footprint_done: [const { AtomicBool::new(false) }; MAX_DEVICES],
    })
}

impl Limiter {
    /// Memory cap of CUDA ordinal `ord`.
    pub fn mem_limit(&self, ord: usize) -> Option<u64> {
        self.limits.mem.get(ord).copied().flatten()
    }

    /// This process's slot in the region.
    pub fn slot(&self) -> Option<usize> {
        let s = OWN_SLOT.load(Ordering::Acquire);
        if s != usize::MAX {
            return Some(s);
        }
        let pid = sys::getpid();
        match self.region.claim(pid, sys::start_time(pid).unwrap_or(0)) {
            Some(s) => {
                OWN_SLOT.store(s, Ordering::Release);
                Some(s)
            }
            None => {
                if !SLOT_WARNED.swap(true, Ordering::Relaxed) {
                    sys::warn(
                        "shared accounting file is full; this process's memory is not counted",
                    );
                }
                None
            }
        }
    }

    /// Region device entry of CUDA ordinal `ord` (found by UUID).
    pub fn dev_entry(&self, ord: usize) -> Option<usize> {
        let cached = self.ord_dev.get(ord)?.load(Ordering::Acquire);
        if cached != u32::MAX {
            return Some(cached as usize);
        }
        let uuid = cuda::real_uuid(ord)?;
        let e = self.region.dev_entry(
            self.region_path.as_deref(),
            &uuid,
            self.mem_limit(ord).unwrap_or(0),
        )?;
        self.ord_dev[ord].store(e as u32, Ordering::Release);
        Some(e)
    }

    /// Reserves `size` bytes on `ord` before the driver call. `Ok(None)`: not counted
    /// (device uncapped or bookkeeping unavailable); `Err(())`: over the cap.
    #[allow(clippy::result_unit_err)]
    pub fn reserve(&self, ord: usize, size: u64) -> Result<Option<Ticket>, ()> {
        let Some(limit) = self.mem_limit(ord) else {
            return Ok(None);
        };
        let (Some(dev), Some(slot)) = (self.dev_entry(ord), self.slot()) else {
            return Ok(None);
        };
        if self
            .region
            .try_reserve(slot, dev, size, limit, sys::getpid())
        {
            Ok(Some(Ticket(Counted { slot, dev, size })))
        } else {
            Err(())
        }
    }

    /// Gives a reservation back (the driver call failed).
    pub fn unreserve(&self, t: Ticket) {
        self.region.release(t.0.slot, t.0.dev, t.0.size);
    }

    /// Remembers a successful allocation so its free can be matched.
    pub fn commit(&self, kind: Kind, key: u64, t: Ticket) {
        let old = self
            .allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((kind, key), t.0);
        if let Some(c) = old {
            // The driver reused a key we still counted: the earlier free bypassed us.
            self.region.release(c.slot, c.dev, c.size);
        }
    }

    /// Forgets an allocation after a successful free; unknown keys are left alone.
    pub fn forget(&self, kind: Kind, key: u64) {
        let c = self
            .allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(kind, key));
        if let Some(c) = c {
            self.region.release(c.slot, c.dev, c.size);
        }
    }

    /// Whether the context footprint on `ord` still has to be measured (true once).
    pub fn take_footprint_turn(&self, ord: usize) -> bool {
        self.mem_limit(ord).is_some()
            && self
                .footprint_done
                .get(ord)
                .is_some_and(|f| !f.swap(true, Ordering::AcqRel))
    }

    /// Counts a context's own footprint (no cap check: the context exists already).
    pub fn add_footprint(&self, ord: usize, bytes: u64) {
        if let (Some(dev), Some(slot)) = (self.dev_entry(ord), self.slot()) {
            self.region.add(slot, dev, bytes);
        }
    }

    /// Charges `bytes` on `ord` without a cap check (memory the driver already handed out).
    pub fn charge(&self, ord: usize, bytes: u64) {
        if bytes != 0 {
            self.add_footprint(ord, bytes);
        }
    }

    /// Gives back `bytes` charged on `ord`.
    pub fn credit(&self, ord: usize, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let (Some(dev), Some(slot)) = (self.dev_entry(ord), self.slot()) {
            self.region.release(slot, dev, bytes);
        }
    }

    /// Bytes the container uses on region entry `dev` (dead processes reclaimed first).
    pub fn container_used(&self, dev: usize) -> u64 {
        self.region.reclaim_dead(sys::getpid());
        self.region.used(dev)
    }
}
