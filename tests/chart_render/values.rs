//! `helm lint`, and values the chart refuses with a message naming the value.

use support::helm::{chart_dir, helm_command, helm_ok};
use support::tools::{run, text};

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

/// Bad values and what the error must name: (`helm template` arguments, needles).
type BadValue = (&'static [&'static str], &'static [&'static str]);

/// The general values: types, ranges, required companions.
const GENERAL: &[BadValue] = &[
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
        &["--set", "serviceAccount.create=false"],
        &["serviceAccount.name is required"],
    ),
];

/// The admission policies' values.
const POLICIES: &[BadValue] = &[
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
        &[
            "--set-json",
            "policies.operators=[{\"serviceAccount\":{\"namespace\":\"ops\",\"name\":\"op\"}}]",
        ],
        &["lease"],
    ),
    (
        &[
            "--set-json",
            "policies.operators=[{\"serviceAccount\":{\"name\":\"op\"},\"lease\":{\"name\":\"l\"}}]",
        ],
        &["namespace"],
    ),
    (
        &[
            "--set-json",
            "policies.operators=[{\"serviceAccount\":{\"namespace\":\"ops\",\"name\":\"op\"},\"lease\":{\"name\":\"Not A Lease\"}}]",
        ],
        &["name"],
    ),
    (
        &[
            "--set-json",
            "policies.operators=[{\"user\":\"system:serviceaccount:ops:op\",\"lease\":{\"name\":\"l\"}}]",
        ],
        &["user"],
    ),
    (
        &[
            "--set-json",
            "policies.operators=[{\"serviceAccount\":{\"namespace\":\"ops\",\"name\":\"op\"},\"lease\":{\"name\":\"l\"},\"failurePolicy\":\"Fail\"}]",
        ],
        &["policies.operators[0].failurePolicy Fail needs namespaces"],
    ),
    (
        &[
            "--set-json",
            "policies.operators=[{\"serviceAccount\":{\"namespace\":\"ops\",\"name\":\"op\"},\"lease\":{\"name\":\"l\"},\"failurePolicy\":\"Never\"}]",
        ],
        &["failurePolicy"],
    ),
];

/// Election timings: the schema checks the syntax ...
const ELECTION: &[BadValue] = &[
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
];

/// The API priority objects' values.
const API_PRIORITY: &[BadValue] = &[
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

#[test]
fn bad_values_fail_with_a_message_naming_the_value() {
    let chart = chart_dir();
    let cases = GENERAL
        .iter()
        .chain(POLICIES)
        .chain(ELECTION)
        .chain(API_PRIORITY);
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
