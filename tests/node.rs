//! palisade in pods, on the local cluster's real node (kubelet + containerd, see
//! tests/controlplane/node.sh): the chart's controller Deployment, and the example workload
//! (examples/ledger) taking the Lease from three pods and writing a fenced ConfigMap.
//!
//! Installed as a user installs it: the chart from the cluster's OCI registry
//! (PALISADE_TEST_REGISTRY, where `make chart` pushed it) with README.md's install
//! command, and the images `make image-local` pushed there, which the kubelet pulls.
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
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use palisade::crd::Lease;
use serde_json::json;
use support::helm::{
    adopt_crds, assert_check_passed, chart_field, helm_command, oci_chart, release_crds,
    test_registry, with_helm_home,
};
use support::tools::{kubectl_command, text, tool};

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

/// examples/ledger/ledger.yaml with its writer image replaced by `image`.
fn ledger_example(image: &str) -> String {
    let path = support::repo_root().join("examples/ledger/ledger.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut replaced = 0;
    let out: Vec<String> = yaml
        .lines()
        .map(|l| match l.split_once("image: ") {
            Some((indent, old)) if old.contains("/palisade-example") => {
                replaced += 1;
                format!("{indent}image: {image}")
            }
            _ => l.to_string(),
        })
        .collect();
    assert_eq!(
        replaced,
        1,
        "{}: expected one palisade-example image",
        path.display()
    );
    out.join("\n")
}

/// README.md's install command as helm arguments (without `helm`), installing from the
/// cluster's registry instead of the published one, over plain HTTP: a README change that
/// breaks the install fails the test that runs it.
fn readme_install_args() -> Vec<String> {
    let readme = std::fs::read_to_string(support::repo_root().join("README.md")).unwrap();
    let block = readme
        .split_once(README_INSTALL_BEGIN)
        .and_then(|(_, rest)| rest.split_once(README_INSTALL_END))
        .map(|(block, _)| block.replace("\\\n", " "))
        .unwrap_or_else(|| {
            panic!("README.md has no install command between {README_INSTALL_BEGIN} and {README_INSTALL_END}")
        });
    let commands: Vec<&str> = block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("helm "))
        .collect();
    let [command] = commands[..] else {
        panic!("README.md's install block must hold one helm command: {block}");
    };
    let registry = test_registry();
    let mut args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|w| w.replace(PUBLISHED_REGISTRY, &registry))
        .collect();
    let (chart, version) = oci_chart();
    let arg = |i: usize| args.get(i).map(String::as_str);
    assert!(
        arg(0) == Some("install") && arg(1) == Some(RELEASE) && arg(2) == Some(chart.as_str()),
        "README.md's command must be `helm install {RELEASE} oci://{PUBLISHED_REGISTRY}/charts/palisade ...` \
         (the test installs {chart} and checks release {RELEASE}): {command}"
    );
    let readme_version = args.iter().skip_while(|a| *a != "--version").nth(1);
    assert_eq!(
        readme_version,
        Some(&version),
        "README.md installs chart version {readme_version:?}, charts/palisade/Chart.yaml is {version}: \
         update README.md's install command"
    );
    assert!(
        args.windows(2).any(|w| w == ["--namespace", SYSTEM_NS]),
        "README.md's command must install into --namespace {SYSTEM_NS}: {command}"
    );
    args.push("--plain-http".into());
    args
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

/// The controller pods run `image` (as the Deployment names it), pulled from the registry:
/// their imageID is `repository@digest`. Returns the kubelet's Pulled event of one of them.
async fn check_controller_image(
    client: &Client,
    image: &str,
    repository: &str,
    digest: &str,
) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=controller");
    let running: Vec<Pod> = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(running.len(), 2, "expected 2 controller pods");
    let pulled_id = format!("{repository}@{digest}");
    for p in &running {
        let spec = &p.spec.as_ref().unwrap().containers[0];
        let status = &p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert_eq!(spec.image.as_deref(), Some(image), "pod {}", p.name_any());
        assert!(
            status.image_id.ends_with(&pulled_id),
            "pod {} runs imageID {}, not {pulled_id} (what make image-local pushed)",
            p.name_any(),
            status.image_id
        );
    }
    event_naming(client, SYSTEM_NS, &running[0].name_any(), "Pulled", image).await
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

