//! Shared test support: binaries, the TEST-ONLY simulated driver, sandboxes with their own state
//! and policy, busybox bundles for runc, and the SKIPPED/CI policy for missing engines.
#![allow(dead_code)]

pub mod cgroup2;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

pub fn hook_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushare-hook"))
}

/// The TEST-ONLY simulated NVML/CUDA library, built by `cargo build --workspace` next to the
/// binaries.
pub fn simdriver() -> PathBuf {
    let p = hook_bin()
        .parent()
        .expect("target dir")
        .join("libgpushare_simdriver.so");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        p.display()
    );
    p
}

/// Whether `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Requires the named programs. Missing ones fail the test under CI and print a loud SKIPPED
/// line elsewhere (returning false so the caller returns early).
pub fn require(what: &str, cmds: &[&str]) -> bool {
    let missing: Vec<&str> = cmds.iter().copied().filter(|c| !have(c)).collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "SKIPPED: {what}: missing {}; run scripts/install-deps.sh",
        missing.join(", ")
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI requires every engine)");
    }
    eprintln!("\n******** {msg} ********\n");
    false
}

/// A private world for one test: state dir, simulated-driver state, policy file, log. Dropping
/// it stops the daemons and detaches the mounts gpushare left in it (a test that fails half-way
/// leaves them otherwise, and its temp dir cannot be removed while they are mounted).
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub gpus: usize,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        clean_up_under(self.dir.path());
    }
}

impl Sandbox {
    pub fn new(gpus: usize) -> Self {
        Self::with_policy(gpus, "")
    }

    /// `extra` is appended to the generated policy (TOML).
    pub fn with_policy(gpus: usize, extra: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpushare-test-")
            .tempdir()
            .expect("tempdir");
        let sb = Self { dir, gpus };
        std::fs::create_dir_all(sb.sim_state()).unwrap();
        sb.write_config(extra);
        sb
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path().join("state")
    }

    pub fn sim_state(&self) -> PathBuf {
        self.path().join("sim")
    }

    pub fn config_path(&self) -> PathBuf {
        self.path().join("config.toml")
    }

    pub fn log_path(&self) -> PathBuf {
        self.path().join("gpushare.log")
    }

    /// Writes the policy: state and log under the sandbox, NVML from the simulated driver,
    /// then `extra`, which may add keys and whole tables (top-level keys go before tables).
    pub fn write_config(&self, extra: &str) {
        let (top, tables): (Vec<&str>, Vec<&str>) = {
            let mut top = Vec::new();
            let mut tables = Vec::new();
            let mut in_table = false;
            for l in extra.lines() {
                if l.trim_start().starts_with('[') {
                    in_table = true;
                }
                if in_table {
                    tables.push(l);
                } else {
                    top.push(l);
                }
            }
            (top, tables)
        };
        let has_nvml = tables.iter().any(|l| l.trim() == "[nvml]");
        // Tables the harness adds go before the test's own, so that a test that copies part
        // of a written policy into a new one does not copy them twice.
        let mut ours: Vec<String> = Vec::new();
        // A memory cap preloads the limiter in every mode: the one this build made.
        if !tables.iter().any(|l| l.trim() == "[limit]") {
            ours.push("[limit]".into());
            ours.push(format!(
                "library = {:?}",
                simdriver().with_file_name("libgpushare_limiter.so")
            ));
        }
        // Every other key is the shipped default policy's unless `extra` sets it.
        let tables = ours
            .iter()
            .map(String::as_str)
            .chain(tables)
            .collect::<Vec<_>>();
        let timeout = if extra.contains("lock_timeout_seconds") {
            ""
        } else {
            "lock_timeout_seconds = 20"
        };
        let text = format!(
            "state_dir = {:?}\nlog_file = {:?}\n{timeout}\n{}\n{}{}\n",
            self.state_dir(),
            self.log_path(),
            top.join("\n"),
            if has_nvml {
                String::new()
            } else {
                format!("[nvml]\nlibrary = {:?}\n", simdriver())
            },
            tables.join("\n"),
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// Env for anything that loads the simulated driver or runs the hook.
    pub fn env(&self) -> Vec<(String, String)> {
        let devices = vec!["81920"; self.gpus].join(",");
        vec![
            (
                "GPUSHARE_CONFIG".into(),
                self.config_path().display().to_string(),
            ),
            ("GPUSHARE_SIM_DEVICES".into(), devices),
            (
                "GPUSHARE_SIM_STATE".into(),
                self.sim_state().display().to_string(),
            ),
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
        ]
    }

    /// Runs `gpushare-hook ARGS` with `stdin`, in this sandbox's env (and nothing else).
    pub fn hook(&self, args: &[&str], stdin: &str) -> Output {
        self.hook_env(args, stdin, &[])
    }

    pub fn hook_env(&self, args: &[&str], stdin: &str, extra_env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(hook_bin());
        cmd.args(args).env_clear().envs(self.env());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        run_with_stdin(cmd, stdin)
    }

    /// Runs `gpushare-hook ARGS` with `stdin`, in this sandbox's env, from inside the cgroup
    /// directory `cgroup`, as a runtime's hook runs in its scope. Returns its output and
    /// `/proc/<pid>/cgroup` as its process read it just before exec (the proof it ran there).
    pub fn hook_in_cgroup(&self, cgroup: &Path, args: &[&str], stdin: &str) -> (Output, String) {
        let seen = self
            .path()
            .join(format!("cgroup-of-hook-{}", args.join("-")));
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            r#"echo $$ >"$1/cgroup.procs" && cat /proc/$$/cgroup >"$2" && shift 2 && exec "$@""#,
            "sh",
        ])
        .arg(cgroup)
        .arg(&seen)
        .arg(hook_bin())
        .args(args)
        .env_clear()
        .envs(self.env());
        let out = run_with_stdin(cmd, stdin);
        (out, std::fs::read_to_string(&seen).unwrap_or_default())
    }

