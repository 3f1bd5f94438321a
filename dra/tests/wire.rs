//! The plugin over the real gRPC wire, as a kubelet drives it: a test kubelet dials the
//! registration socket, reads the plugin's info, confirms the registration, then dials the
//! endpoint it was given and prepares and unprepares claims (v1, and v1beta1 as older kubelets
//! call). The claims come from a fake API server (a map), the GPUs from a fake inventory.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use gpushare_dra::grpc::{self, BoxFuture, ClaimSource};
use gpushare_dra::pb::registration::registration_client::RegistrationClient;
use gpushare_dra::pb::registration::{InfoRequest, RegistrationStatus};
use gpushare_dra::pb::{v1, v1beta1};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tonic::transport::{Channel, Endpoint};

/// The fake API server's claims.
#[derive(Default, Clone)]
struct Claims(Arc<Mutex<HashMap<String, ResourceClaim>>>);

impl Claims {
    fn add(&self, c: ResourceClaim) {
        let name = c.metadata.name.clone().unwrap();
        self.0.lock().unwrap().insert(name, c);
    }
}

impl ClaimSource for Claims {
    fn get<'a>(
        &'a self,
        _: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        let c = self.0.lock().unwrap().get(name).cloned();
        Box::pin(async move { c.ok_or_else(|| "resourceclaims not found".to_owned()) })
    }
}

async fn dial(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap()
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    registered: Arc<AtomicBool>,
    reg: PathBuf,
}

/// The plugin on `dir` (the kubelet's directories and its own) serving `claims`.
async fn start(dir: &Path, claims: &Claims, sizes: Vec<u64>) -> Running {
    let cfg = policy("[runtime]\nhook = \"/usr/bin/gpushare-hook\"\n");
    let driver = Arc::new(driver(cfg, dir, sizes));
    let plugin = grpc::Plugin::new(driver, Arc::new(claims.clone()));
    let reg = gpushare_dra::registration_socket(&dir.join("plugins_registry"));
    let dra = dir.join("plugins/gpushare.io/dra.sock");
    let registered = Arc::new(AtomicBool::new(false));
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let (r, d, flag) = (reg.clone(), dra.clone(), registered.clone());
    let task = tokio::spawn(async move {
        grpc::serve(plugin, &d, &r, flag, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    for _ in 0..200 {
        if reg.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Running {
        stop,
        task,
        registered,
        reg,
    }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
        assert!(
            !self.reg.exists(),
            "the registration socket is removed at exit"
        );
    }
}

/// What a kubelet does on seeing the registration socket: GetInfo, checks, then notifies.
async fn register(r: &Running) -> PathBuf {
    let mut c = RegistrationClient::new(dial(&r.reg).await);
    let info = c.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpushare.io");
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert!(!r.registered.load(Ordering::SeqCst));
    c.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    assert!(
        r.registered.load(Ordering::SeqCst),
        "the plugin took the kubelet's word"
    );
    PathBuf::from(info.endpoint)
}

fn wire_claim(name: &str) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        uid: uid(name),
        name: name.into(),
    }
}

async fn prepare(ch: &Channel, names: &[&str]) -> HashMap<String, v1::NodePrepareResourceResponse> {
    let mut c = v1::dra_plugin_client::DraPluginClient::new(ch.clone());
    c.node_prepare_resources(v1::NodePrepareResourcesRequest {
        claims: names.iter().map(|n| wire_claim(n)).collect(),
    })
    .await
    .unwrap()
    .into_inner()
    .claims
}

async fn unprepare(
    ch: &Channel,
    names: &[&str],
) -> HashMap<String, v1::NodeUnprepareResourceResponse> {
    let mut c = v1::dra_plugin_client::DraPluginClient::new(ch.clone());
    c.node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
        claims: names.iter().map(|n| wire_claim(n)).collect(),
    })
    .await
    .unwrap()
    .into_inner()
    .claims
}

fn spec_of(dir: &Path, name: &str) -> Option<serde_json::Value> {
    let p = gpushare_dra::driver::spec_path(&dir.join("cdi"), &uid(name));
    std::fs::read(p)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
}

