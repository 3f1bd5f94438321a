//! `gpushare-hook serve`: a long-running agent that serves `/metrics` and `/healthz` and runs
//! the healing pass of `gc` every `[serve] gc_interval_seconds`.
//!
//! The pass is [`crate::host::acquire::Host::gc`], which takes each GPU's lock for that GPU's
//! step only; between passes serve holds no lock. Each action is logged, noted as an event and
//! counted. SIGTERM or SIGINT stops both loops; the process then exits 0.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use thiserror::Error;

use crate::admin::gc::GcReport;
use crate::admin::metrics::{self, Format};
use crate::config::Config;
use crate::host::events::{self, Event};
use crate::host::inventory::{self, Unavailable};

/// Why serve could not run.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {why}; set [serve] listen to a free address")]
    Listen { addr: String, why: String },
    #[error("cannot install the SIGTERM handler")]
    Signal(#[source] std::io::Error),
    #[error("cannot start the healing thread")]
    Thread(#[source] std::io::Error),
}

/// What one HTTP request gets: status, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// Routes one request: `GET /metrics` (OpenMetrics when the `Accept` header asks for it, else
/// the Prometheus text format), `GET /healthz` (200 while the state dir can be read, else
/// 503 with the reason), anything else 404 (or 405 for another method).
pub fn answer(cfg: &Config, method_is_get: bool, url: &str, accept: Option<&str>) -> Answer {
    let path = url.split('?').next().unwrap_or("");
    if !matches!(path, "/metrics" | "/healthz") {
        return Answer {
            status: 404,
            content_type: "text/plain; charset=utf-8",
            body: "not found: gpushare serves /metrics and /healthz\n".into(),
        };
    }
    if !method_is_get {
        return Answer {
            status: 405,
            content_type: "text/plain; charset=utf-8",
            body: "only GET\n".into(),
        };
    }
    if path == "/healthz" {
        return match crate::admin::status::unreadable(cfg) {
            None => Answer {
                status: 200,
                content_type: "text/plain; charset=utf-8",
                body: "ok\n".into(),
            },
            Some(why) => Answer {
                status: 503,
                content_type: "text/plain; charset=utf-8",
                body: format!("{why}\n"),
            },
        };
    }
    let format = if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        Format::OpenMetrics
    } else {
        Format::Text
    };
    let inv = inventory::open(cfg).ok();
    Answer {
        status: 200,
        content_type: format.content_type(),
        body: metrics::render(cfg, inv.as_deref(), format),
    }
}

/// One healing pass: gc (each GPU under its own lock, one at a time), then the drift check of
/// the MPS domains; every action and newly seen drift is logged, and written as an event and
/// counted. `drifting` carries the domains found drifting by the previous pass, so that a
/// drift is one event, not one per pass.
pub fn heal(cfg: &Config, drifting: &mut BTreeSet<(String, String)>) -> GcReport {
    let report = match inventory::open(cfg) {
        Ok(inv) => crate::admin::gc::gc(cfg, inv.as_ref()),
        Err(e) => crate::admin::gc::gc(cfg, &Unavailable::new(e)),
    };
    for a in &report.actions {
        tracing::info!("serve: gc: {a}");
    }
    for p in &report.problems {
        tracing::warn!("serve: gc: {p}");
    }
    events::note_gc(&report.actions);
    let st = crate::admin::status::status(cfg, None);
    let mut now = BTreeSet::new();
    for g in &st.gpus {
        for d in g.domains.iter().filter(|d| d.drift) {
            let key = (g.uuid.clone(), d.key.clone());
            if !drifting.contains(&key) {
                let current = d.current.map_or("?".into(), |c| c.to_string());
                tracing::warn!(
                    "serve: MPS daemon of GPU {} ({}, domain {}) has defaults {current}, gpushare set {}; the next acquire in the domain puts them back",
                    g.index, g.uuid, d.key, d.enforced
                );
                events::note(Event::Drift {
                    gpu: g.uuid.clone(),
                    domain: d.key.clone(),
                    enforced: d.enforced.to_string(),
                    current,
                });
            }
            now.insert(key);
        }
    }
    *drifting = now;
    events::flush_if_any(cfg);
    report
}

