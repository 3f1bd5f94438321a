//! TEST-ONLY: end-to-end tests of the simulated r615 cgroup memory limits in real processes.
//!
//! Each process that uses the simulated driver is this test binary run again as a small
//! command server ([`server`], selected by `GPUSHARE_SIM_TEST_ROLE`), with its own
//! `GPUSHARE_SIM_STATE`: it reads one command a line on stdin and answers one `@@answer <numbers>` line.
//! The cgroup test mounts a private cgroup2 view (root only) and cleans up in `Drop` guards.

use crate::cuda::{self, CuDevicePtr, Opaque};
use crate::nvml::{self, GetMemoryLimitsV1, NvmlDevice, SetMemoryLimitsV1};
use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const ROLE: &str = "GPUSHARE_SIM_TEST_ROLE";
/// What starts an answer line.
const MARK: &str = "@@answer ";
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The command server, not a test of its own: [`Server::spawn`] runs this test binary again
/// with `--ignored --exact` on this entry and `GPUSHARE_SIM_TEST_ROLE` set. Run any other way
/// (`--include-ignored`), it fails rather than pass without doing anything.
#[test]
#[ignore = "the command server of this module's tests, run by them as a child process"]
fn server() {
    assert!(
        std::env::var_os(ROLE).is_some(),
        "cgroup_e2e::server is the command server of the simulated-driver tests, started by them \
         with {ROLE} set; it is not a test to run alone"
    );
    serve();
}

/// Positive control of the command server the other tests talk to: it runs in a child process
/// (its own pid), under the state directory and devices it was started with, and answers.
#[test]
fn server_runs_in_a_child_with_its_own_state() {
    let state = scratch("server-control");
    let mut s = Server::spawn(&state, &[]);
    let child = s.pid();
    let got = s.ask("whoami");
    assert_eq!(got[0], u64::from(child), "the answer comes from the child");
    assert_ne!(got[0], u64::from(std::process::id()));
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&state).unwrap());
    assert_eq!(got[1], ino, "it runs with this test's state directory");
    assert_eq!(got[2], 2, "and the two GPUs it was given");
    drop(s);
    let _ = std::fs::remove_dir_all(&state);
}

/// NVML handle of GPU `i` (initialising NVML).
fn nvml_dev(i: u32) -> NvmlDevice {
    assert_eq!(nvml::nvmlInit_v2(), 0);
    let mut d: NvmlDevice = std::ptr::null();
    assert_eq!(nvml::nvmlDeviceGetHandleByIndex_v2(i, &mut d), 0);
    d
}

/// A context on GPU 0, created once.
fn ensure_ctx(ctx: &mut Opaque) {
    if !ctx.is_null() {
        return;
    }
    assert_eq!(cuda::cuInit(0), 0);
    let mut dev = 0;
    // SAFETY: `dev` is a valid, writable CUdevice.
    assert_eq!(unsafe { cuda::cuDeviceGet(&mut dev, 0) }, 0);
    assert_eq!(cuda::cuCtxCreate_v2(ctx, 0, dev), 0);
}

fn set(i: u32, ns: Option<&str>, soft: u64, hard: u64) -> String {
    let c = ns.map(|n| CString::new(n).expect("no NUL"));
    let mut l = SetMemoryLimitsV1 {
        name_space: c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        soft_limit: soft,
        hard_limit: hard,
    };
    // SAFETY: `l` is a valid struct; its namespace is null or a live C string.
    let rc = unsafe { nvml::nvmlDeviceSetMemoryLimits_v1(nvml_dev(i), &mut l) };
    rc.to_string()
}

fn get(i: u32, ns: &str) -> String {
    let c = CString::new(ns).expect("no NUL");
    let mut l = GetMemoryLimitsV1 {
        name_space: c.as_ptr(),
        soft_limit: 7,
        hard_limit: 7,
        current_used: 7,
    };
    // SAFETY: `l` is a valid, writable struct; its namespace is a live C string.
    let rc = unsafe { nvml::nvmlDeviceGetMemoryLimits_v1(nvml_dev(i), &mut l) };
    format!("{rc} {} {} {}", l.soft_limit, l.hard_limit, l.current_used)
}

fn alloc(ctx: &mut Opaque, bytes: u64) -> String {
    ensure_ctx(ctx);
    let mut p: CuDevicePtr = 0;
    cuda::cuMemAlloc_v2(&mut p, bytes as usize).to_string()
}

fn info(ctx: &mut Opaque) -> String {
    ensure_ctx(ctx);
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid, writable.
    let rc = unsafe { cuda::cuMemGetInfo_v2(&mut free, &mut total) };
    format!("{rc} {free} {total}")
}

