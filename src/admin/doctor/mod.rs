//! `gpushare-hook doctor`: read-only checks of everything gpushare depends on on this node:
//! the policy file, NVML and each GPU's compute mode against the daemons that serve it, the MPS
//! binaries, the state dir (writable, on a writable filesystem), the binaries the engines will
//! execute, and each engine's own files, parsed.

mod probes;

use std::path::Path;

use serde::Serialize;

use crate::config::{Config, ConfigError, Source};
use crate::host::inventory::NvmlInventory;
use crate::host::mps::find_binary;
use crate::vocab::{ComputeMode, Inventory};

pub use crate::admin::engines::check::{check, Check, Verdict};

/// The `gpushare-runtime` of this installation: the one next to this `gpushare-hook`, else the
/// one on `$PATH`. (`[runtime] hook` says what containers' hooks run, which may be a wrapper
/// elsewhere; the engines' own entries are checked with each engine.)
fn runtime_binary() -> std::path::PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .map(|p| p.with_file_name("gpushare-runtime"))
        .filter(|p| p.is_file());
    beside
        .or_else(|| crate::admin::engines::check::find_tool("gpushare-runtime"))
        .unwrap_or_else(|| "/usr/bin/gpushare-runtime".into())
}

/// The policy-file check for a policy that loaded.
pub fn config_ok(source: &Source) -> Check {
    check("config", Verdict::Ok, source.to_string())
}

/// The policy-file check for a policy that did not load: the error and the parser's own
/// diagnostic; the other checks then run with the defaults.
pub fn config_failed(source: &Source, e: &ConfigError) -> Check {
    let mut detail = format!(
        "{}: {} (the other checks use what could be read of it and the defaults for the rest); fix the file, then run `gpushare-hook doctor` again",
        source,
        crate::vocab::chain(e)
    );
    if let Some(d) = e.diagnostic() {
        detail.push('\n');
        detail.push_str(d);
    }
    check("config", Verdict::Fail, detail)
}

/// Runs every check. Changes nothing (probes it creates are removed). For a policy file that
/// did not load, `cfg` is what could be read of it ([`crate::config::salvage`]).
pub fn run(cfg: &Config, config: Check) -> Checks {
    let mut out = vec![config];
    let inv = NvmlInventory::open(&cfg.nvml.library);
    match &inv {
        Ok(inv) => gpu_checks(cfg, inv, &mut out),
        Err(e) => out.push(check("nvml", Verdict::Fail, crate::vocab::chain(e))),
    }
    let allowed = |m| cfg.policy.modes.contains(&m);
    let need = |m| {
        if allowed(m) {
            Verdict::Fail
        } else {
            Verdict::Warn
        }
    };
    out.push(probes::mps_control(
        &cfg.mps.control,
        need(crate::vocab::Mode::Mps),
    ));
    let server = Path::new(&cfg.mps.control)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| p.join("nvidia-cuda-mps-server").display().to_string())
        .unwrap_or_else(|| "nvidia-cuda-mps-server".into());
    out.push(binary_check(
        "mps server",
        &server,
        Verdict::Warn,
        "needed to run CUDA clients under MPS",
    ));
    out.push(probes::nvidia_smi(&cfg.timeslice.smi, Verdict::Warn));
    out.push(probes::limiter(
        &cfg.limit.library,
        need(crate::vocab::Mode::Limit),
    ));
    out.push(state_dir_check(&cfg.state_dir));
    out.push(probes::log_file(&cfg.log_file));
    out.push(
        match caps::has_cap(
            None,
            caps::CapSet::Effective,
            caps::Capability::CAP_SYS_ADMIN,
        ) {
            Ok(true) => check("privileges", Verdict::Ok, "CAP_SYS_ADMIN"),
            _ => check(
                "privileges",
                Verdict::Warn,
                "no CAP_SYS_ADMIN here; the hook needs it when runtimes run it",
            ),
        },
    );
    out.push(crate::admin::engines::check::executable_check(
        "hook",
        &cfg.runtime.hook,
        &["version"],
        "[runtime] hook; the spec edit puts it into containers' hooks",
    ));
    let runtime = runtime_binary();
    // Its own version line comes first; the next runtime's answer follows and is the next
    // check's, so that a missing runc is reported once.
    out.push(crate::admin::engines::check::executable_check_by(
        "runtime",
        &runtime,
        &["--version"],
        "gpushare-runtime of this installation, next to this gpushare-hook",
        |o| o.stdout.starts_with(b"gpushare-runtime version "),
    ));
    out.push(match probes::next_runtime(&cfg.runtime.next, &runtime) {
        Ok(p) => crate::admin::engines::check::executable_check(
            "next runtime",
            &p,
            &["--version"],
            "[runtime] next, found on this $PATH as gpushare-runtime finds it",
        ),
        Err(e) => check(
            "next runtime",
            Verdict::Fail,
            format!("{e} (looked up on this $PATH as gpushare-runtime does; it uses its engine's)"),
        ),
    });
    out.extend(crate::admin::engines::doctor());
    Checks(out)
}

