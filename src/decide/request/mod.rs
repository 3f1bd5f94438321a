//! What a container asked for: the `gpu.share*` annotations, with `GPU_SHARE*` env fallbacks.
//!
//! Pure: annotations, env and the admin policy in, a validated [`Request`] (or none) out.
//! [`sources`] finds each key's value, [`grammar`] reads it, and [`parse`] puts them together
//! under the admin policy.

mod grammar;
mod sources;

use serde::Serialize;
use thiserror::Error;

use crate::config::Config;
use crate::vocab::domain::is_group_name;
use crate::vocab::quantity::{self, QuantityError};
use crate::vocab::{Mode, Timeslice};

pub use grammar::{parse_mode, parse_selector, parse_timeslice, Selector, DEVICES_GRAMMAR};
pub use sources::{
    annotation_keys, env_lookup, is_sandbox, wants_share, Sources, ANNOTATION, SANDBOX_MARKERS,
};
use sources::{CORES, DEVICES, FIELDS, GROUP, MEMORY, MODE, PREFIX, TIMESLICE};

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
        Some((key, v)) => Some(grammar::parse_selectors(key, &v)?),
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
            match parse_timeslice(&v) {
                Some(t) => Some(t),
                None => return Err(RequestError::Timeslice { key, value: v }),
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
    fn a_group_and_limits_at_the_policy_maximum_are_accepted() {
        let mut cfg = Config::default();
        cfg.policy.max_memory = Some("8Gi".into());
        cfg.policy.max_cores = 80;
        let got = run(
            &[
                ("gpu.share", "mps"),
                ("gpu.share.group", "team-a"),
                ("gpu.share.memory", "8Gi"),
                ("gpu.share.cores", "80"),
            ],
            &[],
            &cfg,
        )
        .unwrap();
        assert_eq!(
            got,
            Some(Request {
                memory: Some(8 << 30),
                cores: 80,
                cores_explicit: true,
                group: Some("team-a".into()),
                ..req(Mode::Mps)
            })
        );
        // Positive control: one more of either is refused.
        for (key, value) in [("gpu.share.memory", "8193Mi"), ("gpu.share.cores", "81")] {
            let e = run(&[("gpu.share", "mps"), (key, value)], &[], &cfg).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
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
        assert!(memory_fits(8 << 30, 8 << 30, "GPU-0").is_ok(), "all of it");
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
}
