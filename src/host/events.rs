//! The event log: one JSON line per acquire, release, refusal, MPS daemon start, stop,
//! restart or replacement, drift and gc action, appended to `[serve] events_file`; each event
//! also counts in [`crate::host::counters`].
//!
//! The doing layer only [`note`]s events (in memory, no I/O under a GPU lock); the command
//! that ran it [`flush`]es them once, after its locks are let go.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::decide::kube::KubeLabels;
use crate::host::counters::{self, Counters};
use crate::host::state::StateDir;

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Acquire {
        container: String,
        mode: String,
        gpus: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        domain: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory: Option<u64>,
        /// The container's memory cap (all its processes together).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<u64>,
        /// What enforces the cap: `driver` or `limiter`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_backend: Option<String>,
        cores: u8,
        /// The Kubernetes names, under keys of their own (`k8s_namespace`, `k8s_pod`,
        /// `k8s_container`): never under the event's `container`, which is the OCI id.
        #[serde(default, flatten)]
        kube: K8sNames,
    },
    Release {
        container: String,
        gpu: String,
    },
    Refusal {
        container: String,
        reason: String,
        message: String,
    },
    DaemonStart {
        gpu: String,
        domain: String,
        pid: i32,
    },
    DaemonStop {
        gpu: String,
        domain: String,
        pid: i32,
    },
    /// A dead daemon is started afresh (a `daemon_start` follows).
    DaemonRestart {
        gpu: String,
        domain: String,
        pid: i32,
    },
    /// A live daemon that did not answer is stopped and replaced (a `daemon_start` follows).
    DaemonReplace {
        gpu: String,
        domain: String,
        pid: i32,
    },
    Drift {
        gpu: String,
        domain: String,
        enforced: String,
        current: String,
    },
    Gc {
        kind: String,
        action: String,
    },
}

/// A container's Kubernetes names as event keys: `k8s_namespace`, `k8s_pod`, `k8s_container`,
/// so that no key of an event line is given twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct K8sNames {
    #[serde(
        rename = "k8s_namespace",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
    #[serde(rename = "k8s_pod", default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(
        rename = "k8s_container",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container: Option<String>,
}

impl From<&KubeLabels> for K8sNames {
    fn from(k: &KubeLabels) -> Self {
        K8sNames {
            namespace: k.namespace.clone(),
            pod: k.pod.clone(),
            container: k.container.clone(),
        }
    }
}

impl Event {
    /// A daemon event: `kind` is `start`, `stop`, `restart` or `replace`.
    pub fn daemon(kind: &str, gpu: &str, domain: &str, pid: i32) -> Self {
        let (gpu, domain) = (gpu.to_owned(), domain.to_owned());
        match kind {
            "start" => Event::DaemonStart { gpu, domain, pid },
            "stop" => Event::DaemonStop { gpu, domain, pid },
            "restart" => Event::DaemonRestart { gpu, domain, pid },
            _ => Event::DaemonReplace { gpu, domain, pid },
        }
    }
}

/// The [`Event::Acquire`] of a carried-out plan.
pub fn acquired(plan: &crate::decide::plan::Plan, kube: &KubeLabels) -> Event {
    Event::Acquire {
        container: plan.container.clone(),
        mode: plan.mode.to_string(),
        gpus: plan.gpus.iter().map(|g| g.uuid.clone()).collect(),
        domain: plan.domain.as_ref().map(|d| d.key.clone()),
        memory: plan.memory,
        cap: plan.cap,
        memory_backend: plan.cap.map(|_| plan.enforcement.backend.to_string()),
        cores: plan.cores,
        kube: K8sNames::from(kube),
    }
}

/// One line of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// Seconds since the epoch (UTC), with milliseconds.
    pub ts: f64,
    #[serde(flatten)]
    pub event: Event,
}

static PENDING: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// Keeps `event` for the next [`flush`] of this process.
pub fn note(event: Event) {
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(event);
}

