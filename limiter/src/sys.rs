//! The FFI layer: the real `dlsym` (found with `dlvsym`), the real driver libraries and their
//! entry points, clocks and `/proc` reads. Every `unsafe` call into libc lives here or in the
//! exported wrappers that must be `extern "C"`.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Address of glibc's `dlsym`; read by the `dlsym` trampoline in `interpose`.
#[no_mangle]
pub static GPUSHARE_LIMITER_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc versions `dlsym` was published under: 2.34 (libdl merged into libc), x86_64's
/// original 2.2.5, aarch64's original 2.17.
const DLSYM_VERSIONS: &[&CStr] = &[c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"];

/// glibc's `dlsym` as found through `handle`, trying each published symbol version.
fn dlsym_in(handle: *mut c_void) -> *mut c_void {
    for v in DLSYM_VERSIONS {
        // SAFETY: dlvsym with a valid (pseudo-)handle and NUL-terminated names.
        let p = unsafe { libc::dlvsym(handle, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            return p;
        }
    }
    std::ptr::null_mut()
}

/// Resolves (once) and returns glibc's `dlsym`.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = GPUSHARE_LIMITER_REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        // RTLD_NEXT when preloaded; libc's own handle when loaded some other way (dlopen with
        // RTLD_LOCAL, as the benchmark does), where RTLD_NEXT may not reach libc.
        p = dlsym_in(libc::RTLD_NEXT);
        if p.is_null() {
            // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to the already loaded libc.
            let libc_handle =
                unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
            if !libc_handle.is_null() {
                p = dlsym_in(libc_handle);
            }
        }
        if p.is_null() {
            return None;
        }
        GPUSHARE_LIMITER_REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's dlsym, whose signature is DlsymFn.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// `dlsym(handle, name)` through glibc, bypassing our override.
///
/// # Safety
/// `handle` must be a handle from `dlopen` or a glibc pseudo-handle.
pub unsafe fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: real dlsym with a handle the caller got from dlopen (or a pseudo-handle).
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Which real library a symbol comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

static CUDA_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static NVML_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// dlopen handle of the real library (opened on first use, never closed).
pub fn lib_handle(lib: Lib) -> *mut c_void {
    let (slot, name) = match lib {
        Lib::Cuda => (&CUDA_HANDLE, c"libcuda.so.1"),
        Lib::Nvml => (&NVML_HANDLE, c"libnvidia-ml.so.1"),
    };
    let h = slot.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    // SAFETY: dlopen with a NUL-terminated soname.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if !h.is_null() {
        slot.store(h, Ordering::Release);
    }
    h
}

/// Monotonic clock in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process's pid.
pub fn getpid() -> u32 {
    std::process::id()
}

/// Start time of `pid` in clock ticks since boot: field 22 of `/proc/<pid>/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line (the command may contain spaces and parentheses).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The calling thread's identity (`pthread_self`: never 0 for a live thread).
#[inline]
pub fn thread_id() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier(cmd, flags = 0, cpu_id = 0) reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        ) == 0
    }
}

/// Registers this process for [`heavy_barrier`]; false when the kernel (before 4.14) or a
/// seccomp filter does not allow it.
pub fn register_heavy_barrier() -> bool {
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
}

/// A full memory barrier on every running thread of this process (`membarrier(2)`,
/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`), so that a thread's plain store followed by a plain
/// load needs no fence of its own. Needs [`register_heavy_barrier`] first.
pub fn heavy_barrier() -> bool {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
}

/// Registers `child` to run in the child after `fork`.
pub fn at_fork_child(child: extern "C" fn()) {
    // SAFETY: registering a plain function pointer with pthread_atfork.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// True in a set-uid/set-gid (AT_SECURE) process: env-chosen paths are then ignored.
pub fn is_secure() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Sleeps for `ns` nanoseconds.
pub fn sleep_ns(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns));
}

/// `errno`-free `getenv` presence check used only at initialisation.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Writes one warning line to stderr; a failing stderr is ignored (`eprintln!` would panic).
pub fn warn(msg: &str) {
    use std::io::Write;
    let line = format!("gpushare-limiter: warning: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Writes one error line to stderr (something is refused); a failing stderr is ignored.
pub fn error(msg: &str) {
    use std::io::Write;
    let line = format!("gpushare-limiter: error: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    #[test]
    fn start_time_field() {
        let stat = "1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 999 20 21";
        assert_eq!(super::parse_start_time(stat), Some(999));
        assert!(super::start_time(std::process::id()).is_some());
    }
}