fn nvml_info() -> String {
    let mut m = nvml::Memory {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: `m` is a valid, writable nvmlMemory_t.
    let rc = unsafe { nvml::nvmlDeviceGetMemoryInfo(nvml_dev(0), &mut m) };
    format!("{rc} {} {} {}", m.total, m.used, m.free)
}

fn num(w: &str) -> u64 {
    w.parse().expect("number")
}

/// Answers commands on stdin until `exit` or EOF.
fn serve() {
    // A stuck test must not hang its parent: exit (EOF for the parent) after two minutes.
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(120));
        std::process::exit(3);
    });
    let mut ctx: Opaque = std::ptr::null_mut();
    for line in std::io::stdin().lines() {
        let line = line.expect("stdin");
        let w: Vec<&str> = line.split_whitespace().collect();
        let reply = match w[..] {
            ["set", i, ns, soft, hard] => set(num(i) as u32, Some(ns), num(soft), num(hard)),
            ["setnull", i] => set(num(i) as u32, None, 0, 1),
            ["get", i, ns] => get(num(i) as u32, ns),
            ["alloc", bytes] => alloc(&mut ctx, num(bytes)),
            ["info"] => info(&mut ctx),
            ["nvmlinfo"] => nvml_info(),
            ["uid", uid] => {
                let uid = num(uid) as libc::uid_t;
                // SAFETY: plain system call; the result is reported.
                unsafe { libc::setresuid(uid, uid, uid) }.to_string()
            }
            ["whoami"] => format!(
                "{} {} {}",
                std::process::id(),
                std::env::var_os("GPUSHARE_SIM_STATE")
                    .and_then(|v| std::fs::metadata(v).ok())
                    .map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m)),
                crate::config::config().devices.len()
            ),
            ["exit"] => break,
            _ => panic!("unknown command {line:?}"),
        };
        println!("{MARK}{reply}");
    }
}

