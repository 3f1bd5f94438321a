//! `gpushare-hook status`: GPUs, modes, daemons, clients and limits, from a lock-free snapshot
//! of the state.

use serde::Serialize;

use crate::config::Config;
use std::collections::HashMap;

use crate::host::mps::{Control, MpsError, Settings};
use crate::host::procinfo::ProcId;
use crate::host::state::StateDir;
use crate::vocab::Inventory;
use crate::vocab::{Isolation, Limits, Mode};

use super::report::Report;

/// One client in `status`.
#[derive(Debug, Serialize)]
pub struct ClientStatus {
    pub id: String,
    pub mode: Mode,
    /// `mps`: its isolation domain.
    pub domain: Option<String>,
    pub pid: Option<i32>,
    pub alive: bool,
    pub cores: u8,
    pub memory: Option<u64>,
    /// Its memory cap for the whole container: bytes, what enforces it, and its use now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<CapStatus>,
}

/// A container's memory cap in `status`.
#[derive(Debug, Serialize)]
pub struct CapStatus {
    pub bytes: u64,
    pub backend: crate::vocab::memcap::Backend,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Why the driver does not enforce it (limiter backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Device memory the container uses now: NVML's `currentUsed` of its cgroup (driver), or
    /// the limiter's account (limiter); `None` when neither could be read.
    pub used: Option<u64>,
    /// Why the cap is not enforced as recorded (the driver's limit on the cgroup is not the
    /// cap, or cannot be read). Absent when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_enforced: Option<String>,
}

/// A client's cap with its current use.
fn cap_status(
    sd: &StateDir,
    inventory: Option<&dyn Inventory>,
    index: u32,
    uuid: &str,
    id: &str,
    cap: &crate::host::state::Cap,
) -> CapStatus {
    let e = &cap.enforcement;
    let (used, not_enforced) = match (&e.backend, &e.cgroup) {
        (crate::vocab::memcap::Backend::Driver, Some(cg)) => {
            match inventory.map(|i| i.memory_limits(index, cg)) {
                Some(Ok(l)) if l.hard == cap.bytes => (Some(l.used), None),
                Some(Ok(l)) => (
                    Some(l.used),
                    Some(format!(
                        "the driver's limit on {cg} is {}, not the cap",
                        if l.hard == crate::vocab::memcap::LIMIT_MAX {
                            "none".to_owned()
                        } else {
                            crate::vocab::size::human(l.hard)
                        }
                    )),
                ),
                Some(Err(err)) => (
                    None,
                    Some(format!(
                        "the driver's limit on {cg} cannot be read: {}",
                        crate::vocab::chain(&err)
                    )),
                ),
                None => (None, None),
            }
        }
        _ => (
            crate::host::account::used_on(&crate::host::account::region_path(sd, id), uuid),
            None,
        ),
    };
    CapStatus {
        bytes: cap.bytes,
        backend: e.backend,
        cgroup: e.cgroup.clone(),
        why: e.why.clone(),
        used,
        not_enforced,
    }
}

/// One MPS daemon in `status`.
#[derive(Debug, Serialize)]
pub struct DaemonStatus {
    pub pid: i32,
    pub alive: bool,
    pub answers: bool,
    pub pipe: String,
    /// The daemon's log (capped; see [`crate::host::mps::dirs::LOG_TMPFS_OPTIONS`]).
    pub log: String,
}

/// One MPS server of a domain's daemon in `status`.
#[derive(Debug, Clone, Serialize)]
pub struct ServerStatus {
    pub pid: u32,
    /// Its active thread percentage and pinned memory limit now.
    pub current: Limits,
}

/// One MPS isolation domain in `status`.
#[derive(Debug, Serialize)]
pub struct DomainStatus {
    pub key: String,
    pub daemon: Option<DaemonStatus>,
    /// The limits gpushare set as the daemon's defaults: what it enforces.
    pub enforced: Limits,
    /// The daemon's defaults as it reports them now.
    pub current: Option<Limits>,
    /// The daemon's default client priority as it reports it now (gpushare keeps
    /// [`crate::host::mps::CLIENT_PRIORITY`]).
    pub current_priority: Option<u32>,
    /// The MPS servers the daemon runs (one per uid with clients; only with a GPU), with the
    /// limits each has now; one that differs from `enforced` is drift too.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerStatus>,
    /// The daemon's defaults or client priority differ from what gpushare set (a tenant
    /// changed them); `serve`'s next healing pass, or the next acquire in the domain, puts
    /// them back.
    pub drift: bool,
    /// Why the domain counts as tampered with: its control socket is held by another process
    /// than the daemon gpushare started (which the next acquire or `gc` restarts in an
    /// emptied pipe directory). Absent when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tampered: Option<String>,
    pub clients: Vec<String>,
    pub reserved: Vec<String>,
}

/// One GPU in `status`.
#[derive(Debug, Serialize)]
pub struct GpuStatus {
    pub uuid: String,
    pub index: u32,
    pub mode: Option<Mode>,
    pub compute_mode: Option<String>,
    /// The compute mode gpushare puts back when its last daemon on the GPU stops.
    pub restore_compute_mode: Option<String>,
    pub domains: Vec<DomainStatus>,
    pub clients: Vec<ClientStatus>,
    /// The GPU's memory as admission counts it (when NVML reports its size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
    pub error: Option<String>,
}

/// A GPU's memory as admission counts it.
#[derive(Debug, Serialize)]
pub struct MemoryStatus {
    pub total: u64,
    /// The caps of its shares added up (an uncapped one counted as `[policy] uncapped` says:
    /// nothing by default).
    pub committed: u64,
    /// What the caps may add up to: `[policy] memory_overcommit` times `total`.
    pub allowed: u64,
}

/// The whole `status` answer.
#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub state_dir: String,
    pub isolation: Isolation,
    /// Why the state dir cannot be read (then `gpus` says nothing about the node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub gpus: Vec<GpuStatus>,
    /// The named requests CDI devices offer, checked against the policy.
    pub profiles: Vec<crate::admin::cdi::ProfileStatus>,
}

