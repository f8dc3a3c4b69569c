//! The controller Deployment and what surrounds it, as rendered: its container and
//! flags, the metrics Service, the PodDisruptionBudget, the ServiceMonitor and the
//! NetworkPolicy.

use serde_json::{Value, json};
use support::helm::{chart_dir, render};

use crate::{find, kinds};

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
    assert_controller_container(c, app_version);
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

    assert_metrics_objects(&objects, deploy);

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

/// The controller container: its image by tag, flags, downward-API env, admin port and
/// probes, and a restricted security context.
fn assert_controller_container(c: &Value, app_version: &str) {
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
}

/// The metrics Service, the PodDisruptionBudget and the ServiceMonitor (off by default).
fn assert_metrics_objects(objects: &[Value], deploy: &Value) {
    let svc = find(objects, "Service", "palisade-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8080);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "admin");
    assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    let pdb = find(objects, "PodDisruptionBudget", "palisade");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert!(
        !kinds(objects).contains("ServiceMonitor"),
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