    /// `status --json` as a value.
    pub fn status(&self) -> Value {
        let out = self.hook(&["status", "--json"], "");
        assert!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status json")
    }

    /// Compute mode of simulated GPU `i` as the driver stores it (0 DEFAULT, 3 EXCLUSIVE_PROCESS).
    pub fn compute_mode(&self, i: usize) -> u32 {
        std::fs::read_to_string(self.sim_state().join(format!("compute_mode.{i}")))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0)
    }

    /// The directory of domain `key` (`gpu` under the default policy) of GPU `gpu`.
    pub fn domain_dir(&self, gpu: usize, key: &str) -> PathBuf {
        self.state_dir()
            .join("mps")
            .join(gpushare::host::state::domain_dir_name(
                &Self::uuid(gpu),
                key,
            ))
    }

    /// GPU `gpu`'s record file.
    pub fn record_path(&self, gpu: usize) -> PathBuf {
        self.state_dir()
            .join("gpus")
            .join(format!("{}.json", Self::uuid(gpu)))
    }

    /// The header of GPU `gpu`'s record: its first line, everything but the clients' lines.
    pub fn record_header(&self, gpu: usize) -> Value {
        let p = self.record_path(gpu);
        let text = std::fs::read(&p).unwrap_or_else(|e| panic!("no record {}: {e}", p.display()));
        let end = text.iter().position(|b| *b == b'\n').unwrap_or(text.len());
        serde_json::from_slice(&text[..end])
            .unwrap_or_else(|e| panic!("record header {}: {e}", p.display()))
    }

    /// Rewrites the header of GPU `gpu`'s record with `edit`, the clients' lines kept.
    pub fn edit_record_header(&self, gpu: usize, edit: impl FnOnce(&mut Value)) {
        let p = self.record_path(gpu);
        let text = std::fs::read(&p).unwrap();
        let end = text.iter().position(|b| *b == b'\n').unwrap_or(text.len());
        let mut head: Value = serde_json::from_slice(&text[..end]).unwrap();
        edit(&mut head);
        let mut out = serde_json::to_vec(&head).unwrap();
        out.extend_from_slice(&text[end..]);
        std::fs::write(&p, out).unwrap();
    }

    /// The simulated UUID of GPU `i`.
    pub fn uuid(i: usize) -> String {
        format!("GPU-5a1e0000-0000-4000-8000-{i:012x}")
    }

    /// Every file under the state dir with its content (sockets and fifos by name only): a
    /// snapshot for "state unchanged" checks. Lock files (and the directory holding them) are
    /// left out: they are created on first use and taking a lock writes the holder's name. So
    /// are the node's counters (`counters.json`, `counters.log`), which count a refusal by design.
    pub fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        walk(&self.state_dir(), &self.state_dir(), &mut out);
        out.sort();
        out
    }

    /// A bundle directory with `config.json` (built from `spec`) for hook-only tests.
    pub fn bundle(&self, name: &str, spec: &Value) -> PathBuf {
        let b = self.path().join("bundles").join(name);
        std::fs::create_dir_all(b.join("rootfs/tmp")).unwrap();
        glibc_rootfs(&b.join("rootfs"));
        std::fs::write(
            b.join("config.json"),
            serde_json::to_vec_pretty(spec).unwrap(),
        )
        .unwrap();
        b
    }

    /// The OCI state a runtime would pass at createRuntime.
    pub fn state_json(id: &str, pid: u32, bundle: &Path) -> String {
        json!({"ociVersion": "1.0.2", "id": id, "status": "creating", "pid": pid, "bundle": bundle})
            .to_string()
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let rel = p.strip_prefix(root).unwrap().display().to_string();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            // The reapers' directory holds only their lock files, made by a detached reaper
            // whenever it gets to it: not state a hook call changes.
            // Nor is the cache of what images' C libraries are (`cache/`).
            if rel == "reapers" || rel == "cache" {
                continue;
            }
            if rel != "gpus" {
                out.push((format!("{rel}/"), Vec::new()));
            }
            walk(root, &p, out);
        } else if ft.is_file() {
            if !rel.ends_with(".lock") && rel != "counters.json" && rel != "counters.log" {
                out.push((rel, std::fs::read(&p).unwrap_or_default()));
            }
        } else {
            out.push((rel, Vec::new()));
        }
    }
}

