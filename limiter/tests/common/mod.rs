//! Shared harness of the limiter and simulated-driver integration tests: takes the two cdylibs
//! from `GPUSHARE_TEST_CDYLIBS` (a directory where the workspace's build put them, as
//! `scripts/test.sh` sets it) or else builds them (nested `cargo build` into `target/nested`, its
//! own target directory, so it never waits on the build lock the outer `cargo test` holds),
//! installs the TEST-ONLY simulated driver as `libcuda.so.1`/`libnvidia-ml.so.1`, compiles the C
//! probes, and runs them in private scratch "containers". The preparation runs once per test
//! process under a lock on `target/nested/.lock`, and a probe is compiled only when its source
//! is newer than the program, so test processes running at once (nextest) share one preparation.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// Simulated kernel duration (the simulated driver's default).
pub const KERNEL_US: f64 = 500.0;

pub struct Built {
    pub limiter: PathBuf,
    pub simlib: PathBuf,
    pub probe: PathBuf,
    pub nvmlprobe: PathBuf,
    pub interposer: PathBuf,
    pub conformance: PathBuf,
    pub foreign: PathBuf,
    pub nested: PathBuf,
}

/// Whether `out` is missing or older than `src` or the simulated driver `simlib` links it to.
fn stale(out: &Path, src: &Path, simlib: &Path) -> bool {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(have) = mtime(out) else {
        return true;
    };
    [src, &simlib.join("libcuda.so.1")]
        .iter()
        .any(|p| mtime(p).is_none_or(|t| t > have))
}

/// Compiles a C test program or library with `cc` when it is stale: into a temporary name,
/// renamed into place, so that another test process never runs a half-written program.
/// `Err` when there is no `cc`.
fn cc_into(
    args: &[&str],
    out: &Path,
    src: &Path,
    libs: &[String],
    simlib: &Path,
) -> Result<(), &'static str> {
    if !stale(out, src, simlib) {
        return Ok(());
    }
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let o = match Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(&tmp)
        .arg(src)
        .args(libs)
        .output()
    {
        Ok(o) => o,
        Err(_) => return Err("no C compiler (cc) on PATH"),
    };
    assert!(
        o.status.success(),
        "cc {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, out).expect("rename the compiled probe into place");
    Ok(())
}

fn cc(args: &[&str], out: &Path, src: &Path, libs: &[String], simlib: &Path) {
    cc_into(args, out, src, libs, simlib).expect("cc");
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Builds everything once per test binary; `None` (with the reason) when `cuda.h` or `cc` is
/// missing.
pub fn built() -> Result<&'static Built, &'static str> {
    static BUILT: OnceLock<Result<Built, &'static str>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !Path::new("/usr/include/cuda.h").exists()
                || !Path::new("/usr/include/nvml.h").exists()
            {
                return Err(
                    "/usr/include/cuda.h or nvml.h missing (apt-get install nvidia-cuda-dev)",
                );
            }
            let root = root();
            let nested = root.join("target").join("nested");
            std::fs::create_dir_all(&nested).expect("target/nested");
            // One preparation at a time across test processes; released when this returns.
            let lock = std::fs::File::create(nested.join(".lock")).expect("target/nested/.lock");
            lock.lock().expect("lock target/nested/.lock");
            let debug = match std::env::var_os("GPUSHARE_TEST_CDYLIBS") {
                Some(dir) => {
                    let dir = PathBuf::from(dir);
                    for lib in ["libgpushare_limiter.so", "libgpushare_simdriver.so"] {
                        assert!(
                            dir.join(lib).exists(),
                            "GPUSHARE_TEST_CDYLIBS={}: {lib} is missing (cargo build --workspace)",
                            dir.display()
                        );
                    }
                    dir
                }
                None => {
                    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                    let status = Command::new(cargo)
                        .current_dir(&root)
                        .args([
                            "build",
                            "-p",
                            "gpushare-limiter",
                            "-p",
                            "gpushare-simdriver",
                            "--target-dir",
                        ])
                        .arg(&nested)
                        .env_remove("CARGO_TARGET_DIR")
                        .status()
                        .expect("run nested cargo build");
                    assert!(status.success(), "nested cargo build failed");
                    nested.join("debug")
                }
            };
            let simlib = nested.join("simlib");
            let status = Command::new("sh")
                .arg(root.join("simdriver/install-sim.sh"))
                .arg(&simlib)
                .arg(debug.join("libgpushare_simdriver.so"))
                .stdout(Stdio::null())
                .status()
                .expect("run install-sim.sh");
            assert!(status.success(), "install-sim.sh failed");
            let sim = |libs: &[&str]| -> Vec<String> {
                std::iter::once(format!("-L{}", simlib.display()))
                    .chain(libs.iter().map(|l| l.to_string()))
                    .collect()
            };
            let probe = nested.join("cuprobe");
            cc_into(
                &["-O2", "-Wall"],
                &probe,
                &root.join("tests/limiter/cuprobe.c"),
                &sim(&["-lcuda", "-lnvidia-ml", "-ldl"]),
                &simlib,
            )?;
            let interposer = nested.join("libinterposer.so");
            cc(
                &["-O2", "-Wall", "-shared", "-fPIC"],
                &interposer,
                &root.join("tests/limiter/interposer.c"),
                &["-ldl".into()],
                &simlib,
            );
            let nvmlprobe = nested.join("nvmlprobe");
            cc(
                &["-O2", "-Wall"],
                &nvmlprobe,
                &root.join("tests/limiter/nvmlprobe.c"),
                &sim(&["-lnvidia-ml"]),
                &simlib,
            );
            let conformance = nested.join("conformance");
            cc(
                &["-O2", "-Wall", "-pthread"],
                &conformance,
                &root.join("tests/limiter/conformance.c"),
                &sim(&["-lcuda", "-ldl"]),
                &simlib,
            );
            let foreign = nested.join("libforeign.so");
            cc(
                &["-O2", "-Wall", "-shared", "-fPIC"],
                &foreign,
                &root.join("tests/limiter/foreign.c"),
                &[],
                &simlib,
            );
            drop(lock);
            Ok(Built {
                limiter: debug.join("libgpushare_limiter.so"),
                simlib,
                probe,
                nvmlprobe,
                interposer,
                conformance,
                foreign,
                nested,
            })
        })
        .as_ref()
        .map_err(|e| *e)
}

