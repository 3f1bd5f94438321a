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
    let sd = crate::host::state::StateDir::new(&cfg.state_dir);
    let control = crate::host::mps::Control::new(&cfg.mps.control).ok();
    let mut now = BTreeSet::new();
    for g in &st.gpus {
        for d in &g.domains {
            let dirs = sd.mps_dirs(&g.uuid, &d.key);
            if crate::host::mps::spawn::trim_log(&dirs.log) {
                tracing::info!(
                    "serve: trimmed the MPS daemon log {}/control.log (domain {} of GPU {})",
                    dirs.log.display(),
                    d.key,
                    g.uuid
                );
            }
        }
        for d in g.domains.iter().filter(|d| d.drift) {
            let key = (g.uuid.clone(), d.key.clone());
            if !drifting.contains(&key) {
                let current = d.current.map_or("?".into(), |c| c.to_string());
                tracing::warn!(
                    "serve: MPS daemon of GPU {} ({}, domain {}) has defaults {current}, client priority {}, gpushare set {}; putting them back",
                    g.index, g.uuid, d.key,
                    d.current_priority.map_or("?".into(), |p| p.to_string()),
                    d.enforced
                );
                events::note(Event::Drift {
                    gpu: g.uuid.clone(),
                    domain: d.key.clone(),
                    enforced: d.enforced.to_string(),
                    current,
                });
            }
            // Put back at once, to the daemon gpushare recorded (proven on its socket); a
            // domain that stays drifting is noted once, and tried again every pass.
            let pipe = sd.mps_dirs(&g.uuid, &d.key).pipe;
            match control.as_ref().map(|c| c.set_defaults(&pipe, &d.enforced)) {
                Some(Ok(())) => continue,
                Some(Err(e)) => tracing::warn!(
                    "serve: cannot put back the defaults of domain {} of GPU {}: {}",
                    d.key,
                    g.uuid,
                    crate::vocab::chain(&e)
                ),
                None => {}
            }
            now.insert(key);
        }
    }
    *drifting = now;
    events::flush_if_any(cfg);
    report
}

/// The bounds on what one client can make serve do. A client can hold one of
/// [`MAX_CONNECTIONS`] connections for at most [`CONNECTION_TIMEOUT`]; whatever it sends or
/// fails to read, it never delays another client's answer, nor the healing.
pub mod limits {
    use std::time::Duration;

    /// Connections served at once; one more closes the oldest.
    pub const MAX_CONNECTIONS: usize = 64;
    /// Largest request head (request line and headers) read; a larger one gets 431.
    pub const MAX_HEAD_BYTES: usize = 8 * 1024;
    /// Most header fields in a request.
    pub const MAX_HEADERS: usize = 32;
    /// A request's head must be in within this time of the connection.
    pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
    /// A connection is closed this long after it was accepted, answered or not (one request
    /// per connection: no keep-alive, no pipelining).
    pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
}

/// Runs the agent until SIGTERM or SIGINT. `ready` is called with the bound address (the
/// port is the kernel's choice when the policy says `:0`).
///
/// HTTP is hyper's HTTP/1 server on one thread, each connection a task of its own bounded by
/// [`limits`]; an answer is made on a blocking thread, so that one slow `/metrics` (a daemon
/// that does not answer) never holds up `/healthz`.
///
/// # Errors
/// [`ServeError`] when the address cannot be bound or the signal handler not installed.
pub fn serve(cfg: &Config, ready: impl FnOnce(SocketAddr)) -> Result<(), ServeError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(ServeError::Signal)?;
    }
    let listen_err = |why: String| ServeError::Listen {
        addr: cfg.serve.listen.clone(),
        why,
    };
    let listener = std::net::TcpListener::bind(cfg.serve.listen.as_str())
        .map_err(|e| listen_err(e.to_string()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| listen_err(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| listen_err(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(limits::MAX_CONNECTIONS)
        .build()
        .map_err(ServeError::Thread)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(|e| listen_err(e.to_string()))?
    };
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
    runtime.block_on(accept_loop(listener, Arc::new(cfg.clone()), &stop));
    // Connections still open are dropped with the runtime; blocking answers are not waited for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    drop(wake);
    let _ = healer.join();
    tracing::info!("serve: stopped");
    Ok(())
}

/// The connections open, oldest first, each with the handle that closes it.
type Open = Arc<std::sync::Mutex<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>>;

/// Accepts connections until `stop` is set, each served by a task of its own. At
/// [`limits::MAX_CONNECTIONS`], the oldest connection is closed to make room: clients that
/// hold connections open (slowly or not at all sending a request, never reading an answer)
/// delay a new one by nothing, and cost at most that many tasks.
async fn accept_loop(listener: tokio::net::TcpListener, cfg: Arc<Config>, stop: &AtomicBool) {
    let open: Open = Arc::default();
    // Answers made at once (each on a blocking thread); more wait for a turn.
    let renders = Arc::new(tokio::sync::Semaphore::new(limits::MAX_CONNECTIONS));
    let mut next: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let stream = match tokio::time::timeout(Duration::from_millis(200), listener.accept()).await
        {
            Err(_) => continue,
            Ok(Ok((stream, _))) => stream,
            Ok(Err(e)) => {
                // Out of descriptors, or a connection reset before it was taken: not fatal.
                tracing::debug!("serve: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        {
            // Never held across an await.
            let mut o = open
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while o.len() >= limits::MAX_CONNECTIONS {
                if let Some((_, oldest)) = o.pop_front() {
                    tracing::debug!(
                        "serve: {} connections open; closing the oldest",
                        limits::MAX_CONNECTIONS
                    );
                    oldest.abort();
                }
            }
        }
        next += 1;
        let id = next;
        let (cfg, renders, mine) = (Arc::clone(&cfg), Arc::clone(&renders), Arc::clone(&open));
        // On this one-thread runtime the task first runs at the loop's next await, after it
        // is listed below.
        let task = tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                respond(Arc::clone(&cfg), Arc::clone(&renders), req)
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits::HEAD_TIMEOUT)
                .max_buf_size(limits::MAX_HEAD_BYTES)
                .max_headers(limits::MAX_HEADERS)
                .keep_alive(false);
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            match tokio::time::timeout(limits::CONNECTION_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("serve: a connection: {e}"),
                Err(_) => tracing::debug!("serve: a connection was closed at its deadline"),
            }
            mine.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|(i, _)| *i != id);
        });
        open.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back((id, task.abort_handle()));
    }
}

/// Answers one request through [`answer`], made on a blocking thread.
async fn respond(
    cfg: Arc<Config>,
    renders: Arc<tokio::sync::Semaphore>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, std::convert::Infallible> {
    let get = req.method() == hyper::Method::GET;
    let url = req.uri().path().to_owned();
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A connection closed while it waits for its turn leaves nothing behind.
    let turn = renders.acquire_owned().await;
    let a = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        answer(&cfg, get, &url, accept.as_deref())
    })
    .await
    .unwrap_or_else(|e| Answer {
        status: 500,
        content_type: "text/plain; charset=utf-8",
        body: format!("{e}\n"),
    });
    let mut resp =
        hyper::Response::new(http_body_util::Full::new(hyper::body::Bytes::from(a.body)));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(a.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(a.content_type),
    );
    Ok(resp)
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
