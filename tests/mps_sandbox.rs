//! A root tenant owns what is in its MPS pipe directory (mounted read-write at `/tmp/nvidia-mps`):
//! links planted there must not lead a (re)started root daemon to create, write or re-mode a host
//! file, and must not redirect gpushare's own control commands to another daemon. Real
//! `nvidia-cuda-mps-control` and runc, TEST-ONLY simulated NVML.

mod common;

use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{daemons_under, runc, runc_bundle, spec, FakeContainer, Sandbox};
use gpushare::host::mps::Control;
use serde_json::json;

/// The names the daemon creates in its pipe directory.
const DAEMON_NAMES: [&str; 4] = ["control", "control_lock", "control_privileged", "log"];

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The directory of GPU `gpu`'s one domain (`isolation = "gpu"`).
fn gpu_dir(sb: &Sandbox, gpu: usize) -> PathBuf {
    sb.domain_dir(gpu, "gpu")
}

fn pipe(sb: &Sandbox, gpu: usize) -> PathBuf {
    gpu_dir(sb, gpu).join("pipe")
}

/// A host directory that no daemon may touch: outside the state dir and outside `/tmp` (which
/// the daemon's sandbox covers with a tmpfs of its own), so only read-only-ness and unfollowed
/// links protect it. Files, a subdirectory, modes other than the daemon's 0666/0777.
struct Marker(tempfile::TempDir);

