//! The node's ResourceSlices, pure: the GPUs (index, UUID, memory) and the policy in, the
//! slices of the node's pool out.
//!
//! Per GPU, a counter set `gpu-<index>` holds the GPU: `memory` (what the node admits,
//! `memory_overcommit` times its size, as the hook's admission counts it) and `cores` (100).
//! Per GPU and mode the policy allows, a share device `gpu-<index>-<mode>`:
//! - it may be allocated many times (`allowMultipleAllocations`), and each allocation consumes
//!   its `memory` capacity: the scheduler sums the claims' memory on the device against the
//!   same budget the node admits by, and a claim that names none counts as the whole GPU, as an
//!   uncapped share does on the node;
//! - it consumes the whole of its GPU's counter set, so of one GPU's share devices only one,
//!   one mode, is in use at a time (a GPU serves MPS clients or time-sliced ones, not both).

use std::collections::BTreeMap;

use gpushare::config::Config;
use gpushare::decide::admission;
use gpushare::vocab::{Inventory, InventoryError, Mode};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::DRIVER;

/// The capacity (and counter) that holds device memory, in bytes.
pub const MEMORY: &str = "memory";
/// The counter that holds the GPU's SM share, in percent.
pub const CORES: &str = "cores";
/// Counter sets per slice (the API's limit).
const COUNTER_SETS_PER_SLICE: usize = 8;
/// Devices per slice when they consume counters (the API's limit).
const DEVICES_PER_SLICE: usize = 64;
/// The label every slice of this driver carries, with the node's name.
pub const NODE_LABEL: &str = "gpushare.io/node";

/// One GPU as the slices show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// Bytes.
    pub memory: u64,
}

/// The GPUs of `inv` with their memory.
///
/// # Errors
/// When the driver cannot list the GPUs or their sizes (a slice must not offer a GPU whose
/// memory the node cannot count).
pub fn gpus(inv: &dyn Inventory) -> Result<Vec<GpuInfo>, InventoryError> {
    inv.gpus()?
        .into_iter()
        .map(|g| {
            Ok(GpuInfo {
                memory: inv.memory_total(g.index)?,
                index: g.index,
                uuid: g.uuid,
            })
        })
        .collect()
}

/// `gpu-<index>-<mode>`.
pub fn device_name(index: u32, mode: Mode) -> String {
    format!("gpu-{index}-{}", mode.as_str())
}

/// The GPU index and mode of a device name of [`device_name`]'s form.
pub fn parse_device_name(name: &str) -> Option<(u32, Mode)> {
    let rest = name.strip_prefix("gpu-")?;
    let (index, mode) = rest.split_once('-')?;
    if index.is_empty() || (index.len() > 1 && index.starts_with('0')) {
        return None;
    }
    let index: u32 = index.parse().ok()?;
    let mode = [Mode::Mps, Mode::Timeslice, Mode::Limit]
        .into_iter()
        .find(|m| m.as_str() == mode)?;
    Some((index, mode))
}

/// The counter set of GPU `index`.
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// What the node admits on a GPU of `total` bytes: the hook's own budget.
pub fn budget(total: u64, cfg: &Config) -> u64 {
    admission::allowed(total, cfg.policy.memory_overcommit)
}

fn q(n: u64) -> Quantity {
    Quantity(n.to_string())
}

fn counters(memory: u64) -> BTreeMap<String, Counter> {
    BTreeMap::from([
        (MEMORY.to_owned(), Counter { value: q(memory) }),
        (CORES.to_owned(), Counter { value: q(100) }),
    ])
}

fn attr_str(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    }
}

/// The share device of `gpu` in `mode`.
pub fn device(gpu: &GpuInfo, mode: Mode, cfg: &Config) -> Device {
    let budget = budget(gpu.memory, cfg);
    // A claim that names no memory counts as the whole GPU (as an uncapped share does), or as
    // all the node admits when that is less.
    let most = gpu.memory.min(budget);
    let attributes = BTreeMap::from([
        ("mode".to_owned(), attr_str(mode.as_str())),
        ("uuid".to_owned(), attr_str(&gpu.uuid)),
        (
            "index".to_owned(),
            DeviceAttribute {
                int: Some(i64::from(gpu.index)),
                ..Default::default()
            },
        ),
    ]);
    let capacity = BTreeMap::from([(
        MEMORY.to_owned(),
        DeviceCapacity {
            value: q(budget),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q(most)),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q(gpushare::vocab::quantity::MIN_MEMORY),
                    max: Some(q(most)),
                    step: None,
                }),
                valid_values: None,
            }),
        },
    )]);
    Device {
        name: device_name(gpu.index, mode),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacity),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counter_set_name(gpu.index),
            counters: counters(budget),
        }]),
        ..Default::default()
    }
}

