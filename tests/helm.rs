//! The Helm chart (charts/palisade) against the real API server: lint and values
//! schema, install and uninstall, least-privilege RBAC (the real controller runs on
//! the chart's ServiceAccount token), and the two ValidatingAdmissionPolicies that
//! enforce claim identity (DESIGN rule 7) and object fencing (rule 6).
//!
//! helm and kubectl come from PATH (`make test` puts the pinned ones there). Every
//! cluster test installs its own release into its own namespace; the policy bindings
//! are limited to that namespace (`policies.namespaceSelector`), so tests running at
//! the same time never see each other's policies.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease as CoordinationLease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use palisade::api::{ClaimPhase, Lease, LeaseClaim, LeasePhase};
use serde_json::{Value, json};
use support::TestNamespace;

const WAIT: Duration = Duration::from_secs(20);
/// How long a freshly created admission policy binding may take to become effective.
const POLICY_WARMUP: Duration = Duration::from_secs(15);

// --- helm and kubectl -------------------------------------------------------------------

fn chart_dir() -> PathBuf {
    support::repo_root().join("charts/palisade")
}

/// The path of `name` on PATH, or a panic that says how to get it there.
fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH. The chart tests run the pinned helm and kubectl: use \
                 `make test`, or put the control-plane binaries first on PATH, e.g. \
                 PATH=~/.cache/palisade/bin-k8s-<version>-etcd-<version>-helm-<version>:$PATH \
                 (the directory `make controlplane-bins` fills)"
            )
        })
}

/// helm with its own config/cache/data directories (never the user's), and the test
/// cluster's kubeconfig when `cluster` is set.
fn helm_command(cluster: bool) -> Command {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    let home = HOME.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("palisade-helm-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    let mut cmd = Command::new(tool("helm"));
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    if cluster {
        cmd.env("KUBECONFIG", support::kubeconfig_path());
    } else {
        // helm lint/template must not need a cluster.
        cmd.env("KUBECONFIG", "/nonexistent/kubeconfig");
    }
    cmd
}

fn run(mut cmd: Command, stdin: Option<&str>) -> Output {
    let shown = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("running {shown}: {e}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn helm_ok(cluster: bool, args: &[&str]) -> Output {
    let mut cmd = helm_command(cluster);
    cmd.args(args);
    let out = run(cmd, None);
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}",
        text(&out)
    );
    out
}

/// `helm template` of the chart, parsed into its objects.
fn render(release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    let out = helm_ok(false, &args);
    parse_objects(&String::from_utf8(out.stdout).unwrap())
}

fn parse_objects(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("helm renders valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| {
            let have: Vec<String> = objects
                .iter()
                .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
                .collect();
            panic!("the chart renders no {kind} {name}; it renders {have:?}")
        })
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Flattens RBAC rules into (apiGroup, resource, verb, resourceName) tuples.
fn rule_set(role: &Value) -> BTreeSet<(String, String, String, String)> {
    let mut set = BTreeSet::new();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    for rule in role["rules"].as_array().expect("rules") {
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    for n in &names {
                        set.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    set
}

fn rules(spec: &[(&str, &str, &[&str], &str)]) -> BTreeSet<(String, String, String, String)> {
    spec.iter()
        .flat_map(|(g, r, verbs, name)| {
            verbs.iter().map(move |v| {
                (
                    g.to_string(),
                    r.to_string(),
                    v.to_string(),
                    name.to_string(),
                )
            })
        })
        .collect()
}

/// A release installed into a test namespace; uninstalled when dropped (before the namespace).
struct Release {
    name: String,
    namespace: String,
}

impl Release {
    /// A release name of its own per namespace. It contains "palisade", so the chart's
    /// full name (and thus the ServiceAccount and cluster-scoped object names) is the
    /// release name itself.
    fn name_for(ns: &TestNamespace) -> String {
        let name = format!("palisade-{}", ns.name.trim_start_matches("t-"));
        assert!(name.len() <= 48, "release name {name} too long");
        name
    }

    /// Installs the chart with the policy bindings limited to `policy_namespaces`.
    fn install(ns: &TestNamespace, policy_namespaces: &[&str], extra: &[&str]) -> Self {
        let name = Self::name_for(ns);
        let selector = json!({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": policy_namespaces
        }]});
        let selector = format!("policies.namespaceSelector={selector}");
        let chart = chart_dir();
        let mut args = vec![
            "install",
            &name,
            chart.to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--set-json",
            &selector,
        ];
        args.extend_from_slice(extra);
        let out = helm_ok(true, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("Warning") && !stderr.contains("WARNING"),
            "helm install printed warnings:\n{}",
            text(&out)
        );
        Self {
            name,
            namespace: ns.name.clone(),
        }
    }

    fn uninstall(&self) -> Output {
        helm_ok(
            true,
            &["uninstall", &self.name, "--namespace", &self.namespace],
        )
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut cmd = helm_command(true);
        cmd.args([
            "uninstall",
            &self.name,
            "--namespace",
            &self.namespace,
            "--ignore-not-found",
        ]);
        let _ = run(cmd, None);
    }
}