impl Marker {
    fn new() -> Self {
        let t = tempfile::Builder::new()
            .prefix("gpushare-marker-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let p = t.path();
        std::fs::write(p.join("existing"), "original\n").unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/inner"), "inner\n").unwrap();
        std::fs::write(p.join("ctl"), "ctl\n").unwrap();
        for (f, m) in [
            ("existing", 0o600),
            ("sub", 0o700),
            ("sub/inner", 0o640),
            ("ctl", 0o600),
        ] {
            std::fs::set_permissions(p.join(f), std::os::unix::fs::PermissionsExt::from_mode(m))
                .unwrap();
        }
        Self(t)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Names, kinds, modes, owners and contents of everything inside, sorted.
    fn snapshot(&self) -> Vec<String> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                let body = if m.is_file() {
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned()
                } else if m.file_type().is_symlink() {
                    std::fs::read_link(&p).unwrap().display().to_string()
                } else {
                    String::new()
                };
                out.push(format!(
                    "{rel} mode={:o} uid={} size={} {body:?}",
                    m.mode(),
                    m.uid(),
                    m.len()
                ));
                if m.is_dir() {
                    walk(root, &p, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.path(), self.path(), &mut out);
        out.sort();
        out
    }

    /// Where each planted link of the daemon's names points: nonexistent targets (the daemon
    /// would create them), an existing file (it would write its log into it and re-mode it).
    fn target(&self, name: &str) -> PathBuf {
        match name {
            "control_lock" => self.path().join("lock"),
            "log" => self.path().join("existing"),
            "control_privileged" => self.path().join("priv"),
            _ => self.path().join("ctl"),
        }
    }
}

/// Replaces `dir/name` with a symlink to `target`, as a tenant does (atomically, by rename).
fn plant(dir: &Path, name: &str, target: &Path) -> std::io::Result<()> {
    let tmp = dir.join(format!(".plant-{name}"));
    let _ = std::fs::remove_file(&tmp);
    symlink(target, &tmp)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// The descriptors of `pid` that point under `dir`.
fn fds_into(pid: i32, dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| t.starts_with(dir))
        .map(|t| t.display().to_string())
        .collect()
}

fn kill_and_wait(root: &Path) -> i32 {
    let d = daemons_under(root);
    assert_eq!(d.len(), 1, "one daemon under {}", root.display());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d[0]),
        nix::sys::signal::Signal::SIGKILL,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemons_under(root).is_empty() {
        assert!(Instant::now() < deadline, "daemon {} did not die", d[0]);
        std::thread::sleep(Duration::from_millis(5));
    }
    d[0]
}

/// What a plain control client (outside any sandbox) gets from the daemon behind `pipe`.
fn query(pipe: &Path, cmd: &str) -> String {
    common::mps_client(pipe, cmd)
}

fn mps_spec(gpu: usize) -> serde_json::Value {
    spec(
        json!({"gpu.share": "mps"}),
        &[&format!("NVIDIA_VISIBLE_DEVICES={gpu}")],
    )
}

/// A runc container with gpushare-hook's createRuntime and poststop hooks, running `sleep`.
struct Ctr {
    id: String,
    bundle: PathBuf,
}

impl Ctr {
    fn start(sb: &Sandbox, name: &str, gpu: usize) -> Self {
        let hook = common::hook_bin().display().to_string();
        let env: Vec<String> = sb.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
        let bundle = runc_bundle(&sb.path().join(name), |v| {
            v["process"]["args"] = json!(["sleep", "600"]);
            v["process"]["env"] = json!(["PATH=/bin", format!("NVIDIA_VISIBLE_DEVICES={gpu}")]);
            v["annotations"] = json!({"gpu.share": "mps"});
            v["hooks"] = json!({
                "createRuntime": [{"path": hook, "args": ["gpushare-hook", "createRuntime"], "env": env}],
                "poststop": [{"path": hook, "args": ["gpushare-hook", "poststop"], "env": env}],
            });
        });
        let id = format!("gpushare-sbx-{}-{name}", std::process::id());
        let c = Self { id, bundle };
        for step in ["create", "start"] {
            let out = runc(&[step, &c.id], &c.bundle);
            assert!(
                out.status.success(),
                "runc {step}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        c
    }

    /// Runs busybox `args` inside; returns its stdout.
    fn exec(&self, args: &[&str]) -> String {
        let mut argv = vec!["exec", &self.id, "/bin/busybox"];
        argv.extend_from_slice(args);
        let out = runc(&argv, &self.bundle);
        assert!(
            out.status.success(),
            "runc exec {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Kills and deletes it (the poststop hook runs).
    fn stop(&self) {
        let _ = runc(&["kill", &self.id, "KILL"], &self.bundle);
        for _ in 0..200 {
            let out = runc(&["state", &self.id], &self.bundle);
            if String::from_utf8_lossy(&out.stdout).contains("\"stopped\"") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = runc(&["delete", &self.id], &self.bundle);
        assert!(
            out.status.success(),
            "runc delete: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Ctr {
    fn drop(&mut self) {
        let _ = runc(&["delete", "--force", &self.id], &self.bundle);
    }
}

#[test]
fn links_planted_by_a_container_do_not_lead_a_restarted_daemon_out() {
    if !common::require(
        "planted links, runc",
        &["runc", "busybox", "nvidia-cuda-mps-control"],
    ) {
        return;
    }
    let sb = Sandbox::new(1);
    let marker = Marker::new();
    let before = marker.snapshot();
    let a = Ctr::start(&sb, "a", 0);

    // Root in the container replaces the daemon's files with links to host paths.
    for name in DAEMON_NAMES {
        let target = marker.target(name).display().to_string();
        a.exec(&["ln", "-sfn", &target, &format!("/tmp/nvidia-mps/{name}")]);
    }
    assert!(std::fs::symlink_metadata(pipe(&sb, 0).join("control_lock"))
        .unwrap()
        .file_type()
        .is_symlink());
    // The daemon dies; the next container's acquire restarts it in the same directory.
    let old = kill_and_wait(&gpu_dir(&sb, 0));
    let b = Ctr::start(&sb, "b", 0);
    let now = daemons_under(&gpu_dir(&sb, 0));
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], old, "restarted");

    assert_eq!(marker.snapshot(), before, "host marker directory changed");
    assert_eq!(fds_into(now[0], marker.path()), Vec::<String>::new());
    // Restarted in place: the first container sees the new daemon's socket.
    assert_eq!(
        a.exec(&["stat", "-c", "%F", "/tmp/nvidia-mps/control"]),
        "socket"
    );
    assert_eq!(
        sb.status()["gpus"][0]["domains"][0]["daemon"]["answers"],
        true
    );
    a.stop();
    b.stop();
    assert!(daemons_under(&sb.state_dir()).is_empty());
    assert_eq!(marker.snapshot(), before);
}

#[test]
fn links_left_behind_when_a_reservation_kept_the_directory_are_not_followed() {
    if !common::require("planted links, reservation", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(1);
    let marker = Marker::new();
    let before = marker.snapshot();
    let ba = sb.bundle("a", &mps_spec(0));
    let a = FakeContainer::start();
    ok(&sb.hook(&["createRuntime"], &Sandbox::state_json("ca", a.pid(), &ba)));
    // B's spec is edited while A runs: the directories are reserved for B's mount.
    let out = sb.hook(
        &["precreate"],
        &serde_json::to_string(&mps_spec(0)).unwrap(),
    );
    ok(&out);
    let edited: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = edited["hooks"]["createRuntime"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.as_str().unwrap().strip_prefix("GPUSHARE_RESERVATION="))
        .expect("reservation key")
        .to_owned();
    // A plants its links, then leaves as the last client: the daemon stops, the directory stays.
    for name in DAEMON_NAMES {
        plant(&pipe(&sb, 0), name, &marker.target(name)).unwrap();
    }
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("ca", 0, &ba)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
    assert!(pipe(&sb, 0).is_dir(), "kept by the reservation");
    // Whatever the daemon's quit left, the links are planted again before B comes.
    for name in DAEMON_NAMES {
        plant(&pipe(&sb, 0), name, &marker.target(name)).unwrap();
    }

    let bb = sb.bundle("b", &edited);
    let b = FakeContainer::start();
    ok(&sb.hook_env(
        &["createRuntime"],
        &Sandbox::state_json("cb", b.pid(), &bb),
        &[("GPUSHARE_RESERVATION", &key)],
    ));
    let d = daemons_under(&sb.state_dir());
    assert_eq!(d.len(), 1);
    assert_eq!(marker.snapshot(), before, "host marker directory changed");
    assert_eq!(fds_into(d[0], marker.path()), Vec::<String>::new());
    assert_eq!(
        sb.status()["gpus"][0]["domains"][0]["daemon"]["answers"],
        true
    );
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("cb", 0, &bb)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

/// Stops and joins the racer thread, also when the test fails half-way.
struct Racer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Racer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_racer_swapping_control_for_a_link_changes_nothing_and_restarts_succeed() {
    if !common::require("control racer", &["nvidia-cuda-mps-control"]) {
        return;
    }
    const RESTARTS: usize = 50;
    let sb = Sandbox::new(1);
    let marker = Marker::new();
    let before = marker.snapshot();
    let b = sb.bundle("b", &mps_spec(0));
    let keep = FakeContainer::start();
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("keep", keep.pid(), &b),
    ));

    // Whenever `control` is the daemon's socket, swap a link to a host file in (the daemon
    // chmods `control` to 0666 by name after binding it).
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut racer = Racer {
        stop: stop.clone(),
        thread: None,
    };
    racer.thread = Some({
        let (stop, swaps, dir, target) = (
            stop.clone(),
            swaps.clone(),
            pipe(&sb, 0),
            marker.target("control"),
        );
        std::thread::spawn(move || {
            use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
            // Told by inotify the moment a name is created, with a spare link standing ready,
            // so that a swap is one rename.
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
            ino.add_watch(&dir, AddWatchFlags::IN_CREATE).unwrap();
            let spare = dir.join(".spare-control");
            while !stop.load(Ordering::Relaxed) {
                if std::fs::symlink_metadata(&spare).is_err() && symlink(&target, &spare).is_err() {
                    std::thread::yield_now();
                    continue;
                }
                let Ok(events) = ino.read_events() else {
                    continue;
                };
                if events
                    .iter()
                    .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new("control")))
                {
                    let is_socket = std::fs::symlink_metadata(dir.join("control"))
                        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
                    if is_socket && std::fs::rename(&spare, dir.join("control")).is_ok() {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    });
    let mut failures = Vec::new();
    for i in 0..RESTARTS {
        kill_and_wait(&gpu_dir(&sb, 0));
        let c = FakeContainer::start();
        let id = format!("c{i}");
        let out = sb.hook(&["createRuntime"], &Sandbox::state_json(&id, c.pid(), &b));
        if !out.status.success() {
            eprintln!("restart {i}: {}", String::from_utf8_lossy(&out.stderr));
            failures.push(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if daemons_under(&gpu_dir(&sb, 0)).is_empty() {
            let log = std::fs::read_to_string(gpu_dir(&sb, 0).join("log/control.log"))
                .unwrap_or_default();
            let tail: String = log.lines().rev().take(8).collect::<Vec<_>>().join("\n");
            let hook_log = std::fs::read_to_string(sb.log_path()).unwrap_or_default();
            let hook_tail: String = hook_log
                .lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .join("\n");
            panic!("restart {i}: no daemon after a successful acquire; its log: {tail}\nhook log: {hook_tail}\nstatus {}", sb.status());
        }
        ok(&sb.hook(&["poststop"], &Sandbox::state_json(&id, 0, &b)));
        if let Some(&d) = daemons_under(&gpu_dir(&sb, 0)).first() {
            assert_eq!(fds_into(d, marker.path()), Vec::<String>::new());
        }
    }
    drop(racer);
    eprintln!(
        "racer swapped control {} times over {RESTARTS} restarts",
        swaps.load(Ordering::Relaxed)
    );
    assert!(
        swaps.load(Ordering::Relaxed) >= RESTARTS / 2,
        "the racer ran"
    );
    assert_eq!(marker.snapshot(), before, "host marker directory changed");
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "starts failed under the racer"
    );
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("keep", 0, &b)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

#[test]
fn linked_control_sockets_do_not_carry_gpushare_commands_to_another_daemon() {
    if !common::require("foreign daemon", &["nvidia-cuda-mps-control"]) {
        return;
    }
    let sb = Sandbox::new(2);
    let (b0, b1) = (sb.bundle("g0", &mps_spec(0)), sb.bundle("g1", &mps_spec(1)));
    let (a, v) = (FakeContainer::start(), FakeContainer::start());
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("tenant", a.pid(), &b0),
    ));
    ok(&sb.hook(
        &["createRuntime"],
        &Sandbox::state_json("victim", v.pid(), &b1),
    ));
    let victim = daemons_under(&gpu_dir(&sb, 1));
    assert_eq!(victim.len(), 1);
    let victim_default = query(&pipe(&sb, 1), "get_default_active_thread_percentage");
    let victim_mem = query(&pipe(&sb, 1), "get_default_device_pinned_mem_limit 0");
    assert_eq!(victim_default, "100.0");

    // Positive control: gpushare's own call reaches GPU 0's daemon through its own socket.
    let control = Control::new("nvidia-cuda-mps-control").unwrap();
    let limits = gpushare::vocab::Limits {
        cores: 10,
        memory_mib: Some(512),
    };
    control
        .set_defaults(&pipe(&sb, 0), &limits)
        .expect("set_defaults on GPU 0's own socket");
    assert_eq!(
        query(&pipe(&sb, 0), "get_default_active_thread_percentage"),
        "10.0"
    );

    // The tenant on GPU 0 points its control sockets at GPU 1's (absolute host paths).
    for name in ["control", "control_privileged"] {
        plant(&pipe(&sb, 0), name, &pipe(&sb, 1).join(name)).unwrap();
    }
    // gpushare's own commands to GPU 0's daemon go nowhere else.
    // The same call now meets the planted links: gpushare proves who listens before it sends
    // anything, so it refuses the domain as tampered with, rather than talking to GPU 1's
    // daemon.
    let res = control.set_defaults(&pipe(&sb, 0), &limits);
    let err = format!("{res:?}");
    assert!(
        res.as_ref().is_err_and(|e| e.is_tampered()),
        "gpushare refused the planted socket as tampered: {err}"
    );
    assert_eq!(
        query(&pipe(&sb, 1), "get_default_active_thread_percentage"),
        victim_default,
        "set_default_* reached the other daemon"
    );
    assert_eq!(
        query(&pipe(&sb, 1), "get_default_device_pinned_mem_limit 0"),
        victim_mem,
        "set_default_device_pinned_mem_limit reached the other daemon"
    );
    // The last tenant container leaves: gpushare stops GPU 0's daemon with `quit`.
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("tenant", 0, &b0)));
    assert!(
        daemons_under(&gpu_dir(&sb, 0)).is_empty(),
        "own daemon stopped"
    );
    assert_eq!(
        daemons_under(&gpu_dir(&sb, 1)),
        victim,
        "quit reached the other daemon"
    );
    let st = sb.status();
    let gpu1 = st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["uuid"] == Sandbox::uuid(1))
        .expect("GPU 1 still served");
    assert_eq!(gpu1["domains"][0]["daemon"]["answers"], true, "{st}");
    ok(&sb.hook(&["poststop"], &Sandbox::state_json("victim", 0, &b1)));
    assert!(daemons_under(&sb.state_dir()).is_empty());
}