/// A test that cannot run: fails under `CI=true`, else says SKIPPED loudly.
pub fn skip(name: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{name}: {why} (CI=true: the test must run)");
    }
    eprintln!("SKIPPED {name}: {why}");
}

#[macro_export]
macro_rules! setup {
    ($name:expr) => {
        match $crate::common::built() {
            Ok(b) => $crate::common::Scratch::new(b, $name),
            Err(why) => {
                $crate::common::skip($name, why);
                return;
            }
        }
    };
}

/// A private "container": its own simulated-driver state, shared cache and limits file path.
pub struct Scratch {
    pub b: &'static Built,
    pub dir: PathBuf,
    pub preload: bool,
    env: Vec<(String, String)>,
}

impl Scratch {
    pub fn new(b: &'static Built, name: &str) -> Scratch {
        let dir = b
            .nested
            .join("scratch")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let env = vec![
            (
                "GPUSHARE_SIM_STATE".into(),
                dir.join("sim").display().to_string(),
            ),
            ("GPUSHARE_SIM_DEVICES".into(), "4096,4096".into()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
                dir.join("cache").display().to_string(),
            ),
            (
                "GPUSHARE_LIMITS_FILE".into(),
                dir.join("limits").display().to_string(),
            ),
        ];
        Scratch {
            b,
            dir,
            preload: true,
            env,
        }
    }

    pub fn set(&mut self, k: &str, v: &str) -> &mut Self {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn unset(&mut self, k: &str) -> &mut Self {
        self.env.retain(|(key, _)| key != k);
        self
    }

    pub fn command(&self, args: &[&str]) -> Command {
        self.program(&self.b.probe, args)
    }

    /// `program` with this scratch's environment (and the limiter, when `preload`).
    pub fn program(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("CUDA_") || k.starts_with("GPUSHARE_") {
                c.env_remove(k);
            }
        }
        c.env("LD_LIBRARY_PATH", &self.b.simlib);
        if self.preload {
            c.env("LD_PRELOAD", &self.b.limiter);
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).spawn().expect("spawn cuprobe")
    }

