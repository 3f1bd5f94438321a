//! A root tenant in a runc container against the MPS domain it shares: it cannot fool gpushare
//! about who answers on its control socket, wedge the daemon it hands out, fill the host's
//! filesystems, run code from `/dev/shm`, delay another group with a look-alike process, keep
//! a refused request's reservation, or get limits other than its domain's; the daemon it
//! talks to runs without capabilities. One test per finding of issue 16. Real runc, NVIDIA's
//! real `nvidia-cuda-mps-control` (also run by the tenant, inside its container), TEST-ONLY
//! simulated NVML.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{daemons_under, runc, runc_bundle, Sandbox};
use serde_json::{json, Value};

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn required() -> bool {
    common::require(
        "MPS tenant attacks",
        &["runc", "busybox", "nvidia-cuda-mps-control"],
    )
}

/// A runc container with gpushare-hook as its createRuntime/poststop hooks; removed on drop.
struct Tenant {
    id: String,
    bundle: PathBuf,
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = runc(&["delete", "--force", &self.id], &self.bundle);
    }
}

/// Busybox applets the tenant's scripts use, beyond those `common` links.
const APPLETS: [&str; 12] = [
    "head", "timeout", "mv", "mkdir", "cp", "wc", "rm", "true", "cut", "chmod", "pidof", "seq",
];

/// Creates and starts tenant `name` asking for `annotations`, with `env` in its process and
/// `hook_env` added to its hooks' env. `Err` carries runc's output when create fails (a
/// refusal).
fn tenant(
    sb: &Sandbox,
    name: &str,
    annotations: Value,
    env: &[String],
    hook_env: &[String],
) -> Result<Tenant, String> {
    let hook = common::hook_bin().display().to_string();
    let mut henv: Vec<String> = sb.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
    henv.extend(hook_env.iter().cloned());
    let mut penv = vec![
        "PATH=/bin".to_owned(),
        "NVIDIA_VISIBLE_DEVICES=0".to_owned(),
    ];
    penv.extend(env.iter().cloned());
    let bundle = runc_bundle(&sb.path().join(name), |v| {
        v["process"]["args"] = json!(["sleep", "600"]);
        v["process"]["env"] = json!(penv);
        v["annotations"] = annotations;
        v["hooks"] = json!({
            "createRuntime": [{"path": hook, "args": ["gpushare-hook", "createRuntime"], "env": henv}],
            "poststop": [{"path": hook, "args": ["gpushare-hook", "poststop"], "env": henv}],
        });
        // NVIDIA's control program, so that the tenant can run it (as a daemon too).
        let mounts = v["mounts"].as_array_mut().unwrap();
        for (src, dst) in [
            (
                "/usr/bin/nvidia-cuda-mps-control",
                "/bin/nvidia-cuda-mps-control",
            ),
            ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"),
            ("/usr/lib64", "/lib64"),
        ] {
            mounts.push(json!({"destination": dst, "type": "bind", "source": src, "options": ["rbind", "ro"]}));
        }
    });
    for a in APPLETS {
        let _ = std::os::unix::fs::symlink("busybox", bundle.join("rootfs/bin").join(a));
    }
    let unique = sb
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let id = format!("{unique}-{name}");
    let t = Tenant { id, bundle };
    let out = runc(&["create", &t.id], &t.bundle);
    if !out.status.success() {
        return Err(text(&out));
    }
    ok(&runc(&["start", &t.id], &t.bundle));
    Ok(t)
}

impl Tenant {
    /// Runs `script` under the container's `sh`, as root in the container.
    fn sh(&self, script: &str) -> Output {
        runc(&["exec", &self.id, "sh", "-c", script], &self.bundle)
    }

    fn stop(&self) {
        let _ = runc(&["kill", &self.id, "KILL"], &self.bundle);
        wait_for("the container to stop", Duration::from_secs(10), || {
            String::from_utf8_lossy(&runc(&["state", &self.id], &self.bundle).stdout)
                .contains("\"stopped\"")
        });
        ok(&runc(&["delete", &self.id], &self.bundle));
    }
}

