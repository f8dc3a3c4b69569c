//! Single decisions: what `decide` makes of one index, and what the index keeps.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::controller::grant::{Ending, decide};
use crate::controller::index::{Index, POD_GRACE};
use crate::crd::{ClaimPhase, LeasePhase};
use crate::fixtures::{ClaimBuilder, LeaseBuilder, PodBuilder};

use super::{NAME, claim, key};

#[test]
fn first_waiter_in_fifo_order_is_granted_with_a_token_above_the_resource_version() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(100)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    // Created later but named earlier: creation time decides.
    index.apply_claim(
        ClaimBuilder::new("a-late", NAME)
            .uid("u1")
            .resource_version(1)
            .created(5)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("z-early", NAME)
            .uid("u2")
            .resource_version(1)
            .created(1)
            .build(),
        now,
    );
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let updates = d.claim_updates();
    let status = d.lease_status.unwrap();
    assert_eq!(status.holder.unwrap().claim, "z-early");
    assert_eq!(status.fencing_token, Some(101));
    assert_eq!(status.grants, Some(1));
    assert_eq!(status.waiting, vec!["a-late"]);
    assert_eq!(status.phase, Some(LeasePhase::Held));
    let granted = updates.iter().find(|u| u.name == "z-early").unwrap();
    assert_eq!(granted.status.phase, Some(ClaimPhase::Granted));
    assert_eq!(granted.status.fencing_token, Some(101));
    let waiting = updates.iter().find(|u| u.name == "a-late").unwrap();
    assert_eq!(waiting.status.position, Some(1));
}

#[test]
fn a_terminal_or_deleted_pod_revokes_its_claim() {
    for (pod_state, reason) in [(Some("Succeeded"), "Succeeded"), (None, "deleted")] {
        let now = Instant::now();
        let mut index = Index::default();
        let held = LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(9)
            .generation(1)
            .duration(600)
            .phase(LeasePhase::Held)
            .holder("a", "u1", "a")
            .token(5)
            .build();
        index.apply_lease(held, now);
        index.apply_claim(
            ClaimBuilder::new("a", NAME)
                .uid("u1")
                .resource_version(1)
                .created(0)
                .pod("pod-a")
                .build(),
            now,
        );
        if let Some(phase) = pod_state {
            index.apply_pod(&PodBuilder::new("pod-a").uid("p1").phase(phase).build());
        }
        let k = key();
        let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
        match &d.ended.first().unwrap().how {
            Ending::Revoked(why) => assert!(why.contains(reason), "{why}"),
            other => panic!("expected revocation, got {other:?}"),
        }
        assert_eq!(d.lease_status.unwrap().phase, Some(LeasePhase::Free));
    }
}

#[test]
fn a_claim_whose_pod_is_not_seen_yet_waits_instead_of_being_revoked() {
    // The claim and pod watches are separate streams: the claim may arrive first.
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("a", NAME)
            .uid("u1")
            .resource_version(1)
            .created(0)
            .pod("pod-a")
            .build(),
        now,
    );
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let updates = d.claim_updates();
    assert!(d.granted.is_empty(), "not granted before its pod is seen");
    assert!(
        updates
            .iter()
            .all(|u| u.status.phase != Some(ClaimPhase::Revoked)),
        "not revoked either: {:?}",
        updates
    );
    assert_eq!(
        index.view(&k, now).unwrap().pod_recheck,
        Some(now + POD_GRACE)
    );

    // The pod arrives: granted.
    index.apply_pod(&PodBuilder::new("pod-a").uid("p1").phase("Running").build());
    let later = now + Duration::from_millis(50);
    let d = decide(&index.view(&k, later).unwrap(), later, Timestamp::now());
    assert_eq!(d.granted[0].claim, "a");

    // A pod that never shows up counts as gone after the grace period.
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("b", NAME)
            .uid("u2")
            .resource_version(1)
            .created(0)
            .pod("pod-b")
            .build(),
        now,
    );
    let after = now + POD_GRACE;
    let d = decide(&index.view(&k, after).unwrap(), after, Timestamp::now());
    let updates = d.claim_updates();
    assert!(d.granted.is_empty());
    assert_eq!(updates[0].status.phase, Some(ClaimPhase::Revoked));
}

