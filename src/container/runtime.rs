//! `gpushare-runtime`: a drop-in wrapper for runc (DESIGN "The runtime wrapper").
//!
//! For `create` and `run` it finds the bundle (`--bundle`/`-b`, else the working directory),
//! edits its `config.json` atomically through [`crate::container::prepare::edit_config`], then execs the
//! next runtime (the first found of `[runtime] next`, never itself) with the argv unchanged.
//! Every other command is exec'd straight through. A container that asks for nothing leaves
//! `config.json` byte-for-byte alone.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::config::Config;
use crate::container::error::Error;
use crate::container::prepare::{self, Context};
use crate::vocab::{Inventory, InventoryError};

/// Set in the next runtime's environment to this call's [`signature`]; a wrapper started with its
/// own signature there was started by itself (runc hands its env on to hooks without `env`, so
/// a mere flag would also refuse a hook that legitimately runs the wrapper for another call).
pub const LOOP_GUARD: &str = "GPUSHARE_RUNTIME_WRAPPED";

/// What identifies one wrapper call: its whole argv, NUL-free.
pub fn signature(argv: &[OsString]) -> OsString {
    let mut s = OsString::from("gpushare-runtime");
    for a in argv {
        s.push("\u{1f}");
        s.push(a);
    }
    OsString::from_vec(s.into_vec().into_iter().filter(|b| *b != 0).collect())
}

/// The wrapper could not do its job.
#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("no next runtime found among {0:?} ([runtime] next); install runc or set [runtime] next to its path")]
    NoNext(Vec<String>),
    #[error("[runtime] next leads back to gpushare-runtime ({0}); set it to the real runtime, e.g. \"runc\"")]
    Loop(String),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {path}")]
    Exec {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the wrapper needs to know about a runc command line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// `--log` (global).
    pub log: Option<PathBuf>,
    /// `--log-format` (global): `json`, or `text` (runc's default).
    pub log_format: Option<String>,
    pub command: Option<String>,
    /// `--bundle`/`-b` of create/run.
    pub bundle: Option<PathBuf>,
    /// The container id (first positional after the command).
    pub id: Option<String>,
}

/// Global runc flags that take a value.
const GLOBAL_VALUED: &[&str] = &["--log", "--log-format", "--root", "--criu", "--rootless"];
/// create/run flags that take a value.
const CREATE_VALUED: &[&str] = &[
    "--bundle",
    "-b",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
];

fn split_flag(a: &str) -> (&str, Option<&str>) {
    match a.split_once('=') {
        Some((f, v)) if f.starts_with('-') => (f, Some(v)),
        _ => (a, None),
    }
}

/// Parses a runc argv (without argv\[0\]) just enough: global `--log`, the command, and for
/// create/run the bundle and id. Unknown flags are taken as boolean.
pub fn parse_args(argv: &[OsString]) -> Args {
    let mut out = Args::default();
    let mut it = argv.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        if out.command.is_none() {
            if a.starts_with('-') {
                let (flag, inline) = split_flag(&a);
                let flag = if flag.starts_with("--") {
                    flag.to_owned()
                } else {
                    format!("-{flag}")
                };
                if GLOBAL_VALUED.contains(&flag.as_str()) {
                    let v = inline.map(str::to_owned).or_else(|| it.next());
                    if flag == "--log" {
                        out.log = v.map(PathBuf::from);
                    } else if flag == "--log-format" {
                        out.log_format = v;
                    }
                }
                continue;
            }
            out.command = Some(a);
            continue;
        }
        if a == "--" {
            if out.id.is_none() {
                out.id = it.next();
            }
            break;
        }
        if a.starts_with('-') {
            let (flag, inline) = split_flag(&a);
            if CREATE_VALUED.contains(&flag) {
                let v = inline.map(str::to_owned).or_else(|| it.next());
                if flag == "--bundle" || flag == "-b" {
                    out.bundle = v.map(PathBuf::from);
                }
            }
            continue;
        }
        if out.id.is_none() {
            out.id = Some(a);
        }
    }
    out
}

