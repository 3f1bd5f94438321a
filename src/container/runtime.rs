//! `gpushare-runtime`: a drop-in wrapper for runc (docs/design.md "The runtime wrapper").
//!
//! For `create` and `run` it finds the bundle (`--bundle`/`-b`, else the working directory),
//! edits its `config.json` atomically through [`crate::container::prepare::edit_config`], then execs the
//! next runtime (the first found of `[runtime] next`, never itself) with the argv unchanged.
//! For `exec --process FILE` into a container that was given a share, it adds the share's env
//! (as the spec edit put it into the container's `config.json`) to the process file, so that
//! `kubectl exec`, `docker exec` and `ctr task exec` processes get what the main process got.
//! Every other command is exec'd straight through. A container that asks for nothing leaves
//! `config.json` (and any process file) byte-for-byte alone.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::config::Config;
use crate::container::error::Error;
use crate::container::prepare::{self, Context};
use crate::container::spec_edit;
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
    #[error("cannot find the bundle: no --bundle and no working directory")]
    Bundle {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the exec process file {path}")]
    ReadProcess {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("exec process file {0} is larger than 16 MiB or not JSON")]
    BadProcess(PathBuf),
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
    /// `--process`/`-p` of exec: the process file.
    pub process: Option<PathBuf>,
    /// Where the command is in argv (what precedes it are the global flags).
    pub command_at: Option<usize>,
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
/// exec flags that take a value.
const EXEC_VALUED: &[&str] = &[
    "--process",
    "-p",
    "--console-socket",
    "--cwd",
    "--env",
    "-e",
    "--user",
    "-u",
    "--additional-gids",
    "-g",
    "--process-label",
    "--apparmor",
    "--pid-file",
    "--cap",
    "-c",
    "--preserve-fds",
    "--cgroup",
];

fn split_flag(a: &str) -> (&str, Option<&str>) {
    match a.split_once('=') {
        Some((f, v)) if f.starts_with('-') => (f, Some(v)),
        _ => (a, None),
    }
}

/// Parses a runc argv (without argv\[0\]) just enough: global `--log`, the command, for
/// create/run the bundle and id, for exec the process file and id. Unknown flags are taken as
/// boolean.
pub fn parse_args(argv: &[OsString]) -> Args {
    let mut out = Args::default();
    let mut it = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .enumerate();
    fn next_value(it: &mut impl Iterator<Item = (usize, String)>) -> Option<String> {
        it.next().map(|(_, v)| v)
    }
    while let Some((i, a)) = it.next() {
        if out.command.is_none() {
            if a.starts_with('-') {
                let (flag, inline) = split_flag(&a);
                let flag = if flag.starts_with("--") {
                    flag.to_owned()
                } else {
                    format!("-{flag}")
                };
                if GLOBAL_VALUED.contains(&flag.as_str()) {
                    let v = inline.map(str::to_owned).or_else(|| next_value(&mut it));
                    if flag == "--log" {
                        out.log = v.map(PathBuf::from);
                    } else if flag == "--log-format" {
                        out.log_format = v;
                    }
                }
                continue;
            }
            out.command = Some(a);
            out.command_at = Some(i);
            continue;
        }
        if a == "--" {
            if out.id.is_none() {
                out.id = next_value(&mut it);
            }
            break;
        }
        if a.starts_with('-') {
            let (flag, inline) = split_flag(&a);
            let valued = if out.command.as_deref() == Some("exec") {
                EXEC_VALUED
            } else {
                CREATE_VALUED
            };
            if valued.contains(&flag) {
                let v = inline.map(str::to_owned).or_else(|| next_value(&mut it));
                match (out.command.as_deref(), flag) {
                    (Some("exec"), "--process" | "-p") => out.process = v.map(PathBuf::from),
                    (Some("exec"), _) => {}
                    (_, "--bundle" | "-b") => out.bundle = v.map(PathBuf::from),
                    _ => {}
                }
            }
            continue;
        }
        if out.id.is_some() && out.command.as_deref() == Some("exec") {
            // The command line of the process to run: not ours to read.
            break;
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
    crate::host::state::write_atomic(&path, &edited, mode)
        .map_err(|source| RuntimeError::Write { path, source })?;
    Ok(true)
}

/// The bundle directory of create/run: `--bundle`/`-b`, else the working directory.
fn bundle_dir(args: &Args) -> Result<PathBuf, Error> {
    let bundle = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().map_err(|source| RuntimeError::Bundle { source })?,
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

/// For `exec --process FILE`: when the container was given a share (its `config.json` was
/// edited), adds the share's env as it stands in that `config.json` to the process file
/// (temp file + rename, mode kept); returns whether the file changed. The container's bundle
/// comes from `<next runtime> [global flags] state <id>`. Anything that is not the exec of a
/// share container (no process file, an unknown container, an unreadable or unedited config)
/// is left alone for the next runtime to handle.
///
/// # Errors
/// A share container's process file that cannot be read, parsed or written.
pub fn edit_exec_process(argv: &[OsString], args: &Args, next: &Path) -> Result<bool, Error> {
    let (Some(file), Some(id), Some(at)) = (&args.process, &args.id, args.command_at) else {
        return Ok(false);
    };
    let Some(bundle) = bundle_of(next, &argv[..at], id) else {
        return Ok(false);
    };
    let Ok(bytes) = crate::decide::input::read_config_bytes(&bundle) else {
        return Ok(false);
    };
    if !bytes.windows(13).any(|w| w == b"gpushare-hook") {
        return Ok(false);
    }
    let Ok(config) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(false);
    };
    let Some(edit) =
        spec_edit::applied_env(&config, crate::container::inject::LIMIT_DIR_IN_CONTAINER)
    else {
        return Ok(false);
    };
    let read = std::fs::File::open(file)
        .and_then(|f| crate::vocab::read::read_capped(f, crate::decide::input::MAX_CONFIG_BYTES))
        .map_err(|source| RuntimeError::ReadProcess {
            path: file.clone(),
            source,
        })?;
    let mut process: serde_json::Value = read
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| RuntimeError::BadProcess(file.clone()))?;
    let before = process.clone();
    spec_edit::apply_to_process(&mut process, &edit)?;
    if process == before {
        return Ok(false);
    }
    let mode = std::fs::metadata(file).map_or(0o600, |m| m.mode() & 0o7777);
    let bytes = serde_json::to_vec(&process).expect("JSON value serialises");
    crate::host::state::write_atomic(file, &bytes, mode).map_err(|source| RuntimeError::Write {
        path: file.clone(),
        source,
    })?;
    Ok(true)
}

/// The bundle of container `id` as the next runtime reports it (`state`), with the same global
/// flags (`--root` above all); `None` when it cannot say.
fn bundle_of(next: &Path, global: &[OsString], id: &str) -> Option<PathBuf> {
    let out = std::process::Command::new(next)
        .args(global)
        .arg("state")
        .arg(id)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let b = PathBuf::from(v.get("bundle")?.as_str()?);
    b.is_absolute().then_some(b)
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
                let open = || crate::host::inventory::open_for_planning(cfg);
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
    if args.command.as_deref() == Some("exec") {
        if let Err(e) = edit_exec_process(argv, args, &next) {
            return Ended::Failed(crate::vocab::chain(&e));
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

/// What the wrapper prints itself before the next runtime answers `--version`/`-v` or
/// `--help`/`-h`/`help` (given before any command): its own version or help first.
pub fn own_answer(argv: &[OsString], args: &Args) -> Option<String> {
    let before_command: Vec<&OsStr> = argv
        .iter()
        .map(OsString::as_os_str)
        .take_while(|a| a.to_string_lossy().starts_with('-'))
        .collect();
    let has = |f: &[&str]| before_command.iter().any(|a| f.iter().any(|x| a == x));
    if args.command.is_none() && has(&["--version", "-v"]) {
        return Some(format!("gpushare-runtime version {}\n", crate::VERSION));
    }
    if has(&["--help", "-h"]) || (args.command.as_deref() == Some("help") && argv.len() == 1) {
        return Some(format!(
            "gpushare-runtime {}: a runc wrapper that shares NVIDIA GPUs between containers.\n\
             For `create` and `run` it edits the bundle's config.json for a container that asks\n\
             for a share (gpu.share* annotations, or GPU_SHARE* env), then runs the next runtime\n\
             ([runtime] next of the policy file: $GPUSHARE_CONFIG, else {}) with the same\n\
             arguments. Every other command goes straight to the next runtime.\n\
             It has no options of its own; the next runtime's help follows.\n\n",
            crate::VERSION,
            crate::config::DEFAULT_PATH
        ));
    }
    None
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
                    command_at: Some(6),
                    ..Args::default()
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
                    command_at: Some(1),
                    ..Args::default()
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
                    command_at: Some(0),
                    ..Args::default()
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
                    command_at: Some(1),
                    ..Args::default()
                },
            ),
            ("nothing", vec![], Args::default()),
            (
                "containerd shim exec",
                vec![
                    "--root",
                    "/r",
                    "--log",
                    "/b/log.json",
                    "--log-format",
                    "json",
                    "exec",
                    "--process",
                    "/b/.p.json",
                    "--detach",
                    "--pid-file",
                    "/b/e.pid",
                    "c5",
                ],
                Args {
                    log: Some("/b/log.json".into()),
                    log_format: Some("json".into()),
                    command: Some("exec".into()),
                    id: Some("c5".into()),
                    process: Some("/b/.p.json".into()),
                    command_at: Some(6),
                    ..Args::default()
                },
            ),
            (
                "exec with a command line whose flags are not ours",
                vec![
                    "exec", "-e", "A=1", "--cwd", "/", "-t", "c6", "sh", "-c", "-b", "/x", "-p",
                    "/y",
                ],
                Args {
                    command: Some("exec".into()),
                    id: Some("c6".into()),
                    command_at: Some(0),
                    ..Args::default()
                },
            ),
            (
                "exec -p=FILE",
                vec!["exec", "-p=/f", "c7"],
                Args {
                    command: Some("exec".into()),
                    id: Some("c7".into()),
                    process: Some("/f".into()),
                    command_at: Some(0),
                    ..Args::default()
                },
            ),
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
    fn own_version_and_help_come_first() {
        let rows: &[(&str, &[&str], Option<&str>)] = &[
            (
                "--version",
                &["--version"],
                Some("gpushare-runtime version "),
            ),
            ("-v", &["-v"], Some("gpushare-runtime version ")),
            ("--help", &["--help"], Some("gpushare-runtime 0")),
            ("help command", &["help"], Some("gpushare-runtime 0")),
            ("a create", &["create", "--bundle", "/b", "c"], None),
            (
                "a container named -v? no: after the command",
                &["state", "-v"],
                None,
            ),
        ];
        for (what, argv, want) in rows {
            let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
            let got = own_answer(&argv, &parse_args(&argv));
            match want {
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.starts_with(w)),
                    "{what}: {got:?}"
                ),
                None => assert_eq!(got, None, "{what}"),
            }
        }
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

    #[test]
    fn exec_process_files_get_the_share_env_of_edited_containers_only() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let bundle = t.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        // A next runtime that answers `state` for container c1 only, and checks it was given
        // the global flags.
        let next = t.path().join("runc");
        std::fs::write(
            &next,
            format!(
                "#!/bin/sh\n[ \"$1 $2 $3 $4\" = \"--root /r state c1\" ] || exit 1\n\
                 echo '{{\"ociVersion\":\"1.0.2\",\"id\":\"c1\",\"status\":\"running\",\"bundle\":\"{}\"}}'\n",
                bundle.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
        let process = t.path().join("process.json");
        let original = br#"{"args":["sh"],"env":["PATH=/bin"],"cwd":"/"}"#;
        let argv = |id: &str, p: &Path| -> Vec<OsString> {
            ["--root", "/r", "exec", "--process"]
                .iter()
                .map(OsString::from)
                .chain([p.as_os_str().to_owned(), id.into()])
                .collect()
        };
        let run_exec = |id: &str| {
            let a = argv(id, &process);
            edit_exec_process(&a, &parse_args(&a), &next)
        };
        let edited = serde_json::json!({
            "process": {"env": ["PATH=/bin", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"]},
            "hooks": {"createRuntime": [{"path": "/usr/bin/gpushare-hook",
                                         "args": ["gpushare-hook", "createRuntime"]}]}
        });
        let plain = serde_json::json!({"process": {"env": ["PATH=/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"]}});

        // (description, bundle config, container id, changed)
        let rows: Vec<(&str, Option<&serde_json::Value>, &str, bool)> = vec![
            ("share container", Some(&edited), "c1", true),
            ("container without a share", Some(&plain), "c1", false),
            ("unknown container", Some(&edited), "c2", false),
            ("bundle without config.json", None, "c1", false),
        ];
        for (what, config, id, changed) in rows {
            let _ = std::fs::remove_file(bundle.join("config.json"));
            if let Some(c) = config {
                std::fs::write(bundle.join("config.json"), c.to_string()).unwrap();
            }
            std::fs::write(&process, original).unwrap();
            std::fs::set_permissions(&process, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert_eq!(run_exec(id).unwrap(), changed, "{what}");
            let got = std::fs::read(&process).unwrap();
            if changed {
                let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
                assert_eq!(
                    v["env"],
                    serde_json::json!([
                        "PATH=/bin",
                        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"
                    ]),
                    "{what}"
                );
                assert_eq!(v["cwd"], "/", "{what}");
                let mode = std::fs::metadata(&process).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{what}: mode kept");
            } else {
                assert_eq!(got, original, "{what}: untouched");
            }
        }

        // A share container's process file that is not JSON: refused, left as it was.
        std::fs::write(bundle.join("config.json"), edited.to_string()).unwrap();
        std::fs::write(&process, b"{not json").unwrap();
        let e = run_exec("c1").unwrap_err();
        assert!(crate::vocab::chain(&e).contains("not JSON"), "{e}");
        assert_eq!(std::fs::read(&process).unwrap(), b"{not json");
        // No --process (runc exec with the command on its command line): nothing to do.
        let a: Vec<OsString> = ["exec", "c1", "sh"].iter().map(OsString::from).collect();
        assert!(!edit_exec_process(&a, &parse_args(&a), &next).unwrap());
        // Nothing left behind in the process file's directory but the files we made.
        let mut names: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["bundle", "process.json", "runc"]);
    }
}
