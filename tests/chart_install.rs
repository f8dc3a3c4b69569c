//! The Helm chart against the real API server: install and uninstall, server-side
//! validation of what it renders, and the Pod Security Standard of the controller pod.
//!
//! helm and kubectl come from PATH (`make test` puts the pinned ones there). Every
//! test installs its own release into its own namespace.

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use palisade::crd::Lease;
use serde_json::{Value, json};
use support::claims::create_lease;
use support::helm::{Release, chart_dir, helm_ok};
use support::tools::{kubectl_command, run, text};
use support::{TestNamespace, WAIT, api_error, setup};

#[tokio::test]
async fn install_creates_the_objects_and_uninstall_keeps_user_leases() {
    // The CRDs exist already (other tests apply them) and the release leaves them alone
    // (crds.enabled=false, Release::install); tests/chart_upgrade.rs installs them.
    let ns = setup("helm-install").await;
    let client = ns.client.clone();
    let release = Release::install(&ns, &[&ns.name], &[]);
    let full = release.name.clone();

    release_is_deployed_with_notes(&ns, &release.name);
    namespaced_objects_exist(&ns, &full).await;
    cluster_objects_exist(&client, &full).await;

    // A user's Lease, created while the chart is installed.
    create_lease(&ns, "users-lease", 30).await;

    release.uninstall();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = left_behind(&ns, &full).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "helm uninstall left controller objects behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ns.api::<Lease>()
        .get("users-lease")
        .await
        .expect("helm uninstall keeps the user's Lease");
}

/// The release is deployed, and its notes tell how to check the install, create a
/// Lease and run `palisade lock`.
fn release_is_deployed_with_notes(ns: &TestNamespace, release: &str) {
    let status = helm_ok(
        true,
        &["status", release, "--namespace", &ns.name, "-o", "json"],
    );
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["info"]["status"], "deployed");
    assert!(
        status["info"]["notes"]
            .as_str()
            .is_some_and(|n| n.contains("kind: Lease")
                && n.contains("palisade lock")
                && n.contains(&format!("helm test {release} -n {}", ns.name))),
        "NOTES tell how to check the install, create a Lease and run palisade lock: {}",
        status["info"]["notes"]
    );
}

/// Namespaced objects (the Deployment never runs: there is no kubelet).
async fn namespaced_objects_exist(ns: &TestNamespace, full: &str) {
    let deploy = ns.api::<Deployment>().get(full).await.expect("Deployment");
    assert_eq!(deploy.spec.unwrap().replicas, Some(2));
    ns.api::<ServiceAccount>()
        .get(full)
        .await
        .expect("ServiceAccount");
    ns.api::<Service>()
        .get(&format!("{full}-metrics"))
        .await
        .expect("metrics Service");
    ns.api::<PodDisruptionBudget>()
        .get(full)
        .await
        .expect("PDB");
    ns.api::<Role>()
        .get(&format!("{full}-election"))
        .await
        .expect("election Role");
    ns.api::<RoleBinding>()
        .get(&format!("{full}-election"))
        .await
        .expect("election RoleBinding");
}

/// Cluster-scoped objects: the roles, the admission policies and the API priority
/// objects.
async fn cluster_objects_exist(client: &kube::Client, full: &str) {
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    cluster_roles
        .get(&format!("{full}-controller"))
        .await
        .expect("controller ClusterRole");
    let client_role = cluster_roles
        .get(&format!("{full}-client"))
        .await
        .expect("client ClusterRole");
    Api::<ClusterRoleBinding>::all(client.clone())
        .get(&format!("{full}-controller"))
        .await
        .expect("controller ClusterRoleBinding");
    for policy in ["claim-identity", "object-fencing", "fencing-lease"] {
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .get(&format!("{full}-{policy}"))
            .await
            .expect("ValidatingAdmissionPolicy");
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .get(&format!("{full}-{policy}"))
            .await
            .expect("ValidatingAdmissionPolicyBinding");
    }
    // API Priority and Fairness: the API server accepts both FlowSchemas and the level,
    // and finds the levels they name.
    Api::<PriorityLevelConfiguration>::all(client.clone())
        .get(full)
        .await
        .expect("PriorityLevelConfiguration");
    for name in [full.to_string(), format!("{full}-election")] {
        Api::<FlowSchema>::all(client.clone())
            .get(&name)
            .await
            .expect("FlowSchema");
    }
    // The built-in edit role aggregates the client role (by label: the aggregation
    // controller itself does not run in the test control plane).
    let edit = cluster_roles
        .get("edit")
        .await
        .expect("the edit ClusterRole");
    let labels = client_role.labels();
    let selected = edit
        .aggregation_rule
        .and_then(|a| a.cluster_role_selectors)
        .unwrap_or_default()
        .iter()
        .any(|s| {
            s.match_labels
                .as_ref()
                .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
        });
    assert!(
        selected,
        "edit does not aggregate {full}-client: {labels:?}"
    );
}

