//! The process-wide limiter: limits read once, the shared region, this process's slot and the
//! allocations it has counted. `None` (inert) when no limit is configured.
#![forbid(unsafe_code)]

use crate::biased::Biased;
use crate::driver::cuda as drv;
use crate::limits::{self, Limits, MAX_DEVICES};
use crate::region::{self, OpenError, Region};
use crate::sm::{self, Sm};
use crate::sys;
use rustc_hash::FxHashMap as HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Kinds of counted objects: device pointers, `cuMemCreate` handles, arrays and mipmapped
/// arrays live in separate key spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Ptr,
    Handle,
    Array,
    Mipmapped,
}

/// What one counted allocation holds.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    size: u64,
    /// The region's process slot (< `MAX_PROCS`) and device entry (< `MAX_DEVICES`), small so
    /// that a table entry stays small.
    slot: u16,
    dev: u8,
    /// The context that owns it (0: none; `cuMemCreate` memory belongs to the process).
    ctx: usize,
    /// The process that counted it: a forked child inherits the table but not the memory.
    pid: u32,
}

const _: () = assert!(region::MAX_PROCS <= u16::MAX as usize && MAX_DEVICES <= u8::MAX as usize);

/// The counted allocations, one map per [`Kind`] (each its own key space), keyed by pointer
/// or handle.
#[derive(Default)]
struct Allocs {
    by_kind: [HashMap<u64, Counted>; 4],
}

impl Allocs {
    #[inline]
    fn of(&mut self, kind: Kind) -> &mut HashMap<u64, Counted> {
        &mut self.by_kind[kind as usize]
    }

    fn len(&self) -> usize {
        self.by_kind.iter().map(HashMap::len).sum()
    }
}

/// A reservation made before calling the driver.
#[derive(Debug, Clone, Copy)]
pub struct Ticket(Counted);

impl Ticket {
    /// Bytes reserved.
    pub fn size(&self) -> u64 {
        self.0.size
    }
}

/// A context whose own footprint was measured: its device and the bytes charged.
#[derive(Debug, Clone, Copy)]
struct Footprint {
    ord: usize,
    bytes: u64,
}

/// The contexts this process created (context → CUDA ordinal) and the measured footprints.
/// The footprint stays counted while any context of the process on that device lives: the
/// driver's per-device share goes only with the last one.
#[derive(Default)]
struct Footprints {
    live: HashMap<usize, usize>,
    measured: HashMap<usize, Footprint>,
}

pub struct Limiter {
    pub limits: Limits,
    /// Whether any device has a memory cap ([`Limits::any_mem`], asked on every allocation).
    pub any_mem: bool,
    pub region: &'static Region,
    region_path: Option<PathBuf>,
    /// Why allocations are refused (the shared file has another layout), if they are.
    refused: OnceLock<String>,
    pub sm: Sm,
    /// Every counted allocation. Taken once per allocation and once per free, for one map
    /// operation: a lock biased to the thread that allocates (no atomic read-modify-write on
    /// that thread's allocations and frees; a spin lock, one atomic operation per critical
    /// section, for everyone once another thread came).
    allocs: Biased<Allocs>,
    /// How many allocations `allocs` holds (written under its lock): a free finds nothing to
    /// forget without taking the lock when it is 0.
    allocs_live: AtomicUsize,
    footprints: Mutex<Footprints>,
    /// Region device entry per CUDA ordinal (`u32::MAX`: not yet known).
    ord_dev: [AtomicU32; MAX_DEVICES],
    footprint_done: [AtomicBool; MAX_DEVICES],
    /// Whether the refusal of a device without a readable UUID was said, per CUDA ordinal.
    unidentified_said: [AtomicBool; MAX_DEVICES],
}

static LIMITER: OnceLock<Option<Limiter>> = OnceLock::new();
static OWN_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
static OWN_PID: AtomicU32 = AtomicU32::new(0);
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
    OWN_PID.store(sys::getpid(), Ordering::SeqCst);
    if let Some(Some(l)) = LIMITER.get() {
        l.allocs.after_fork_child();
    }
    sm::after_fork_child();
    crate::pools::POOLS.after_fork_child();
}

