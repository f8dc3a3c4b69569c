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
