//! The whole story on the node, in order: the chart installed with README.md's
//! command, the example workload taking turns on the Lease, holders and the leading
//! controller deleted, an upgrade to the image by digest, a pod claiming for another,
//! the uninstall, and the frozen-holder demo.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as CoordinationLease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use palisade::crd::Lease;
use support::helm::{adopt_crds, chart_field, oci_chart, test_registry, with_helm_home};
use support::tools::{text, tool};
use tokio::task::JoinHandle;

use crate::install::{
    Uninstall, check_controller_image, helm_test, leaders, readme_install_args, ready_replicas,
};
use crate::ledger::{
    Write, check_history, holder_of, lease, ledger_example, max_token, next_grant, record, sections,
};
use crate::{
    LEASE_SECONDS, LEDGER_NS, NODE_NAME, RELEASE, SYSTEM_NS, example_image, exited, ok,
    pod_namespace, pushed_digest, restricted_pod, run, wait_pod, wait_until,
};

type History = Arc<Mutex<Vec<Write>>>;

#[tokio::test(flavor = "multi_thread")]
async fn controller_and_workload_run_as_pods_on_the_node() {
    let client = support::client().await;
    let _uninstall = Uninstall;
    node_is_ready(&client).await;
    let installed = install_with_the_readme_command(&client).await;
    let (history, watch) = run_the_workload(&client).await;
    delete_holders(&client).await;
    delete_the_leading_controller(&client, &history).await;
    upgrade_to_the_image_by_digest(&client, &installed, &history).await;

    watch.abort();
    let h = history.lock().unwrap().clone();
    check_history(&h);
    println!(
        "history: {} writes, tokens {}..{}",
        h.len(),
        h[0].token,
        h.last().unwrap().token
    );

    a_pod_cannot_claim_for_another(&client).await;
    uninstall_keeps_leases_and_crds(&client).await;
    frozen_holder_demo(&installed.tagged);

    // Leave nothing running on the node.
    for ns in [LEDGER_NS, SYSTEM_NS] {
        let _ = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::background())
            .await;
    }
}

/// What the install leaves for the later steps.
struct Installed {
    chart: String,
    version: String,
    repository: String,
    digest: String,
    /// The controller image by tag, as the install runs it.
    tagged: String,
}

/// The node: Ready, schedulable, no taints.
async fn node_is_ready(client: &Client) {
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
}

/// The chart from the registry, with README.md's command: the image by tag (the
/// appVersion), which the kubelet pulls from the registry. Always: every `make
/// image-local` pushes the tag again, as with any tag that moves.
async fn install_with_the_readme_command(client: &Client) -> Installed {
    let _ = run("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
    pod_namespace(client, SYSTEM_NS).await;
    pod_namespace(client, LEDGER_NS).await;
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
        || async { ready_replicas(client).await == 2 },
    )
    .await;
    println!(
        "helm install {chart} --version {version} (README.md's command) to 2/2 Ready, pulling from the registry: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let tagged = format!("{repository}:{}", chart_field("appVersion"));
    let pulled = check_controller_image(client, &tagged, &repository, &digest).await;
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
            let l = leaders(client).await;
            l.len() == 2 && l.iter().filter(|(_, x)| *x).count() == 1
        },
    )
    .await;
    Installed {
        chart,
        version,
        repository,
        digest,
        tagged,
    }
}

/// The workload: three pods contend for the Lease and write the fenced ConfigMap,
/// whose versions a watch records until the returned task is aborted.
async fn run_the_workload(client: &Client) -> (History, JoinHandle<()>) {
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
    (history, watch)
}

/// Graceful delete of the holder: the next pod is granted, with a higher token; a
/// forced delete revokes the grant at once instead of waiting for expiry.
async fn delete_holders(client: &Client) {
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
            let l = lease(client).await;
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
            client,
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
}

/// Deleting the leading controller pod: the standby takes over and grants continue.
/// Polled: under the workload's load a leader may step down for about a second (its
/// 750 ms renew deadline missed) before a replica leads again, and a metrics read
/// through the API server's pod proxy may fail once.
async fn delete_the_leading_controller(client: &Client, history: &History) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let seen = leaders(client).await;
        if let Some((pod, _)) = seen.iter().find(|(_, l)| *l) {
            break pod.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no controller pod led for 30 s; last seen (pod, leading): {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let before = max_token(history);
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
        || async { max_token(history) > before && sections(history) > 0 },
    )
    .await;
    println!(
        "first grant after the failover: {:.2}s",
        failover.elapsed().as_secs_f64()
    );
}

/// helm upgrade to the image by digest (the one `make image-local` recorded) rolls the
/// controller: the kubelet pulls it by digest (pullPolicy Always); tokens keep rising.
async fn upgrade_to_the_image_by_digest(client: &Client, installed: &Installed, history: &History) {
    let Installed {
        chart,
        version,
        repository,
        digest,
        ..
    } = installed;
    let before = max_token(history);
    ok(
        "helm",
        &[
            "upgrade",
            RELEASE,
            chart.as_str(),
            "--version",
            version.as_str(),
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
        || async { ready_replicas(client).await == 2 },
    )
    .await;
    let by_digest = format!("{repository}@{digest}");
    let pulled = check_controller_image(client, &by_digest, repository, digest).await;
    println!("by digest: the controller runs {by_digest}; kubelet: {pulled}");
    helm_test("after the upgrade");
    wait_until(
        "grants after the upgrade",
        Duration::from_secs(60),
        || async { max_token(history) > before },
    )
    .await;
}

/// With its kubelet-issued token, a pod cannot claim for another pod.
async fn a_pod_cannot_claim_for_another(client: &Client) {
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
        client,
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
}

/// helm uninstall keeps Leases and CRDs.
async fn uninstall_keeps_leases_and_crds(client: &Client) {
    ok("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
    Api::<Lease>::namespaced(client.clone(), LEDGER_NS)
        .get("ledger")
        .await
        .expect("the Lease survives helm uninstall");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get("leases.palisade.dev")
        .await
        .expect("the CRD survives helm uninstall");
}

/// The frozen-holder story (make demo-cluster): the stale write refused or never sent,
/// the newer token kept, exit 75, restart.
fn frozen_holder_demo(tagged: &str) {
    let demo = {
        let mut cmd = Command::new("bash");
        cmd.arg(support::repo_root().join("tests/demo/demo-cluster.sh"))
            .env("KUBECONFIG", support::kubeconfig_path())
            .env("KUBECTL", tool("kubectl"))
            .env("HELM", tool("helm"))
            .env("PALISADE_IMAGE", tagged)
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
}