/// Whether `[nvml] library` is gpushare's TEST-ONLY simulated driver: its file name, or the
/// UUIDs it gives its GPUs (`GPU-5a1e0000-0000-4000-8000-…`, whatever the file is called).
fn simulated(library: &str, uuids: &[&str]) -> bool {
    let named = Path::new(library)
        .file_name()
        .is_some_and(|f| f.to_string_lossy().starts_with("libgpushare_simdriver"));
    named
        || (!uuids.is_empty()
            && uuids
                .iter()
                .all(|u| u.starts_with("GPU-5a1e0000-0000-4000-8000-")))
}

/// NVML, and per GPU: its compute mode and size, against the daemons and clients the state
/// records. EXCLUSIVE_PROCESS without a live daemon of ours keeps every other CUDA program out
/// ("all CUDA-capable devices are busy"); a dead daemon with live clients leaves them stuck.
fn gpu_checks(cfg: &Config, inv: &NvmlInventory, out: &mut Vec<Check>) {
    let gpus = match inv.gpus() {
        Ok(g) if g.is_empty() => {
            out.push(check(
                "nvml",
                Verdict::Fail,
                format!("{}: no GPU found", cfg.nvml.library),
            ));
            return;
        }
        Ok(g) => g,
        Err(e) => {
            out.push(check("nvml", Verdict::Fail, crate::vocab::chain(&e)));
            return;
        }
    };
    out.push(check(
        "nvml",
        Verdict::Ok,
        format!("{}: {} GPU(s)", cfg.nvml.library, gpus.len()),
    ));
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    if simulated(&cfg.nvml.library, &uuids) {
        out.push(check(
            "driver",
            Verdict::Warn,
            format!("TEST-ONLY: {} is gpushare's simulated driver ([nvml] library): its GPUs do not exist and no CUDA program runs on them; for trying gpushare and for its tests, never for production (GPUSHARE_SIM_* settings: docs/testing.md)", cfg.nvml.library),
        ));
    }
    out.push(memory_cap_check(cfg, inv, gpus[0].index));
    let status = crate::admin::status::status(cfg, Some(inv));
    for g in gpus {
        let name = format!("gpu {}", g.index);
        let mode = match inv.compute_mode(g.index) {
            Ok(m) => m,
            Err(e) => {
                out.push(check(
                    &name,
                    Verdict::Warn,
                    format!("{}: {}", g.uuid, crate::vocab::chain(&e)),
                ));
                continue;
            }
        };
        let size = inv
            .memory_total(g.index)
            .map(|b| format!(", {}", crate::vocab::size::human(b)))
            .unwrap_or_default();
        let rec = status.gpus.iter().find(|s| s.uuid == g.uuid);
        let live = |ids: &[String]| {
            rec.map_or(0, |r| {
                r.clients
                    .iter()
                    .filter(|c| c.alive && ids.contains(&c.id))
                    .count()
            })
        };
        let domains = rec.map_or(&[][..], |r| r.domains.as_slice());
        let running: Vec<i32> = domains
            .iter()
            .filter_map(|d| d.daemon.as_ref())
            .filter(|d| d.alive)
            .map(|d| d.pid)
            .collect();
        let dead_in_use = domains.iter().find_map(|d| {
            let dm = d.daemon.as_ref().filter(|dm| !dm.alive)?;
            let n = live(&d.clients);
            (n > 0).then(|| (d.key.clone(), dm.pid, n))
        });
        let clients = rec.map_or(0, |r| r.clients.iter().filter(|c| c.alive).count());
        let (v, d) = match (mode, dead_in_use) {
            (_, Some((key, pid, n))) => (
                Verdict::Fail,
                format!(
                    "{}: MPS daemon pid {pid} (domain {key}) is dead while {n} client(s) live; their CUDA calls fail. Restart those containers, or run `gpushare-hook gc`",
                    g.uuid
                ),
            ),
            (ComputeMode::ExclusiveProcess, None) if running.is_empty() => (
                Verdict::Fail,
                format!(
                    "{}: compute mode EXCLUSIVE_PROCESS with no gpushare MPS daemon: CUDA programs get \"all CUDA-capable devices are busy\". Run `gpushare-hook gc`, or `nvidia-smi -i {} -c DEFAULT`",
                    g.uuid, g.index
                ),
            ),
            (m, None) if !running.is_empty() => (
                Verdict::Ok,
                format!(
                    "{} compute mode {m}{size}; MPS daemon pid(s) {running:?}, {clients} live client(s)",
                    g.uuid
                ),
            ),
            (m, None) => (Verdict::Ok, format!("{} compute mode {m}{size}", g.uuid)),
        };
        out.push(check(&name, v, d));
    }
}

