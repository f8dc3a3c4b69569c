//! Fenced operators against the real API server: the chart's `policies.operators`
//! policy judges every write of the named service account (every verb, subresources,
//! server-side apply, custom resources) against its Lease's token, leaves everyone
//! else's alone; `palisade::operator` stamps the token, confirms before the first
//! write, and a deposed leader's client is refused once its successor leads.
//! One module per concern: the policy's verdicts (verdicts.rs), leadership handed over
//! through the controller (handover.rs).

mod go_kube;
mod handover;
mod verdicts;

use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Config};
use palisade::crd::{Lease, LeaseSpec};
use palisade::operator::Fence;
use serde_json::json;
use support::TestNamespace;
use support::accounts::{bind_client_role, create_sa_and_pod, service_account_token};
use support::helm::Release;

/// The operator's service account in every test.
const SA: &str = "op";
const LEASE: &str = "op-lease";

/// The chart installed with `ns`'s service account `op` fenced by Lease `op-lease`;
/// the account may write ConfigMaps and Deployments (with /status and /scale) and hold
/// Leases. Returns the release and the account's configuration.
async fn fenced_operator(ns: &TestNamespace) -> (Release, Config) {
    let operators =
        json!([{"serviceAccount": {"namespace": ns.name, "name": SA}, "lease": {"name": LEASE}}]);
    let release = Release::install(
        ns,
        &[&ns.name],
        &[
            "--set-json",
            &format!("policies.operators={operators}"),
            "--set",
            "replicaCount=0",
        ],
    );
    create_sa_and_pod(ns, SA, &[]).await;
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, SA).await;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "operator-writes"},
        "rules": [{"apiGroups": ["", "apps"],
                   "resources": ["configmaps", "deployments", "deployments/status", "deployments/scale"],
                   "verbs": ["*"]}]
    }))
    .unwrap();
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "operator-writes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator-writes"},
        "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": ns.name}]
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = service_account_token(ns, SA, None).await;
    let mut config = support::admin_config().await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    (release, config)
}

/// Creates the Lease and publishes `token` on it, as the controller would.
async fn lease_with_token(ns: &TestNamespace, token: i64) {
    ns.api::<Lease>()
        .create(
            &PostParams::default(),
            &Lease::new(LEASE, LeaseSpec::default()),
        )
        .await
        .unwrap();
    publish_token(ns, token).await;
}

async fn publish_token(ns: &TestNamespace, token: i64) {
    ns.api::<Lease>()
        .patch_status(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"fencingToken": token, "phase": "Held"}})),
        )
        .await
        .unwrap_or_else(|e| panic!("publishing token {token} on Lease {LEASE}: {e}"));
}

/// A fence of the account, confirming against the test plane's one API server.
async fn fence(namespace: &str, config: &Config) -> Fence {
    Fence::new(config.clone(), namespace, LEASE)
        .await
        .expect("the fence learns the service account's name")
        .with_servers(vec![config.cluster_url.clone()])
}

/// The error's Status, for a request the API server must refuse.
fn refusal<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, kube::Error>,
) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("{what}: expected the API server to refuse it, got {other:?}"),
    }
}

fn configmaps(
    client: &kube::Client,
    namespace: &str,
) -> Api<k8s_openapi::api::core::v1::ConfigMap> {
    Api::namespaced(client.clone(), namespace)
}
