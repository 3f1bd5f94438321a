//! The shared accounting region: one memory-mapped, versioned file per container through which
//! all its processes share one memory cap.
//!
//! Lock-free on every path that counts memory: each process owns one slot (claimed by CAS on
//! its pid) and only ever adds to or subtracts from its own counters; a cap check adds first,
//! then sums all slots, and backs out if over, so concurrent allocators can both fail but never
//! both exceed the cap. `flock` is held only while the file is created and while a device
//! entry is added, never across a driver call. Slots of dead processes (pid gone, or its start
//! time, field 22 of `/proc/<pid>/stat`, changed) are reclaimed.

use crate::limits::MAX_DEVICES;
use crate::sys;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use gpushare_region::{uuid_words, DEV_IN_USE, RECLAIMING};
pub use gpushare_region::{MAGIC, MAX_PROCS, VERSION};

/// A device the container uses, keyed by UUID (never by an index, which differs between
/// CUDA ordinals and NVML indices and between processes).
#[repr(C)]
pub struct DevEntry {
    /// 0 free, 1 in use.
    pub state: AtomicU32,
    pub _pad: u32,
    pub uuid: [AtomicU64; 2],
    /// The cap the first process that used the device recorded (for NVML-only processes).
    pub limit: AtomicU64,
}

/// One process's counters.
#[repr(C)]
pub struct ProcSlot {
    pub pid: AtomicU32,
    pub _pad: u32,
    pub start_time: AtomicU64,
    pub used: [AtomicU64; MAX_DEVICES],
}

/// The file's layout (`gpushare_region`'s offsets, checked below at compile time).
#[repr(C)]
pub struct Region {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub size: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_procs: AtomicU32,
    pub proc_hwm: AtomicU32,
    pub _pad: u32,
    pub devs: [DevEntry; MAX_DEVICES],
    pub procs: [ProcSlot; MAX_PROCS],
}

const SIZE: usize = std::mem::size_of::<Region>();

// The struct is the shared definition's layout, field by field.
const _: () = {
    use gpushare_region as l;
    use std::mem::{offset_of, size_of};
    assert!(SIZE == l::SIZE);
    assert!(offset_of!(Region, magic) == l::header::MAGIC);
    assert!(offset_of!(Region, version) == l::header::VERSION);
    assert!(offset_of!(Region, size) == l::header::SIZE);
    assert!(offset_of!(Region, max_devices) == l::header::MAX_DEVICES);
    assert!(offset_of!(Region, max_procs) == l::header::MAX_PROCS);
    assert!(offset_of!(Region, proc_hwm) == l::header::PROC_HWM);
    assert!(offset_of!(Region, devs) == l::DEVS);
    assert!(offset_of!(Region, procs) == l::PROCS);
    assert!(size_of::<DevEntry>() == l::dev::LEN);
    assert!(offset_of!(DevEntry, state) == l::dev::STATE);
    assert!(offset_of!(DevEntry, uuid) == l::dev::UUID);
    assert!(offset_of!(DevEntry, limit) == l::dev::LIMIT);
    assert!(size_of::<ProcSlot>() == l::slot::LEN);
    assert!(offset_of!(ProcSlot, pid) == l::slot::PID);
    assert!(offset_of!(ProcSlot, start_time) == l::slot::START_TIME);
    assert!(offset_of!(ProcSlot, used) == l::slot::USED);
    assert!(MAX_DEVICES == l::MAX_DEVICES);
};

/// Why the shared file could not be used.
#[derive(Debug)]
pub enum OpenError {
    Io(&'static str, std::io::Error),
    Mismatch { magic: u64, version: u32, size: u32 },
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io(what, e) => write!(f, "{what}: {e}"),
            OpenError::Mismatch { magic, version, size } => write!(
                f,
                "layout mismatch (magic {magic:#x}, version {version}, size {size}; this library writes version {VERSION}, size {SIZE})"
            ),
        }
    }
}

struct Fd(i32);
impl Drop for Fd {
    fn drop(&mut self) {
        // An mmap keeps the open file description (and so a flock) alive after close:
        // unlock explicitly.
        // SAFETY: unlocking and closing an fd we own.
        unsafe {
            libc::flock(self.0, libc::LOCK_UN);
            libc::close(self.0);
        }
    }
}

fn last_err(what: &'static str) -> OpenError {
    OpenError::Io(what, std::io::Error::last_os_error())
}

fn map(fd: i32) -> Result<&'static Region, OpenError> {
    // SAFETY: shared mapping of SIZE bytes of a file at least that long (or anonymous when fd
    // is -1); checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            if fd < 0 {
                libc::MAP_SHARED | libc::MAP_ANONYMOUS
            } else {
                libc::MAP_SHARED
            },
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_err("mmap"));
    }
    // SAFETY: page-aligned mapping of SIZE bytes that is never unmapped; all fields are
    // atomics or plain padding, so shared mutation is sound.
    Ok(unsafe { &*(p as *const Region) })
}

