//! palisade in pods, on the local cluster's real node (kubelet + containerd, see
//! tests/controlplane/node.sh): the chart's controller Deployment, and the example workload
//! (examples/ledger) taking the Lease from three pods and writing a fenced ConfigMap.
//!
//! Installed as a user installs it: the chart from the cluster's OCI registry
//! (PALISADE_TEST_REGISTRY, where `make chart` pushed it) with README.md's install
//! command, and the images `make image-local` pushed there, which the kubelet pulls.
//!
//! One test drives the whole story in order (one chart install and one workload keep
//! it within its time budget; story.rs, in named steps); the bad-input checks
//! (bad_input.rs) and the bridge check (bridge.rs) are separate tests. The release is
//! `palisade` (the example binds the ClusterRole `palisade-client`), watching only the
//! workload's namespace, with its admission policies bound to that namespace only.
//!
//! Namespaces that run pods carry the annotation scheduler.alpha.kubernetes.io/node-selector
//! with an empty value: cluster.sh gives every other namespace a node selector no node
//! matches, so the Pod objects other tests create as records are never scheduled.

mod bad_input;
mod bridge;
mod install;
mod ledger;
mod story;

use std::process::Output;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::helm::{helm_command, test_registry};
use support::tools::{kubectl_command, text};

const RELEASE: &str = "palisade";
const SYSTEM_NS: &str = "palisade-system";
const LEDGER_NS: &str = "palisade-ledger";
const NODE_NAME: &str = "palisade-node";
/// README.md's install command is the one helm command between these markers.
const README_INSTALL_BEGIN: &str = "<!-- install-command:begin";
const README_INSTALL_END: &str = "<!-- install-command:end -->";
/// The registry README.md installs from; the tests swap in the cluster's.
const PUBLISHED_REGISTRY: &str = "ghcr.io/palisade-dev";
/// The example's Lease duration (examples/ledger/ledger.yaml).
const LEASE_SECONDS: u64 = 5;

/// helm or kubectl `args` against the test cluster (helm with a home of its own).
fn run(program: &str, args: &[&str]) -> Output {
    let mut cmd = match program {
        "helm" => helm_command(true),
        "kubectl" => kubectl_command(),
        other => panic!("run: not helm or kubectl: {other}"),
    };
    cmd.args(args);
    support::tools::run(cmd, None)
}

fn ok(program: &str, args: &[&str]) -> Output {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        text(&out)
    );
    out
}

/// The digest `make image-local` recorded when it pushed image `name` to the registry.
fn pushed_digest(name: &str) -> String {
    let path = support::repo_root().join(format!("target/images/{name}.digest"));
    let digest = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e}; `make image-local` pushes the images to the registry and records their digests",
            path.display()
        )
    });
    let digest = digest.trim().to_string();
    assert!(
        digest.starts_with("sha256:"),
        "{}: not a digest: {digest:?}",
        path.display()
    );
    digest
}

/// The example image (palisade, kubectl, a POSIX shell) by the digest `make image-local`
/// pushed: exactly that build, whichever build the tag names on the node.
fn example_image() -> String {
    format!(
        "{}/palisade-example@{}",
        test_registry(),
        pushed_digest("palisade-example")
    )
}

/// The messages of the events about pod `name` with `reason` (Pulled, Failed, BackOff), as
/// `kubectl get events` shows them.
async fn pod_events(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name},reason={reason}"
    ));
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .collect()
}

/// Waits (at most 30 s: the kubelet posts events on its own time) for an event about pod
/// `name` with `reason` whose message names `image`, and returns that message.
async fn event_naming(client: &Client, ns: &str, name: &str, reason: &str, image: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = pod_events(client, ns, name, reason).await;
        if let Some(m) = seen.iter().find(|m| m.contains(image)) {
            return m.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} event of pod {ns}/{name} names {image} within 30s; its {reason} events: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A namespace whose pods run on the node, enforcing the `restricted` Pod Security Standard.
async fn pod_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    if let Ok(old) = api.get(name).await {
        if old.metadata.deletion_timestamp.is_none() {
            let _ = api.delete(name, &DeleteParams::background()).await;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while api.get_opt(name).await.unwrap().is_some() {
            assert!(
                Instant::now() < deadline,
                "namespace {name} from an earlier run is not gone after 60s"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {
        "name": name,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted", "palisade.dev/test": "true"},
        "annotations": {"scheduler.alpha.kubernetes.io/node-selector": ""},
    }}))
    .unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (watching) until pod `name` in `ns` satisfies `check`, for at most `limit`.
async fn wait_pod<F>(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    limit: Duration,
    check: F,
) -> Pod
where
    F: Fn(&Pod) -> bool,
{
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    support::wait_for_within(pods, name, &format!("pod {name}: {what}"), limit, |p| {
        p.is_some_and(&check)
    })
    .await
    .expect("a pod that satisfies the check exists")
}

/// The pod's container has exited: the pod failed or succeeded.
fn exited(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Failed" || ph == "Succeeded")
}

fn restricted_pod(name: &str, image: &str, sa: &str, command: &[&str]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": sa,
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": command,
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                ],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))
    .unwrap()
}

/// The reason and message of the pod's first container while it waits.
fn waiting_reason(p: &Pod) -> Option<(String, String)> {
    let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
    let waiting = statuses.first()?.state.as_ref()?.waiting.as_ref()?;
    Some((
        waiting.reason.clone()?,
        waiting.message.clone().unwrap_or_default(),
    ))
}
