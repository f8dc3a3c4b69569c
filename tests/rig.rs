//! The test control plane itself: the pinned server version, and pod identity
//! through bound service-account tokens (which claim identity relies on).

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::TestNamespace;

#[tokio::test]
async fn server_reports_the_pinned_kubernetes_version() {
    let client = support::client().await;
    let info = client.apiserver_version().await.expect("GET /version");
    assert_eq!(info.git_version, support::pinned_kubernetes_version());
}

#[tokio::test]
async fn pod_bound_token_carries_the_pod_name_in_user_info() {
    let ns = TestNamespace::new("rig-identity").await;
    let sas: Api<ServiceAccount> = ns.api();
    let pods: Api<Pod> = ns.api();
    let pp = PostParams::default();

    sas.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "worker"}})).unwrap(),
    )
    .await
    .expect("create ServiceAccount");
    // No kubelet or scheduler: the Pod object only has to exist to bind a token to it.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "worker-0"},
        "spec": {
            "serviceAccountName": "worker",
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "registry.invalid/none:0"}]
        }
    }))
    .unwrap();
    let pod = pods.create(&pp, &pod).await.expect("create Pod");
    let pod_uid = pod.metadata.uid.clone().unwrap();

    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "worker-0", "uid": pod_uid}
        }
    }))
    .unwrap();
    let issued = sas
        .create_token_request("worker", &pp, &request)
        .await
        .expect("TokenRequest for the pod-bound token");
    let token = issued.status.expect("TokenRequest status").token;

    let as_pod = support::client_with_token(&token).await;
    let review = Api::<SelfSubjectReview>::all(as_pod)
        .create(&pp, &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview with the pod's token");
    let user = review.status.and_then(|s| s.user_info).expect("user info");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:worker", ns.name).as_str())
    );
    let extra = user.extra.expect("extra user info");
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["worker-0".to_string()])
    );
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![pod_uid])
    );
}