/// Waits for `cond` with a deadline; fails naming `what`.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn mps(extra: &[(&str, &str)]) -> Value {
    let mut a = json!({"gpu.share": "mps"});
    for (k, v) in extra {
        a[*k] = json!(v);
    }
    a
}

/// The one domain (`key`) of GPU 0 in `status --json`.
fn domain(sb: &Sandbox, key: &str) -> Value {
    let st = sb.status();
    st["gpus"][0]["domains"]
        .as_array()
        .and_then(|ds| ds.iter().find(|d| d["key"] == key).cloned())
        .unwrap_or_else(|| panic!("no domain {key} in {st}"))
}

/// The recorded daemon pid of domain `key` of GPU 0.
fn daemon_pid(sb: &Sandbox, key: &str) -> i32 {
    domain(sb, key)["daemon"]["pid"].as_i64().expect("a daemon") as i32
}

/// NVIDIA's client, run on the host against `pipe` (the test's own look at a daemon).
fn ask(pipe: &Path, cmd: &str) -> String {
    common::mps_client(pipe, cmd)
}

/// The pid listening on the unix socket `sock`, as the kernel says (`SO_PEERCRED`).
fn listener(sock: &Path) -> Option<i32> {
    use nix::sys::socket::{
        connect, getsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, UnixAddr,
    };
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .ok()?;
    connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &UnixAddr::new(sock).ok()?,
    )
    .ok()?;
    getsockopt(&fd, sockopt::PeerCredentials)
        .ok()
        .map(|c| c.pid())
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
}

fn hook_log(sb: &Sandbox) -> String {
    std::fs::read_to_string(sb.log_path()).unwrap_or_default()
}

/// Finding 1: the tenant raises its real daemon's defaults, then renames the socket of a
/// daemon of its own (holding the enforced values) over `control_privileged`. gpushare must
/// not believe that daemon: status shows the domain tampered with, and the next acquire
/// restarts the recorded daemon in an emptied pipe directory, with the enforced defaults,
/// without signalling the tenant's process.
#[test]
fn a_planted_control_socket_is_not_believed_and_the_next_acquire_restarts_the_daemon() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(1, "[policy]\ndefault_cores = 40\n");
    let a = tenant(&sb, "a", mps(&[]), &[], &[]).unwrap();
    let pipe = sb.domain_dir(0, "gpu").join("pipe");
    let real = daemon_pid(&sb, "gpu");
    assert_eq!(ask(&pipe, "get_default_active_thread_percentage"), "40.0");
    let out = a.sh(
        "echo set_default_active_thread_percentage 100 | nvidia-cuda-mps-control && \
         mkdir -p /tmp/nvidia-mps/evil && \
         CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps/evil CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps/evil \
           nvidia-cuda-mps-control -d && \
         echo set_default_active_thread_percentage 40 | \
           CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps/evil nvidia-cuda-mps-control && \
         mv /tmp/nvidia-mps/evil/control_privileged /tmp/nvidia-mps/control_privileged",
    );
    ok(&out);
    // Positive control: the socket gpushare would use is now the tenant's daemon, holding 40,
    // while the real daemon holds 100.
    let rogue = listener(&pipe.join("control_privileged")).expect("the planted socket listens");
    assert_ne!(rogue, real, "the planted socket is another process's");
    assert_eq!(ask(&pipe, "get_default_active_thread_percentage"), "40.0");

    let d = domain(&sb, "gpu");
    assert!(
        d["tampered"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("listener pid {rogue}"))),
        "status shows the domain tampered with: {d}"
    );
    let human = text(&sb.hook(&["status"], ""));
    assert!(human.contains("TAMPERED"), "{human}");

    let b = tenant(&sb, "b", mps(&[]), &[], &[]).unwrap();
    let log = hook_log(&sb);
    assert!(
        log.lines()
            .any(|l| l.contains("tampered") && l.contains("domain gpu") && l.contains(&a.id)),
        "logged with its domain and containers: {log}"
    );
    let new = daemon_pid(&sb, "gpu");
    assert_ne!(new, real, "the daemon was restarted");
    assert!(!alive(real), "the recorded daemon was stopped");
    assert_eq!(listener(&pipe.join("control_privileged")), Some(new));
    assert_eq!(ask(&pipe, "get_default_active_thread_percentage"), "40.0");
    assert!(
        alive(rogue),
        "the tenant's process is never signalled; its log: {}",
        text(&a.sh("cat /tmp/evil-log/control.log"))
    );
    assert!(
        !pipe.join("evil").exists(),
        "the pipe directory was emptied"
    );
    assert!(domain(&sb, "gpu")["tampered"].is_null());
    b.stop();
    a.stop();
    assert!(daemons_under(&sb.state_dir()).is_empty());
}

