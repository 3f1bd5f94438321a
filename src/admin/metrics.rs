//! `gpushare-hook metrics`: the Prometheus exposition of the node's shares, per GPU, isolation
//! domain and container, with the node-wide counters of [`crate::host::counters`].
//!
//! Built from a lock-free snapshot ([`super::status`] and the records), the counters file and
//! the limiters' accounting regions; it takes no GPU lock.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::config::Config;
use crate::host::counters::{self, Counters};
use crate::host::state::StateDir;
use crate::host::{account, state::Record};
use crate::vocab::{Inventory, Mode};

type Labels = Vec<(String, String)>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type CounterFamily = Family<Labels, Counter>;

/// Every metric name gpushare exports (the dashboard test checks its expressions against
/// these; histogram series add `_bucket`, `_sum` and `_count`).
pub const NAMES: &[&str] = &[
    "gpushare_state_readable",
    "gpushare_gpu_info",
    "gpushare_gpu_compute_mode",
    "gpushare_gpu_memory_total_bytes",
    "gpushare_gpu_memory_committed_bytes",
    "gpushare_gpu_clients",
    "gpushare_domain_daemon_up",
    "gpushare_domain_daemon_answering",
    "gpushare_domain_enforced_cores_ratio",
    "gpushare_domain_enforced_memory_bytes",
    "gpushare_domain_drift",
    "gpushare_domain_tampered",
    "gpushare_domain_clients",
    "gpushare_domain_restarts_total",
    "gpushare_container_info",
    "gpushare_container_memory_cap_bytes",
    "gpushare_container_cores_ratio",
    "gpushare_container_device_memory_used_bytes",
    "gpushare_requests_total",
    "gpushare_acquires_total",
    "gpushare_releases_total",
    "gpushare_refusals_total",
    "gpushare_daemon_starts_total",
    "gpushare_daemon_stops_total",
    "gpushare_daemon_restarts_total",
    "gpushare_daemon_replacements_total",
    "gpushare_drifts_total",
    "gpushare_gc_actions_total",
    "gpushare_create_runtime_duration_seconds",
];

/// A histogram whose buckets were counted elsewhere (the counters file).
#[derive(Debug)]
struct StoredHistogram {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for StoredHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Gauges by name, registered in one go with their help.
struct Gauges {
    families: BTreeMap<&'static str, (&'static str, GaugeFamily)>,
}

impl Gauges {
    fn new(defs: &[(&'static str, &'static str)]) -> Self {
        Self {
            families: defs
                .iter()
                .map(|(n, h)| (*n, (*h, GaugeFamily::default())))
                .collect(),
        }
    }

    fn set(&self, name: &str, l: &Labels, v: f64) {
        self.families[name].1.get_or_create(l).set(v);
    }

    fn register(self, reg: &mut Registry) {
        for (name, (help, fam)) in self.families {
            reg.register(name, help, fam);
        }
    }
}

fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    reg.register(name.trim_end_matches("_total"), help, c);
}

fn counter_by(reg: &mut Registry, name: &str, help: &str, label: &str, m: &BTreeMap<String, u64>) {
    let fam = CounterFamily::default();
    for (k, v) in m {
        fam.get_or_create(&labels(&[(label, k)])).inc_by(*v);
    }
    reg.register(name.trim_end_matches("_total"), help, fam);
}

/// The enforcing backend of a mode: who makes the caps hold.
fn backend(mode: Mode) -> &'static str {
    match mode {
        Mode::Mps => "mps_daemon",
        Mode::Limit => "limiter",
        Mode::Timeslice => "none",
    }
}

/// The exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (what `promtool check metrics` and node_exporter's
    /// textfile collector read).
    Text,
    /// OpenMetrics 1.0 text, as `prometheus-client` writes it.
    OpenMetrics,
}

impl Format {
    /// The HTTP `Content-Type` of the format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The exposition of the node in `format`.
pub fn render(cfg: &Config, inventory: Option<&dyn Inventory>, format: Format) -> String {
    let om = render_openmetrics(cfg, inventory);
    match format {
        Format::OpenMetrics => om,
        Format::Text => to_text_format(&om),
    }
}

/// OpenMetrics to the Prometheus text format: a counter family is named with its `_total`
/// suffix in `# HELP` and `# TYPE` (OpenMetrics names the family without it, which classic
/// parsers take for a second, untyped family), and `# EOF` and `# UNIT` lines go.
pub fn to_text_format(om: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for l in om.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, l.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(l);
                }
            }
            None => out.push_str(l),
        }
        out.push('\n');
    }
    out
}