async fn setup(prefix: &str) -> TestNamespace {
    support::install_crds().await;
    TestNamespace::new(prefix).await
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// Retries `attempt` until it fails with a message containing `expected`, for at most
/// POLICY_WARMUP (a new policy binding takes a moment to be enforced). Each accepted
/// attempt is undone by `undo` before the next one.
async fn until_rejected<T, F, Fut, U, UFut>(
    what: &str,
    expected: &str,
    mut attempt: F,
    mut undo: U,
) -> Box<kube::core::Status>
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
    U: FnMut() -> UFut,
    UFut: std::future::Future<Output = ()>,
{
    let deadline = Instant::now() + POLICY_WARMUP;
    loop {
        match attempt().await {
            Err(kube::Error::Api(status)) if status.message.contains(expected) => return status,
            Err(e) => panic!("{what}: refused, but not by the policy ({expected:?}): {e:?}"),
            Ok(accepted) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: still accepted {POLICY_WARMUP:?} after installing the policy: {accepted:?}"
                );
                undo().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

// --- the chart on its own ---------------------------------------------------------------

#[test]
fn chart_crds_are_a_byte_identical_copy_of_the_generated_crds() {
    let generated = support::repo_root().join("crds/palisade.dev.yaml");
    let copy = chart_dir().join("crds/palisade.dev.yaml");
    let a = std::fs::read(&generated).expect("crds/palisade.dev.yaml");
    let b = std::fs::read(&copy).expect("charts/palisade/crds/palisade.dev.yaml");
    assert!(
        a == b,
        "{} differs from {}: copy it (cp crds/palisade.dev.yaml charts/palisade/crds/)",
        copy.display(),
        generated.display()
    );
    let files: Vec<_> = std::fs::read_dir(chart_dir().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "charts/palisade/crds holds only the copy: {files:?}"
    );
}

#[test]
fn helm_lint_is_clean() {
    let chart = chart_dir();
    for extra in [
        &[][..],
        &[
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "controller.watchNamespace=apps",
            "--set",
            "controller.leaderElection.enabled=false",
        ][..],
    ] {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = helm_ok(false, &args);
        let all = text(&out);
        assert!(
            !all.contains("[WARNING]") && !all.contains("[ERROR]"),
            "helm lint {extra:?} is not clean:\n{all}"
        );
    }
}

#[test]
fn bad_values_fail_with_a_message_naming_the_value() {
    let chart = chart_dir();
    let cases: &[(&[&str], &[&str])] = &[
        (&["--set", "replicaCount=two"], &["replicaCount"]),
        (&["--set", "replicas=3"], &["replicas"]),
        (&["--set", "image.pullPolicy=Sometimes"], &["pullPolicy"]),
        (&["--set", "image.digest=latest"], &["digest"]),
        (&["--set", "controller.adminPort=80"], &["adminPort"]),
        (&["--set", "controller.concurrency=0"], &["concurrency"]),
        (
            &["--set", "controller.watchNamespace=Not_A_Namespace"],
            &["watchNamespace"],
        ),
        (
            &["--set-json", "podDisruptionBudget.maxUnavailable=\"half\""],
            &["maxUnavailable"],
        ),
        (
            &[
                "--set-json",
                "policies.claimIdentity.validationActions=[\"Deny\",\"Warn\"]",
            ],
            &["validationActions"],
        ),
        (
            &[
                "--set-json",
                "policies.fencing.validationActions=[\"Block\"]",
            ],
            &["validationActions"],
        ),
        (
            &[
                "--set-json",
                "policies.fencing.resources=[{\"apiGroups\":[\"apps\"],\"apiVersions\":[\"v1\"]}]",
            ],
            &["resources"],
        ),
        (
            &[
                "--set-json",
                "policies.fencing.resources=[{\"apiGroups\":[\"apps\"],\"apiVersions\":[\"v1\"],\"resources\":[\"deployments\"]}]",
            ],
            &[
                "policies.fencing.resources[0]",
                "deployments",
                "cannot be fenced",
                "/scale",
            ],
        ),
        (
            &[
                "--set-json",
                "policies.fencing.resources=[{\"apiGroups\":[\"\"],\"apiVersions\":[\"v1\"],\"resources\":[\"secrets\",\"pods\"]}]",
            ],
            &["policies.fencing.resources[0]", "pods", "cannot be fenced"],
        ),
        (
            &[
                "--set-json",
                "policies.fencing.resources=[{\"apiGroups\":[\"example.com\"],\"apiVersions\":[\"v1\"],\"resources\":[\"widgets/status\"]}]",
            ],
            &["resources"],
        ),
        (
            &[
                "--set-json",
                "policies.fencing.resources=[{\"apiGroups\":[\"*\"],\"apiVersions\":[\"v1\"],\"resources\":[\"widgets\"]}]",
            ],
            &["apiGroups"],
        ),
        (
            &[
                "--set",
                "policies.claimIdentity.allowNonPodCredentials=maybe",
            ],
            &["allowNonPodCredentials"],
        ),
        (
            &["--set", "policies.fencing.configMaps=false"],
            &["nothing to fence", "policies.fencing.resources"],
        ),
        (
            &["--set", "serviceAccount.create=false"],
            &["serviceAccount.name is required"],
        ),
    ];
    for (args, expected) in cases {
        let mut cmd = helm_command(false);
        cmd.args(["template", "bad", chart.to_str().unwrap()])
            .args(*args);
        let out = run(cmd, None);
        assert!(
            !out.status.success(),
            "helm template {args:?} should fail:\n{}",
            text(&out)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        for needle in *expected {
            assert!(
                stderr.contains(needle),
                "helm template {args:?}: the error should name {needle:?}:\n{}",
                text(&out)
            );
        }
    }
}

#[test]
fn rendered_controller_deployment_matches_the_contract() {
    let objects = render("palisade", "ops", &[]);
    let chart: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    let app_version = chart["appVersion"].as_str().unwrap();

    let deploy = find(&objects, "Deployment", "palisade");
    assert_eq!(deploy["metadata"]["namespace"], "ops");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "palisade");
    find(&objects, "ServiceAccount", "palisade");
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        format!("ghcr.io/palisade-dev/palisade:{app_version}")
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for expected in [
        "controller",
        "--leader-elect=true",
        "--admin-addr=0.0.0.0:8080",
        "--election-name=palisade-controller",
    ] {
        assert!(args.contains(&expected), "args {args:?} lack {expected}");
    }
    assert_eq!(args[0], "controller");
    assert!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "all namespaces by default: {args:?}"
    );
    let env = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no env {name}"))
            .clone()
    };
    assert_eq!(
        env("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        env("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    assert_eq!(c["ports"][0]["name"], "admin");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    for k in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(c["resources"][k][r].is_string(), "resources.{k}.{r} unset");
        }
    }

    let svc = find(&objects, "Service", "palisade-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8080);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "admin");
    assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    let pdb = find(&objects, "PodDisruptionBudget", "palisade");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert!(
        !kinds(&objects).contains("ServiceMonitor"),
        "the ServiceMonitor is off by default"
    );

    let with_monitor = render("palisade", "ops", &["--set", "serviceMonitor.enabled=true"]);
    let sm = find(&with_monitor, "ServiceMonitor", "palisade");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"],
        svc["metadata"]["labels"]
            .as_object()
            .map(|l| {
                let keep = [
                    "app.kubernetes.io/name",
                    "app.kubernetes.io/instance",
                    "app.kubernetes.io/component",
                ];
                Value::Object(
                    l.iter()
                        .filter(|(k, _)| keep.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                )
            })
            .unwrap()
    );

    let pinned = render(
        "palisade",
        "ops",
        &["--set", &format!("image.digest=sha256:{}", "a".repeat(64))],
    );
    assert_eq!(
        find(&pinned, "Deployment", "palisade")["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("ghcr.io/palisade-dev/palisade@sha256:{}", "a".repeat(64))
    );
}

#[test]
fn rendered_rbac_grants_exactly_the_calls_the_controller_and_clients_make() {
    let objects = render("palisade", "ops", &[]);
    let controller = find(&objects, "ClusterRole", "palisade-controller");
    assert_eq!(
        rule_set(controller),
        rules(&[
            ("palisade.dev", "leases", &["get", "list", "watch"], ""),
            ("palisade.dev", "leaseclaims", &["get", "list", "watch"], ""),
            ("palisade.dev", "leases/status", &["get", "update"], ""),
            ("palisade.dev", "leaseclaims/status", &["patch"], ""),
            ("", "pods", &["get", "list", "watch"], ""),
            ("events.k8s.io", "events", &["create"], ""),
        ])
    );
    let binding = find(&objects, "ClusterRoleBinding", "palisade-controller");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "palisade", "namespace": "ops"}])
    );
    let election = find(&objects, "Role", "palisade-election");
    assert_eq!(election["metadata"]["namespace"], "ops");
    assert_eq!(
        rule_set(election),
        rules(&[
            ("coordination.k8s.io", "leases", &["create"], ""),
            (
                "coordination.k8s.io",
                "leases",
                &["get", "update"],
                "palisade-controller"
            ),
        ])
    );
    find(&objects, "RoleBinding", "palisade-election");
    let client = find(&objects, "ClusterRole", "palisade-client");
    assert_eq!(
        rule_set(client),
        rules(&[
            (
                "palisade.dev",
                "leases",
                &["create", "get", "list", "watch"],
                ""
            ),
            (
                "palisade.dev",
                "leaseclaims",
                &["create", "get", "list", "watch", "patch", "delete"],
                ""
            ),
        ])
    );
    assert_eq!(
        client["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    assert_eq!(
        client["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    let role_kinds: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"].as_str().unwrap().contains("Role"))
        .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
        .collect();
    assert_eq!(role_kinds.len(), 5, "no other RBAC objects: {role_kinds:?}");

    // One namespace watched: the ClusterRole is granted there only.
    let scoped = render(
        "palisade",
        "ops",
        &["--set", "controller.watchNamespace=apps"],
    );
    assert!(
        !scoped.iter().any(|o| o["kind"] == "ClusterRoleBinding"),
        "no ClusterRoleBinding when one namespace is watched"
    );
    let rb = find(&scoped, "RoleBinding", "palisade-controller");
    assert_eq!(rb["metadata"]["namespace"], "apps");
    assert_eq!(rb["roleRef"]["kind"], "ClusterRole");
    let args = &find(&scoped, "Deployment", "palisade")["spec"]["template"]["spec"]["containers"]
        [0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--namespace=apps")),
        "{args}"
    );

    // Without leader election there is no election Role.
    let single = render(
        "palisade",
        "ops",
        &["--set", "controller.leaderElection.enabled=false"],
    );
    assert!(!single.iter().any(|o| o["kind"] == "Role"));
    let args = &find(&single, "Deployment", "palisade")["spec"]["template"]["spec"]["containers"]
        [0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--leader-elect=false"))
    );
}

