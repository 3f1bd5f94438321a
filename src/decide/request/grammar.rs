//! The grammar of a request's values, key by key: modes, device selectors, time slices (the
//! quantities of `gpu.share.memory` and `gpu.share.cores` are [`crate::vocab::quantity`]'s).

use serde::Serialize;

use super::RequestError;
use crate::vocab::{Mode, Timeslice};

/// One entry of `gpu.share.devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Selector {
    Index(u32),
    Uuid(String),
}

/// The device-list grammar, as every message words it (README "Request grammar").
pub const DEVICES_GRAMMAR: &str = "a comma list without spaces of GPU indices (0 to 1023, no leading zero) or UUIDs as nvidia-smi -L prints them (GPU-<hex and dashes>, MIG-<hex and dashes>), e.g. 0,1";

/// A mode by any of its names (`none` and the empty string are not modes).
pub fn parse_mode(s: &str) -> Option<Mode> {
    match s {
        "mps" => Some(Mode::Mps),
        "timeslice" | "time-slicing" | "timeslicing" => Some(Mode::Timeslice),
        "limit" | "preload" | "preload-limit" => Some(Mode::Limit),
        _ => None,
    }
}

/// A time slice by its name.
pub fn parse_timeslice(s: &str) -> Option<Timeslice> {
    match s {
        "default" => Some(Timeslice::Default),
        "short" => Some(Timeslice::Short),
        "medium" => Some(Timeslice::Medium),
        "long" => Some(Timeslice::Long),
        _ => None,
    }
}

/// Parses `0,1` or `GPU-…` UUIDs (mixed allowed, at most 64 entries, duplicates removed).
pub(super) fn parse_selectors(key: &'static str, v: &str) -> Result<Vec<Selector>, RequestError> {
    let bad = |value: &str| RequestError::Devices {
        key,
        value: value.chars().take(64).collect(),
    };
    let mut out = Vec::new();
    for part in v.split(',') {
        let sel = parse_selector(part).ok_or_else(|| bad(part))?;
        if !out.contains(&sel) {
            out.push(sel);
        }
        if out.len() > 64 {
            return Err(bad(v));
        }
    }
    Ok(out)
}

/// One device selector ([`DEVICES_GRAMMAR`]): a decimal index below 1024 without a leading
/// zero, or a `GPU-`/`MIG-` UUID (prefix in capitals as NVIDIA prints it; the hex digits in
/// either case, matched without regard to case).
pub fn parse_selector(part: &str) -> Option<Selector> {
    if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
        if part.len() > 4 || (part.len() > 1 && part.starts_with('0')) {
            return None;
        }
        return part
            .parse::<u32>()
            .ok()
            .filter(|n| *n < 1024)
            .map(Selector::Index);
    }
    let body = part
        .strip_prefix("GPU-")
        .or_else(|| part.strip_prefix("MIG-"))?;
    let ok_uuid = part.len() <= 96
        && body.bytes().any(|b| b.is_ascii_hexdigit())
        && body.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok_uuid.then(|| Selector::Uuid(part.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_table() {
        let rows: &[(&str, Option<Selector>)] = &[
            ("0", Some(Selector::Index(0))),
            ("1023", Some(Selector::Index(1023))),
            ("1024", None),
            ("007", None),
            ("GPU-0a1B-2c", Some(Selector::Uuid("GPU-0a1B-2c".into()))),
            ("MIG-0a1b", Some(Selector::Uuid("MIG-0a1b".into()))),
            ("gpu-0a1b", None),
            ("Gpu-0a1b", None),
            ("GPU-", None),
            ("GPU----", None),
            ("GPU-xyz", None),
            ("GPU-0a/1", None),
            ("MIG-GPU-0a1b/1/0", None),
            (" 0", None),
            ("", None),
            ("+1", None),
        ];
        for (input, want) in rows {
            assert_eq!(&parse_selector(input), want, "{input:?}");
        }
    }

    #[test]
    fn mode_and_timeslice_names() {
        let modes = [
            ("mps", Some(Mode::Mps)),
            ("timeslice", Some(Mode::Timeslice)),
            ("time-slicing", Some(Mode::Timeslice)),
            ("timeslicing", Some(Mode::Timeslice)),
            ("limit", Some(Mode::Limit)),
            ("preload", Some(Mode::Limit)),
            ("preload-limit", Some(Mode::Limit)),
            ("none", None),
            ("", None),
            ("MPS", None),
        ];
        for (name, want) in modes {
            assert_eq!(parse_mode(name), want, "{name:?}");
        }
        let slices = [
            ("default", Some(Timeslice::Default)),
            ("short", Some(Timeslice::Short)),
            ("medium", Some(Timeslice::Medium)),
            ("long", Some(Timeslice::Long)),
            ("Long", None),
            ("", None),
        ];
        for (name, want) in slices {
            assert_eq!(parse_timeslice(name), want, "{name:?}");
        }
    }

    #[test]
    fn selector_lists_drop_repeats_and_stop_past_64() {
        assert_eq!(
            parse_selectors("k", "1,0,1").unwrap(),
            vec![Selector::Index(1), Selector::Index(0)]
        );
        let ok: Vec<String> = (0..64).map(|i| i.to_string()).collect();
        assert_eq!(parse_selectors("k", &ok.join(",")).unwrap().len(), 64);
        let over: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        assert!(matches!(
            parse_selectors("k", &over.join(",")),
            Err(RequestError::Devices { .. })
        ));
        assert!(parse_selectors("k", "0,,1").is_err());
    }
}
