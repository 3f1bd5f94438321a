//! `gpushare-hook doctor`: read-only checks of everything gpushare depends on on this node.

use std::path::Path;

use serde::Serialize;

use crate::config::Config;
use crate::host::inventory::NvmlInventory;
use crate::host::mps::find_binary;
use crate::vocab::Inventory;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub detail: String,
}

fn check(name: &str, verdict: Verdict, detail: impl Into<String>) -> Check {
    Check {
        name: name.to_owned(),
        verdict,
        detail: detail.into(),
    }
}

/// Runs every check. Changes nothing.
pub fn run(cfg: &Config, config_source: &str) -> Checks {
    let mut out = vec![check("config", Verdict::Ok, config_source)];
    match NvmlInventory::open(&cfg.nvml.library) {
        Ok(inv) => match inv.gpus() {
            Ok(gpus) if gpus.is_empty() => out.push(check(
                "nvml",
                Verdict::Fail,
                format!("{}: no GPU found", cfg.nvml.library),
            )),
            Ok(gpus) => {
                out.push(check(
                    "nvml",
                    Verdict::Ok,
                    format!("{}: {} GPU(s)", cfg.nvml.library, gpus.len()),
                ));
                for g in gpus {
                    let (v, d) = match inv.compute_mode(g.index) {
                        Ok(m) => (Verdict::Ok, format!("{} compute mode {m}", g.uuid)),
                        Err(e) => (
                            Verdict::Warn,
                            format!("{}: {}", g.uuid, crate::vocab::chain(&e)),
                        ),
                    };
                    out.push(check(&format!("gpu {}", g.index), v, d));
                }
            }
            Err(e) => out.push(check("nvml", Verdict::Fail, crate::vocab::chain(&e))),
        },
        Err(e) => out.push(check("nvml", Verdict::Fail, crate::vocab::chain(&e))),
    }
    let allowed = |m| cfg.policy.modes.contains(&m);
    let need_mps = if allowed(crate::vocab::Mode::Mps) {
        Verdict::Fail
    } else {
        Verdict::Warn
    };
    out.push(binary_check(
        "mps control",
        &cfg.mps.control,
        need_mps,
        "install nvidia-cuda-mps",
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
    out.push(binary_check(
        "nvidia-smi",
        &cfg.timeslice.smi,
        Verdict::Warn,
        "needed for gpu.share.timeslice",
    ));
    let lim = &cfg.limit.library;
    out.push(if lim.is_file() {
        check("limiter", Verdict::Ok, lim.display().to_string())
    } else {
        let v = if allowed(crate::vocab::Mode::Limit) {
            Verdict::Fail
        } else {
            Verdict::Warn
        };
        check(
            "limiter",
            v,
            format!("{} missing; limit mode cannot work", lim.display()),
        )
    });
    out.push(state_dir_check(&cfg.state_dir));
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
    let runtime = cfg.runtime.next.iter().find_map(|n| find_binary(n));
    out.push(match runtime {
        Some(p) => check("next runtime", Verdict::Ok, p.display().to_string()),
        None => check(
            "next runtime",
            Verdict::Warn,
            format!(
                "none of {:?} found; gpushare-runtime cannot exec",
                cfg.runtime.next
            ),
        ),
    });
    out.extend(engine_checks());
    Checks(out)
}

fn binary_check(name: &str, bin: &str, missing: Verdict, what: &str) -> Check {
    match find_binary(bin) {
        Some(p) => check(name, Verdict::Ok, p.display().to_string()),
        None => check(name, missing, format!("{bin} not found; {what}")),
    }
}

fn state_dir_check(dir: &Path) -> Check {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.mode() & 0o077 == 0 => check(
            "state dir",
            Verdict::Ok,
            format!("{} (0700)", dir.display()),
        ),
        Ok(m) if m.is_dir() => check(
            "state dir",
            Verdict::Fail,
            format!(
                "{} has mode {:o}; make it 0700",
                dir.display(),
                m.mode() & 0o777
            ),
        ),
        Ok(_) => check(
            "state dir",
            Verdict::Fail,
            format!("{} is not a directory", dir.display()),
        ),
        Err(_) => check(
            "state dir",
            Verdict::Ok,
            format!("{} (created on first use)", dir.display()),
        ),
    }
}

/// Which engines have gpushare wired in, from their usual configuration files.
fn engine_checks() -> Vec<Check> {
    let contains = |paths: &[&str], needle: &str| {
        paths.iter().any(|p| {
            if Path::new(p).is_dir() {
                std::fs::read_dir(p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(needle)))
            } else {
                std::fs::read_to_string(p).is_ok_and(|t| t.contains(needle))
            }
        })
    };
    let rows: [(&str, &[&str], &str); 4] = [
        (
            "podman/cri-o hooks",
            &[
                "/usr/share/containers/oci/hooks.d",
                "/etc/containers/oci/hooks.d",
            ],
            "gpushare-hook",
        ),
        ("docker", &["/etc/docker/daemon.json"], "gpushare"),
        ("containerd", &["/etc/containerd/config.toml"], "gpushare"),
        (
            "cri-o runtime",
            &["/etc/crio/crio.conf", "/etc/crio/crio.conf.d"],
            "gpushare",
        ),
    ];
    rows.iter()
        .map(|(name, paths, needle)| {
            if contains(paths, needle) {
                check(name, Verdict::Ok, "configured")
            } else {
                check(
                    name,
                    Verdict::Warn,
                    "not configured (gpushare-hook configure shows how)",
                )
            }
        })
        .collect()
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

/// Human rendering, one line per check.
pub fn human(checks: &[Check]) -> String {
    checks
        .iter()
        .map(|c| {
            let v = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            format!("{v}  {:<20} {}\n", c.name, c.detail)
        })
        .collect()
}
