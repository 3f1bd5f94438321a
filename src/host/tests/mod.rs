//! Tests of the doing layer against the recording fakes ([`crate::host::fakes`]).
//!
//! Most are tables: a row names its case (`what`), sets the world up (`given`), acts (`when`)
//! and checks the outcome (`err` or `says`, then `then`); `rows.rs` says what each field means.
//! [`rows!`] makes each row a `#[test]` of its own, named after it, so that:
//! - every failing row is reported, all together, at the end of the run: a failing row never
//!   hides the rows after it;
//! - one row runs alone by its name, and one table by its file, with cargo's usual filter:
//!   `cargo test -p gpushare --lib host::tests::rollback::the_final_save_fails_the_daemon_is_stopped_no_record`
//!   or `cargo test -p gpushare --lib host::tests::gc_rows::` (`-- --list` lists the names).
//!
//! Files: `world` (the state directory, policy and fakes a row runs in, and the plans it
//! acquires), `rows` (the row types and how one runs), one file per table (`acquire_mps`,
//! `mode_conflicts`, `rollback`, `releasing`, `gc_rows`, `reservation_rows`),
//! `control_contract` (what every MPS control keeps, on the fake and on the real one),
//! `many_clients` (an acquire on a GPU with many clients reads only the record's header) and
//! `memory_caps` (memory caps: admission and the driver backend's limits).

/// A table: one `#[test]` per row, named by the identifier before it, which runs the row with
/// the runner named first.
///
/// ```ignore
/// rows! {
///     run_acquire_row;
///     two_gpus_a_daemon_on_each: AcquireRow { what: "two GPUs: a daemon on each", .. },
/// }
/// ```
macro_rules! rows {
    ($run:path; $($name:ident: $row:expr),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $run($row);
            }
        )+
    };
}

mod rows;
mod world;

/// Held by each test that loads the TEST-ONLY simulated driver into this process: a load's first
/// call reads the environment, which such a test sets.
pub(crate) static SIMULATED_NVML: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The TEST-ONLY simulated driver, copied to `to` (a library of its own inode, so that no other
/// test's load keeps it loaded, and its environment is read afresh): `GPUSHARE_TEST_CDYLIBS`,
/// or the workspace's debug build.
pub(crate) fn simulated_nvml_at(to: &std::path::Path) -> String {
    let built = std::env::var_os("GPUSHARE_TEST_CDYLIBS")
        .map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug"),
            std::path::PathBuf::from,
        )
        .join("libgpushare_simdriver.so");
    assert!(
        built.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        built.display()
    );
    std::fs::copy(&built, to).unwrap();
    to.to_string_lossy().into_owned()
}

/// The mount point of the cgroup v2 hierarchy's root, for `what`, which needs it (and root):
/// `None` (SKIPPED, said loudly; a failure under CI) where there is none.
pub(crate) fn cgroup2_root(what: &str) -> Option<std::path::PathBuf> {
    if !can_mount(what) {
        return None;
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = crate::host::mounts::entries(&mountinfo)
        .find(|e| e.fstype == "cgroup2" && e.root == std::path::Path::new("/"))
        .map(|e| e.mount_point);
    if root.is_none() {
        assert!(std::env::var_os("CI").is_none(), "no cgroup2 mount here");
        eprintln!("SKIPPED: {what}: no cgroup2 mount here");
    }
    root
}

/// A child cgroup v2 of a test's own, `gpushare-<what>-test-<pid>` under the hierarchy's root:
/// dropped, it kills what is still in it (only the test's own processes are put there) and is
/// removed.
pub(crate) struct OwnCgroup {
    pub(crate) dir: std::path::PathBuf,
    /// Its path in the unified hierarchy, as `/proc/<pid>/cgroup` says it (`/<name>`).
    pub(crate) unified: String,
}

impl OwnCgroup {
    /// Made for `test` (its description, said when it is SKIPPED); `None` where
    /// [`cgroup2_root`] finds no hierarchy.
    pub(crate) fn new(test: &str, what: &str) -> Option<Self> {
        let root = cgroup2_root(test)?;
        let name = format!("gpushare-{what}-test-{}", std::process::id());
        let dir = root.join(&name);
        std::fs::create_dir(&dir).unwrap();
        Some(Self {
            dir,
            unified: format!("/{name}"),
        })
    }
}

impl Drop for OwnCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs"));
        for pid in procs.iter().flat_map(|p| p.lines()) {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// The path of process `pid` in the unified hierarchy (the `0::` line of `/proc/<pid>/cgroup`).
pub(crate) fn unified_cgroup(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
}

/// Whether this process may mount (root): `what` needs it, and under CI it must.
pub(crate) fn can_mount(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what} need root to mount, and CI=true"
    );
    eprintln!("SKIPPED: {what} need root to mount");
    false
}

/// Removes an MPS domain's directories (and detaches their tmpfs) when dropped, so that a
/// failing check leaves nothing mounted.
pub(crate) struct RemoveOnDrop<'a>(pub(crate) &'a crate::host::mps::MpsDirs);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// Plants a FIFO at `path` and calls `f` on another thread: its answer if it returns within
/// 5 s, else `None` (a call that opened the FIFO for reading waits for a writer; one is then
/// opened, so that the call and its thread go).
pub(crate) fn beside_a_fifo<T: Send + 'static>(
    path: &std::path::Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    let got = rx.recv_timeout(std::time::Duration::from_secs(5)).ok();
    if got.is_none() {
        let _ = std::fs::OpenOptions::new().write(true).open(path);
    }
    got
}

/// A process (this test's own child) in a mount namespace of its own, with `dir` bound
/// at `at` in it; killed and reaped when dropped.
pub(crate) struct Binder(pub(crate) std::process::Child);

impl Binder {
    pub(crate) fn start(dir: &std::path::Path, at: &std::path::Path) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$0" "$1" && echo bound && exec sleep 60"#)
            .arg(dir)
            .arg(at)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "bound", "the bind in the new namespace");
        Self(child)
    }
}

impl Drop for Binder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a closure logs, as the node log would show it (no colours).
pub(crate) fn logged(f: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buf.0.lock().unwrap().clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

mod acquire_mps;
mod control_contract;
mod gc_rows;
mod many_clients;
mod memory_caps;
mod mode_conflicts;
mod releasing;
mod reservation_rows;
mod rollback;