/// The exposition as `prometheus-client` writes it (OpenMetrics).
fn render_openmetrics(cfg: &Config, inventory: Option<&dyn Inventory>) -> String {
    let st = super::status::status(cfg, inventory);
    let sd = StateDir::new(&cfg.state_dir);
    let records: BTreeMap<String, Record> = if st.error.is_none() {
        sd.list_records()
            .into_iter()
            .filter_map(|(u, r)| Some((u, r.ok()?)))
            .collect()
    } else {
        BTreeMap::new()
    };
    let counters = counters::load(&sd);
    let mut reg = Registry::default();
    let g = Gauges::new(&[
        ("gpushare_state_readable", "1 when the state directory can be read (else the other metrics say nothing about the node)"),
        ("gpushare_gpu_info", "A GPU gpushare shares: its UUID, NVML index and the mode it serves"),
        ("gpushare_gpu_compute_mode", "The GPU's NVML compute mode (1 for the mode named)"),
        ("gpushare_gpu_memory_total_bytes", "The GPU's device memory"),
        ("gpushare_gpu_memory_committed_bytes", "Sum of the memory caps of the GPU's containers"),
        ("gpushare_gpu_clients", "Containers sharing the GPU"),
        ("gpushare_domain_daemon_up", "1 when the MPS isolation domain has a recorded daemon that runs"),
        ("gpushare_domain_daemon_answering", "1 when the domain's MPS daemon answers its control socket"),
        ("gpushare_domain_enforced_cores_ratio", "Active thread percentage the domain's daemon enforces, as a ratio"),
        ("gpushare_domain_enforced_memory_bytes", "Pinned device memory per client the domain's daemon enforces"),
        ("gpushare_domain_drift", "1 when the daemon's defaults differ from what gpushare set"),
        ("gpushare_domain_tampered", "1 when the domain's control socket is held by a process other than the daemon gpushare started"),
        ("gpushare_domain_clients", "Containers in the MPS isolation domain"),
        ("gpushare_container_info", "A container with a share: its mode, domain, enforcing backend and what enforces its memory cap (memory_backend: driver, limiter, or none for an uncapped share, which reserves no memory and has no guarantee: memory=\"uncapped\")"),
        ("gpushare_container_memory_cap_bytes", "The container's device memory cap on the GPU"),
        ("gpushare_container_cores_ratio", "The container's share of the GPU's SMs, as a ratio"),
        ("gpushare_container_device_memory_used_bytes", "Device memory the container's processes hold on the GPU: NVML's currentUsed of its cgroup (driver backend) or the limiter's account"),
    ]);
    g.set(
        "gpushare_state_readable",
        &Vec::new(),
        f64::from(u8::from(st.error.is_none())),
    );
    let domain_restarts = CounterFamily::default();
    for gpu in &st.gpus {
        let index = gpu.index.to_string();
        let gl = labels(&[("gpu", &gpu.uuid), ("index", &index)]);
        let mode = gpu
            .mode
            .map_or_else(|| "none".to_owned(), |m| m.to_string());
        g.set(
            "gpushare_gpu_info",
            &labels(&[("gpu", &gpu.uuid), ("index", &index), ("mode", &mode)]),
            1.0,
        );
        if let Some(cm) = &gpu.compute_mode {
            g.set(
                "gpushare_gpu_compute_mode",
                &labels(&[("gpu", &gpu.uuid), ("index", &index), ("compute_mode", cm)]),
                1.0,
            );
        }
        if let Some(total) = inventory.and_then(|i| i.memory_total(gpu.index).ok()) {
            g.set("gpushare_gpu_memory_total_bytes", &gl, total as f64);
        }
        let committed: u64 = gpu.clients.iter().filter_map(|c| c.memory).sum();
        g.set("gpushare_gpu_memory_committed_bytes", &gl, committed as f64);
        g.set("gpushare_gpu_clients", &gl, gpu.clients.len() as f64);
        for d in &gpu.domains {
            let dl = labels(&[("gpu", &gpu.uuid), ("domain", &d.key)]);
            let (up, answering) = d
                .daemon
                .as_ref()
                .map_or((false, false), |dm| (dm.alive, dm.alive && dm.answers));
            g.set("gpushare_domain_daemon_up", &dl, f64::from(u8::from(up)));
            g.set(
                "gpushare_domain_daemon_answering",
                &dl,
                f64::from(u8::from(answering)),
            );
            g.set(
                "gpushare_domain_enforced_cores_ratio",
                &dl,
                f64::from(d.enforced.cores) / 100.0,
            );
            if let Some(mib) = d.enforced.memory_mib {
                g.set(
                    "gpushare_domain_enforced_memory_bytes",
                    &dl,
                    (mib << 20) as f64,
                );
            }
            g.set("gpushare_domain_drift", &dl, f64::from(u8::from(d.drift)));
            g.set(
                "gpushare_domain_tampered",
                &dl,
                f64::from(u8::from(d.tampered.is_some())),
            );
            g.set("gpushare_domain_clients", &dl, d.clients.len() as f64);
            let restarts = counters
                .domain_restarts
                .get(&format!("{}/{}", gpu.uuid, d.key))
                .copied()
                .unwrap_or(0);
            domain_restarts.get_or_create(&dl).inc_by(restarts);
        }
        let Some(rec) = records.get(&gpu.uuid) else {
            continue;
        };
        for (id, c) in &rec.clients {
            let mut cl = labels(&[("id", id), ("gpu", &gpu.uuid)]);
            for (k, v) in [
                ("namespace", &c.kube.namespace),
                ("pod", &c.kube.pod),
                ("container", &c.kube.container),
            ] {
                if let Some(v) = v {
                    cl.push((k.to_owned(), v.clone()));
                }
            }
            let mut info = cl.clone();
            info.push(("mode".into(), c.mode.to_string()));
            info.push(("domain".into(), c.domain.clone().unwrap_or_default()));
            info.push(("backend".into(), backend(c.mode).into()));
            info.push((
                "memory_backend".into(),
                c.cap
                    .as_ref()
                    .map_or("none".into(), |k| k.enforcement.backend.to_string()),
            ));
            info.push((
                "memory".into(),
                if c.cap.is_some() {
                    "capped"
                } else {
                    "uncapped"
                }
                .into(),
            ));
            g.set("gpushare_container_info", &info, 1.0);
            if let Some(m) = c.cap.as_ref().map(|k| k.bytes).or(c.memory) {
                g.set("gpushare_container_memory_cap_bytes", &cl, m as f64);
            }
            g.set(
                "gpushare_container_cores_ratio",
                &cl,
                f64::from(c.cores) / 100.0,
            );
            // What `status` read for a capped container (NVML's `currentUsed` of its cgroup, or
            // the limiter's account): not asked of the driver a second time.
            let capped = gpu
                .clients
                .iter()
                .find(|s| s.id == *id)
                .and_then(|s| s.cap.as_ref());
            let used = match capped {
                Some(k) => k.used,
                None if c.mode == Mode::Limit => {
                    account::used_on(&account::region_path(&sd, id), &gpu.uuid)
                }
                None => None,
            };
            if let Some(used) = used {
                g.set(
                    "gpushare_container_device_memory_used_bytes",
                    &cl,
                    used as f64,
                );
            }
        }
    }
    g.register(&mut reg);
    reg.register(
        "gpushare_domain_restarts",
        "MPS daemons of the domain restarted (dead) or replaced (not answering)",
        domain_restarts,
    );
    node_counters(&mut reg, &counters);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).expect("writing to a String");
    out
}

