//! `gpushare-serve`: what `gpushare-hook serve` runs, with the hook's command line (the hook
//! replaces itself with it). The metrics agent lives in a binary of its own so that the HTTP
//! server it carries (hyper, tokio) is not loaded by the hook that every container runs.
//! Thin: parse, load the policy, log, serve, exit.

#[path = "shared/exit.rs"]
mod exit;

use clap::Parser;
use gpushare::cli::{Cli, Cmd};
use gpushare::commands::{self, Ctx};
use gpushare::config::{Config, Source};
use gpushare::logging;

fn main() -> std::process::ExitCode {
    logging::start_clock();
    std::process::ExitCode::from(run())
}

fn run() -> exit::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let Cmd::Serve { listen } = cli.command else {
        eprintln!("gpushare-serve: runs only `gpushare-hook serve`; run the other commands with gpushare-hook");
        return 2;
    };
    let source = Source::resolve(cli.config.as_deref());
    let cfg = match Config::load_from(&source) {
        Ok(c) => c,
        Err(e) => {
            // Its log path is unknown: the error goes to the log file of what can be read.
            logging::init(Some(&gpushare::config::salvage(&source).log_file));
            if let Some(d) = e.diagnostic() {
                tracing::error!(target: logging::EXIT_TARGET, "{d}");
            }
            return exit::fail_config(&e);
        }
    };
    logging::init(Some(&cfg.log_file));
    match commands::serve(&Ctx { cfg, source }, listen) {
        Ok(reply) => exit::print(&reply),
        Err(e) => exit::fail(&e),
    }
}
