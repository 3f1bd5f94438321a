//! `gpushare-hook`: the OCI hook stages and the admin commands. Thin: parse, log, call, exit.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gpushare::cli::{Cli, Cmd};
use gpushare::commands::{self, Ctx, Reply};
use gpushare::config::{Config, Source};
use gpushare::{logging, vocab};

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
    let cfg = match Config::load_from(&source) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    logging::init(Some(&cfg.log_file));
    let ctx = Ctx { cfg, source };
    let stdin = std::io::stdin().lock();
    let result = match cli.command {
        Cmd::CreateRuntime { dry_run } | Cmd::Prestart { dry_run } => {
            commands::create_runtime(&ctx, stdin, dry_run)
        }
        Cmd::Poststop => commands::poststop(&ctx, stdin),
        Cmd::Precreate => commands::precreate(&ctx, stdin),
        Cmd::Status { json } => Ok(commands::status(&ctx, json)),
        Cmd::Gc { json } => Ok(commands::gc(&ctx, json)),
        Cmd::Configure { engine } => Ok(commands::configure(&ctx, engine)),
        Cmd::Doctor { json } => Ok(commands::doctor(&ctx, json)),
        Cmd::Version => unreachable!("handled above"),
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
fn fail(e: &dyn std::error::Error) -> ExitCode {
    let line = vocab::chain(e);
    tracing::error!(target: logging::EXIT_TARGET, "{line}");
    eprintln!("gpushare-hook: {line}");
    ExitCode::from(1)
}
