//! Least-privilege RBAC of the Helm chart: the real controller runs on the chart's
//! ServiceAccount token (grants, handover, revocation, Events, leader election), and
//! SubjectAccessReviews show the controller and client roles allow exactly the calls
//! they need. The controller's requests go through the chart's API Priority and Fairness
//! FlowSchemas.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease as CoordinationLease;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim, LeasePhase};
use serde_json::json;
use support::accounts::service_account_token;
use support::claims::{claim, create_lease, wait_claim_phase, wait_holder};
use support::helm::Release;
use support::{TestNamespace, WAIT, api_error, setup, wait_lease};

/// A kubeconfig for `token`, pointing at the test API server (server and CA from the admin one).
fn write_token_kubeconfig(path: &Path, token: &str) {
    let admin = support::kubeconfig();
    let context = admin.current_context.clone().expect("current-context");
    let cluster_name = admin
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .expect("the current context names a cluster");
    let cluster = admin
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .expect("the cluster of the current context");
    let mut c = json!({"server": cluster.server.clone().expect("server")});
    if let Some(data) = &cluster.certificate_authority_data {
        c["certificate-authority-data"] = json!(data);
    }
    if let Some(file) = &cluster.certificate_authority {
        c["certificate-authority"] = json!(file);
    }
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test", "cluster": c}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
        "current-context": "sa",
    });
    std::fs::write(path, serde_yaml::to_string(&config).unwrap()).unwrap();
}

/// `palisade controller` authenticated as the chart's ServiceAccount; killed on drop.
struct ChartController {
    child: tokio::process::Child,
    admin_port: u16,
    log: PathBuf,
}

impl ChartController {
    async fn start(ns: &TestNamespace, kubeconfig: &Path, election_name: &str) -> Self {
        let admin_port = support::free_port();
        let log = support::repo_root().join(format!("target/helm-controller-{}.log", ns.name));
        let file = std::fs::File::create(&log).unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
            .arg("controller")
            // Watching only the test namespace keeps this controller out of other
            // tests' Leases; cluster-wide reads are checked separately.
            .args(["--namespace", &ns.name])
            .arg("--leader-elect=true")
            .args(["--election-namespace", &ns.name])
            .args(["--election-name", election_name])
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{admin_port}"))
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", &ns.name)
            .env("POD_NAME", "palisade-controller-0")
            .env("RUST_LOG", "info,palisade=debug")
            .env_remove("PALISADE_WATCH_NAMESPACE")
            .env_remove("PALISADE_ADMIN_ADDR")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("spawning palisade controller");
        Self {
            child,
            admin_port,
            log,
        }
    }