#[test]
fn rendered_fencing_policy_covers_configmaps_and_the_configured_resources() {
    let objects = render("palisade", "ops", &[]);
    let rules_of = |objects: &[Value]| {
        find(
            objects,
            "ValidatingAdmissionPolicy",
            "palisade-object-fencing",
        )["spec"]["matchConstraints"]["resourceRules"]
            .clone()
    };
    assert_eq!(
        rules_of(&objects),
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                "operations": ["CREATE", "UPDATE", "DELETE"]}])
    );
    // The Lease is the parameter of the second policy: every Lease of the object's namespace
    // is selected, and a missing one lets the object's own token decide.
    let lease_policy = find(
        &objects,
        "ValidatingAdmissionPolicy",
        "palisade-fencing-lease",
    );
    assert_eq!(
        lease_policy["spec"]["paramKind"],
        json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "Lease"})
    );
    assert_eq!(
        find(
            &objects,
            "ValidatingAdmissionPolicyBinding",
            "palisade-fencing-lease"
        )["spec"]["paramRef"],
        json!({"selector": {}, "parameterNotFoundAction": "Allow"})
    );
    assert!(
        !objects
            .iter()
            .any(|o| o["metadata"]["name"] == "palisade-fencing-scale"),
        "no /scale policy without policies.fencing.resources"
    );
    for name in [
        "palisade-object-fencing",
        "palisade-fencing-lease",
        "palisade-claim-identity",
    ] {
        let binding = find(&objects, "ValidatingAdmissionPolicyBinding", name);
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(
            binding["spec"]["matchResources"]["namespaceSelector"],
            json!({})
        );
    }
    let more = render(
        "palisade",
        "ops",
        &[
            "--set-json",
            r#"policies.fencing.resources=[{"apiGroups":["example.com"],"apiVersions":["v1"],"resources":["widgets","gadgets"]}]"#,
        ],
    );
    // Their subresources are matched too (and refused for fenced objects), ...
    assert_eq!(
        rules_of(&more)[1],
        json!({"apiGroups": ["example.com"], "apiVersions": ["v1"],
               "resources": ["widgets", "widgets/*", "gadgets", "gadgets/*"],
               "operations": ["CREATE", "UPDATE", "DELETE"]})
    );
    // ... and /scale is refused for the whole kind.
    assert_eq!(
        find(&more, "ValidatingAdmissionPolicy", "palisade-fencing-scale")["spec"]["matchConstraints"]
            ["resourceRules"],
        json!([{"apiGroups": ["example.com"], "apiVersions": ["v1"],
                "resources": ["widgets/scale", "gadgets/scale"], "operations": ["CREATE", "UPDATE"]}])
    );
    let off = render(
        "palisade",
        "ops",
        &[
            "--set",
            "policies.fencing.enabled=false",
            "--set",
            "policies.claimIdentity.enabled=false",
        ],
    );
    assert!(
        !kinds(&off)
            .iter()
            .any(|k| k.starts_with("ValidatingAdmission")),
        "{:?}",
        kinds(&off)
    );
}

// --- against the API server -------------------------------------------------------------

