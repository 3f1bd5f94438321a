//! The decision: a [`Plan`] made from (container, request, assignment, inventory). Pure data that
//! tests compare and `--dry-run` prints; [`crate::host::acquire`] carries it out.

use serde::Serialize;

use crate::decide::devices::{self, DeviceError};
use crate::decide::domain::PlannedDomain;
use crate::decide::enforce::{self, HostFacts};
use crate::decide::input::SpecView;
use crate::decide::request::Request;
use crate::vocab::memcap::Enforcement;
use crate::vocab::quantity::to_mib;
use crate::vocab::Gpu;
use crate::vocab::{Mode, Timeslice};

/// One GPU the container will share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedGpu {
    pub index: u32,
    pub uuid: String,
    /// CUDA ordinal inside the container (its position among the container's GPUs).
    pub ordinal: u32,
}

/// What the hook will do for one container.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub container: String,
    pub mode: Mode,
    pub gpus: Vec<PlannedGpu>,
    /// Per-GPU device-memory limit in bytes (for `mps` the per-process pinned limit; a joiner
    /// that names none is given its domain's).
    pub memory: Option<u64>,
    /// Per-GPU memory cap for the whole container, all its processes together: the
    /// `gpu.share.memory` it asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
    /// What enforces [`Plan::cap`], chosen from the host's facts ([`enforce::choose`]):
    /// [`enforce::uncapped`] without a cap (not printed), [`enforce::not_created`] in a spec
    /// edit, which comes before the container exists.
    #[serde(skip_serializing_if = "enforce::is_uncapped")]
    pub enforcement: Enforcement,
    /// Why a capped `mps` or `timeslice` share runs without the limiter: its image cannot load
    /// it (no glibc), and the driver enforces the cap. The container then loses only the
    /// reported sizes (CUDA and NVML inside show the whole GPU's memory, not the cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without_limiter: Option<String>,
    /// SM share in percent (100: no cap).
    pub cores: u8,
    /// Whether the container named its cores (otherwise they are its domain's or the policy's).
    pub cores_explicit: bool,
    pub timeslice: Option<Timeslice>,
    /// `mps`: the isolation domain the container joins (set by [`crate::decide::front`]).
    pub domain: Option<PlannedDomain>,
    /// The uid the container's process runs as (MPS serves one uid per daemon unless the
    /// driver has a multi-user server).
    pub uid: u32,
}

/// Makes the plan for a container that asked for `req`, its cap's enforcement chosen from the
/// host's `facts`.
///
/// # Errors
/// [`DeviceError`] when the container's GPUs do not fit the request.
pub fn decide(
    container: &str,
    req: &Request,
    spec: &SpecView,
    inventory: &[Gpu],
    facts: &HostFacts<'_>,
) -> Result<Plan, DeviceError> {
    let devs: Vec<String> = spec.linux.devices.iter().map(|d| d.path.clone()).collect();
    let mut given = devices::assigned(devices::visible(&spec.process.env), &devs, inventory)?;
    given.sort_by_key(|g| g.index);
    let chosen = devices::select(&given, req.devices.as_deref(), req.mode, inventory)?;
    // The CUDA ordinal is the GPU's place among those the container was given; a chosen GPU
    // outside them is refused (never ordinal 0, which names another GPU).
    let gpus = chosen
        .into_iter()
        .map(|g| {
            let ordinal = given
                .iter()
                .position(|a| a.index == g.index)
                .ok_or_else(|| DeviceError::NotAssigned(g.index.to_string()))?;
            Ok(PlannedGpu {
                ordinal: u32::try_from(ordinal)
                    .map_err(|_| DeviceError::NotAssigned(g.index.to_string()))?,
                index: g.index,
                uuid: g.uuid,
            })
        })
        .collect::<Result<Vec<PlannedGpu>, DeviceError>>()?;
    let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let enforcement = enforce::choose(req.memory, &indices, facts);
    Ok(Plan {
        container: container.to_owned(),
        mode: req.mode,
        gpus,
        memory: req.memory,
        cap: req.memory,
        enforcement,
        without_limiter: None,
        cores: req.cores,
        cores_explicit: req.cores_explicit,
        timeslice: req.timeslice,
        domain: None,
        uid: spec.process.user.uid,
    })
}