/// Finding 2: the tenant fills the daemon's `log` FIFO; its next log line blocks it for good.
/// The next acquire must not hand that daemon out: it is replaced.
#[test]
fn a_daemon_wedged_through_its_log_fifo_is_replaced_by_the_next_acquire() {
    if !required() {
        return;
    }
    let sb = Sandbox::new(1);
    let a = tenant(&sb, "a", mps(&[]), &[], &[]).unwrap();
    let wedged = daemon_pid(&sb, "gpu");
    // The writer holds none of the exec's output: when the daemon has already logged into the
    // FIFO, 64 KiB do not fit and the writer blocks for good, which must not hold `runc exec`
    // (it waits for the end of the output it was given).
    ok(&a.sh(
        "(head -c 65536 /dev/zero > /tmp/nvidia-mps/log 2>/dev/null &) ; \
         (for i in $(seq 1 250); do echo get_server_list | nvidia-cuda-mps-control; done \
           >/dev/null 2>&1 &)",
    ));
    // Positive control: the daemon is stuck writing into its log FIFO.
    wait_for(
        "the daemon to block in a pipe write",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(format!("/proc/{wedged}/wchan"))
                .is_ok_and(|w| w.contains("pipe_write"))
        },
    );
    assert_eq!(domain(&sb, "gpu")["daemon"]["answers"], false);
    let t = Instant::now();
    let b = tenant(&sb, "b", mps(&[]), &[], &[]).unwrap();
    let took = t.elapsed();
    let new = daemon_pid(&sb, "gpu");
    assert_ne!(new, wedged, "the wedged daemon was replaced");
    assert!(!alive(wedged));
    // The tenant's loop of control sessions may still be running against the new daemon.
    wait_for(
        "the new daemon to answer status",
        Duration::from_secs(10),
        || domain(&sb, "gpu")["daemon"]["answers"] == true,
    );
    // 500 ms without an answer, an unanswered quit, SIGTERM, and a start.
    assert!(took < Duration::from_secs(4), "the acquire took {took:?}");
    assert!(
        hook_log(&sb).contains("does not answer"),
        "{}",
        hook_log(&sb)
    );
    b.stop();
    a.stop();
}

/// Finding 3: writing into the pipe directory stops at its own small tmpfs; nothing lands on
/// the state directory's filesystem and another group's acquire is not hurt.
#[test]
fn filling_the_pipe_directory_hurts_only_its_domain() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"group\"\nshm_size = \"8Mi\"\n");
    let a = tenant(&sb, "a", mps(&[("gpu.share.group", "a")]), &[], &[]).unwrap();
    let out =
        a.sh("head -c 8388608 /dev/zero > /tmp/nvidia-mps/fill; wc -c < /tmp/nvidia-mps/fill");
    let written: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(!out.status.success() || written < 8 << 20, "{}", text(&out));
    assert!(
        written <= 1 << 20,
        "the pipe directory holds at most 1 MiB: {written}"
    );
    assert!(written > 0, "the write really happened");
    let files = a.sh("for i in $(seq 1 400); do : > /tmp/nvidia-mps/f$i || exit 1; done");
    assert!(
        !files.status.success(),
        "the inode cap stops a tenant making names"
    );
    use std::os::unix::fs::MetadataExt;
    let pipe = sb.domain_dir(0, "g-a").join("pipe");
    assert_ne!(
        std::fs::metadata(&pipe).unwrap().dev(),
        std::fs::metadata(sb.state_dir()).unwrap().dev(),
        "the pipe directory is a filesystem of its own: nothing lands on the state directory's"
    );
    assert_eq!(std::fs::metadata(pipe.join("fill")).unwrap().len(), written);
    let mounts = text(&a.sh("cat /proc/self/mountinfo"));
    // The last mount on a path is the one seen there.
    let line = mounts
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/tmp/nvidia-mps"))
        .unwrap_or_else(|| panic!("{mounts}"));
    for opt in ["nosuid", "nodev", "noexec"] {
        assert!(line.contains(opt), "{opt}: {line}");
    }
    let shm = mounts
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/dev/shm"))
        .unwrap_or_else(|| panic!("{mounts}"));
    assert!(
        shm.contains("size=8192k"),
        "[mps] shm_size sets the cap: {shm}"
    );
    let b = tenant(&sb, "b", mps(&[("gpu.share.group", "b")]), &[], &[]).unwrap();
    assert_eq!(domain(&sb, "g-b")["daemon"]["answers"], true);
    ok(&a.sh("rm -f /tmp/nvidia-mps/fill /tmp/nvidia-mps/f*"));
    b.stop();
    a.stop();
}

