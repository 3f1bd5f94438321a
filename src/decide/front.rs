//! The front half every entry point shares (createRuntime, precreate, the runtime wrapper): a
//! cheap test on the raw config, then request -> devices -> [`Plan`].

use std::collections::HashMap;

use thiserror::Error;

use crate::config::Config;
use crate::decide::devices::DeviceError;
use crate::decide::domain::{self, DomainError};
use crate::decide::enforce::{CgroupFact, HostFacts, ImageFact};
use crate::decide::input::SpecView;
use crate::decide::plan::{self, Plan};
use crate::decide::request::{self, RequestError, Sources};
use crate::vocab::{Inventory, InventoryError, Mode};

/// Why no plan could be made.
#[derive(Debug, Error)]
pub enum DecideError {
    #[error("invalid share request")]
    Request(#[from] RequestError),
    #[error(transparent)]
    Devices(#[from] DeviceError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error(transparent)]
    LimiterImage(#[from] crate::decide::enforce::NeedsLimiter),
    #[error("gpu.share.memory asks for {asked} but GPU {index} ({uuid}) has {total} in all; ask for less")]
    MemoryAboveGpu {
        asked: String,
        index: u32,
        uuid: String,
        total: String,
    },
}

/// Cheap test on the raw config bytes: can this container possibly ask for sharing?
pub(crate) fn may_ask(bytes: &[u8], state_annotations: &HashMap<String, String>) -> bool {
    let has = |needle: &[u8]| memchr::memmem::find(bytes, needle).is_some();
    state_annotations
        .keys()
        .any(|k| k.starts_with(request::ANNOTATION))
        || has(b"gpu.share")
        || has(b"GPU_SHARE")
}

/// A plan and the inventory it was made from.
pub(crate) type Planned = (Plan, Box<dyn Inventory>);

/// Parses the request and makes the plan, complete with its cap's enforcement and whether it
/// runs without the limiter; `None` when the container asks for nothing. `cgroup`: the
/// container's cgroup, and `image`: what its image's C library is, as the caller finds them
/// (each asked only for a capped share that needs it); the driver's limits are asked of the
/// inventory.
pub(crate) fn plan_for(
    id: &str,
    spec: &SpecView,
    cfg: &Config,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
    cgroup: &dyn Fn() -> CgroupFact,
    image: &dyn Fn() -> ImageFact,
) -> Result<Option<Planned>, DecideError> {
    let src = Sources {
        annotations: &spec.annotations,
        env: &spec.process.env,
    };
    if !request::wants_share(&src, cfg.policy.env_fallback) {
        return Ok(None);
    }
    let Some(req) = request::parse(&src, cfg)? else {
        return Ok(None);
    };
    let inventory = open_inventory()?;
    let gpus = inventory.gpus()?;
    let driver = |index: u32, dir: &str| {
        inventory
            .memory_limits(index, dir)
            .map(drop)
            .map_err(|e| crate::vocab::chain(&e))
    };
    let facts = HostFacts {
        cgroup,
        driver: &driver,
    };
    let mut plan = plan::decide(id, &req, spec, &gpus, &facts)?;
    if plan.mode == Mode::Mps {
        let d = domain::choose(id, &req, &spec.annotations, cfg)?;
        if !req.cores_explicit {
            plan.cores = d.limits.cores;
        }
        plan.domain = Some(d);
    }
    check_memory(&plan, inventory.as_ref())?;
    plan.without_limiter =
        crate::decide::enforce::without_limiter(plan.mode, plan.cap, &plan.enforcement, image)?;
    Ok(Some((plan, inventory)))
}

/// Refuses a memory cap above a planned GPU's total memory (when the inventory knows it).
fn check_memory(plan: &Plan, inventory: &dyn Inventory) -> Result<(), DecideError> {
    let Some(asked) = plan.memory else {
        return Ok(());
    };
    for g in &plan.gpus {
        if let Ok(total) = inventory.memory_total(g.index) {
            if asked > total {
                return Err(DecideError::MemoryAboveGpu {
                    asked: crate::vocab::size::human(asked),
                    index: g.index,
                    uuid: g.uuid.clone(),
                    total: crate::vocab::size::human(total),
                });
            }
        }
    }
    Ok(())
}

/// Hook-entry env naming the spec edit's reservation of the MPS directories.
pub const RESERVATION_ENV: &str = "GPUSHARE_RESERVATION";
