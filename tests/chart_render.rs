//! The Helm chart (charts/palisade) on its own, no cluster: the CRD copy, `helm lint`,
//! the values schema, and what `helm template` renders (the controller Deployment, the
//! least-privilege RBAC, the admission policies and their bindings).

use std::collections::BTreeSet;

use serde_json::{Value, json};
use support::helm::{chart_dir, helm_command, helm_ok, parse_objects, render};
use support::tools::{run, text};

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

/// What a workload may do: the `<fullname>-client` ClusterRole's rules.
const CLIENT_RULES: &[Rule] = &[
    (
        "palisade.dev",
        "leases",
        &["create", "get", "list", "watch"],
        "",
    ),
    (
        "palisade.dev",
        "leaseclaims",
        &["create", "get", "list", "watch", "patch", "delete"],
        "",
    ),
];

/// (apiGroup, resource, verbs, resourceName).
type Rule = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

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

#[test]
fn chart_crds_are_a_byte_identical_copy_of_the_generated_crds() {
    let generated = support::repo_root().join("crds/palisade.dev.yaml");
    let copy = chart_dir().join("files/crds.yaml");
    let a = std::fs::read(&generated).expect("crds/palisade.dev.yaml");
    let b = std::fs::read(&copy).expect("charts/palisade/files/crds.yaml");
    assert!(
        a == b,
        "{} differs from {}: run `make crds`",
        copy.display(),
        generated.display()
    );
    // Helm installs a chart's crds/ directory once and never upgrades it.
    assert!(
        !chart_dir().join("crds").exists(),
        "charts/palisade/crds/ must not exist: the CRDs are templates (templates/crds.yaml)"
    );
}

/// The rendered CRDs are the generated ones, with the release's labels and, with
/// crds.keep (the default), the annotation that keeps them on `helm uninstall`.
#[test]
fn crds_render_from_the_generated_yaml_and_follow_crds_enabled_and_keep() {
    let generated = parse_objects(
        &std::fs::read_to_string(support::repo_root().join("crds/palisade.dev.yaml")).unwrap(),
    );
    let crds = |extra: &[&str]| -> Vec<Value> {
        render("rel", "ns", extra)
            .into_iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .collect()
    };
    let rendered = crds(&[]);
    assert_eq!(
        rendered.len(),
        generated.len(),
        "one rendered CRD per generated one"
    );
    for want in &generated {
        let name = want["metadata"]["name"].as_str().unwrap();
        let got = find(&rendered, "CustomResourceDefinition", name);
        let meta = &got["metadata"];
        assert_eq!(
            meta["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}"
        );
        assert_eq!(
            meta["labels"]["app.kubernetes.io/managed-by"], "Helm",
            "{name}"
        );
        assert_eq!(
            meta["labels"]["app.kubernetes.io/part-of"], "palisade",
            "{name}"
        );
        // Numbers compare as numbers (the generator writes 1.0, Helm's toYaml 1).
        let mut got = got.clone();
        got["metadata"] = json!({"name": name});
        assert!(
            same_numbers(&got, want),
            "the rendered {name} is not the generated one:\n{}",
            serde_json::to_string_pretty(&got).unwrap()
        );
    }
    for crd in crds(&["--set", "crds.keep=false"]) {
        assert!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
            "crds.keep=false still keeps {}",
            crd["metadata"]["name"]
        );
    }
    assert!(crds(&["--set", "crds.enabled=false"]).is_empty());
}

