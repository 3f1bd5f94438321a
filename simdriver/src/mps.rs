//! TEST-ONLY: the simulated NVIDIA MPS client pinned device memory limit
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`).
//!
//! A process is an MPS client when `CUDA_MPS_PIPE_DIRECTORY` is set (non-empty) in its
//! environment. Such a client's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (a comma list of
//! `<device>=<size>`, the device a CUDA ordinal or a GPU UUID, the size an integer with the
//! qualifier `M` or `G`) caps the device memory the process itself may hold on that device:
//! an allocation that would take its own use past the limit fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`, and `cuMemGetInfo*` reports at most the room left under the limit
//! as free (total stays the device's). Both
//! variables are read once per process (at `cuInit`, or at the first allocation or memory query
//! if that comes first); a malformed value is ignored with a one-line warning on stderr. What
//! goes beyond NVIDIA's documentation is listed in [`crate::cuda::guesses`].
#![forbid(unsafe_code)]

use crate::config::{self, config};
use std::sync::OnceLock;

/// The variable whose presence makes a process an MPS client.
pub const PIPE_VAR: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The per-client limit variable.
pub const LIMIT_VAR: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Per-device limits in bytes, indexed by CUDA ordinal; `None` = no limit on that device.
pub type Limits = [Option<u64>; config::MAX_DEVICES];

/// Bytes of a size with its qualifier (`512M`, `2G`; `MB`/`GB` too, any case), or `None`.
pub fn parse_size(raw: &str) -> Option<u64> {
    let s = raw.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let unit_bytes = match unit.to_ascii_uppercase().as_str() {
        "M" | "MB" => MIB,
        "G" | "GB" => GIB,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(unit_bytes)
}

/// The ordinal a device key names: a decimal ordinal below `count`, or a GPU UUID (or a prefix
/// of one, from `GPU-` on, that names exactly one GPU, as `CUDA_VISIBLE_DEVICES` allows).
fn parse_device(raw: &str, count: usize) -> Option<usize> {
    let s = raw.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<usize>().ok().filter(|&i| i < count);
    }
    if !s.starts_with("GPU-") || s.len() <= 4 {
        return None;
    }
    let mut hits = (0..count).filter(|&i| config::uuid(i).starts_with(s));
    match (hits.next(), hits.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}

/// Parses a `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` value for `count` GPUs. A later entry for the
/// same device replaces an earlier one.
///
/// # Errors
/// A message naming the first malformed entry; the whole value is then to be ignored.
pub fn parse_limits(raw: &str, count: usize) -> Result<Limits, String> {
    let mut out: Limits = [None; config::MAX_DEVICES];
    for entry in raw.split(',') {
        let (dev, size) = entry
            .split_once('=')
            .ok_or_else(|| format!("entry {entry:?} is not <device>=<size>"))?;
        let i = parse_device(dev, count)
            .ok_or_else(|| format!("entry {entry:?} names no simulated GPU"))?;
        let bytes = parse_size(size)
            .ok_or_else(|| format!("entry {entry:?} has no size like 512M or 2G"))?;
        out[i] = Some(bytes);
    }
    Ok(out)
}

/// The limits of this process from its two variables: none unless it is an MPS client
/// (`pipe` set and non-empty) with `limit` set and non-empty; a malformed `limit` warns and
/// gives none.
pub fn limits_from(pipe: Option<&str>, limit: Option<&str>, count: usize) -> Option<Limits> {
    pipe.filter(|p| !p.is_empty())?;
    let raw = limit.map(str::trim).filter(|l| !l.is_empty())?;
    match parse_limits(raw, count) {
        Ok(l) => Some(l),
        Err(why) => {
            config::warn(&format!("{LIMIT_VAR}={raw:?} ignored: {why}"));
            None
        }
    }
}

/// This process's MPS client limits, read from the environment once.
pub fn client_limits() -> Option<&'static Limits> {
    static LIMITS: OnceLock<Option<Limits>> = OnceLock::new();
    LIMITS
        .get_or_init(|| {
            limits_from(
                std::env::var(PIPE_VAR).ok().as_deref(),
                std::env::var(LIMIT_VAR).ok().as_deref(),
                config().devices.len(),
            )
        })
        .as_ref()
}