fn checkpoint(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("state/checkpoint.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_registers_the_plugin_then_prepares_and_unprepares_claims() {
    let t = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    // One GPU of 8 GiB: the node admits 8 GiB of caps (memory_overcommit 1.0).
    claims.add(claim("a", "gpu-0-mps", Some("4Gi"), None));
    claims.add(claim(
        "b",
        "gpu-0-mps",
        Some("3Gi"),
        Some(config(serde_json::json!({"cores": 25}))),
    ));
    claims.add(claim("c", "gpu-0-mps", Some("2Gi"), None));
    claims.add(claim(
        "bad",
        "gpu-0-mps",
        None,
        Some(config(serde_json::json!({"memory": "lots"}))),
    ));
    let run = start(t.path(), &claims, vec![8 * GIB]).await;
    let endpoint = register(&run).await;
    assert_eq!(endpoint, t.path().join("plugins/gpushare.io/dra.sock"));
    let ch = dial(&endpoint).await;

    let got = prepare(&ch, &["a", "b"]).await;
    for (name, mem) in [("a", "4Gi"), ("b", "3Gi")] {
        let r = &got[&uid(name)];
        assert_eq!(r.error, "", "{name}");
        assert_eq!(r.devices.len(), 1);
        let d = &r.devices[0];
        assert_eq!(
            (d.pool_name.as_str(), d.device_name.as_str()),
            (NODE, "gpu-0-mps")
        );
        assert_eq!(d.request_names, ["gpu"]);
        assert_eq!(
            d.cdi_device_ids,
            [
                format!("gpushare.io/claim=c-{}", uid(name)),
                "nvidia.com/gpu=0".into()
            ]
        );
        // The claim's CDI spec hands the request to the createRuntime hook through argv.
        let spec = spec_of(t.path(), name).expect("spec written");
        assert_eq!(spec["kind"], "gpushare.io/claim");
        let dev = &spec["devices"][0];
        assert_eq!(dev["name"], format!("c-{}", uid(name)));
        let hook = &dev["containerEdits"]["hooks"][0];
        assert_eq!(hook["hookName"], "createRuntime");
        assert_eq!(hook["path"], "/usr/bin/gpushare-hook");
        let mut want = format!("gpu.share=mps,gpu.share.memory={mem}");
        if name == "b" {
            want.push_str(",gpu.share.cores=25");
        }
        assert_eq!(
            hook["args"],
            serde_json::json!(["gpushare-hook", "createRuntime", "--profile", want])
        );
        assert_eq!(dev["containerEdits"]["hooks"][1]["hookName"], "poststop");
    }

    // 4 + 3 GiB held: 2 GiB more does not fit; the kubelet shows the reason on the pod.
    let got = prepare(&ch, &["c"]).await;
    let e = &got[&uid("c")].error;
    assert!(
        e.contains("GPU 0")
            && e.contains("cannot take 2.0 GiB more")
            && e.contains("7.0 GiB of the 8.0 GiB"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(
        spec_of(t.path(), "c").is_none(),
        "nothing written for a refused claim"
    );
    // A bad config gets the annotation's own error.
    let got = prepare(&ch, &["bad", "missing"]).await;
    let e = &got[&uid("bad")].error;
    assert!(e.starts_with("gpushare.io config: gpu.share.memory"), "{e}");
    assert!(got[&uid("missing")]
        .error
        .contains("resourceclaims not found"));
    let cp = checkpoint(t.path());
    let held: Vec<&String> = cp["claims"].as_object().unwrap().keys().collect();
    let mut want = [uid("a"), uid("b")];
    want.sort();
    assert_eq!(
        held,
        want.iter().collect::<Vec<_>>(),
        "only a and b are held"
    );

    // A restart of the plugin: the same answers, from the checkpoint, through v1beta1 as
    // well; a lost spec file is written again.
    let before = prepare(&ch, &["a"]).await;
    run.stop().await;
    std::fs::remove_file(gpushare_dra::driver::spec_path(
        &t.path().join("cdi"),
        &uid("a"),
    ))
    .unwrap();
    let run = start(t.path(), &claims, vec![8 * GIB]).await;
    let ch = dial(&register(&run).await).await;
    let again = prepare(&ch, &["a"]).await;
    assert_eq!(before, again);
    assert!(spec_of(t.path(), "a").is_some(), "the spec is back");
    let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(ch.clone());
    let old = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "default".into(),
                uid: uid("b"),
                name: "b".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let d = &old.claims[&uid("b")].devices[0];
    assert_eq!(d.device_name, "gpu-0-mps");
    assert_eq!(
        d.cdi_device_ids[0],
        format!("gpushare.io/claim=c-{}", uid("b"))
    );

    // Unprepare releases the share and removes the spec; then c fits.
    let got = unprepare(&ch, &["b", "never-prepared"]).await;
    assert_eq!(got.len(), 2, "every claim of the request has an entry");
    assert!(got.values().all(|r| r.error.is_empty()), "{got:?}");
    assert!(spec_of(t.path(), "b").is_none());
    assert!(checkpoint(t.path())["claims"].get(uid("b")).is_none());
    let got = prepare(&ch, &["c"]).await;
    assert_eq!(got[&uid("c")].error, "");
    assert!(spec_of(t.path(), "c").is_some());
    // Idempotent unprepare.
    assert!(unprepare(&ch, &["b"]).await[&uid("b")].error.is_empty());
    run.stop().await;
}