    /// Runs the conformance probe to completion (60 s watchdog).
    pub fn conform(&self, args: &[&str]) -> Probe {
        use std::io::Read;
        let mut child = self
            .program(&self.b.conformance, args)
            .spawn()
            .expect("spawn conformance");
        // Drained while it runs: the output may be larger than a pipe holds.
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|e| Box::new(e) as Box<dyn Read + Send>),
        );
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("conformance {args:?} hung");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let output = Output {
            status,
            stdout: out.join().expect("stdout reader"),
            stderr: err.join().expect("stderr reader"),
        };
        Probe::from(output, args)
    }

    /// Runs nvmlprobe to completion.
    pub fn nvml(&self, args: &[&str]) -> Probe {
        let out = self
            .program(&self.b.nvmlprobe, args)
            .output()
            .expect("run nvmlprobe");
        Probe::from(out, args)
    }

    /// Runs cuprobe to completion (30 s watchdog).
    pub fn run(&self, args: &[&str]) -> Probe {
        let mut child = self.spawn(args);
        let start = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("cuprobe {args:?} hung");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Probe::from(child.wait_with_output().expect("output"), args)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct Probe {
    pub vals: HashMap<String, String>,
    pub stdout: String,
    pub stderr: String,
    pub code: Option<i32>,
    args: String,
}

impl Probe {
    pub fn from(o: Output, args: &[&str]) -> Probe {
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        let vals = stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Probe {
            vals,
            stdout,
            stderr: String::from_utf8_lossy(&o.stderr).to_string(),
            code: o.status.code(),
            args: format!("{args:?}"),
        }
    }

    pub fn ok(self) -> Probe {
        assert_eq!(
            self.code,
            Some(0),
            "cuprobe {} failed; stderr:\n{}",
            self.args,
            self.stderr
        );
        self
    }

    pub fn u(&self, k: &str) -> u64 {
        self.vals
            .get(k)
            .unwrap_or_else(|| {
                panic!(
                    "cuprobe {} printed no {k}; got {:?}; stderr {}",
                    self.args, self.vals, self.stderr
                )
            })
            .parse()
            .unwrap_or_else(|_| panic!("{k} not a number"))
    }

    pub fn f(&self, k: &str) -> f64 {
        self.vals[k]
            .parse()
            .unwrap_or_else(|_| panic!("{k} not a number"))
    }
}

/// Reads the child's stdout until `line` appears.
pub fn wait_for_line(child: &mut Child, line: &str) {
    use std::io::{BufRead, BufReader};
    let out = child.stdout.take().expect("stdout");
    let mut r = BufReader::new(out);
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = r.read_line(&mut buf).expect("read child");
        assert!(n > 0, "child exited before printing {line}");
        if buf.trim() == line {
            return;
        }
        assert!(!buf.starts_with("HELD="), "child could not allocate: {buf}");
    }
}

/// Rows of the `pool` scenario: the same under a 1 GiB cap on a 4 GiB device and without the
/// limiter on a 1 GiB simulated device (`keep`: release threshold UINT64_MAX instead of 0).
pub fn pool_rows(keep: bool) -> Vec<(&'static str, u64, &'static str)> {
    let mut rows = vec![
        ("DEFPOOL_RC", 0, "cuDeviceGetDefaultMemPool"),
        (
            "CURPOOL_IS_DEFAULT",
            1,
            "the current pool is the default one",
        ),
        ("ASYNC_RC", 0, "cuMemAllocAsync 600 MiB"),
        ("RESERVED_1", 600 * MIB, "the pool grew by the request"),
        ("USED_1", 600 * MIB, "and hands it out"),
        ("ASYNC_OVER_RC", 2, "another 600 MiB does not fit"),
        ("FREE_RC", 0, "cuMemFreeAsync"),
        (
            "RESERVED_2",
            600 * MIB,
            "the pool keeps it until synchronisation",
        ),
        ("USED_2", 0, "nothing handed out"),
        ("SYNC_RC", 0, "cuCtxSynchronize"),
        ("REUSE_RC", 0, "600 MiB again fits, from the pool"),
        ("RESERVED_4", 600 * MIB, "without growing past 600 MiB"),
        ("TRIM_RC", 0, "cuMemPoolTrimTo 0"),
        ("RESERVED_5", 0, "trimmed"),
        ("ALLOC_AFTER_TRIM_RC", 0, "the memory is usable again"),
        ("MEMINFO_TOTAL", GIB, "cuMemGetInfo total"),
        (
            "MEMINFO_FREE",
            424 * MIB,
            "cuMemGetInfo free after the last 600 MiB",
        ),
    ];
    if keep {
        rows.extend([
            ("THRESHOLD_RC", 0, "release threshold UINT64_MAX"),
            (
                "RESERVED_3",
                600 * MIB,
                "the pool keeps 600 MiB after synchronisation",
            ),
            ("MEMINFO_FREE_3", 424 * MIB, "and it counts as used"),
            ("ALLOC_OVER_RC", 2, "so cuMemAlloc_v2 600 MiB is refused"),
        ]);
    } else {
        rows.extend([
            (
                "RESERVED_3",
                0,
                "release threshold 0: released at synchronisation",
            ),
            ("MEMINFO_FREE_3", GIB, "nothing counted any more"),
            ("ALLOC_OVER_RC", 0, "cuMemAlloc_v2 600 MiB fits"),
        ]);
    }
    rows
}
