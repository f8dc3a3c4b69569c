//! Bad input that reaches the API server: the tables of invalid manifests that the
//! real API server must reject, naming the field (the parsers' property tests are in
//! tests/input_properties.rs).

use kube::api::{Patch, PatchParams};
use palisade::crd::{Lease, LeaseClaim};
use serde_json::{Value, json};
use support::claims::create_claim;
use support::setup;

/// The basic table of invalid manifests: each is refused by the real API server with
/// the field named, and nothing is created; immutable fields of a claim stay as they are.
#[tokio::test]
async fn invalid_specs_are_rejected_with_the_field_named() {
    let ns = setup("invalid").await;
    let leases = ns.api::<Lease>();
    let claims = ns.api::<LeaseClaim>();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "zero duration",
            json!({"kind": "Lease", "metadata": {"name": "l1"}, "spec": {"leaseDurationSeconds": 0}}),
            "spec.leaseDurationSeconds",
        ),
        (
            "negative duration",
            json!({"kind": "Lease", "metadata": {"name": "l2"}, "spec": {"leaseDurationSeconds": -5}}),
            "spec.leaseDurationSeconds",
        ),
        (
            "huge duration",
            json!({"kind": "Lease", "metadata": {"name": "l3"}, "spec": {"leaseDurationSeconds": 86401}}),
            "spec.leaseDurationSeconds",
        ),
        (
            "string duration",
            json!({"kind": "Lease", "metadata": {"name": "l4"}, "spec": {"leaseDurationSeconds": "15s"}}),
            "spec.leaseDurationSeconds",
        ),
        (
            "unknown field",
            json!({"kind": "Lease", "metadata": {"name": "l5"}, "spec": {"leaseDuration": 15}}),
            "leaseDuration",
        ),
        (
            "name not a DNS label",
            json!({"kind": "Lease", "metadata": {"name": "a.b"}, "spec": {}}),
            "metadata.name",
        ),
        (
            "missing leaseName",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c1"}, "spec": {"holderIdentity": "x"}}),
            "spec.leaseName",
        ),
        (
            "missing holderIdentity",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c2"}, "spec": {"leaseName": "x"}}),
            "spec.holderIdentity",
        ),
        (
            "bad leaseName",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c3"}, "spec": {"leaseName": "Not_A_Name", "holderIdentity": "x"}}),
            "spec.leaseName",
        ),
        (
            "unknown claim field",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c4"}, "spec": {"leaseName": "x", "holderIdentity": "x", "ttl": 5}}),
            "ttl",
        ),
    ];
    for (case, body, field) in cases {
        let name = body["metadata"]["name"].as_str().unwrap().to_string();
        let message = support::apply_rejected(&ns, case, body).await;
        assert!(
            message.contains(field),
            "{case}: the error names {field}: {message}"
        );
        assert!(
            leases.get_opt(&name).await.unwrap().is_none()
                && claims.get_opt(&name).await.unwrap().is_none(),
            "{case}: nothing was created"
        );
    }

    // Immutable fields of an existing claim.
    create_claim(&ns, "fixed", "some-lease", None).await;
    for (field, patch) in [
        ("spec.leaseName", json!({"spec": {"leaseName": "other"}})),
        (
            "spec.holderIdentity",
            json!({"spec": {"holderIdentity": "someone-else"}}),
        ),
        ("spec.pod", json!({"spec": {"pod": {"name": "p"}}})),
    ] {
        let err = claims
            .patch("fixed", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err(field);
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    let unchanged = claims.get("fixed").await.unwrap();
    assert_eq!(unchanged.spec.lease_name, "some-lease");
    assert_eq!(unchanged.spec.holder_identity, "fixed");
    assert!(unchanged.spec.pod.is_none());
}

/// Invalid manifests beyond the basic table above: each is refused by the real API server
/// (CRD schema, CEL rules, strict field validation), and the error names the field.
#[tokio::test]
async fn invalid_manifests_are_rejected_by_the_api_server_naming_the_field() {
    let ns = setup("bad-input").await;
    let leases = ns.api::<Lease>();
    let claims = ns.api::<LeaseClaim>();
    let long = "a".repeat(64);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "lease name longer than a DNS label",
            json!({"kind": "Lease", "metadata": {"name": long}, "spec": {}}),
            "metadata.name",
        ),
        (
            "fractional duration",
            json!({"kind": "Lease", "metadata": {"name": "f1"}, "spec": {"leaseDurationSeconds": 1.5}}),
            "spec.leaseDurationSeconds",
        ),
        (
            "status field in spec",
            json!({"kind": "Lease", "metadata": {"name": "f2"}, "spec": {"fencingToken": 9}}),
            "fencingToken",
        ),
        (
            "claim without spec",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c1"}}),
            "spec",
        ),
        (
            "empty holderIdentity",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c2"}, "spec": {"leaseName": "x", "holderIdentity": ""}}),
            "spec.holderIdentity",
        ),
        (
            "holderIdentity longer than 253",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c3"}, "spec": {"leaseName": "x", "holderIdentity": "h".repeat(254)}}),
            "spec.holderIdentity",
        ),
        (
            "leaseName longer than 63",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c4"}, "spec": {"leaseName": long, "holderIdentity": "x"}}),
            "spec.leaseName",
        ),
        (
            "pod without a name",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c5"}, "spec": {"leaseName": "x", "holderIdentity": "x", "pod": {"uid": "u"}}}),
            "spec.pod.name",
        ),
        (
            "pod with an empty name",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c6"}, "spec": {"leaseName": "x", "holderIdentity": "x", "pod": {"name": ""}}}),
            "spec.pod.name",
        ),
        (
            "unknown pod field",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c7"}, "spec": {"leaseName": "x", "holderIdentity": "x", "pod": {"name": "p", "namespace": "n"}}}),
            "namespace",
        ),
        (
            "renewTime not a timestamp",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c8"}, "spec": {"leaseName": "x", "holderIdentity": "x", "renewTime": "yesterday"}}),
            "spec.renewTime",
        ),
        (
            "renewTime a number",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c9"}, "spec": {"leaseName": "x", "holderIdentity": "x", "renewTime": 5}}),
            "spec.renewTime",
        ),
        (
            "leaseName a number",
            json!({"kind": "LeaseClaim", "metadata": {"name": "c10"}, "spec": {"leaseName": 7, "holderIdentity": "x"}}),
            "spec.leaseName",
        ),
    ];
    for (case, body, field) in cases {
        let err = support::apply_rejected(&ns, case, body).await;
        assert!(
            err.contains(field),
            "{case}: the error names {field}: {err}"
        );
    }
    // Nothing was half-written: no object of any case exists.
    assert!(
        leases
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        claims
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
