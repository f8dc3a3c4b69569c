//! The API calls a write pass makes, behind a small trait: [`KubeApiServer`] makes them on
//! the API server; tests answer them from a model server with the same
//! compare-and-swap rules (`model_tests`).

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::error::{Error, Result};
use super::grant::ClaimUpdate;
use super::index::LeaseKey;
use crate::crd::{CONTROLLER_MANAGER, Lease, LeaseClaim};
use crate::kube_client::{CONTROLLER_CALL_TIMEOUT, within};

/// Reads are quorum reads (served from etcd, not a cache); writes are conditional.
pub trait ApiServer: Clone + Send + Sync + 'static {
    fn get_lease(&self, key: &LeaseKey) -> impl Future<Output = Result<Option<Lease>>> + Send;

    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<LeaseClaim>>> + Send;

    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>>> + Send;

    /// Replaces the Lease's status, conditioned on the `metadata.resourceVersion` of
    /// `desired`: a conflict (409) if the Lease changed since, not found (404) if it is gone.
    fn replace_lease_status(
        &self,
        key: &LeaseKey,
        desired: &Lease,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Sets a claim's status, conditioned on its UID and, when the update says so, its
    /// resourceVersion: invalid (422) when either changed, not found (404) if it is gone.
    fn patch_claim_status(
        &self,
        namespace: &str,
        update: &ClaimUpdate,
    ) -> impl Future<Output = Result<LeaseClaim>> + Send;
}

/// The API server, each call under [`CONTROLLER_CALL_TIMEOUT`].
#[derive(Clone)]
pub struct KubeApiServer {
    client: Client,
}

impl KubeApiServer {
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

impl ApiServer for KubeApiServer {
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<Lease>> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
        within(CONTROLLER_CALL_TIMEOUT, api.get_opt(&key.name))
            .await
            .map_err(|e| Error::api("get Lease", e))
    }

    async fn get_claim(&self, namespace: &str, name: &str) -> Result<Option<LeaseClaim>> {
        let api: Api<LeaseClaim> = Api::namespaced(self.client.clone(), namespace);
        within(CONTROLLER_CALL_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|e| Error::api("get LeaseClaim", e))
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        within(CONTROLLER_CALL_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|e| Error::api("get Pod", e))
    }

    async fn replace_lease_status(&self, key: &LeaseKey, desired: &Lease) -> Result<Lease> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
        let params = PostParams {
            field_manager: Some(CONTROLLER_MANAGER.to_string()),
            ..Default::default()
        };
        within(
            CONTROLLER_CALL_TIMEOUT,
            api.replace_status(&key.name, &params, desired),
        )
        .await
        .map_err(|e| Error::api("replace Lease status", e))
    }

    async fn patch_claim_status(
        &self,
        namespace: &str,
        update: &ClaimUpdate,
    ) -> Result<LeaseClaim> {
        let api: Api<LeaseClaim> = Api::namespaced(self.client.clone(), namespace);
        // A JSON patch that tests the UID, so a claim re-created under the same name is
        // left alone; and, when it ends a grant, the resourceVersion (a failed test: 422).
        let mut ops =
            vec![serde_json::json!({"op": "test", "path": "/metadata/uid", "value": update.uid})];
        if let Some(rv) = &update.condition_on {
            ops.push(
                serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
            );
        }
        ops.push(serde_json::json!({"op": "add", "path": "/status", "value": update.status}));
        let patch = serde_json::Value::Array(ops);
        let patch: json_patch::Patch =
            serde_json::from_value(patch).expect("a well-formed JSON patch");
        within(
            CONTROLLER_CALL_TIMEOUT,
            api.patch_status(
                &update.name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            ),
        )
        .await
        .map_err(|e| Error::api("patch LeaseClaim status", e))
    }
}