#[tokio::test]
async fn install_creates_the_objects_and_uninstall_keeps_user_leases_and_crds() {
    // The CRDs exist already (other tests apply them): helm must tolerate that.
    let ns = setup("helm-install").await;
    let client = ns.client.clone();
    let release = Release::install(&ns, &[&ns.name], &[]);
    let full = release.name.clone();

    let status = helm_ok(
        true,
        &[
            "status",
            &release.name,
            "--namespace",
            &ns.name,
            "-o",
            "json",
        ],
    );
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["info"]["status"], "deployed");
    assert!(
        status["info"]["notes"]
            .as_str()
            .is_some_and(|n| n.contains("kind: Lease") && n.contains("palisade lock")),
        "NOTES tell how to create a Lease and run palisade lock: {}",
        status["info"]["notes"]
    );

    // Namespaced objects (the Deployment never runs: there is no kubelet).
    let deploy = ns.api::<Deployment>().get(&full).await.expect("Deployment");
    assert_eq!(deploy.spec.unwrap().replicas, Some(2));
    ns.api::<ServiceAccount>()
        .get(&full)
        .await
        .expect("ServiceAccount");
    ns.api::<Service>()
        .get(&format!("{full}-metrics"))
        .await
        .expect("metrics Service");
    ns.api::<PodDisruptionBudget>()
        .get(&full)
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
    // Cluster-scoped objects.
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

    // A user's Lease, created while the chart is installed.
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": "users-lease"}, "spec": {"leaseDurationSeconds": 30}
    }))
    .unwrap();
    ns.api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await
        .expect("create Lease");

    release.uninstall();
    let deadline = Instant::now() + WAIT;
    loop {
        let mut left = vec![];
        if ns
            .api::<Deployment>()
            .get_opt(&full)
            .await
            .unwrap()
            .is_some()
        {
            left.push("Deployment".to_string());
        }
        if ns
            .api::<ServiceAccount>()
            .get_opt(&full)
            .await
            .unwrap()
            .is_some()
        {
            left.push("ServiceAccount".into());
        }
        if ns
            .api::<Service>()
            .get_opt(&format!("{full}-metrics"))
            .await
            .unwrap()
            .is_some()
        {
            left.push("Service".into());
        }
        if ns
            .api::<PodDisruptionBudget>()
            .get_opt(&full)
            .await
            .unwrap()
            .is_some()
        {
            left.push("PodDisruptionBudget".into());
        }
        if ns
            .api::<Role>()
            .get_opt(&format!("{full}-election"))
            .await
            .unwrap()
            .is_some()
        {
            left.push("Role".into());
        }
        for suffix in ["controller", "client"] {
            if cluster_roles
                .get_opt(&format!("{full}-{suffix}"))
                .await
                .unwrap()
                .is_some()
            {
                left.push(format!("ClusterRole {suffix}"));
            }
        }
        if Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(&format!("{full}-controller"))
            .await
            .unwrap()
            .is_some()
        {
            left.push("ClusterRoleBinding".into());
        }
        for policy in ["claim-identity", "object-fencing", "fencing-lease"] {
            if Api::<ValidatingAdmissionPolicy>::all(client.clone())
                .get_opt(&format!("{full}-{policy}"))
                .await
                .unwrap()
                .is_some()
            {
                left.push(format!("ValidatingAdmissionPolicy {policy}"));
            }
            if Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                .get_opt(&format!("{full}-{policy}"))
                .await
                .unwrap()
                .is_some()
            {
                left.push(format!("ValidatingAdmissionPolicyBinding {policy}"));
            }
        }
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
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in ["leases.palisade.dev", "leaseclaims.palisade.dev"] {
        crds.get(crd)
            .await
            .unwrap_or_else(|e| panic!("helm uninstall keeps CRD {crd}: {e}"));
    }
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
        ][..],
    ] {
        let mut args = vec![
            "template",
            &release,
            chart.to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--include-crds",
        ];
        args.extend_from_slice(extra);
        let rendered = helm_ok(false, &args);
        let rendered = String::from_utf8(rendered.stdout).unwrap();
        assert!(rendered.contains("kind: CustomResourceDefinition"));
        // Server-side apply, dry run, strict field validation: unknown or duplicate
        // fields are errors, not warnings.
        let mut cmd = Command::new(tool("kubectl"));
        cmd.env("KUBECONFIG", support::kubeconfig_path()).args([
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

// --- RBAC: the real controller on the chart's ServiceAccount ----------------------------

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

async fn service_account_token(ns: &TestNamespace, sa: &str, pod: Option<&Pod>) -> String {
    let mut spec = json!({"audiences": [], "expirationSeconds": 3600});
    if let Some(pod) = pod {
        spec["boundObjectRef"] = json!({
            "apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid().unwrap()
        });
    }
    let request: TokenRequest = serde_json::from_value(json!({ "spec": spec })).unwrap();
    ns.api::<ServiceAccount>()
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for ServiceAccount {sa}: {e}"))
        .status
        .expect("TokenRequest status")
        .token
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

async fn create_lease(ns: &TestNamespace, name: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": name}, "spec": {"leaseDurationSeconds": 600}
    }))
    .unwrap();
    ns.api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await
        .expect("create Lease");
}

/// A claim named `name`; bound to `pod` when given, and then shown as held by that pod (as
/// the claim-identity policy requires of a pod's own claims), else by `name`.
fn claim(name: &str, lease: &str, pod: Option<Value>) -> LeaseClaim {
    let mut spec = json!({"leaseName": lease, "holderIdentity": name});
    if let Some(pod) = pod {
        spec["holderIdentity"] = pod["name"].clone();
        spec["pod"] = pod;
    }
    serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

async fn wait_lease(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    controller: &ChartController,
    pred: impl Fn(&Lease) -> bool,
) -> Lease {
    let deadline = Instant::now() + WAIT;
    loop {
        let lease = ns.api::<Lease>().get(name).await.expect("get Lease");
        if pred(&lease) {
            return lease;
        }
        assert!(
            Instant::now() < deadline,
            "Lease {name}: no {what} within {WAIT:?}: {:?}\ncontroller log:\n{}",
            lease.status,
            controller.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_claim_phase(
    ns: &TestNamespace,
    name: &str,
    phase: ClaimPhase,
    controller: &ChartController,
) -> LeaseClaim {
    let deadline = Instant::now() + WAIT;
    loop {
        let claim = ns.api::<LeaseClaim>().get(name).await.expect("get claim");
        if claim.status.as_ref().and_then(|s| s.phase) == Some(phase) {
            return claim;
        }
        assert!(
            Instant::now() < deadline,
            "claim {name} never reached {phase:?}: {:?}\ncontroller log:\n{}",
            claim.status,
            controller.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
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

    // Cluster-wide reads, as the default install does them (the process below watches
    // only this namespace, to stay out of other tests' Leases).
    let as_controller = support::client_with_token(&sa_token).await;
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

    // Grant, then hand over on release with a higher token.
    create_lease(&ns, "orders").await;
    let claims = ns.api::<LeaseClaim>();
    let pp = PostParams::default();
    claims
        .create(&pp, &claim("first", "orders", None))
        .await
        .unwrap();
    let lease = wait_lease(&ns, "orders", "holder first", &controller, |l| {
        support::holder_claim(l).as_deref() == Some("first")
    })
    .await;
    let first_token = support::token(&lease);
    wait_claim_phase(&ns, "first", ClaimPhase::Granted, &controller).await;
    claims
        .create(&pp, &claim("second", "orders", None))
        .await
        .unwrap();
    wait_lease(&ns, "orders", "a waiter", &controller, |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(1))
    })
    .await;
    claims
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    let lease = wait_lease(&ns, "orders", "holder second", &controller, |l| {
        support::holder_claim(l).as_deref() == Some("second")
    })
    .await;
    let second_token = support::token(&lease);
    assert!(
        second_token > first_token,
        "handover token {second_token} not above {first_token}"
    );
    let second = wait_claim_phase(&ns, "second", ClaimPhase::Granted, &controller).await;
    assert_eq!(second.status.unwrap().fencing_token, Some(second_token));

    // A pod-bound claim is revoked when its pod goes.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "worker-0"},
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "main", "image": "registry.invalid/none:0"}]}
    }))
    .unwrap();
    let pod = ns.api::<Pod>().create(&pp, &pod).await.unwrap();
    create_lease(&ns, "guarded").await;
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
    wait_lease(&ns, "guarded", "holder worker-0", &controller, |l| {
        support::holder_claim(l).as_deref() == Some("worker-0")
    })
    .await;
    ns.api::<Pod>()
        .delete("worker-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_claim_phase(&ns, "worker-0", ClaimPhase::Revoked, &controller).await;
    wait_lease(&ns, "guarded", "phase Free", &controller, |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.phase == Some(LeasePhase::Free) && s.holder.is_none())
    })
    .await;

    // Events were published (events.k8s.io create).
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
    let elsewhere = "palisade-elsewhere";
    let all = "";
    let election = format!("{}-controller", release.name);
    let (p, c, ev) = ("palisade.dev", "coordination.k8s.io", "events.k8s.io");

    let controller: Vec<Check> = vec![
        // allowed: what src/controller.rs and src/election.rs call
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
        ("get", c, "leases", "", n, &election, true),
        ("update", c, "leases", "", n, &election, true),
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
        ("delete", c, "leases", "", n, &election, false),
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
        ("get", c, "leases", "", elsewhere, &election, false),
        (
            "create",
            "",
            "serviceaccounts",
            "token",
            n,
            &release.name,
            false,
        ),
        (
            "create",
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            "",
            all,
            "",
            false,
        ),
    ];

    // A workload's ServiceAccount bound to the client role in its namespace.
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
                    "name": format!("{}-client", release.name)},
        "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": n}]
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let client: Vec<Check> = vec![
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
    ];

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

// --- admission policies ------------------------------------------------------------------

async fn create_sa_and_pod(ns: &TestNamespace, sa: &str, pods: &[&str]) -> Vec<Pod> {
    let pp = PostParams::default();
    ns.api::<ServiceAccount>()
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": sa}})).unwrap(),
        )
        .await
        .unwrap();
    let mut out = vec![];
    for name in pods {
        // No kubelet or scheduler: the Pod object only has to exist to bind a token to it.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"serviceAccountName": sa, "automountServiceAccountToken": false,
                     "containers": [{"name": "main", "image": "registry.invalid/none:0"}]}
        }))
        .unwrap();
        out.push(ns.api::<Pod>().create(&pp, &pod).await.unwrap());
    }
    out
}