/// Finding 4: the domain's `/dev/shm` has a size cap (the default of `[mps] shm_size`, 64 MiB,
/// as engines give a container's own `/dev/shm`) and runs nothing.
#[test]
fn shm_is_capped_and_runs_nothing() {
    if !required() {
        return;
    }
    let sb = Sandbox::new(1);
    let a = tenant(&sb, "a", mps(&[]), &[], &[]).unwrap();
    let out = a.sh("head -c 75497472 /dev/zero > /dev/shm/big; wc -c < /dev/shm/big");
    let written: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(written > 0, "the write really happened");
    // Positive control: the container's /dev/shm is its domain's tmpfs.
    let host_side = sb.domain_dir(0, "gpu").join("shm/big");
    assert_eq!(
        std::fs::metadata(&host_side).map(|m| m.len()).ok(),
        Some(written)
    );
    assert!(written <= 64 << 20, "capped at 64 MiB: {written}");
    ok(&a.sh("rm -f /dev/shm/big"));
    let run = a.sh("cp /bin/busybox /dev/shm/bb && chmod 755 /dev/shm/bb && /dev/shm/bb true");
    assert!(!run.status.success(), "a binary in /dev/shm ran");
    assert!(
        text(&run).contains("denied"),
        "refused by noexec: {}",
        text(&run)
    );
    ok(&a.sh("rm -f /dev/shm/big /dev/shm/bb"));
    a.stop();
}

/// Finding 5: a process that looks like the victim group's daemon (program name, `-f`, its
/// pipe directory in the environment) delays the victim's first acquire by nothing, and is
/// sent no signal. It is started by the test as a tenant would (the old code looked at every
/// process on the host).
#[test]
fn a_look_alike_daemon_delays_nobody_and_gets_no_signal() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"group\"\n");
    let victim_pipe = sb.domain_dir(0, "g-victim").join("pipe");
    let mark = sb.path().join("decoy-signalled");
    let decoy = Command::new("/bin/sh")
        .arg0("/usr/bin/nvidia-cuda-mps-control")
        .args([
            "-c",
            &format!(
                "trap 'echo TERM >> {}' TERM; while :; do sleep 1; done",
                mark.display()
            ),
            "-f",
        ])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("CUDA_MPS_PIPE_DIRECTORY", &victim_pipe)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut decoy = KillOnDrop(decoy);
    let decoy_pid = decoy.0.id() as i32;
    wait_for("the look-alike to exec", Duration::from_secs(5), || {
        std::fs::read(format!("/proc/{decoy_pid}/cmdline"))
            .is_ok_and(|c| c.starts_with(b"/usr/bin/nvidia-cuda-mps-control\0"))
    });
    // Positive control: it has every trait the old lookup checked.
    let cmdline = std::fs::read(format!("/proc/{decoy_pid}/cmdline")).unwrap();
    assert!(String::from_utf8_lossy(&cmdline).starts_with("/usr/bin/nvidia-cuda-mps-control\0"));
    let environ = std::fs::read(format!("/proc/{decoy_pid}/environ")).unwrap();
    assert!(String::from_utf8_lossy(&environ).contains(&format!(
        "CUDA_MPS_PIPE_DIRECTORY={}",
        victim_pipe.display()
    )));

    let t = Instant::now();
    let v = tenant(&sb, "v", mps(&[("gpu.share.group", "victim")]), &[], &[]);
    let took = t.elapsed();
    let v = v.unwrap();
    let alive_after = alive(decoy_pid);
    decoy.kill();
    assert!(took < Duration::from_secs(3), "the acquire took {took:?}");
    assert!(alive_after, "the look-alike was not killed");
    assert!(!mark.exists(), "the look-alike was sent SIGTERM");
    assert_ne!(daemon_pid(&sb, "g-victim"), decoy_pid);
    assert_eq!(domain(&sb, "g-victim")["daemon"]["answers"], true);
    v.stop();
}