/// The message for a shared file that is not (or no longer) this library's layout.
fn refusal(path: &Path, e: &OpenError) -> String {
    format!(
        "shared accounting file {}: {e}: another program (HAMi-core's libvgpu.so reads the same \
         CUDA_DEVICE_MEMORY_SHARED_CACHE variable) or another gpushare version uses it; refusing \
         device-memory allocations rather than counting them apart: give this container its own \
         file or remove the stale one",
        path.display()
    )
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
    let refused = OnceLock::new();
    let (region, region_path) = match region::open(&path) {
        Ok(r) => (r, Some(path)),
        Err(e @ OpenError::Mismatch { .. }) => {
            let msg = refusal(&path, &e);
            sys::error(&msg);
            let _ = refused.set(msg);
            (region::private(), None)
        }
        Err(e) => {
            sys::warn(&format!(
                "shared accounting file {}: {e}; counting this process's memory alone",
                path.display()
            ));
            (region::private(), None)
        }
    };
    OWN_PID.store(sys::getpid(), Ordering::SeqCst);
    sys::at_fork_child(after_fork_child);
    Some(Limiter {
        sm: Sm::new(&limits),
        any_mem: limits.any_mem(),
        limits,
        region,
        region_path,
        refused,
        allocs: Biased::new(Allocs::default()),
        allocs_live: AtomicUsize::new(0),
        footprints: Mutex::new(Footprints::default()),
        ord_dev: [const { AtomicU32::new(u32::MAX) }; MAX_DEVICES],
        footprint_done: [const { AtomicBool::new(false) }; MAX_DEVICES],
        unidentified_said: [const { AtomicBool::new(false) }; MAX_DEVICES],
    })
}

impl Limiter {
    /// Memory cap of CUDA ordinal `ord`.
    pub fn mem_limit(&self, ord: usize) -> Option<u64> {
        self.limits.mem.get(ord).copied().flatten()
    }

    /// Whether the shared file can be used: its header is still this library's layout. The
    /// first time it is not, the refusal is recorded and printed once.
    #[inline]
    pub fn shared_ok(&self) -> bool {
        if self.refused.get().is_some() {
            return false;
        }
        if self.region.layout_ok() {
            return true;
        }
        self.refuse_changed();
        false
    }

    #[cold]
    fn refuse_changed(&self) {
        let path = self
            .region_path
            .as_deref()
            .unwrap_or(Path::new("(private)"));
        let msg = refusal(path, &self.region.header());
        if self.refused.set(msg.clone()).is_ok() {
            sys::error(&msg);
        }
    }

    /// This process's slot in the region.
    pub fn slot(&self) -> Option<usize> {
        if !self.shared_ok() {
            return None;
        }
        self.slot_checked()
    }