/// What each live daemon gpushare recorded says, keyed by (GPU uuid, domain key).
type Answers = HashMap<(String, String), Result<Asked, MpsError>>;

/// What one daemon said: its defaults and client priority, and the limits of each server it
/// runs.
type Asked = (Settings, Vec<ServerStatus>);

/// Most daemons asked at once (each conversation is over within its own deadline).
const ASK_AT_ONCE: usize = 64;

/// Asks every live daemon the records name for its settings, all at once: `status` takes about
/// one daemon's deadline however many of them do not answer. Asked only of the daemon gpushare
/// started, proven on the socket; nothing is asked when the control binary is missing.
fn ask_daemons(
    cfg: &Config,
    sd: &StateDir,
    records: &[(
        String,
        Result<crate::host::state::Record, crate::host::state::StateError>,
    )],
) -> Answers {
    if Control::new(&cfg.mps.control).is_err() {
        return Answers::new();
    }
    let asks: Vec<((String, String), std::path::PathBuf, ProcId)> = records
        .iter()
        .filter_map(|(uuid, rec)| Some((uuid, rec.as_ref().ok()?)))
        .flat_map(|(uuid, rec)| {
            rec.domains.iter().filter_map(move |(key, d)| {
                let dm = d.daemon.as_ref().filter(|dm| dm.process.is_alive())?;
                Some((
                    (uuid.clone(), key.clone()),
                    sd.mps_dirs(uuid, key).pipe,
                    dm.process,
                ))
            })
        })
        .collect();
    let mut answers = Answers::new();
    for chunk in asks.chunks(ASK_AT_ONCE) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(k, pipe, p)| {
                    let ask = move || {
                        let settings = crate::host::mps::settings(pipe, *p)?;
                        let servers = crate::host::mps::server_limits(pipe, *p)
                            .into_iter()
                            .map(|(pid, current)| ServerStatus { pid, current })
                            .collect();
                        Ok((settings, servers))
                    };
                    (k, scope.spawn(ask))
                })
                .collect();
            for (k, h) in handles {
                if let Ok(r) = h.join() {
                    answers.insert(k.clone(), r);
                }
            }
        });
    }
    answers
}