/// A minimal spec asking for `annotations` with `env`.
pub fn spec(annotations: Value, env: &[&str]) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
    })
}

/// A long-lived stand-in for a container's init process, in a private mount namespace of its
/// own (so the hook's mounts into "its" rootfs stay there); killed on drop.
pub struct FakeContainer(pub std::process::Child);

/// Waits (up to 5 s) until process `pid` is in another mount namespace than this process.
pub fn wait_for_own_mount_ns(pid: u32) {
    let own = std::fs::read_link("/proc/self/ns/mnt").ok();
    for _ in 0..1000 {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        if theirs.is_some() && theirs != own {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("process {pid} did not enter a mount namespace of its own");
}

impl FakeContainer {
    /// A process in a mount namespace of its own, as a runtime's container process is by
    /// createRuntime: returns once `unshare` has entered it.
    pub fn start() -> Self {
        let c = Self(
            Command::new("unshare")
                .args(["-m", "--propagation", "private", "sleep", "600"])
                .stdin(Stdio::null())
                .spawn()
                .expect("sleep"),
        );
        wait_for_own_mount_ns(c.pid());
        c
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Live MPS control daemons gpushare started whose domain directory lies under `root` (a
/// state dir or one domain's directory): as gpushare knows them, by the pid and start time it
/// wrote into `<domain>/daemon` when it spawned each; never by a process's name, arguments or
/// environment, which a tenant can imitate.
pub fn daemons_under(root: &Path) -> Vec<i32> {
    let mut files = Vec::new();
    collect_daemon_files(root, 0, &mut files);
    let mut out: Vec<i32> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            let (pid, start) = text.trim().split_once(' ')?;
            let p = gpushare::host::procinfo::ProcId {
                pid: pid.parse().ok()?,
                start_time: start.parse().ok()?,
            };
            p.is_alive().then_some(p.pid)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The `daemon` files of domain directories under `dir` (which may be one).
fn collect_daemon_files(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let f = dir.join(gpushare::host::mps::find::DAEMON_FILE);
    if f.is_file() {
        out.push(f);
    }
    if depth >= 3 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let keep = e.file_type().is_ok_and(|t| t.is_dir())
            && !matches!(e.file_name().to_str(), Some("pipe" | "shm" | "log"));
        if keep {
            collect_daemon_files(&e.path(), depth + 1, out);
        }
    }
}

/// Stops the reapers of a state dir at `root` or `root/state`: as gpushare knows them, by the pid
/// and start time each stamped into its lock file (`StateDir::reaper`), and one still starting
/// (no stamp yet) by its command line naming a policy file under `root`.
pub fn kill_reapers_under(root: &Path) {
    // A reaper the last create started may not have taken its lock yet (the hook does not wait
    // for it): found by its command line, `gpushare-hook --config <root>/… reap <GPU>`.
    for pid in reapers_started_under(root) {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    for state in [root.to_owned(), root.join("state")] {
        let sd = gpushare::host::state::StateDir::new(&state);
        let Ok(rd) = std::fs::read_dir(state.join("reapers")) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(uuid) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
                continue;
            };
            if let Some(p) = sd.reaper(uuid) {
                let _ = Command::new("kill")
                    .args(["-9", &p.pid.to_string()])
                    .status();
            }
        }
    }
}

/// Running `gpushare-hook … reap …` processes whose policy file is under `root`.
fn reapers_started_under(root: &Path) -> Vec<i32> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    pids_where(|pid| {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        args.windows(2)
            .any(|w| w[0] == b"--config" && Path::new(OsStr::from_bytes(w[1])).starts_with(root))
            && args.iter().any(|a| *a == b"reap")
    })
}

/// The pids in `/proc` that `keep` holds to, in order (the tests' own view of what runs).
pub fn pids_where(keep: impl Fn(i32) -> bool) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| keep(*pid))
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// Stops every daemon under `root` (test clean-up).
pub fn kill_daemons_under(root: &Path) {
    for pid in daemons_under(root) {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
}

/// Mount points at or under `root` (this mount namespace's), deepest first.
pub fn mounts_under(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = root.display().to_string();
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| {
            mp.strip_prefix(want.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .map(String::from)
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.len()));
    out
}

/// Kills the GPUs' reapers and the daemons gpushare left under `root` and detaches every mount
/// there, deepest first: what a test that stops half-way (or never releases) leaves in the host's
/// mount table. The reapers go first: one still running after its sandbox is removed wrote its
/// last event and the simulated driver's state into a directory of that name made anew.
pub fn clean_up_under(root: &Path) {
    kill_reapers_under(root);
    kill_daemons_under(root);
    for m in mounts_under(root) {
        let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Gives the rootfs `dir` a C library: copies of this machine's glibc loader, `libc.so.6`,
/// `libpthread.so.0` and `libdl.so.2`, where images keep them, so that `limit` mode's check of the image's libc finds glibc.
pub fn glibc_rootfs(dir: &Path) {
    for (host, inside) in [
        ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
        (
            "/lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libc.so.6",
        ),
        (
            "/lib/x86_64-linux-gnu/libpthread.so.0",
            "lib/x86_64-linux-gnu/libpthread.so.0",
        ),
        (
            "/lib/x86_64-linux-gnu/libdl.so.2",
            "lib/x86_64-linux-gnu/libdl.so.2",
        ),
    ] {
        let to = dir.join(inside);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(host, &to).unwrap_or_else(|e| panic!("copy {host}: {e}"));
    }
}

/// Makes a busybox rootfs at `dir` (static busybox with a few applet links, and glibc).
pub fn busybox_rootfs(dir: &Path) {
    glibc_rootfs(dir);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for d in ["tmp", "dev", "proc", "sys", "etc", "usr/local"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static installed");
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for applet in [
        "sh", "cat", "ls", "env", "sleep", "echo", "test", "grep", "mount", "stat", "touch",
        "readlink",
    ] {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
}

/// A runc bundle: busybox rootfs plus a `runc spec` config edited by `edit`.
pub fn runc_bundle(dir: &Path, edit: impl FnOnce(&mut Value)) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    busybox_rootfs(&dir.join("rootfs"));
    let st = Command::new("runc")
        .args(["spec"])
        .current_dir(dir)
        .status()
        .expect("runc spec");
    assert!(st.success());
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["process"]["terminal"] = json!(false);
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    dir.to_path_buf()
}

/// Runs `runc ARGS` (with the default root) and returns its output. Output goes through files,
/// not pipes: a created container inherits runc's stdio and would hold a pipe open.
pub fn runc(args: &[&str], cwd: &Path) -> Output {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let status = Command::new("runc")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .status()
        .expect("runc");
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut v = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut v).unwrap();
        v
    };
    Output {
        status,
        stdout: read(out),
        stderr: read(err),
    }
}

/// Asserts that the hook run `out` was SIGKILLed by failpoint `point` (`GPUSHARE_FAILPOINT`):
/// the positive control of every crash test. The failpoint coverage test
/// (`tests/failpoints.rs`) counts the points named next to calls of this function.
pub fn assert_killed_at(out: &Output, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(9),
        "{point}: the hook was not killed there (exit {:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `cond` holds, polling every 10 ms for up to `secs` seconds; panics with
/// "timed out after Ns waiting for WHAT" otherwise.
pub fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether process `pid` has exited (gone, or a zombie nobody reaped yet).
pub fn process_gone(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
        })
        .unwrap_or(true)
}

/// NVIDIA's control client run on `pipe` with `cmd` on its stdin (as a tenant runs it, or as a
/// test looks at a daemon independently of gpushare's own protocol code): its trimmed stdout.
pub fn mps_client(pipe: &Path, cmd: &str) -> String {
    let mut c = Command::new("nvidia-cuda-mps-control")
        .env_clear()
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut c.stdin.take().unwrap(), format!("{cmd}\n").as_bytes()).unwrap();
    String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout)
        .trim()
        .to_owned()
}

/// `cuprobe` (tests/limiter/cuprobe.c) built against the simulated driver, and the directory
/// that makes the simulated driver loadable as libcuda.so.1.
pub fn build_probe(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let simlib = dir.join("simlib");
    let st = Command::new("sh")
        .arg(root.join("simdriver/install-sim.sh"))
        .arg(&simlib)
        .arg(simdriver())
        .stdout(Stdio::null())
        .status()
        .ok()?;
    assert!(st.success(), "install-sim.sh failed");
    let probe = dir.join("cuprobe");
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&probe)
        .arg(root.join("tests/limiter/cuprobe.c"))
        .arg(format!("-L{}", simlib.display()))
        .args(["-lcuda", "-lnvidia-ml", "-ldl"])
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "cc cuprobe.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((probe, simlib))
}

