//! What a container asked for: the `gpu.share*` annotations, with `GPU_SHARE*` env fallbacks.
//!
//! Pure: annotations, env and the admin policy in, a validated [`Request`] (or none) out.

use std::collections::HashMap;

use serde::Serialize;
use thiserror::Error;

use crate::config::Config;
use crate::vocab::domain::is_group_name;
use crate::vocab::quantity::{self, QuantityError};
use crate::vocab::{Mode, Timeslice};

/// The annotation that turns sharing on.
pub const ANNOTATION: &str = "gpu.share";
const PREFIX: &str = "gpu.share.";
/// Largest annotation or env value read.
const MAX_VALUE_LEN: usize = 4096;
/// Annotations (key, value) by which CRI runtimes mark a pod's sandbox ("pause", infra)
/// container: containerd's CRI plugin and CRI-O. Such a container holds the pod's namespaces
/// and runs no workload; it carries the pod's `gpu.share*` annotations too when the runtime
/// passes pod annotations on, and is never a share request.
pub const SANDBOX_MARKERS: [(&str, &str); 2] = [
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
];

/// One entry of `gpu.share.devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Selector {
    Index(u32),
    Uuid(String),
}

/// A validated share request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    pub mode: Mode,
    /// Subset of the container's GPUs; `None` means all of them.
    pub devices: Option<Vec<Selector>>,
    /// Per-GPU device-memory cap in bytes.
    pub memory: Option<u64>,
    /// SM share in percent.
    pub cores: u8,
    /// Whether the container named `cores` itself (otherwise it is the policy's default).
    pub cores_explicit: bool,
    pub timeslice: Option<Timeslice>,
    /// The MPS isolation domain (`gpu.share.group`) the container asks to join.
    pub group: Option<String>,
}

