//! What the operator workers (operator_worker.rs) need on the chaos plane before they
//! start. The operators policy and its RBAC (impersonating itself with the token,
//! listing the API servers) come from the chart, rendered with the suite's other
//! policies (cluster.rs) with [`chart_value`]; here: the service account, the chart's
//! client role and a Role to write the objects it owns bound to it, the Lease, the
//! objects, a token, and a wait until the policy judges the account.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Config};
use palisade::client::LeaseClient;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, HA_APISERVERS, LEASE_SECONDS};
use crate::operator_worker::{
    OPERATOR_LEASE, OPERATOR_NAMESPACE as NAMESPACE, SERVICE_ACCOUNT, STATE_CONFIGMAP,
    TARGET_DEPLOYMENT,
};

/// The chart's client role as `helm template chaos` names it (`<fullname>-client`).
const CLIENT_ROLE: &str = "chaos-palisade-client";

/// `--set-json` of `policies.operators`: the account, fenced by the operators' Lease,
/// failing closed in their namespace. While an API server cannot resolve the policy's
/// paramKind (up to 30 s after it starts, until its admission REST mapper, reset every
/// 30 s, sees the CRD), it applies the failure policy to every write the policy's
/// rules match: the default, Ignore, would let a deposed leader's writes through a
/// restarted server land after its successor's; Fail refuses them, and every other
/// user's writes in the namespaces named (none of the suite's other workers write there).
pub fn chart_value() -> String {
    let operators = json!([{
        "serviceAccount": {"namespace": NAMESPACE, "name": SERVICE_ACCOUNT},
        "lease": {"name": OPERATOR_LEASE},
        "namespaces": [NAMESPACE],
        "failurePolicy": "Fail",
    }]);
    format!("policies.operators={operators}")
}

/// Creates `object` (as JSON) in [`NAMESPACE`]; one that exists already is fine.
async fn create<K>(admin: &Client, object: Value) -> Result<(), String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let what = format!(
        "{} {}",
        K::kind(&K::DynamicType::default()),
        object["metadata"]["name"]
    );
    let parsed: K = serde_json::from_value(object).map_err(|e| format!("{what}: {e}"))?;
    match Api::<K>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &parsed)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("creating {what}: {e}")),
    }
}

/// The account, its roles, the Lease and the objects; the account's token written to
/// a file in `out`, whose path it returns.
pub async fn set_up(admin: &Client, plane: &ControlPlane, out: &Path) -> Result<PathBuf, String> {
    create::<ServiceAccount>(admin, json!({"metadata": {"name": SERVICE_ACCOUNT}})).await?;
    let subjects =
        json!([{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]);
    create::<RoleBinding>(admin, json!({
        "metadata": {"name": "chaos-operator-claims"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLIENT_ROLE},
        "subjects": subjects,
    }))
    .await?;
    create::<Role>(admin, json!({
        "metadata": {"name": "chaos-operator-writes"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]},
            {"apiGroups": ["apps"], "resources": ["deployments/status"], "verbs": ["get", "patch"]},
        ],
    }))
    .await?;
    create::<RoleBinding>(admin, json!({
        "metadata": {"name": "chaos-operator-writes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "chaos-operator-writes"},
        "subjects": subjects,
    }))
    .await?;
    LeaseClient::new(admin.clone(), NAMESPACE)
        .ensure_lease(OPERATOR_LEASE, LEASE_SECONDS as i64)
        .await
        .map_err(|e| format!("creating lease {OPERATOR_LEASE}: {e}"))?;
    // Not labelled palisade.dev/fenced-by: the object-fencing policy has no say here.
    create::<ConfigMap>(admin, json!({"metadata": {"name": STATE_CONFIGMAP}})).await?;
    // No replicas: the deployment controller (kube-controller-manager runs on the
    // plane) keeps its status without pods, and no node is needed.
    create::<Deployment>(admin, json!({
        "metadata": {"name": TARGET_DEPLOYMENT},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": TARGET_DEPLOYMENT}},
                 "template": {"metadata": {"labels": {"app": TARGET_DEPLOYMENT}},
                              "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}]}}},
    }))
    .await?;
    let token = account_token(admin).await?;
    wait_judged(plane, &token).await?;
    let path = out.join("operator.token");
    std::fs::write(&path, &token).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// A token of the account, valid longer than any run.
async fn account_token(admin: &Client) -> Result<String, String> {
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 86400}}))
            .expect("a TokenRequest");
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("TokenRequest for {SERVICE_ACCOUNT}: {e}"))?
        .status
        .map(|s| s.token)
        .ok_or_else(|| "the TokenRequest returned no token".into())
}

/// The API server loads a new admission policy asynchronously: waits until every API
/// server refuses a tokenless write of the account (a dry run, so nothing changes).
async fn wait_judged(plane: &ControlPlane, token: &str) -> Result<(), String> {
    let kubeconfigs = if plane.ha {
        (0..HA_APISERVERS)
            .map(|j| plane.apiserver_kubeconfig(j))
            .collect()
    } else {
        vec![plane.kubeconfig()]
    };
    let probe = json!({"data": {"probe": "tokenless"}});
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    for kubeconfig in kubeconfigs {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| e.to_string())?;
        let mut config = Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        config.auth_info = AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        };
        let client = Client::try_from(config).map_err(|e| e.to_string())?;
        let configmaps: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
        let mut judged = false;
        for _ in 0..300 {
            match configmaps
                .patch(STATE_CONFIGMAP, &dry_run, &Patch::Merge(&probe))
                .await
            {
                Err(kube::Error::Api(e))
                    if e.code == 403 && e.message.contains("fencing token") =>
                {
                    judged = true;
                    break;
                }
                // Not yet authorized (RBAC comes into effect asynchronously too): ask again.
                Err(kube::Error::Api(e)) if e.code == 403 => {}
                Err(e) => return Err(format!("probing the operators policy: {e}")),
                Ok(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !judged {
            return Err(format!(
                "the operators policy did not judge {SERVICE_ACCOUNT}'s writes within 30 s ({})",
                kubeconfig.display()
            ));
        }
    }
    Ok(())
}