/// A running command server (also used by `mps_e2e`).
pub(crate) struct Server {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Server {
    /// Starts a command server with its own `state` directory and `env` on top of this
    /// process's environment, less any `GPUSHARE_SIM_*` and `CUDA_MPS_*` variables.
    pub(crate) fn spawn(state: &Path, env: &[(&str, &str)]) -> Server {
        let name = module_path!()
            .split_once("::")
            .map_or("", |(_, rest)| rest)
            .to_owned()
            + "::server";
        let mut c = Command::new(std::env::current_exe().expect("test binary"));
        c.args([
            "--exact",
            &name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (k, _) in std::env::vars() {
            if k.starts_with("GPUSHARE_SIM_") || k.starts_with("CUDA_MPS_") {
                c.env_remove(k);
            }
        }
        c.env(ROLE, "server")
            .env("GPUSHARE_SIM_STATE", state)
            .env("GPUSHARE_SIM_DEVICES", "4096,4096");
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn test server");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Server { child, stdin, out }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `cmd`, returns the numbers of its answer.
    pub(crate) fn ask(&mut self, cmd: &str) -> Vec<u64> {
        writeln!(self.stdin, "{cmd}").expect("write command");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).expect("read answer");
            assert!(n > 0, "test server exited during {cmd:?}");
            // The harness's "test ... " may precede the first answer on its line.
            if let Some((_, rest)) = line.split_once(MARK) {
                return rest.split_whitespace().map(num).collect();
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test that cannot run here: fails when `CI` is set, else says SKIPPED loudly.
fn skip(name: &str, why: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{name}: {why} (CI is set: the test must run)");
    }
    eprintln!("\n*** SKIPPED {name}: {why} ***\n");
}

/// A fresh scratch directory under the system temp directory.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpushare-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// A private cgroup2 mount with test cgroups in it; `Drop` moves the processes put into them
/// back to the root cgroup, removes them, unmounts and removes the mount point.
struct Cgroups {
    mnt: PathBuf,
    mounted: bool,
    made: Vec<PathBuf>,
    moved: Vec<u32>,
}

impl Cgroups {
    /// Mounts cgroup2 at a fresh directory; `Err` says why it could not.
    fn mount() -> Result<Cgroups, String> {
        let mut g = Cgroups {
            mnt: scratch("cg2"),
            mounted: false,
            made: Vec::new(),
            moved: Vec::new(),
        };
        let target = CString::new(g.mnt.display().to_string()).expect("no NUL");
        // SAFETY: all arguments are NUL-terminated strings; data may be null.
        let rc = unsafe {
            libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                c"cgroup2".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(format!(
                "mount -t cgroup2: {}",
                std::io::Error::last_os_error()
            ));
        }
        g.mounted = true;
        Ok(g)
    }

    fn mkdir(&mut self, name: &str) -> PathBuf {
        let d = self.mnt.join(name);
        std::fs::create_dir(&d).expect("mkdir cgroup");
        self.made.push(d.clone());
        d
    }

    fn rmdir(&mut self, d: &Path) {
        std::fs::remove_dir(d).expect("rmdir cgroup");
        self.made.retain(|m| m != d);
    }

    fn enter(&mut self, dir: &Path, pid: u32) {
        self.moved.push(pid);
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move into cgroup");
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for pid in &self.moved {
            let _ = std::fs::write(self.mnt.join("cgroup.procs"), pid.to_string());
        }
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        if self.mounted {
            if let Ok(c) = CString::new(self.mnt.display().to_string()) {
                // SAFETY: `c` is a NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let _ = std::fs::remove_dir(&self.mnt);
    }
}

/// The log lines the test expects, built as it goes.
#[derive(Default)]
struct Expect(String);

impl Expect {
    fn set(&mut self, i: u32, ns: &Path, soft: u64, hard: u64, rc: u64) {
        self.0 += &format!(
            "{{\"call\":\"set\",\"index\":{i},\"namespace\":\"{}\",\"soft\":{soft},\"hard\":{hard},\"result\":{rc}}}\n",
            ns.display()
        );
    }

    fn get(&mut self, i: u32, ns: &Path, got: &[u64]) {
        let f = |v: u64| {
            if got[0] == 0 {
                v.to_string()
            } else {
                "null".into()
            }
        };
        self.0 += &format!(
            "{{\"call\":\"get\",\"index\":{i},\"namespace\":\"{}\",\"soft\":{},\"hard\":{},\"currentUsed\":{},\"result\":{}}}\n",
            ns.display(),
            f(got[1]),
            f(got[2]),
            f(got[3]),
            got[0]
        );
    }
}

#[test]
fn cgroup_hard_limit_caps_allocations_and_memory_reports() {
    const NAME: &str = "cgroup_hard_limit_caps_allocations_and_memory_reports";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(NAME, "needs root (mounts cgroup2, sets limits as root)");
    }
    let mut cg = match Cgroups::mount() {
        Ok(c) => c,
        Err(why) => return skip(NAME, &why),
    };
    let state = scratch("limits-e2e");
    let box_ = cg.mkdir(&format!("gpushare-sim-box-{}", std::process::id()));
    let mut admin = Server::spawn(&state, &[]);
    let mut app = Server::spawn(&state, &[]);
    cg.enter(&box_, app.pid());
    let mut log = Expect::default();
    let max = u64::MAX;

    // Before any limit: the device's own numbers, and get reads "no limit".
    let g = admin.ask(&format!("get 0 {}", box_.display()));
    assert_eq!(g, vec![0, 0, max, 0], "no limit set: soft 0, hard MAX");
    log.get(0, &box_, &g);
    assert_eq!(app.ask("info"), vec![0, 4096 * MIB, 4096 * MIB]);

    assert_eq!(
        admin.ask(&format!("set 0 {} {} {GIB}", box_.display(), 256 * MIB)),
        vec![0]
    );
    log.set(0, &box_, 256 * MIB, GIB, 0);

    assert_eq!(
        app.ask("info"),
        vec![0, GIB, GIB],
        "cuMemGetInfo: total capped"
    );
    assert_eq!(
        app.ask(&format!("alloc {}", 768 * MIB)),
        vec![0],
        "below the limit"
    );
    assert_eq!(app.ask("info"), vec![0, 256 * MIB, GIB], "free = headroom");
    assert_eq!(
        app.ask("nvmlinfo"),
        vec![0, GIB, 768 * MIB, 256 * MIB],
        "NVML memory info from inside the cgroup: capped total"
    );
    assert_eq!(
        admin.ask("nvmlinfo"),
        vec![0, 4096 * MIB, 768 * MIB, 3328 * MIB],
        "outside: not capped"
    );
    assert_eq!(
        app.ask(&format!("alloc {}", 512 * MIB)),
        vec![2],
        "over the hard limit: OUT_OF_MEMORY"
    );
    assert_eq!(
        app.ask(&format!("alloc {}", 256 * MIB)),
        vec![0],
        "exactly up to the limit fits"
    );

    let g = admin.ask(&format!("get 0 {}", box_.display()));
    assert_eq!(g, vec![0, 256 * MIB, GIB, GIB], "soft, hard, currentUsed");
    log.get(0, &box_, &g);
    let g = admin.ask(&format!("get 1 {}", box_.display()));
    assert_eq!(g, vec![0, 0, max, 0], "GPU 1 has no limit");
    log.get(1, &box_, &g);
    let unified = Path::new("/sys/fs/cgroup/unified").join(box_.file_name().expect("name"));
    if unified.is_dir() {
        let g = admin.ask(&format!("get 0 {}", unified.display()));
        assert_eq!(
            g,
            vec![0, 256 * MIB, GIB, GIB],
            "same cgroup through another mount point"
        );
        log.get(0, &unified, &g);
    }

    // Errors.
    let missing = cg.mnt.join("no-such-cgroup");
    assert_eq!(
        admin.ask(&format!("set 0 {} 0 {GIB}", missing.display())),
        vec![6],
        "NOT_FOUND"
    );
    log.set(0, &missing, 0, GIB, 6);
    assert_eq!(
        admin.ask(&format!("set 0 {} {GIB} {}", box_.display(), GIB - 1)),
        vec![2],
        "soft > hard"
    );
    log.set(0, &box_, GIB, GIB - 1, 2);
    assert_eq!(admin.ask("setnull 0"), vec![2], "null nameSpace");
    log.0 +=
        "{\"call\":\"set\",\"index\":0,\"namespace\":null,\"soft\":0,\"hard\":1,\"result\":2}\n";

    // Clearing restores the device's numbers and lets the cgroup past the old limit.
    assert_eq!(
        admin.ask(&format!("set 0 {} 0 {max}", box_.display())),
        vec![0]
    );
    log.set(0, &box_, 0, max, 0);
    assert_eq!(
        app.ask("info"),
        vec![0, 3072 * MIB, 4096 * MIB],
        "cleared: device total"
    );
    assert_eq!(
        app.ask(&format!("alloc {GIB}")),
        vec![0],
        "cleared: beyond the old limit"
    );
    let g = admin.ask(&format!("get 0 {}", box_.display()));
    assert_eq!(g, vec![0, 0, max, 2 * GIB]);
    log.get(0, &box_, &g);

    // Removing a cgroup clears its limits: re-created under the same name it has none.
    let gone = cg.mkdir("gpushare-sim-gone");
    assert_eq!(
        admin.ask(&format!("set 0 {} 0 {GIB}", gone.display())),
        vec![0]
    );
    log.set(0, &gone, 0, GIB, 0);
    cg.rmdir(&gone);
    let gone = cg.mkdir("gpushare-sim-gone");
    let g = admin.ask(&format!("get 0 {}", gone.display()));
    assert_eq!(
        g,
        vec![0, 0, max, 0],
        "re-created cgroup starts without limits"
    );
    log.get(0, &gone, &g);

    // Setting is privileged.
    let mut nobody = Server::spawn(&state, &[]);
    assert_eq!(nobody.ask("uid 65534"), vec![0]);
    assert_eq!(
        nobody.ask(&format!("set 0 {} 0 {GIB}", box_.display())),
        vec![4],
        "NO_PERMISSION"
    );
    drop(nobody);

    let text = std::fs::read_to_string(state.join(crate::memlimits::LOG_NAME)).expect("log");
    assert_eq!(text, log.0, "the call log holds exactly these calls");
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn older_driver_and_fault_injection() {
    let state = scratch("limits-old");
    let ns = "/sys/fs/cgroup";
    let mut old = Server::spawn(&state, &[("GPUSHARE_SIM_MEMORY_LIMITS", "0")]);
    assert_eq!(
        old.ask(&format!("set 0 {ns} 0 1")),
        vec![13],
        "FUNCTION_NOT_FOUND"
    );
    assert_eq!(
        old.ask(&format!("get 0 {ns}")),
        vec![13, 7, 7, 7],
        "outputs untouched"
    );
    assert!(
        !state.join(crate::memlimits::LOG_NAME).exists(),
        "nothing logged"
    );
    assert!(!state.join("memlimits.0").exists(), "nothing stored");
    drop(old);

    let fail = "nvmlDeviceSetMemoryLimits_v1=999,nvmlDeviceGetMemoryLimits_v1=3";
    let mut failing = Server::spawn(&state, &[("GPUSHARE_SIM_FAIL", fail)]);
    assert_eq!(failing.ask(&format!("set 0 {ns} 0 1")), vec![999]);
    assert_eq!(failing.ask(&format!("get 0 {ns}")), vec![3, 7, 7, 7]);
    drop(failing);
    let text = std::fs::read_to_string(state.join(crate::memlimits::LOG_NAME)).expect("log");
    assert_eq!(
        text,
        format!(
            "{{\"call\":\"set\",\"index\":0,\"namespace\":\"{ns}\",\"soft\":0,\"hard\":1,\"result\":999}}\n\
             {{\"call\":\"get\",\"index\":0,\"namespace\":\"{ns}\",\"soft\":null,\"hard\":null,\"currentUsed\":null,\"result\":3}}\n"
        )
    );
    let _ = std::fs::remove_dir_all(&state);
}
