//! `gpushare-hook serve`: /metrics and /healthz over HTTP, the healing pass of gc every
//! `[serve] gc_interval_seconds` (a killed MPS daemon is restarted, each action counted and
//! written to the event log), a clean exit on SIGTERM; and a real Prometheus scraping it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{spec, FakeContainer, Sandbox};
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
    let mut before = Vec::new();
    wait_for(30, "one daemon to run", || {
        before = common::daemons_under(&sb.state_dir());
        before.len() == 1
    });
    let _ = Command::new("kill")
        .args(["-9", &before[0].to_string()])
        .status();
    wait_for(30, "a new daemon and the restart counted", || {
        let m = serve.metrics();
        let now = common::daemons_under(&sb.state_dir());
        // At least one: on a loaded machine a pass may also find the daemon silent and
        // replace it.
        let some = |name: &str, want: &[&str]| value(&m, name, want).is_some_and(|v| v >= 1.0);
        some("gpushare_daemon_restarts_total", &[])
            && some("gpushare_gc_actions_total", &[r#"kind="restart_daemon""#])
            && some("gpushare_domain_restarts_total", &[r#"domain="gpu""#])
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

    // The container is gone (no poststop): the GPU's reaper (or, without one, the pass) drops
    // it and stops the daemon; either is counted as a healing action.
    drop(c);
    wait_for(30, "the gone client dropped and its daemon stopped", || {
        let m = serve.metrics();
        value(&m, "gpushare_gc_actions_total", &[r#"kind="drop_client""#]).is_some_and(|v| v >= 1.0)
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
    // --listen wins over the policy.
    let sb = Sandbox::new(1);
    let addr = addr.to_string();
    let out = sb.hook(&["serve", "--listen", &addr], "");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

/// `GET path` on `addr`: status and body.
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((head.split(' ').nth(1)?.parse().ok()?, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A private Prometheus on loopback with its own storage, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
}

impl Prometheus {
    fn start(dir: &std::path::Path, target: SocketAddr) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        std::fs::create_dir_all(dir.join("tsdb")).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpushare\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus { child, addr };
        wait_for(60, "prometheus to be ready", || {
            http_get(addr, "/-/ready").is_some_and(|(s, _)| s == 200)
        });
        p
    }

    /// The vector result of instant query `q`.
    fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let Some((200, body)) = http_get(
            self.addr,
            &format!("/api/v1/query?query={}", percent_encode(q)),
        ) else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_per_container_series_with_the_limiters_account() {
    if !common::require(
        "prometheus scrape",
        &["prometheus", "nvidia-cuda-mps-control", "cc"],
    ) {
        return;
    }
    if !std::path::Path::new("/usr/include/cuda.h").exists() {
        common::require("prometheus scrape (cuda.h)", &["/usr/include/cuda.h"]);
        return;
    }
    let limiter = common::simdriver().with_file_name("libgpushare_limiter.so");
    let sb = Sandbox::with_policy(
        2,
        &format!(
            "[limit]\nlibrary = {limiter:?}\n[serve]\nlisten = \"127.0.0.1:0\"\ngc_interval_seconds = 1\n"
        ),
    );
    let (probe, simlib) = common::build_probe(sb.path()).expect("cc and install-sim.sh");
    // A limit pod on GPU 0 and an MPS pod on GPU 1, named as the kubelet names them.
    let bl = sb.bundle(
        "l",
        &spec(
            json!({"gpu.share": "limit", "gpu.share.memory": "1Gi",
                   "io.kubernetes.pod.namespace": "ml",
                   "io.kubernetes.pod.name": "train-0",
                   "io.kubernetes.container.name": "worker"}),
            &["NVIDIA_VISIBLE_DEVICES=0"],
        ),
    );
    let bm = sb.bundle(
        "m",
        &spec(
            json!({"gpu.share": "mps", "gpu.share.memory": "2Gi", "gpu.share.cores": "25",
                   "io.kubernetes.pod.namespace": "web",
                   "io.kubernetes.pod.name": "infer-1",
                   "io.kubernetes.container.name": "server"}),
            &["NVIDIA_VISIBLE_DEVICES=1"],
        ),
    );
    let (l, m) = (FakeContainer::start(), FakeContainer::start());
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cl", l.pid(), &bl)));
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("cm", m.pid(), &bm)));

    // The container's workload: the limiter with the container's limits and its accounting
    // file (as the host sees them), allocating 256 MiB and holding it.
    let cdir = sb.state_dir().join("containers/cl");
    let limits = std::fs::read_to_string(cdir.join("limits")).unwrap();
    let mut cmd = Command::new(&probe);
    cmd.args(["direct", "hold", "0", "256"])
        .env_clear()
        .envs(sb.env())
        .env("LD_LIBRARY_PATH", &simlib)
        .env("LD_PRELOAD", &limiter)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in limits.lines().filter_map(|l| l.split_once('=')) {
        cmd.env(k, v);
    }
    cmd.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", cdir.join("shared/cache"));
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut holder = Killed(cmd.spawn().expect("cuprobe"));
    let mut line = String::new();
    BufReader::new(holder.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        "HELD=1",
        "the test program allocated its 256 MiB"
    );

    let serve = Serve::start(&sb);
    let prom = Prometheus::start(&sb.path().join("prom"), serve.addr);
    let used = r#"gpushare_container_device_memory_used_bytes{namespace="ml",pod="train-0",container="worker"}"#;
    let mut got = Vec::new();
    wait_for(
        60,
        "prometheus to hold the limiter's account of the pod",
        || {
            got = prom.query(used);
            got.len() == 1
        },
    );
    let s = &got[0];
    assert_eq!(s["metric"]["id"], "cl", "{s}");
    assert_eq!(s["metric"]["gpu"], Sandbox::uuid(0), "{s}");
    assert_eq!(s["metric"]["job"], "gpushare", "{s}");
    assert_eq!(s["value"][1], (256u64 << 20).to_string(), "{s}");

    let info = prom.query(r#"gpushare_container_info{pod="infer-1"}"#);
    assert_eq!(info.len(), 1, "{info:?}");
    let i = &info[0]["metric"];
    for (k, v) in [
        ("id", "cm"),
        ("namespace", "web"),
        ("container", "server"),
        ("mode", "mps"),
        ("domain", "gpu"),
        ("backend", "mps_daemon"),
    ] {
        assert_eq!(i[k], v, "{k} in {i}");
    }
    let cores = prom.query(r#"gpushare_container_cores_ratio{pod="infer-1"}"#);
    assert_eq!(cores[0]["value"][1], "0.25", "{cores:?}");
    let cap = prom.query(r#"gpushare_container_memory_cap_bytes{pod="train-0"}"#);
    assert_eq!(cap[0]["value"][1], (1u64 << 30).to_string(), "{cap:?}");
    let up = prom.query(r#"gpushare_domain_daemon_answering{domain="gpu"}"#);
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let acquires = prom.query("sum(gpushare_acquires_total)");
    assert_eq!(acquires[0]["value"][1], "2", "{acquires:?}");
}

#[test]
fn systemd_units_verify_and_ship_in_both_packages() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let units = [
        "gpushare-serve.service",
        "gpushare-gc.service",
        "gpushare-gc.timer",
    ];
    // Both package asset lists carry the units and the dashboard.
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let meta = &manifest["package"]["metadata"];
    let deb = meta["deb"]["assets"].to_string();
    let rpm = meta["generate-rpm"]["assets"].to_string();
    for f in units
        .iter()
        .map(|u| format!("packaging/systemd/{u}"))
        .chain(["packaging/grafana/gpushare.json".to_owned()])
    {
        assert!(root.join(&f).is_file(), "{f}");
        assert!(deb.contains(&f), "{f} not in the .deb assets");
        assert!(rpm.contains(&f), "{f} not in the .rpm assets");
    }
    if !common::require("systemd units", &["systemd-analyze"]) {
        return;
    }
    // systemd-analyze verify, with ExecStart pointing at the built binary.
    let dir = tempfile::tempdir().unwrap();
    let hook = common::hook_bin();
    for u in units {
        let text = std::fs::read_to_string(root.join("packaging/systemd").join(u))
            .unwrap()
            .replace("/usr/bin/gpushare-hook", &hook.display().to_string());
        std::fs::write(dir.path().join(u), text).unwrap();
    }
    let verify = |paths: &[std::path::PathBuf]| {
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(paths)
            .env("SYSTEMD_LOG_LEVEL", "warning")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let paths: Vec<_> = units.iter().map(|u| dir.path().join(u)).collect();
    let (good, said) = verify(&paths);
    let ours: Vec<&str> = said.lines().filter(|l| l.contains("gpushare-")).collect();
    assert!(good && ours.is_empty(), "systemd-analyze verify: {said}");
    // Positive control: a unit with a bad directive is refused.
    let bad = dir.path().join("gpushare-bad.service");
    std::fs::write(&bad, "[Service]\nType=simple\nExecStart=relative/path\n").unwrap();
    let (good, said) = verify(&[bad]);
    assert!(
        !good || said.contains("gpushare-bad"),
        "a bad unit verified: {said}"
    );
}

/// `VmRSS` (KiB) and `Threads` of process `pid`.
fn rss_and_threads(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("Threads:"))
}

/// `GET /healthz` with a deadline of `limit`: whether it was answered 200 in time.
fn healthz_within(addr: SocketAddr, limit: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, limit).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(limit)).unwrap();
    s.set_write_timeout(Some(limit)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let took = t.elapsed();
    if text.starts_with("HTTP/1.1 200") && text.ends_with("ok\n") && took < limit {
        Ok(took)
    } else {
        Err(format!("after {took:?}: {text:?}"))
    }
}

/// No client stalls or bloats serve: a client that pipelines `/metrics` and never reads, a
/// 32 MiB header line, and 300 connections that never finish their request. Meanwhile
/// `/healthz` answers within a second and the healing pass goes on (a tenant's change of its
/// daemon's defaults is put back).
#[test]
fn no_client_stalls_or_bloats_serve() {
    if !common::require("serve", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[serve]\nlisten = \"127.0.0.1:0\"\ngc_interval_seconds = 1\n",
    );
    let b = mps_bundle(&sb, "b", json!({}));
    let c = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("c1", c.pid(), &b)));
    let serve = Serve::start(&sb);
    let pid = serve.child.id();
    let second = Duration::from_secs(1);
    healthz_within(serve.addr, second).expect("positive control: healthz answers");
    let (rss0, _) = rss_and_threads(pid);

    // A slow reader: pipelined scrapes, never read. The writer stops when the socket is full.
    let mut slow = TcpStream::connect(serve.addr).unwrap();
    slow.set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut sent = 0;
    for _ in 0..20_000 {
        if slow
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .is_err()
        {
            break;
        }
        sent += 1;
    }
    assert!(sent > 0, "the slow reader sent its requests");
    // Healing goes on beside it: a tenant's change to the daemon's defaults is put back.
    let pipe = sb.domain_dir(0, "gpu").join("pipe");
    // NVIDIA's daemon serves one control session at a time and resets a second one, so each of
    // the tenant's commands is repeated until its effect is seen (the positive control: the
    // drift really happened before healing is waited for).
    let until = |what: &str, mut f: Box<dyn FnMut() -> bool + '_>| {
        let end = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < end, "timed out after 10s: {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut enforced = String::new();
    until(
        "reading the enforced default",
        Box::new(|| {
            enforced = common::mps_client(&pipe, "get_default_active_thread_percentage");
            !enforced.is_empty()
        }),
    );
    until(
        "the tenant's change of the defaults",
        Box::new(|| {
            common::mps_client(&pipe, "set_default_active_thread_percentage 1");
            common::mps_client(&pipe, "set_default_client_priority 1");
            let pct = common::mps_client(&pipe, "get_default_active_thread_percentage");
            pct == "1.0" || pct == "1"
        }),
    );
    for i in 0..10 {
        if let Err(e) = healthz_within(serve.addr, second) {
            panic!("healthz {i} beside a slow reader: {e}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Asked through NVIDIA's own client, twice a second: the daemon serves one control session
    // at a time, and a faster poll keeps serve's healing conversation waiting on a loaded node.
    let end = Instant::now() + Duration::from_secs(20);
    while !(common::mps_client(&pipe, "get_default_active_thread_percentage") == enforced
        && common::mps_client(&pipe, "get_default_client_priority").trim() == "0")
    {
        assert!(
            Instant::now() < end,
            "timed out after 20s waiting for the healing pass to put back the defaults; gpushare's log:\n{}",
            std::fs::read_to_string(sb.log_path()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // A 32 MiB header line: refused long before it is read whole.
    let mut big = TcpStream::connect(serve.addr).unwrap();
    big.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = big.write_all(b"GET /healthz HTTP/1.1\r\nX-Big: ");
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..32 {
        if big.write_all(&chunk).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = big.read_to_end(&mut answer);
    let (rss1, _) = rss_and_threads(pid);
    assert!(
        rss1 < rss0 + 16 * 1024,
        "serve grew from {rss0} KiB to {rss1} KiB on one header"
    );
    healthz_within(serve.addr, second).expect("healthz after the big header");

    // 300 connections that never finish their request head.
    let lorises: Vec<TcpStream> = (0..300)
        .filter_map(|_| {
            let mut s = TcpStream::connect(serve.addr).ok()?;
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
            Some(s)
        })
        .collect();
    assert!(lorises.len() >= 200, "the slow connections were made");
    std::thread::sleep(Duration::from_millis(500));
    let (rss2, threads) = rss_and_threads(pid);
    assert!(threads <= 16, "serve runs {threads} threads");
    assert!(
        rss2 < rss0 + 32 * 1024,
        "serve grew from {rss0} KiB to {rss2} KiB"
    );
    // At the cap the oldest connection makes room: healthz answers while they are held.
    for i in 0..5 {
        if let Err(e) = healthz_within(serve.addr, second) {
            panic!("healthz {i} beside 300 slow connections: {e}");
        }
    }
    drop(lorises);
    drop(slow);
    healthz_within(serve.addr, second).expect("healthz at the end");
    drop(c);
}