/// JSON equality where 1 and 1.0 are the same number.
fn same_numbers(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_numbers(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_numbers(v, w)))
        }
        _ => a == b,
    }
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
            "--set",
            "apiPriority.electionPriorityLevel=",
        ][..],
        &["--set", "apiPriority.enabled=false"][..],
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
        (
            &["--set", "networkPolicy.enabled=true"],
            &["networkPolicy.apiServer.cidrs is empty"],
        ),
        (
            &["--set-json", "networkPolicy.apiServer.cidrs=[\"10.0.0.1\"]"],
            &["cidrs"],
        ),
        (&["--set", "crds.keep=yes"], &["keep"]),
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
        // Election timings: the schema checks the syntax ...
        (
            &["--set", "controller.leaderElection.leaseDuration=1.5s"],
            &["leaseDuration"],
        ),
        (
            &["--set", "controller.leaderElection.leaseDuration=1500ms"],
            &["leaseDuration"],
        ),
        (
            &["--set", "controller.leaderElection.renewDeadline=750us"],
            &["renewDeadline"],
        ),
        (
            &["--set", "controller.leaderElection.retryPeriod=250"],
            &["retryPeriod"],
        ),
        (
            &["--set", "controller.leaderElection.retryPeriod=0.25s"],
            &["retryPeriod"],
        ),
        // ... and the templates the order and the range (and the syntax again, for
        // installs that skip the schema).
        (
            &["--set", "controller.leaderElection.renewDeadline=1s"],
            &[
                "controller.leaderElection.renewDeadline (1s) must be shorter than \
                 controller.leaderElection.leaseDuration (1s)",
            ],
        ),
        (
            &[
                "--set",
                "controller.leaderElection.leaseDuration=2s",
                "--set",
                "controller.leaderElection.renewDeadline=2500ms",
            ],
            &[
                "controller.leaderElection.renewDeadline (2500ms) must be shorter than \
                 controller.leaderElection.leaseDuration (2s)",
            ],
        ),
        (
            &["--set", "controller.leaderElection.retryPeriod=1s"],
            &[
                "controller.leaderElection.retryPeriod (1s) must be greater than zero and \
                 shorter than controller.leaderElection.renewDeadline (750ms)",
            ],
        ),
        (
            &["--set", "controller.leaderElection.retryPeriod=0ms"],
            &["controller.leaderElection.retryPeriod (0ms) must be greater than zero"],
        ),
        (
            &["--set", "controller.leaderElection.leaseDuration=25h"],
            &[
                "controller.leaderElection.leaseDuration",
                "whole seconds from 1s to 24h",
            ],
        ),
        (
            &[
                "--skip-schema-validation",
                "--set",
                "controller.leaderElection.renewDeadline=1.5s",
            ],
            &[
                "controller.leaderElection.renewDeadline",
                "\"1.5s\" is not a duration",
            ],
        ),
        (
            &[
                "--skip-schema-validation",
                "--set",
                "controller.leaderElection.leaseDuration=1500ms",
            ],
            &["controller.leaderElection.leaseDuration", "whole seconds"],
        ),
        (
            &["--set", "apiPriority.matchingPrecedence=0"],
            &["matchingPrecedence"],
        ),
        (
            &["--set", "apiPriority.priorityLevel.lendablePercent=101"],
            &["lendablePercent"],
        ),
        (
            &["--set", "apiPriority.electionPriorityLevel=Leader_Election"],
            &["electionPriorityLevel"],
        ),
        (
            &["--set", "apiPriority.priorityLevel.handSize=17"],
            &[
                "apiPriority.priorityLevel.handSize (17) must not exceed apiPriority.priorityLevel.queues (16)",
            ],
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
        // The binary's defaults, passed explicitly.
        "--leader-elect-lease-duration=1s",
        "--leader-elect-renew-deadline=750ms",
        "--leader-elect-retry-period=250ms",
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
    assert_eq!(rule_set(client), rules(CLIENT_RULES));
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
        // helm test's own (helm_test_pod_runs_palisade_check_with_its_own_least_privilege_role).
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] != "test")
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
    assert!(
        !single
            .iter()
            .any(|o| o["kind"] == "Role" && o["metadata"]["name"] == "palisade-election")
    );
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

/// The controller container's args.
fn controller_args(objects: &[Value]) -> Vec<String> {
    let deploy = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn election_timings_are_passed_as_flags() {
    let timed = render(
        "palisade",
        "ops",
        &[
            "--set",
            "controller.leaderElection.leaseDuration=15s",
            "--set",
            "controller.leaderElection.renewDeadline=10s",
            "--set",
            "controller.leaderElection.retryPeriod=2s",
        ],
    );
    let args = controller_args(&timed);
    for expected in [
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=2s",
    ] {
        assert!(
            args.iter().any(|a| a == expected),
            "args {args:?} lack {expected}"
        );
    }
    // Units are compared, not strings: 2000ms > 1s > 999ms.
    let mixed = render(
        "palisade",
        "ops",
        &[
            "--set",
            "controller.leaderElection.leaseDuration=2000ms",
            "--set",
            "controller.leaderElection.renewDeadline=1s",
            "--set",
            "controller.leaderElection.retryPeriod=999ms",
        ],
    );
    assert!(
        controller_args(&mixed)
            .iter()
            .any(|a| a == "--leader-elect-lease-duration=2000ms")
    );
    // Without an election there are no timings to pass.
    let single = render(
        "palisade",
        "ops",
        &["--set", "controller.leaderElection.enabled=false"],
    );
    let args = controller_args(&single);
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--leader-elect-") && a.as_str() != "--leader-elect=false"),
        "{args:?}"
    );
}