/// Whether the named object exists.
async fn exists<K>(api: Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_some()
}

/// The objects of release `full` (the chart's full name) that still exist.
async fn left_behind(ns: &TestNamespace, full: &str) -> Vec<String> {
    let client = ns.client.clone();
    let mut left = vec![];
    for (kind, there) in [
        ("Deployment", exists(ns.api::<Deployment>(), full).await),
        (
            "ServiceAccount",
            exists(ns.api::<ServiceAccount>(), full).await,
        ),
        (
            "Service",
            exists(ns.api::<Service>(), &format!("{full}-metrics")).await,
        ),
        (
            "PodDisruptionBudget",
            exists(ns.api::<PodDisruptionBudget>(), full).await,
        ),
        (
            "Role",
            exists(ns.api::<Role>(), &format!("{full}-election")).await,
        ),
    ] {
        if there {
            left.push(kind.to_string());
        }
    }
    for suffix in ["controller", "client"] {
        if exists(
            Api::<ClusterRole>::all(client.clone()),
            &format!("{full}-{suffix}"),
        )
        .await
        {
            left.push(format!("ClusterRole {suffix}"));
        }
    }
    if exists(
        Api::<ClusterRoleBinding>::all(client.clone()),
        &format!("{full}-controller"),
    )
    .await
    {
        left.push("ClusterRoleBinding".into());
    }
    for name in [full.to_string(), format!("{full}-election")] {
        if exists(Api::<FlowSchema>::all(client.clone()), &name).await {
            left.push(format!("FlowSchema {name}"));
        }
    }
    if exists(Api::<PriorityLevelConfiguration>::all(client.clone()), full).await {
        left.push("PriorityLevelConfiguration".into());
    }
    for policy in ["claim-identity", "object-fencing", "fencing-lease"] {
        let name = format!("{full}-{policy}");
        if exists(Api::<ValidatingAdmissionPolicy>::all(client.clone()), &name).await {
            left.push(format!("ValidatingAdmissionPolicy {policy}"));
        }
        if exists(
            Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
            &name,
        )
        .await
        {
            left.push(format!("ValidatingAdmissionPolicyBinding {policy}"));
        }
    }
    left
}

#[tokio::test]
async fn rendered_chart_passes_server_side_validation() {
    let ns = setup("helm-dry-run").await;
    let release = Release::name_for(&ns);
    let chart = chart_dir();
    for extra in [
        &[][..],
        &[
            "--set",
            &format!("controller.watchNamespace={}", ns.name),
            "--set-json",
            r#"policies.fencing.resources=[{"apiGroups":[""],"apiVersions":["v1"],"resources":["secrets"]},{"apiGroups":["example.com"],"apiVersions":["v1"],"resources":["widgets"],"scope":"Namespaced"}]"#,
            "--set",
            "policies.claimIdentity.allowNonPodCredentials=false",
            "--set-json",
            r#"policies.namespaceSelector={"matchLabels":{"team":"payments"}}"#,
            "--set-json",
            "podDisruptionBudget.minAvailable=1",
            "--set",
            "controller.leaderElection.leaseName=elect",
            "--set",
            "controller.leaderElection.leaseDuration=15s",
            "--set",
            "controller.leaderElection.renewDeadline=10s",
            "--set",
            "controller.leaderElection.retryPeriod=2s",
            "--set",
            "apiPriority.matchingPrecedence=9999",
            "--set",
            "apiPriority.priorityLevel.lendablePercent=100",
            "--set",
            "apiPriority.priorityLevel.queues=128",
            "--set",
            "apiPriority.priorityLevel.handSize=8",
        ][..],
    ] {
        let mut args = vec![
            "template",
            &release,
            chart.to_str().unwrap(),
            "--namespace",
            &ns.name,
            // helm test's pod names a ServiceAccount that a dry run never creates; the
            // node tests create them all (`helm test` after install and upgrade).
            "--skip-tests",
        ];
        args.extend_from_slice(extra);
        let rendered = helm_ok(false, &args);
        let rendered = String::from_utf8(rendered.stdout).unwrap();
        assert!(rendered.contains("kind: CustomResourceDefinition"));
        // Server-side apply, dry run, strict field validation: unknown or duplicate
        // fields are errors, not warnings.
        let mut cmd = kubectl_command();
        cmd.args([
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "--field-manager=palisade-helm-dry-run",
            "--namespace",
            &ns.name,
            "-f",
            "-",
        ]);
        let out = run(cmd, Some(&rendered));
        assert!(
            out.status.success(),
            "kubectl apply --dry-run=server of `helm template {extra:?}` failed:\n{}",
            text(&out)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.to_lowercase().contains("warning"),
            "server-side validation warned:\n{}",
            text(&out)
        );
        let applied = String::from_utf8_lossy(&out.stdout);
        for kind in [
            "customresourcedefinition.apiextensions.k8s.io/leases.palisade.dev",
            "deployment.apps/",
            "validatingadmissionpolicy.admissionregistration.k8s.io/",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/",
            "clusterrole.rbac.authorization.k8s.io/",
            "poddisruptionbudget.policy/",
            "flowschema.flowcontrol.apiserver.k8s.io/",
            "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/",
        ] {
            assert!(applied.contains(kind), "{kind} not applied:\n{applied}");
        }
    }
}

