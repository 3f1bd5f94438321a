//! TEST-ONLY: state the simulated driver shares between processes, under `GPUSHARE_SIM_STATE`.
//!
//! - `compute_mode.<i>`: decimal NVML compute mode of GPU `i` (absent = 0), replaced atomically.
//! - `proc.<pid>`: one memory-mapped [`ProcRecord`] per process that used the CUDA side: its
//!   device memory in use and its simulated busy time, which NVML sums over live processes.
//!   Records of dead processes (pid gone or start time changed) are ignored and removed, the way
//!   a real driver frees a killed process's memory.

use crate::config::{config, MAX_DEVICES};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Busy-time histogram bucket width.
pub const BUCKET_NS: u64 = 10_000_000;
/// Number of buckets kept per device (2.56 s of history).
pub const BUCKETS: usize = 256;
const MAGIC: u64 = 0x3130_4d49_5353_5047; // "GPSSIM01"

/// Creates the state directory (mode 0700) if needed and returns it.
pub fn state_dir() -> PathBuf {
    let dir = config().state_dir.clone();
    if !dir.is_dir() {
        let _ = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o700));
    }
    dir
}

/// Compute mode of GPU `i` (NVML value).
pub fn compute_mode(i: usize) -> u32 {
    fs::read_to_string(state_dir().join(format!("compute_mode.{i}")))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Sets the compute mode of GPU `i`: temp file in the same directory, then rename.
///
/// # Errors
/// Any I/O error writing or renaming the file.
pub fn set_compute_mode(i: usize, mode: u32) -> std::io::Result<()> {
    write_atomic(
        &state_dir().join(format!("compute_mode.{i}")),
        format!("{mode}\n").as_bytes(),
    )
}

/// Writes `bytes` to `path` through a temp file in the same directory (fsynced, mode 0600),
/// then renames it over `path`.
///
/// # Errors
/// Any I/O error writing or renaming the file.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// One histogram bucket: which 10 ms slot it holds and the busy ns in it.
#[repr(C)]
pub struct Bucket {
    pub slot: AtomicU64,
    pub busy_ns: AtomicU64,
}

/// Per-device part of a process record.
#[repr(C)]
pub struct DevRecord {
    /// Bytes of device memory this process holds (allocations and context).
    pub mem_used: AtomicU64,
    /// Non-zero once the process has a context on the device.
    pub has_ctx: AtomicU64,
    /// Monotonic ns at which the last queued simulated kernel ends.
    pub busy_until: AtomicU64,
    pub buckets: [Bucket; BUCKETS],
}

/// The mapped per-process file.
#[repr(C)]
pub struct ProcRecord {
    pub magic: AtomicU64,
    pub pid: AtomicU64,
    pub start_time: AtomicU64,
    pub devs: [DevRecord; MAX_DEVICES],
}

/// Monotonic clock in ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the comm field: field 3 is state, so field 22 is index 19 here.
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn map_file(file: &fs::File, writable: bool) -> Option<&'static ProcRecord> {
    let len = std::mem::size_of::<ProcRecord>();
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    use std::os::fd::AsRawFd;
    // SAFETY: mapping a regular file of at least `len` bytes (checked by callers) shared;
    // the result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping is page aligned, `len` bytes long and lives until `unmap`/exit;
    // every field is an atomic, so shared mutation across processes is sound.
    Some(unsafe { &*(p as *const ProcRecord) })
}

fn unmap(rec: &'static ProcRecord) {
    // SAFETY: `rec` came from `map_file` with this exact length and is not used afterwards.
    unsafe {
        libc::munmap(
            rec as *const ProcRecord as *mut libc::c_void,
            std::mem::size_of::<ProcRecord>(),
        )
    };
}

