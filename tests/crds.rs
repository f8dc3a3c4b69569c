//! The CRDs: the checked-in YAML is generated from the Rust types and must not drift,
//! and the API server enforces their rules.

use kube::api::{Patch, PatchParams};
use palisade::crd::{LeaseClaim, crds_yaml};
use serde_json::json;
use support::TestNamespace;
use support::claims::create_claim;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/palisade.dev.yaml");
    let on_disk = std::fs::read_to_string(path).expect("crds/palisade.dev.yaml exists");
    assert!(
        on_disk == crds_yaml(),
        "crds/palisade.dev.yaml is out of date with src/crd.rs: run `make crds`"
    );
}

#[test]
fn the_crd_reference_page_matches_the_crds() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/crd-reference.md");
    let on_disk = std::fs::read_to_string(path).expect("docs/crd-reference.md exists");
    assert!(
        on_disk == support::crd_reference::markdown(),
        "docs/crd-reference.md is out of date with src/crd.rs: run `make crds`"
    );
}

/// A claim's status never moves back, whoever writes it (an ex-leader's pass in flight,
/// two controllers without an election): the API server refuses a status that leaves a
/// final phase, goes from Granted to Pending, or changes the token, and names the rule.
#[tokio::test]
async fn a_claim_status_that_moves_back_is_refused_by_the_api_server() {
    support::install_crds().await;
    let ns = TestNamespace::new("crd-claim-status").await;
    let claims = ns.api::<LeaseClaim>();
    let set = |name: &'static str, status: serde_json::Value| {
        let claims = claims.clone();
        async move {
            claims
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
        }
    };
    let refused = |result: Result<LeaseClaim, kube::Error>, rule: &str| match result {
        Err(kube::Error::Api(e)) if e.code == 422 => {
            assert!(
                e.message.contains(rule),
                "refused, but not for {rule:?}: {}",
                e.message
            )
        }
        Err(e) => panic!("expected 422 naming {rule:?}, got {e}"),
        Ok(c) => panic!(
            "accepted {:?}; expected a refusal naming {rule:?}",
            c.status
        ),
    };
    for (name, end) in [
        ("expired", "Expired"),
        ("revoked", "Revoked"),
        ("released", "Released"),
    ] {
        create_claim(&ns, name, "db", None).await;
        set(name, json!({"phase": "Granted", "fencingToken": 7}))
            .await
            .unwrap();
        set(name, json!({"phase": end})).await.unwrap();
        for back in ["Granted", "Pending"] {
            refused(
                set(name, json!({"phase": back})).await,
                "cannot leave a final phase",
            );
        }
    }
    create_claim(&ns, "granted", "db", None).await;
    set("granted", json!({"phase": "Granted", "fencingToken": 7}))
        .await
        .unwrap();
    refused(
        set("granted", json!({"phase": "Pending"})).await,
        "cannot go from Granted back to Pending",
    );
    refused(
        set("granted", json!({"fencingToken": 8})).await,
        "fencingToken is set once",
    );
    // What the controller does stays allowed: Pending to Granted, Granted to an end.
    set("granted", json!({"phase": "Expired"})).await.unwrap();
}