/// Takes the events noted so far.
pub fn take() -> Vec<Event> {
    std::mem::take(
        &mut *PENDING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// Writes the events noted so far and counts them, together with `extra` (what is counted
/// without an event: the request, the hook's duration). Best effort: a failure is logged,
/// never fails the command.
pub fn flush(cfg: &Config, extra: impl FnOnce(&mut Counters)) {
    write(cfg, &take(), extra);
}

/// [`flush`] when something was noted (a poststop of a container that held nothing writes
/// nothing).
pub fn flush_if_any(cfg: &Config) {
    let events = take();
    if !events.is_empty() {
        write(cfg, &events, |_| {});
    }
}

/// [`flush`] of given events.
pub fn write(cfg: &Config, events: &[Event], extra: impl FnOnce(&mut Counters)) {
    if !events.is_empty() {
        if let Err(e) = append(cfg, events) {
            tracing::warn!(
                "cannot write the event log {}: {e}",
                cfg.events_file().display()
            );
        }
    }
    let res = counters::update(&StateDir::new(&cfg.state_dir), |c| {
        for e in events {
            count(c, e);
        }
        extra(c);
    });
    if let Err(e) = res {
        tracing::warn!("cannot update the counters: {}", crate::vocab::chain(&e));
    }
}

fn append(cfg: &Config, events: &[Event]) -> std::io::Result<()> {
    let ts = now();
    let mut text = String::new();
    for e in events {
        let line = Line {
            ts,
            event: e.clone(),
        };
        text.push_str(&serde_json::to_string(&line).expect("event serialises"));
        text.push('\n');
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(cfg.events_file())?;
    // One write per flush: lines of concurrent hooks do not interleave.
    f.write_all(text.as_bytes())
}

fn now() -> f64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_millis() as f64) / 1000.0
}

/// Adds one event to the counters.
pub fn count(c: &mut Counters, e: &Event) {
    match e {
        Event::Acquire { mode, .. } => *c.acquires.entry(mode.clone()).or_default() += 1,
        Event::Release { .. } => c.releases += 1,
        Event::Refusal { reason, .. } => *c.refusals.entry(reason.clone()).or_default() += 1,
        Event::DaemonStart { .. } => c.daemon_starts += 1,
        Event::DaemonStop { .. } => c.daemon_stops += 1,
        Event::DaemonRestart { gpu, domain, .. } => {
            c.daemon_restarts += 1;
            *c.domain_restarts
                .entry(format!("{gpu}/{domain}"))
                .or_default() += 1;
        }
        Event::DaemonReplace { gpu, domain, .. } => {
            c.daemon_replacements += 1;
            *c.domain_restarts
                .entry(format!("{gpu}/{domain}"))
                .or_default() += 1;
        }
        Event::Drift { .. } => c.drifts += 1,
        Event::Gc { kind, .. } => *c.gc_actions.entry(kind.clone()).or_default() += 1,
    }
}

/// The kind of a gc action, from its line (see [`crate::host::acquire::Host::gc`]).
pub fn gc_kind(action: &str) -> &'static str {
    const KINDS: &[(&str, &str)] = &[
        ("dropped client", "drop_client"),
        ("stopped the MPS daemon", "stop_daemon"),
        ("replaced the MPS daemon", "replace_daemon"),
        ("restarted the dead MPS daemon", "restart_daemon"),
        ("cannot restart", "restart_failed"),
        ("put back the compute mode", "restore_compute_mode"),
        ("record", "rebuild_record"),
        ("removed", "remove_leftover"),
    ];
    KINDS
        .iter()
        .find(|(needle, _)| action.contains(needle))
        .map_or("other", |(_, kind)| kind)
}

