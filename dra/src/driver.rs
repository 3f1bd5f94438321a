//! Prepare and unprepare: a claim's share checked against the node's own admission, a CDI
//! spec per claim, and a checkpoint so that the same claim gets the same answer after a
//! restart of the plugin or the kubelet.
//!
//! Admission at prepare is the hook's (`admission::admit`): the memory of the claims prepared
//! on the GPU plus this one, against `memory_overcommit` times the GPU's size. The hook admits
//! the claim's containers again when they start, by the same rule and the same caps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpushare::config::{Config, ProfileConfig};
use gpushare::decide::{admission, request};
use gpushare::vocab::{Inventory, InventoryError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::claim::{self, ClaimError};

/// The CDI kind of per-claim specs: `gpushare.io/claim=c-<uid>`.
pub const CDI_KIND: &str = "gpushare.io/claim";
/// The checkpoint's file in the plugin's state directory.
pub const CHECKPOINT: &str = "checkpoint.json";

/// Opens the node's GPU inventory (NVML, or a fake in tests) for one call.
pub type Opener = Box<dyn Fn() -> Result<Box<dyn Inventory>, InventoryError> + Send + Sync>;

/// How NVIDIA's CDI spec names a GPU (`nvidia-ctk cdi generate --device-name-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NvidiaName {
    /// `nvidia.com/gpu=0`.
    Index,
    /// `nvidia.com/gpu=GPU-…`.
    Uuid,
}