    async fn get(&self, path: &str) -> std::io::Result<String> {
        support::admin_get(self.admin_port, path).await
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the controller is ready and leads.
    async fn wait_leading(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self
                .get("/readyz")
                .await
                .is_ok_and(|b| b.starts_with("ready"));
            let leading = self.get("/metrics").await.is_ok_and(|m| {
                m.lines()
                    .any(|l| l.starts_with("palisade_is_leader ") && l.ends_with(" 1"))
            });
            if ready && leading {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "controller on the chart's RBAC not ready and leading within 30s (ready={ready}, \
                 leading={leading}); log {}:\n{}",
                self.log.display(),
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ChartController {
    /// A failed test shows what the controller saw.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "controller log {}:\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

#[tokio::test]
async fn controller_grants_and_hands_over_with_only_the_chart_rbac() {
    let ns = setup("helm-rbac").await;
    let release = Release::install(&ns, &[&ns.name], &[]);
    let sa_token = service_account_token(&ns, &release.name, None).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_token_kubeconfig(&kubeconfig, &sa_token);

    controller_reads_cluster_wide(&sa_token).await;

    let election = format!("{}-controller", release.name);
    let mut controller = ChartController::start(&ns, &kubeconfig, &election).await;
    controller.wait_leading().await;
    let elected = ns
        .api::<CoordinationLease>()
        .get(&election)
        .await
        .expect("the election Lease, created with the chart's Role");
    assert_eq!(
        elected.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("palisade-controller-0")
    );

    grant_then_hand_over(&ns).await;
    a_pod_bound_claim_is_revoked_with_its_pod(&ns).await;
    events_are_published(&ns, &controller).await;
    requests_go_through_the_flow_schemas(&ns, &release.name).await;

    controller.child.start_kill().unwrap();
    let _ = controller.child.wait().await;
    let log = controller.log_text();
    for needle in ["forbidden", "Forbidden"] {
        let hits: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
        assert!(
            hits.is_empty(),
            "the controller hit an RBAC denial ({needle}) with the chart's role:\n{}",
            hits.join("\n")
        );
    }
}

/// Cluster-wide reads, as the default install does them (the process below watches
/// only this namespace, to stay out of other tests' Leases).
async fn controller_reads_cluster_wide(sa_token: &str) {
    let as_controller = support::client_with_token(sa_token).await;
    let lp = ListParams::default().limit(1);
    Api::<Lease>::all(as_controller.clone())
        .list(&lp)
        .await
        .expect("controller SA lists Leases in all namespaces");
    Api::<LeaseClaim>::all(as_controller.clone())
        .list(&lp)
        .await
        .expect("controller SA lists LeaseClaims in all namespaces");
    Api::<Pod>::all(as_controller.clone())
        .list(&lp)
        .await
        .expect("controller SA lists Pods in all namespaces");
    let forbidden = api_error(Api::<Secret>::all(as_controller.clone()).list(&lp).await);
    assert_eq!(forbidden.code, 403, "{forbidden:?}");
}

/// Grant, then hand over on release with a higher token.
async fn grant_then_hand_over(ns: &TestNamespace) {
    create_lease(ns, "orders", 600).await;
    let claims = ns.api::<LeaseClaim>();
    let pp = PostParams::default();
    claims
        .create(&pp, &claim("first", "orders", None))
        .await
        .unwrap();
    let lease = wait_holder(ns, "orders", "first").await;
    let first_token = support::token(&lease);
    wait_claim_phase(ns, "first", ClaimPhase::Granted).await;
    claims
        .create(&pp, &claim("second", "orders", None))
        .await
        .unwrap();
    wait_lease(ns, "orders", "a waiter", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(1))
    })
    .await;
    claims
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    let lease = wait_holder(ns, "orders", "second").await;
    let second_token = support::token(&lease);
    assert!(
        second_token > first_token,
        "handover token {second_token} not above {first_token}"
    );
    let second = wait_claim_phase(ns, "second", ClaimPhase::Granted).await;
    assert_eq!(second.status.unwrap().fencing_token, Some(second_token));
}

/// A pod-bound claim is revoked when its pod goes.
async fn a_pod_bound_claim_is_revoked_with_its_pod(ns: &TestNamespace) {
    let claims = ns.api::<LeaseClaim>();
    let pp = PostParams::default();
    let pod = support::create_pod(ns, "worker-0").await;
    create_lease(ns, "guarded", 600).await;
    claims
        .create(
            &pp,
            &claim(
                "worker-0",
                "guarded",
                Some(json!({"name": "worker-0", "uid": pod.uid().unwrap()})),
            ),
        )
        .await
        .unwrap();
    wait_holder(ns, "guarded", "worker-0").await;
    ns.api::<Pod>()
        .delete("worker-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_claim_phase(ns, "worker-0", ClaimPhase::Revoked).await;
    wait_lease(ns, "guarded", "phase Free", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.phase == Some(LeasePhase::Free) && s.holder.is_none())
    })
    .await;
}

/// Events were published (events.k8s.io create).
async fn events_are_published(ns: &TestNamespace, controller: &ChartController) {
    let deadline = Instant::now() + WAIT;
    loop {
        let events = ns
            .api::<Event>()
            .list(&ListParams::default())
            .await
            .unwrap();
        let reasons: BTreeSet<String> = events
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Lease"))
            .filter_map(|e| e.reason.clone())
            .collect();
        if reasons.contains("Granted") && reasons.len() >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Events for the Leases (reasons so far {reasons:?}); log:\n{}",
            controller.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// API Priority and Fairness: the API server dispatched the controller's requests
/// through the chart's FlowSchema and level, and the leader's renewals (every
/// retryPeriod, 250 ms) through the election FlowSchema to leader-election.
async fn requests_go_through_the_flow_schemas(ns: &TestNamespace, full: &str) {
    let work = dispatched(&ns.client, full, full).await;
    assert!(
        work > 0,
        "no request dispatched by FlowSchema {full} to priority level {full}"
    );
    let election_schema = format!("{full}-election");
    let renewals = dispatched(&ns.client, &election_schema, "leader-election").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let renewals_later = dispatched(&ns.client, &election_schema, "leader-election").await;
    assert!(
        renewals_later >= renewals + 2,
        "election renewals through FlowSchema {election_schema} to leader-election: \
         {renewals} then {renewals_later} a second later"
    );
    eprintln!(
        "dispatched: {work} by {full}, {renewals_later} by {election_schema} \
         ({} in the last second)",
        renewals_later - renewals
    );
}

/// Requests the API server has dispatched through `flow_schema` to `priority_level`
/// (its apiserver_flowcontrol_dispatched_requests_total counter; 0 before the first).
async fn dispatched(admin: &Client, flow_schema: &str, priority_level: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = admin.request_text(request).await.expect("GET /metrics");
    let series = format!(
        "apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"{flow_schema}\",\
         priority_level=\"{priority_level}\"}} "
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.trim().parse::<f64>().expect("a counter value") as u64)
        .unwrap_or(0)
}

/// (verb, apiGroup, resource, subresource, namespace, name, allowed)
type Check<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str, &'a str, bool);

async fn can_i(client: &Client, sa_namespace: &str, sa: &str, checks: &[Check<'_>]) -> Vec<String> {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut wrong = vec![];
    for &(verb, group, resource, sub, namespace, name, allowed) in checks {
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "spec": {
                "user": format!("system:serviceaccount:{sa_namespace}:{sa}"),
                "groups": ["system:serviceaccounts",
                           format!("system:serviceaccounts:{sa_namespace}"),
                           "system:authenticated"],
                "resourceAttributes": {
                    "verb": verb, "group": group, "resource": resource,
                    "subresource": sub, "namespace": namespace, "name": name
                }
            }
        }))
        .unwrap();
        let result = reviews
            .create(&PostParams::default(), &review)
            .await
            .expect("SubjectAccessReview");
        let got = result.status.map(|s| s.allowed).unwrap_or(false);
        if got != allowed {
            let what = format!(
                "{sa}: {verb} {group}/{resource}{}{} in {:?}{}",
                if sub.is_empty() { "" } else { "/" },
                sub,
                namespace,
                if name.is_empty() {
                    String::new()
                } else {
                    format!(" name {name}")
                }
            );
            wrong.push(format!(
                "{what}: {} but should be {}",
                if got { "allowed" } else { "denied" },
                if allowed { "allowed" } else { "denied" }
            ));
        }
    }
    wrong
}

#[tokio::test]
async fn rbac_allows_exactly_the_needed_verbs() {
    let ns = setup("helm-can-i").await;
    let release = Release::install(&ns, &[&ns.name], &[]);
    let n = ns.name.as_str();
    let election = format!("{}-controller", release.name);

    let controller = controller_checks(n, &election, &release.name);
    bind_a_workload_to_the_client_role(&ns, &release.name).await;
    let client = client_checks(n);

    let admin = ns.client.clone();
    let mut wrong = can_i(&admin, n, &release.name, &controller).await;
    // RoleBindings are effective at once, but retry briefly for the authorizer's cache.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut client_wrong = can_i(&admin, n, "app", &client).await;
    while !client_wrong.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        client_wrong = can_i(&admin, n, "app", &client).await;
    }
    wrong.extend(client_wrong);
    assert!(
        wrong.is_empty(),
        "RBAC is not as designed:\n{}",
        wrong.join("\n")
    );
}

/// A namespace not the test's: the controller's ClusterRole reaches it, a workload's
/// RoleBinding does not.
const ELSEWHERE: &str = "palisade-elsewhere";
/// All namespaces: a cluster-wide request.
const ALL: &str = "";
/// The API groups the checks name.
const P: &str = "palisade.dev";
const C: &str = "coordination.k8s.io";
const EV: &str = "events.k8s.io";

/// The controller's ServiceAccount (`sa`) in namespace `n`, its election Lease `election`.
fn controller_checks<'a>(n: &'a str, election: &'a str, sa: &'a str) -> Vec<Check<'a>> {
    let (elsewhere, all, p, c, ev) = (ELSEWHERE, ALL, P, C, EV);
    vec![
        // allowed: what src/controller/ (election.rs included) calls
        ("list", p, "leases", "", all, "", true),
        ("watch", p, "leases", "", all, "", true),
        ("get", p, "leases", "", elsewhere, "x", true),
        ("list", p, "leaseclaims", "", all, "", true),
        ("watch", p, "leaseclaims", "", all, "", true),
        ("get", p, "leaseclaims", "", elsewhere, "x", true),
        ("update", p, "leases", "status", elsewhere, "x", true),
        ("get", p, "leases", "status", elsewhere, "x", true),
        ("patch", p, "leaseclaims", "status", elsewhere, "x", true),
        ("list", "", "pods", "", all, "", true),
        ("watch", "", "pods", "", all, "", true),
        ("get", "", "pods", "", elsewhere, "x", true),
        ("create", ev, "events", "", elsewhere, "", true),
        ("create", c, "leases", "", n, "", true),
        ("get", c, "leases", "", n, election, true),
        ("update", c, "leases", "", n, election, true),
        // denied: everything else
        ("create", p, "leases", "", elsewhere, "", false),
        ("update", p, "leases", "", elsewhere, "x", false),
        ("patch", p, "leases", "", elsewhere, "x", false),
        ("delete", p, "leases", "", elsewhere, "x", false),
        ("patch", p, "leases", "status", elsewhere, "x", false),
        ("create", p, "leaseclaims", "", elsewhere, "", false),
        ("update", p, "leaseclaims", "", elsewhere, "x", false),
        ("patch", p, "leaseclaims", "", elsewhere, "x", false),
        ("delete", p, "leaseclaims", "", elsewhere, "x", false),
        ("update", p, "leaseclaims", "status", elsewhere, "x", false),
        ("get", "", "secrets", "", n, "x", false),
        ("list", "", "secrets", "", all, "", false),
        ("get", "", "configmaps", "", n, "x", false),
        ("create", "", "pods", "", n, "", false),
        ("delete", "", "pods", "", elsewhere, "x", false),
        ("create", "", "events", "", elsewhere, "", false),
        ("delete", ev, "events", "", elsewhere, "x", false),
        ("patch", ev, "events", "", elsewhere, "x", false),
        ("update", ev, "events", "", elsewhere, "x", false),
        ("list", c, "leases", "", n, "", false),
        ("delete", c, "leases", "", n, election, false),
        ("get", c, "leases", "", n, "someone-elses-election", false),
        (
            "update",
            c,
            "leases",
            "",
            n,
            "someone-elses-election",
            false,
        ),
        ("create", c, "leases", "", elsewhere, "", false),
        ("get", c, "leases", "", elsewhere, election, false),
        ("create", "", "serviceaccounts", "token", n, sa, false),
        (
            "create",
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            "",
            all,
            "",
            false,
        ),
    ]
}

