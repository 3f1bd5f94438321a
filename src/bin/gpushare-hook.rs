//! `gpushare-hook`: the OCI hook stages and the admin commands. Thin: parse, log, call, exit.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpushare::config::Config;
use gpushare::hook::{self, Outcome};
use gpushare::{admin, error, logging};

#[derive(Parser)]
#[command(
    name = "gpushare-hook",
    version,
    about = "Share NVIDIA GPUs between OCI containers"
)]
struct Cli {
    /// Policy file (default: $GPUSHARE_CONFIG, else /etc/gpushare/config.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// OCI createRuntime hook: acquire the container's GPU share (state on stdin).
    #[command(name = "createRuntime", alias = "create-runtime")]
    CreateRuntime {
        /// Print the plan as JSON and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// OCI prestart hook: the same work as createRuntime.
    Prestart {
        /// Print the plan as JSON and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// OCI poststop hook: release the container (state on stdin). Idempotent.
    Poststop,
    /// podman precreate hook: edit the config.json on stdin for env injection, print it.
    Precreate,
    /// Show GPUs, modes, daemons, clients and limits.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Drop clients whose process is gone, stop unused daemons, remove leftovers.
    Gc {
        #[arg(long)]
        json: bool,
    },
    /// Print the configuration that wires gpushare into an engine (to merge into its files).
    Configure {
        #[arg(value_enum)]
        engine: gpushare::configure::Engine,
    },
    /// Check the driver, NVML, MPS binaries, compute modes, state dir and engines (read-only).
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Cmd::Version = cli.command {
        println!("gpushare-hook {}", gpushare::VERSION);
        return ExitCode::SUCCESS;
    }
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    logging::init(Some(&cfg.log_file));
    let open = || hook::nvml_inventory(&cfg);
    match cli.command {
        Cmd::CreateRuntime { dry_run } | Cmd::Prestart { dry_run } => {
            match hook::create_runtime(std::io::stdin().lock(), &cfg, dry_run, &open) {
                Ok(Outcome::Nothing) => ExitCode::SUCCESS,
                Ok(Outcome::Done(plan)) => {
                    if dry_run {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&plan).expect("plan serialises")
                        );
                    } else {
                        tracing::info!(container = %plan.container, mode = %plan.mode, gpus = ?plan.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), "acquired");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Cmd::Precreate => {
            let path = gpushare::prepare::config_path(cli.config.as_deref());
            match gpushare::prepare::precreate(std::io::stdin().lock(), &cfg, path, &open) {
                Ok(out) => {
                    use std::io::Write;
                    let mut so = std::io::stdout().lock();
                    match so.write_all(&out).and_then(|()| so.flush()) {
                        Ok(()) => ExitCode::SUCCESS,
                        Err(e) => fail(&e),
                    }
                }
                Err(e) => fail(&e),
            }
        }
        Cmd::Poststop => match hook::poststop(std::io::stdin().lock(), &cfg, &open) {
            Ok(warnings) => {
                for w in warnings {
                    tracing::warn!("poststop: {w}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Cmd::Status { json } => {
            let inv = open().ok();
            let st = admin::status(&cfg, inv.as_deref());
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&st).expect("status serialises")
                );
            } else {
                print!("{}", st.human());
            }
            ExitCode::SUCCESS
        }
        Cmd::Gc { json } => {
            let report = match open() {
                Ok(inv) => admin::gc(&cfg, inv.as_ref()),
                Err(e) => {
                    let inv = gpushare::inventory::Unavailable(error::chain(&e));
                    admin::gc(&cfg, &inv)
                }
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&report).expect("report serialises")
                );
            } else {
                for line in &report {
                    println!("{line}");
                }
            }
            ExitCode::SUCCESS
        }
        Cmd::Configure { engine } => {
            let path = gpushare::prepare::config_path(cli.config.as_deref());
            print!(
                "{}",
                gpushare::configure::snippet(engine, &cfg, path.as_deref())
            );
            ExitCode::SUCCESS
        }
        Cmd::Doctor { json } => {
            let source = gpushare::prepare::config_path(cli.config.as_deref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| {
                    let default = gpushare::config::DEFAULT_PATH;
                    if std::path::Path::new(default).exists() {
                        default.to_owned()
                    } else {
                        "defaults (no policy file)".to_owned()
                    }
                });
            let checks = gpushare::doctor::run(&cfg, &source);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&checks).expect("checks serialise")
                );
            } else {
                print!("{}", gpushare::doctor::human(&checks));
            }
            let failed = checks
                .iter()
                .any(|c| c.verdict == gpushare::doctor::Verdict::Fail);
            if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Cmd::Version => unreachable!("handled above"),
    }
}

/// Prints the one-line error, logs it, exits 1.
fn fail(e: &dyn std::error::Error) -> ExitCode {
    let line = error::chain(e);
    tracing::error!(target: logging::EXIT_TARGET, "{line}");
    eprintln!("gpushare-hook: {line}");
    ExitCode::from(1)
}
