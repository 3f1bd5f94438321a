//! A claim's share: the device the scheduler allocated (its GPU and mode), the memory it
//! counted there, and the opaque config of the claim and its class, turned into a gpushare
//! request and checked exactly as the hook checks annotations (`request::parse`, then the
//! inline profile the hook will be handed, `profile::find` and `check`). Pure.

use std::collections::HashMap;

use gpushare::config::Config;
use gpushare::decide::profile::{self, INLINE_PREFIX};
use gpushare::decide::request::{self, Request, Sources};
use gpushare::vocab::{quantity, Mode};
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use serde_json::Value;
use thiserror::Error;

use crate::slices;
use crate::DRIVER;

/// The `apiVersion` of gpushare's opaque config.
pub const CONFIG_API_VERSION: &str = "gpushare.io/v1alpha1";
/// Its `kind`.
pub const CONFIG_KIND: &str = "ShareConfig";
/// The config's fields and the annotations they stand for.
const FIELDS: [(&str, &str); 5] = [
    ("mode", "gpu.share"),
    ("memory", "gpu.share.memory"),
    ("cores", "gpu.share.cores"),
    ("timeslice", "gpu.share.timeslice"),
    ("group", "gpu.share.group"),
];

/// Why a claim cannot be served as allocated; one line each, shown by `kubectl describe pod`.
#[derive(Debug, Error)]
pub enum ClaimError {
    #[error(
        "claim {0} is not allocated yet; the scheduler allocates it before the kubelet prepares it"
    )]
    NotAllocated(String),
    #[error("claim {claim} has {count} {DRIVER} devices; a claim takes one gpushare share: use one request with count 1")]
    Several { claim: String, count: usize },
    #[error("claim {claim} was allocated device {device}, which this node does not publish (its GPUs changed?); delete the pod so that it is scheduled again")]
    UnknownDevice { claim: String, device: String },
    #[error("{DRIVER} config: {0}")]
    Config(String),
    #[error("{DRIVER} config: {0}")]
    Request(#[source] request::RequestError),
    #[error("{DRIVER} config: {0}")]
    Profile(#[source] profile::ProfileError),
    #[error("{DRIVER} config: {0}")]
    Domain(#[source] gpushare::decide::domain::DomainError),
    #[error("{DRIVER} config: mode {asked} does not match the allocated device {device} ({mode}); pick the DeviceClass of the mode, or drop mode from the config")]
    ModeMismatch {
        asked: String,
        device: String,
        mode: Mode,
    },
    #[error("{DRIVER} config: memory {asked} is more than the {allocated} the scheduler counted for this claim; request capacity memory: {asked} in the claim, or ask for less")]
    MemoryAboveAllocated { asked: String, allocated: String },
}

/// What the node does for a claim: the share on one GPU, with the request the hook gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The claim's request name the device serves.
    pub request_name: String,
    pub pool: String,
    pub device: String,
    pub gpu: u32,
    pub request: Request,
    /// The inline profile the hook is handed (`--profile`), the request itself.
    pub profile: String,
}

/// The share of `claim`, allocated on this node's pool `pool`.
///
/// # Errors
/// [`ClaimError`], one line naming what is wrong and what to do.
pub fn share(claim: &ResourceClaim, pool: &str, cfg: &Config) -> Result<Share, ClaimError> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let devices = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated(name.clone()))?;
    let ours: Vec<_> = devices
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == DRIVER)
        .collect();
    let [result] = ours.as_slice() else {
        return Err(match ours.len() {
            0 => ClaimError::NotAllocated(name),
            count => ClaimError::Several { claim: name, count },
        });
    };
    let unknown = || ClaimError::UnknownDevice {
        claim: name.clone(),
        device: format!("{}/{}", result.pool, result.device),
    };
    if result.pool != pool {
        return Err(unknown());
    }
    let (gpu, mode) = slices::parse_device_name(&result.device).ok_or_else(unknown)?;
    let allocated = result
        .consumed_capacity
        .as_ref()
        .and_then(|c| c.get(slices::MEMORY))
        .map(|q| q.0.clone());
    let configs = devices.config.as_deref().unwrap_or_default();
    let annotations = annotations(configs, &result.request, &result.device, mode, allocated)?;
    let src = Sources {
        annotations: &annotations,
        env: &[],
    };
    let request = request::parse(&src, cfg)
        .map_err(ClaimError::Request)?
        .ok_or_else(|| {
            ClaimError::Config(
                "mode asks for no share; a gpushare claim is a share: drop mode, or pick the DeviceClass of the mode wanted".into(),
            )
        })?;
    if request.mode == Mode::Mps {
        // The MPS domain the hook will choose: a group the policy has no place for is refused
        // now, not when the container starts.
        // The pod's namespace is the claim's, as the CRI will set it on the container.
        let spec: std::collections::HashMap<String, String> = claim
            .metadata
            .namespace
            .iter()
            .map(|ns| ("io.kubernetes.cri.sandbox-namespace".to_owned(), ns.clone()))
            .collect();
        gpushare::decide::domain::choose(&name, &request, &spec, cfg)
            .map_err(ClaimError::Domain)?;
    }
    let profile = inline_profile(&annotations);
    // What the hook will do with it: the same parse, from the inline profile.
    profile::find(cfg, &profile)
        .and_then(|p| p.check(cfg))
        .map_err(ClaimError::Profile)?;
    Ok(Share {
        request_name: result.request.clone(),
        pool: result.pool.clone(),
        device: result.device.clone(),
        gpu,
        request,
        profile,
    })
}