fn identity(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Finds the next runtime: the first of `next` that exists and is not this program.
///
/// # Errors
/// [`RuntimeError::Loop`] when only this program was found, [`RuntimeError::NoNext`] when
/// nothing was.
pub fn find_next(
    next: &[String],
    me: &Path,
    path_env: Option<&OsStr>,
) -> Result<PathBuf, RuntimeError> {
    let me_id = identity(me);
    let mut saw_self = None;
    for name in next {
        let candidates: Vec<PathBuf> = if name.contains('/') {
            vec![PathBuf::from(name)]
        } else {
            let path = path_env
                .map(|p| p.to_owned())
                .unwrap_or_else(|| OsString::from(crate::host::mps::SAFE_PATH));
            std::env::split_paths(&path).map(|d| d.join(name)).collect()
        };
        for c in candidates {
            let Some(id) = identity(&c) else { continue };
            if !std::fs::metadata(&c).is_ok_and(|m| m.is_file()) {
                continue;
            }
            if Some(id) == me_id {
                saw_self = Some(c);
                continue;
            }
            return Ok(c);
        }
    }
    match saw_self {
        Some(p) => Err(RuntimeError::Loop(p.display().to_string())),
        None => Err(RuntimeError::NoNext(next.to_vec())),
    }
}

/// For create/run: edits the bundle's `config.json` in place (temp file + rename), keeping its
/// mode; returns whether it changed.
///
/// # Errors
/// [`Error`] for bad input, a refused request, or a file that cannot be written.
pub fn edit_bundle(
    args: &Args,
    cfg: &Config,
    config_path: Option<PathBuf>,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<bool, Error> {
    let bundle = bundle_dir(args)?;
    let bytes = crate::decide::input::read_config_bytes(&bundle)?;
    let ctx = Context {
        id: args.id.as_deref(),
        bundle: Some(&bundle),
        config_path,
    };
    let Some(edited) = prepare::edit_config(&bytes, &ctx, cfg, open_inventory)? else {
        return Ok(false);
    };
    let path = bundle.join("config.json");
    let mode = std::fs::metadata(&path).map_or(0o644, |m| m.mode() & 0o7777);
    crate::host::state::write_atomic(&path, &edited, mode).map_err(|source| {
        Error::Other(crate::vocab::chain(&RuntimeError::Write { path, source }))
    })?;
    Ok(true)
}

/// The bundle directory of create/run: `--bundle`/`-b`, else the working directory.
fn bundle_dir(args: &Args) -> Result<PathBuf, Error> {
    let bundle = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir()
            .map_err(|e| Error::Other(format!("cannot find the bundle: {e}")))?,
    };
    Ok(std::path::absolute(&bundle).unwrap_or(bundle))
}

/// Whether the bundle's `config.json` may ask for sharing (cheap byte scan; an unreadable
/// config is left to the next runtime to report).
pub fn bundle_may_ask(args: &Args) -> bool {
    bundle_dir(args)
        .ok()
        .and_then(|b| crate::decide::input::read_config_bytes(&b).ok())
        .is_some_and(|bytes| crate::decide::front::may_ask(&bytes, &Default::default()))
}

/// How a wrapper call ended, when this process did not become the next runtime.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The wrapper failed before the next runtime ran: the one-line message.
    Failed(String),
    /// The next runtime ran as a child and exited with this status (ours to exit with).
    Next(u8),
}