/// Which backend enforces containers' memory caps on this node, and the admission policy.
fn memory_cap_check(cfg: &Config, inv: &NvmlInventory, first_gpu: u32) -> Check {
    let policy = format!(
        "admission: caps add up to at most {} x each GPU's memory, an uncapped share {}",
        cfg.policy.memory_overcommit,
        match cfg.policy.uncapped {
            crate::vocab::memcap::Uncapped::Share =>
                "reserves nothing (uncapped: no guarantee, only caps are counted)",
            crate::vocab::memcap::Uncapped::WholeGpu => "counts as the whole GPU",
            crate::vocab::memcap::Uncapped::Refuse => "is refused",
        }
    );
    let limiter_ok = cfg.limit.library.is_file();
    let unified = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|mi| crate::host::cgroup::unified_dir(&mi, "/"));
    let driver = match (inv.has_memory_limits(first_gpu), &unified) {
        (false, _) => Err(
            "NVML does not export nvmlDeviceSetMemoryLimits_v1 (driver r615 or later has it)"
                .to_owned(),
        ),
        (true, None) => {
            Err("no cgroup v2 hierarchy is mounted; the driver's limits need cgroup v2".to_owned())
        }
        (true, Some(root)) => inv
            .memory_limits(first_gpu, &root.display().to_string())
            .map(|_| root.display().to_string())
            .map_err(|e| {
                format!(
                    "the driver does not take limits on {}: {}",
                    root.display(),
                    crate::vocab::chain(&e)
                )
            }),
    };
    match (driver, limiter_ok) {
        (Ok(root), _) => check(
            "memory caps",
            Verdict::Ok,
            format!("driver: NVML's cgroup memory limits on {root}, set on each container's own cgroup; {policy}"),
        ),
        (Err(why), true) => check(
            "memory caps",
            Verdict::Ok,
            format!("limiter (cooperative: a process that drops the preload escapes it): {why}; {policy}"),
        ),
        (Err(why), false) => check(
            "memory caps",
            Verdict::Fail,
            format!(
                "no backend: {why}, and the limiter {} is missing, so every request with gpu.share.memory is refused; install it or set [limit] library; {policy}",
                cfg.limit.library.display()
            ),
        ),
    }
}

fn binary_check(name: &str, bin: &str, missing: Verdict, what: &str) -> Check {
    match find_binary(bin) {
        Some(p) => check(name, Verdict::Ok, p.display().to_string()),
        None => check(name, missing, format!("{bin} not found; {what}")),
    }
}

/// The state dir: 0700 and writable when it exists; else its nearest existing parent must let
/// it be made. Both on a filesystem mounted read-write.
fn state_dir_check(dir: &Path) -> Check {
    use std::os::unix::fs::MetadataExt;
    let name = "state dir";
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if let Ok(st) = nix::sys::statvfs::statvfs(existing) {
        if st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
            return check(
                name,
                Verdict::Fail,
                format!(
                    "{} is on a read-only filesystem ({} is); set state_dir to a writable tmpfs such as /run/gpushare",
                    dir.display(),
                    existing.display()
                ),
            );
        }
    }
    let writable = |p: &Path| {
        nix::unistd::access(
            p,
            nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
        )
        .is_ok()
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.mode() & 0o077 != 0 => check(
            name,
            Verdict::Fail,
            format!(
                "{} has mode {:o}; make it 0700",
                dir.display(),
                m.mode() & 0o777
            ),
        ),
        Ok(m) if m.is_dir() && !writable(dir) => check(
            name,
            Verdict::Fail,
            format!(
                "{} is not writable by uid {}; the hooks run as root",
                dir.display(),
                nix::unistd::geteuid()
            ),
        ),
        Ok(m) if m.is_dir() => match probes::state_dir(dir) {
            Ok(_) => check(
                name,
                Verdict::Ok,
                format!(
                    "{} (0700; a probe was created there and removed)",
                    dir.display()
                ),
            ),
            Err(e) => check(name, Verdict::Fail, e),
        },
        Ok(_) => check(
            name,
            Verdict::Fail,
            format!("{} is not a directory", dir.display()),
        ),
        Err(_) if !writable(existing) => check(
            name,
            Verdict::Fail,
            format!(
                "{} does not exist and {} is not writable; it cannot be created",
                dir.display(),
                existing.display()
            ),
        ),
        Err(_) => match probes::state_dir(dir) {
            Ok(_) => check(
                name,
                Verdict::Ok,
                format!(
                    "{} (created on first use; a probe was created there and removed)",
                    dir.display()
                ),
            ),
            Err(e) => check(
                name,
                Verdict::Fail,
                format!(
                    "{e}; set state_dir to a directory on a writable tmpfs such as /run/gpushare"
                ),
            ),
        },
    }
}

/// The whole `doctor` answer: the checks, in order (JSON: an array).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct Checks(pub Vec<Check>);

impl Checks {
    /// Whether any check failed (the command then exits 1).
    pub fn failed(&self) -> bool {
        self.0.iter().any(|c| c.verdict == Verdict::Fail)
    }
}

impl super::report::Report for Checks {
    fn human(&self) -> String {
        human(&self.0)
    }
}

/// Human rendering, one line per check (a multi-line detail indented under it).
pub fn human(checks: &[Check]) -> String {
    checks
        .iter()
        .map(|c| {
            let v = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            let mut lines = c.detail.lines();
            let mut s = format!("{v}  {:<20} {}\n", c.name, lines.next().unwrap_or(""));
            for l in lines {
                s.push_str(&format!("      {l}\n"));
            }
            s
        })
        .collect()
}