/// Runs the agent until SIGTERM or SIGINT. `ready` is called with the bound address (the
/// port is the kernel's choice when the policy says `:0`).
///
/// # Errors
/// [`ServeError`] when the address cannot be bound or the signal handler not installed.
pub fn serve(cfg: &Config, ready: impl FnOnce(SocketAddr)) -> Result<(), ServeError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(ServeError::Signal)?;
    }
    let server =
        tiny_http::Server::http(cfg.serve.listen.as_str()).map_err(|e| ServeError::Listen {
            addr: cfg.serve.listen.clone(),
            why: e.to_string(),
        })?;
    let addr = server
        .server_addr()
        .to_ip()
        .expect("an IP listener has an IP address");
    tracing::info!(
        "serve: listening on http://{addr} (/metrics, /healthz); healing every {}s",
        cfg.serve.gc_interval_seconds
    );
    ready(addr);
    // The healing thread waits on a channel: dropping the sender wakes and ends it at once.
    let (wake, sleep) = mpsc::channel::<()>();
    let interval = Duration::from_secs(cfg.serve.gc_interval_seconds);
    let healer = {
        let cfg = cfg.clone();
        std::thread::Builder::new()
            .name("heal".into())
            .spawn(move || {
                let mut drifting = BTreeSet::new();
                loop {
                    heal(&cfg, &mut drifting);
                    match sleep.recv_timeout(interval) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })
            .map_err(ServeError::Thread)?
    };
    while !stop.load(Ordering::Relaxed) {
        let req = match server.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("serve: {e}");
                continue;
            }
        };
        let accept = req
            .headers()
            .iter()
            .find(|h| h.field.equiv("Accept"))
            .map(|h| h.value.as_str().to_owned());
        let a = answer(
            cfg,
            *req.method() == tiny_http::Method::Get,
            req.url(),
            accept.as_deref(),
        );
        let header =
            tiny_http::Header::from_bytes("Content-Type", a.content_type).expect("a valid header");
        let resp = tiny_http::Response::from_string(a.body)
            .with_status_code(a.status)
            .with_header(header);
        if let Err(e) = req.respond(resp) {
            tracing::debug!("serve: answering a scrape: {e}");
        }
    }
    drop(wake);
    let _ = healer.join();
    tracing::info!("serve: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &std::path::Path) -> Config {
        Config {
            state_dir: dir.join("state"),
            log_file: dir.join("gpushare.log"),
            ..Config::default()
        }
    }

    #[test]
    fn routes() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let h = answer(&c, true, "/healthz", None);
        assert_eq!((h.status, h.body.as_str()), (200, "ok\n"));
        let m = answer(&c, true, "/metrics?x=1", None);
        assert_eq!(m.status, 200);
        assert!(m.content_type.starts_with("text/plain; version=0.0.4"));
        assert!(
            m.body.contains("# TYPE gpushare_requests_total counter"),
            "{}",
            m.body
        );
        let om = answer(
            &c,
            true,
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
        );
        assert!(om.content_type.starts_with("application/openmetrics-text"));
        assert!(om.body.ends_with("# EOF\n"));
        assert_eq!(answer(&c, true, "/", None).status, 404);
        assert_eq!(answer(&c, false, "/metrics", None).status, 405);
    }

    #[test]
    fn healthz_fails_when_the_state_dir_cannot_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        // A file where the state dir should be: it cannot be listed.
        std::fs::write(dir.path().join("state"), b"").unwrap();
        let h = answer(&c, true, "/healthz", None);
        assert_eq!(h.status, 503, "{}", h.body);
        assert!(h.body.contains("cannot read the state dir"), "{}", h.body);
    }
}