/// Why the state dir cannot be read, if it cannot (a missing one is fine: nothing is shared).
pub fn unreadable(cfg: &Config) -> Option<String> {
    let sd = StateDir::new(&cfg.state_dir);
    for dir in [sd.root().to_owned(), sd.gpus_dir()] {
        match std::fs::read_dir(&dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                    format!(
                        "; it is private to root (0700): run as root, e.g. sudo gpushare-hook (uid here: {})",
                        nix::unistd::geteuid()
                    )
                } else {
                    String::new()
                };
                return Some(format!(
                    "cannot read the state dir {}: {e}{hint}",
                    dir.display()
                ));
            }
        }
    }
    None
}

/// Reads the state (without locks: a snapshot) and asks NVML for compute modes when given.
pub fn status(cfg: &Config, inventory: Option<&dyn Inventory>) -> Status {
    let sd = StateDir::new(&cfg.state_dir);
    if let Some(error) = unreadable(cfg) {
        return Status {
            version: crate::VERSION,
            state_dir: cfg.state_dir.display().to_string(),
            isolation: cfg.mps.isolation,
            error: Some(error),
            gpus: Vec::new(),
            profiles: crate::admin::cdi::profiles(cfg),
        };
    }
    let records = sd.list_records();
    let answers = ask_daemons(cfg, &sd, &records);
    let mut gpus = Vec::new();
    for (uuid, rec) in records {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                gpus.push(GpuStatus {
                    uuid,
                    index: 0,
                    mode: None,
                    compute_mode: None,
                    restore_compute_mode: None,
                    domains: Vec::new(),
                    clients: Vec::new(),
                    memory: None,
                    error: Some(crate::vocab::chain(&e)),
                });
                continue;
            }
        };
        let domains = rec
            .domains
            .iter()
            .map(|(key, d)| {
                let dirs = sd.mps_dirs(&uuid, key);
                let asked = answers.get(&(uuid.clone(), key.clone()));
                let settings = asked.and_then(|r| r.as_ref().ok()).map(|a| a.0);
                let servers = asked
                    .and_then(|r| r.as_ref().ok())
                    .map(|a| a.1.clone())
                    .unwrap_or_default();
                let current = settings.map(|s| s.limits);
                let current_priority = settings.map(|s| s.priority);
                let tampered = match asked {
                    Some(Err(e)) if e.is_tampered() => Some(crate::vocab::chain(e)),
                    _ => None,
                };
                DomainStatus {
                    key: key.clone(),
                    daemon: d.daemon.as_ref().map(|dm| DaemonStatus {
                        pid: dm.process.pid,
                        alive: dm.process.is_alive(),
                        answers: current.is_some(),
                        pipe: dirs.pipe.display().to_string(),
                        log: dirs.log.join("control.log").display().to_string(),
                    }),
                    enforced: d.limits,
                    drift: settings.is_some_and(|s| {
                        s.limits != d.limits || s.priority != crate::host::mps::CLIENT_PRIORITY
                    }) || servers.iter().any(|v| v.current != d.limits),
                    servers,
                    tampered,
                    current,
                    current_priority,
                    clients: rec.domain_clients(key),
                    reserved: d.reserved.keys().cloned().collect(),
                }
            })
            .collect();
        gpus.push(GpuStatus {
            mode: rec.serving(),
            compute_mode: inventory
                .and_then(|i| i.compute_mode(rec.index).ok())
                .map(|m| m.to_string()),
            restore_compute_mode: rec.restore_compute_mode.map(|m| m.to_string()),
            domains,
            clients: rec
                .clients
                .iter()
                .map(|(id, c)| ClientStatus {
                    id: id.clone(),
                    mode: c.mode,
                    domain: c.domain.clone(),
                    pid: c.process.map(|p| p.pid),
                    alive: c.process.is_none_or(|p| p.is_alive()),
                    cores: c.cores,
                    memory: c.memory,
                    cap: c
                        .cap
                        .as_ref()
                        .map(|k| cap_status(&sd, inventory, rec.index, &uuid, id, k)),
                })
                .collect(),
            memory: inventory
                .and_then(|i| i.memory_total(rec.index).ok())
                .map(|total| MemoryStatus {
                    total,
                    committed: crate::decide::admission::committed(
                        total,
                        rec.clients
                            .values()
                            .map(|c| c.cap.as_ref().map(|k| k.bytes)),
                        cfg.policy.uncapped,
                    ),
                    allowed: crate::decide::admission::allowed(total, cfg.policy.memory_overcommit),
                }),
            error: None,
            index: rec.index,
            uuid,
        });
    }
    Status {
        version: crate::VERSION,
        state_dir: cfg.state_dir.display().to_string(),
        isolation: cfg.mps.isolation,
        error: None,
        gpus,
        profiles: crate::admin::cdi::profiles(cfg),
    }
}

