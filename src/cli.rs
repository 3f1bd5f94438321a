//! The command line of `gpushare-hook`, in the library so that man pages and shell
//! completions can be generated from the same definition.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::admin::configure::Engine;

/// `gpushare-hook`: the OCI hook stages and the admin commands.
#[derive(Debug, Parser)]
#[command(
    name = "gpushare-hook",
    version,
    about = "Share NVIDIA GPUs between OCI containers"
)]
pub struct Cli {
    /// Policy file (default: $GPUSHARE_CONFIG, else /etc/gpushare/config.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Cmd,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Drop clients whose process is gone, stop unused daemons, remove leftovers.
    Gc {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the configuration that wires gpushare into an engine (to merge into its files).
    Configure {
        #[arg(value_enum)]
        engine: Engine,
    },
    /// Check the driver, NVML, MPS binaries, compute modes, state dir and engines (read-only).
    Doctor {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the version.
    Version,
}
