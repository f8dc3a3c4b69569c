//! The Go integration's own tests (clients/go/kube, `TestCluster*`) against the real
//! API server: the chart fences service account `op` by its Lease, the Lease publishes
//! a token, and `go test` gets the account's kubeconfig, the admin's, the namespace,
//! the Lease and the token in its environment (what those tests read).

use std::path::Path;
use std::process::Command;

use serde_json::json;
use support::accounts::service_account_token;
use support::tools::run_suite;
use support::{TestNamespace, kubeconfig, kubeconfig_path, repo_root};

use super::{LEASE, SA, fence, fenced_operator, lease_with_token};

const PUBLISHED: i64 = 7000;

/// A kubeconfig of the test cluster (server and CA as the admin's names them) that
/// authenticates with a token of service account `op`, written into `dir`.
async fn account_kubeconfig(ns: &TestNamespace, dir: &Path) -> std::path::PathBuf {
    let admin = kubeconfig();
    let cluster = admin.clusters[0]
        .cluster
        .as_ref()
        .expect("the admin kubeconfig names its cluster");
    let token = service_account_token(ns, SA, None).await;
    // JSON is YAML: client-go reads it as a kubeconfig.
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "op",
        "clusters": [{"name": "palisade-test", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": "op", "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": "palisade-test", "user": "op", "namespace": ns.name}}],
    });
    let path = dir.join("op.kubeconfig");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

#[tokio::test]
async fn the_go_integration_passes_its_tests_against_the_api_server() {
    let ns = support::setup("op-go").await;
    let (_release, config) = fenced_operator(&ns).await;
    lease_with_token(&ns, PUBLISHED).await;
    // The Go tests start with the policy in force: the API server refuses the token
    // below the published one (a new policy binding takes a moment to be enforced).
    fence(&ns.name, &config)
        .await
        .lead(PUBLISHED)
        .await
        .expect("the API server judges the account's writes by the Lease");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = account_kubeconfig(&ns, dir.path()).await;

    let mut go = Command::new("go");
    go.args(["test", "-count=1", "-v", "-run", "^TestCluster", "./..."])
        .current_dir(repo_root().join("clients/go/kube"))
        .env("PALISADE_OPERATOR_KUBECONFIG", &kubeconfig)
        .env("PALISADE_OPERATOR_NAMESPACE", &ns.name)
        .env("PALISADE_OPERATOR_LEASE", LEASE)
        .env("PALISADE_OPERATOR_TOKEN", PUBLISHED.to_string())
        .env("PALISADE_ADMIN_KUBECONFIG", kubeconfig_path())
        .env_remove("PALISADE_APISERVERS");
    let text = run_suite("go test -run '^TestCluster' (clients/go/kube)", go);
    eprintln!("{text}");
}