/// A request that cannot be served as written.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("{key}: unknown mode {value:?}; valid modes are mps, timeslice, limit, none")]
    UnknownMode { key: &'static str, value: String },
    #[error("{key}: mode {mode} is not allowed on this node; allowed: {allowed}")]
    ModeNotAllowed {
        key: &'static str,
        mode: Mode,
        allowed: String,
    },
    #[error("gpu.share={mode} without gpu.share.memory is refused on this node ([policy] uncapped = \"refuse\"): every share must name its memory cap, e.g. gpu.share.memory=8Gi")]
    Uncapped { mode: Mode },
    #[error("unknown annotation {0:?}; valid keys are gpu.share, gpu.share.devices, gpu.share.memory, gpu.share.cores, gpu.share.timeslice, gpu.share.group")]
    UnknownKey(String),
    #[error("{key}: value is longer than 4096 bytes")]
    TooLong { key: String },
    #[error("{key}")]
    Quantity {
        key: &'static str,
        #[source]
        source: QuantityError,
    },
    #[error("{key}: {requested} bytes is above this node's maximum of {max} bytes; ask for less")]
    MemoryAboveMax {
        key: &'static str,
        requested: u64,
        max: u64,
    },
    #[error("{key}: {requested}% is above this node's maximum of {max}%; ask for less")]
    CoresAboveMax {
        key: &'static str,
        requested: u8,
        max: u8,
    },
    #[error("{key}: {value:?} is not a group name; use 1 to 63 of a-z 0-9 . _ - starting with a letter or digit")]
    Group { key: &'static str, value: String },
    #[error("{key}: unknown time slice {value:?}; valid values are default, short, medium, long")]
    Timeslice { key: &'static str, value: String },
    #[error("{key}: {value:?} is not a GPU index or UUID; give {DEVICES_GRAMMAR}")]
    Devices { key: &'static str, value: String },
    #[error("{key}: {requested} bytes is above the {total} bytes of GPU {gpu}; ask for less")]
    MemoryAboveGpu {
        key: &'static str,
        requested: u64,
        total: u64,
        gpu: String,
    },
    #[error("{key} only applies to {applies}; remove it or use gpu.share={applies}")]
    NotForMode {
        key: &'static str,
        applies: &'static str,
    },
}

/// The device-list grammar, as every message words it (README "Request grammar").
pub const DEVICES_GRAMMAR: &str = "a comma list without spaces of GPU indices (0 to 1023, no leading zero) or UUIDs as nvidia-smi -L prints them (GPU-<hex and dashes>, MIG-<hex and dashes>), e.g. 0,1";

/// Refuses a memory cap above a GPU's size (the hook for a check against the inventory, which
/// knows each GPU's memory).
///
/// # Errors
/// [`RequestError::MemoryAboveGpu`] when `requested` exceeds `total`.
pub fn memory_fits(requested: u64, total: u64, gpu: &str) -> Result<(), RequestError> {
    if requested > total {
        return Err(RequestError::MemoryAboveGpu {
            key: MEMORY.annotation,
            requested,
            total,
            gpu: gpu.to_owned(),
        });
    }
    Ok(())
}

/// One request field: its annotation name and env fallback.
struct Field {
    annotation: &'static str,
    env: &'static str,
}

const MODE: Field = Field {
    annotation: "gpu.share",
    env: "GPU_SHARE",
};
const DEVICES: Field = Field {
    annotation: "gpu.share.devices",
    env: "GPU_SHARE_DEVICES",
};
const MEMORY: Field = Field {
    annotation: "gpu.share.memory",
    env: "GPU_SHARE_MEMORY",
};
const CORES: Field = Field {
    annotation: "gpu.share.cores",
    env: "GPU_SHARE_CORES",
};
const TIMESLICE: Field = Field {
    annotation: "gpu.share.timeslice",
    env: "GPU_SHARE_TIMESLICE",
};
const GROUP: Field = Field {
    annotation: "gpu.share.group",
    env: "GPU_SHARE_GROUP",
};
const FIELDS: [&Field; 6] = [&MODE, &DEVICES, &MEMORY, &CORES, &TIMESLICE, &GROUP];

/// Every annotation a request is read from (for an engine's list of annotations it passes on).
pub fn annotation_keys() -> [&'static str; 6] {
    FIELDS.map(|f| f.annotation)
}

/// The two sources of a request: the spec's annotations and its `process.env`.
pub struct Sources<'a> {
    pub annotations: &'a HashMap<String, String>,
    pub env: &'a [String],
}

impl Sources<'_> {
    /// The value of `field` and the key it came from; annotations win over env.
    fn get(
        &self,
        field: &Field,
        env_fallback: bool,
    ) -> Result<Option<(&'static str, String)>, RequestError> {
        let found = if let Some(v) = self.annotations.get(field.annotation) {
            Some((field.annotation, v.as_str()))
        } else if env_fallback {
            env_lookup(self.env, field.env).map(|v| (field.env, v))
        } else {
            None
        };
        match found {
            Some((key, v)) if v.len() > MAX_VALUE_LEN => Err(RequestError::TooLong {
                key: key.to_owned(),
            }),
            // Values are taken exactly as written (README "Request grammar"): no trimming.
            Some((key, v)) => Ok(Some((key, v.to_owned()))),
            None => Ok(None),
        }
    }
}

/// Finds `NAME=value` in a `process.env` list; the last occurrence wins, as in execve.
pub fn env_lookup<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter().rev().find_map(|kv| {
        kv.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('='))
    })
}

/// Whether the annotations mark a pod's sandbox container ([`SANDBOX_MARKERS`]).
pub fn is_sandbox(annotations: &HashMap<String, String>) -> bool {
    SANDBOX_MARKERS
        .iter()
        .any(|(k, v)| annotations.get(*k).is_some_and(|a| a == v))
}

/// Quick check, without validation, whether a container asks for sharing at all. Used on the
/// fast path so that containers which ask for nothing cost almost nothing. A pod's sandbox
/// container never does.
pub fn wants_share(src: &Sources<'_>, env_fallback: bool) -> bool {
    if is_sandbox(src.annotations) {
        return false;
    }
    let v = src
        .annotations
        .get(ANNOTATION)
        .map(String::as_str)
        .or_else(|| {
            env_fallback
                .then(|| env_lookup(src.env, MODE.env))
                .flatten()
        });
    let any_sub = src.annotations.keys().any(|k| k.starts_with(PREFIX));
    match v {
        Some(v) => !v.is_empty() && v != "none" || any_sub,
        None => any_sub,
    }
}

