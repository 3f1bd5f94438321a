//! `gpushare-dra`: the DRA kubelet plugin. Parses arguments and calls the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gpushare_dra::driver::NvidiaName;

/// gpushare's DRA kubelet plugin: publishes the node's GPUs as ResourceSlices and prepares
/// claims as gpushare shares.
#[derive(Debug, Parser)]
#[command(name = "gpushare-dra", version)]
struct Cli {
    /// The node's name (the pool's; in a DaemonSet, from the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// gpushare's policy file (default: $GPUSHARE_CONFIG, else /etc/gpushare/config.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The kubelet's plugin registration directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// The directory of the plugin's DRA socket.
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpushare.io")]
    plugin_dir: PathBuf,
    /// Where prepared claims are checkpointed.
    #[arg(long, default_value = "/var/lib/gpushare-dra")]
    state_dir: PathBuf,
    /// Where the per-claim CDI specs go (a directory the container runtime reads).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// How NVIDIA's CDI spec on this node names GPUs.
    #[arg(long, value_enum, default_value = "index")]
    nvidia_cdi_name: NvidiaName,
    /// Seconds between checks that the published ResourceSlices still match the GPUs.
    #[arg(long, default_value_t = 60)]
    resync_seconds: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let opts = gpushare_dra::Options {
        node: cli.node_name,
        config: cli.config,
        registry_dir: cli.registry_dir,
        plugin_dir: cli.plugin_dir,
        state_dir: cli.state_dir,
        cdi_dir: cli.cdi_dir,
        nvidia: cli.nvidia_cdi_name,
        resync: std::time::Duration::from_secs(cli.resync_seconds.max(1)),
    };
    match gpushare_dra::run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare-dra: {e}");
            ExitCode::FAILURE
        }
    }
}
