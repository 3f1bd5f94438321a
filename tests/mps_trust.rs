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

use common::{daemons_under, runc, runc_bundle, Cleanup, Sandbox};
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let _c = Cleanup(sb.path().to_path_buf());
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
    let rec_path = sb
        .state_dir()
        .join("gpus")
        .join(format!("{}.json", Sandbox::uuid(0)));
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    for (_, at) in rec["domains"]["g-h"]["reserved"].as_object_mut().unwrap() {
        *at = json!(1);
    }
    std::fs::write(&rec_path, serde_json::to_vec(&rec).unwrap()).unwrap();
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
    let _c = Cleanup(sb.path().to_path_buf());
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