/// Runs `cmd` with `stdin` written from a thread (so that a large input cannot block), stdout
/// and stderr captured.
fn run_with_stdin(mut cmd: Command, stdin: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpushare-hook");
    let mut si = child.stdin.take().unwrap();
    let input = stdin.as_bytes().to_vec();
    let writer = std::thread::spawn(move || {
        let _ = si.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    out
}

/// A child cgroup made for a test in a hierarchy it can write: v1's `pids` where the node has
/// it, else the cgroup v2 root. On drop its processes go back to the root and it is removed, so
/// a failing test leaves none behind.
pub struct TestCgroup {
    pub root: PathBuf,
    pub dir: PathBuf,
    /// The hierarchy's controller list as `/proc/<pid>/cgroup` names it ("" for v2).
    pub controllers: &'static str,
}

impl TestCgroup {
    pub fn new(name: &str) -> Self {
        let pids = Path::new("/sys/fs/cgroup/pids");
        let (root, controllers) = if pids.join("cgroup.procs").exists() {
            (pids.to_owned(), "pids")
        } else {
            assert!(
                Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
                "no cgroup v1 pids hierarchy nor cgroup v2 under /sys/fs/cgroup"
            );
            (PathBuf::from("/sys/fs/cgroup"), "")
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self {
            root,
            dir,
            controllers,
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// tests/engines/lib.sh's host-wide lock, held shared (as every engine script holds it) while a
/// test runs gpushare with a policy that does not load: gpushare then logs to the host's default
/// log and event files, which the package test, holding the lock alone, checks that its purge
/// removes. Released on drop.
pub struct HostLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

pub fn host_lock_shared() -> HostLock {
    use nix::fcntl::{Flock, FlockArg};
    let open = |p: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    // Through the turnstile, as lib.sh does: a test waiting to hold the lock alone makes new
    // shared holders wait behind it.
    let turnstile = Flock::lock(
        open("/tmp/gpushare-engine-tests.turnstile"),
        FlockArg::LockExclusive,
    )
    .unwrap_or_else(|(_, e)| panic!("turnstile: {e}"));
    let lock = Flock::lock(
        open("/tmp/gpushare-engine-tests.lock"),
        FlockArg::LockShared,
    )
    .unwrap_or_else(|(_, e)| panic!("host lock: {e}"));
    drop(turnstile);
    HostLock(lock)
}