#[tokio::test]
async fn controller_pod_meets_the_restricted_pod_security_standard() {
    let ns = setup("helm-psa").await;
    Api::<Namespace>::all(ns.client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/warn-version": "latest",
            }}})),
        )
        .await
        .unwrap();
    // helm install fails on warnings (Release::install), including "would violate PodSecurity".
    let release = Release::install(&ns, &[&ns.name], &[]);
    let deploy = ns.api::<Deployment>().get(&release.name).await.unwrap();
    let template = serde_json::to_value(deploy.spec.unwrap().template).unwrap();
    let pod = |spec: Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "controller-pod", "labels": template["metadata"]["labels"]},
            "spec": spec
        }))
        .unwrap()
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    ns.api::<Pod>()
        .create(&dry_run, &pod(template["spec"].clone()))
        .await
        .expect("the controller pod is admitted in a namespace enforcing `restricted`");

    // The check has teeth: without the container security context the pod is refused.
    let mut loose = template["spec"].clone();
    loose["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("securityContext");
    let refused = api_error(ns.api::<Pod>().create(&dry_run, &pod(loose)).await);
    assert!(
        refused.message.contains("violates PodSecurity"),
        "{refused:?}"
    );
}

/// The FlowSchema and priority level the API server classified a request into: the UIDs
/// it reports in the X-Kubernetes-PF-FlowSchema-UID and X-Kubernetes-PF-PriorityLevel-UID
/// response headers, for a GET of `path` made by `client`.
async fn classified_as(client: &kube::Client, path: &str) -> (String, String) {
    let request = http::Request::get(path)
        .body(kube::client::Body::empty())
        .unwrap();
    let response = client
        .send(request)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| {
                panic!(
                    "GET {path} ({}): no {name} header in {:?}",
                    response.status(),
                    response.headers()
                )
            })
            .to_string()
    };
    (
        header("X-Kubernetes-PF-FlowSchema-UID"),
        header("X-Kubernetes-PF-PriorityLevel-UID"),
    )
}

/// A client of the admin credentials impersonating `user` (as `kubectl --as`): API
/// Priority and Fairness classifies the impersonated user's requests.
async fn impersonating(user: &str) -> kube::Client {
    let mut config = support::admin_config().await;
    config.auth_info.impersonate = Some(user.to_string());
    kube::Client::try_from(config).unwrap()
}

fn uid<K: kube::Resource>(object: &K) -> String {
    object
        .meta()
        .uid
        .clone()
        .expect("a stored object has a UID")
}

#[tokio::test]
async fn api_priority_classifies_the_controller_requests_and_only_those() {
    let ns = setup("helm-apf").await;
    let release = Release::install(&ns, &[&ns.name], &[]);
    let full = release.name.clone();
    let schemas: Api<FlowSchema> = Api::all(ns.client.clone());
    let levels: Api<PriorityLevelConfiguration> = Api::all(ns.client.clone());
    let uids = Uids {
        ours: uid(&schemas.get(&full).await.unwrap()),
        election: uid(&schemas.get(&format!("{full}-election")).await.unwrap()),
        our_level: uid(&levels.get(&full).await.unwrap()),
        leader_election: uid(&levels.get("leader-election").await.unwrap()),
    };

    let controller = impersonating(&format!("system:serviceaccount:{}:{full}", ns.name)).await;
    let leases = format!("/apis/palisade.dev/v1alpha1/namespaces/{}/leases", ns.name);
    our_flow_schema_is_in_use(&controller, &leases, &full, &uids).await;
    let lease = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{full}-controller",
        ns.name
    );
    only_the_controllers_requests_are_ours(&ns, &controller, &leases, &lease, &uids).await;
    the_election_on_the_charts_own_level(&ns, &controller, &full, &lease, &uids).await;
}