/// A process this test started, killed (by its pid) when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The env a spec edit (precreate) gives a config asking for `annotations`, and its
/// reservation's hook env.
fn precreate(sb: &Sandbox, annotations: &Value) -> (Vec<String>, Vec<String>) {
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sleep"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
    });
    let out = sb.hook(&["precreate"], &config.to_string());
    ok(&out);
    let edited: Value = serde_json::from_slice(&out.stdout).unwrap();
    let env: Vec<String> = edited["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .filter(|e| e.starts_with("CUDA_MPS_"))
        .collect();
    let reservation: Vec<String> = edited["hooks"]["createRuntime"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|h| h["env"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e.as_str().map(str::to_owned))
        .filter(|e| e.starts_with("GPUSHARE_RESERVATION="))
        .collect();
    (env, reservation)
}

/// Finding 6: a container that names no cores, joining a domain that enforces 30%, gets 30 in
/// its env and in `status` (not the policy's default of 50).
#[test]
fn a_joiner_naming_no_limit_gets_its_domains() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[mps]\nisolation = \"group\"\n[policy]\ndefault_cores = 50\n",
    );
    let first = mps(&[("gpu.share.group", "g"), ("gpu.share.cores", "30")]);
    let (env, res) = precreate(&sb, &first);
    let a = tenant(&sb, "a", first, &env, &res).unwrap();
    assert_eq!(domain(&sb, "g-g")["enforced"]["cores"], 30);
    let joiner = mps(&[("gpu.share.group", "g")]);
    let (env, res) = precreate(&sb, &joiner);
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30".to_owned()),
        "{env:?}"
    );
    let b = tenant(&sb, "b", joiner, &env, &res).unwrap();
    let inside = text(&b.sh("env"));
    assert!(
        inside.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"),
        "{inside}"
    );
    let st = sb.status();
    let c = st["gpus"][0]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == b.id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(c["cores"], 30, "{st}");
    b.stop();
    a.stop();
}

/// Finding 7: a refused request releases its reservation at once; a reservation that expired
/// is reported by `gc`, with the directories it removed.
#[test]
fn a_refusal_releases_its_reservation_and_gc_says_what_it_removed() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"group\"\n");
    let first = mps(&[("gpu.share.group", "g"), ("gpu.share.cores", "30")]);
    let (env, res) = precreate(&sb, &first);
    let a = tenant(&sb, "a", first, &env, &res).unwrap();
    let greedy = mps(&[("gpu.share.group", "g"), ("gpu.share.cores", "80")]);
    let (env, res) = precreate(&sb, &greedy);
    // Positive control: the spec edit reserved.
    assert_eq!(domain(&sb, "g-g")["reserved"].as_array().unwrap().len(), 1);
    let err = tenant(&sb, "b", greedy, &env, &res).err().expect("refused");
    assert!(err.contains("gpu.share.cores=80"), "{err}");
    assert_eq!(
        domain(&sb, "g-g")["reserved"],
        json!([]),
        "the refusal released its reservation"
    );

    // A spec edit whose container never comes: its reservation expires; gc says so.
    let (_, _) = precreate(&sb, &mps(&[("gpu.share.group", "h")]));
    let h = sb.domain_dir(0, "g-h");
    assert!(h.join("shm").is_dir());
    sb.edit_record_header(0, |rec| {
        for (_, at) in rec["domains"]["g-h"]["reserved"].as_object_mut().unwrap() {
            *at = json!(1);
        }
    });
    let out = sb.hook(&["gc"], "");
    ok(&out);
    let said = text(&out);
    assert!(said.contains("dropped the expired reservation"), "{said}");
    assert!(said.contains(&format!("removed {}", h.display())), "{said}");
    assert!(!said.contains("nothing to do"), "{said}");
    assert!(!h.exists());
    assert!(common::mounts_under(&h).is_empty());
    a.stop();
}