#[test]
fn claims_of_a_missing_lease_wait_with_lease_not_found() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_claim(claim("a", "u1", 0), now);
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let updates = d.claim_updates();
    assert!(d.lease_status.is_none());
    let a = &updates[0];
    assert_eq!(a.status.phase, Some(ClaimPhase::Pending));
    assert!(
        a.status
            .conditions
            .iter()
            .any(|c| c.type_ == "LeaseNotFound" && c.status == "True")
    );
}

#[test]
fn a_stale_delete_event_does_not_remove_a_recreated_lease() {
    let now = Instant::now();
    let mut index = Index::default();
    let old = LeaseBuilder::new(NAME)
        .uid("old")
        .resource_version(5)
        .generation(1)
        .duration(15)
        .build();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("new")
            .resource_version(9)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    assert!(index.delete_lease(&old).is_none());
    assert!(index.lease(&key()).is_some());
}

/// A `fencingToken` at the top of the range (anyone with
/// `leases/status` can set one) must not make the next grant repeat or saturate it.
#[test]
fn a_token_at_the_maximum_is_refused_with_a_condition_instead_of_repeated() {
    for last in [999_999_999_999_999_999_i64, i64::MAX - 1, i64::MAX] {
        let now = Instant::now();
        let mut index = Index::default();
        let free = LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(60)
            .generation(1)
            .duration(15)
            .phase(LeasePhase::Free)
            .token(last)
            .grants(3)
            .build();
        index.apply_lease(free, now);
        index.apply_claim(claim("a", "u1", 0), now);
        let k = key();
        let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
        let updates = d.claim_updates();
        assert_eq!(d.granted, vec![], "last token {last}: {d:?}");
        let status = d.lease_status.expect("a condition says why");
        assert!(status.holder.is_none(), "last token {last}: {status:?}");
        assert_eq!(status.fencing_token, Some(last), "the token is kept");
        let held = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Held")
            .expect("Held condition");
        assert_eq!(held.status, "False");
        assert_eq!(held.reason, "TokensExhausted", "{held:?}");
        assert!(held.message.contains(&last.to_string()), "{held:?}");
        // The claim keeps waiting: nothing is taken from it.
        let a = updates.iter().find(|u| u.name == "a").unwrap();
        assert_eq!(a.status.phase, Some(ClaimPhase::Pending));
    }
}

/// A Lease deleted before its holder's `Granted` mirror landed: the holder is revoked
/// all the same (its renewals, which count while the claim shows Pending, must stop
/// counting), and a Lease re-created under the name never grants that claim again,
/// whether the watch delivered the delete first or the new object first.
#[test]
fn a_deleted_leases_holder_is_revoked_even_before_its_granted_mirror() {
    let k = key();
    for delete_event_first in [true, false] {
        let now = Instant::now();
        let mut index = Index::default();
        let old = LeaseBuilder::new(NAME)
            .uid("L-old")
            .resource_version(60)
            .generation(1)
            .duration(15)
            .phase(LeasePhase::Held)
            .token(50)
            .grants(1)
            .holder("a", "u1", "a")
            .granted_with(15)
            .build();
        index.apply_lease(old.clone(), now);
        // The holder's claim still shows no phase: its mirror was never written.
        index.apply_claim(claim("a", "u1", 0), now);
        index.apply_claim(claim("b", "u2", 1), now);
        let case = if delete_event_first {
            "deleted, then re-created"
        } else {
            "re-created, delete event not seen"
        };
        if delete_event_first {
            index.delete_lease(&old);
            let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
            let updates = d.claim_updates();
            let a = updates.iter().find(|u| u.name == "a");
            assert_eq!(
                a.and_then(|u| u.status.phase),
                Some(ClaimPhase::Revoked),
                "{case}: the deleted Lease's holder: {d:?}"
            );
        }
        index.apply_lease(
            LeaseBuilder::new(NAME)
                .uid("L-new")
                .resource_version(70)
                .generation(1)
                .duration(15)
                .build(),
            now,
        );
        let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
        let updates = d.claim_updates();
        assert_eq!(
            d.granted.first().map(|g| g.claim.as_str()),
            Some("b"),
            "{case}: {d:?}"
        );
        let a = updates.iter().find(|u| u.name == "a");
        assert_eq!(
            a.and_then(|u| u.status.phase),
            Some(ClaimPhase::Revoked),
            "{case}: {d:?}"
        );
    }
}
