//! The API server: the claims the kubelet names, and the node's ResourceSlices (kept equal to
//! what [`crate::slices`] says, the pool's generation raised whenever they change).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;

use crate::grpc::{BoxFuture, ClaimSource};
use crate::slices::NODE_LABEL;

/// The field manager of the slices.
const MANAGER: &str = "gpushare-dra";

/// Claims read from the API server.
pub struct KubeClaims(pub Client);

impl ClaimSource for KubeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// The spec of each slice, without the pool's generation, by name: what decides whether the
/// published slices are current.
fn content(slices: &[ResourceSlice]) -> BTreeMap<String, serde_json::Value> {
    slices
        .iter()
        .map(|s| {
            let mut spec = serde_json::to_value(&s.spec).expect("spec serialises");
            spec["pool"]["generation"] = serde_json::Value::Null;
            (s.metadata.name.clone().unwrap_or_default(), spec)
        })
        .collect()
}

/// Makes the published slices of `node` equal to `desired` (built for generation 0): nothing
/// when they are; otherwise every desired slice applied at the next generation, and the
/// slices no longer desired deleted. Returns whether anything changed.
///
/// # Errors
/// The API server's.
pub async fn publish(
    client: &Client,
    node: &str,
    mut desired: Vec<ResourceSlice>,
) -> Result<bool, kube::Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await?;
    let published: Vec<ResourceSlice> = list
        .items
        .into_iter()
        .filter(|s| s.spec.driver == crate::DRIVER)
        .collect();
    if content(&published) == content(&desired) {
        return Ok(false);
    }
    let generation = published
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0)
        + 1;
    let params = PatchParams::apply(MANAGER).force();
    for s in &mut desired {
        s.spec.pool.generation = generation;
        let mut body = serde_json::to_value(&*s).expect("slice serialises");
        body["apiVersion"] = "resource.k8s.io/v1".into();
        body["kind"] = "ResourceSlice".into();
        let name = s.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(body)).await?;
    }
    let keep: Vec<String> = desired
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    for s in published {
        let name = s.metadata.name.unwrap_or_default();
        if !keep.contains(&name) {
            api.delete(&name, &DeleteParams::default()).await?;
        }
    }
    Ok(true)
}