/// Why a claim was not prepared or unprepared; one line, shown by `kubectl describe pod`.
#[derive(Debug, Error)]
pub enum PrepareError {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("{0}")]
    Memory(#[from] request::RequestError),
    #[error("{0}")]
    Overcommitted(#[from] Box<admission::Overcommitted>),
    #[error("GPU {0} is not on this node any more; delete the pod so that it is scheduled again")]
    NoGpu(u32),
    #[error("cannot ask the GPU driver: {}", gpushare::vocab::chain(.0))]
    Inventory(#[from] InventoryError),
    #[error("claim {uid}: the API server sent claim {got}; retry")]
    WrongClaim { uid: String, got: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the CDI spec: {0}")]
    Cdi(String),
}

/// A prepared claim, as the checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub namespace: String,
    pub name: String,
    pub request_name: String,
    pub pool: String,
    pub device: String,
    pub gpu: u32,
    pub uuid: String,
    /// The share's memory cap in bytes; `None`: uncapped (counts as the whole GPU).
    pub memory: Option<u64>,
    /// The inline profile the hook is handed.
    pub profile: String,
    /// The CDI devices the runtime adds: the claim's, then the GPU's own.
    pub cdi_devices: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    claims: BTreeMap<String, Prepared>,
}

/// The plugin's node side.
pub struct Driver {
    cfg: Config,
    /// A policy file not at the default path, handed to the hook (`GPUSHARE_CONFIG`).
    policy: Option<PathBuf>,
    node: String,
    state_dir: PathBuf,
    cdi_dir: PathBuf,
    nvidia: NvidiaName,
    open: Opener,
    checkpoint: Mutex<Checkpoint>,
}

/// Where the driver keeps things and how it names GPUs.
pub struct Paths {
    pub state_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub nvidia: NvidiaName,
}

impl Driver {
    /// The driver of `node`, with the prepared claims of its checkpoint.
    ///
    /// # Errors
    /// When the checkpoint exists but cannot be read: nothing is forgotten silently.
    pub fn new(
        cfg: Config,
        policy: Option<PathBuf>,
        node: &str,
        paths: Paths,
        open: Opener,
    ) -> Result<Self, String> {
        let path = paths.state_dir.join(CHECKPOINT);
        let checkpoint = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "checkpoint {} is not readable ({e}); move it aside only once no pod uses a gpushare claim on this node",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint::default(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        Ok(Self {
            cfg,
            policy,
            node: node.to_owned(),
            state_dir: paths.state_dir,
            cdi_dir: paths.cdi_dir,
            nvidia: paths.nvidia,
            open,
            checkpoint: Mutex::new(checkpoint),
        })
    }

    /// The policy the driver runs.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The node (and pool) name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Opens the inventory.
    ///
    /// # Errors
    /// The inventory's.
    pub fn inventory(&self) -> Result<Box<dyn Inventory>, InventoryError> {
        (self.open)()
    }

    /// The prepared claims, by UID.
    pub fn prepared(&self) -> BTreeMap<String, Prepared> {
        self.lock().claims.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Checkpoint> {
        self.checkpoint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Prepares `claim` (UID `uid`): the same answer for a claim already prepared (its CDI
    /// spec rewritten if it went missing); otherwise its share checked and admitted, its CDI
    /// spec written, and then the checkpoint.
    ///
    /// # Errors
    /// [`PrepareError`]; a refused claim changes nothing.
    pub fn prepare(&self, uid: &str, claim: &ResourceClaim) -> Result<Prepared, PrepareError> {
        let got = claim.metadata.uid.as_deref().unwrap_or_default();
        if got != uid {
            return Err(PrepareError::WrongClaim {
                uid: uid.to_owned(),
                got: got.chars().take(64).collect(),
            });
        }
        let mut cp = self.lock();
        if let Some(p) = cp.claims.get(uid) {
            let p = p.clone();
            if !self.spec_path(uid).exists() {
                self.write_spec(uid, &p)?;
            }
            return Ok(p);
        }
        let share = claim::share(claim, &self.node, &self.cfg)?;
        let inv = (self.open)()?;
        let gpu = inv
            .gpus()?
            .into_iter()
            .find(|g| g.index == share.gpu)
            .ok_or(PrepareError::NoGpu(share.gpu))?;
        let total = inv.memory_total(gpu.index)?;
        if let Some(m) = share.request.memory {
            request::memory_fits(m, total, &gpu.uuid)?;
        }
        let holders: Vec<(String, Option<u64>)> = cp
            .claims
            .iter()
            .filter(|(_, p)| p.gpu == gpu.index)
            .map(|(u, p)| (format!("claim {}/{} ({u})", p.namespace, p.name), p.memory))
            .collect();
        admission::admit(
            gpu.index,
            &gpu.uuid,
            total,
            holders.iter().map(|(n, m)| (n.as_str(), *m)),
            share.request.memory,
            self.cfg.policy.memory_overcommit,
            self.cfg.policy.uncapped,
        )?;
        let nvidia = match self.nvidia {
            NvidiaName::Index => format!("nvidia.com/gpu={}", gpu.index),
            NvidiaName::Uuid => format!("nvidia.com/gpu={}", gpu.uuid),
        };
        let prepared = Prepared {
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            name: claim.metadata.name.clone().unwrap_or_default(),
            request_name: share.request_name,
            pool: share.pool,
            device: share.device,
            gpu: gpu.index,
            uuid: gpu.uuid,
            memory: share.request.memory,
            profile: share.profile,
            cdi_devices: vec![format!("{CDI_KIND}={}", cdi_device(uid)), nvidia],
        };
        self.write_spec(uid, &prepared)?;
        cp.claims.insert(uid.to_owned(), prepared.clone());
        if let Err(e) = self.save(&cp) {
            cp.claims.remove(uid);
            let _ = std::fs::remove_file(self.spec_path(uid));
            return Err(e);
        }
        Ok(prepared)
    }

    /// Unprepares claim `uid`: its CDI spec removed and its share released from the
    /// checkpoint. A claim not prepared here is already unprepared.
    ///
    /// # Errors
    /// [`PrepareError::Write`] when the spec or the checkpoint cannot be changed (retried by
    /// the kubelet).
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let mut cp = self.lock();
        let path = self.spec_path(uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PrepareError::Write {
                    path: path.display().to_string(),
                    source,
                })
            }
        }
        if let Some(p) = cp.claims.remove(uid) {
            if let Err(e) = self.save(&cp) {
                cp.claims.insert(uid.to_owned(), p);
                return Err(e);
            }
        }
        Ok(())
    }

    fn save(&self, cp: &Checkpoint) -> Result<(), PrepareError> {
        let path = self.state_dir.join(CHECKPOINT);
        let err = |source| PrepareError::Write {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.state_dir).map_err(err)?;
        let cp = Checkpoint {
            version: 1,
            claims: cp.claims.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&cp).expect("checkpoint serialises");
        gpushare::host::state::write_atomic(&path, &bytes, 0o600).map_err(err)
    }

    /// The per-claim CDI spec's path.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        spec_path(&self.cdi_dir, uid)
    }

    fn write_spec(&self, uid: &str, p: &Prepared) -> Result<(), PrepareError> {
        let spec = claim_spec(&self.cfg, self.policy.as_deref(), uid, &p.profile)?;
        let path = self.spec_path(uid);
        let err = |source| PrepareError::Write {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.cdi_dir).map_err(err)?;
        let mut text = serde_json::to_string_pretty(&spec).expect("spec serialises");
        text.push('\n');
        gpushare::host::state::write_atomic(&path, text.as_bytes(), 0o644).map_err(err)
    }
}

/// The CDI device of claim `uid` (a name that starts with a letter, as CDI 0.3.0 wants).
pub fn cdi_device(uid: &str) -> String {
    format!("c-{uid}")
}

/// `<dir>/gpushare.io-claim-<uid>.json`.
pub fn spec_path(dir: &Path, uid: &str) -> PathBuf {
    let safe: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(64)
        .collect();
    dir.join(format!("gpushare.io-claim-{safe}.json"))
}

/// The CDI spec of one claim: the device gpushare's `cdi generate` writes for a profile (the
/// same env and hooks), for the inline `profile`, under kind [`CDI_KIND`].
///
/// # Errors
/// [`PrepareError::Cdi`] when the policy refuses the profile (checked at prepare already).
pub fn claim_spec(
    cfg: &Config,
    policy: Option<&Path>,
    uid: &str,
    profile: &str,
) -> Result<serde_json::Value, PrepareError> {
    let mode = request::parse_mode(
        profile
            .strip_prefix(gpushare::decide::profile::INLINE_PREFIX)
            .and_then(|r| r.split(',').next())
            .unwrap_or_default(),
    )
    .ok_or_else(|| PrepareError::Cdi(format!("{profile:?} is not an inline profile")))?;
    let mut one = cfg.clone();
    one.profiles = BTreeMap::from([(
        profile.to_owned(),
        ProfileConfig {
            mode,
            cores: None,
            memory: None,
            group: None,
            timeslice: None,
        },
    )]);
    let mut spec = gpushare::admin::cdi::spec(&one, policy)
        .map_err(|e| PrepareError::Cdi(gpushare::vocab::chain(&e)))?;
    let mut device = spec["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == profile))
        .cloned()
        .ok_or_else(|| PrepareError::Cdi(format!("no device for {profile}")))?;
    device["name"] = cdi_device(uid).into();
    spec["kind"] = CDI_KIND.into();
    spec["devices"] = serde_json::json!([device]);
    Ok(spec)
}