/// The UIDs of the release's FlowSchemas and of the levels they name, as the API
/// server's classification headers show them.
#[derive(Clone)]
struct Uids {
    ours: String,
    election: String,
    our_level: String,
    leader_election: String,
}

/// The API server digests new FlowSchemas asynchronously: waits until it classifies the
/// controller's GET of `leases` by ours.
async fn our_flow_schema_is_in_use(
    controller: &kube::Client,
    leases: &str,
    full: &str,
    uids: &Uids,
) {
    let Uids {
        ours, our_level, ..
    } = uids.clone();
    let installed = Instant::now();
    let deadline = installed + WAIT;
    loop {
        let (schema, level) = classified_as(controller, leases).await;
        if schema == ours {
            assert_eq!(level, our_level, "{leases}");
            eprintln!(
                "the API server classified by FlowSchema {full} {:?} after it was read back",
                installed.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the controller's GET {leases} is still classified by FlowSchema {schema}, not {full} ({ours})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controller's requests go through our FlowSchema and level, its election Lease
/// (`lease`) to leader-election; nobody else's do.
async fn only_the_controllers_requests_are_ours(
    ns: &TestNamespace,
    controller: &kube::Client,
    leases: &str,
    lease: &str,
    uids: &Uids,
) {
    let Uids {
        ours,
        election,
        our_level,
        leader_election,
    } = uids.clone();
    // The controller's other requests: cluster-wide lists and watches, its status writes'
    // resources, Events.
    for path in [
        "/apis/palisade.dev/v1alpha1/leaseclaims?limit=1".to_string(),
        "/api/v1/pods?limit=1".to_string(),
        format!(
            "/apis/palisade.dev/v1alpha1/namespaces/{}/leases/missing/status",
            ns.name
        ),
        format!("/api/v1/namespaces/{}/pods?limit=1", ns.name),
        format!(
            "/apis/events.k8s.io/v1/namespaces/{}/events?limit=1",
            ns.name
        ),
    ] {
        assert_eq!(
            classified_as(controller, &path).await,
            (ours.clone(), our_level.clone()),
            "{path}"
        );
    }
    // coordination.k8s.io Leases outside the release namespace are not the election.
    let elsewhere = "/apis/coordination.k8s.io/v1/namespaces/default/leases/x";
    let (schema, _) = classified_as(controller, elsewhere).await;
    assert!(
        schema != ours && schema != election,
        "{elsewhere} classified by our FlowSchema {schema}"
    );
    // The election Lease goes to the built-in leader-election level.
    assert_eq!(
        classified_as(controller, lease).await,
        (election.clone(), leader_election.clone()),
        "{lease}"
    );
    // Requests the controller does not make keep the cluster's default classification.
    let configmaps = format!("/api/v1/namespaces/{}/configmaps", ns.name);
    let (schema, level) = classified_as(controller, &configmaps).await;
    assert!(
        schema != ours && schema != election && level != our_level,
        "{configmaps} classified by {schema}"
    );
    // Only the controller's ServiceAccount: another one in the same namespace, and the
    // admin, are not ours.
    let other = impersonating(&format!("system:serviceaccount:{}:default", ns.name)).await;
    for (who, client) in [("default ServiceAccount", &other), ("admin", &ns.client)] {
        for path in [leases, lease] {
            let (schema, level) = classified_as(client, path).await;
            assert!(
                schema != ours && schema != election && level != our_level,
                "{who}: {path} classified by our FlowSchema {schema}"
            );
        }
    }
}

/// With the election on the chart's own level (electionPriorityLevel empty), the
/// election FlowSchema is gone and the main one takes the election Lease.
async fn the_election_on_the_charts_own_level(
    ns: &TestNamespace,
    controller: &kube::Client,
    full: &str,
    lease: &str,
    uids: &Uids,
) {
    let Uids {
        ours, our_level, ..
    } = uids.clone();
    let schemas: Api<FlowSchema> = Api::all(ns.client.clone());
    helm_ok(
        true,
        &[
            "upgrade",
            full,
            chart_dir().to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--reuse-values",
            "--set",
            "apiPriority.electionPriorityLevel=",
        ],
    );
    assert!(
        schemas
            .get_opt(&format!("{full}-election"))
            .await
            .unwrap()
            .is_none()
    );
    let deadline = Instant::now() + WAIT;
    loop {
        let classified = classified_as(controller, lease).await;
        if classified == (ours.clone(), our_level.clone()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{lease} is still classified as {classified:?} after the election FlowSchema was removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