/// An anonymous region: accounting for this process only (fallback when the file cannot be
/// opened).
pub fn private() -> &'static Region {
    let r = private_zeroed();
    r.init_header();
    r
}

fn private_zeroed() -> &'static Region {
    // Anonymous mappings cannot fail short of address-space exhaustion; then there is
    // nothing sane left to do but leak a zeroed heap allocation instead.
    map(-1).unwrap_or_else(|_| {
        let layout = std::alloc::Layout::new::<Region>();
        // SAFETY: non-zero-size layout; an all-zero Region is valid (atomics of 0).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: zeroed, properly aligned, leaked for the process lifetime.
        unsafe { &*(p as *const Region) }
    })
}

/// Opens (creating and initialising if new) the shared file at `path`.
///
/// # Errors
/// I/O failures, or a file whose magic/version/size is not this library's.
pub fn open(path: &Path) -> Result<&'static Region, OpenError> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| OpenError::Io("path", std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: NUL-terminated path; the fd is owned by `Fd`.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o666,
        )
    };
    if fd < 0 {
        return Err(last_err("open"));
    }
    let fd = Fd(fd);
    // SAFETY: flock on our fd; released when it is closed.
    if unsafe { libc::flock(fd.0, libc::LOCK_EX) } != 0 {
        return Err(last_err("flock"));
    }
    // SAFETY: zeroed stat buffer filled by fstat on our fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
        return Err(last_err("fstat"));
    }
    if st.st_size == 0 {
        // SAFETY: growing our own fd; processes of the container may run as different users.
        unsafe { libc::fchmod(fd.0, 0o666) };
        // SAFETY: as above.
        if unsafe { libc::ftruncate(fd.0, SIZE as libc::off_t) } != 0 {
            return Err(last_err("ftruncate"));
        }
    } else if st.st_size as usize != SIZE {
        // Map just the header to report what it is.
        return Err(header_of(fd.0));
    }
    let r = map(fd.0)?;
    let magic = r.magic.load(SeqCst);
    if magic == 0 {
        r.init_header();
    } else if magic != MAGIC
        || r.version.load(SeqCst) != VERSION
        || r.size.load(SeqCst) != SIZE as u32
    {
        return Err(OpenError::Mismatch {
            magic,
            version: r.version.load(SeqCst),
            size: r.size.load(SeqCst),
        });
    }
    Ok(r)
}

fn header_of(fd: i32) -> OpenError {
    let mut buf = [0u8; 16];
    // SAFETY: reading 16 bytes into a 16-byte buffer from our fd.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), 16, 0) };
    if n < 16 {
        return OpenError::Mismatch {
            magic: 0,
            version: 0,
            size: 0,
        };
    }
    let magic = u64::from_le_bytes(buf[0..8].try_into().unwrap_or([0; 8]));
    let version = u32::from_le_bytes(buf[8..12].try_into().unwrap_or([0; 4]));
    let size = u32::from_le_bytes(buf[12..16].try_into().unwrap_or([0; 4]));
    OpenError::Mismatch {
        magic,
        version,
        size,
    }
}

/// Takes the file lock for a short, non-blocking critical section (device entry creation).
fn with_file_lock<T>(path: Option<&Path>, f: impl FnOnce() -> T) -> T {
    let fd = path
        .and_then(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .map(|c| {
            // SAFETY: NUL-terminated path.
            Fd(unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                )
            })
        });
    if let Some(Fd(fd)) = &fd {
        if *fd >= 0 {
            // SAFETY: flock on our own fd.
            unsafe { libc::flock(*fd, libc::LOCK_EX) };
        }
    }
    f()
}

impl Region {
    fn init_header(&self) {
        self.version.store(VERSION, SeqCst);
        self.size.store(SIZE as u32, SeqCst);
        self.max_devices.store(MAX_DEVICES as u32, SeqCst);
        self.max_procs.store(MAX_PROCS as u32, SeqCst);
        self.magic.store(MAGIC, SeqCst);
    }

    /// Whether the header still says this library's layout. Another program (HAMi-core shares
    /// the variable that names this file) may rewrite the file in its own layout at any time;
    /// from then on nothing in it may be read as counters or written.
    #[inline]
    pub fn layout_ok(&self) -> bool {
        self.magic.load(SeqCst) == MAGIC && self.version.load(SeqCst) == VERSION
    }