/// The whole wrapper. Usually this process becomes the next runtime (exec) and this returns
/// only on failure. For a `create` whose edit made the container's per-container directory, the
/// next runtime runs as a child instead (signals forwarded, its exit status returned), so that
/// the directory can be removed when the create fails before any hook of the container ran.
/// A policy file that cannot be loaded fails only the containers that may ask for sharing; the
/// others run with the default `[runtime] next`.
pub fn run(argv: &[OsString], args: &Args) -> Ended {
    if is_looping(argv) {
        return Ended::Failed(RuntimeError::Loop("started by itself".into()).to_string());
    }
    // GPUSHARE_CONFIG, else the default file; the wrapper has no flags of its own.
    let source = crate::config::Source::resolve(None);
    let loaded = Config::load_from(&source);
    let cfg = loaded.as_ref().cloned().unwrap_or_default();
    let me = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    let next = match find_next(&cfg.runtime.next, &me, std::env::var_os("PATH").as_deref()) {
        Ok(n) => n,
        Err(e) => return Ended::Failed(crate::vocab::chain(&e)),
    };
    if wants_edit(args) {
        match &loaded {
            Ok(cfg) => {
                let open = || crate::host::inventory::open(cfg);
                let dir = made_here(args, cfg);
                let had = dir.as_ref().is_some_and(|d| d.exists());
                if let Err(e) = edit_bundle(args, cfg, source.to_hand_on(), &open) {
                    // Nothing runs this container: a directory made for it goes too.
                    if let Some(d) = dir.filter(|d| !had && d.exists()) {
                        let _ = std::fs::remove_dir_all(d);
                    }
                    return Ended::Failed(crate::vocab::chain(&e));
                }
                if let Some(dir) = dir.filter(|d| !had && d.exists()) {
                    return match run_next_child(&next, argv) {
                        Ok(0) => Ended::Next(0),
                        Ok(code) => {
                            // The create failed: no container has this id, so nothing will
                            // ever release the directory this call made for it.
                            let _ = std::fs::remove_dir_all(&dir);
                            Ended::Next(code)
                        }
                        Err(e) => {
                            let _ = std::fs::remove_dir_all(&dir);
                            Ended::Failed(crate::vocab::chain(&e))
                        }
                    };
                }
            }
            Err(e) if bundle_may_ask(args) => return Ended::Failed(crate::vocab::chain(e)),
            Err(_) => {}
        }
    }
    Ended::Failed(crate::vocab::chain(&exec_next(&next, argv)))
}

/// The per-container directory a `create` of a known, safe id may make (`None` for other
/// commands, where the runtime is exec'd as always).
fn made_here(args: &Args, cfg: &Config) -> Option<PathBuf> {
    let id = args
        .id
        .as_deref()
        .filter(|id| crate::vocab::is_safe_name(id))?;
    (args.command.as_deref() == Some("create"))
        .then(|| crate::host::state::StateDir::new(&cfg.state_dir).container_dir(id))
}

/// Signals a caller may send the runtime it started; forwarded to the child runtime.
const FORWARDED: [nix::sys::signal::Signal; 7] = {
    use nix::sys::signal::Signal::*;
    [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH]
};

/// Runs `next` with `argv` as a child (the loop guard set as for exec), forwarding
/// [`FORWARDED`] signals to it, and returns its exit status (128 + the signal when killed).
///
/// # Errors
/// [`RuntimeError::Exec`] when it cannot be started or waited for.
pub fn run_next_child(next: &Path, argv: &[OsString]) -> Result<u8, RuntimeError> {
    use nix::sys::signal::SigSet;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let exec_err = |source| RuntimeError::Exec {
        path: next.to_owned(),
        source,
    };
    let mut set = SigSet::empty();
    FORWARDED.iter().for_each(|s| set.add(*s));
    // Blocked here and taken by the forwarding thread; the child starts with an empty mask
    // (std resets it before exec).
    set.thread_block()
        .map_err(|e| exec_err(std::io::Error::from(e)))?;
    let mut child = std::process::Command::new(next)
        .arg0(next.as_os_str())
        .args(argv)
        .env(LOOP_GUARD, signature(argv))
        .spawn()
        .map_err(exec_err)?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    });
    let status = child.wait().map_err(exec_err)?;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    })
}

/// Whether the command edits a bundle.
pub fn wants_edit(args: &Args) -> bool {
    matches!(args.command.as_deref(), Some("create" | "run"))
}

/// The line written to the `--log` file for an error, in the runtime's log format: JSON (what
/// containerd's shim asks for and reads; its `time` must be RFC 3339) or runc's logfmt text.
pub fn log_line(msg: &str, json: bool) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let msg = format!("gpushare-runtime: {msg}");
    if json {
        serde_json::json!({"level": "error", "msg": msg, "time": rfc3339(secs)}).to_string()
    } else {
        // logfmt: the message quoted like a JSON string.
        format!(
            "time={:?} level=error msg={}",
            rfc3339(secs),
            serde_json::Value::String(msg)
        )
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (UTC; civil-from-days, H. Hinnant).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Appends an error line to the `--log` file in its `--log-format`; best effort.
pub fn log_error(args: &Args, msg: &str) {
    use std::io::Write;
    let json = args.log_format.as_deref() == Some("json");
    if let Some(p) = &args.log {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{}", log_line(msg, json));
        }
    }
}

