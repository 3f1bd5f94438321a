//! What doctor's engine checks share: the verdict type, whether a binary an engine will run
//! exists and answers, which policy file an entry will load, an engine's TOML files in the
//! order they apply, and asking an engine's program with a time limit.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{Config, Source};
use crate::host::mps::find_binary;

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

pub fn check(name: &str, verdict: Verdict, detail: impl Into<String>) -> Check {
    Check {
        name: name.to_owned(),
        verdict,
        detail: detail.into(),
    }
}

/// How long one probed program may take.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `cmd` with stdin closed, killing it (by its pid: we started it) after `timeout`.
///
/// # Errors
/// The program cannot be started, or it ran past `timeout`.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{:?} did not answer within {}s",
                    cmd.get_program(),
                    timeout.as_secs()
                ));
            }
        }
    }
    child
        .wait_with_output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))
}

/// The first non-empty line of a program's stdout, else of its stderr (the other way round
/// when it failed: its complaint is on stderr).
pub fn first_line(o: &Output) -> String {
    let order = if o.status.success() {
        [&o.stdout, &o.stderr]
    } else {
        [&o.stderr, &o.stdout]
    };
    order
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .find(|l| !l.is_empty())
        .unwrap_or_default()
}

/// `path` exists, is an executable file, and answers `args` (its first line shown).
pub fn executable_check(name: &str, path: &Path, args: &[&str], what: &str) -> Check {
    executable_check_by(name, path, args, what, |o| o.status.success())
}

/// [`executable_check`] judging the run by `ran` instead of its exit status: for a program that
/// answers for itself first and then exits with another program's status (gpushare-runtime's
/// `--version`, which the next runtime's answer follows: that one is checked apart).
pub fn executable_check_by(
    name: &str,
    path: &Path,
    args: &[&str],
    what: &str,
    ran: fn(&std::process::Output) -> bool,
) -> Check {
    match executable(path) {
        Err(e) => check(name, Verdict::Fail, format!("{e} ({what})")),
        Ok(()) => {
            let out = std::process::Command::new(path)
                .args(args)
                .env_clear()
                .env("PATH", crate::host::mps::SAFE_PATH)
                .stdin(std::process::Stdio::null())
                .output();
            match out {
                Ok(o) if ran(&o) => {
                    let text = String::from_utf8_lossy(&o.stdout);
                    let first = text.lines().next().unwrap_or("").trim();
                    check(name, Verdict::Ok, format!("{}: {first}", path.display()))
                }
                Ok(o) => check(
                    name,
                    Verdict::Fail,
                    format!(
                        "{} {} exited with {} ({what})",
                        path.display(),
                        args.join(" "),
                        o.status
                    ),
                ),
                Err(e) => check(
                    name,
                    Verdict::Fail,
                    format!("cannot run {}: {e} ({what})", path.display()),
                ),
            }
        }
    }
}

/// Whether `path` is an existing executable file.
pub(super) fn executable(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!("{} is not a file", path.display())),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => {
            Err(format!("{} is not executable", path.display()))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{} cannot be used: {e}", path.display())),
    }
}

/// The advice for an entry whose policy file does not load: `configure` would refuse it too.
pub(super) const POLICY_FIX: &str =
    "fix that policy file first (`gpushare-hook configure` refuses it too)";

/// `e`, followed by the advice to run `configure` unless the fix is the policy file's.
pub(super) fn advise(e: &str, cmd: &str) -> String {
    if e.ends_with(POLICY_FIX) {
        e.to_owned()
    } else {
        format!("{e}; run `gpushare-hook configure {cmd}`")
    }
}

/// The policy file an entry will load: `GPUSHARE_CONFIG` from its env (a hook file) or from
/// the launcher it runs; else the default. `Err` when that file does not load.
pub(super) fn policy_of(env: Option<&str>) -> Result<String, String> {
    let source = Source::pick(None, env.map(std::ffi::OsStr::new));
    match Config::load_from(&source) {
        Ok(_) => Ok(source.to_string()),
        Err(e) => Err(format!(
            "{source}: {}; {POLICY_FIX}",
            crate::vocab::chain(&e)
        )),
    }
}

/// `GPUSHARE_CONFIG` set by a launcher written by `configure` (a shell script).
pub(super) fn launcher_policy(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    if !text.starts_with("#!") {
        return None;
    }
    text.lines().find_map(|l| {
        let v = l.strip_prefix(&format!("{}=", crate::config::ENV_PATH))?;
        Some(v.trim().trim_matches('\'').replace(r"'\''", "'"))
    })
}

/// A runtime entry's binary: executable, and the policy it will load.
pub(super) fn runtime_entry(path: &Path) -> Result<String, String> {
    executable(path)?;
    let policy = policy_of(launcher_policy(path).as_deref())?;
    Ok(format!("runs {}, policy {policy}", path.display()))
}

pub(super) fn installed(engine: &str) -> bool {
    find_tool(engine).is_some()
}

pub(super) fn not_configured(name: &str, engine: &str, cmd: &str, why: &str) -> Check {
    if installed(engine) {
        check(
            name,
            Verdict::Warn,
            format!("{why}; run `gpushare-hook configure {cmd}`"),
        )
    } else {
        check(name, Verdict::Ok, format!("{engine} not installed"))
    }
}

/// doctor's two checks of one engine, made to agree: when the running engine has loaded
/// gpushare (`live` ok) while its usual file has no gpushare entry (`file` the warning of
/// [`not_configured`] for `cmd`: `configure --path` wrote another file), the file check says
/// so as ok instead of warning about what the engine already runs.
pub(super) fn agree(mut file: Check, live: Check, cmd: &str) -> Vec<Check> {
    let unconfigured = file.verdict == Verdict::Warn
        && file
            .detail
            .ends_with(&format!("; run `gpushare-hook configure {cmd}`"));
    if unconfigured && live.verdict == Verdict::Ok {
        let why = file.detail.split("; run `").next().unwrap_or_default();
        file = check(
            &file.name,
            Verdict::Ok,
            format!("the running engine has gpushare (below), from another file than this: {why}"),
        );
    }
    vec![file, live]
}

/// A bare name (Docker allows one) resolved on the safe PATH.
pub(super) fn resolve(p: &str) -> PathBuf {
    find_binary(p).unwrap_or_else(|| PathBuf::from(p))
}

/// The TOML files of an engine's main file and drop-in dir, in the order they apply.
pub(super) fn toml_files(paths: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        let p = Path::new(p);
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|f| f.extension().is_some_and(|e| e == "conf"))
                .collect();
            v.sort();
            out.extend(v);
        } else if p.is_file() {
            out.push(p.to_owned());
        }
    }
    out
}

/// The last value of `keys` among `files` (later files override), or a parse failure.
pub(super) fn last_value(files: &[PathBuf], keys: &[&str]) -> Result<Option<toml::Value>, String> {
    let mut found = None;
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            format!("{} is not valid TOML ({})", f.display(), e.message())
        })?;
        let mut cur = Some(toml::Value::Table(doc));
        for k in keys {
            cur = cur.and_then(|v| v.get(k).cloned());
        }
        if cur.is_some() {
            found = cur;
        }
    }
    Ok(found)
}

/// `name` on `$PATH`, else on the safe PATH.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::env::split_paths(crate::host::mps::SAFE_PATH))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub(super) fn ask(bin: &Path, args: &[&str]) -> Result<Output, String> {
    let mut c = Command::new(bin);
    c.args(args).current_dir("/");
    run_bounded(&mut c, TOOL_TIMEOUT)
}
