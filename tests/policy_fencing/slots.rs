//! A semaphore's slots: an object labelled `palisade.dev/fenced-slot` is judged against
//! its slot's published token, never another slot's, and keeps its slot for its life.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use palisade::crd::Lease;
use serde_json::json;
use support::admission::until_rejected;
use support::helm::Release;
use support::{TestNamespace, api_error, setup};

use crate::{next_write_id, token_of, unfence_and_delete, write_with_token};

/// A semaphore of 3 whose status publishes slot 0's token `first` and the others' rows.
async fn publish_slots(ns: &TestNamespace, first: i64, slots: &[(i32, i64)]) {
    let rows: Vec<_> = slots
        .iter()
        .map(|(slot, token)| json!({"slot": slot, "fencingToken": token}))
        .collect();
    ns.api::<Lease>()
        .patch_status(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"fencingToken": first, "slots": rows, "held": "3/3"}})),
        )
        .await
        .expect("publishing the slots' tokens");
}

/// A ConfigMap fenced by slot `slot` of Lease pool, carrying `token`.
fn slot_cm(name: &str, slot: &str, token: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name,
                     "labels": {"palisade.dev/fenced-by": "pool", "palisade.dev/fenced-slot": slot},
                     "annotations": {"palisade.dev/fencing-token": token,
                                     "palisade.dev/write-id": next_write_id()}},
        "data": {"n": "0"}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_slots_object_is_judged_against_that_slots_token_and_keeps_its_slot() {
    let ns = setup("helm-slots").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": "pool"}, "spec": {"leaseDurationSeconds": 600, "permits": 3}
    }))
    .unwrap();
    ns.api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    // Slot 1's token (40) is below slot 0's (50): judged against slot 0, it would be stale.
    publish_slots(&ns, 50, &[(1, 40), (2, 60)]).await;
    let cms: Api<ConfigMap> = ns.api();
    let cms_ref = &cms;
    until_rejected(
        "creating slot 1's object with token 39 while slot 1 published 40",
        "Lease pool slot 1 has granted since",
        move || async move {
            cms_ref
                .create(&PostParams::default(), &slot_cm("shard-1", "1", "39"))
                .await
        },
        move || async move { unfence_and_delete(cms_ref, "shard-1").await },
    )
    .await;
    cms.create(&PostParams::default(), &slot_cm("shard-1", "1", "40"))
        .await
        .expect("slot 1's holder creates its object, below slot 0's token");

    // Slot 1 is granted again (45): its old holder (40, or 42: above the object's own
    // token) is refused, naming the slot; the new one writes.
    publish_slots(&ns, 50, &[(1, 45), (2, 60)]).await;
    until_rejected(
        "a write with token 42 after slot 1 published 45",
        "Lease pool slot 1 has granted since",
        move || async move { write_with_token(cms_ref, "shard-1", Some("42")).await },
        || async {},
    )
    .await;
    let kept = write_with_token(&cms, "shard-1", Some("45"))
        .await
        .expect("slot 1's new holder writes");
    assert_eq!(token_of(&kept).as_deref(), Some("45"));

    // The slot never changes, and a slot must be one.
    let moved = cms
        .patch(
            "shard-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"palisade.dev/fenced-slot": "2"},
                "annotations": {"palisade.dev/fencing-token": "60",
                                "palisade.dev/write-id": next_write_id()}}})),
        )
        .await;
    let e = api_error(moved);
    assert!(
        e.message
            .contains("changes the label palisade.dev/fenced-slot"),
        "{e:?}"
    );
    for bad in ["64", "x", "01"] {
        let e = api_error(
            cms.create(&PostParams::default(), &slot_cm("shard-bad", bad, "60"))
                .await,
        );
        assert!(
            e.message.contains("must be a semaphore slot"),
            "slot {bad}: {e:?}"
        );
    }
    unfence_and_delete(&cms, "shard-1").await;
}