/// A workload's ServiceAccount bound to the client role in its namespace.
async fn bind_a_workload_to_the_client_role(ns: &TestNamespace, release: &str) {
    let n = ns.name.as_str();
    let sas = ns.api::<ServiceAccount>();
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "app"}})).unwrap(),
    )
    .await
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "app-palisade"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": format!("{release}-client")},
        "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": n}]
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// The workload's ServiceAccount `app` in namespace `n`.
fn client_checks(n: &str) -> Vec<Check<'_>> {
    let (elsewhere, all, p, c) = (ELSEWHERE, ALL, P, C);
    vec![
        ("create", p, "leases", "", n, "", true),
        ("get", p, "leases", "", n, "x", true),
        ("list", p, "leases", "", n, "", true),
        ("watch", p, "leases", "", n, "", true),
        ("create", p, "leaseclaims", "", n, "", true),
        ("get", p, "leaseclaims", "", n, "x", true),
        ("list", p, "leaseclaims", "", n, "", true),
        ("watch", p, "leaseclaims", "", n, "", true),
        ("patch", p, "leaseclaims", "", n, "x", true),
        ("delete", p, "leaseclaims", "", n, "x", true),
        // never the status, and nothing else
        ("update", p, "leases", "status", n, "x", false),
        ("patch", p, "leases", "status", n, "x", false),
        ("update", p, "leaseclaims", "status", n, "x", false),
        ("patch", p, "leaseclaims", "status", n, "x", false),
        ("update", p, "leases", "", n, "x", false),
        ("patch", p, "leases", "", n, "x", false),
        ("delete", p, "leases", "", n, "x", false),
        ("update", p, "leaseclaims", "", n, "x", false),
        ("deletecollection", p, "leaseclaims", "", n, "", false),
        ("get", "", "secrets", "", n, "x", false),
        ("list", "", "pods", "", n, "", false),
        ("create", c, "leases", "", n, "", false),
        // the RoleBinding grants its own namespace only
        ("create", p, "leaseclaims", "", elsewhere, "", false),
        ("list", p, "leases", "", all, "", false),
    ]
}
