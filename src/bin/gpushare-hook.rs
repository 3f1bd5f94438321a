//! `gpushare-hook`: the OCI hook stages and the admin commands. Thin: parse, log, call, exit.
//!
//! The engine runs it for every container, most of which ask for nothing, so it starts as a
//! C `main` without Rust's runtime set-up (`gpushare::prepare_process` does the part it needs):
//! the fast path went from 0.91 to 0.83 ms.
#![cfg_attr(not(test), no_main)]

use std::error::Error as StdError;
use std::io::Write;

use clap::Parser;
use gpushare::admin::configure;
use gpushare::cli::{Cli, Cmd};
use gpushare::commands::{self, Ctx, Reply};
use gpushare::config::{Config, ConfigError, Source};
use gpushare::{logging, vocab};

type Result<T> = std::result::Result<T, Box<dyn StdError>>;

/// An exit status.
type ExitCode = u8;

/// The process entry (C `main`: see the crate docs). A panic is exit status 101, as from a
/// Rust `main`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    gpushare::prepare_process();
    logging::start_clock();
    let code = std::panic::catch_unwind(run).unwrap_or(101);
    // Nothing flushes Rust's stdout after a C `main` returns.
    let _ = std::io::stdout().flush();
    std::ffi::c_int::from(code)
}

fn run() -> ExitCode {
    let cli = match hook_stage_cli().map_or_else(Cli::try_parse, Ok) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    if let Cmd::Version = cli.command {
        println!("gpushare-hook {}", gpushare::VERSION);
        return 0;
    }
    if let Cmd::CreateRuntime { .. } | Cmd::Prestart { .. } | Cmd::Poststop | Cmd::Precreate =
        cli.command
    {
        // A stage ends soon after it last asks NVML.
        gpushare::leave_nvml_to_exit();
    }
    let mut stdin = std::io::stdin().lock();
    // The no-share fast path: a container that asks for nothing is let through before the
    // policy is read, logging set up or anything else done (so a policy that does not load
    // refuses only the containers that ask, as precreate and gpushare-runtime do). Any other
    // input goes the whole way, from the bytes read (the state, and the config.json the first
    // look read). A refusal precreate carried is not for the fast path.
    let mut input = None;
    let carried = std::env::var_os(gpushare::container::prepare::REFUSED_ENV).is_some();
    if let (Cmd::CreateRuntime { profile: None, .. } | Cmd::Prestart { profile: None, .. }, false) =
        (&cli.command, carried)
    {
        use gpushare::container::hook::{look, Look};
        let read = Replay::of(&mut stdin);
        let preread = match read.error {
            Some(_) => None,
            None => match look(&read.bytes) {
                Look::Nothing => return 0,
                Look::Ask(preread) => preread,
            },
        };
        input = Some((read, preread));
    }
    let source = Source::resolve(cli.config.as_deref());
    let loaded = Config::load_from(&source);
    if let (Cmd::CreateRuntime { .. } | Cmd::Prestart { .. }, true) = (&cli.command, carried) {
        // A refusal precreate carried here: the runtime shows this hook's stderr.
        // A policy that does not load is written to with the defaults (the refusal it
        // carries is that policy error).
        let salvaged;
        let cfg = match &loaded {
            Ok(c) => c,
            Err(_) => {
                salvaged = gpushare::config::salvage(&source);
                &salvaged
            }
        };
        if let Some(e) = commands::refused_by_precreate(&mut stdin, cfg, || {
            logging::init(Some(&cfg.log_file));
        }) {
            // Logged with its container by refused_by_precreate: once.
            return fail_unlogged(&e);
        }
    }
    let cfg = match loaded {
        Ok(c) => c,
        Err(e) => {
            let rest: Box<dyn std::io::Read + '_> = match input {
                Some((read, _)) => Box::new(read),
                None => Box::new(stdin),
            };
            return without_policy(cli.command, &source, &e, rest);
        }
    };
    logging::init(Some(&cfg.log_file));
    let ctx = Ctx { cfg, source };
    // createRuntime logs its own refusal, with the container: the final line is not logged again.
    let logs_itself = matches!(
        cli.command,
        Cmd::CreateRuntime { .. } | Cmd::Prestart { .. }
    );
    let result: Result<Reply> = match cli.command {
        Cmd::CreateRuntime { dry_run, profile } | Cmd::Prestart { dry_run, profile } => match input
        {
            Some((read, preread)) => {
                commands::create_runtime(&ctx, read, dry_run, profile.as_deref(), preread)
            }
            None => commands::create_runtime(&ctx, stdin, dry_run, profile.as_deref(), None),
        }
        .map_err(Into::into),
        Cmd::Poststop => commands::poststop(&ctx, stdin).map_err(Into::into),
        Cmd::Precreate => commands::precreate(&ctx, stdin).map_err(Into::into),
        Cmd::Status { json } => Ok(commands::status(&ctx, json)),
        Cmd::Gc { json } => Ok(commands::gc(&ctx, json)),
        Cmd::Reap { uuid } => commands::reap(&ctx, &uuid).map_err(Into::into),
        Cmd::Configure {
            engine,
            path,
            dry_run,
            hooks_dir,
            order,
            containerd_version,
            default_runtime,
            policy_at,
            cdi_dir,
            print,
            remove,
            allow_missing,
            json,
        } => {
            let opts = configure::Options {
                path,
                dry_run,
                hooks_dir,
                order,
                containerd_version,
                default_runtime,

                remove,
                allow_missing,
            };
            commands::configure(
                &ctx,
                engine,
                &opts,
                policy_at,
                cdi_dir.as_deref(),
                print,
                json,
            )
            .map_err(Into::into)
        }
        Cmd::Doctor { json } => Ok(commands::doctor(&ctx, json)),
        Cmd::Cdi {
            command:
                gpushare::cli::CdiCmd::Generate {
                    output,
                    dry_run,
                    json,
                },
        } => commands::cdi_generate(&ctx, &output, dry_run, json).map_err(Into::into),

        Cmd::Metrics { openmetrics } => Ok(commands::metrics(&ctx, openmetrics)),
        Cmd::Serve { listen } => commands::serve(&ctx, listen).map_err(Into::into),
        Cmd::Events { follow } => commands::events(&ctx, follow).map_err(Into::into),
        Cmd::Version => unreachable!("handled above"),
    };
    match result {
        Ok(reply) => print(&reply),
        Err(e) if logs_itself => fail_unlogged(e.as_ref()),
        Err(e) => fail(e.as_ref()),
    }
}

