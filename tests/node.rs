//! palisade in pods, on the local cluster's real node (kubelet + containerd, see
//! tests/controlplane/node.sh): the chart's controller Deployment with the image built by
//! `make image-local`, and the example workload (examples/ledger) taking the Lease from
//! three pods and writing a fenced ConfigMap.
//!
//! One test drives the whole story in order (one chart install and one workload keep
//! it within its time budget); the bad-input checks are separate tests. The release is
//! `palisade` (the example binds the ClusterRole `palisade-client`), watching only the
//! workload's namespace, with its admission policies bound to that namespace only.
//!
//! Namespaces that run pods carry the annotation scheduler.alpha.kubernetes.io/node-selector
//! with an empty value: cluster.sh gives every other namespace a node selector no node
//! matches, so the Pod objects other tests create as records are never scheduled.

use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease as CoordinationLease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use palisade::api::Lease;
use serde_json::json;
use support::helm::{chart_dir, helm_command, with_helm_home};
use support::tools::{kubectl_command, text, tool};

const RELEASE: &str = "palisade";
const SYSTEM_NS: &str = "palisade-system";
const LEDGER_NS: &str = "palisade-ledger";
const NODE_NAME: &str = "palisade-node";
const EXAMPLE_IMAGE: &str = "palisade.local/palisade-example:0.2.0";
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

fn example() -> String {
    support::repo_root()
        .join("examples/ledger/ledger.yaml")
        .display()
        .to_string()
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

/// One version of the fenced ConfigMap, as the watch saw it.
#[derive(Debug, Clone)]
struct Write {
    token: u64,
    holder: String,
    phase: String,
}

fn record(history: &Arc<Mutex<Vec<Write>>>, cm: &ConfigMap) {
    let data = cm.data.clone().unwrap_or_default();
    let token = data.get("token").and_then(|t| t.parse().ok()).unwrap_or(0);
    if token == 0 {
        return;
    }
    let w = Write {
        token,
        holder: data.get("holder").cloned().unwrap_or_default(),
        phase: data.get("phase").cloned().unwrap_or_default(),
    };
    let mut h = history.lock().unwrap();
    let last = h.last();
    if last.is_none_or(|l| l.token != w.token || l.phase != w.phase) {
        h.push(w);
    }
}

/// The history's invariants: tokens never decrease; a token belongs to one holder; a
/// critical section (enter..exit of one token) is never interleaved with another token.
fn check_history(history: &[Write]) {
    let mut open: Option<u64> = None;
    let mut owner = std::collections::BTreeMap::new();
    for (i, w) in history.iter().enumerate() {
        if i > 0 {
            assert!(
                w.token >= history[i - 1].token,
                "token went down at write {i}: {history:#?}"
            );
        }
        let prev = owner.entry(w.token).or_insert_with(|| w.holder.clone());
        assert_eq!(
            *prev, w.holder,
            "token {} written by two pods: {history:#?}",
            w.token
        );
        match w.phase.as_str() {
            "enter" => open = Some(w.token),
            "exit" => {
                if let Some(t) = open {
                    assert_eq!(
                        t, w.token,
                        "exit of {} inside the section of {t}: {history:#?}",
                        w.token
                    );
                }
                open = None;
            }
            other => panic!("unexpected phase {other:?}"),
        }
    }
}

fn sections(history: &Arc<Mutex<Vec<Write>>>) -> usize {
    history
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.phase == "exit")
        .count()
}

fn max_token(history: &Arc<Mutex<Vec<Write>>>) -> u64 {
    history
        .lock()
        .unwrap()
        .iter()
        .map(|w| w.token)
        .max()
        .unwrap_or(0)
}

async fn lease(client: &Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), LEDGER_NS)
        .get("ledger")
        .await
        .unwrap()
}

fn holder_of(l: &Lease) -> Option<(String, i64)> {
    let s = l.status.as_ref()?;
    Some((s.holder.as_ref()?.identity.clone(), s.fencing_token?))
}