/// This process's limit on GPU `dev`, if it is an MPS client with one there.
pub fn limit(dev: usize) -> Option<u64> {
    client_limits().and_then(|l| l.get(dev).copied().flatten())
}

/// Whether `size` more bytes on GPU `dev`, on top of the `own` bytes this process holds there,
/// stay within its MPS client limit.
pub fn fits(dev: usize, own: u64, size: u64) -> bool {
    limit(dev).is_none_or(|l| own.saturating_add(size) <= l)
}

/// `(total, free)` of GPU `dev` as this MPS client sees it: `total` as reported without MPS,
/// `free` capped by the room its `own` use leaves under its limit.
pub fn view(dev: usize, total: u64, free: u64, own: u64) -> (u64, u64) {
    match limit(dev) {
        Some(l) => (total, free.min(l.saturating_sub(own))),
        None => (total, free),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases: &[(&str, Option<u64>)] = &[
            ("512M", Some(512 * MIB)),
            ("1024M", Some(GIB)),
            ("2G", Some(2 * GIB)),
            ("512MB", Some(512 * MIB)),
            ("1gb", Some(GIB)),
            (" 3G ", Some(3 * GIB)),
            ("0M", Some(0)),
            ("512", None),
            ("M", None),
            ("1.5G", None),
            ("-1G", None),
            ("1T", None),
            ("1K", None),
            ("1 G", None),
            ("", None),
            ("99999999999999999G", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_size(raw), *want, "{raw:?}");
        }
    }

    #[test]
    fn limit_values() {
        let on = |pairs: &[(usize, u64)]| {
            let mut l: Limits = [None; config::MAX_DEVICES];
            for &(i, b) in pairs {
                l[i] = Some(b);
            }
            Ok(l)
        };
        let u1 = config::uuid(1);
        let both = format!("{u1}=2G");
        // The simulated UUIDs differ in their last digit only: any shorter prefix is ambiguous.
        let prefix = format!("{}=1G", &u1[..u1.len() - 1]);
        let cases: Vec<(&str, Result<Limits, String>)> = vec![
            ("0=512M", on(&[(0, 512 * MIB)])),
            ("0=1G,1=512MB", on(&[(0, GIB), (1, 512 * MIB)])),
            (" 1 = 2G , 0=1024M", on(&[(0, GIB), (1, 2 * GIB)])),
            ("0=1G,0=2G", on(&[(0, 2 * GIB)])),
            (&both, on(&[(1, 2 * GIB)])),
            ("512M", Err(String::new())),
            ("0=512", Err(String::new())),
            ("0=", Err(String::new())),
            ("=1G", Err(String::new())),
            ("2=1G", Err(String::new())),
            ("-1=1G", Err(String::new())),
            ("GPU-=1G", Err(String::new())),
            ("GPU-5a1e=1G", Err(String::new())),
            ("GPU-ffff=1G", Err(String::new())),
            (&prefix, Err(String::new())),
            ("0=1G,", Err(String::new())),
            ("0=1G;1=1G", Err(String::new())),
        ];
        for (raw, want) in cases {
            let got = parse_limits(raw, 2);
            match want {
                Ok(w) => assert_eq!(got, Ok(w), "{raw:?}"),
                Err(_) => assert!(got.is_err(), "{raw:?} must be refused, got {got:?}"),
            }
        }
    }

    #[test]
    fn only_mps_clients_are_limited() {
        let some = |l: Option<Limits>| l.map(|l| l[0]);
        assert_eq!(some(limits_from(None, Some("0=1G"), 1)), None);
        assert_eq!(some(limits_from(Some(""), Some("0=1G"), 1)), None);
        assert_eq!(some(limits_from(Some("/tmp/x"), None, 1)), None);
        assert_eq!(some(limits_from(Some("/tmp/x"), Some(" "), 1)), None);
        assert_eq!(some(limits_from(Some("/tmp/x"), Some("junk"), 1)), None);
        assert_eq!(
            some(limits_from(Some("/tmp/x"), Some("0=1G"), 1)),
            Some(Some(GIB))
        );
    }
}