impl Report for Status {
    fn human(&self) -> String {
        let mut out = format!("gpushare {}  state {}\n", self.version, self.state_dir);
        if let Some(e) = &self.error {
            out.push_str(&format!("{e}\n"));
            return out;
        }
        out.push_str(&crate::admin::cdi::render_profiles(&self.profiles));
        if self.gpus.is_empty() {
            out.push_str("no GPU is shared\n");
        }
        for g in &self.gpus {
            out.push_str(&format!(
                "GPU {} {}  mode {}  compute {}\n",
                g.index,
                g.uuid,
                g.mode.map_or("-".into(), |m| m.to_string()),
                g.compute_mode.as_deref().unwrap_or("?"),
            ));
            if let Some(e) = &g.error {
                out.push_str(&format!("  error: {e}\n"));
            }
            if let Some(m) = &g.memory {
                out.push_str(&format!(
                    "  memory {} committed of {} allowed ({} on the GPU)\n",
                    crate::vocab::size::human(m.committed),
                    crate::vocab::size::human(m.allowed),
                    crate::vocab::size::human(m.total),
                ));
            }
            for d in &g.domains {
                let daemon = match &d.daemon {
                    Some(dm) => format!(
                        "daemon pid {} {}{}",
                        dm.pid,
                        if dm.alive { "running" } else { "DEAD" },
                        if dm.answers { "" } else { ", not answering" }
                    ),
                    None => "no daemon".into(),
                };
                out.push_str(&format!(
                    "  mps domain {}  {daemon}  enforces {}{}\n",
                    d.key,
                    d.enforced,
                    if d.drift {
                        format!(
                            "  DRIFT: daemon has {}, client priority {} (put back by serve's next healing pass or the next acquire)",
                            d.current.map_or("?".into(), |c| c.to_string()),
                            d.current_priority.map_or("?".into(), |p| p.to_string())
                        )
                    } else {
                        String::new()
                    }
                ));
                for v in d.servers.iter().filter(|v| v.current != d.enforced) {
                    out.push_str(&format!(
                        "    DRIFT: MPS server pid {} has {}\n",
                        v.pid, v.current
                    ));
                }
                if let Some(t) = &d.tampered {
                    out.push_str(&format!(
                        "    TAMPERED: {t}; the next acquire or gc restarts the daemon in an emptied pipe directory\n"
                    ));
                }
            }
            for c in &g.clients {
                out.push_str(&format!(
                    "  client {}  pid {}{}  cores {}%  memory {}\n",
                    c.id,
                    c.pid.map_or("-".into(), |p| p.to_string()),
                    if c.alive { "" } else { " (gone)" },
                    c.cores,
                    c.memory.map_or("-".into(), crate::vocab::size::human),
                ));
                if c.cap.is_none() {
                    out.push_str("    uncapped: reserves no GPU memory, no guarantee\n");
                }
                if let Some(k) = &c.cap {
                    out.push_str(&format!(
                        "    cap {} for the container, enforced by the {}{}  used {}\n",
                        crate::vocab::size::human(k.bytes),
                        k.backend,
                        match (&k.cgroup, &k.why) {
                            (Some(cg), _) => format!(" on {cg}"),
                            (None, Some(why)) => format!(" ({why})"),
                            _ => String::new(),
                        },
                        k.used.map_or("?".into(), crate::vocab::size::human),
                    ));
                    if let Some(why) = &k.not_enforced {
                        out.push_str(&format!("    NOT ENFORCED: {why}\n"));
                    }
                }
            }
        }
        out
    }
}