/// Where the container finds the MPS control pipe.
pub const MPS_PIPE_IN_CONTAINER: &str = "/tmp/nvidia-mps";

impl Plan {
    /// The plan of an `mps` container joining a running domain whose daemon enforces
    /// `enforced` (the host's answer, under the GPU's lock, to reserving the domain): the limits
    /// the container did not name are the domain's, so that its env says what it gets.
    #[must_use]
    pub fn joining(mut self, enforced: &crate::vocab::Limits) -> Plan {
        if !self.cores_explicit {
            self.cores = enforced.cores;
        }
        if self.memory.is_none() {
            self.memory = enforced.memory_mib.map(|m| m << 20);
        }
        self
    }

    /// The environment the container gets where env can be injected (docs/design.md: "What the
    /// container sees"). `LD_PRELOAD` is not included: it is appended by the spec editor.
    pub fn container_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        match self.mode {
            Mode::Mps => {
                env.push((
                    "CUDA_MPS_PIPE_DIRECTORY".into(),
                    MPS_PIPE_IN_CONTAINER.into(),
                ));
                env.push((
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
                    self.cores.to_string(),
                ));
                if let Some(m) = self.memory {
                    let limits: Vec<String> = self
                        .gpus
                        .iter()
                        .map(|g| format!("{}={}M", g.ordinal, to_mib(m)))
                        .collect();
                    env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(",")));
                }
                env.extend(self.limiter_env());
            }
            Mode::Limit | Mode::Timeslice => env.extend(self.limiter_env()),
        }
        env
    }

    /// Whether the container gets the limiter preloaded: always in `limit` mode; in `mps` and
    /// `timeslice` when it asked for a memory cap (the limiter keeps the container-wide
    /// account, and reports the cap inside, whichever backend enforces it), unless its image
    /// cannot load the limiter and the driver enforces the cap ([`Plan::without_limiter`]).
    pub fn uses_limiter(&self) -> bool {
        self.mode == Mode::Limit || (self.cap.is_some() && self.without_limiter.is_none())
    }

    /// The limiter's env: the container's cap per GPU (its CUDA ordinal), and in `limit` mode
    /// the SM share (MPS enforces `mps` cores itself; `timeslice` takes none).
    pub fn limiter_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if !self.uses_limiter() {
            return env;
        }
        if let Some(m) = self.cap {
            for g in &self.gpus {
                env.push((
                    format!("CUDA_DEVICE_MEMORY_LIMIT_{}", g.ordinal),
                    m.to_string(),
                ));
            }
        }
        if self.mode == Mode::Limit && self.cores < 100 {
            env.push(("CUDA_DEVICE_SM_LIMIT".into(), self.cores.to_string()));
        }
        env
    }

    /// The key of the MPS isolation domain (`gpu` for plans made before domains existed).
    pub fn domain_key(&self) -> &str {
        self.domain
            .as_ref()
            .map_or(crate::vocab::domain::GPU_DOMAIN, |d| d.key.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::enforce::CgroupFact;
    use crate::decide::input::parse_spec;
    use crate::vocab::memcap::Backend;

    /// Facts of a container in a cgroup v2 of its own that the driver takes limits on.
    fn driver_facts(f: impl FnOnce(&HostFacts<'_>) -> Plan) -> Plan {
        let cg = || CgroupFact::Own("/sys/fs/cgroup/c1".into());
        let drv = |_: u32, _: &str| Ok(());
        f(&HostFacts {
            cgroup: &cg,
            driver: &drv,
        })
    }

    fn inv() -> Vec<Gpu> {
        (0..4)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08x}"),
                minor: i,
            })
            .collect()
    }

    #[test]
    fn mps_plan_and_env() {
        let spec = parse_spec(
            br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=2"]}}"#,
            std::path::Path::new("c"),
        )
        .unwrap();
        let req = Request {
            mode: Mode::Mps,
            devices: None,
            memory: Some(4 << 30),
            cores: 30,
            cores_explicit: true,
            timeslice: None,
            group: None,
        };
        let plan = driver_facts(|f| decide("c1", &req, &spec, &inv(), f).unwrap());
        assert_eq!(
            plan.gpus,
            vec![PlannedGpu {
                index: 2,
                uuid: "GPU-00000002".into(),
                ordinal: 0
            }]
        );
        assert_eq!(
            plan.container_env(),
            vec![
                (
                    "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                    "/tmp/nvidia-mps".to_string()
                ),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "30".into()),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=4096M".into()),
                // The container-wide cap, kept by the limiter's account.
                (
                    "CUDA_DEVICE_MEMORY_LIMIT_0".into(),
                    (4u64 << 30).to_string()
                ),
            ]
        );
        assert!(plan.uses_limiter());
        let uncapped = Plan {
            cap: None,
            ..plan.clone()
        };
        assert!(!uncapped.uses_limiter());
        assert!(!uncapped
            .container_env()
            .iter()
            .any(|(k, _)| k.starts_with("CUDA_DEVICE_")));
    }

    /// A container joining a running domain gets the limits it did not name from the domain,
    /// and keeps the ones it named (admission then checks them against the domain's).
    #[test]
    fn joining_a_domain_fills_only_the_limits_not_named() {
        let spec = parse_spec(
            br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#,
            std::path::Path::new("c"),
        )
        .unwrap();
        let enforced = crate::vocab::Limits {
            cores: 25,
            memory_mib: Some(2048),
        };
        let plan_of = |cores: Option<u8>, memory: Option<u64>| {
            let req = Request {
                mode: Mode::Mps,
                devices: None,
                memory,
                cores: cores.unwrap_or(100),
                cores_explicit: cores.is_some(),
                timeslice: None,
                group: None,
            };
            driver_facts(|f| decide("c1", &req, &spec, &inv(), f).unwrap())
        };
        // (named cores, named memory) -> (cores, memory) after joining
        let rows = [
            ((None, None), (25, Some(2048u64 << 20))),
            ((Some(50), None), (50, Some(2048 << 20))),
            ((None, Some(1 << 30)), (25, Some(1 << 30))),
            ((Some(50), Some(1 << 30)), (50, Some(1 << 30))),
        ];
        let mut failed = Vec::new();
        for ((cores, memory), want) in rows {
            let before = plan_of(cores, memory);
            // Positive control: what was not named is not the domain's before joining.
            assert!(before.cores != 25 || cores.is_some());
            let got = before.clone().joining(&enforced);
            if (got.cores, got.memory) != want {
                failed.push(format!(
                    "named {cores:?}/{memory:?}: got {}/{:?}, want {want:?}",
                    got.cores, got.memory
                ));
            }
            // Nothing else changes: the cap stays what was asked.
            if got.cap != before.cap || got.gpus != before.gpus {
                failed.push(format!(
                    "named {cores:?}/{memory:?}: more than limits changed"
                ));
            }
        }
        assert!(failed.is_empty(), "{failed:#?}");
    }

    #[test]
    fn limit_plan_uses_container_ordinals() {
        let spec = parse_spec(
            br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=3,1"]}}"#,
            std::path::Path::new("c"),
        )
        .unwrap();
        let req = Request {
            mode: Mode::Limit,
            devices: Some(vec![crate::decide::request::Selector::Index(3)]),
            memory: Some(1 << 30),
            cores: 50,
            cores_explicit: true,
            timeslice: None,
            group: None,
        };
        let plan = driver_facts(|f| decide("c1", &req, &spec, &inv(), f).unwrap());
        assert_eq!(plan.gpus[0].ordinal, 1);
        assert_eq!(
            plan.container_env(),
            vec![
                (
                    "CUDA_DEVICE_MEMORY_LIMIT_1".to_string(),
                    (1u64 << 30).to_string()
                ),
                ("CUDA_DEVICE_SM_LIMIT".into(), "50".into()),
            ]
        );
        // All of the SMs: no SM limit for the limiter to keep.
        let whole = Plan {
            cores: 100,
            ..plan.clone()
        };
        assert!(whole.uses_limiter());
        assert!(!whole
            .container_env()
            .iter()
            .any(|(k, _)| k == "CUDA_DEVICE_SM_LIMIT"));
        let most = Plan { cores: 99, ..plan };
        assert!(most
            .container_env()
            .contains(&("CUDA_DEVICE_SM_LIMIT".into(), "99".into())));
    }

    #[test]
    fn every_mode_gets_the_enforcement_its_cap_and_the_host_call_for() {
        let spec = parse_spec(
            br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=2"]}}"#,
            std::path::Path::new("c"),
        )
        .unwrap();
        let own = || CgroupFact::Own("/sys/fs/cgroup/c1".into());
        let v1 = || CgroupFact::NotOwn("the node accounts memory in cgroup v1".into());
        let not_yet = || CgroupFact::NotCreated;
        let takes = |_: u32, _: &str| Ok(());
        let refuses = |_: u32, _: &str| Err("Not Supported".to_owned());
        /// What a row expects.
        #[derive(Debug)]
        enum Want {
            Uncapped,
            NotCreated,
            By(Backend, Option<&'static str>),
        }
        type Cg<'a> = &'a dyn Fn() -> CgroupFact;
        type Drv<'a> = &'a dyn Fn(u32, &str) -> Result<(), String>;
        type Row<'a> = (&'a str, Option<u64>, Cg<'a>, Drv<'a>, Want);
        // Rows: (what, cap, cgroup, driver, expected).
        let rows: [Row<'_>; 6] = [
            (
                "cap, v2, driver limits",
                Some(1 << 30),
                &own,
                &takes,
                Want::By(Backend::Driver, Some("/sys/fs/cgroup/c1")),
            ),
            (
                "cap, v2, no driver limits",
                Some(1 << 30),
                &own,
                &refuses,
                Want::By(Backend::Limiter, None),
            ),
            (
                "cap, v1, driver limits",
                Some(1 << 30),
                &v1,
                &takes,
                Want::By(Backend::Limiter, None),
            ),
            (
                "cap, spec edit",
                Some(1 << 30),
                &not_yet,
                &takes,
                Want::NotCreated,
            ),
            (
                "no cap, v2, driver limits",
                None,
                &own,
                &takes,
                Want::Uncapped,
            ),
            (
                "no cap, v1, no driver limits",
                None,
                &v1,
                &refuses,
                Want::Uncapped,
            ),
        ];
        for mode in [Mode::Mps, Mode::Timeslice, Mode::Limit] {
            for (what, cap, cg, drv, want) in &rows {
                let req = Request {
                    mode,
                    devices: None,
                    memory: *cap,
                    cores: 100,
                    cores_explicit: false,
                    timeslice: None,
                    group: None,
                };
                let facts = HostFacts {
                    cgroup: *cg,
                    driver: *drv,
                };
                let plan = decide("c1", &req, &spec, &inv(), &facts).unwrap();
                let e = &plan.enforcement;
                match want {
                    Want::Uncapped => assert!(enforce::is_uncapped(e), "{mode} {what}: {e:?}"),
                    Want::NotCreated => {
                        assert!(enforce::is_not_created(e), "{mode} {what}: {e:?}")
                    }
                    Want::By(backend, cgroup) => {
                        assert_eq!(
                            (e.backend, e.cgroup.as_deref()),
                            (*backend, *cgroup),
                            "{mode} {what}"
                        );
                        // A limiter chosen for a cap says why.
                        assert_eq!(
                            e.why.is_some(),
                            *backend == Backend::Limiter,
                            "{mode} {what}"
                        );
                    }
                }
                // The plan prints its enforcement exactly when it has a cap.
                let json = serde_json::to_value(&plan).unwrap();
                assert_eq!(
                    json.get("enforcement").is_some(),
                    cap.is_some(),
                    "{mode} {what}"
                );
            }
        }
    }
}
