//! gpushare's Kubernetes DRA kubelet plugin: publishes each GPU's memory as ResourceSlices so
//! that the scheduler counts what the node admits, and prepares allocated claims as gpushare
//! shares (a CDI spec per claim whose hook runs gpushare's own createRuntime with the claim's
//! request).
//!
//! - [`claim`]: a claim's opaque config and allocation in, a checked gpushare request out;
//! - [`slices`]: the node's GPUs in, its ResourceSlices out (pure);
//! - [`driver`]: prepare and unprepare, with the checkpoint and the per-claim CDI specs;
//! - [`grpc`]: the kubelet's registration and DRA services over unix sockets;
//! - [`kubeapi`]: the API server: fetching claims, publishing slices.
//!
//! The binary (`src/main.rs`) only parses arguments and calls [`run`].

pub mod authority;
pub mod claim;
pub mod driver;
pub mod grpc;
pub mod kubeapi;
pub mod slices;

/// The generated gRPC code of the kubelet's APIs (proto/).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    /// pluginregistration v1.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// DRA kubelet plugin service, v1.
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// DRA kubelet plugin service, v1beta1.
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

/// The DRA driver's name: ResourceSlices, DeviceClasses and opaque configs name it.
pub const DRIVER: &str = "gpushare.io";

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// What `gpushare-dra` is told.
pub struct Options {
    pub node: String,
    pub config: Option<PathBuf>,
    pub registry_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub nvidia: driver::NvidiaName,
    pub resync: Duration,
}

/// The registration socket's name in the kubelet's plugins_registry directory.
pub fn registration_socket(registry_dir: &std::path::Path) -> PathBuf {
    registry_dir.join(format!("{DRIVER}-reg.sock"))
}

/// Runs the plugin until SIGTERM or SIGINT: publishes the slices (and keeps them current),
/// serves registration and the DRA service.
///
/// # Errors
/// A one-line reason: bad policy, unreadable checkpoint, no API server, a socket not bound.
pub fn run(opts: Options) -> Result<(), String> {
    let source = gpushare::config::Source::resolve(opts.config.as_deref());
    let cfg =
        gpushare::config::Config::load_from(&source).map_err(|e| gpushare::vocab::chain(&e))?;
    let inv_cfg = cfg.clone();
    let open: driver::Opener = Box::new(move || gpushare::host::inventory::open(&inv_cfg));
    let drv = Arc::new(driver::Driver::new(
        cfg,
        source.to_hand_on(),
        &opts.node,
        driver::Paths {
            state_dir: opts.state_dir,
            cdi_dir: opts.cdi_dir,
            nvidia: opts.nvidia,
        },
        open,
    )?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("cannot reach the API server: {e}"))?;
        let publisher = {
            let (client, drv) = (client.clone(), drv.clone());
            async move {
                loop {
                    let desired = drv
                        .inventory()
                        .and_then(|inv| slices::gpus(inv.as_ref()))
                        .map(|g| slices::slices(drv.node(), &g, drv.config(), 0));
                    match desired {
                        Ok(d) => match kubeapi::publish(&client, drv.node(), d).await {
                            Ok(true) => tracing::info!("ResourceSlices published"),
                            Ok(false) => {}
                            Err(e) => tracing::error!(error = %e, "ResourceSlices not published"),
                        },
                        Err(e) => tracing::error!(error = %gpushare::vocab::chain(&e), "cannot list the GPUs"),
                    }
                    tokio::time::sleep(opts.resync).await;
                }
            }
        };
        tokio::spawn(publisher);
        let plugin = grpc::Plugin::new(drv, Arc::new(kubeapi::KubeClaims(client)));
        let dra = opts.plugin_dir.join("dra.sock");
        let reg = registration_socket(&opts.registry_dir);
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        grpc::serve(plugin, &dra, &reg, Arc::new(AtomicBool::new(false)), shutdown)
            .await
            .map_err(|e| e.to_string())
    })
}