async fn bind_client_role(ns: &str, client: &Client, release: &str, sa_ns: &str, sa: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{sa_ns}-{sa}-palisade")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": format!("{release}-client")},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pod_may_only_claim_for_itself() {
    let ns = setup("helm-identity").await;
    let other = TestNamespace::new("helm-identity-other").await;
    let release = Release::install(&ns, &[&ns.name, &other.name], &[]);
    let pods = create_sa_and_pod(&ns, "worker", &["worker-a", "worker-b"]).await;
    let (a, b) = (&pods[0], &pods[1]);
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, "worker").await;
    bind_client_role(&other.name, &ns.client, &release.name, &ns.name, "worker").await;
    let as_a =
        support::client_with_token(&service_account_token(&ns, "worker", Some(a)).await).await;
    let a_claims: Api<LeaseClaim> = Api::namespaced(as_a.clone(), &ns.name);
    let admin_claims = ns.api::<LeaseClaim>();
    let pp = PostParams::default();
    let (a_claims_ref, admin_ref, pp_ref) = (&a_claims, &admin_claims, &pp);

    // Pod A claiming for pod B is refused (once the new binding is in force).
    let refused = until_rejected(
        "pod worker-a creating a claim for worker-b",
        "a pod may only claim for itself",
        move || {
            let c = claim("for-b", "jobs", Some(json!({"name": "worker-b"})));
            async move { a_claims_ref.create(pp_ref, &c).await }
        },
        move || async move {
            let _ = admin_ref.delete("for-b", &DeleteParams::default()).await;
        },
    )
    .await;
    assert!(
        refused.message.contains("spec.pod.name is worker-b")
            && refused
                .message
                .contains("the request comes from pod worker-a"),
        "{refused:?}"
    );

    // ... for itself it is allowed, with or without its UID.
    a_claims
        .create(
            &pp,
            &claim(
                "for-a",
                "jobs",
                Some(json!({"name": "worker-a", "uid": a.uid().unwrap()})),
            ),
        )
        .await
        .expect("pod worker-a claims for itself");
    a_claims
        .create(
            &pp,
            &claim("for-a-by-name", "jobs", Some(json!({"name": "worker-a"}))),
        )
        .await
        .expect("pod worker-a claims for itself (no uid)");

    // Without spec.pod, or with B's UID, it is refused.
    let e = api_error(a_claims.create(&pp, &claim("no-pod", "jobs", None)).await);
    assert!(
        e.message.contains("a pod may only claim for itself")
            && e.message.contains("spec.pod.name must be set to worker-a"),
        "{e:?}"
    );
    let e = api_error(
        a_claims
            .create(
                &pp,
                &claim(
                    "wrong-uid",
                    "jobs",
                    Some(json!({"name": "worker-a", "uid": b.uid().unwrap()})),
                ),
            )
            .await,
    );
    assert!(
        e.message.contains("a pod may only claim for itself") && e.message.contains("spec.pod.uid"),
        "{e:?}"
    );

    // Renewing (an UPDATE): its own claim yes, someone else's no.
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    a_claims
        .patch("for-a", &PatchParams::default(), &renew)
        .await
        .expect("pod worker-a renews its own claim");
    admin_claims
        .create(
            &pp,
            &claim("b-by-admin", "jobs", Some(json!({"name": "worker-b"}))),
        )
        .await
        .expect("requests not from a pod are not affected");
    let e = api_error(
        a_claims
            .patch("b-by-admin", &PatchParams::default(), &renew)
            .await,
    );
    assert!(
        e.message.contains("a pod may only claim for itself"),
        "{e:?}"
    );
    a_claims
        .delete("for-a", &DeleteParams::default())
        .await
        .expect("pod worker-a releases its claim");

    // spec.pod is namespace-local: in another namespace "worker-a" is not this pod.
    let e = api_error(
        Api::<LeaseClaim>::namespaced(as_a.clone(), &other.name)
            .create(
                &pp,
                &claim("abroad", "jobs", Some(json!({"name": "worker-a"}))),
            )
            .await,
    );
    assert!(
        e.message.contains("a pod may only claim for itself") && e.message.contains("namespace"),
        "{e:?}"
    );

    // A token that is not bound to a pod is not a pod's request.
    let unbound =
        support::client_with_token(&service_account_token(&ns, "worker", None).await).await;
    Api::<LeaseClaim>::namespaced(unbound, &ns.name)
        .create(
            &pp,
            &claim("unbound", "jobs", Some(json!({"name": "worker-b"}))),
        )
        .await
        .expect("a service-account token without a pod is not checked");
}

/// What a fenced write changes besides the token: ConfigMap `data`, Secret `stringData`.
trait Payload {
    const FIELD: &'static str;
}
impl Payload for ConfigMap {
    const FIELD: &'static str = "data";
}
impl Payload for Secret {
    const FIELD: &'static str = "stringData";
}

/// A value never used before in this test process, for `palisade.dev/write-id`.
fn next_write_id() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    n.to_string()
}

/// Sets (or with None removes) the token annotation, sets a new `palisade.dev/write-id`
/// and changes the data: a real write, as a merge patch (no resourceVersion precondition:
/// only the token decides).
async fn write_with_token<K>(
    api: &Api<K>,
    name: &str,
    token: Option<&str>,
) -> Result<K, kube::Error>
where
    K: kube::Resource + Payload + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let n = next_write_id();
    let patch = json!({
        "metadata": {"annotations": {"palisade.dev/fencing-token": token,
                                     "palisade.dev/write-id": n}},
        K::FIELD: {"n": n},
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

#[tokio::test]
async fn fenced_objects_refuse_missing_malformed_and_stale_tokens() {
    let ns = setup("helm-fencing").await;
    let _release = Release::install(
        &ns,
        &[&ns.name],
        &[
            "--set-json",
            r#"policies.fencing.resources=[{"apiGroups":[""],"apiVersions":["v1"],"resources":["secrets"]}]"#,
        ],
    );
    let cms = ns.api::<ConfigMap>();
    let pp = PostParams::default();
    let (cms_ref, pp_ref) = (&cms, &pp);
    let fenced = |name: &str, token: Option<&str>| -> ConfigMap {
        let mut cm = json!({
            "metadata": {"name": name, "labels": {"palisade.dev/fenced-by": "billing-cron"}},
            "data": {"n": "0"}
        });
        if let Some(t) = token {
            cm["metadata"]["annotations"] = json!({"palisade.dev/fencing-token": t});
        }
        serde_json::from_value(cm).unwrap()
    };

    // CREATE of a fenced object needs a token (the first expectation waits for the binding).
    let e = until_rejected(
        "creating a fenced ConfigMap without a token",
        "palisade.dev/fencing-token",
        move || {
            let cm = fenced("billing-config", None);
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, "billing-config").await },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("ConfigMap")
            && e.message.contains("billing-config")
            && e.message.contains("fenced by Lease billing-cron")
            && e.message.contains("must carry"),
        "{e:?}"
    );
    let e = api_error(
        cms.create(&pp, &fenced("billing-config", Some("soon")))
            .await,
    );
    assert!(e.message.contains("non-negative integer"), "{e:?}");
    cms.create(&pp, &fenced("billing-config", Some("12")))
        .await
        .expect("create with a well-formed token");

    // The holder with token 34 writes; a paused holder with 33 wakes up and is refused.
    write_with_token(&cms, "billing-config", Some("34"))
        .await
        .expect("token 34 is above 12");
    write_with_token(&cms, "billing-config", Some("34"))
        .await
        .expect("the same holder writes again with its token");
    let e = api_error(write_with_token(&cms, "billing-config", Some("33")).await);
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message
            .contains("stale fencing token 33 is lower than the current token 34"),
        "{e:?}"
    );

    // Missing and malformed tokens are refused; the object keeps token 34.
    let e = api_error(write_with_token(&cms, "billing-config", None).await);
    assert!(e.message.contains("must carry"), "{e:?}");
    for bad in [
        "",
        "-1",
        "+35",
        " 35",
        "35 ",
        "3.5e1",
        "0x23",
        "thirty-five",
        "١٢٣",
        "9223372036854775808",
        "99999999999999999999999999999999999999999999999999",
    ] {
        let e = api_error(write_with_token(&cms, "billing-config", Some(bad)).await);
        assert!(
            e.message.contains("must be a non-negative integer"),
            "token {bad:?}: {e:?}"
        );
    }
    // The largest accepted token: 18 digits, so int() cannot overflow.
    write_with_token(&cms, "billing-config", Some("999999999999999999"))
        .await
        .expect("an 18-digit token");
    let e = api_error(write_with_token(&cms, "billing-config", Some("1000000000000000000")).await);
    assert!(e.message.contains("at most 18 digits"), "{e:?}");
    let current = cms.get("billing-config").await.unwrap();
    assert_eq!(
        current
            .annotations()
            .get("palisade.dev/fencing-token")
            .map(String::as_str),
        Some("999999999999999999")
    );

    // Taking an object out of fencing is itself a fenced write.
    let unlabel = |token: &str| {
        Patch::Merge(json!({"metadata": {
            "labels": {"palisade.dev/fenced-by": null},
            "annotations": {"palisade.dev/fencing-token": token,
                            "palisade.dev/write-id": next_write_id()}
        }}))
    };
    let e = api_error(
        cms.patch("billing-config", &PatchParams::default(), &unlabel("35"))
            .await,
    );
    assert!(e.message.contains("stale fencing token 35"), "{e:?}");
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &unlabel("999999999999999999"),
    )
    .await
    .expect("the current holder may remove the label");
    write_with_token(&cms, "billing-config", None)
        .await
        .expect("no longer fenced");

    // Unlabelled objects are untouched.
    let plain: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "plain"}, "data": {"n": "0"}})).unwrap();
    cms.create(&pp, &plain).await.unwrap();
    for t in [Some("34"), Some("33"), Some("junk"), None] {
        write_with_token(&cms, "plain", t)
            .await
            .unwrap_or_else(|e| panic!("unlabelled ConfigMap with token {t:?}: {e}"));
    }

    // Kinds from values: here Secrets.
    let secrets = ns.api::<Secret>();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-password", "labels": {"palisade.dev/fenced-by": "billing-cron"},
                     "annotations": {"palisade.dev/fencing-token": "40"}},
        "stringData": {"n": "0"}
    }))
    .unwrap();
    secrets.create(&pp, &secret).await.expect("fenced Secret");
    write_with_token(&secrets, "db-password", Some("41"))
        .await
        .expect("a higher token");
    let e = api_error(write_with_token(&secrets, "db-password", Some("40")).await);
    assert!(
        e.message.contains("Secret")
            && e.message
                .contains("stale fencing token 40 is lower than the current token 41"),
        "{e:?}"
    );
}