/// Notes one [`Event::Gc`] per action line.
pub fn note_gc(actions: &[String]) {
    for a in actions {
        note(Event::Gc {
            kind: gc_kind(a).to_owned(),
            action: a.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_lines_have_kinds() {
        for (line, kind) in [
            ("GPU-1: dropped client c1, whose process is gone", "drop_client"),
            (
                "GPU-1: stopped the MPS daemon of domain gpu (pid 4), which no container uses",
                "stop_daemon",
            ),
            (
                "GPU-1: replaced the MPS daemon of domain gpu, which did not answer, for 1 client(s)",
                "replace_daemon",
            ),
            (
                "GPU-1: restarted the dead MPS daemon of domain gpu for 2 client(s)",
                "restart_daemon",
            ),
            (
                "GPU-1: cannot restart the MPS daemon of domain gpu: boom",
                "restart_failed",
            ),
            (
                "GPU-1: put back the compute mode no MPS daemon explains",
                "restore_compute_mode",
            ),
            ("removed leftover /run/gpushare/mps/x", "remove_leftover"),
            ("GPU-1: record readable again, nothing to rebuild", "rebuild_record"),
            ("something new", "other"),
        ] {
            assert_eq!(gc_kind(line), kind, "{line}");
        }
    }

    /// A config whose files are under `dir`.
    fn cfg_in(dir: &std::path::Path) -> Config {
        Config {
            state_dir: dir.join("state"),
            log_file: dir.join("gpushare.log"),
            ..Config::default()
        }
    }

    /// The events in the event log of `cfg` (none when there is no log).
    fn logged(cfg: &Config) -> Vec<Line> {
        std::fs::read_to_string(cfg.events_file())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The tests that note and flush this process's pending events, one at a time (other
    /// library tests only note).
    static PENDING_TESTS: Mutex<()> = Mutex::new(());

    fn unique_gc(tag: &str) -> Event {
        Event::Gc {
            kind: format!("test-{tag}-{}", std::process::id()),
            action: tag.to_owned(),
        }
    }

    #[test]
    fn noted_events_are_written_and_counted_at_the_flush_once() {
        let _one = PENDING_TESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        StateDir::new(&cfg.state_dir).ensure().unwrap();
        let e = unique_gc("flush");
        // The clock read here, not through `now`: seconds since the epoch, to the millisecond.
        let clock = || {
            let d = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            d.as_millis() as f64 / 1000.0
        };
        let before = clock();
        note(e.clone());
        assert!(logged(&cfg).is_empty(), "noting writes nothing");
        flush(&cfg, |c| c.requests += 1);
        let after = clock();
        let lines = logged(&cfg);
        let mine: Vec<&Line> = lines.iter().filter(|l| l.event == e).collect();
        assert_eq!(mine.len(), 1, "{lines:?}");
        assert!(
            (before..=after).contains(&mine[0].ts) && before > 1.6e9,
            "{before} <= {} <= {after}",
            mine[0].ts
        );
        let Event::Gc { kind, .. } = &e else {
            unreachable!()
        };
        let c = counters::load(&StateDir::new(&cfg.state_dir));
        assert_eq!(c.gc_actions.get(kind), Some(&1));
        assert_eq!(c.requests, 1, "what the flush counted itself");
        // Flushed once: a second flush has nothing of it left.
        assert!(!take().contains(&e));
    }

    #[test]
    fn flush_if_any_writes_what_was_noted_and_nothing_when_nothing_was() {
        let _one = PENDING_TESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        StateDir::new(&cfg.state_dir).ensure().unwrap();
        let _ = take();
        flush_if_any(&cfg);
        assert!(
            !cfg.events_file().exists(),
            "nothing noted, nothing written"
        );
        let e = unique_gc("if-any");
        note(e.clone());
        flush_if_any(&cfg);
        assert!(logged(&cfg).iter().any(|l| l.event == e));
    }

    #[test]
    fn a_link_in_place_of_the_event_log_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg_in(dir.path());
        StateDir::new(&cfg.state_dir).ensure().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, cfg.events_file()).unwrap();
        assert!(append(&cfg, &[unique_gc("link")]).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"");
        // Positive control: a file in its place is appended to.
        std::fs::remove_file(cfg.events_file()).unwrap();
        append(&cfg, &[unique_gc("link")]).unwrap();
        assert_eq!(logged(&cfg).len(), 1);
    }

    #[test]
    fn each_event_counts_once_where_it_belongs() {
        let d = |kind| Event::daemon(kind, "GPU-1", "gpu", 7);
        assert_eq!(
            [d("start"), d("stop"), d("restart"), d("replace")],
            [
                Event::DaemonStart {
                    gpu: "GPU-1".into(),
                    domain: "gpu".into(),
                    pid: 7
                },
                Event::DaemonStop {
                    gpu: "GPU-1".into(),
                    domain: "gpu".into(),
                    pid: 7
                },
                Event::DaemonRestart {
                    gpu: "GPU-1".into(),
                    domain: "gpu".into(),
                    pid: 7
                },
                Event::DaemonReplace {
                    gpu: "GPU-1".into(),
                    domain: "gpu".into(),
                    pid: 7
                },
            ]
        );
        let mut c = Counters::default();
        for e in [
            d("start"),
            d("stop"),
            d("restart"),
            Event::Release {
                container: "c1".into(),
                gpu: "GPU-1".into(),
            },
            Event::Drift {
                gpu: "GPU-1".into(),
                domain: "gpu".into(),
                enforced: "50".into(),
                current: "100".into(),
            },
            Event::Gc {
                kind: "drop_client".into(),
                action: "x".into(),
            },
        ] {
            count(&mut c, &e);
        }
        assert_eq!(
            (
                c.daemon_starts,
                c.daemon_stops,
                c.daemon_restarts,
                c.releases,
                c.drifts
            ),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(c.domain_restarts["GPU-1/gpu"], 1);
        assert_eq!(c.gc_actions["drop_client"], 1);
        assert_eq!(c.daemon_replacements, 0);
    }

    #[test]
    fn an_acquire_names_the_pod_it_came_from() {
        let kube = KubeLabels {
            namespace: Some("ml".into()),
            pod: Some("p".into()),
            container: Some("worker".into()),
        };
        assert_eq!(
            K8sNames::from(&kube),
            K8sNames {
                namespace: Some("ml".into()),
                pod: Some("p".into()),
                container: Some("worker".into()),
            }
        );
    }

    #[test]
    fn events_are_lines_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: dir.path().join("state"),
            log_file: dir.path().join("gpushare.log"),
            ..Config::default()
        };
        let events = vec![
            Event::Acquire {
                container: "c1".into(),
                mode: "mps".into(),
                gpus: vec!["GPU-1".into()],
                domain: Some("gpu".into()),
                memory: Some(1 << 30),
                cap: Some(1 << 30),
                memory_backend: Some("driver".into()),
                cores: 50,
                kube: K8sNames {
                    namespace: Some("ml".into()),
                    pod: Some("p".into()),
                    container: Some("worker".into()),
                },
            },
            Event::DaemonReplace {
                gpu: "GPU-1".into(),
                domain: "gpu".into(),
                pid: 7,
            },
            Event::Refusal {
                container: "c2".into(),
                reason: "busy".into(),
                message: "GPU 0 serves mps".into(),
            },
        ];
        StateDir::new(&cfg.state_dir).ensure().unwrap();
        write(&cfg, &events, |c| c.create_runtime_seconds.observe(0.01));
        let text = std::fs::read_to_string(dir.path().join("gpushare-events.jsonl")).unwrap();
        let lines: Vec<Line> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines.iter().map(|l| l.event.clone()).collect::<Vec<_>>(),
            events
        );
        assert!(text.contains(r#""event":"acquire""#), "{text}");
        assert!(
            text.contains(r#""k8s_namespace":"ml","k8s_pod":"p","k8s_container":"worker""#),
            "{text}"
        );
        // The OCI id is the only `container` key (serde_json, jq and Python keep the last of
        // a repeated key).
        for l in text.lines() {
            assert!(l.matches(r#""container":"#).count() <= 1, "{l}");
        }
        assert!(
            text.contains(r#""cap":1073741824,"memory_backend":"driver""#),
            "{text}"
        );
        let c = counters::load(&StateDir::new(&cfg.state_dir));
        assert_eq!(c.acquires["mps"], 1);
        assert_eq!(c.daemon_replacements, 1);
        assert_eq!(c.domain_restarts["GPU-1/gpu"], 1);
        assert_eq!(c.refusals["busy"], 1);
        assert_eq!(c.create_runtime_seconds.count, 1);
    }
}