fn node_counters(reg: &mut Registry, c: &Counters) {
    counter(
        reg,
        "gpushare_requests_total",
        "createRuntime hooks of containers that asked for a share",
        c.requests,
    );
    counter_by(
        reg,
        "gpushare_acquires_total",
        "Shares acquired, by mode",
        "mode",
        &c.acquires,
    );
    counter(
        reg,
        "gpushare_releases_total",
        "Containers released from a GPU",
        c.releases,
    );
    counter_by(
        reg,
        "gpushare_refusals_total",
        "Share requests refused, by reason",
        "reason",
        &c.refusals,
    );
    counter(
        reg,
        "gpushare_daemon_starts_total",
        "MPS control daemons started",
        c.daemon_starts,
    );
    counter(
        reg,
        "gpushare_daemon_stops_total",
        "MPS control daemons stopped",
        c.daemon_stops,
    );
    counter(
        reg,
        "gpushare_daemon_restarts_total",
        "Dead MPS daemons started afresh for their clients",
        c.daemon_restarts,
    );
    counter(
        reg,
        "gpushare_daemon_replacements_total",
        "Live MPS daemons that did not answer, replaced",
        c.daemon_replacements,
    );
    counter(
        reg,
        "gpushare_drifts_total",
        "MPS domains seen with defaults other than gpushare set",
        c.drifts,
    );
    counter_by(
        reg,
        "gpushare_gc_actions_total",
        "Actions of gc and of serve's healing pass, by kind",
        "kind",
        &c.gc_actions,
    );
    let h = &c.create_runtime_seconds;
    reg.register(
        "gpushare_create_runtime_duration_seconds",
        "Duration of createRuntime hooks that acquired or refused a share",
        StoredHistogram {
            sum: h.sum,
            count: h.count,
            buckets: h.pairs(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_name_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: dir.path().to_owned(),
            ..Config::default()
        };
        let text = render(&cfg, None, Format::OpenMetrics);
        let typed: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for t in &typed {
            let full = if NAMES.contains(t) {
                (*t).to_owned()
            } else {
                format!("{t}_total")
            };
            assert!(NAMES.contains(&full.as_str()), "{t} is not in NAMES");
        }
        assert!(text.contains("gpushare_state_readable 1"), "{text}");
        assert!(text.contains("gpushare_requests_total 0"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        let plain = to_text_format(&text);
        assert!(!plain.contains("# EOF"), "{plain}");
        assert!(
            plain.contains("# TYPE gpushare_requests_total counter\n"),
            "{plain}"
        );
        assert!(plain.contains("# HELP gpushare_requests_total "), "{plain}");
        assert!(
            plain.contains("# TYPE gpushare_state_readable gauge\n"),
            "{plain}"
        );
    }
}