/// Parses and validates the request against the admin policy. `Ok(None)`: nothing asked (a
/// pod's sandbox container asks for nothing, whatever `gpu.share*` annotations it carries).
///
/// # Errors
/// [`RequestError`] naming the offending key and what to write instead.
pub fn parse(src: &Sources<'_>, cfg: &Config) -> Result<Option<Request>, RequestError> {
    if is_sandbox(src.annotations) {
        return Ok(None);
    }
    for k in src.annotations.keys() {
        if k.starts_with(PREFIX) && !FIELDS.iter().any(|f| f.annotation == k) {
            return Err(RequestError::UnknownKey(k.clone()));
        }
    }
    let fb = cfg.policy.env_fallback;
    let Some((mode_key, mode_str)) = src.get(&MODE, fb)? else {
        return reject_orphans(src);
    };
    if matches!(mode_str.as_str(), "none" | "") {
        return reject_orphans(src);
    }
    let Some(mode) = parse_mode(&mode_str) else {
        return Err(RequestError::UnknownMode {
            key: mode_key,
            value: mode_str,
        });
    };
    if !cfg.policy.modes.contains(&mode) {
        let allowed: Vec<_> = cfg.policy.modes.iter().map(|m| m.as_str()).collect();
        return Err(RequestError::ModeNotAllowed {
            key: mode_key,
            mode,
            allowed: if allowed.is_empty() {
                "none".into()
            } else {
                allowed.join(", ")
            },
        });
    }

    let devices = match src.get(&DEVICES, fb)? {
        Some((key, v)) => Some(parse_selectors(key, &v)?),
        None => None,
    };

    let memory = match src.get(&MEMORY, fb)? {
        Some((key, v)) => {
            let bytes = quantity::parse_memory(&v)
                .map_err(|source| RequestError::Quantity { key, source })?;
            if let Some(max) = cfg.max_memory_bytes() {
                if bytes > max {
                    return Err(RequestError::MemoryAboveMax {
                        key,
                        requested: bytes,
                        max,
                    });
                }
            }
            Some(bytes)
        }
        None if cfg.policy.uncapped == crate::vocab::memcap::Uncapped::Refuse => {
            return Err(RequestError::Uncapped { mode });
        }
        None => None,
    };

    let cores_explicit = src.get(&CORES, fb)?.is_some();
    let cores = match src.get(&CORES, fb)? {
        Some((key, v)) => {
            not_for_timeslice(mode, key)?;
            let c = quantity::parse_cores(&v)
                .map_err(|source| RequestError::Quantity { key, source })?;
            if c > cfg.policy.max_cores {
                return Err(RequestError::CoresAboveMax {
                    key,
                    requested: c,
                    max: cfg.policy.max_cores,
                });
            }
            c
        }
        None => cfg.policy.default_cores,
    };

    let timeslice = match src.get(&TIMESLICE, fb)? {
        Some((key, v)) => {
            if mode != Mode::Timeslice {
                return Err(RequestError::NotForMode {
                    key,
                    applies: "timeslice",
                });
            }
            Some(match v.as_str() {
                "default" => Timeslice::Default,
                "short" => Timeslice::Short,
                "medium" => Timeslice::Medium,
                "long" => Timeslice::Long,
                _ => return Err(RequestError::Timeslice { key, value: v }),
            })
        }
        None => None,
    };

    let group = match src.get(&GROUP, fb)? {
        Some((key, v)) => {
            if mode != Mode::Mps {
                return Err(RequestError::NotForMode {
                    key,
                    applies: "mps",
                });
            }
            if !is_group_name(&v) {
                return Err(RequestError::Group { key, value: v });
            }
            Some(v)
        }
        None => None,
    };

    Ok(Some(Request {
        mode,
        devices,
        memory,
        cores,
        cores_explicit,
        timeslice,
        group,
    }))
}

/// A mode by any of its names (`none` and the empty string are not modes).
pub fn parse_mode(s: &str) -> Option<Mode> {
    match s {
        "mps" => Some(Mode::Mps),
        "timeslice" | "time-slicing" | "timeslicing" => Some(Mode::Timeslice),
        "limit" | "preload" | "preload-limit" => Some(Mode::Limit),
        _ => None,
    }
}

/// Memory and cores caps mean nothing to plain time-slicing.
fn not_for_timeslice(mode: Mode, key: &'static str) -> Result<(), RequestError> {
    if mode == Mode::Timeslice {
        return Err(RequestError::NotForMode {
            key,
            applies: "mps or limit",
        });
    }
    Ok(())
}

/// With no mode (or `none`), any other `gpu.share.*` annotation is a mistake worth reporting.
fn reject_orphans(src: &Sources<'_>) -> Result<Option<Request>, RequestError> {
    for f in &FIELDS[1..] {
        if src.annotations.contains_key(f.annotation) {
            return Err(RequestError::NotForMode {
                key: f.annotation,
                applies: "mps, timeslice or limit",
            });
        }
    }
    Ok(None)
}

