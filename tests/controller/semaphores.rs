//! Semaphores (`spec.permits` above 1) on the real API server: slots granted at once
//! and handed over per slot, `permits` lowered and raised, and the schema refusing
//! bad permits and slots.

use kube::api::{Patch, PatchParams, PostParams};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim};
use serde_json::json;
use support::claims::{claim_for, create_claim, delete_claim, wait_claim_phase};
use support::{ControllerProcess, TestNamespace, api_error, setup, wait_lease};

async fn create_semaphore(ns: &TestNamespace, name: &str, permits: i32) -> Lease {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"leaseDurationSeconds": 15, "permits": permits}
    }))
    .unwrap();
    ns.api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await
        .expect("create Lease")
}

/// (slot, holder's claim, token) of every held slot.
fn held(lease: &Lease) -> Vec<(i32, String, i64)> {
    let rows = lease
        .status
        .as_ref()
        .map(|s| s.slot_rows())
        .unwrap_or_default();
    rows.into_iter()
        .filter_map(|r| Some((r.slot, r.holder?.claim, r.fencing_token?)))
        .collect()
}

fn slot_token(lease: &Lease, slot: i32) -> Option<i64> {
    let rows = lease
        .status
        .as_ref()
        .map(|s| s.slot_rows())
        .unwrap_or_default();
    rows.into_iter().find(|r| r.slot == slot)?.fencing_token
}

async fn set_permits(ns: &TestNamespace, name: &str, permits: i32) {
    ns.api::<Lease>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"permits": permits}})),
        )
        .await
        .expect("patch spec.permits");
}

#[tokio::test]
async fn three_permits_go_to_three_claims_in_their_own_slots_and_a_release_hands_one_on() {
    let ns = setup("semaphore").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_semaphore(&ns, "settle", 3).await;
    for name in ["w0", "w1", "w2", "w3"] {
        create_claim(&ns, name, "settle", None).await;
    }
    let lease = wait_lease(&ns, "settle", "3 of 3 held, 1 waiting", |l| {
        held(l).len() == 3 && l.status.as_ref().and_then(|s| s.waiting_count) == Some(1)
    })
    .await;
    let status = lease.status.clone().unwrap();
    assert_eq!(status.held.as_deref(), Some("3/3"));
    assert_eq!(status.waiting_count, Some(1));
    let slots: Vec<i32> = held(&lease).iter().map(|h| h.0).collect();
    assert_eq!(slots, vec![0, 1, 2]);
    let waiter = status.waiting[0].clone();
    // Each holder's claim mirrors its slot and token.
    for (slot, claim, token) in held(&lease) {
        let granted = wait_claim_phase(&ns, &claim, ClaimPhase::Granted).await;
        let mirror = granted.status.unwrap();
        assert_eq!(
            (mirror.slot, mirror.fencing_token),
            (Some(slot), Some(token))
        );
    }

    // The holder of slot 1 releases: the waiter gets slot 1, with a higher token.
    let (_, in_slot_1, before) = held(&lease)[1].clone();
    delete_claim(&ns, &in_slot_1).await;
    let lease = wait_lease(&ns, "settle", "the waiter in slot 1", |l| {
        held(l).iter().any(|h| h.0 == 1 && h.1 == waiter)
    })
    .await;
    let after = slot_token(&lease, 1).unwrap();
    assert!(after > before, "slot 1's token {after} after {before}");
    assert_eq!(held(&lease).len(), 3);
}

