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

/// Cheap test on the raw config bytes: can this container possibly ask for sharing? The names
/// are looked for in the bytes as they are: bytes that are not UTF-8 (which runc's Go decoder
/// takes, replacing them) are read lossily, which keeps every ASCII byte where it was, so a
/// container that names nothing still passes.
///
/// `str::contains` is core's substring search, vectorised with SSE2 at compile time; `memchr`'s
/// picks its code by asking the CPU first, seven `cpuid`s that cost 4-5 µs each in a VM (the
/// fast path of every container that asks for nothing went 0.03 ms slower for them).
pub(crate) fn may_ask(bytes: &[u8], state_annotations: &HashMap<String, String>) -> bool {
    state_annotations
        .keys()
        .any(|k| k.starts_with(request::ANNOTATION))
        || {
            let text = crate::vocab::text(bytes);
            text.contains("gpu.share") || text.contains("GPU_SHARE")
        }
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::Path;

    use super::*;
    use crate::decide::enforce::{CgroupFact, ImageFact};
    use crate::decide::input::parse_spec;
    use crate::vocab::{ComputeMode, Gpu};

    const GIB: u64 = 1 << 30;

    /// Two GPUs of 80 GiB; counts how often it was opened.
    struct TwoGpus;

    impl Inventory for TwoGpus {
        fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
            Ok((0..2)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{i:08x}"),
                    minor: i,
                })
                .collect())
        }
        fn compute_mode(&self, _: u32) -> Result<ComputeMode, InventoryError> {
            Ok(ComputeMode::Default)
        }
        fn set_compute_mode(&self, _: u32, _: ComputeMode) -> Result<(), InventoryError> {
            Ok(())
        }
        fn memory_total(&self, _: u32) -> Result<u64, InventoryError> {
            Ok(80 * GIB)
        }
    }

    /// `plan_for` on a spec with these annotations (GPU 1 visible), and how often the
    /// inventory was opened.
    fn plan(annotations: &[(&str, &str)], cfg: &Config) -> (Result<Option<Plan>, String>, u32) {
        let ann: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let spec = serde_json::json!({
            "annotations": ann,
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
        });
        let spec = parse_spec(spec.to_string().as_bytes(), Path::new("config.json")).unwrap();
        let opened = Cell::new(0);
        let open = || {
            opened.set(opened.get() + 1);
            Ok(Box::new(TwoGpus) as Box<dyn Inventory>)
        };
        let got = plan_for("c1", &spec, cfg, &open, &|| CgroupFact::NotCreated, &|| {
            ImageFact::Loads
        })
        .map(|p| p.map(|(plan, _)| plan))
        .map_err(|e| crate::vocab::chain(&e));
        (got, opened.get())
    }

    #[test]
    fn may_ask_sees_every_way_of_asking_and_nothing_else() {
        let none = HashMap::new();
        assert!(!may_ask(br#"{"process":{"env":["PATH=/bin"]}}"#, &none));
        assert!(may_ask(br#"{"annotations":{"gpu.share":"mps"}}"#, &none));
        assert!(may_ask(br#"{"process":{"env":["GPU_SHARE=mps"]}}"#, &none));
        let state: HashMap<String, String> = [("gpu.share.cores".to_owned(), "50".to_owned())]
            .into_iter()
            .collect();
        assert!(may_ask(b"{}", &state), "an annotation only the state has");
        let other: HashMap<String, String> =
            [("io.x".to_owned(), "1".to_owned())].into_iter().collect();
        assert!(!may_ask(b"{}", &other));
        // Bytes that are not UTF-8: the names are found where they are, and nothing else is.
        assert!(!may_ask(b"{\"a\":\"\xff\xc3\"}", &none));
        assert!(may_ask(b"{\"gpu.share\xc3\":\"mps\xff\"}", &none));
        assert!(may_ask(b"{\"\xc3gpu.share\":\"mps\"}", &none));
        // Anywhere in a long spec, past the first vector's width and at its very end.
        let long = format!("{{\"x\":\"{}\",\"y\":\"gpu.share\"", "a".repeat(10_000));
        assert!(may_ask(long.as_bytes(), &none));
        assert!(may_ask(&long.as_bytes()[..long.len() - 1], &none));
        assert!(!may_ask(&long.as_bytes()[..long.len() - 2], &none));
    }

    #[test]
    fn a_container_that_asks_for_nothing_gets_no_plan_and_opens_no_inventory() {
        let (got, opened) = plan(&[("io.x", "1")], &Config::default());
        assert!(matches!(got, Ok(None)), "{got:?}");
        assert_eq!(opened, 0);
        // Positive control: the same spec asking for a share opens it and gets a plan.
        let (got, opened) = plan(&[("gpu.share", "timeslice")], &Config::default());
        let plan = got.unwrap().expect("a plan");
        assert_eq!(opened, 1);
        assert_eq!(plan.mode, Mode::Timeslice);
        assert_eq!(plan.gpus.len(), 1);
        assert_eq!(plan.gpus[0].index, 1);
        assert_eq!(plan.domain, None, "only mps has a domain");
    }

    #[test]
    fn an_mps_plan_has_its_domain_and_takes_its_cores_unless_it_named_them() {
        let mut cfg = Config::default();
        cfg.policy.default_cores = 60;
        let (got, _) = plan(&[("gpu.share", "mps")], &cfg);
        let p = got.unwrap().expect("a plan");
        let d = p.domain.as_ref().expect("a domain");
        assert_eq!(d.key, "gpu");
        assert_eq!(p.cores, 60, "the domain's");
        let (got, _) = plan(&[("gpu.share", "mps"), ("gpu.share.cores", "30")], &cfg);
        let p = got.unwrap().expect("a plan");
        assert_eq!(p.cores, 30, "named");
        assert_eq!(p.domain.as_ref().map(|d| d.limits.cores), Some(60));
    }

    #[test]
    fn a_memory_cap_above_the_gpu_is_refused_and_one_up_to_it_is_planned() {
        let cfg = Config::default();
        for (memory, ok) in [
            ("80Gi", true),
            ("1Gi", true),
            ("81920Mi", true),
            ("81921Mi", false),
        ] {
            let (got, _) = plan(
                &[("gpu.share", "timeslice"), ("gpu.share.memory", memory)],
                &cfg,
            );
            match got {
                Ok(Some(p)) => {
                    assert!(ok, "{memory}: planned, should be refused");
                    assert!(p.memory.is_some(), "{memory}");
                }
                Ok(None) => panic!("{memory}: no plan"),
                Err(e) => {
                    assert!(!ok, "{memory}: {e}");
                    assert!(
                        e.contains("gpu.share.memory asks for")
                            && e.contains("GPU 1 (GPU-00000001) has 80.0 GiB"),
                        "{e}"
                    );
                }
            }
        }
    }
}