/// This process's record, created on first use. `None` if the state dir is unusable.
pub fn own_record() -> Option<&'static ProcRecord> {
    static OWN: OnceLock<Option<(u32, &'static ProcRecord)>> = OnceLock::new();
    let pid = std::process::id();
    let (owner, rec) = (*OWN.get_or_init(|| create_record(pid).map(|r| (pid, r))))?;
    // A forked child shares the parent's mapping; it must not count as the parent.
    (owner == pid).then_some(rec)
}

fn create_record(pid: u32) -> Option<&'static ProcRecord> {
    let path = state_dir().join(format!("proc.{pid}"));
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .ok()?;
    file.set_len(std::mem::size_of::<ProcRecord>() as u64)
        .ok()?;
    let rec = map_file(&file, true)?;
    rec.pid.store(u64::from(pid), Ordering::Relaxed);
    rec.start_time
        .store(start_time(pid).unwrap_or(0), Ordering::Relaxed);
    rec.magic.store(MAGIC, Ordering::Release);
    Some(rec)
}

/// Calls `f(pid, record)` for every live process's record; removes dead ones.
pub fn for_each_live(mut f: impl FnMut(u32, &ProcRecord)) {
    let dir = state_dir();
    let Ok(entries) = fs::read_dir(&dir) else {
        return;
    };
    let own = std::process::id();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("proc."))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own {
            if let Some(rec) = own_record() {
                f(pid, rec);
            }
            continue;
        }
        let Ok(file) = fs::File::open(e.path()) else {
            continue;
        };
        let big_enough = file
            .metadata()
            .map(|m| m.len() >= std::mem::size_of::<ProcRecord>() as u64)
            .unwrap_or(false);
        if !big_enough {
            continue;
        }
        let Some(rec) = map_file(&file, false) else {
            continue;
        };
        let ok = rec.magic.load(Ordering::Acquire) == MAGIC;
        let recorded_start = rec.start_time.load(Ordering::Relaxed);
        match start_time(pid) {
            Some(st) if ok && st == recorded_start => f(pid, rec),
            Some(_) if !ok => {}
            _ => {
                // Dead (or pid reused): the driver frees everything it held.
                let _ = fs::remove_file(e.path());
            }
        }
        unmap(rec);
    }
}

/// Adds the simulated kernel interval `[start, end)` to the busy histogram of `dev`.
pub fn add_busy(dev: &DevRecord, start: u64, end: u64) {
    let mut t = start;
    while t < end {
        let slot = t / BUCKET_NS;
        let slot_end = (slot + 1) * BUCKET_NS;
        let chunk = end.min(slot_end) - t;
        let b = &dev.buckets[(slot as usize) % BUCKETS];
        if b.slot.swap(slot, Ordering::AcqRel) != slot {
            b.busy_ns.store(0, Ordering::Release);
        }
        b.busy_ns.fetch_add(chunk, Ordering::AcqRel);
        t += chunk;
    }
}

/// Busy ns of `dev` within `[t0, t1)` (monotonic ns), proportionally for partial buckets.
pub fn busy_between(dev: &DevRecord, t0: u64, t1: u64) -> u64 {
    let mut total = 0u64;
    let first = t0 / BUCKET_NS;
    let last = t1.saturating_sub(1) / BUCKET_NS;
    for slot in first..=last {
        let b = &dev.buckets[(slot as usize) % BUCKETS];
        if b.slot.load(Ordering::Acquire) != slot {
            continue;
        }
        let busy = b.busy_ns.load(Ordering::Acquire);
        let s0 = (slot * BUCKET_NS).max(t0);
        let s1 = ((slot + 1) * BUCKET_NS).min(t1);
        total += busy.min(BUCKET_NS) * (s1.saturating_sub(s0)) / BUCKET_NS;
    }
    total
}

/// Device memory used on GPU `i` by all live processes.
pub fn used_on(i: usize) -> u64 {
    let mut used = 0u64;
    for_each_live(|_, rec| {
        used = used.saturating_add(rec.devs[i].mem_used.load(Ordering::Relaxed));
    });
    used
}
