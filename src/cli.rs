//! The command line of `gpushare-hook`, in the library so that man pages and shell
//! completions can be generated from the same definition.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::admin::configure::{Engine, Order};

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
        /// The named request of the CDI device that added this hook (`mps`, `timeslice`,
        /// `limit` or a `[profiles.<name>]` of the policy).
        #[arg(long, value_name = "NAME")]
        profile: Option<String>,
    },
    /// OCI prestart hook: the same work as createRuntime.
    Prestart {
        /// Print the plan as JSON and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The named request of the CDI device that added this hook.
        #[arg(long, value_name = "NAME")]
        profile: Option<String>,
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
    /// Release the clients of GPU UUID as their processes exit (started by the createRuntime
    /// hook; exits when the GPU has no client left to watch).
    #[command(hide = true)]
    Reap { uuid: String },
    /// Wire gpushare into an engine: merge into its files (atomic, with a backup), say what to
    /// restart. A second run changes nothing.
    Configure {
        #[arg(value_enum)]
        engine: Engine,
        /// Act on FILE instead of the engine's usual file (daemon.json, config.toml, the
        /// containers.conf or CRI-O drop-in, the policy or NVIDIA's config.toml).
        #[arg(long, value_name = "FILE")]
        path: Option<PathBuf>,
        /// Print a unified diff of what would change; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// podman/CRI-O: put the hook files under DIR/hooks.d and DIR/hooks.d-podman instead of
        /// the system hooks dirs.
        #[arg(long, value_name = "DIR")]
        hooks_dir: Option<PathBuf>,
        /// nvidia-container-runtime: which runtime comes first.
        #[arg(long, value_enum, default_value_t = Order::GpushareFirst)]
        order: Order,
        /// containerd: config version for a new file (2 for containerd 1.x, 3 for 2.x; default:
        /// from `containerd --version`).
        #[arg(long, value_parser = clap::value_parser!(i64).range(2..=3))]
        containerd_version: Option<i64>,
        /// docker: also make gpushare the daemon's default runtime (`"default-runtime":
        /// "gpushare"`), so that `--annotation gpu.share=…` works without `--runtime gpushare`;
        /// containers that ask for nothing pass straight through to runc.
        #[arg(long)]
        default_runtime: bool,
        /// The policy file as the engine will see it, when that differs from the one read (an
        /// installer writing a node's files from elsewhere). At the default path, nothing is
        /// handed on.
        #[arg(long, value_name = "FILE")]
        policy_at: Option<PathBuf>,
        /// Also write gpushare's CDI spec into DIR with this run's policy. The node-wide specs
        /// (/etc/cdi, /var/run/cdi) follow the policy only when configure runs on the node's
        /// own engine files with the node's own policy; with --path, --hooks-dir, --config or
        /// --policy-at it only says what it would write there.
        #[arg(long, value_name = "DIR")]
        cdi_dir: Option<PathBuf>,
        /// Print the files as `# ---- PATH` sections (`(merge)`: gpushare's part of a file to
        /// merge into) instead of writing them.
        #[arg(long, conflicts_with = "dry_run")]
        print: bool,
        /// Undo what `configure` wrote for the engine (atomic, with a backup; a second run
        /// changes nothing). Other entries are left alone.
        #[arg(long, conflicts_with = "print")]
        remove: bool,
        /// Write the entries even though gpushare-runtime or the hook is not at the path they
        /// name (an installer preparing a node).
        #[arg(long)]
        allow_missing: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check the driver, NVML, MPS binaries, compute modes, state dir and engines (read-only).
    Doctor {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the version.
    Version,
    /// Print the Prometheus metrics of GPUs, MPS domains, containers and the node's counters
    /// once (for node_exporter's textfile collector).
    Metrics {
        /// Print OpenMetrics 1.0 instead of the Prometheus text format.
        #[arg(long)]
        openmetrics: bool,
    },
    /// Serve /metrics and /healthz on [serve] listen and run the healing pass of gc every
    /// [serve] gc_interval_seconds, until SIGTERM.
    Serve {
        /// Listen on ADDR (host:port, the host an address or a name such as localhost) instead
        /// of [serve] listen (e.g. 0.0.0.0:9401 in a pod).
        #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Print the event log ([serve] events_file) for people.
    Events {
        /// Keep printing events as they are written (across a log rotation), until Ctrl-C.
        #[arg(long, short)]
        follow: bool,
    },
    /// CDI: offer shares as devices `gpushare.io/share=<mode or profile>`.
    Cdi {
        #[command(subcommand)]
        command: CdiCmd,
    },
}

/// `gpushare-hook cdi …`.
#[derive(Debug, Subcommand)]
pub enum CdiCmd {
    /// Write the CDI spec (kind gpushare.io/share): a device per mode and per [profiles.<name>]
    /// of the policy, atomically; a second run changes nothing.
    Generate {
        /// Directory to write gpushare.io-share.json into (engines read /var/run/cdi and
        /// /etc/cdi).
        #[arg(long, value_name = "DIR", default_value = crate::admin::cdi::DEFAULT_DIR)]
        output: PathBuf,
        /// Print a unified diff of what would change; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `serve --listen`: `host:port`, the host an IP address or a name (`localhost:9401`), resolved
/// here to one address (an IPv4 one when the name has both).
///
/// # Errors
/// Not `host:port`, or a name that does not resolve.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let bad =
        |why: String| format!("{s}: {why}; give host:port, like localhost:9401 or 0.0.0.0:9401");
    let addrs: Vec<std::net::SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| bad("no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn serve_listens_on_a_host_name_and_port() {
        let cli = Cli::try_parse_from(["gpushare-hook", "serve", "--listen", "localhost:9401"])
            .expect("localhost:9401 is accepted");
        let Cmd::Serve { listen: Some(a) } = cli.command else {
            panic!("not serve --listen")
        };
        assert!(a.ip().is_loopback() && a.port() == 9401, "{a}");
        for ok in ["0.0.0.0:9401", "[::1]:9401", "127.0.0.1:1"] {
            assert_eq!(parse_listen(ok).unwrap().to_string(), ok);
        }
        for bad in ["localhost", "9401", "localhost:port", ""] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("host:port"), "{bad}: {e}");
        }
    }
}
