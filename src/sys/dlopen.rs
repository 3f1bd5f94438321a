//! Inspecting a shared library by loading it (what the dynamic loader says, not a parse).

use std::ffi::{CStr, CString};

/// Loads the shared library at `path` (`RTLD_NOW | RTLD_LOCAL`: every dependency and
/// undefined symbol resolved, nothing made visible to this process) and returns which of
/// `symbols` it does not define, then unloads it. `Err`: `dlerror`'s text.
///
/// # Errors
/// The library cannot be loaded.
pub fn missing_symbols(path: &std::path::Path, symbols: &[&CStr]) -> Result<Vec<String>, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} has a NUL byte", path.display()))?;
    let last_error = || {
        // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
        // on this thread; it is copied at once.
        let e = unsafe { libc::dlerror() };
        if e.is_null() {
            "dlopen failed".to_owned()
        } else {
            // SAFETY: checked non-NULL above; NUL-terminated per dlerror's contract.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: dlopen reads the NUL-terminated `c`, alive across the call. Loading runs the
    // library's initialisers in this process: `path` is the limiter library the admin's policy
    // names (trusted as the policy is), whose only initialiser resolves glibc's `dlsym`.
    // RTLD_LOCAL keeps its symbols (its own `dlsym` included) out of this process's global
    // scope, so no call made here resolves to it.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(last_error());
    }
    let missing = symbols
        .iter()
        .filter(|s| {
            // SAFETY: `handle` is the live handle from dlopen above (closed only after this
            // loop); `s` is NUL-terminated. The symbol is only compared with NULL, never called.
            unsafe { libc::dlsym(handle, s.as_ptr()) }.is_null()
        })
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    // SAFETY: `handle` came from dlopen above and is closed once, here; no address from it is
    // kept past this point.
    unsafe { libc::dlclose(handle) };
    Ok(missing)
}