/// `helm test`: the chart's check pod (`palisade check`, in the watched namespace) is
/// granted a Lease by the installed controller and finds both admission policies enforced.
fn helm_test(when: &str) {
    let t0 = Instant::now();
    ok(
        "helm",
        &["test", RELEASE, "-n", SYSTEM_NS, "--timeout", "3m"],
    );
    // The pod runs in the watched namespace, where `helm test --logs` does not look.
    let out = ok(
        "kubectl",
        &["logs", "-n", LEDGER_NS, &format!("{RELEASE}-test")],
    );
    let logs = String::from_utf8_lossy(&out.stdout);
    assert_check_passed(&logs, when);
    println!(
        "helm test {when}: passed in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

/// Uninstalls the release when the test ends, passed or not: a cluster-wide controller
/// left running would interfere with the test binaries that run after this one. The
/// CRDs it kept are left to no release, as the other tests expect them.
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
        release_crds();
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

    // The chart from the registry, with README.md's command: the image by tag (the
    // appVersion), which the kubelet pulls from the registry. Always: every `make
    // image-local` pushes the tag again, as with any tag that moves.
    let _ = run("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
    pod_namespace(&client, SYSTEM_NS).await;
    pod_namespace(&client, LEDGER_NS).await;
    support::install_crds().await;
    // The suite applied the CRDs before: README.md's command installs the chart whole,
    // CRDs included, once they are marked as this release's.
    adopt_crds(RELEASE, SYSTEM_NS);
    let (chart, version) = oci_chart();
    let repository = format!("{}/palisade", test_registry());
    let digest = pushed_digest("palisade");
    let mut install = readme_install_args();
    install.extend(
        [
            "--timeout",
            "150s",
            "--set",
            &format!("image.repository={repository}"),
            "--set",
            "image.pullPolicy=Always",
            "--set",
            &format!("controller.watchNamespace={LEDGER_NS}"),
            "--set",
            &format!(
                "policies.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={LEDGER_NS}"
            ),
        ]
        .map(String::from),
    );
    let t0 = Instant::now();
    let out = ok(
        "helm",
        &install.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    wait_until(
        "the controller Deployment 2/2 Ready",
        Duration::from_secs(90),
        || async { ready_replicas(&client).await == 2 },
    )
    .await;
    println!(
        "helm install {chart} --version {version} (README.md's command) to 2/2 Ready, pulling from the registry: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let tagged = format!("{repository}:{}", chart_field("appVersion"));
    let pulled = check_controller_image(&client, &tagged, &repository, &digest).await;
    println!("by tag: the controller runs {tagged} = {digest}; kubelet: {pulled}");
    helm_test("after the install");
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(
        [
            "ImagePullBackOff",
            "image.repository",
            "image.tag",
            "image.digest",
            "imagePullSecrets"
        ]
        .iter()
        .all(|w| notes.contains(w)),
        "the install notes give no hint for image pull errors naming the values to fix: {notes}"
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
    let ledger = ledger_example(&example_image());
    let applied = support::tools::kubectl(&["-n", LEDGER_NS, "apply", "-f", "-"], Some(&ledger));
    assert!(
        applied.status.success(),
        "kubectl apply of examples/ledger failed: {}",
        text(&applied)
    );
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

    // helm upgrade to the image by digest (the one `make image-local` recorded) rolls the
    // controller: the kubelet pulls it by digest (pullPolicy Always); tokens keep rising.
    let before = max_token(&history);
    ok(
        "helm",
        &[
            "upgrade",
            RELEASE,
            &chart,
            "--version",
            &version,
            "--plain-http",
            "-n",
            SYSTEM_NS,
            "--reuse-values",
            "--set",
            &format!("image.digest={digest}"),
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
    let by_digest = format!("{repository}@{digest}");
    let pulled = check_controller_image(&client, &by_digest, &repository, &digest).await;
    println!("by digest: the controller runs {by_digest}; kubelet: {pulled}");
    helm_test("after the upgrade");
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
            &example_image(),
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
            .env("PALISADE_IMAGE", &tagged)
            .env("EXAMPLE_IMAGE", example_image())
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

/// An image the registry does not have, by tag or by digest: the pod waits in
/// ErrImagePull or ImagePullBackOff, and both its status and the kubelet's event name the
/// image, which is what a user fixes (image.repository, image.tag or image.digest, as the
/// chart's notes and README.md say).
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_tag_or_digest_fails_with_an_event_naming_the_image() {
    const NS: &str = "palisade-pull-errors";
    let client = support::client().await;
    pod_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let registry = test_registry();
    let missing = [
        (
            "missing-tag",
            format!("{registry}/palisade-example:does-not-exist"),
        ),
        (
            "missing-digest",
            format!("{registry}/palisade-example@sha256:{}", "0".repeat(64)),
        ),
    ];
    for (name, image) in &missing {
        pods.create(
            &PostParams::default(),
            &restricted_pod(name, image, "default", &["true"]),
        )
        .await
        .unwrap();
    }
    for (name, image) in &missing {
        let p = wait_pod(
            &client,
            NS,
            name,
            "ErrImagePull or ImagePullBackOff",
            Duration::from_secs(60),
            |p| {
                waiting_reason(p)
                    .is_some_and(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
            },
        )
        .await;
        let (reason, message) = waiting_reason(&p).unwrap();
        assert!(
            message.contains(image.as_str()),
            "{name}: the pod's {reason} message does not name {image}: {message}"
        );
        let event = event_naming(&client, NS, name, "Failed", image).await;
        println!("{name}: pod waits in {reason}; event: {event}");
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::background())
        .await;
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

/// Bad input fails with an error a user can act on, never a hang: a chart value of the
/// wrong type, a workload whose ServiceAccount lacks the client RoleBinding (an image the
/// registry lacks: a_missing_tag_or_digest_fails_with_an_event_naming_the_image).
#[tokio::test(flavor = "multi_thread")]
async fn bad_input_in_the_cluster_fails_with_an_actionable_error() {
    const NS: &str = "palisade-bad-input";
    let client = support::client().await;
    support::install_crds().await;
    pod_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();

    // A chart value of the wrong type: refused before anything is created.
    let (chart, version) = oci_chart();
    let t = Instant::now();
    let out = run(
        "helm",
        &[
            "install",
            "palisade-bad",
            &chart,
            "--version",
            &version,
            "--plain-http",
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
    let image = example_image();
    pods.create(
        &pp,
        &restricted_pod(
            "no-rolebinding",
            &image,
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
    let image = example_image();
    for name in names {
        pods.create(
            &PostParams::default(),
            &restricted_pod(name, &image, "default", &["/bin/sh", "-c", probe]),
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