// --- object fencing against the Lease's published token (DESIGN: object fencing policy) ----

/// A fenced ConfigMap: label `palisade.dev/fenced-by: lease`, token annotation `token`.
fn fenced_cm(name: &str, lease: &str, token: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"palisade.dev/fenced-by": lease},
                     "annotations": {"palisade.dev/fencing-token": token,
                                     "palisade.dev/write-id": next_write_id()}},
        "data": {"n": "0", "token": token}
    }))
    .unwrap()
}

/// The one way to delete a fenced object: remove the label in a write that carries a
/// token above any test token, then delete. Errors are ignored (used to undo).
async fn unfence_and_delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let unlabel = Patch::Merge(json!({"metadata": {
        "labels": {"palisade.dev/fenced-by": null},
        "annotations": {"palisade.dev/fencing-token": "999999999999999999",
                        "palisade.dev/write-id": next_write_id()}
    }}));
    let _ = api.patch(name, &PatchParams::default(), &unlabel).await;
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// Publishes `token` as the Lease's status.fencingToken, as the controller does on a grant
/// (no controller runs in these tests: the status is what the policy reads).
async fn publish_token(ns: &TestNamespace, lease: &str, token: i64) {
    ns.api::<Lease>()
        .patch_status(
            lease,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"fencingToken": token, "phase": "Held"}})),
        )
        .await
        .unwrap_or_else(|e| panic!("publishing token {token} on Lease {lease}: {e}"));
}

fn token_of(cm: &ConfigMap) -> Option<String> {
    cm.annotations().get("palisade.dev/fencing-token").cloned()
}

/// kubectl against the test cluster, with `stdin`.
fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(tool("kubectl"));
    cmd.env("KUBECONFIG", support::kubeconfig_path()).args(args);
    run(cmd, stdin)
}

