//! TEST-ONLY: the simulated r615 (CUDA 13.4) driver-enforced cgroup memory limits
//! (`nvmlDeviceSetMemoryLimits_v1`/`nvmlDeviceGetMemoryLimits_v1`): where they are stored,
//! the call log, and what a limit does to this process's allocations and memory reports.
//!
//! State under `GPUSHARE_SIM_STATE`:
//! - `memlimits.<i>/<st_dev>.<st_ino>`: the limits of one cgroup v2 directory on GPU `i`, keyed
//!   by the directory's identity, so every mount point of one hierarchy names the same entry and
//!   a removed and re-created cgroup starts without limits. Text `soft=<n>\nhard=<n>\n
//!   namespace=<path as given>\n`, written to a temp file in the same directory and renamed.
//!   Clearing (soft 0, hard `u64::MAX`) removes it.
//! - `nvml-memory-limits.log`: one JSON line per call that reached either function, appended
//!   with a single `O_APPEND` write.

use crate::cgroup::{self, DirId};
use crate::config::config;
use crate::state;
use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: a hard limit of "none".
pub const LIMIT_MAX: u64 = u64::MAX;

/// Name of the call log in the state directory.
pub const LOG_NAME: &str = "nvml-memory-limits.log";

/// The limits of one cgroup on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub soft: u64,
    pub hard: u64,
    /// The `nameSpace` path the limit was set through.
    pub namespace: String,
}

/// Whether `soft`/`hard` are the documented "no limit" pair.
pub fn is_clear(soft: u64, hard: u64) -> bool {
    soft == 0 && hard == LIMIT_MAX
}

fn dev_dir(state: &Path, i: usize) -> PathBuf {
    state.join(format!("memlimits.{i}"))
}

fn entry(state: &Path, i: usize, id: DirId) -> PathBuf {
    dev_dir(state, i).join(format!("{}.{}", id.0, id.1))
}

fn encode(l: &Limit) -> String {
    format!(
        "soft={}\nhard={}\nnamespace={}\n",
        l.soft, l.hard, l.namespace
    )
}

fn decode(text: &str) -> Option<Limit> {
    let mut soft = None;
    let mut hard = None;
    let mut namespace = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("soft", v)) => soft = v.parse().ok(),
            Some(("hard", v)) => hard = v.parse().ok(),
            Some(("namespace", v)) => namespace = Some(v.to_owned()),
            _ => {}
        }
    }
    Some(Limit {
        soft: soft?,
        hard: hard?,
        namespace: namespace?,
    })
}