/// Replaces this process with `next`, argv unchanged (argv\[0\] set to the next runtime's path).
///
/// # Errors
/// Only when exec fails.
pub fn exec_next(next: &Path, argv: &[OsString]) -> RuntimeError {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(next)
        .arg0(next.as_os_str())
        .args(argv)
        .env(LOOP_GUARD, signature(argv))
        .exec();
    RuntimeError::Exec {
        path: next.to_owned(),
        source: err,
    }
}

/// Whether this process was started by itself through the next-runtime chain (the same call
/// came back).
pub fn is_looping(argv: &[OsString]) -> bool {
    std::env::var_os(LOOP_GUARD).is_some_and(|v| v == signature(argv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Args {
        parse_args(&s.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn parses_runc_command_lines() {
        let rows: Vec<(&str, Vec<&str>, Args)> = vec![
            (
                "containerd shim",
                vec![
                    "--root",
                    "/r",
                    "--log",
                    "/b/log.json",
                    "--log-format",
                    "json",
                    "create",
                    "--bundle",
                    "/b",
                    "--pid-file",
                    "/b/pid",
                    "c1",
                ],
                Args {
                    log: Some("/b/log.json".into()),
                    log_format: Some("json".into()),
                    command: Some("create".into()),
                    bundle: Some("/b".into()),
                    id: Some("c1".into()),
                },
            ),
            (
                "docker style with = and -b",
                vec![
                    "--log=/l",
                    "run",
                    "-b",
                    "/b",
                    "-d",
                    "--console-socket",
                    "/s",
                    "c2",
                ],
                Args {
                    log: Some("/l".into()),
                    log_format: None,
                    command: Some("run".into()),
                    bundle: Some("/b".into()),
                    id: Some("c2".into()),
                },
            ),
            (
                "no bundle",
                vec!["create", "--bundle=/x", "c3"],
                Args {
                    log: None,
                    log_format: None,
                    command: Some("create".into()),
                    bundle: Some("/x".into()),
                    id: Some("c3".into()),
                },
            ),
            (
                "other command",
                vec!["--debug", "delete", "--force", "c4"],
                Args {
                    log: None,
                    log_format: None,
                    command: Some("delete".into()),
                    bundle: None,
                    id: Some("c4".into()),
                },
            ),
            ("nothing", vec![], Args::default()),
        ];
        for (what, argv, want) in rows {
            assert_eq!(args(&argv), want, "{what}");
        }
    }

    #[test]
    fn next_runtime_is_never_itself() {
        let t = tempfile::tempdir().unwrap();
        let me = t.path().join("me");
        std::fs::write(&me, b"#!/bin/sh\n").unwrap();
        let link = t.path().join("runc");
        std::fs::hard_link(&me, &link).unwrap();
        let other = t.path().join("crun");
        std::fs::write(&other, b"#!/bin/sh\n").unwrap();
        let dir = t.path().as_os_str();
        // Only itself (under another name): a loop.
        let e = find_next(&["runc".into()], &me, Some(dir)).unwrap_err();
        assert!(matches!(e, RuntimeError::Loop(_)), "{e}");
        // Itself first, then a real one.
        assert_eq!(
            find_next(&["runc".into(), "crun".into()], &me, Some(dir)).unwrap(),
            other
        );
        // Nothing at all.
        let e = find_next(&["/nonexistent/runc".into()], &me, Some(dir)).unwrap_err();
        assert!(matches!(e, RuntimeError::NoNext(_)));
    }

    #[test]
    fn log_lines_in_both_formats() {
        let v: serde_json::Value = serde_json::from_str(&log_line("bad \"x\"", true)).unwrap();
        assert_eq!(v["level"], "error");
        assert!(v["msg"].as_str().unwrap().contains("bad \"x\""));
        let text = log_line("bad \"x\"", false);
        assert!(
            text.starts_with("time=\"") && text.contains(" level=error msg="),
            "{text}"
        );
        assert!(
            text.ends_with(r#"msg="gpushare-runtime: bad \"x\"""#),
            "{text}"
        );
        let a = parse_args(&[
            "--log-format=json".into(),
            "--log".into(),
            "/l".into(),
            "state".into(),
        ]);
        assert_eq!(a.log_format.as_deref(), Some("json"));
        assert_eq!(a.log.as_deref(), Some(Path::new("/l")));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3661), "2000-02-29T01:01:01Z");
        assert_eq!(rfc3339(1_795_321_481), "2026-11-22T04:24:41Z");
    }
}
