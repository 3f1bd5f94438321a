//! Which caps apply: parsed from the HAMi-core compatible environment, or from the limits file
//! the hook mounts. Pure: strings in, [`Limits`] and warnings out.
#![forbid(unsafe_code)]

use std::path::PathBuf;

/// Most CUDA devices the limiter keeps limits and accounting for.
pub const MAX_DEVICES: usize = gpushare_region::MAX_DEVICES;
/// Limits file the hook mounts into the container.
pub const DEFAULT_LIMITS_FILE: &str = "/usr/local/gpushare/limits";
/// Shared accounting file when neither env nor limits file names one.
pub const DEFAULT_SHARED_CACHE: &str = "/usr/local/gpushare/shared/cache";
/// Fallback when the hook's shared directory is absent (env-only setups).
pub const FALLBACK_SHARED_CACHE: &str = "/tmp/gpushare-limiter.cache";

/// Env keys the limiter reads (and the keys the limits file may hold).
pub const KEY_MEM: &str = "CUDA_DEVICE_MEMORY_LIMIT";
pub const KEY_SM: &str = "CUDA_DEVICE_SM_LIMIT";
pub const KEY_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";

/// The caps for one process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits {
    /// Device-memory cap in bytes per CUDA ordinal (`None`: uncapped).
    pub mem: [Option<u64>; MAX_DEVICES],
    /// SM share in percent (1–99) per CUDA ordinal (`None`: uncapped).
    pub sm: [Option<u32>; MAX_DEVICES],
    /// Path of the shared accounting file, if configured.
    pub shared_cache: Option<PathBuf>,
}

impl Limits {
    /// True when nothing is capped: the library stays inert.
    pub fn is_empty(&self) -> bool {
        self.mem.iter().all(Option::is_none) && self.sm.iter().all(Option::is_none)
    }

    /// True when any device has an SM cap.
    pub fn any_sm(&self) -> bool {
        self.sm.iter().any(Option::is_some)
    }

    /// True when any device has a memory cap.
    pub fn any_mem(&self) -> bool {
        self.mem.iter().any(Option::is_some)
    }
}

/// Parses a size: plain bytes, or with `k`/`m`/`g`/`t` (also `Ki`/`Mi`/`Gi`/`Ti`, `KB`, `KiB`...),
/// all binary multiples as in HAMi-core.
pub fn parse_size(raw: &str) -> Option<u64> {
    let s = raw.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kb" | "kib" => 10,
        "m" | "mi" | "mb" | "mib" => 20,
        "g" | "gi" | "gb" | "gib" => 30,
        "t" | "ti" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Collects limits from `(key, value)` pairs (env or file); returns warnings for bad values.
///
/// Rules: `*_<i>` wins over the plain key for device `i`; a memory cap of 0 and an SM share of
/// 0 or 100 mean "no cap" (HAMi-core); an invalid value is ignored with a warning, so device `i`
/// falls back to the plain key, or to no cap.
pub fn from_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> (Limits, Vec<String>) {
    let mut warnings = Vec::new();
    let mut mem_all: Option<u64> = None;
    let mut sm_all: Option<u32> = None;
    let mut mem: [Option<Option<u64>>; MAX_DEVICES] = [None; MAX_DEVICES];
    let mut sm: [Option<Option<u32>>; MAX_DEVICES] = [None; MAX_DEVICES];
    let mut shared_cache = None;
    for (key, value) in pairs {
        let (base, index) = match key.rsplit_once('_') {
            Some((b, i)) if (b == KEY_MEM || b == KEY_SM) => match i.parse::<usize>() {
                Ok(i) if i < MAX_DEVICES => (b, Some(i)),
                _ => {
                    warnings.push(format!(
                        "{key} names no device index below {MAX_DEVICES}; ignoring it"
                    ));
                    continue;
                }
            },
            _ => (key, None),
        };
        match base {
            KEY_MEM => match parse_size(value) {
                Some(v) => {
                    let v = (v > 0).then_some(v);
                    match index {
                        Some(i) => mem[i] = Some(v),
                        None => mem_all = v,
                    }
                }
                None => warnings.push(format!(
                    "{key}={value:?} is not a size (bytes, or with a k/m/g/Ki/Mi/Gi suffix); ignoring it{}",
                    fallback_note(index, "memory")
                )),
            },
            KEY_SM => match value.trim().parse::<u32>() {
                Ok(v) if v <= 100 => {
                    let v = (v > 0 && v < 100).then_some(v);
                    match index {
                        Some(i) => sm[i] = Some(v),
                        None => sm_all = v,
                    }
                }
                _ => warnings.push(format!(
                    "{key}={value:?} is not a percentage from 0 to 100; ignoring it{}",
                    fallback_note(index, "SM")
                )),
            },
            KEY_CACHE => {
                let v = value.trim();
                if v.starts_with('/') {
                    shared_cache = Some(PathBuf::from(v));
                } else {
                    warnings.push(format!(
                        "{key}={value:?} is not an absolute path; using the default shared cache"
                    ));
                }
            }
            _ => {}
        }
    }
    let mut limits = Limits {
        shared_cache,
        ..Limits::default()
    };
    for i in 0..MAX_DEVICES {
        limits.mem[i] = mem[i].unwrap_or(mem_all);
        limits.sm[i] = sm[i].unwrap_or(sm_all);
    }
    (limits, warnings)
}

fn fallback_note(index: Option<usize>, what: &str) -> String {
    match index {
        Some(i) => format!(" (device {i} falls back to the device-wide {what} cap, if any)"),
        None => format!(" (no device-wide {what} cap)"),
    }
}

/// True when the environment carries any limit key (then the limits file is not read).
pub fn env_has_limits<'a>(keys: impl IntoIterator<Item = &'a str>) -> bool {
    keys.into_iter()
        .any(|k| k.starts_with(KEY_MEM) || k.starts_with(KEY_SM))
}

