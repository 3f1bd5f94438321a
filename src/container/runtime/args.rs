//! Reading a runc command line: just enough of it for the wrapper.

use std::ffi::OsString;
use std::path::PathBuf;

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
