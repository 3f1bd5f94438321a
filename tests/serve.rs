//! `gpushare-hook serve`: /metrics and /healthz over HTTP, the healing pass of gc every
//! `[serve] gc_interval_seconds` (a killed MPS daemon is restarted, each action counted and
//! written to the event log), a clean exit on SIGTERM; and a real Prometheus scraping it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{spec, Cleanup, FakeContainer, Sandbox};
use serde_json::json;

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `gpushare-hook serve`, killed on drop.
struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Serve {
    fn start(sb: &Sandbox) -> Self {
        let mut child = Command::new(common::hook_bin())
            .arg("serve")
            .env_clear()
            .envs(sb.env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("serve did not say where it listens: {line:?} {err}")
            });
        Serve { child, addr }
    }

    /// `GET path` with `accept`: status, headers, body.
    fn get(&self, path: &str, accept: Option<&str>) -> (u16, String, String) {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_owned(), body.to_owned())
    }

    fn metrics(&self) -> String {
        let (status, _, body) = self.get("/metrics", None);
        assert_eq!(status, 200, "{body}");
        body
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the first sample of `name` whose line contains every string of `want`.
fn value(text: &str, name: &str, want: &[&str]) -> Option<f64> {
    text.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
                && want.iter().all(|w| l.contains(w))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Waits up to `secs` for `cond`, else fails with `what`.
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {secs}s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mps_bundle(sb: &Sandbox, name: &str, extra: serde_json::Value) -> std::path::PathBuf {
    let mut ann = json!({"gpu.share": "mps", "gpu.share.memory": "2Gi"});
    ann.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    sb.bundle(name, &spec(ann, &["NVIDIA_VISIBLE_DEVICES=0"]))
}

#[test]
fn serve_answers_heals_a_killed_daemon_and_stops_on_sigterm() {
    if !common::require("serve", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[serve]\nlisten = \"127.0.0.1:0\"\ngc_interval_seconds = 1\n",
    );
    let _c = Cleanup(sb.path().to_path_buf());
    let b = mps_bundle(&sb, "b", json!({}));
    let c = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("c1", c.pid(), &b)));
    let mut serve = Serve::start(&sb);

    let (status, _, body) = serve.get("/healthz", None);
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, head, body) = serve.get("/metrics", Some("application/openmetrics-text"));
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert_eq!(serve.get("/nope", None).0, 404);
    let m = serve.metrics();
    assert_eq!(
        value(&m, "gpushare_container_info", &[r#"id="c1""#]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        value(&m, "gpushare_domain_daemon_up", &[]),
        Some(1.0),
        "{m}"
    );

    // The daemon dies; the healing pass restarts it for its client.
    let before = common::daemons_under(&sb.state_dir());
    assert_eq!(before.len(), 1, "one daemon runs");
    let _ = Command::new("kill")
        .args(["-9", &before[0].to_string()])
        .status();
    wait_for(30, "a new daemon and the restart counted", || {
        let m = serve.metrics();
        let now = common::daemons_under(&sb.state_dir());
        value(&m, "gpushare_daemon_restarts_total", &[]) == Some(1.0)
            && value(
                &m,
                "gpushare_gc_actions_total",
                &[r#"kind="restart_daemon""#],
            ) == Some(1.0)
            && value(&m, "gpushare_domain_restarts_total", &[r#"domain="gpu""#]) == Some(1.0)
            && value(&m, "gpushare_domain_daemon_answering", &[]) == Some(1.0)
            && now.len() == 1
            && now != before
    });
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    assert!(log.contains("serve: gc: "), "the action is logged:\n{log}");
    let events = std::fs::read_to_string(sb.path().join("gpushare-events.jsonl")).unwrap();
    for want in [
        r#""event":"daemon_restart""#,
        r#""event":"gc","kind":"restart_daemon""#,
    ] {
        assert!(events.contains(want), "{want} not in\n{events}");
    }

    // The container is gone (no poststop): the pass drops it and stops the daemon.
    drop(c);
    wait_for(30, "the gone client dropped and its daemon stopped", || {
        let m = serve.metrics();
        value(&m, "gpushare_gc_actions_total", &[r#"kind="drop_client""#]) == Some(1.0)
            && common::daemons_under(&sb.state_dir()).is_empty()
            && value(&m, "gpushare_container_info", &[r#"id="c1""#]).is_none()
    });

    // SIGTERM: a clean exit, the port closed.
    let _ = Command::new("kill")
        .args(["-TERM", &serve.child.id().to_string()])
        .status();
    let mut code = None;
    wait_for(10, "serve to exit after SIGTERM", || {
        code = serve.child.try_wait().unwrap();
        code.is_some()
    });
    assert_eq!(code.unwrap().code(), Some(0), "exit status after SIGTERM");
    assert!(TcpStream::connect(serve.addr).is_err(), "still listening");
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    assert!(log.contains("serve: stopped"), "{log}");
}

#[test]
fn serve_refuses_a_busy_address_in_one_line() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap();
    let sb = Sandbox::with_policy(1, &format!("[serve]\nlisten = \"{addr}\"\n"));
    let out = sb.hook(&["serve"], "");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