    /// The header as it is now (for the message when [`Self::layout_ok`] turns false).
    pub fn header(&self) -> OpenError {
        OpenError::Mismatch {
            magic: self.magic.load(SeqCst),
            version: self.version.load(SeqCst),
            size: self.size.load(SeqCst),
        }
    }

    /// Entry index of the device with `uuid`, if any process recorded it.
    pub fn find_dev(&self, uuid: &[u8; 16]) -> Option<usize> {
        let [a, b] = uuid_words(uuid);
        self.devs.iter().position(|d| {
            d.state.load(SeqCst) == DEV_IN_USE
                && d.uuid[0].load(SeqCst) == a
                && d.uuid[1].load(SeqCst) == b
        })
    }

    /// Entry index for `uuid`, added (under the file lock) if new; records `limit`.
    pub fn dev_entry(&self, path: Option<&Path>, uuid: &[u8; 16], limit: u64) -> Option<usize> {
        if let Some(i) = self.find_dev(uuid) {
            return Some(i);
        }
        with_file_lock(path, || {
            if let Some(i) = self.find_dev(uuid) {
                return Some(i);
            }
            let i = self.devs.iter().position(|d| d.state.load(SeqCst) == 0)?;
            let [a, b] = uuid_words(uuid);
            let d = &self.devs[i];
            d.uuid[0].store(a, SeqCst);
            d.uuid[1].store(b, SeqCst);
            d.limit.store(limit, SeqCst);
            d.state.store(DEV_IN_USE, SeqCst);
            Some(i)
        })
    }

    /// Claims a slot for `pid`; reclaims dead slots if the table is full.
    pub fn claim(&self, pid: u32, start_time: u64) -> Option<usize> {
        for attempt in 0..2 {
            for (i, s) in self.procs.iter().enumerate() {
                if s.pid.load(SeqCst) == 0 && s.pid.compare_exchange(0, pid, SeqCst, SeqCst).is_ok()
                {
                    for u in &s.used {
                        u.store(0, SeqCst);
                    }
                    s.start_time.store(start_time, SeqCst);
                    self.proc_hwm.fetch_max(i as u32 + 1, SeqCst);
                    return Some(i);
                }
            }
            if attempt == 0 {
                self.reclaim_dead(pid);
            }
        }
        None
    }

    #[inline]
    fn live_slots(&self) -> impl Iterator<Item = &ProcSlot> {
        let hwm = (self.proc_hwm.load(SeqCst) as usize).min(MAX_PROCS);
        self.procs[..hwm].iter().filter(|s| {
            let p = s.pid.load(SeqCst);
            p != 0 && p != RECLAIMING
        })
    }

    /// Bytes counted on device entry `dev` by all processes.
    #[inline]
    pub fn used(&self, dev: usize) -> u64 {
        self.live_slots()
            .fold(0u64, |acc, s| acc.saturating_add(s.used[dev].load(SeqCst)))
    }

    /// Pids of all processes holding a slot.
    pub fn pids(&self) -> Vec<u32> {
        self.live_slots().map(|s| s.pid.load(SeqCst)).collect()
    }

    /// Frees the slots of processes that are gone (pid absent or start time changed).
    pub fn reclaim_dead(&self, own_pid: u32) -> usize {
        let mut n = 0;
        let hwm = (self.proc_hwm.load(SeqCst) as usize).min(MAX_PROCS);
        for s in &self.procs[..hwm] {
            let p = s.pid.load(SeqCst);
            if p == 0 || p == RECLAIMING || p == own_pid {
                continue;
            }
            let recorded = s.start_time.load(SeqCst);
            let dead = match sys::start_time(p) {
                None => true,
                Some(st) => recorded != 0 && st != recorded,
            };
            if dead
                && s.pid
                    .compare_exchange(p, RECLAIMING, SeqCst, SeqCst)
                    .is_ok()
            {
                for u in &s.used {
                    u.store(0, SeqCst);
                }
                s.start_time.store(0, SeqCst);
                s.pid.store(0, SeqCst);
                n += 1;
            }
        }
        n
    }

    /// Adds `size` to `slot`'s count on `dev` if the container total stays within `limit`.
    #[inline]
    pub fn try_reserve(
        &self,
        slot: usize,
        dev: usize,
        size: u64,
        limit: u64,
        own_pid: u32,
    ) -> bool {
        let counter = &self.procs[slot].used[dev];
        for attempt in 0..2 {
            counter.fetch_add(size, SeqCst);
            if self.used(dev) <= limit {
                return true;
            }
            counter.fetch_sub(size, SeqCst);
            if attempt == 0 && self.reclaim_dead(own_pid) == 0 {
                break;
            }
        }
        false
    }

