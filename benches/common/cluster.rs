//! What the benches that run against the local control plane share: the client, the
//! CRDs, a namespace of their own, the controller process, and waiting for waiters.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config, CustomResourceExt, ResourceExt};
use palisade::client::LeaseClient;
use palisade::crd::{Lease, LeaseClaim};
use serde_json::json;

/// The longest wait for a state a bench expects (every wait is bounded).
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The local control plane of `make cluster`: its kubeconfig, a client configuration, a client.
pub async fn connect() -> (PathBuf, Config, Client) {
    let kubeconfig = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/cluster/kubeconfig");
    let kc = Kubeconfig::read_from(&kubeconfig)
        .expect("no target/cluster/kubeconfig: run `make cluster` (make bench does)");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let (client, _) = palisade::kube_client::client(config.clone()).unwrap();
    install_crds(&client).await;
    (kubeconfig, config, client)
}

async fn install_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [Lease::crd(), LeaseClaim::crd()] {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply("palisade-bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
        kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await
        .unwrap();
    }
}

pub async fn create_namespace(client: &Client, ns: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
}

pub async fn delete_namespace(client: &Client, ns: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::background())
        .await;
}

/// `palisade controller` for `ns` (the binary of the bench's profile: release under
/// `cargo bench`, debug under the smoke run of `make test`; or, for a before figure,
/// the one `PALISADE_CONTROLLER_BIN` names), and its admin port.
pub async fn start_controller(kubeconfig: &PathBuf, ns: &str) -> (tokio::process::Child, u16) {
    let controller_bin = std::env::var_os("PALISADE_CONTROLLER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_palisade")),
        PathBuf::from,
    );
    let admin_port = support::free_port();
    let controller = tokio::process::Command::new(&controller_bin)
        .args([
            "controller",
            "--namespace",
            ns,
            "--leader-elect=false",
            "--admin-addr",
        ])
        .arg(format!("127.0.0.1:{admin_port}"))
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting {}: {e} (make bench builds it)",
                controller_bin.display()
            )
        });
    tokio::time::sleep(Duration::from_millis(500)).await;
    (controller, admin_port)
}

/// Waits until the Lease lists `n` waiting claims, so the next handover has someone to go to.
pub async fn wait_waiting(leases: &LeaseClient, lease: &str, n: i64) {
    let mut stream = watcher::watch_object(leases.leases().clone(), lease).boxed();
    let seen = tokio::time::timeout(WAIT_LIMIT, async {
        while let Some(Ok(Some(l))) = stream.next().await {
            if l.status.as_ref().and_then(|s| s.waiting_count) == Some(n) {
                return true;
            }
        }
        false
    })
    .await;
    match seen {
        Ok(true) => {}
        Ok(false) => panic!("watch on {lease} ended"),
        Err(_) => panic!("{lease} did not list {n} waiting claims within {WAIT_LIMIT:?}"),
    }
}

/// The API server's count of requests to palisade's resources, all verbs and codes.
// Not every bench that includes this file counts requests (the operator bench does not).
#[allow(dead_code)]
pub async fn palisade_requests(client: &Client) -> f64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(req)
        .await
        .expect("GET /metrics of the API server");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(r#"group="palisade.dev""#)
                && (l.contains(r#"resource="leases""#) || l.contains(r#"resource="leaseclaims""#))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