#[tokio::test]
async fn a_stale_holder_cannot_rewrite_a_fenced_object_by_deleting_and_recreating_it() {
    let ns = setup("helm-recreate").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron").await;
    publish_token(&ns, "billing-cron", 34).await;
    let cms = ns.api::<ConfigMap>();
    let pp = PostParams::default();
    let (cms_ref, pp_ref) = (&cms, &pp);

    // Creating the object needs a token at least the Lease's published one.
    let e = until_rejected(
        "creating a fenced ConfigMap with token 33 while Lease billing-cron has published 34",
        "has granted since",
        move || {
            let cm = fenced_cm("billing-config", "billing-cron", "33");
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, "billing-config").await },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("ConfigMap")
            && e.message.contains("billing-config")
            && e.message.contains(
                "stale fencing token 33 is lower than the token 34 that Lease billing-cron has granted since"
            ),
        "{e:?}"
    );
    cms.create(&pp, &fenced_cm("billing-config", "billing-cron", "34"))
        .await
        .expect("the holder of token 34 creates the object");

    // The holder of 33 wakes up: it cannot delete the object, ...
    let e = api_error(cms.delete("billing-config", &DeleteParams::default()).await);
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("billing-config")
            && e.message.contains("a delete cannot carry a fencing token"),
        "{e:?}"
    );
    // ... nor replace it (kubectl replace --force deletes, then creates).
    let manifest =
        serde_json::to_string(&fenced_cm("billing-config", "billing-cron", "33")).unwrap();
    let out = kubectl(
        &["replace", "--force", "--namespace", &ns.name, "-f", "-"],
        Some(&manifest),
    );
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr)
                .contains("a delete cannot carry a fencing token"),
        "kubectl replace --force by a stale holder must be refused:\n{}",
        text(&out)
    );
    let kept = cms.get("billing-config").await.unwrap();
    assert_eq!(token_of(&kept).as_deref(), Some("34"), "{kept:?}");

    // The next holder (35) deletes it the fenced way: the label goes first, with its token.
    publish_token(&ns, "billing-cron", 35).await;
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "labels": {"palisade.dev/fenced-by": null},
            "annotations": {"palisade.dev/fencing-token": "35", "palisade.dev/write-id": next_write_id()}
        }})),
    )
    .await
    .expect("the holder of 35 takes the object out of fencing");
    cms.delete("billing-config", &DeleteParams::default())
        .await
        .expect("an unfenced object can be deleted");

    // Now the holder of 34 re-creates it with its old token (kubectl apply, or a create):
    // refused, since the Lease has published 35 (the policy's view of the Lease may lag a moment).
    let e = until_rejected(
        "re-creating the deleted fenced ConfigMap with token 34 after Lease billing-cron published 35",
        "has granted since",
        move || {
            let cm = fenced_cm("billing-config", "billing-cron", "34");
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, "billing-config").await },
    )
    .await;
    assert!(
        e.message
            .contains("stale fencing token 34 is lower than the token 35"),
        "{e:?}"
    );
    let manifest =
        serde_json::to_string(&fenced_cm("billing-config", "billing-cron", "34")).unwrap();
    let out = kubectl(
        &["apply", "--namespace", &ns.name, "-f", "-"],
        Some(&manifest),
    );
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("stale fencing token 34"),
        "kubectl apply by a stale holder must be refused:\n{}",
        text(&out)
    );
    assert!(cms.get_opt("billing-config").await.unwrap().is_none());
    cms.create(&pp, &fenced_cm("billing-config", "billing-cron", "35"))
        .await
        .expect("the holder of 35 re-creates it");

    // A label naming no existing Lease: the write is judged by the object's own token.
    cms.create(&pp, &fenced_cm("orphan", "no-such-lease", "1"))
        .await
        .expect("fenced by a Lease that does not exist: a well-formed token suffices");
    let e = api_error(write_with_token(&cms, "orphan", Some("0")).await);
    assert!(
        e.message
            .contains("stale fencing token 0 is lower than the current token 1"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_namespace_with_fenced_objects_can_still_be_deleted() {
    let ns = setup("helm-ns-delete").await;
    let doomed = TestNamespace::new("helm-ns-doomed").await;
    let _release = Release::install(&ns, &[&ns.name, &doomed.name], &[]);
    let cms = doomed.api::<ConfigMap>();
    let cms_ref = &cms;
    until_rejected(
        "deleting a fenced ConfigMap",
        "a delete cannot carry a fencing token",
        move || async move {
            let _ = cms_ref
                .create(
                    &PostParams::default(),
                    &fenced_cm("doomed", "billing-cron", "1"),
                )
                .await;
            cms_ref.delete("doomed", &DeleteParams::default()).await
        },
        || async {},
    )
    .await;
    cms.get("doomed")
        .await
        .expect("the fenced ConfigMap is still there");
    // The namespace controller's deletes happen while the namespace is terminating: allowed.
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    namespaces
        .delete(&doomed.name, &DeleteParams::background())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while namespaces.get_opt(&doomed.name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "namespace {} with a fenced ConfigMap not deleted within 60s: {:?}",
            doomed.name,
            namespaces.get(&doomed.name).await.unwrap().status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_write_that_leaves_the_token_untouched_is_refused() {
    let ns = setup("helm-untouched").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron").await;
    publish_token(&ns, "billing-cron", 34).await;
    let cms = ns.api::<ConfigMap>();
    let pp = PostParams::default();
    cms.create(&pp, &fenced_cm("billing-config", "billing-cron", "34"))
        .await
        .expect("the holder of 34 creates the object");
    let cms_ref = &cms;
    let untouched = |what: &str| Patch::Merge(json!({"data": {"n": what.to_string()}}));

    // A write that changes only the data (a merge patch without the annotations, as a
    // writer that forgot its token sends it) would inherit token 34: refused.
    let e = until_rejected(
        "a data-only patch of a fenced ConfigMap",
        "carries no fencing token",
        move || async move {
            cms_ref
                .patch(
                    "billing-config",
                    &PatchParams::default(),
                    &untouched("stale"),
                )
                .await
        },
        || async {},
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("billing-config")
            && e.message.contains("fenced by Lease billing-cron")
            && e.message.contains("palisade.dev/write-id"),
        "{e:?}"
    );
    // So is a label edit that carries no token.
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "payments"}}})),
        )
        .await,
    );
    assert!(e.message.contains("carries no fencing token"), "{e:?}");

    // The holder writes again and again with its token and a new write id each time.
    for _ in 0..3 {
        write_with_token(&cms, "billing-config", Some("34"))
            .await
            .expect("the holder of 34 writes again with a new write id");
    }
    // Replaying its last write (same token, same write id) is refused too.
    let last = cms.get("billing-config").await.unwrap();
    let replay = Patch::Merge(json!({"metadata": {"annotations": {
        "palisade.dev/fencing-token": "34",
        "palisade.dev/write-id": last.annotations()["palisade.dev/write-id"].clone()
    }}, "data": {"n": "replayed"}}));
    let e = api_error(
        cms.patch("billing-config", &PatchParams::default(), &replay)
            .await,
    );
    assert!(e.message.contains("carries no fencing token"), "{e:?}");

    // A new grant (35) is published and its holder has not written yet: the holder of 34 is
    // refused even with its token and a new write id.
    publish_token(&ns, "billing-cron", 35).await;
    let e = until_rejected(
        "a write with token 34 after Lease billing-cron published 35",
        "has granted since",
        move || async move { write_with_token(cms_ref, "billing-config", Some("34")).await },
        || async {},
    )
    .await;
    assert!(
        e.message
            .contains("stale fencing token 34 is lower than the token 35 that Lease billing-cron"),
        "{e:?}"
    );
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &untouched("stale"),
        )
        .await,
    );
    // Both policies refuse it; which one answers first is the API server's choice.
    assert!(
        e.message.contains("carries no fencing token")
            || e.message
                .contains("stale fencing token 34 is lower than the token 35"),
        "{e:?}"
    );

    // The new holder writes; a write without a token is still refused, though it would now
    // inherit the current token.
    write_with_token(&cms, "billing-config", Some("35"))
        .await
        .expect("the holder of 35 writes");
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &untouched("stale"),
        )
        .await,
    );
    assert!(e.message.contains("carries no fencing token"), "{e:?}");
    let now = cms.get("billing-config").await.unwrap();
    assert_eq!(token_of(&now).as_deref(), Some("35"));
    assert_ne!(now.data.unwrap()["n"], "stale");
}

// --- subresources of fenced kinds -----------------------------------------------------------

/// A namespaced custom resource `widgets.<group>` with /status and /scale; deleted on drop.
struct WidgetCrd {
    group: String,
    client: Client,
}

impl WidgetCrd {
    async fn create(ns: &TestNamespace) -> Self {
        let group = format!("{}.palisade-tests.example", ns.name);
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("widgets.{group}")},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                        "status": {"type": "object", "properties": {
                            "replicas": {"type": "integer"}, "note": {"type": "string"}}}
                    }}},
                    "subresources": {"status": {}, "scale": {
                        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}
                }]
            }
        }))
        .unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
        let name = crd.name_any();
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("creating CRD {name}: {e}"));
        tokio::time::timeout(
            WAIT,
            kube::runtime::wait::await_condition(
                crds,
                &name,
                kube::runtime::wait::conditions::is_crd_established(),
            ),
        )
        .await
        .expect("the test CRD is established")
        .unwrap();
        Self {
            group,
            client: ns.client.clone(),
        }
    }

    fn api(&self, ns: &str) -> Api<kube::api::DynamicObject> {
        let resource = kube::api::ApiResource {
            group: self.group.clone(),
            version: "v1".into(),
            api_version: format!("{}/v1", self.group),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        Api::namespaced_with(self.client.clone(), ns, &resource)
    }

    fn widget(&self, name: &str, fenced_token: Option<&str>) -> kube::api::DynamicObject {
        let mut w = json!({
            "apiVersion": format!("{}/v1", self.group), "kind": "Widget",
            "metadata": {"name": name}, "spec": {"replicas": 1}
        });
        if let Some(t) = fenced_token {
            w["metadata"]["labels"] = json!({"palisade.dev/fenced-by": "widget-lease"});
            w["metadata"]["annotations"] = json!({"palisade.dev/fencing-token": t});
        }
        serde_json::from_value(w).unwrap()
    }
}

impl Drop for WidgetCrd {
    fn drop(&mut self) {
        let name = format!("widgets.{}", self.group);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = Api::<CustomResourceDefinition>::all(support::client().await)
                    .delete(&name, &DeleteParams::default())
                    .await;
            });
        })
        .join();
    }
}