    /// Adds `size` without a cap check (context footprint).
    pub fn add(&self, slot: usize, dev: usize, size: u64) {
        self.procs[slot].used[dev].fetch_add(size, SeqCst);
    }

    /// Subtracts `size` from `slot`'s count on `dev` (never below zero).
    #[inline]
    pub fn release(&self, slot: usize, dev: usize, size: u64) {
        // One atomic subtraction (a compare-exchange loop costs more on every free): only this
        // process changes its slot while it lives, and it releases only what it counted, so the
        // counter holds at least `size`. Should it not, the counter is brought back to zero.
        let counter = &self.procs[slot].used[dev];
        let before = counter.fetch_sub(size, SeqCst);
        if before < size {
            counter.fetch_add(size - before, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_respects_cap_and_reclaims() {
        let dir = std::env::temp_dir().join(format!("gpushare-region-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache");
        let r = open(&path).unwrap();
        let me = std::process::id();
        let dev = r.dev_entry(Some(&path), &[7; 16], 100).unwrap();
        assert_eq!(
            r.dev_entry(Some(&path), &[7; 16], 100),
            Some(dev),
            "same uuid, same entry"
        );
        let a = r.claim(me, sys::start_time(me).unwrap()).unwrap();
        // A slot of a process that no longer exists (pid 0x7ffffffe is never valid).
        let dead = r.claim(0x7fff_fffe, 1).unwrap();
        r.add(dead, dev, 60);
        assert!(
            r.try_reserve(a, dev, 50, 100, me),
            "over only because of the dead slot, which is reclaimed"
        );
        assert_eq!(r.used(dev), 50);
        assert!(!r.try_reserve(a, dev, 51, 100, me), "over the cap");
        assert!(r.try_reserve(a, dev, 50, 100, me));
        r.release(a, dev, 100);
        assert_eq!(r.used(dev), 0);
        // Reopening maps the same data; a foreign file is a mismatch, not a crash.
        assert!(open(&path).is_ok());
        assert!(r.layout_ok(), "our own layout");
        // Another program rewrites the header while the file is attached.
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0x4e, 0xf7, 0x12, 0x01, 0, 0, 0, 0], 0)
                .unwrap();
        }
        assert!(!r.layout_ok(), "a rewritten header is seen at once");
        assert!(
            matches!(open(&path), Err(OpenError::Mismatch { .. })),
            "and refused at the next attach"
        );
        let bad = dir.join("bad");
        std::fs::write(&bad, b"not a region at all").unwrap();
        assert!(matches!(open(&bad), Err(OpenError::Mismatch { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What this library writes into the file is what the shared definition reads back (the
    /// host reads the file that way), and what the shared definition writes this library reads.
    #[test]
    fn the_file_round_trips_through_the_shared_definition() {
        let dir = std::env::temp_dir().join(format!("gpushare-region-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache");
        let g = gpushare_region::uuid_bytes("GPU-5a1e0000-0000-4000-8000-000000000007").unwrap();
        let h = [9u8; 16];
        let r = open(&path).unwrap();
        let me = std::process::id();
        let dh = r.dev_entry(Some(&path), &h, 5).unwrap();
        let dg = r.dev_entry(Some(&path), &g, 1 << 30).unwrap();
        let other = r.claim(0x7fff_fffe, 1).unwrap();
        let a = r.claim(me, 42).unwrap();
        r.add(a, dg, 3 << 20);
        r.add(other, dg, 1 << 20);
        r.add(a, dh, 77);
        let bytes = std::fs::read(&path).unwrap();
        let v = gpushare_region::View::new(&bytes).expect("the limiter's file is the layout");
        assert_eq!(v.dev_of(&g), Some(dg));
        assert_eq!(v.dev_of(&h), Some(dh));
        assert_eq!(v.limit(dg), 1 << 30);
        assert_eq!(v.used(dg), 4 << 20, "both slots on the GPU");
        assert_eq!(v.used(dh), 77);
        assert!(v.live().any(|(i, pid, st)| i == a && pid == me && st == 42));
        assert_eq!(gpushare_region::used_in(&bytes, &g), Some(4 << 20));

        // The other way: a file written from the shared definition alone.
        let image = gpushare_region::Image::new()
            .dev(2, &g, 7 << 20)
            .slot(4, me, 42, &[(2, 6 << 20)])
            .into_bytes();
        let path2 = dir.join("image");
        std::fs::write(&path2, &image).unwrap();
        let r2 = open(&path2).expect("the shared definition's bytes are this library's layout");
        assert_eq!(r2.find_dev(&g), Some(2));
        assert_eq!(r2.devs[2].limit.load(SeqCst), 7 << 20);
        assert_eq!(r2.used(2), 6 << 20);
        assert_eq!(r2.pids(), vec![me]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