/// The command line of the hook entries gpushare writes (`gpushare-hook createRuntime`, or
/// `prestart`, and nothing else), read without building clap's parser of every command;
/// `None` for any other command line, which clap parses (to the same [`Cli`] for these).
fn hook_stage_cli() -> Option<Cli> {
    let mut args = std::env::args_os().skip(1);
    let stage = args.next()?;
    if args.next().is_some() {
        return None;
    }
    let command = match stage.to_str()? {
        "createRuntime" | "create-runtime" => Cmd::CreateRuntime {
            dry_run: false,
            profile: None,
        },
        "prestart" => Cmd::Prestart {
            dry_run: false,
            profile: None,
        },
        _ => return None,
    };
    Some(Cli {
        config: None,
        command,
    })
}

/// The state on stdin, read once for the fast path (as much as createRuntime reads: one byte
/// past the cap), then read again from here by createRuntime: the same bytes, then the same
/// read error, if reading failed.
struct Replay {
    bytes: Vec<u8>,
    at: usize,
    error: Option<std::io::Error>,
}

impl Replay {
    fn of(stdin: impl std::io::Read) -> Replay {
        use std::io::Read;
        let mut bytes = Vec::new();
        let error = stdin
            .take(gpushare::container::intake::MAX_STATE_BYTES + 1)
            .read_to_end(&mut bytes)
            .err();
        Replay {
            bytes,
            at: 0,
            error,
        }
    }
}