/// Parses `0,1` or `GPU-…` UUIDs (mixed allowed, at most 64 entries, duplicates removed).
fn parse_selectors(key: &'static str, v: &str) -> Result<Vec<Selector>, RequestError> {
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

    fn run(
        ann: &[(&str, &str)],
        env: &[&str],
        cfg: &Config,
    ) -> Result<Option<Request>, RequestError> {
        let annotations: HashMap<String, String> = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env: Vec<String> = env.iter().map(|s| s.to_string()).collect();
        parse(
            &Sources {
                annotations: &annotations,
                env: &env,
            },
            cfg,
        )
    }

    fn req(mode: Mode) -> Request {
        Request {
            mode,
            devices: None,
            memory: None,
            cores: 100,
            cores_explicit: false,
            timeslice: None,
            group: None,
        }
    }

    #[test]
    fn accepted_requests() {
        let cfg = Config::default();
        type Row<'a> = (
            &'a str,
            Vec<(&'a str, &'a str)>,
            Vec<&'a str>,
            Option<Request>,
        );
        let rows: Vec<Row> = vec![
            ("nothing", vec![], vec![], None),
            ("explicit none", vec![("gpu.share", "none")], vec![], None),
            (
                "mps",
                vec![("gpu.share", "mps")],
                vec![],
                Some(req(Mode::Mps)),
            ),
            (
                "alias time-slicing",
                vec![("gpu.share", "time-slicing")],
                vec![],
                Some(req(Mode::Timeslice)),
            ),
            (
                "alias preload",
                vec![("gpu.share", "preload")],
                vec![],
                Some(req(Mode::Limit)),
            ),
            (
                "env fallback",
                vec![],
                vec!["GPU_SHARE=mps"],
                Some(req(Mode::Mps)),
            ),
            (
                "annotation wins over env",
                vec![("gpu.share", "limit")],
                vec!["GPU_SHARE=mps"],
                Some(req(Mode::Limit)),
            ),
            (
                "limits",
                vec![
                    ("gpu.share", "mps"),
                    ("gpu.share.memory", "4Gi"),
                    ("gpu.share.cores", "30"),
                    ("gpu.share.devices", "0,GPU-abc-1"),
                ],
                vec![],
                Some(Request {
                    memory: Some(4 << 30),
                    cores: 30,
                    cores_explicit: true,
                    devices: Some(vec![Selector::Index(0), Selector::Uuid("GPU-abc-1".into())]),
                    ..req(Mode::Mps)
                }),
            ),
            (
                "timeslice length",
                vec![("gpu.share", "timeslice"), ("gpu.share.timeslice", "long")],
                vec![],
                Some(Request {
                    timeslice: Some(Timeslice::Long),
                    ..req(Mode::Timeslice)
                }),
            ),
            (
                "timeslice with a memory cap",
                vec![("gpu.share", "timeslice"), ("gpu.share.memory", "1Gi")],
                vec![],
                Some(Request {
                    memory: Some(1 << 30),
                    ..req(Mode::Timeslice)
                }),
            ),
            (
                "env limits",
                vec![],
                vec![
                    "GPU_SHARE=limit",
                    "GPU_SHARE_MEMORY=512M",
                    "GPU_SHARE_CORES=50",
                ],
                Some(Request {
                    memory: Some(512_000_000),
                    cores: 50,
                    cores_explicit: true,
                    ..req(Mode::Limit)
                }),
            ),
        ];
        for (what, ann, env, want) in rows {
            assert_eq!(run(&ann, &env, &cfg).unwrap(), want, "{what}");
        }
    }

    #[test]
    fn refused_requests() {
        let mut cfg = Config::default();
        cfg.policy.max_memory = Some("8Gi".into());
        cfg.policy.max_cores = 80;
        cfg.policy.default_cores = 80;
        type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>, &'a str);
        let rows: Vec<Row> = vec![
            (
                "unknown mode",
                vec![("gpu.share", "turbo")],
                vec![],
                "valid modes are mps, timeslice, limit",
            ),
            (
                "unknown key",
                vec![("gpu.share", "mps"), ("gpu.share.colour", "red")],
                vec![],
                "unknown annotation",
            ),
            (
                "bad memory",
                vec![("gpu.share", "mps"), ("gpu.share.memory", "12XB")],
                vec![],
                "gpu.share.memory",
            ),
            (
                "zero memory",
                vec![("gpu.share", "mps"), ("gpu.share.memory", "0")],
                vec![],
                "gpu.share.memory",
            ),
            (
                "memory above max",
                vec![("gpu.share", "mps"), ("gpu.share.memory", "9Gi")],
                vec![],
                "maximum",
            ),
            (
                "cores 0",
                vec![("gpu.share", "mps"), ("gpu.share.cores", "0")],
                vec![],
                "gpu.share.cores",
            ),
            (
                "cores 101",
                vec![("gpu.share", "mps"), ("gpu.share.cores", "101")],
                vec![],
                "gpu.share.cores",
            ),
            (
                "cores above max",
                vec![("gpu.share", "mps"), ("gpu.share.cores", "90")],
                vec![],
                "maximum of 80%",
            ),
            (
                "bad devices",
                vec![("gpu.share", "mps"), ("gpu.share.devices", "0;rm")],
                vec![],
                "not a GPU index",
            ),
            (
                "path in uuid",
                vec![("gpu.share", "mps"), ("gpu.share.devices", "GPU-../../x")],
                vec![],
                "not a GPU index",
            ),
            (
                "timeslice on mps",
                vec![("gpu.share", "mps"), ("gpu.share.timeslice", "long")],
                vec![],
                "only applies to timeslice",
            ),
            (
                "bad timeslice",
                vec![
                    ("gpu.share", "timeslice"),
                    ("gpu.share.timeslice", "forever"),
                ],
                vec![],
                "unknown time slice",
            ),
            (
                "orphan key",
                vec![("gpu.share.memory", "1Gi")],
                vec![],
                "only applies",
            ),
            (
                "space after comma",
                vec![("gpu.share", "mps"), ("gpu.share.devices", "0, 1")],
                vec![],
                "\" 1\" is not a GPU index",
            ),
            (
                "lower-case uuid prefix",
                vec![("gpu.share", "mps"), ("gpu.share.devices", "gpu-abc")],
                vec![],
                "GPU-<hex and dashes>",
            ),
            (
                "index with leading zero",
                vec![("gpu.share", "mps"), ("gpu.share.devices", "01")],
                vec![],
                "no leading zero",
            ),
            (
                "empty list item",
                vec![("gpu.share", "mps"), ("gpu.share.devices", "0,,1")],
                vec![],
                "not a GPU index",
            ),
            (
                "mode with trailing space",
                vec![("gpu.share", "mps ")],
                vec![],
                "unknown mode \"mps \"",
            ),
            (
                "cores with plus",
                vec![("gpu.share", "mps"), ("gpu.share.cores", "+50")],
                vec![],
                "gpu.share.cores: cores \"+50\" is not valid",
            ),
            (
                "env cores with newline",
                vec![],
                vec!["GPU_SHARE=mps", "GPU_SHARE_CORES=50\n"],
                "GPU_SHARE_CORES: cores \"50\\n\" is not valid",
            ),
            (
                "memory with plus",
                vec![("gpu.share", "mps"), ("gpu.share.memory", "+4Gi")],
                vec![],
                "gpu.share.memory: memory \"+4Gi\" is not valid",
            ),
            (
                "memory of one byte",
                vec![("gpu.share", "mps"), ("gpu.share.memory", "1")],
                vec![],
                "below the minimum of 1Mi",
            ),
            (
                "memory of u64::MAX",
                vec![
                    ("gpu.share", "limit"),
                    ("gpu.share.memory", "18446744073709551615"),
                ],
                vec![],
                "above the maximum",
            ),
            (
                "env unknown mode",
                vec![],
                vec!["GPU_SHARE=bogus"],
                "GPU_SHARE: unknown mode",
            ),
        ];
        for (what, ann, env, want) in rows {
            let err = run(&ann, &env, &cfg).unwrap_err();
            let msg = crate::vocab::chain(&err);
            assert!(msg.contains(want), "{what}: {msg}");
        }
    }

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
    fn uncapped_refuse_wants_a_memory_cap_in_every_mode() {
        let mut cfg = Config::default();
        cfg.policy.uncapped = crate::vocab::memcap::Uncapped::Refuse;
        for mode in ["mps", "timeslice", "limit"] {
            let e = run(&[("gpu.share", mode)], &[], &cfg).unwrap_err();
            assert!(
                e.to_string().contains("uncapped = \"refuse\""),
                "{mode}: {e}"
            );
            // Positive control: the same request with a cap passes.
            let ok = run(
                &[("gpu.share", mode), ("gpu.share.memory", "1Gi")],
                &[],
                &cfg,
            );
            assert_eq!(ok.unwrap().unwrap().memory, Some(1 << 30), "{mode}");
        }
        // A container that asks for no share is not a share.
        assert!(run(&[], &[], &cfg).unwrap().is_none());
    }

    #[test]
    fn memory_above_a_gpu_is_refused() {
        assert!(memory_fits(4 << 30, 8 << 30, "GPU-0").is_ok());
        let e = memory_fits(9 << 30, 8 << 30, "GPU-0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("above the 8589934592 bytes of GPU GPU-0"), "{e}");
    }

    #[test]
    fn policy_can_forbid_modes_and_env() {
        let mut cfg = Config::default();
        cfg.policy.modes = vec![Mode::Timeslice];
        let err = run(&[("gpu.share", "mps")], &[], &cfg).unwrap_err();
        assert!(err.to_string().contains("allowed: timeslice"), "{err}");
        cfg.policy.env_fallback = false;
        assert_eq!(run(&[], &["GPU_SHARE=timeslice"], &cfg).unwrap(), None);
    }

    #[test]
    fn pod_sandbox_containers_are_never_share_requests() {
        let cfg = Config::default();
        // (description, annotations, env, asks)
        type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>, bool);
        let rows: Vec<Row> = vec![
            (
                "containerd sandbox with the pod's mps annotation",
                vec![
                    ("io.kubernetes.cri.container-type", "sandbox"),
                    ("gpu.share", "mps"),
                ],
                vec![],
                false,
            ),
            (
                "CRI-O sandbox with the pod's limit annotations",
                vec![
                    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
                    ("gpu.share", "limit"),
                    ("gpu.share.memory", "1Gi"),
                ],
                vec![],
                false,
            ),
            (
                "sandbox with a key this node does not know",
                vec![
                    ("io.kubernetes.cri.container-type", "sandbox"),
                    ("gpu.share", "mps"),
                    ("gpu.share.colour", "red"),
                ],
                vec![],
                false,
            ),
            (
                "sandbox with a bad mode",
                vec![
                    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
                    ("gpu.share", "turbo"),
                ],
                vec![],
                false,
            ),
            (
                "sandbox with the env fallback",
                vec![("io.kubernetes.cri.container-type", "sandbox")],
                vec!["GPU_SHARE=mps"],
                false,
            ),
            (
                "containerd workload container",
                vec![
                    ("io.kubernetes.cri.container-type", "container"),
                    ("gpu.share", "mps"),
                ],
                vec![],
                true,
            ),
            (
                "CRI-O workload container",
                vec![
                    ("io.kubernetes.cri-o.ContainerType", "container"),
                    ("gpu.share", "limit"),
                ],
                vec![],
                true,
            ),
            (
                "marker value is not sandbox",
                vec![
                    ("io.kubernetes.cri.container-type", "Sandbox "),
                    ("gpu.share", "mps"),
                ],
                vec![],
                true,
            ),
            (
                "the CRI-O key spelt in containerd's style is not a marker",
                vec![
                    ("io.kubernetes.cri-o.container-type", "sandbox"),
                    ("gpu.share", "mps"),
                ],
                vec![],
                true,
            ),
        ];
        for (what, ann, env, asks) in rows {
            let annotations: HashMap<String, String> = ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let env_v: Vec<String> = env.iter().map(|s| s.to_string()).collect();
            let src = Sources {
                annotations: &annotations,
                env: &env_v,
            };
            assert_eq!(wants_share(&src, true), asks, "{what}: wants_share");
            assert_eq!(
                run(&ann, &env, &cfg).unwrap().is_some(),
                asks,
                "{what}: parse"
            );
        }
    }

    #[test]
    fn fast_check() {
        let none = HashMap::new();
        let env = vec!["GPU_SHARE=mps".to_string()];
        assert!(wants_share(
            &Sources {
                annotations: &none,
                env: &env
            },
            true
        ));
        assert!(!wants_share(
            &Sources {
                annotations: &none,
                env: &env
            },
            false
        ));
        assert!(!wants_share(
            &Sources {
                annotations: &none,
                env: &[]
            },
            true
        ));
    }
}
