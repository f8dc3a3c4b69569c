//! How long a holder keeps its grant when `leaseDurationSeconds` changes under it,
//! and across a controller restart.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::controller::grant::{Ending, decide};
use crate::controller::index::Index;
use crate::crd::LeasePhase;
use crate::fixtures::LeaseBuilder;

use super::{NAME, claim, key};

/// A holder's client keeps the
/// duration its grant was observed with (or a shorter one it sees later), so the
/// controller must never apply a shorter one to a grant in progress. Lowering
/// `leaseDurationSeconds` from 600 to 3 during a grant must not let the
/// controller expire the holder 3 s after its last renewal.
#[test]
fn a_lowered_lease_duration_does_not_cut_short_a_grant_in_progress() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(600)
            .build(),
        now,
    );
    let mut a = claim("a", "u1", 0);
    index.apply_claim(a.clone(), now);
    index.apply_claim(claim("b", "u2", 1), now);
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let updates = d.claim_updates();
    let status = d.lease_status.clone().unwrap();
    let mut written = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(11)
        .generation(1)
        .duration(600)
        .build();
    written.status = Some(status.clone());
    index.apply_lease(written.clone(), now);
    a.status = Some(
        updates
            .iter()
            .find(|u| u.name == "a")
            .unwrap()
            .status
            .clone(),
    );
    index.apply_claim(a, now);

    // The duration is lowered while "a" holds the lease.
    let mut edited = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(12)
        .generation(1)
        .duration(3)
        .build();
    edited.status = Some(status.clone());
    index.apply_lease(edited.clone(), now);
    let view = index.view(&k, now).unwrap();
    assert_eq!(
        view.holders.first().and_then(|h| h.deadline),
        Some(now + Duration::from_secs(600)),
        "the holder keeps the duration it was granted with"
    );
    let later = now + Duration::from_secs(3);
    let d = decide(&view, later, Timestamp::now());
    assert_eq!(d.ended, vec![], "expired on the lowered duration: {d:?}");
    assert!(d.granted.is_empty());

    // After the granted duration it expires, and the next grant uses the current spec.
    let expiry = now + Duration::from_secs(600);
    let d = decide(&index.view(&k, expiry).unwrap(), expiry, Timestamp::now());
    assert_eq!(
        d.ended.first().map(|e| e.how.clone()),
        Some(Ending::Expired)
    );
    assert_eq!(d.granted.first().map(|g| g.claim.as_str()), Some("b"));
    let next = serde_json::to_value(d.lease_status.unwrap()).unwrap();
    assert_eq!(next["holder"]["leaseDurationSeconds"], json!(3), "{next}");
    // The grant of "a" recorded the duration it was made with.
    let recorded = serde_json::to_value(&status).unwrap();
    assert_eq!(
        recorded["holder"]["leaseDurationSeconds"],
        json!(600),
        "{recorded}"
    );
}

/// The same across a controller restart or failover: rule 4's fresh full duration
/// is at least the duration the grant was made with, as recorded in the Lease.
#[test]
fn after_a_restart_a_holder_gets_at_least_the_duration_it_was_granted_with() {
    // Spec lowered to 3 s after the grant; a new controller starts and lists it.
    let restarted = Instant::now();
    let mut index = Index::default();
    let held = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(60)
        .generation(1)
        .duration(3)
        .phase(LeasePhase::Held)
        .token(50)
        .grants(3)
        .holder("a", "u1", "a")
        .granted_with(600)
        .build();
    index.apply_lease(held, restarted);
    index.apply_claim(claim("a", "u1", 0), restarted);
    index.apply_claim(claim("b", "u2", 1), restarted);
    let k = key();
    let view = index.view(&k, restarted).unwrap();
    assert_eq!(
        view.holders.first().and_then(|h| h.deadline),
        Some(restarted + Duration::from_secs(600))
    );
    let d = decide(&view, restarted + Duration::from_secs(3), Timestamp::now());
    assert_eq!(d.ended, vec![], "expired on the lowered duration: {d:?}");
}

/// Raising the duration takes effect for the holder at once (the controller applies
/// the longer of the recorded and the current duration; the client never believes
/// the longer one, so that is safe), and a Lease written before the field existed
/// is expired on its current spec, as before.
#[test]
fn a_raised_duration_applies_to_the_holder_and_an_unrecorded_grant_uses_the_spec() {
    let now = Instant::now();
    let k = key();
    for (recorded, spec, expected) in [(Some(3), 600, 600), (None, 7, 7), (Some(20), 20, 20)] {
        let held = LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(60)
            .generation(1)
            .duration(spec)
            .phase(LeasePhase::Held)
            .token(50)
            .holder("a", "u1", "a")
            .granted_with(recorded)
            .build();
        let mut index = Index::default();
        index.apply_lease(held, now);
        index.apply_claim(claim("a", "u1", 0), now);
        assert_eq!(
            index
                .view(&k, now)
                .unwrap()
                .holders
                .first()
                .and_then(|h| h.deadline),
            Some(now + Duration::from_secs(expected)),
            "recorded {recorded:?}, spec {spec}"
        );
    }
}
