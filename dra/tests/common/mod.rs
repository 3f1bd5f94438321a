//! What the DRA plugin's tests share: a fake GPU inventory, claims as the scheduler leaves
//! them, and a driver on scratch directories.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use gpushare::config::Config;
use gpushare::vocab::{ComputeMode, Gpu, Inventory, InventoryError};
use gpushare_dra::driver::{Driver, NvidiaName, Paths};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

pub const GIB: u64 = 1 << 30;
pub const NODE: &str = "node-a";

/// GPUs of the given sizes, GPU-0000…, GPU-0001….
pub struct FakeGpus(pub Vec<u64>);

impl Inventory for FakeGpus {
    fn gpus(&self) -> Result<Vec<Gpu>, InventoryError> {
        Ok((0..self.0.len() as u32)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:04}aaaa-0000-0000-0000-000000000000"),
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
    fn memory_total(&self, index: u32) -> Result<u64, InventoryError> {
        self.0
            .get(index as usize)
            .copied()
            .ok_or_else(|| InventoryError::Unavailable("no such GPU".into()))
    }
}

pub fn policy(text: &str) -> Config {
    Config::parse(text, Path::new("t.toml")).unwrap()
}

/// A driver of node-a whose GPUs have `sizes`, keeping its files under `dir`.
pub fn driver(cfg: Config, dir: &Path, sizes: Vec<u64>) -> Driver {
    Driver::new(
        cfg,
        None,
        NODE,
        Paths {
            state_dir: dir.join("state"),
            cdi_dir: dir.join("cdi"),
            nvidia: NvidiaName::Index,
        },
        Box::new(move || Ok(Box::new(FakeGpus(sizes.clone())) as Box<dyn Inventory>)),
    )
    .unwrap()
}

/// A claim `name` allocated device `device` of node-a's pool, the scheduler having counted
/// `consumed` memory (None: a cluster without consumable capacity), with `config` as the
/// claim's own opaque parameters.
pub fn claim(
    name: &str,
    device: &str,
    consumed: Option<&str>,
    config: Option<serde_json::Value>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid(name)),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        driver: "gpushare.io".into(),
                        pool: NODE.into(),
                        device: device.into(),
                        request: "gpu".into(),
                        consumed_capacity: consumed
                            .map(|c| BTreeMap::from([("memory".to_owned(), Quantity(c.into()))])),
                        ..Default::default()
                    }]),
                    config: config.map(|parameters| {
                        vec![DeviceAllocationConfiguration {
                            source: "FromClaim".into(),
                            requests: None,
                            opaque: Some(OpaqueDeviceConfiguration {
                                driver: "gpushare.io".into(),
                                parameters: RawExtension(parameters),
                            }),
                        }]
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A claim's UID, made from its name.
pub fn uid(name: &str) -> String {
    let h = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{h:08x}-0000-4000-8000-{:012x}", name.len())
}

/// gpushare's opaque config with `fields`.
pub fn config(fields: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::json!({"apiVersion": "gpushare.io/v1alpha1", "kind": "ShareConfig"});
    for (k, f) in fields.as_object().unwrap() {
        v[k] = f.clone();
    }
    v
}