/// The annotations a claim's share stands for: the allocated device's mode, the configs that
/// apply to `request_name` (the class's first, then the claim's, a later one winning key by
/// key), and the memory the scheduler counted when no config names one.
///
/// # Errors
/// [`ClaimError`] for a config that is not gpushare's `ShareConfig` as written, or that asks
/// for another mode or more memory than was allocated.
pub fn annotations(
    configs: &[DeviceAllocationConfiguration],
    request_name: &str,
    device: &str,
    mode: Mode,
    allocated_memory: Option<String>,
) -> Result<HashMap<String, String>, ClaimError> {
    let mut out = HashMap::from([(request::ANNOTATION.to_owned(), mode.as_str().to_owned())]);
    let applies = |c: &&DeviceAllocationConfiguration| {
        c.opaque.as_ref().is_some_and(|o| o.driver == DRIVER)
            && c.requests
                .as_ref()
                .is_none_or(|r| r.is_empty() || r.iter().any(|n| n == request_name))
    };
    let mut ordered: Vec<&DeviceAllocationConfiguration> = configs.iter().filter(applies).collect();
    // FromClass before FromClaim: the claim's own config wins.
    ordered.sort_by_key(|c| c.source != "FromClass");
    for c in ordered {
        let params = &c.opaque.as_ref().expect("filtered").parameters.0;
        for (key, value) in config_fields(params)? {
            if key == request::ANNOTATION {
                match request::parse_mode(&value) {
                    Some(m) if m == mode => {}
                    // Not a mode: the annotation's own error ("unknown mode …").
                    None => {
                        out.insert(key, value);
                    }
                    Some(_) => {
                        return Err(ClaimError::ModeMismatch {
                            asked: value,
                            device: device.to_owned(),
                            mode,
                        })
                    }
                }
                continue;
            }
            out.insert(key, value);
        }
    }
    let memory_key = FIELDS[1].1;
    if let Some(allocated) = allocated_memory {
        match out.get(memory_key) {
            None => {
                out.insert(memory_key.to_owned(), allocated);
            }
            Some(asked) => {
                if let (Ok(a), Ok(b)) = (
                    quantity::parse_memory(asked),
                    quantity::parse_memory(&allocated),
                ) {
                    if a > b {
                        return Err(ClaimError::MemoryAboveAllocated {
                            asked: asked.clone(),
                            allocated,
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The `(annotation, value)` pairs of one opaque config.
fn config_fields(params: &Value) -> Result<Vec<(String, String)>, ClaimError> {
    let bad = |what: String| ClaimError::Config(what);
    let Value::Object(map) = params else {
        return Err(bad(format!(
            "parameters must be an object with apiVersion: {CONFIG_API_VERSION} and kind: {CONFIG_KIND}"
        )));
    };
    let api = map.get("apiVersion").and_then(Value::as_str);
    let kind = map.get("kind").and_then(Value::as_str);
    if api != Some(CONFIG_API_VERSION) || kind != Some(CONFIG_KIND) {
        return Err(bad(format!(
            "parameters must say apiVersion: {CONFIG_API_VERSION} and kind: {CONFIG_KIND} (got {}, {})",
            shown(map.get("apiVersion")),
            shown(map.get("kind"))
        )));
    }
    let mut out = Vec::new();
    for (k, v) in map {
        if k == "apiVersion" || k == "kind" {
            continue;
        }
        let Some((_, annotation)) = FIELDS.iter().find(|(f, _)| f == k) else {
            return Err(bad(format!(
                "unknown field {:?}; valid fields are mode, memory, cores, timeslice, group",
                k.chars().take(64).collect::<String>()
            )));
        };
        let value = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(bad(format!(
                    "{k}: {} is not a string or a number",
                    shown(Some(other))
                )))
            }
        };
        out.push(((*annotation).to_owned(), value));
    }
    Ok(out)
}

fn shown(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => v.to_string().chars().take(64).collect(),
    }
}

/// The inline profile for `annotations`: `gpu.share=<mode>` and each other key in a fixed
/// order, the values as written (already checked; none holds a comma).
pub fn inline_profile(annotations: &HashMap<String, String>) -> String {
    let mut out = format!("{INLINE_PREFIX}{}", annotations[request::ANNOTATION]);
    for (_, key) in &FIELDS[1..] {
        if let Some(v) = annotations.get(*key) {
            out.push_str(&format!(",{key}={v}"));
        }
    }
    out
}
