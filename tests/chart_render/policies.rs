//! The admission policies and their bindings, as rendered.

use serde_json::{Value, json};
use support::helm::render;

use crate::{find, kinds};

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

#[test]
fn rendered_operator_policies_judge_each_named_account_by_its_lease() {
    let none = render("palisade", "ops", &[]);
    assert!(
        !none.iter().any(|o| o["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .starts_with("palisade-operator-")),
        "no operator is fenced by default"
    );
    let objects = render(
        "palisade",
        "ops",
        &[
            "--set-json",
            r#"policies.operators=[{"serviceAccount":{"namespace":"shop","name":"orders"},"lease":{"name":"orders-leader"}},{"serviceAccount":{"namespace":"pay","name":"settle"},"lease":{"name":"settle","namespace":"locks"}}]"#,
        ],
    );
    let policy = find(
        &objects,
        "ValidatingAdmissionPolicy",
        "palisade-operator-shop-orders",
    );
    // Fail open by default: a failing policy would refuse every user's writes.
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        r#"request.userInfo.username == "system:serviceaccount:shop:orders""#
    );
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"],
                "operations": ["CREATE", "UPDATE", "DELETE", "CONNECT"]}])
    );
    // The Lease is named, in the account's namespace unless given; a missing Lease cannot
    // refuse (Deny would refuse every user's requests: params are looked up first).
    let param = |name: &str| {
        find(&objects, "ValidatingAdmissionPolicyBinding", name)["spec"]["paramRef"].clone()
    };
    assert_eq!(
        param("palisade-operator-shop-orders"),
        json!({"name": "orders-leader", "namespace": "shop", "parameterNotFoundAction": "Allow"})
    );
    assert_eq!(
        param("palisade-operator-pay-settle"),
        json!({"name": "settle", "namespace": "locks", "parameterNotFoundAction": "Allow"})
    );
    // The account may impersonate itself (only itself) with the token extra, and list
    // the API servers.
    let role = find(&objects, "Role", "palisade-operator-shop-orders");
    assert_eq!(role["metadata"]["namespace"], "shop");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"], "resourceNames": ["orders"]}])
    );
    assert_eq!(
        find(&objects, "ClusterRole", "palisade-operator-shop-orders")["rules"],
        json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/palisade.dev/fencing-token"], "verbs": ["impersonate"]}])
    );
    let apiservers = find(&objects, "Role", "palisade-operator-shop-orders-apiservers");
    assert_eq!(apiservers["metadata"]["namespace"], "default");
    for name in [
        "palisade-operator-shop-orders",
        "palisade-operator-shop-orders-apiservers",
    ] {
        let binding = find(&objects, "RoleBinding", name);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "orders", "namespace": "shop"}])
        );
    }
}

#[test]
fn an_operator_fenced_fail_closed_is_narrowed_to_its_namespaces() {
    let objects = render(
        "palisade",
        "ops",
        &[
            "--set-json",
            r#"policies.operators=[{"serviceAccount":{"namespace":"shop","name":"orders"},"lease":{"name":"orders"},"failurePolicy":"Fail","namespaces":["shop","shop-data"]}]"#,
        ],
    );
    let spec = &find(
        &objects,
        "ValidatingAdmissionPolicy",
        "palisade-operator-shop-orders",
    )["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(
        spec["matchConstraints"]["namespaceSelector"],
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["shop", "shop-data"]}]})
    );
    assert_eq!(
        spec["matchConstraints"]["resourceRules"][0]["scope"],
        "Namespaced"
    );
}