    /// [`Self::slot`] once [`Self::shared_ok`] said yes.
    #[inline]
    fn slot_checked(&self) -> Option<usize> {
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
    #[inline]
    pub fn dev_entry(&self, ord: usize) -> Option<usize> {
        let cached = self.ord_dev.get(ord)?.load(Ordering::Acquire);
        if cached != u32::MAX {
            return Some(cached as usize);
        }
        self.find_dev_entry(ord)
    }

    /// [`Self::dev_entry`] the first time: finds (or adds) the device in the shared file.
    #[cold]
    #[inline(never)]
    fn find_dev_entry(&self, ord: usize) -> Option<usize> {
        if !self.shared_ok() {
            return None;
        }
        let Some(uuid) = drv::uuid(ord) else {
            self.refuse_unidentified(ord);
            return None;
        };
        let e = self.region.dev_entry(
            self.region_path.as_deref(),
            &uuid,
            self.mem_limit(ord).unwrap_or(0),
        )?;
        self.ord_dev[ord].store(e as u32, Ordering::Release);
        Some(e)
    }

    /// CUDA ordinal `ord` has no UUID the limiter can read: its memory cannot be counted in
    /// the container's shared file, so its allocations are refused. Said once per device.
    #[cold]
    fn refuse_unidentified(&self, ord: usize) {
        let Some(said) = self.unidentified_said.get(ord) else {
            return;
        };
        if self.mem_limit(ord).is_some() && !said.swap(true, Ordering::AcqRel) {
            sys::error(&format!(
                "cuDeviceGetUuid failed for CUDA device {ord}: its memory cannot be counted \
                 against the container's cap; refusing device-memory allocations on it"
            ));
        }
    }

    /// Reserves `size` bytes on `ord` before the driver call. `Ok(None)`: not counted
    /// (device uncapped or bookkeeping unavailable); `Err(())`: over the cap, or the shared
    /// file has another layout (fail closed).
    #[allow(clippy::result_unit_err)]
    #[inline]
    pub fn reserve(&self, ord: usize, size: u64) -> Result<Option<Ticket>, ()> {
        let Some(limit) = self.mem_limit(ord) else {
            return Ok(None);
        };
        if !self.shared_ok() {
            return Err(());
        }
        // A device that cannot be identified fails closed (said once, on stderr).
        let Some(dev) = self.dev_entry(ord) else {
            return Err(());
        };
        let Some(slot) = self.slot_checked() else {
            return Ok(None);
        };
        let pid = OWN_PID.load(Ordering::Relaxed);
        if self.region.try_reserve(slot, dev, size, limit, pid) {
            Ok(Some(Ticket(Counted {
                slot: slot as u16,
                dev: dev as u8,
                size,
                ctx: 0,
                pid,
            })))
        } else {
            Err(())
        }
    }

    /// Grows or shrinks a reservation to `size` (the driver's own figure, known only after the
    /// call). Growth is checked against the cap: `Err` (the ticket unchanged) when it does not
    /// fit.
    pub fn resize(&self, ord: usize, t: Ticket, size: u64) -> Result<Ticket, Ticket> {
        let c = t.0;
        if size <= c.size {
            self.release_bytes(&c, c.size - size);
            return Ok(Ticket(Counted { size, ..c }));
        }
        match self.reserve(ord, size - c.size) {
            Ok(Some(extra)) => {
                // Both live in this process's slot on the same device: merge them.
                debug_assert!(extra.0.slot == c.slot && extra.0.dev == c.dev);
                Ok(Ticket(Counted { size, ..c }))
            }
            Ok(None) => Ok(t),
            Err(()) => Err(t),
        }
    }

    #[inline]
    fn release_bytes(&self, c: &Counted, bytes: u64) {
        if bytes != 0 && c.pid == OWN_PID.load(Ordering::Relaxed) && self.shared_ok() {
            self.region
                .release(usize::from(c.slot), usize::from(c.dev), bytes);
        }
    }

    /// Gives a reservation back (the driver call failed).
    pub fn unreserve(&self, t: Ticket) {
        self.release_bytes(&t.0, t.0.size);
    }

    /// Remembers a successful allocation, owned by context `ctx` (0: by the process), so its
    /// free, or its context's destruction, can be matched.
    pub fn commit(&self, kind: Kind, key: u64, t: Ticket, ctx: usize) {
        let old = {
            let mut allocs = self.allocs.lock();
            let old = allocs.of(kind).insert(key, Counted { ctx, ..t.0 });
            self.allocs_live.store(allocs.len(), Ordering::Release);
            old
        };
        if let Some(c) = old {
            // The driver reused a key we still counted: the earlier free bypassed us.
            self.release_bytes(&c, c.size);
        }
    }

    /// Forgets an allocation after a successful free; unknown keys are left alone.
    pub fn forget(&self, kind: Kind, key: u64) {
        // The allocation being freed was committed before the program could free it, so its
        // count is visible here.
        if self.allocs_live.load(Ordering::Acquire) == 0 {
            return;
        }
        let c = {
            let mut allocs = self.allocs.lock();
            let c = allocs.of(kind).remove(&key);
            self.allocs_live.store(allocs.len(), Ordering::Release);
            c
        };
        if let Some(c) = c {
            self.release_bytes(&c, c.size);
        }
    }

    /// Context `ctx` was destroyed: the driver freed everything it owned, and its own
    /// footprint, if this process measured one.
    pub fn forget_context(&self, ctx: usize) {
        if ctx == 0 {
            return;
        }
        let gone: Vec<Counted> = {
            let mut allocs = self.allocs.lock();
            let mut gone = Vec::new();
            for map in &mut allocs.by_kind {
                map.retain(|_, c| {
                    let owned = c.ctx == ctx;
                    if owned {
                        gone.push(*c);
                    }
                    !owned
                });
            }
            self.allocs_live.store(allocs.len(), Ordering::Release);
            gone
        };
        for c in &gone {
            self.release_bytes(c, c.size);
        }
        let credit = {
            let mut fps = self.footprints.lock().unwrap_or_else(|e| e.into_inner());
            fps.live.remove(&ctx);
            match fps.measured.remove(&ctx) {
                Some(fp) => {
                    let heir = fps
                        .live
                        .iter()
                        .find(|&(_, &o)| o == fp.ord)
                        .map(|(&c, _)| c);
                    match heir {
                        Some(other) => {
                            fps.measured.insert(other, fp);
                            None
                        }
                        None => Some(fp),
                    }
                }
                None => None,
            }
        };
        if let Some(fp) = credit {
            self.credit(fp.ord, fp.bytes);
            // The next context on the device is measured again.
            if let Some(done) = self.footprint_done.get(fp.ord) {
                done.store(false, Ordering::Release);
            }
        }
    }

    /// Records context `ctx` on `ord`, just created (or the primary context, retained).
    pub fn context_created(&self, ctx: usize, ord: usize) {
        if ctx != 0 {
            self.footprints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .live
                .insert(ctx, ord);
        }
    }

    /// Whether the context footprint on `ord` still has to be measured (true once, until the
    /// measured context's device has no context of this process left).
    pub fn take_footprint_turn(&self, ord: usize) -> bool {
        self.mem_limit(ord).is_some()
            && self
                .footprint_done
                .get(ord)
                .is_some_and(|f| !f.swap(true, Ordering::AcqRel))
    }

    /// Counts the own footprint of context `ctx` on `ord` (no cap check: the context exists
    /// already); credited again when the last context of the process on `ord` is destroyed.
    pub fn add_footprint(&self, ctx: usize, ord: usize, bytes: u64) {
        self.charge(ord, bytes);
        if ctx != 0 && bytes != 0 {
            self.footprints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .measured
                .insert(ctx, Footprint { ord, bytes });
        }
    }

    /// Gives the footprint-measuring turn on `ord` back (the context creation failed).
    pub fn return_footprint_turn(&self, ord: usize) {
        if let Some(done) = self.footprint_done.get(ord) {
            done.store(false, Ordering::Release);
        }
    }

    /// Charges `bytes` on `ord` without a cap check (memory the driver already handed out).
    pub fn charge(&self, ord: usize, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let (Some(dev), Some(slot)) = (self.dev_entry(ord), self.slot()) {
            self.region.add(slot, dev, bytes);
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

    /// Bytes the container uses on region entry `dev` (dead processes reclaimed first). With a
    /// shared file of another layout: `u64::MAX` (nothing is free).
    pub fn container_used(&self, dev: usize) -> u64 {
        if !self.shared_ok() {
            return u64::MAX;
        }
        self.region.reclaim_dead(sys::getpid());
        self.region.used(dev)
    }

    /// Pids of the container's processes in the shared file (none if it has another layout).
    pub fn member_pids(&self) -> Vec<u32> {
        if self.shared_ok() {
            self.region.pids()
        } else {
            Vec::new()
        }
    }
}