/// Stores (or, for the "no limit" pair, removes) the limits of cgroup `id` on GPU `i`.
///
/// # Errors
/// Any I/O error creating, writing or renaming the entry.
pub fn store(state: &Path, i: usize, id: DirId, l: &Limit) -> std::io::Result<()> {
    let path = entry(state, i, id);
    if is_clear(l.soft, l.hard) {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    fs::create_dir_all(dev_dir(state, i))?;
    crate::state::write_atomic(&path, encode(l).as_bytes())
}

/// The stored limits of cgroup `id` on GPU `i`, if any.
pub fn load(state: &Path, i: usize, id: DirId) -> Option<Limit> {
    decode(&fs::read_to_string(entry(state, i, id)).ok()?)
}

/// Whether any limit entry exists for GPU `i` (the cheap check before any `/proc` reads).
pub fn any(state: &Path, i: usize) -> bool {
    fs::read_dir(dev_dir(state, i)).is_ok_and(|mut d| {
        d.any(|e| e.is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.')))
    })
}

/// Removes the entries of GPU `i` whose directory is gone (its path no longer has the
/// recorded identity): removing a cgroup clears its limits.
pub fn sweep(state: &Path, i: usize) {
    let Ok(entries) = fs::read_dir(dev_dir(state, i)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((dev, ino)) = name.split_once('.') else {
            continue;
        };
        let key = (dev.parse().ok(), ino.parse().ok());
        let Some(l) = fs::read_to_string(e.path()).ok().and_then(|t| decode(&t)) else {
            continue;
        };
        let live = cgroup::dir_id(Path::new(&l.namespace));
        if (live.map(|v| v.0), live.map(|v| v.1)) != key {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Device memory on GPU `i` held by the live simulated processes among `pids`.
pub fn used_by(i: usize, pids: &HashSet<u32>) -> u64 {
    let mut used = 0u64;
    state::for_each_live(|pid, rec| {
        if pids.contains(&pid) {
            used = used.saturating_add(rec.devs[i].mem_used.load(Ordering::Relaxed));
        }
    });
    used
}

/// Device memory on GPU `i` held by the processes of cgroup `dir` and the cgroups below it.
pub fn cgroup_used(i: usize, dir: &Path) -> u64 {
    used_by(i, &cgroup::procs_below(dir).into_iter().collect())
}

/// What the hard limits over this process's cgroup allow on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// The smallest hard limit of this process's cgroup and its ancestors.
    pub total: u64,
    /// The smallest room left under any of them.
    pub headroom: u64,
}

/// The hard limits that apply to this process on GPU `i`; `None` when none does (the usual
/// case, answered without reading `/proc` when GPU `i` has no limit entries at all).
pub fn own_cap(i: usize) -> Option<Cap> {
    if !config().memory_limits {
        return None;
    }
    let state = state::state_dir();
    if !any(&state, i) {
        return None;
    }
    let mut cap: Option<Cap> = None;
    for (dir, id) in cgroup::own_chain() {
        let Some(l) = load(&state, i, id).filter(|l| l.hard != LIMIT_MAX) else {
            continue;
        };
        let room = l.hard.saturating_sub(cgroup_used(i, &dir));
        cap = Some(match cap {
            Some(c) => Cap {
                total: c.total.min(l.hard),
                headroom: c.headroom.min(room),
            },
            None => Cap {
                total: l.hard,
                headroom: room,
            },
        });
    }
    cap
}

/// `(total, free)` of GPU `i` as this process sees it: the device's `total` and `used`, capped
/// by the hard limits of its cgroup (free is also never more than the device has free).
pub fn view(i: usize, total: u64, used: u64) -> (u64, u64) {
    let free = total.saturating_sub(used);
    match own_cap(i) {
        Some(c) => {
            let t = total.min(c.total);
            (t, free.min(c.headroom).min(t))
        }
        None => (total, free),
    }
}

/// Whether `size` more bytes on GPU `i` stay within the hard limits of this process's cgroup.
pub fn fits(i: usize, size: u64) -> bool {
    own_cap(i).is_none_or(|c| size <= c.headroom)
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_owned(), |v| v.to_string())
}

/// One call as the log records it; `None` fields are written as `null`.
#[derive(Debug, Default)]
pub struct Call<'a> {
    /// `"set"` or `"get"`.
    pub call: &'a str,
    pub index: Option<usize>,
    pub namespace: Option<&'a str>,
    pub soft: Option<u64>,
    pub hard: Option<u64>,
    /// `currentUsed` (get only).
    pub used: Option<u64>,
    pub result: u32,
}

impl Call<'_> {
    /// The JSON line (with its newline).
    pub fn line(&self) -> String {
        let mut s = format!(
            "{{\"call\":{},\"index\":{},\"namespace\":{},\"soft\":{},\"hard\":{}",
            json_str(self.call),
            json_opt(self.index),
            self.namespace.map_or_else(|| "null".to_owned(), json_str),
            json_opt(self.soft),
            json_opt(self.hard),
        );
        if self.call == "get" {
            s.push_str(&format!(",\"currentUsed\":{}", json_opt(self.used)));
        }
        s.push_str(&format!(",\"result\":{}}}\n", self.result));
        s
    }
}

/// Appends `call` to the call log with one `O_APPEND` write.
pub fn log(state: &Path, call: &Call) {
    let f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(state.join(LOG_NAME));
    if let Ok(mut f) = f {
        let _ = f.write(call.line().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpushare-sim-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn entries_store_load_clear() {
        let st = tmp("limits-store");
        let l = Limit {
            soft: 1,
            hard: 2 << 30,
            namespace: "/sys/fs/cgroup/a b".into(),
        };
        assert!(!any(&st, 0), "no entries yet");
        store(&st, 0, (7, 9), &l).unwrap();
        assert!(any(&st, 0));
        assert!(!any(&st, 1), "per device");
        assert_eq!(load(&st, 0, (7, 9)), Some(l.clone()));
        assert_eq!(load(&st, 0, (7, 8)), None, "keyed by identity");
        let names: Vec<String> = fs::read_dir(st.join("memlimits.0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["7.9"], "no temp file left");
        let clear = Limit {
            soft: 0,
            hard: LIMIT_MAX,
            ..l
        };
        store(&st, 0, (7, 9), &clear).unwrap();
        assert_eq!(load(&st, 0, (7, 9)), None, "clearing removes the entry");
        assert!(!any(&st, 0));
        store(&st, 0, (7, 9), &clear).unwrap();
        let _ = fs::remove_dir_all(&st);
    }

    #[test]
    fn sweep_drops_entries_of_gone_directories() {
        let st = tmp("limits-sweep");
        let cg = st.join("cg");
        fs::create_dir(&cg).unwrap();
        let id = cgroup::dir_id(&cg).unwrap();
        let l = |ns: &Path| Limit {
            soft: 0,
            hard: 1,
            namespace: ns.display().to_string(),
        };
        store(&st, 0, id, &l(&cg)).unwrap();
        store(&st, 0, (1, 2), &l(&st.join("gone"))).unwrap();
        sweep(&st, 0);
        assert!(load(&st, 0, id).is_some(), "live directory kept");
        assert!(load(&st, 0, (1, 2)).is_none(), "gone directory cleared");
        let _ = fs::remove_dir_all(&st);
    }

    #[test]
    fn decode_rejects_partial_entries() {
        assert_eq!(decode("soft=1\nhard=2\n"), None);
        assert_eq!(decode("soft=x\nhard=2\nnamespace=/a\n"), None);
        assert_eq!(
            decode("soft=1\nhard=2\nnamespace=/a=b\n"),
            Some(Limit {
                soft: 1,
                hard: 2,
                namespace: "/a=b".into()
            })
        );
    }

    #[test]
    fn log_lines() {
        let set = Call {
            call: "set",
            index: Some(0),
            namespace: Some("/sys/fs/cgroup/x\"y"),
            soft: Some(1),
            hard: Some(2),
            result: 0,
            ..Call::default()
        };
        assert_eq!(
            set.line(),
            "{\"call\":\"set\",\"index\":0,\"namespace\":\"/sys/fs/cgroup/x\\\"y\",\"soft\":1,\"hard\":2,\"result\":0}\n"
        );
        let get = Call {
            call: "get",
            result: 2,
            ..Call::default()
        };
        assert_eq!(
            get.line(),
            "{\"call\":\"get\",\"index\":null,\"namespace\":null,\"soft\":null,\"hard\":null,\"currentUsed\":null,\"result\":2}\n"
        );
        let st = tmp("limits-log");
        log(&st, &set);
        log(&st, &get);
        let text = fs::read_to_string(st.join(LOG_NAME)).unwrap();
        assert_eq!(text, set.line() + &get.line());
        let _ = fs::remove_dir_all(&st);
    }
}
