//! `gpushare-hook`: the OCI hook stages and the admin commands. Thin: parse, log, call, exit.

use std::error::Error as StdError;
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gpushare::admin::configure;
use gpushare::cli::{Cli, Cmd};
use gpushare::commands::{self, Ctx, Reply};
use gpushare::config::{Config, ConfigError, Source};
use gpushare::{logging, vocab};

type Result<T> = std::result::Result<T, Box<dyn StdError>>;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if let Cmd::Version = cli.command {
        println!("gpushare-hook {}", gpushare::VERSION);
        return ExitCode::SUCCESS;
    }
    let source = Source::resolve(cli.config.as_deref());
    let loaded = Config::load_from(&source);
    if let Cmd::CreateRuntime { .. } | Cmd::Prestart { .. } = cli.command {
        // A refusal precreate carried here: the runtime shows this hook's stderr.
        if let Some(e) = commands::refused_by_precreate(std::io::stdin().lock(), || {
            let log = loaded
                .as_ref()
                .map_or_else(|_| Config::default().log_file, |c| c.log_file.clone());
            logging::init(Some(&log));
        }) {
            return fail(&e);
        }
    }
    let stdin = std::io::stdin().lock();
    let cfg = match loaded {
        Ok(c) => c,
        Err(e) => return without_policy(cli.command, &source, &e, stdin),
    };
    logging::init(Some(&cfg.log_file));
    let ctx = Ctx { cfg, source };
    let result: Result<Reply> = match cli.command {
        Cmd::CreateRuntime { dry_run } | Cmd::Prestart { dry_run } => {
            commands::create_runtime(&ctx, stdin, dry_run).map_err(Into::into)
        }
        Cmd::Poststop => commands::poststop(&ctx, stdin).map_err(Into::into),
        Cmd::Precreate => commands::precreate(&ctx, stdin).map_err(Into::into),
        Cmd::Status { json } => Ok(commands::status(&ctx, json)),
        Cmd::Gc { json } => Ok(commands::gc(&ctx, json)),
        Cmd::Configure {
            engine,
            path,
            dry_run,
            hooks_dir,
            order,
            containerd_version,
            policy_at,
            print,
            json,
        } => {
            let opts = configure::Options {
                path,
                dry_run,
                hooks_dir,
                order,
                containerd_version,
            };
            commands::configure(&ctx, engine, &opts, policy_at, print, json).map_err(Into::into)
        }
        Cmd::Doctor { json } => Ok(commands::doctor(&ctx, json)),
        Cmd::Metrics { openmetrics } => Ok(commands::metrics(&ctx, openmetrics)),
        Cmd::Serve { listen } => commands::serve(&ctx, listen).map_err(Into::into),
        Cmd::Events { follow } => commands::events(&ctx, follow).map_err(Into::into),
        Cmd::Version => unreachable!("handled above"),
    };
    match result {
        Ok(reply) => print(&reply),
        Err(e) => fail(e.as_ref()),
    }
}

/// The policy file cannot be loaded. Its log path is unknown, so the error goes to the default
/// log file (and stderr). precreate still passes containers that ask for nothing (it runs for
/// every podman container), and carries the error to the createRuntime hook of those that ask;
/// doctor reports it; every other command fails with it.
fn without_policy(
    cmd: Cmd,
    source: &Source,
    e: &ConfigError,
    stdin: impl std::io::Read,
) -> ExitCode {
    logging::init(Some(&Config::default().log_file));
    if let Some(d) = e.diagnostic() {
        tracing::error!(target: logging::EXIT_TARGET, "{d}");
    }
    let result = match cmd {
        Cmd::Precreate => commands::precreate_without_policy(e, stdin),
        Cmd::Doctor { json } => Ok(commands::doctor_without_policy(source, e, json)),
        // Runtimes show a hook's stderr: one line there; the diagnostic is in the log.
        Cmd::CreateRuntime { .. } | Cmd::Prestart { .. } | Cmd::Poststop => return fail(e),
        _ => return fail_config(e),
    };
    match result {
        Ok(reply) => print(&reply),
        Err(e) => fail(&e),
    }
}

/// Writes the reply's output; a closed stdout is a failure.
fn print(reply: &Reply) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(&reply.stdout).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::from(reply.code),
        Err(e) => fail(&e),
    }
}

/// Prints the one-line error, logs it, exits 1.
fn fail(e: &dyn StdError) -> ExitCode {
    let line = vocab::chain(e);
    tracing::error!(target: logging::EXIT_TARGET, "{line}");
    eprintln!("gpushare-hook: {line}");
    ExitCode::from(1)
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
