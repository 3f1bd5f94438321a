//! Which runtime comes next, and telling a call that came back to this wrapper (a loop).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::RuntimeError;

/// Set in the next runtime's environment to this call's [`signature`]; a wrapper started with its
/// own signature there was started by itself (runc hands its env on to hooks without `env`, so
/// a mere flag would also refuse a hook that legitimately runs the wrapper for another call).
pub const LOOP_GUARD: &str = "GPUSHARE_RUNTIME_WRAPPED";

/// What identifies one wrapper call: its whole argv, NUL-free.
pub fn signature(argv: &[OsString]) -> OsString {
    let mut s = OsString::from("gpushare-runtime");
    for a in argv {
        s.push("\u{1f}");
        s.push(a);
    }
    OsString::from_vec(s.into_vec().into_iter().filter(|b| *b != 0).collect())
}

/// Whether this process was started by itself through the next-runtime chain (the same call
/// came back).
pub fn is_looping(argv: &[OsString]) -> bool {
    std::env::var_os(LOOP_GUARD).is_some_and(|v| v == signature(argv))
}

fn identity(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Finds the next runtime: the first of `next` that exists and is not this program.
///
/// # Errors
/// [`RuntimeError::Loop`] when only this program was found, [`RuntimeError::NoNext`] when
/// nothing was.
pub fn find_next(
    next: &[String],
    me: &Path,
    path_env: Option<&OsStr>,
) -> Result<PathBuf, RuntimeError> {
    let me_id = identity(me);
    let mut saw_self = None;
    for name in next {
        let candidates: Vec<PathBuf> = if name.contains('/') {
            vec![PathBuf::from(name)]
        } else {
            let path = path_env
                .map(|p| p.to_owned())
                .unwrap_or_else(|| OsString::from(crate::host::mps::SAFE_PATH));
            std::env::split_paths(&path).map(|d| d.join(name)).collect()
        };
        for c in candidates {
            let Some(id) = identity(&c) else { continue };
            if !std::fs::metadata(&c).is_ok_and(|m| m.is_file()) {
                continue;
            }
            if Some(id) == me_id {
                saw_self = Some(c);
                continue;
            }
            return Ok(c);
        }
    }
    match saw_self {
        Some(p) => Err(RuntimeError::Loop(p.display().to_string())),
        None => Err(RuntimeError::NoNext(next.to_vec())),
    }
}