/// Parses the limits file: `KEY=VALUE` lines using the env names; `#` comments and blank lines
/// allowed; an optional `export ` prefix and surrounding quotes are stripped; other lines warn.
pub fn parse_file(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut pairs = Vec::new();
    let mut warnings = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        match line.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                let v = v.trim();
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v);
                pairs.push((k.trim().to_owned(), v.to_owned()));
            }
            _ => warnings.push(format!("limits file line {}: expected KEY=VALUE", n + 1)),
        }
    }
    (pairs, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases: &[(&str, &str, Option<u64>)] = &[
            ("plain bytes", "4096", Some(4096)),
            ("k suffix", "4k", Some(4096)),
            ("m suffix", "512m", Some(512 << 20)),
            ("G suffix", "4G", Some(4 << 30)),
            ("Gi suffix", "4Gi", Some(4 << 30)),
            ("Mi suffix", "4096Mi", Some(4 << 30)),
            ("MiB suffix with space", "1 MiB", Some(1 << 20)),
            ("garbage", "lots", None),
            ("negative", "-1", None),
            ("overflow", "99999999999999999999", None),
            ("bad suffix", "4x", None),
            ("empty", "", None),
        ];
        for (what, raw, want) in cases {
            assert_eq!(parse_size(raw), *want, "{what}");
        }
    }

    #[test]
    fn pairs() {
        let (l, w) = from_pairs([
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_2", "100"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/cache"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(l.mem[0], Some(1 << 30), "plain key applies to device 0");
        assert_eq!(l.mem[1], Some(2 << 30), "indexed key wins");
        assert_eq!(l.sm[0], Some(30));
        assert_eq!(l.sm[2], None, "100% is no cap");
        assert_eq!(l.shared_cache, Some(PathBuf::from("/x/cache")));
    }

    #[test]
    fn bad_values_warn_and_fall_back() {
        type Case = (
            &'static str,
            &'static [(&'static str, &'static str)],
            Option<u64>,
            Option<u32>,
        );
        let cases: &[Case] = &[
            (
                "bad indexed memory falls back to plain",
                &[
                    ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_0", "xyz"),
                ],
                Some(1 << 30),
                None,
            ),
            (
                "bad plain memory: no cap",
                &[("CUDA_DEVICE_MEMORY_LIMIT", "-5")],
                None,
                None,
            ),
            (
                "SM over 100",
                &[("CUDA_DEVICE_SM_LIMIT", "150")],
                None,
                None,
            ),
            (
                "SM not a number",
                &[
                    ("CUDA_DEVICE_SM_LIMIT_0", "half"),
                    ("CUDA_DEVICE_SM_LIMIT", "40"),
                ],
                None,
                Some(40),
            ),
            (
                "index out of range",
                &[("CUDA_DEVICE_MEMORY_LIMIT_99", "1g")],
                None,
                None,
            ),
        ];
        for (what, pairs, mem0, sm0) in cases {
            let (l, w) = from_pairs(pairs.iter().copied());
            assert_eq!(w.len(), 1, "{what}: one warning, got {w:?}");
            assert_eq!(l.mem[0], *mem0, "{what}");
            assert_eq!(l.sm[0], *sm0, "{what}");
        }
    }

    #[test]
    fn zero_means_no_cap() {
        let (l, w) = from_pairs([
            ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
            ("CUDA_DEVICE_SM_LIMIT", "0"),
        ]);
        assert!(w.is_empty());
        assert!(l.is_empty());
    }

    #[test]
    fn file_format() {
        let text = "# gpushare limits\nCUDA_DEVICE_MEMORY_LIMIT_0=4294967296\nexport CUDA_DEVICE_SM_LIMIT=\"30\"\n\nnonsense\n";
        let (pairs, w) = parse_file(text);
        assert_eq!(w.len(), 1);
        let (l, w2) = from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert!(w2.is_empty());
        assert_eq!(l.mem[0], Some(4 << 30));
        assert_eq!(l.sm[0], Some(30));
        assert!(env_has_limits(["PATH", "CUDA_DEVICE_SM_LIMIT_1"]));
        assert!(!env_has_limits(["PATH", "CUDA_DEVICE_MEMORY_SHARED_CACHE"]));
    }
}
