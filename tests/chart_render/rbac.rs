//! The least-privilege RBAC, as rendered: the controller's, a workload's, and
//! `helm test`'s own.

use std::collections::BTreeSet;

use serde_json::json;
use support::helm::render;

use crate::{CLIENT_RULES, find, rule_set, rules};

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