#[tokio::test]
async fn a_claim_for_one_slot_waits_for_it_while_later_claims_take_the_others() {
    let ns = setup("semaphore-slot").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_semaphore(&ns, "shards", 3).await;
    create_claim(&ns, "first", "shards", None).await;
    wait_lease(&ns, "shards", "slot 0 held", |l| held(l).len() == 1).await;
    let mut wants_zero = claim_for("wants-0", "shards", "wants-0", None);
    wants_zero.spec.slot = Some(0);
    ns.api::<LeaseClaim>()
        .create(&PostParams::default(), &wants_zero)
        .await
        .unwrap();
    create_claim(&ns, "later", "shards", None).await;
    let lease = wait_lease(&ns, "shards", "later in slot 1", |l| {
        held(l).iter().any(|h| h.1 == "later")
    })
    .await;
    assert_eq!(held(&lease)[1].0, 1);
    assert_eq!(lease.status.unwrap().waiting, vec!["wants-0"]);
    delete_claim(&ns, "first").await;
    wait_lease(&ns, "shards", "wants-0 in slot 0", |l| {
        held(l)
            .first()
            .is_some_and(|h| h.0 == 0 && h.1 == "wants-0")
    })
    .await;
}

#[tokio::test]
async fn lowering_permits_revokes_the_highest_slots_and_raising_them_grants_at_once() {
    let ns = setup("semaphore-permits").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_semaphore(&ns, "pool", 3).await;
    for name in ["p0", "p1", "p2", "p3"] {
        create_claim(&ns, name, "pool", None).await;
    }
    let lease = wait_lease(&ns, "pool", "3 of 3 held", |l| held(l).len() == 3).await;
    let holders = held(&lease);
    set_permits(&ns, "pool", 1).await;
    let lease = wait_lease(&ns, "pool", "1 of 1 held", |l| {
        l.status.as_ref().and_then(|s| s.held.as_deref()) == Some("1/1")
    })
    .await;
    assert_eq!(
        held(&lease),
        holders[..1].to_vec(),
        "slot 0 kept its holder"
    );
    for (_, claim, _) in &holders[1..] {
        wait_claim_phase(&ns, claim, ClaimPhase::Revoked).await;
    }
    set_permits(&ns, "pool", 2).await;
    let lease = wait_lease(&ns, "pool", "slot 1 granted again", |l| held(l).len() == 2).await;
    let (slot, claim, token) = held(&lease)[1].clone();
    assert_eq!((slot, claim.as_str()), (1, "p3"));
    assert!(
        token > holders[1].2,
        "slot 1's token {token} after {}",
        holders[1].2
    );
}

#[tokio::test]
async fn the_schema_refuses_bad_permits_and_slots_naming_the_field() {
    let ns = setup("semaphore-input").await;
    for permits in [json!(0), json!(65), json!(-1), json!("three"), json!(1.5)] {
        let lease = json!({
            "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
            "metadata": {"name": "bad"}, "spec": {"permits": permits}
        });
        let refused = api_error(create_raw(&ns, "leases", lease).await);
        assert_eq!(refused.code, 422, "permits {permits}: {refused:?}");
        assert!(
            refused.message.contains("spec.permits"),
            "permits {permits}: {}",
            refused.message
        );
    }
    for slot in [json!(64), json!(-1), json!("one")] {
        let claim = json!({
            "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
            "metadata": {"name": "bad-slot"},
            "spec": {"leaseName": "pool", "holderIdentity": "x", "slot": slot}
        });
        let refused = api_error(create_raw(&ns, "leaseclaims", claim).await);
        assert_eq!(refused.code, 422, "slot {slot}: {refused:?}");
        assert!(
            refused.message.contains("spec.slot"),
            "slot {slot}: {}",
            refused.message
        );
    }
    let claims = ns.api::<LeaseClaim>();
    let mut c = claim_for("slotted", "pool", "slotted", None);
    c.spec.slot = Some(1);
    claims.create(&PostParams::default(), &c).await.unwrap();
    let changed = claims
        .patch(
            "slotted",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"slot": 2}})),
        )
        .await;
    assert!(
        api_error(changed)
            .message
            .contains("spec.slot is immutable")
    );
}

/// Creates an object from raw JSON, for values our own types cannot hold.
async fn create_raw(
    ns: &TestNamespace,
    plural: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value, kube::Error> {
    let request = http::Request::post(format!(
        "/apis/palisade.dev/v1alpha1/namespaces/{}/{plural}",
        ns.name
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    support::client().await.request(request).await
}