/// The (apiGroup, resource) pairs a FlowSchema's resource rules match in `namespace`
/// (a rule with namespaces ["*"] matches every namespace).
fn flow_schema_matches(fs: &Value, namespace: &str) -> BTreeSet<(String, String)> {
    let mut set = BTreeSet::new();
    for rule in fs["spec"]["rules"].as_array().unwrap() {
        for r in rule["resourceRules"].as_array().unwrap() {
            let namespaces = r["namespaces"].as_array().unwrap();
            if !namespaces.contains(&json!("*")) && !namespaces.contains(&json!(namespace)) {
                continue;
            }
            assert_eq!(r["verbs"], json!(["*"]), "every verb: {r}");
            for g in r["apiGroups"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    set.insert((
                        g.as_str().unwrap().to_string(),
                        res.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    set
}

#[test]
fn rendered_api_priority_objects_match_only_the_controller_service_account() {
    let objects = render("palisade", "ops", &[]);
    let sa = json!([{"kind": "ServiceAccount", "serviceAccount": {"name": "palisade", "namespace": "ops"}}]);

    let level = find(&objects, "PriorityLevelConfiguration", "palisade");
    assert_eq!(level["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    assert_eq!(
        level["spec"],
        json!({"type": "Limited", "limited": {
            "nominalConcurrencyShares": 20, "lendablePercent": 50,
            "limitResponse": {"type": "Queue",
                "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 50}}}})
    );

    let fs = find(&objects, "FlowSchema", "palisade");
    assert_eq!(fs["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    assert_eq!(fs["spec"]["priorityLevelConfiguration"]["name"], "palisade");
    assert_eq!(fs["spec"]["matchingPrecedence"], 501);
    assert_eq!(fs["spec"]["distinguisherMethod"]["type"], "ByNamespace");
    let rules = fs["spec"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["subjects"], sa,
        "the controller's ServiceAccount only"
    );
    assert!(rules[0]["nonResourceRules"].is_null());
    // Every resource the controller's ClusterRole grants is classified here (a new grant
    // without a rule would fall back to the cluster's default priority), and the election
    // Lease too, as a fallback for the election FlowSchema.
    let granted: BTreeSet<(String, String)> =
        rule_set(find(&objects, "ClusterRole", "palisade-controller"))
            .into_iter()
            .map(|(g, r, _, _)| (g, r))
            .collect();
    let matched = flow_schema_matches(fs, "some-tenant");
    assert!(
        granted.is_subset(&matched),
        "granted {granted:?}, classified {matched:?}"
    );
    let in_release_ns = flow_schema_matches(fs, "ops");
    assert!(in_release_ns.contains(&("coordination.k8s.io".into(), "leases".into())));
    assert!(
        !matched.contains(&("coordination.k8s.io".into(), "leases".into())),
        "coordination Leases only in the release namespace"
    );
    // Lists and watches across namespaces are cluster-scope requests.
    let palisade_rule = rules[0]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["apiGroups"] == json!(["palisade.dev"]))
        .unwrap();
    assert_eq!(palisade_rule["clusterScope"], true);

    let election = find(&objects, "FlowSchema", "palisade-election");
    assert_eq!(
        election["spec"]["priorityLevelConfiguration"]["name"],
        "leader-election"
    );
    assert_eq!(election["spec"]["matchingPrecedence"], 500);
    assert_eq!(
        election["spec"]["rules"],
        json!([{"subjects": sa, "resourceRules": [{
            "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "create", "update"], "namespaces": ["ops"]}]}])
    );

    // Values: precedence, shares, a ServiceAccount of the user's, another release.
    let tuned = render(
        "other",
        "tenant-a",
        &[
            "--set",
            "apiPriority.matchingPrecedence=1000",
            "--set",
            "apiPriority.priorityLevel.nominalConcurrencyShares=7",
            "--set",
            "apiPriority.priorityLevel.lendablePercent=0",
            "--set",
            "apiPriority.priorityLevel.queues=64",
            "--set",
            "apiPriority.priorityLevel.handSize=8",
            "--set",
            "apiPriority.priorityLevel.queueLengthLimit=100",
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=lease-controller",
        ],
    );
    let level = find(&tuned, "PriorityLevelConfiguration", "other-palisade");
    assert_eq!(level["spec"]["limited"]["nominalConcurrencyShares"], 7);
    assert_eq!(level["spec"]["limited"]["lendablePercent"], 0);
    assert_eq!(
        level["spec"]["limited"]["limitResponse"]["queuing"],
        json!({"queues": 64, "handSize": 8, "queueLengthLimit": 100})
    );
    let fs = find(&tuned, "FlowSchema", "other-palisade");
    assert_eq!(fs["spec"]["matchingPrecedence"], 1001);
    assert_eq!(
        fs["spec"]["priorityLevelConfiguration"]["name"],
        "other-palisade"
    );
    let sa = json!([{"kind": "ServiceAccount",
        "serviceAccount": {"name": "lease-controller", "namespace": "tenant-a"}}]);
    assert_eq!(fs["spec"]["rules"][0]["subjects"], sa);
    let election = find(&tuned, "FlowSchema", "other-palisade-election");
    assert_eq!(election["spec"]["matchingPrecedence"], 1000);
    assert_eq!(election["spec"]["rules"][0]["subjects"], sa);
    assert_eq!(
        election["spec"]["rules"][0]["resourceRules"][0]["namespaces"],
        json!(["tenant-a"])
    );
    // Two releases never share a cluster-scoped name.
    let names = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .filter(|o| o["kind"] == "FlowSchema" || o["kind"] == "PriorityLevelConfiguration")
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(names(&objects).len(), 3);
    assert!(names(&objects).is_disjoint(&names(&tuned)));

    // The election's own level, or none at all.
    for extra in [
        &["--set", "apiPriority.electionPriorityLevel="][..],
        &["--set", "controller.leaderElection.enabled=false"][..],
    ] {
        let objects = render("palisade", "ops", extra);
        find(&objects, "FlowSchema", "palisade");
        assert_eq!(
            names(&objects),
            BTreeSet::from([
                "FlowSchema/palisade".to_string(),
                "PriorityLevelConfiguration/palisade".to_string()
            ]),
            "{extra:?}"
        );
    }
    let other_level = render(
        "palisade",
        "ops",
        &["--set", "apiPriority.electionPriorityLevel=workload-high"],
    );
    assert_eq!(
        find(&other_level, "FlowSchema", "palisade-election")["spec"]["priorityLevelConfiguration"]
            ["name"],
        "workload-high"
    );
    let off = render("palisade", "ops", &["--set", "apiPriority.enabled=false"]);
    assert!(names(&off).is_empty(), "{:?}", names(&off));
}

/// The NetworkPolicy (off by default) lets the controller pods reach only the API
/// server's endpoints, and only the configured peers reach the admin port.
#[test]
fn network_policy_allows_the_api_server_and_the_metrics_scrapers_only() {
    let off = render("rel", "ns", &[]);
    assert!(!kinds(&off).contains("NetworkPolicy"), "off by default");
    let objects = render(
        "rel",
        "ns",
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.apiServer.cidrs=["10.0.0.10/32","10.0.0.11/32"]"#,
            "--set-json",
            "networkPolicy.apiServer.ports=[6443]",
            "--set",
            "controller.adminPort=9090",
        ],
    );
    let policy = &find(&objects, "NetworkPolicy", "rel-palisade")["spec"];
    let deployment = find(&objects, "Deployment", "rel-palisade");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in policy["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[k], v,
            "the policy selects the controller pods ({k})"
        );
    }
    assert_eq!(policy["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        policy["egress"],
        json!([{
            "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "10.0.0.11/32"}}],
            "ports": [{"protocol": "TCP", "port": 6443}],
        }]),
        "egress: the API server only (no DNS: the in-cluster client uses the Service's address)"
    );
    assert_eq!(
        policy["ingress"],
        json!([{
            "ports": [{"protocol": "TCP", "port": 9090}],
            "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        }])
    );
}

/// `helm test` runs `palisade check` in a restricted pod, with a Role that allows only
/// what the check does, kept until the next `helm test` (for `--logs`).
#[test]
fn helm_test_pod_runs_palisade_check_with_its_own_least_privilege_role() {
    let objects = render("rel", "ns", &[]);
    let name = "rel-palisade-test";
    let pod = find(&objects, "Pod", name);
    for object in [
        pod,
        find(&objects, "ServiceAccount", name),
        find(&objects, "Role", name),
        find(&objects, "RoleBinding", name),
    ] {
        let annotations = &object["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/hook"], "test", "{}", object["kind"]);
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"], "before-hook-creation",
            "kept for helm test --logs, replaced by the next helm test"
        );
    }
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        json!(["check", "--lease", "rel-palisade-check"])
    );
    let controller = &find(&objects, "Deployment", "rel-palisade")["spec"]["template"]["spec"];
    assert_eq!(container["image"], controller["containers"][0]["image"]);
    assert_eq!(
        container["securityContext"],
        controller["containers"][0]["securityContext"]
    );
    assert_eq!(
        pod["spec"]["securityContext"],
        controller["securityContext"]
    );
    let env: BTreeSet<_> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        env,
        ["POD_NAME", "POD_NAMESPACE", "POD_UID"]
            .map(String::from)
            .into(),
        "the claim is bound to the test pod"
    );
    assert_eq!(pod["spec"]["serviceAccountName"], name);
    assert_eq!(pod["metadata"]["namespace"], "ns");
    // In the one namespace the controller watches, or where tests.namespace says.
    for (extra, namespace) in [
        (&["--set", "controller.watchNamespace=apps"][..], "apps"),
        (
            &[
                "--set",
                "controller.watchNamespace=apps",
                "--set",
                "tests.namespace=team",
            ],
            "team",
        ),
    ] {
        let objects = render("rel", "ns", extra);
        for kind in ["Pod", "ServiceAccount", "Role", "RoleBinding"] {
            assert_eq!(
                find(&objects, kind, name)["metadata"]["namespace"],
                namespace,
                "{kind}"
            );
        }
        let binding = find(&objects, "RoleBinding", name);
        assert_eq!(binding["subjects"][0]["namespace"], namespace);
    }
    assert_eq!(
        rule_set(find(&objects, "Role", name)),
        // A workload's rules, and the fenced ConfigMap the check writes and deletes.
        rules(
            &[
                CLIENT_RULES,
                &[("", "configmaps", &["create", "get", "patch", "delete"], "")],
            ]
            .concat()
        )
    );
}

/// Every change to the chart comes with a new chart version: a version that is released
/// (charts/released/) is exactly the released chart, any other is above the newest
/// released one, and CHANGELOG.md has an entry for it; the app version is the crate's.
#[test]
fn chart_changes_come_with_a_version_bump_and_a_changelog_entry() {
    let chart = support::helm::chart_field("version");
    let app = support::helm::chart_field("appVersion");
    assert_eq!(
        app,
        env!("CARGO_PKG_VERSION"),
        "appVersion is the crate's version"
    );
    let released = support::helm::released_charts();
    let (newest, _) = released
        .first()
        .expect("charts/released/ holds at least one released chart");
    match released.iter().find(|(version, _)| *version == chart) {
        Some((_, package)) => {
            let scratch = tempfile::tempdir().unwrap();
            let dir = |name: &str| {
                let dir = scratch.path().join(name);
                std::fs::create_dir(&dir).unwrap();
                dir
            };
            let was = support::helm::packaged_files(package, &dir("released"));
            let current = support::helm::package_chart(&dir("package"));
            let now = support::helm::packaged_files(&current, &dir("current"));
            let paths: BTreeSet<_> = was.keys().chain(now.keys()).collect();
            let changed: Vec<String> = paths
                .into_iter()
                .filter(|path| was.get(*path) != now.get(*path))
                .map(|path| path.display().to_string())
                .collect();
            assert!(
                changed.is_empty(),
                "charts/palisade differs from the released chart {chart} \
                 (charts/released/palisade-{chart}.tgz) in {}: bump Chart.yaml's version \
                 (SemVer: minor for new values or objects, patch for fixes) and add its \
                 CHANGELOG.md entry",
                changed.join(", ")
            );
        }
        None => assert!(
            support::helm::chart_version(&chart) > support::helm::chart_version(newest),
            "Chart.yaml's version {chart} is not released and not above the newest released \
             chart, {newest} (charts/released/)"
        ),
    }
    let changelog = std::fs::read_to_string(support::repo_root().join("CHANGELOG.md")).unwrap();
    assert!(
        changelog.lines().any(|l| l.starts_with("## [")
            && l.contains(&format!("[{app}]"))
            && l.contains(&format!("(chart {chart})"))),
        "CHANGELOG.md has no entry `## [{app}] - <date> (chart {chart})`"
    );
}