#[tokio::test]
async fn subresource_writes_of_fenced_kinds_are_refused() {
    let ns = setup("helm-subres").await;
    let crd = WidgetCrd::create(&ns).await;
    let rules =
        json!([{"apiGroups": [crd.group], "apiVersions": ["v1"], "resources": ["widgets"]}]);
    let _release = Release::install(
        &ns,
        &[&ns.name],
        &["--set-json", &format!("policies.fencing.resources={rules}")],
    );
    let widgets = crd.api(&ns.name);
    let pp = PostParams::default();
    widgets
        .create(&pp, &crd.widget("fenced", Some("5")))
        .await
        .expect("a fenced widget");
    widgets
        .create(&pp, &crd.widget("plain", None))
        .await
        .expect("an unfenced widget");
    let pp_patch = PatchParams::default();
    let widgets_ref = &widgets;
    let pp_patch_ref = &pp_patch;

    // /status of a fenced object: the API server ignores metadata there, so no token can
    // come with it. Refused.
    let e = until_rejected(
        "a /status write of a fenced widget",
        "status subresource",
        move || async move {
            widgets_ref
                .patch_status(
                    "fenced",
                    pp_patch_ref,
                    &Patch::Merge(json!({"status": {"note": "stale"}})),
                )
                .await
        },
        || async {},
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("Widget")
            && e.message.contains("fenced")
            && e.message.contains("cannot carry a fencing token"),
        "{e:?}"
    );
    // /scale: a Scale shows neither label nor token, so it is refused for the whole kind.
    let scale = Patch::Merge(json!({"spec": {"replicas": 3}}));
    let e = until_rejected(
        "a /scale write of a fenced widget",
        "/scale",
        move || {
            let scale = scale.clone();
            async move {
                widgets_ref
                    .patch_scale("fenced", pp_patch_ref, &scale)
                    .await
            }
        },
        || async {},
    )
    .await;
    assert!(
        e.message.contains("widgets/scale")
            && e.message
                .contains("neither the palisade.dev/fenced-by label nor a fencing token"),
        "{e:?}"
    );
    let e = api_error(
        widgets
            .patch_scale(
                "plain",
                &pp_patch,
                &Patch::Merge(json!({"spec": {"replicas": 3}})),
            )
            .await,
    );
    assert!(e.message.contains("/scale"), "{e:?}");
    // The fenced write path: spec with a token.
    widgets
        .patch(
            "fenced",
            &pp_patch,
            &Patch::Merge(json!({
                "metadata": {"annotations": {"palisade.dev/fencing-token": "6",
                                             "palisade.dev/write-id": next_write_id()}},
                "spec": {"replicas": 3}
            })),
        )
        .await
        .expect("a write of spec.replicas with a token");
    // Unfenced objects' /status is untouched.
    widgets
        .patch_status(
            "plain",
            &pp_patch,
            &Patch::Merge(json!({"status": {"note": "fine"}})),
        )
        .await
        .expect("/status of an unfenced widget");
}

// --- claim identity: update, delete, holderIdentity, non-pod credentials ---------------------

/// A claim bound to pod `pod`, shown as held by `identity`.
fn pod_claim(name: &str, lease: &str, identity: &str, pod: &str) -> LeaseClaim {
    serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": name},
        "spec": {"leaseName": lease, "holderIdentity": identity, "pod": {"name": pod}}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pod_may_only_renew_or_release_its_own_claims_and_shows_its_own_name() {
    let ns = setup("helm-own-claims").await;
    let release = Release::install(&ns, &[&ns.name], &[]);
    let pods = create_sa_and_pod(&ns, "worker", &["worker-a", "worker-b"]).await;
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, "worker").await;
    let as_a =
        support::client_with_token(&service_account_token(&ns, "worker", Some(&pods[0])).await)
            .await;
    let as_b =
        support::client_with_token(&service_account_token(&ns, "worker", Some(&pods[1])).await)
            .await;
    let a_claims: Api<LeaseClaim> = Api::namespaced(as_a, &ns.name);
    let b_claims: Api<LeaseClaim> = Api::namespaced(as_b, &ns.name);
    let pp = PostParams::default();
    b_claims
        .create(&pp, &pod_claim("jobs-b", "jobs", "worker-b", "worker-b"))
        .await
        .expect("pod worker-b claims for itself");
    let (a_ref, b_ref, pp_ref) = (&a_claims, &b_claims, &pp);

    // Pod A deleting B's claim (and so taking B's lease) is refused.
    let e = until_rejected(
        "pod worker-a deleting the claim of worker-b",
        "a pod may only claim for itself",
        move || async move { a_ref.delete("jobs-b", &DeleteParams::default()).await },
        move || async move {
            let _ = b_ref
                .create(pp_ref, &pod_claim("jobs-b", "jobs", "worker-b", "worker-b"))
                .await;
        },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("delete refused")
            && e.message.contains("spec.pod.name is worker-b")
            && e.message.contains("the request comes from pod worker-a"),
        "{e:?}"
    );
    // ... and renewing it.
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    let e = api_error(
        a_claims
            .patch("jobs-b", &PatchParams::default(), &renew)
            .await,
    );
    assert!(e.message.contains("update refused"), "{e:?}");

    // A pod's claim shows the pod: holderIdentity must be its name.
    let e = api_error(
        a_claims
            .create(&pp, &pod_claim("jobs-a", "jobs", "worker-b", "worker-a"))
            .await,
    );
    assert!(
        e.message.contains("spec.holderIdentity is worker-b")
            && e.message.contains("it must be worker-a"),
        "{e:?}"
    );
    a_claims
        .create(&pp, &pod_claim("jobs-a", "jobs", "worker-a", "worker-a"))
        .await
        .expect("pod worker-a claims for itself, as worker-a");
    a_claims
        .patch("jobs-a", &PatchParams::default(), &renew)
        .await
        .expect("pod worker-a renews its own claim");
    a_claims
        .delete("jobs-a", &DeleteParams::default())
        .await
        .expect("pod worker-a releases its own claim");
    // A claim bound to no pod (made by a user) is not a pod's to delete either.
    ns.api::<LeaseClaim>()
        .create(&pp, &claim("by-user", "jobs", None))
        .await
        .unwrap();
    let e = api_error(a_claims.delete("by-user", &DeleteParams::default()).await);
    assert!(e.message.contains("spec.pod.name must be set"), "{e:?}");
    b_claims
        .delete("jobs-b", &DeleteParams::default())
        .await
        .expect("pod worker-b releases its own claim");
}

#[tokio::test]
async fn non_pod_credentials_can_be_kept_from_claims() {
    let ns = setup("helm-no-pod-creds").await;
    let release = Release::install(
        &ns,
        &[&ns.name],
        &[
            "--set",
            "policies.claimIdentity.allowNonPodCredentials=false",
        ],
    );
    let pods = create_sa_and_pod(&ns, "worker", &["worker-a"]).await;
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, "worker").await;
    let as_pod =
        support::client_with_token(&service_account_token(&ns, "worker", Some(&pods[0])).await)
            .await;
    let unbound =
        support::client_with_token(&service_account_token(&ns, "worker", None).await).await;
    let pod_claims: Api<LeaseClaim> = Api::namespaced(as_pod, &ns.name);
    let unbound_claims: Api<LeaseClaim> = Api::namespaced(unbound, &ns.name);
    let pp = PostParams::default();
    let (u_ref, pp_ref) = (&unbound_claims, &pp);
    let admin_claims = ns.api::<LeaseClaim>();
    let admin_ref = &admin_claims;

    let e = until_rejected(
        "a token not bound to a pod creating a claim",
        "only pods may create LeaseClaims here",
        move || async move {
            u_ref
                .create(pp_ref, &pod_claim("by-ci", "jobs", "worker-a", "worker-a"))
                .await
        },
        move || async move {
            let _ = admin_ref.delete("by-ci", &DeleteParams::default()).await;
        },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("allowNonPodCredentials is false")
            && e.message
                .contains(&format!("system:serviceaccount:{}:worker", ns.name)),
        "{e:?}"
    );
    pod_claims
        .create(&pp, &pod_claim("jobs-a", "jobs", "worker-a", "worker-a"))
        .await
        .expect("the pod claims for itself");
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    let e = api_error(
        unbound_claims
            .patch("jobs-a", &PatchParams::default(), &renew)
            .await,
    );
    assert!(e.message.contains("only pods may update"), "{e:?}");
    let e = api_error(
        unbound_claims
            .delete("jobs-a", &DeleteParams::default())
            .await,
    );
    assert!(e.message.contains("only pods may delete"), "{e:?}");
    // Cluster administrators (system:masters) remain able to clean up.
    admin_claims
        .delete("jobs-a", &DeleteParams::default())
        .await
        .expect("system:masters may delete any claim");
}
