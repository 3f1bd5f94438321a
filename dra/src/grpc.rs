//! The kubelet's two gRPC services over unix sockets: plugin registration (a socket in the
//! kubelet's plugins_registry directory) and the DRA service, v1 and v1beta1 (one socket; the
//! two versions carry the same messages, so v1beta1 calls are answered by the v1 code).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use prost::Message;
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

use crate::driver::{Driver, Prepared};
use crate::pb::registration::registration_server::{Registration, RegistrationServer};
use crate::pb::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::pb::{v1, v1beta1};
use crate::DRIVER;

/// The plugin type the kubelet's DRA manager handles.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services served, newest first, as the kubelet names them in registration.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// A boxed future, for [`ClaimSource`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where the plugin reads the claims the kubelet names (the API server; a fake in tests).
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`, or why not (one line).
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>>;
}

/// The registration service.
pub struct Registrar {
    endpoint: PathBuf,
    registered: Arc<AtomicBool>,
}

impl Registrar {
    /// Registration of the DRA service at `endpoint`; `registered` follows the kubelet's word.
    pub fn new(endpoint: PathBuf, registered: Arc<AtomicBool>) -> Self {
        Self {
            endpoint,
            registered,
        }
    }
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: DRIVER.to_owned(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.map(str::to_owned).to_vec(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!(error = %s.error, "the kubelet refused the registration");
        }
        self.registered.store(s.plugin_registered, Ordering::SeqCst);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The DRA service.
#[derive(Clone)]
pub struct Plugin {
    driver: Arc<Driver>,
    claims: Arc<dyn ClaimSource>,
}

impl Plugin {
    /// The service of `driver`, reading claims from `claims`.
    pub fn new(driver: Arc<Driver>, claims: Arc<dyn ClaimSource>) -> Self {
        Self { driver, claims }
    }

    async fn prepare_one(&self, c: &v1::Claim) -> v1::NodePrepareResourceResponse {
        let answer = match self.claims.get(&c.namespace, &c.name).await {
            Ok(claim) => self
                .driver
                .prepare(&c.uid, &claim)
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot read claim {}/{}: {e}", c.namespace, c.name)),
        };
        match answer {
            Ok(p) => v1::NodePrepareResourceResponse {
                devices: vec![device(&p)],
                error: String::new(),
            },
            Err(error) => {
                tracing::warn!(claim = %c.uid, namespace = %c.namespace, name = %c.name, %error, "claim not prepared");
                v1::NodePrepareResourceResponse {
                    devices: vec![],
                    error,
                }
            }
        }
    }
}

fn device(p: &Prepared) -> v1::Device {
    v1::Device {
        request_names: vec![p.request_name.clone()],
        pool_name: p.pool.clone(),
        device_name: p.device.clone(),
        cdi_device_ids: p.cdi_devices.clone(),
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let mut out = v1::NodePrepareResourcesResponse::default();
        for c in req.into_inner().claims {
            let r = self.prepare_one(&c).await;
            out.claims.insert(c.uid, r);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let mut out = v1::NodeUnprepareResourcesResponse::default();
        for c in req.into_inner().claims {
            let error = match self.driver.unprepare(&c.uid) {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            };
            out.claims
                .insert(c.uid, v1::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}

/// A message of one version as the same message of the other (same fields, same numbers).
fn convert<A: Message, B: Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice()).map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let r = v1::dra_plugin_server::DraPlugin::node_prepare_resources(
            self,
            Request::new(convert(req.get_ref())?),
        )
        .await?;
        Ok(Response::new(convert(r.get_ref())?))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let r = v1::dra_plugin_server::DraPlugin::node_unprepare_resources(
            self,
            Request::new(convert(req.get_ref())?),
        )
        .await?;
        Ok(Response::new(convert(r.get_ref())?))
    }
}

/// Binds a unix socket at `path`, replacing a stale one left by an earlier run. The socket
/// appears at `path` only once it listens: it is bound under a hidden name in the same
/// directory (the kubelet's plugin watcher skips names starting with `.`) and renamed into
/// place, so that a kubelet dialling as soon as it sees the file is never refused (between
/// bind(2) and listen(2) a connect is refused).
///
/// # Errors
/// When the directory cannot be made or the socket bound.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: no file name", path.display())))?;
    let hidden = dir.join(format!(
        ".{}.{}.binding",
        name.to_string_lossy(),
        std::process::id()
    ));
    for p in [path, hidden.as_path()] {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let listener = UnixListener::bind(&hidden)?;
    if let Err(e) = std::fs::rename(&hidden, path) {
        let _ = std::fs::remove_file(&hidden);
        return Err(e);
    }
    Ok(listener)
}

/// Serves the DRA service (v1 and v1beta1) on `dra` and registration on `registration`
/// until `shutdown` resolves; the sockets are removed then, which the kubelet takes as the
/// plugin going away.
///
/// # Errors
/// When a socket cannot be bound or a server fails.
pub async fn serve(
    plugin: Plugin,
    dra: &Path,
    registration: &Path,
    registered: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The DRA socket first: the kubelet dials it as soon as registration answers.
    let dra_listener = bind(dra)?;
    let reg_listener = bind(registration)?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let dra_server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(plugin.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(plugin))
        .serve_with_incoming_shutdown(crate::authority::incoming(dra_listener), wait(rx.clone()));
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(Registrar::new(
            dra.to_owned(),
            registered,
        )))
        .serve_with_incoming_shutdown(crate::authority::incoming(reg_listener), wait(rx));
    tokio::spawn(async move {
        shutdown.await;
        let _ = tx.send(true);
    });
    let (a, b) = tokio::join!(dra_server, reg_server);
    let _ = std::fs::remove_file(registration);
    let _ = std::fs::remove_file(dra);
    a?;
    b?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bind;

    /// A kubelet dials a plugin's socket the moment it sees the file, and between bind(2) and
    /// listen(2) a connect is refused: the file must never be there before the socket listens.
    /// So the socket is bound under a hidden name (the address the listener reports) and only
    /// renamed into place once it listens; a stale file of an earlier run is replaced and
    /// nothing hidden is left behind.
    #[test]
    fn the_socket_appears_only_once_it_listens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpushare.io-reg.sock");
        std::fs::write(&path, b"stale").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = bind(&path).unwrap();
            let bound = l.local_addr().unwrap();
            let bound = bound.as_pathname().unwrap().to_owned();
            assert_ne!(
                bound, path,
                "bound under its final name, visible before it listens"
            );
            assert_eq!(bound.parent(), path.parent());
            assert!(
                bound
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with('.'),
                "{} is not hidden from the kubelet's plugin watcher",
                bound.display()
            );
            assert!(!bound.exists(), "{} left behind", bound.display());
            // Positive control: the file at the final name is this listening socket.
            let client = tokio::net::UnixStream::connect(&path).await.unwrap();
            let (_server, _) = l.accept().await.unwrap();
            drop(client);
        });
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gpushare.io-reg.sock"]);
    }
}