/// Finding 8: the daemon runs with no capability at all and NoNewPrivs, and still starts,
/// answers and quits.
#[test]
fn the_daemon_runs_without_capabilities() {
    if !required() {
        return;
    }
    let sb = Sandbox::new(1);
    let a = tenant(&sb, "a", mps(&[]), &[], &[]).unwrap();
    let pid = daemon_pid(&sb, "gpu");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{status}"));
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
    assert_eq!(domain(&sb, "gpu")["daemon"]["answers"], true);
    a.stop();
    wait_for("the daemon to quit", Duration::from_secs(10), || {
        !alive(pid)
    });
}

// Round 3: what a root tenant tried against groups, the limiter's shared directory, the
// daemon's log, the daemon's other defaults and `status`.

/// A pod's annotations as containerd's CRI writes them into a container's spec (its own keys
/// last, over any pod annotation it passes through), asking for MPS group `group`.
fn pod(namespace: &str, group: &str) -> Value {
    mps(&[
        ("gpu.share.group", group),
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-namespace", namespace),
        ("io.kubernetes.cri.sandbox-name", "p"),
        ("io.kubernetes.cri.container-name", "c"),
    ])
}

/// Round 3, finding 1: a group belongs to its namespace. A pod in namespace `evil` naming
/// `team-a`'s group gets a domain of its own: it neither sees team-a's `/dev/shm` nor changes
/// team-a's daemon; a pod annotation that claims team-a's namespace is refused.
#[test]
fn the_same_group_in_another_namespace_is_another_domain() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"group\"\n");
    let a = tenant(&sb, "a", pod("team-a", "team-a"), &[], &[]).unwrap();
    ok(&a.sh("echo secret > /dev/shm/team-a-data"));
    let e = tenant(&sb, "e", pod("evil", "team-a"), &[], &[]).unwrap();
    let keys: Vec<String> = sb.status()["gpus"][0]["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 2, "two domains: {keys:?}");
    let read = e.sh("cat /dev/shm/team-a-data");
    assert!(
        !text(&read).contains("secret"),
        "the other namespace read team-a's /dev/shm"
    );
    // Positive control: team-a's own container sees it.
    assert!(text(&a.sh("cat /dev/shm/team-a-data")).contains("secret"));
    let a_key = keys.iter().find(|k| k.contains("team-a:")).unwrap().clone();
    let a_pipe = sb.domain_dir(0, &a_key).join("pipe");
    let enforced = ask(&a_pipe, "get_default_active_thread_percentage");
    ok(&e.sh("echo set_default_active_thread_percentage 1 | nvidia-cuda-mps-control"));
    assert_eq!(
        ask(&a_pipe, "get_default_active_thread_percentage"),
        enforced,
        "the other namespace changed team-a's daemon"
    );
    // A pod annotation of CRI-O's namespace key, passed through on containerd, claiming
    // team-a: refused, naming what was wrong.
    let mut forged = pod("evil", "team-a");
    forged["io.kubernetes.pod.namespace"] = json!("team-a");
    let err = tenant(&sb, "f", forged, &[], &[]).err().expect("refused");
    assert!(err.contains("more than one Kubernetes namespace"), "{err}");
    e.stop();
    a.stop();
}