/// Waits for a grant to a holder other than `old` and returns it with the time it took.
async fn next_grant(
    client: &Client,
    old: &str,
    since: Instant,
    limit: Duration,
) -> (String, i64, Duration) {
    let deadline = since + limit;
    loop {
        if let Some((h, t)) = holder_of(&lease(client).await)
            && h != old
        {
            return (h, t, since.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "no grant to another pod within {limit:?} of deleting {old}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `palisade_is_leader` of every controller pod, read through the API server's pod proxy.
async fn leaders(client: &Client) -> Vec<(String, bool)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=controller");
    let mut out = Vec::new();
    for p in pods.list(&lp).await.unwrap() {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.name_any();
        let req = http::Request::get(format!(
            "/api/v1/namespaces/{SYSTEM_NS}/pods/{name}:8080/proxy/metrics"
        ))
        .body(Vec::new())
        .unwrap();
        let Ok(metrics) = client.request_text(req).await else {
            continue;
        };
        let leader = metrics
            .lines()
            .find(|l| l.starts_with("palisade_is_leader"))
            .is_some_and(|l| l.trim_end().ends_with(" 1"));
        out.push((name, leader));
    }
    out
}

async fn ready_replicas(client: &Client) -> i32 {
    let d = Api::<Deployment>::namespaced(client.clone(), SYSTEM_NS)
        .get(RELEASE)
        .await
        .unwrap();
    let s = d.status.unwrap_or_default();
    if s.updated_replicas == Some(2) && s.replicas == Some(2) {
        s.ready_replicas.unwrap_or(0)
    } else {
        0
    }
}

/// Uninstalls the release when the test ends, passed or not: a cluster-wide controller
/// left running would interfere with the test binaries that run after this one.
struct Uninstall;

impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
        let _ = run(
            "kubectl",
            &[
                "delete",
                "namespace",
                LEDGER_NS,
                "palisade-demo-test",
                "--wait=false",
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_and_workload_run_as_pods_on_the_node() {
    let client = support::client().await;
    let _uninstall = Uninstall;

    // The node: Ready, schedulable, no taints.
    let node = Api::<Node>::all(client.clone())
        .get(NODE_NAME)
        .await
        .unwrap_or_else(|e| {
            panic!("node {NODE_NAME} is not registered ({e}); `make cluster` starts it (NODE=1)")
        });
    let spec = node.spec.clone().unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "node is cordoned");
    assert!(
        spec.taints.unwrap_or_default().is_empty(),
        "node has taints: {:?}",
        node.spec
    );
    let ready = node.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        ready
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "node not Ready: {ready:?}"
    );

    // The chart, with the image `make image-local` imported into the node.
    let _ = run("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
    pod_namespace(&client, SYSTEM_NS).await;
    pod_namespace(&client, LEDGER_NS).await;
    let t0 = Instant::now();
    ok(
        "helm",
        &[
            "install",
            RELEASE,
            chart_dir().to_str().unwrap(),
            "-n",
            SYSTEM_NS,
            "--set",
            "image.pullPolicy=Never",
            "--set",
            &format!("controller.watchNamespace={LEDGER_NS}"),
            "--set",
            &format!(
                "policies.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={LEDGER_NS}"
            ),
        ],
    );
    wait_until(
        "the controller Deployment 2/2 Ready",
        Duration::from_secs(90),
        || async { ready_replicas(&client).await == 2 },
    )
    .await;
    println!(
        "helm install to 2/2 Ready: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    wait_until(
        "exactly one leader (palisade_is_leader)",
        Duration::from_secs(30),
        || async {
            let l = leaders(&client).await;
            l.len() == 2 && l.iter().filter(|(_, x)| *x).count() == 1
        },
    )
    .await;

    // The workload: three pods contend for the Lease and write the fenced ConfigMap.
    let history = Arc::new(Mutex::new(Vec::<Write>::new()));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), LEDGER_NS);
    let watch = {
        let history = history.clone();
        let cfg = watcher::Config::default().fields("metadata.name=ledger");
        tokio::spawn(async move {
            let mut events = watcher(cms, cfg).boxed();
            while let Some(e) = events.next().await {
                if let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = e {
                    record(&history, &cm);
                }
            }
        })
    };
    ok("kubectl", &["-n", LEDGER_NS, "apply", "-f", &example()]);
    let t1 = Instant::now();
    wait_until(
        "three critical sections in the ConfigMap",
        Duration::from_secs(90),
        || async { sections(&history) >= 3 },
    )
    .await;
    println!(
        "workload applied to 3 sections: {:.1}s",
        t1.elapsed().as_secs_f64()
    );

    // Graceful delete of the holder: the next pod is granted, with a higher token.
    for (how, args) in [
        ("graceful", &[][..]),
        (
            "--grace-period=0 --force",
            &["--grace-period=0", "--force"][..],
        ),
    ] {
        // A holder with a waiter queued behind it: a pod restarted after exit 75 may
        // still be in the kubelet's crash-loop back-off, and with nobody waiting the
        // Lease would rightly stay Free after the delete.
        let (holder, token) = loop {
            let l = lease(&client).await;
            let waiting = l.status.as_ref().and_then(|s| s.waiting_count).unwrap_or(0);
            if let Some(h) = holder_of(&l)
                && waiting > 0
            {
                break h;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let since = Instant::now();
        let mut a = vec![
            "-n",
            LEDGER_NS,
            "delete",
            "pod",
            holder.as_str(),
            "--wait=false",
        ];
        a.extend_from_slice(args);
        ok("kubectl", &a);
        let (next, next_token, took) = next_grant(
            &client,
            &holder,
            since,
            Duration::from_secs(LEASE_SECONDS * 4),
        )
        .await;
        println!(
            "delete pod ({how}) of {holder} (token {token}) -> grant to {next} (token {next_token}) in {:.2}s",
            took.as_secs_f64()
        );
        assert!(
            next_token > token,
            "token did not increase: {token} -> {next_token}"
        );
        if how.contains("force") {
            assert!(
                took < Duration::from_secs(LEASE_SECONDS),
                "force delete: the grant took {took:?}, i.e. it waited for expiry ({LEASE_SECONDS}s) instead of revoking on pod deletion"
            );
        }
    }

    // Deleting the leading controller pod: the standby takes over and grants continue.
    // Polled: under the workload's load a leader may step down for about a second (its
    // 750 ms renew deadline missed) before a replica leads again, and a metrics read
    // through the API server's pod proxy may fail once.
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let seen = leaders(&client).await;
        if let Some((pod, _)) = seen.iter().find(|(_, l)| *l) {
            break pod.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no controller pod led for 30 s; last seen (pod, leading): {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let before = max_token(&history);
    ok(
        "kubectl",
        &["-n", SYSTEM_NS, "delete", "pod", &leader, "--wait=false"],
    );
    let failover = Instant::now();
    let elections: Api<CoordinationLease> = Api::namespaced(client.clone(), SYSTEM_NS);
    wait_until(
        "another controller replica to lead",
        Duration::from_secs(60),
        || async {
            let l = elections
                .get(&format!("{RELEASE}-controller"))
                .await
                .unwrap();
            let h = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            !h.is_empty() && h != leader
        },
    )
    .await;
    println!(
        "delete leading controller pod {leader} -> another replica leads in {:.2}s",
        failover.elapsed().as_secs_f64()
    );
    wait_until(
        "grants after the controller failover",
        Duration::from_secs(60),
        || async { max_token(&history) > before && sections(&history) > 0 },
    )
    .await;
    println!(
        "first grant after the failover: {:.2}s",
        failover.elapsed().as_secs_f64()
    );

    // helm upgrade with a changed value rolls the controller; tokens keep rising.
    let before = max_token(&history);
    ok(
        "helm",
        &[
            "upgrade",
            RELEASE,
            chart_dir().to_str().unwrap(),
            "-n",
            SYSTEM_NS,
            "--reuse-values",
            "--set",
            "controller.logLevel=debug",
        ],
    );
    wait_until(
        "the upgraded Deployment 2/2 Ready",
        Duration::from_secs(90),
        || async { ready_replicas(&client).await == 2 },
    )
    .await;
    wait_until(
        "grants after the upgrade",
        Duration::from_secs(60),
        || async { max_token(&history) > before },
    )
    .await;

    watch.abort();
    let h = history.lock().unwrap().clone();
    check_history(&h);
    println!(
        "history: {} writes, tokens {}..{}",
        h.len(),
        h[0].token,
        h.last().unwrap().token
    );

    // With its kubelet-issued token, a pod cannot claim for another pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), LEDGER_NS);
    let victim = pods
        .list(&ListParams::default().labels("app=ledger-writer"))
        .await
        .unwrap()
        .items[0]
        .name_any();
    let claim = format!(
        "{{\"apiVersion\":\"palisade.dev/v1alpha1\",\"kind\":\"LeaseClaim\",\"metadata\":{{\"name\":\"impostor\"}},\
         \"spec\":{{\"leaseName\":\"ledger\",\"holderIdentity\":\"{victim}\",\"pod\":{{\"name\":\"{victim}\"}}}}}}"
    );
    let script = format!("echo '{claim}' | kubectl create -f -");
    pods.create(
        &PostParams::default(),
        &restricted_pod(
            "impostor",
            EXAMPLE_IMAGE,
            "ledger-writer",
            &["sh", "-c", &script],
        ),
    )
    .await
    .unwrap();
    let p = wait_pod(
        &client,
        LEDGER_NS,
        "impostor",
        "the container to exit",
        Duration::from_secs(60),
        exited,
    )
    .await;
    let logs = pods.logs("impostor", &Default::default()).await.unwrap();
    println!("a pod claiming for {victim}: {}", logs.trim());
    assert_eq!(
        p.status.unwrap().phase.as_deref(),
        Some("Failed"),
        "the claim for another pod was accepted: {logs}"
    );
    assert!(
        logs.contains("denied"),
        "not refused by the claim-identity policy: {logs}"
    );

    // helm uninstall keeps Leases and CRDs.
    ok("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
    Api::<Lease>::namespaced(client.clone(), LEDGER_NS)
        .get("ledger")
        .await
        .expect("the Lease survives helm uninstall");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get("leases.palisade.dev")
        .await
        .expect("the CRD survives helm uninstall");

    // The frozen-holder story (make demo-cluster): the stale write refused or never sent,
    // the newer token kept, exit 75, restart.
    let demo = {
        let mut cmd = Command::new("bash");
        cmd.arg(support::repo_root().join("tests/demo/demo-cluster.sh"))
            .env("KUBECONFIG", support::kubeconfig_path())
            .env("KUBECTL", tool("kubectl"))
            .env("HELM", tool("helm"))
            .env("DEMO_SYSTEM_NAMESPACE", SYSTEM_NS)
            .env("DEMO_NAMESPACE", "palisade-demo-test")
            .stdin(Stdio::null());
        with_helm_home(&mut cmd);
        cmd.output().expect("running tests/demo/demo-cluster.sh")
    };
    println!("{}", String::from_utf8_lossy(&demo.stdout));
    assert!(
        demo.status.success(),
        "the frozen-holder story failed: {}",
        text(&demo)
    );

    // Leave nothing running on the node.
    for ns in [LEDGER_NS, SYSTEM_NS] {
        let _ = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::background())
            .await;
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
                "name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
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

/// Bad input fails with an error a user can act on, never a hang: a missing image, a chart
/// value of the wrong type, a workload whose ServiceAccount lacks the client RoleBinding.
#[tokio::test(flavor = "multi_thread")]
async fn bad_input_in_the_cluster_fails_with_an_actionable_error() {
    const NS: &str = "palisade-bad-input";
    let client = support::client().await;
    support::install_crds().await;
    pod_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();

    // An image that is not on the node.
    let missing = "palisade.local/palisade-example:does-not-exist";
    pods.create(
        &pp,
        &restricted_pod("missing-image", missing, "default", &["true"]),
    )
    .await
    .unwrap();
    let p = wait_pod(
        &client,
        NS,
        "missing-image",
        "a waiting reason",
        Duration::from_secs(60),
        |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c[0].state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some("ErrImageNeverPull"))
        },
    )
    .await;
    let waiting = p.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    let message = waiting.message.unwrap_or_default();
    println!("missing image: {message}");
    assert!(
        message.contains(missing),
        "the message does not name the image: {message}"
    );

    // A chart value of the wrong type: refused before anything is created.
    let t = Instant::now();
    let out = run(
        "helm",
        &[
            "install",
            "palisade-bad",
            chart_dir().to_str().unwrap(),
            "-n",
            NS,
            "--set",
            "replicaCount=two",
        ],
    );
    assert!(
        !out.status.success(),
        "helm accepted replicaCount=two: {}",
        text(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    println!(
        "wrong-typed value ({:.1}s): {}",
        t.elapsed().as_secs_f64(),
        err.trim()
    );
    assert!(
        err.contains("replicaCount"),
        "the error does not name the value: {err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "helm took {:?}",
        t.elapsed()
    );

    // `palisade lock` from a ServiceAccount without the palisade-client RoleBinding.
    let image = EXAMPLE_IMAGE;
    pods.create(
        &pp,
        &restricted_pod(
            "no-rolebinding",
            image,
            "default",
            &[
                "palisade",
                "lock",
                "ledger",
                "--timeout",
                "20s",
                "--",
                "true",
            ],
        ),
    )
    .await
    .unwrap();
    let p = wait_pod(
        &client,
        NS,
        "no-rolebinding",
        "the container to exit",
        Duration::from_secs(60),
        exited,
    )
    .await;
    let term = p.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    let logs = pods
        .logs("no-rolebinding", &Default::default())
        .await
        .unwrap();
    println!("no RoleBinding: exit {}: {}", term.exit_code, logs.trim());
    assert_eq!(term.exit_code, 1, "expected exit 1 (API error): {logs}");
    assert!(
        logs.to_lowercase().contains("forbidden"),
        "the error does not say forbidden: {logs}"
    );

    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::background())
        .await;
}

/// Deleting pods never cuts the others off from the API server. A Linux bridge without
/// an address of its own takes the lowest one among its ports and changes it when a
/// port comes or goes; the pods keep the old gateway address cached and lose the API
/// server (and the kubelet's probes) for about 30 s. Four pods ask for /readyz every
/// 200 ms; three are deleted one by one; the survivor must keep being answered, and the
/// bridge's address must not change while pods come and go.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_pods_keeps_the_other_pods_reaching_the_api_server() {
    use k8s_openapi::jiff::Timestamp;
    const NS: &str = "palisade-bridge";
    let bridge_address = || {
        std::fs::read_to_string("/sys/class/net/palisade0/address")
            .expect("the node's bridge palisade0 exists")
    };
    let client = support::client().await;
    pod_namespace(&client, NS).await;
    let before = bridge_address();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // No --request-timeout: with any flag that overrides the config, kubectl stops
    // using the in-cluster one.
    let probe = "while true; do \
        if timeout 2 kubectl get --raw /readyz >/dev/null 2>&1; \
        then echo ok; else echo fail; fi; sleep 0.2; done";
    let names = ["p0", "p1", "p2", "survivor"];
    for name in names {
        pods.create(
            &PostParams::default(),
            &restricted_pod(name, EXAMPLE_IMAGE, "default", &["/bin/sh", "-c", probe]),
        )
        .await
        .unwrap();
    }
    for name in names {
        wait_pod(&client, NS, name, "running", Duration::from_secs(60), |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await;
    }
    let first_deletion = Timestamp::now();
    for name in &names[..3] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        wait_until(
            &format!("pod {name} gone"),
            Duration::from_secs(60),
            || async { pods.get_opt(name).await.unwrap().is_none() },
        )
        .await;
    }
    // Watch the survivor for 12 s after the last deletion.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let watched_until = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(1);
    let logs = pods
        .logs(
            "survivor",
            &kube::api::LogParams {
                timestamps: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let answered: Vec<Timestamp> = logs
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, verdict)| *verdict == "ok")
        .filter_map(|(at, _)| at.parse().ok())
        .filter(|at| *at >= first_deletion)
        .collect();
    let after = bridge_address();
    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::background())
        .await;
    assert_eq!(before, after, "the bridge's address changed");
    // No gap of more than 3 s between answers from the first deletion to the end.
    let mut last = first_deletion;
    for at in answered.iter().copied().chain([watched_until]) {
        let gap = at.duration_since(last);
        assert!(
            gap < k8s_openapi::jiff::SignedDuration::from_secs(3),
            "the survivor got no answer from the API server for {gap:?} after {last} \
             (pods deleted from {first_deletion}); its log:\n{logs}"
        );
        last = at.max(last);
    }
}