impl std::io::Read for Replay {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest = &self.bytes[self.at..];
        if rest.is_empty() {
            return self.error.take().map_or(Ok(0), Err);
        }
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

/// Prints the one-line error (already logged), exits 1.
fn fail_unlogged(e: &dyn StdError) -> ExitCode {
    eprintln!("gpushare-hook: {}", vocab::chain(e));
    1
}

/// The policy file cannot be loaded. Its log path is unknown, so the error goes to the default
/// log file (and stderr). precreate still passes containers that ask for nothing (it runs for
/// every podman container), and carries the error to the createRuntime hook of those that ask;
/// doctor reports it; status, gc and poststop run on what can be read of it (see
/// [`gpushare::config::salvage`]); every other command fails with it.
fn without_policy(
    cmd: Cmd,
    source: &Source,
    e: &ConfigError,
    stdin: impl std::io::Read,
) -> ExitCode {
    let salvaged = gpushare::config::salvage(source);
    logging::init(Some(&salvaged.log_file));
    if let Some(d) = e.diagnostic() {
        tracing::error!(target: logging::EXIT_TARGET, "{d}");
    }
    let ctx = Ctx {
        cfg: salvaged,
        source: source.clone(),
    };
    let result = match cmd {
        Cmd::Precreate => commands::precreate_without_policy(e, stdin),
        Cmd::Doctor { json } => Ok(commands::doctor_without_policy(&ctx, e, json)),
        // Live shares must stay visible and releasable: the state where the file says it is,
        // the defaults for what cannot be read, and a warning.
        Cmd::Status { json } => {
            warn_salvaged(e, "status");
            Ok(commands::status(&ctx, json))
        }
        Cmd::Gc { json } => {
            warn_salvaged(e, "gc");
            Ok(commands::gc(&ctx, json))
        }
        Cmd::Poststop => {
            tracing::warn!("{} (poststop releases with what it could read of it and the defaults for the rest)", vocab::chain(e));
            commands::poststop(&ctx, stdin)
        }
        // Runtimes show a hook's stderr: one line there; the diagnostic is in the log.
        Cmd::CreateRuntime { dry_run, .. } | Cmd::Prestart { dry_run, .. } => {
            if !dry_run {
                commands::count_policy_refusal(&ctx, e, stdin);
            }
            return fail(e);
        }
        _ => return fail_config(e),
    };
    match result {
        Ok(reply) => print(&reply),
        Err(e) => fail(&e),
    }
}

/// The warning of a command that runs on what could be read of a broken policy file.
fn warn_salvaged(e: &ConfigError, cmd: &str) {
    let line = vocab::chain(e);
    tracing::warn!(target: logging::EXIT_TARGET, "{line} ({cmd} uses what it could read of it and the defaults for the rest)");
    eprintln!("gpushare-hook: warning: {line}; {cmd} uses what it could read of it and the defaults for the rest");
    if let Some(d) = e.diagnostic() {
        eprintln!("{d}");
    }
}

/// Writes the reply's output; a closed stdout is a failure.
fn print(reply: &Reply) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(&reply.stdout).and_then(|()| out.flush()) {
        Ok(()) => reply.code,
        Err(e) => fail(&e),
    }
}

/// Prints the one-line error, logs it, exits 1.
fn fail(e: &dyn StdError) -> ExitCode {
    let line = vocab::chain(e);
    tracing::error!(target: logging::EXIT_TARGET, "{line}");
    eprintln!("gpushare-hook: {line}");
    1
}

/// [`fail`] for a policy file, followed by the parser's own diagnostic when there is one (for
/// the admin commands, which people run in a terminal).
fn fail_config(e: &ConfigError) -> ExitCode {
    let code = fail(e);
    if let Some(d) = e.diagnostic() {
        eprintln!("{d}");
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The hook entries read without clap give what clap gives for them.
    #[test]
    fn hook_stage_cli_is_what_clap_parses() {
        for stage in ["createRuntime", "create-runtime", "prestart"] {
            let clap = Cli::try_parse_from(["gpushare-hook", stage]).unwrap();
            let (Cmd::CreateRuntime { dry_run, profile } | Cmd::Prestart { dry_run, profile }) =
                &clap.command
            else {
                panic!("{stage}: clap parsed {clap:?}");
            };
            assert!(!dry_run && profile.is_none() && clap.config.is_none());
        }
        // hook_stage_cli reads this process's own arguments (the test harness's): not a stage.
        assert!(hook_stage_cli().is_none());
    }

    /// The replayed stdin gives createRuntime the bytes, then the read error.
    #[test]
    fn replay_gives_the_same_bytes_then_the_error() {
        let r = Replay::of(&b"{\"id\":\"x\"}"[..]);
        assert!(r.error.is_none());
        let mut again = Vec::new();
        let mut r = r;
        r.read_to_end(&mut again).unwrap();
        assert_eq!(again, b"{\"id\":\"x\"}");

        struct Broken(bool);
        impl Read for Broken {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if std::mem::replace(&mut self.0, true) {
                    Err(std::io::Error::other("pipe broke"))
                } else {
                    buf[..2].copy_from_slice(b"{}");
                    Ok(2)
                }
            }
        }
        let mut r = Replay::of(Broken(false));
        assert!(r.error.is_some(), "the read error is kept");
        let mut got = Vec::new();
        let e = r.read_to_end(&mut got).unwrap_err();
        assert_eq!(e.to_string(), "pipe broke");
        assert_eq!(got, b"{}", "the bytes before it come first");
    }
}