/// Every slice of `node`'s pool for `gpus` under `cfg`, the pool at `generation`: the counter
/// sets first (8 a slice), then the share devices (64 a slice).
pub fn slices(node: &str, gpus: &[GpuInfo], cfg: &Config, generation: i64) -> Vec<ResourceSlice> {
    let sets: Vec<CounterSet> = gpus
        .iter()
        .map(|g| CounterSet {
            name: counter_set_name(g.index),
            counters: counters(budget(g.memory, cfg)),
        })
        .collect();
    let mut modes = cfg.policy.modes.clone();
    modes.dedup();
    let devices: Vec<Device> = gpus
        .iter()
        .flat_map(|g| modes.iter().map(move |m| (g, *m)))
        .map(|(g, m)| device(g, m, cfg))
        .collect();
    let set_chunks: Vec<Vec<CounterSet>> = sets
        .chunks(COUNTER_SETS_PER_SLICE)
        .map(<[CounterSet]>::to_vec)
        .collect();
    let device_chunks: Vec<Vec<Device>> = devices
        .chunks(DEVICES_PER_SLICE)
        .map(<[Device]>::to_vec)
        .collect();
    let count = i64::try_from(set_chunks.len() + device_chunks.len()).unwrap_or(i64::MAX);
    let slice = |suffix: String, spec: ResourceSliceSpec| ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-{DRIVER}-{suffix}")),
            labels: Some(BTreeMap::from([(NODE_LABEL.to_owned(), node.to_owned())])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation,
                resource_slice_count: count,
            },
            ..spec
        },
    };
    let mut out = Vec::new();
    for (i, chunk) in set_chunks.into_iter().enumerate() {
        out.push(slice(
            format!("counters-{i}"),
            ResourceSliceSpec {
                shared_counters: Some(chunk),
                ..Default::default()
            },
        ));
    }
    for (i, chunk) in device_chunks.into_iter().enumerate() {
        out.push(slice(
            format!("devices-{i}"),
            ResourceSliceSpec {
                devices: Some(chunk),
                ..Default::default()
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_round_trip_and_odd_ones_are_refused() {
        for (i, m) in [(0, Mode::Mps), (7, Mode::Timeslice), (1023, Mode::Limit)] {
            assert_eq!(parse_device_name(&device_name(i, m)), Some((i, m)));
        }
        for bad in [
            "gpu-01-mps",
            "gpu--mps",
            "gpu-0-none",
            "gpu-0",
            "cpu-0-mps",
            "gpu-x-mps",
        ] {
            assert_eq!(parse_device_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn counters_and_devices_go_in_slices_of_their_own_within_the_limits() {
        let cfg = Config::default();
        let gpus: Vec<GpuInfo> = (0..9)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{i}"),
                memory: 80 << 30,
            })
            .collect();
        let s = slices("node-a", &gpus, &cfg, 3);
        let kinds: Vec<(usize, usize)> = s
            .iter()
            .map(|s| {
                (
                    s.spec.shared_counters.as_ref().map_or(0, Vec::len),
                    s.spec.devices.as_ref().map_or(0, Vec::len),
                )
            })
            .collect();
        // 9 GPUs: 8 + 1 counter sets; 27 devices in one slice.
        assert_eq!(kinds, [(8, 0), (1, 0), (0, 27)]);
        for slice in &s {
            assert_eq!(slice.spec.pool.resource_slice_count, 3);
            assert_eq!(slice.spec.pool.generation, 3);
            assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        }
        let d = &s[2].spec.devices.as_ref().unwrap()[0];
        assert_eq!(d.name, "gpu-0-mps");
        let consumed = &d.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(consumed.counter_set, "gpu-0");
        assert_eq!(consumed.counters[MEMORY].value.0, (80u64 << 30).to_string());
    }
}