/// Round 3, finding 1: `[mps] group_namespaces` binds a group to the namespaces that may name
/// it; a container of another namespace, or of none, is refused in one line.
#[test]
fn a_group_bound_to_namespaces_refuses_the_others() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[mps]\nisolation = \"group\"\ngroup_namespaces = { team-a = [\"team-a\"] }\n",
    );
    let a = tenant(&sb, "a", pod("team-a", "team-a"), &[], &[]).unwrap();
    for (name, ann) in [
        ("e", pod("evil", "team-a")),
        ("n", mps(&[("gpu.share.group", "team-a")])),
    ] {
        let err = tenant(&sb, name, ann, &[], &[]).err().expect("refused");
        assert!(err.contains("[mps] group_namespaces"), "{err}");
    }
    // A group the policy does not bind is open to every namespace, one domain each.
    let b = tenant(&sb, "b", pod("evil", "open"), &[], &[]).unwrap();
    assert_eq!(
        sb.status()["gpus"][0]["domains"].as_array().unwrap().len(),
        2
    );
    b.stop();
    a.stop();
}

/// Round 3, finding 2: the limiter's shared directory is a capped tmpfs of its own (bytes
/// and inodes), nosuid, nodev, noexec; nothing a tenant writes there lands on the state
/// directory's filesystem, and it goes with the container.
#[test]
fn the_limiters_shared_directory_is_capped_and_off_the_state_filesystem() {
    if !required() {
        return;
    }
    let sb = Sandbox::new(1);
    let a = tenant(
        &sb,
        "a",
        json!({"gpu.share": "limit", "gpu.share.memory": "1Gi"}),
        &[],
        &[],
    )
    .unwrap();
    let dir = "/usr/local/gpushare/shared";
    let out = a.sh(&format!(
        "head -c 8388608 /dev/zero > {dir}/fill; wc -c < {dir}/fill"
    ));
    let written: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(written > 0, "the write really happened: {}", text(&out));
    assert!(written <= 1 << 20, "at most 1 MiB: {written}");
    let files = a.sh(&format!(
        "for i in $(seq 1 200); do : > {dir}/f$i || exit 1; done"
    ));
    assert!(
        !files.status.success(),
        "the inode cap stops a tenant making names"
    );
    use std::os::unix::fs::MetadataExt;
    let host = sb.state_dir().join("containers").join(&a.id).join("shared");
    assert_eq!(std::fs::metadata(host.join("fill")).unwrap().len(), written);
    assert_ne!(
        std::fs::metadata(&host).unwrap().dev(),
        std::fs::metadata(sb.state_dir()).unwrap().dev(),
        "the shared directory is a filesystem of its own"
    );
    let mounts = text(&a.sh("cat /proc/self/mountinfo"));
    let line = mounts
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(dir))
        .unwrap_or_else(|| panic!("{mounts}"));
    for opt in ["nosuid", "nodev", "noexec"] {
        assert!(line.contains(opt), "{opt}: {line}");
    }
    a.stop();
    assert!(!host.exists(), "the directory went with the container");
    assert!(
        common::mounts_under(&sb.state_dir()).is_empty(),
        "{:?}",
        common::mounts_under(&sb.state_dir())
    );
}

/// Round 3, finding 3: the daemon logs every command a tenant sends; its log is a capped
/// tmpfs of its own, which serve trims (keeping the tail), and `status` names it.
#[test]
fn the_daemons_log_stays_bounded_whatever_a_tenant_sends() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(
        1,
        "[serve]\nlisten = \"127.0.0.1:0\"\ngc_interval_seconds = 1\n",
    );
    let a = tenant(&sb, "a", mps(&[]), &[], &[]).unwrap();
    // 3,000 commands of 3,000 bytes: about 9 MB of log lines.
    ok(&a.sh(
        "L=$(printf '%03000d' 0); for i in $(seq 1 3000); do echo \"get_server_list $L\"; done \
         | nvidia-cuda-mps-control > /dev/null",
    ));
    let d = domain(&sb, "gpu");
    let log = PathBuf::from(d["daemon"]["log"].as_str().expect("status names the log"));
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        size > 1 << 20,
        "positive control: the commands were logged ({size} B)"
    );
    assert!(size <= 4 << 20, "the log holds at most 4 MiB: {size}");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(log.parent().unwrap()).unwrap().dev(),
        std::fs::metadata(sb.state_dir()).unwrap().dev(),
        "the log is a filesystem of its own"
    );
    assert_eq!(d["daemon"]["answers"], true, "the daemon still answers");
    // serve trims it and keeps the tail; the daemon logs on into it.
    let mut serve = Command::new(common::hook_bin())
        .arg("serve")
        .env_clear()
        .envs(sb.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let old = log.with_file_name("control.log.1");
    wait_for("serve to trim the log", Duration::from_secs(15), || {
        old.exists() && std::fs::metadata(&log).is_ok_and(|m| m.len() < 1 << 20)
    });
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(std::fs::metadata(&old).unwrap().len() <= 256 << 10);
    ok(&a.sh("echo get_default_client_priority | nvidia-cuda-mps-control"));
    let now = std::fs::read_to_string(&log).unwrap();
    assert!(
        now.contains("Cmd:get_default_client_priority"),
        "the daemon logs on into the trimmed log: {now}"
    );
    a.stop();
}

