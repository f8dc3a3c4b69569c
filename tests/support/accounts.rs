//! Workload identities: ServiceAccounts, Pods that run as them (objects only, no
//! kubelet), their tokens, and the chart's client role bound to them.

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::TestNamespace;

/// A token of ServiceAccount `sa`, bound to `pod` when given (as the kubelet mounts it).
pub async fn service_account_token(ns: &TestNamespace, sa: &str, pod: Option<&Pod>) -> String {
    let mut spec = json!({"audiences": [], "expirationSeconds": 3600});
    if let Some(pod) = pod {
        spec["boundObjectRef"] = json!({
            "apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid().unwrap()
        });
    }
    let request: TokenRequest = serde_json::from_value(json!({ "spec": spec })).unwrap();
    ns.api::<ServiceAccount>()
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for ServiceAccount {sa}: {e}"))
        .status
        .expect("TokenRequest status")
        .token
}

/// ServiceAccount `sa` and, running as it, the Pods `pods`.
pub async fn create_sa_and_pod(ns: &TestNamespace, sa: &str, pods: &[&str]) -> Vec<Pod> {
    let pp = PostParams::default();
    ns.api::<ServiceAccount>()
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": sa}})).unwrap(),
        )
        .await
        .unwrap();
    let mut out = vec![];
    for name in pods {
        // No kubelet or scheduler: the Pod object only has to exist to bind a token to it.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"serviceAccountName": sa, "automountServiceAccountToken": false,
                     "containers": [{"name": "main", "image": "registry.invalid/none:0"}]}
        }))
        .unwrap();
        out.push(ns.api::<Pod>().create(&pp, &pod).await.unwrap());
    }
    out
}

/// Binds the ClusterRole `<release>-client` to ServiceAccount `sa_ns/sa` in namespace `ns`.
pub async fn bind_client_role(ns: &str, client: &Client, release: &str, sa_ns: &str, sa: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{sa_ns}-{sa}-palisade")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": format!("{release}-client")},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}