/// Round 3, finding 7: a tenant's change of the daemon's default client priority shows as
/// drift in `status` and is put back by the next acquire.
#[test]
fn a_changed_client_priority_is_shown_and_put_back() {
    if !required() {
        return;
    }
    let sb = Sandbox::new(1);
    let a = tenant(&sb, "a", mps(&[]), &[], &[]).unwrap();
    let pipe = sb.domain_dir(0, "gpu").join("pipe");
    assert_eq!(ask(&pipe, "get_default_client_priority"), "0");
    assert_eq!(domain(&sb, "gpu")["drift"], false, "positive control");
    ok(&a.sh("echo set_default_client_priority 1 | nvidia-cuda-mps-control"));
    assert_eq!(ask(&pipe, "get_default_client_priority"), "1");
    let d = domain(&sb, "gpu");
    assert_eq!(d["drift"], true, "{d}");
    assert_eq!(d["current_priority"], 1, "{d}");
    let b = tenant(&sb, "b", mps(&[]), &[], &[]).unwrap();
    assert_eq!(ask(&pipe, "get_default_client_priority"), "0");
    assert_eq!(domain(&sb, "gpu")["drift"], false);
    b.stop();
    a.stop();
}

/// Round 3, finding 6: `status` and `metrics` take about one daemon's deadline however many
/// daemons do not answer: 20 wedged domains, under a second each.
#[test]
fn twenty_wedged_domains_keep_status_and_metrics_under_a_second() {
    if !required() {
        return;
    }
    let sb = Sandbox::with_policy(1, "[mps]\nisolation = \"container\"\n");
    let mut containers = Vec::new();
    for i in 0..20 {
        let b = sb.bundle(
            &format!("w{i}"),
            &common::spec(mps(&[]), &["NVIDIA_VISIBLE_DEVICES=0"]),
        );
        let c = common::FakeContainer::start();
        ok(&sb.hook(
            &["createRuntime"],
            &Sandbox::state_json(&format!("w{i}"), c.pid(), &b),
        ));
        containers.push((c, b));
    }
    let daemons = daemons_under(&sb.state_dir());
    assert_eq!(daemons.len(), 20, "{daemons:?}");
    // Wedged: stopped, so that a connection is accepted by the kernel and never answered.
    let signal = |sig: &str| {
        for p in &daemons {
            let _ = Command::new("kill").args([sig, &p.to_string()]).status();
        }
    };
    signal("-STOP");
    let t = Instant::now();
    let st = sb.status();
    let took = t.elapsed();
    let domains = st["gpus"][0]["domains"].as_array().unwrap();
    let silent = domains
        .iter()
        .filter(|d| d["daemon"]["answers"] == false)
        .count();
    let t = Instant::now();
    let m = sb.hook(&["metrics"], "");
    let took_metrics = t.elapsed();
    signal("-CONT");
    assert_eq!(
        silent, 20,
        "positive control: every daemon was wedged: {st}"
    );
    assert!(took < Duration::from_secs(1), "status took {took:?}");
    ok(&m);
    assert!(
        took_metrics < Duration::from_secs(1),
        "metrics took {took_metrics:?}"
    );
    for (i, (c, b)) in containers.iter().enumerate() {
        let _ = sb.hook(
            &["poststop"],
            &Sandbox::state_json(&format!("w{i}"), c.pid(), b),
        );
    }
}
