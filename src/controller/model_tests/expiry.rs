//! Decisions about a holder's expiry: its deadline, the quorum read ahead of it,
//! and the write that ends it (DESIGN.md rule 4; `index::holder`, "Expiry is one write").

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use kube::ResourceExt;

use crate::conditions::{reasons, types};
use crate::controller::grant::{Check, Decision, Ending, Work, decide};
use crate::controller::index::{ExpiryConfirmed, Index, Learned};
use crate::crd::{ClaimPhase, Lease, LeaseClaim, LeasePhase, RENEWED_TOKEN_ANNOTATION};
use crate::fixtures::{ClaimBuilder, LeaseBuilder};

use super::{NAME, claim, key};

#[test]
fn a_renewal_changes_nothing_but_the_deadline() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(2)
            .build(),
        now,
    );
    let mut c = claim("a", "u1", 0);
    index.apply_claim(c.clone(), now);
    let k = key();
    // Settle: grant, and apply what the controller wrote.
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let updates = d.claim_updates();
    let mut written = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(11)
        .generation(1)
        .duration(2)
        .build();
    written.status = d.lease_status;
    index.apply_lease(written, now);
    c.status = Some(updates[0].status.clone());
    index.apply_claim(c.clone(), now);
    let settled = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    assert!(
        settled.lease_status.is_none() && settled.claim_updates().is_empty(),
        "{settled:?}"
    );
    assert_eq!(
        index
            .view(&k, now)
            .unwrap()
            .holders
            .first()
            .and_then(|h| h.deadline),
        Some(now + Duration::from_secs(2))
    );

    let later = now + Duration::from_millis(1500);
    c.spec.renew_time = Some(MicroTime(Timestamp::now()));
    renewed_token(&mut c, 11);
    let c_renewed = c.clone();
    index.apply_claim(c, later);
    let view = index.view(&k, now).unwrap();
    assert_eq!(
        view.holders.first().and_then(|h| h.deadline),
        Some(later + Duration::from_secs(2))
    );
    // Past the old deadline but within the new one: nothing to write at all.
    let d = decide(&view, now + Duration::from_millis(2500), Timestamp::now());
    assert!(
        d.lease_status.is_none() && d.claim_updates().is_empty() && d.ended.is_empty(),
        "{d:?}"
    );
    // Past the new deadline: expired. The holder was seen renewing, so one quorum
    // read of its claim, then the Lease; its `Expired` waits with the mirrors.
    let d = decide(&view, later + Duration::from_secs(2), Timestamp::now());
    assert_eq!(d.ended.first().unwrap().how, Ending::Expired);
    assert_eq!(
        d.confirm,
        vec![Check::NotRenewed {
            name: "a".into(),
            uid: "u1".into(),
            renew_time: c_renewed.spec.renew_time.map(|t| t.0),
            token: 11,
        }]
    );
    assert_eq!(d.end_holder, vec![]);
    assert_eq!(d.expired_unmarked, vec!["u1"]);
    let mark = d.mirrors.iter().find(|m| m.name == "a").unwrap();
    assert_eq!(mark.status.phase, Some(ClaimPhase::Expired));
    assert_eq!(mark.condition_on, None);
}

/// What the client library's renewal of the grant with `token` adds to its claim.
fn renewed_token(claim: &mut LeaseClaim, token: i64) {
    claim
        .annotations_mut()
        .insert(RENEWED_TOKEN_ANNOTATION.into(), token.to_string());
}

/// A Lease held by claim `a` (UID u1) with token 50, for 2 s.
fn held_by_a() -> Lease {
    LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(60)
        .generation(1)
        .duration(2)
        .phase(LeasePhase::Held)
        .holder("a", "u1", "a")
        .token(50)
        .grants(3)
        .build()
}

/// A Lease held by claim `a` (token 50, 2 s) whose holder renewed this grant
/// 500 ms after the index first saw it. Returns the index, the Lease, and when the
/// renewal was observed.
fn renewed_holder(now: Instant) -> (Index, Lease, Instant) {
    let mut index = Index::default();
    let lease = held_by_a();
    index.apply_lease(lease.clone(), now);
    let mut a = claim("a", "u1", 0);
    let mut mirror = a.status.clone().unwrap_or_default();
    mirror.phase = Some(ClaimPhase::Granted);
    mirror.fencing_token = Some(50);
    a.status = Some(mirror);
    index.apply_claim(a.clone(), now);
    let renewed = now + Duration::from_millis(500);
    a.spec.renew_time = Some(MicroTime(Timestamp::now()));
    renewed_token(&mut a, 50);
    a.metadata.resource_version = Some("2".into());
    index.apply_claim(a, renewed);
    (index, lease, renewed)
}

#[test]
fn an_expiry_confirmed_in_the_holders_last_sixth_is_the_lease_write_alone() {
    let now = Instant::now();
    let (mut index, _, renewed) = renewed_holder(now);
    let k = key();
    let view = index.view(&k, now).unwrap();
    let check_at = renewed + Duration::from_secs(2) * 5 / 6;
    assert_eq!(view.holders[0].expiry_check_at, Some(check_at));
    assert_eq!(view.wake_at(), Some(check_at));
    // Before the holder's last sixth: nothing to do, not even a read.
    let early = check_at - Duration::from_millis(1);
    let d = decide(&view, early, Timestamp::now());
    assert_eq!(d.confirm_expiry_early, vec![]);
    // In it: the holder keeps its grant, and the read is due, urgent.
    let d = decide(&view, check_at, Timestamp::now());
    let read = d
        .confirm_expiry_early
        .first()
        .cloned()
        .expect("an early read");
    assert_eq!(d.work(), Work::Urgent);
    assert!(d.ended.is_empty() && d.confirm.is_empty());
    let Check::NotRenewed {
        uid,
        renew_time,
        token,
        ..
    } = read
    else {
        panic!("{read:?}")
    };
    assert_eq!(token, 50);
    // What the read found, as the pass reports it.
    let learned = Learned {
        lease_uid: Some("L".into()),
        expiries_confirmed: vec![ExpiryConfirmed {
            uid,
            renew_time,
            token,
        }],
        ..Learned::default()
    };
    index.apply_outcome(&k, learned, check_at);
    let view = index.view(&k, check_at).unwrap();
    assert!(view.holders[0].expiry_confirmed);
    assert_eq!(view.holders[0].expiry_check_at, None);
    assert_eq!(
        view.wake_at(),
        view.holders.first().and_then(|h| h.deadline)
    );
    // At the expiry: the Lease write, with nothing to read first.
    let expiry = renewed + Duration::from_secs(2);
    let d = decide(&view, expiry, Timestamp::now());
    assert_eq!(d.ended.first().unwrap().how, Ending::Expired);
    assert!(d.confirm.is_empty(), "{:?}", d.confirm);
    assert_eq!(d.confirm_expiry_early, vec![]);
    assert_eq!(d.end_holder, vec![]);
    assert!(d.lease_status.is_some());
}

#[test]
fn a_renewal_after_the_early_read_voids_it() {
    let now = Instant::now();
    let (mut index, _, renewed) = renewed_holder(now);
    let k = key();
    let check_at = renewed + Duration::from_secs(2) * 5 / 6;
    let view = index.view(&k, now).unwrap();
    let [
        Check::NotRenewed {
            uid,
            renew_time,
            token,
            ..
        },
    ] = &decide(&view, check_at, Timestamp::now()).confirm_expiry_early[..]
    else {
        panic!("no early read")
    };
    let confirmed = ExpiryConfirmed {
        uid: uid.clone(),
        renew_time: *renew_time,
        token: *token,
    };
    let learned = Learned {
        lease_uid: Some("L".into()),
        expiries_confirmed: vec![confirmed],
        ..Learned::default()
    };
    index.apply_outcome(&k, learned, check_at);
    // A renewal the watch delivers after the read (it counted for nothing, but the
    // index cannot tell): the holder's clock restarts, and so does the read.
    let mut a = ClaimBuilder::new("a", NAME)
        .uid("u1")
        .resource_version(3)
        .created(0)
        .build();
    a.spec.renew_time = Some(MicroTime(Timestamp::now() + Duration::from_secs(1)));
    renewed_token(&mut a, 50);
    let seen = check_at + Duration::from_millis(100);
    index.apply_claim(a, seen);
    let view = index.view(&k, seen).unwrap();
    assert!(!view.holders[0].expiry_confirmed);
    assert_eq!(
        view.holders.first().and_then(|h| h.deadline),
        Some(seen + Duration::from_secs(2))
    );
    let d = decide(&view, seen + Duration::from_secs(2), Timestamp::now());
    assert_eq!(d.ended.first().unwrap().how, Ending::Expired);
    assert_eq!(d.confirm.len(), 1, "{:?}", d.confirm);
}

#[test]
fn an_expiry_written_without_its_mark_is_mirrored_as_expired_not_superseded() {
    let now = Instant::now();
    let k = key();
    let (mut index, lease, renewed) = renewed_holder(now);
    let expiry = renewed + Duration::from_secs(2);
    let d = decide(&index.view(&k, expiry).unwrap(), expiry, Timestamp::now());
    assert_eq!(d.expired_unmarked, vec!["u1"]);
    // The Lease write lands (freed: nobody waits), and the index learns it.
    lease_write_lands(&mut index, lease, &d, expiry);
    // The mirrors' own pass, decided afresh: the claim shows `Granted` and the Lease
    // names nobody, yet its grant expired (it was not superseded) and needs no read.
    let d = decide(&index.view(&k, expiry).unwrap(), expiry, Timestamp::now());
    assert_eq!(d.lease_status, None);
    assert!(d.confirm.is_empty(), "{:?}", d.confirm);
    let mark = d.mirrors.iter().find(|m| m.name == "a").unwrap();
    assert_eq!(mark.status.phase, Some(ClaimPhase::Expired));
    let granted = mark
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == types::GRANTED)
        .unwrap();
    assert_eq!(granted.reason, reasons::EXPIRED);
}

#[test]
fn silent_holder_expires_and_the_next_claim_gets_a_higher_token_in_the_same_write() {
    let now = Instant::now();
    let mut index = Index::default();
    let held = held_by_a();
    index.apply_lease(held, now);
    index.apply_claim(claim("a", "u1", 0), now);
    index.apply_claim(claim("b", "u2", 1), now);
    let k = key();
    let d = decide(
        &index.view(&k, now).unwrap(),
        now + Duration::from_secs(2),
        Timestamp::now(),
    );
    let updates = d.claim_updates();
    assert_eq!(d.ended.first().unwrap().how, Ending::Expired);
    let status = d.lease_status.unwrap();
    assert_eq!(status.holder.unwrap().claim, "b");
    assert_eq!(status.fencing_token, Some(61));
    assert_eq!(status.grants, Some(4));
    let a = updates.iter().find(|u| u.name == "a").unwrap();
    assert_eq!(a.status.phase, Some(ClaimPhase::Expired));
    // Never seen renewing since the grant (its client may not have counted its first
    // renewal yet): its claim is marked first, conditioned on its resourceVersion.
    let mark = d.end_holder.first().unwrap();
    assert_eq!(mark.name, "a");
    assert_eq!(mark.condition_on.as_deref(), Some("1"));
    assert!(d.confirm.is_empty(), "{:?}", d.confirm);
    assert!(d.expired_unmarked.is_empty());
}

/// A Lease freed when `a`'s grant (token 50) expired, as a controller that has never
/// seen it held finds it after a failover: `a`'s claim still `Pending` (its `Granted`
/// mirror never landed), annotated with its renewal of token 50.
fn freed_after_unmirrored_expiry() -> (Lease, LeaseClaim) {
    let mut lease = held_by_a();
    let status = lease.status.as_mut().unwrap();
    status.holder = None;
    status.phase = Some(LeasePhase::Free);
    lease.metadata.resource_version = Some("61".into());
    (lease, renewed_a())
}

/// Claim `a` (UID u1), still `Pending`, with its client's renewal of token 50.
fn renewed_a() -> LeaseClaim {
    let mut a = claim("a", "u1", 0);
    a.spec.renew_time = Some(MicroTime(Timestamp::now()));
    renewed_token(&mut a, 50);
    a
}

/// The decision's Lease write lands on `lease` (as resourceVersion 61) and the
/// index learns it, as the write pass reports it.
fn lease_write_lands(index: &mut Index, mut lease: Lease, d: &Decision, at: Instant) {
    lease.status = d.lease_status.clone();
    lease.metadata.resource_version = Some("61".into());
    let learned = Learned {
        lease_uid: Some("L".into()),
        lease: Some(lease),
        expired_unmarked: d.expired_unmarked.clone(),
        ..Learned::default()
    };
    index.apply_outcome(&key(), learned, at);
}

#[test]
fn a_claim_whose_grant_expired_before_its_mirror_landed_is_never_granted_again() {
    let now = Instant::now();
    let k = key();
    // The holder's `Granted` mirror never landed: its claim says `Pending`.
    let mut index = Index::default();
    let lease = held_by_a();
    index.apply_lease(lease.clone(), now);
    index.apply_claim(renewed_a(), now);
    let expiry = now + Duration::from_secs(2);
    let d = decide(&index.view(&k, expiry).unwrap(), expiry, Timestamp::now());
    assert_eq!(d.ended.first().unwrap().how, Ending::Expired);
    assert_eq!(d.expired_unmarked, vec!["u1"]);
    lease_write_lands(&mut index, lease, &d, expiry);
    let d = decide(&index.view(&k, expiry).unwrap(), expiry, Timestamp::now());
    assert_eq!(d.granted, vec![], "{d:?}");
    let mark = d.mirrors.iter().find(|m| m.name == "a").unwrap();
    assert_eq!(mark.status.phase, Some(ClaimPhase::Expired));
}

#[test]
fn after_a_failover_a_pending_claim_that_renewed_a_grant_is_not_a_waiter() {
    let now = Instant::now();
    let k = key();
    let (lease, a) = freed_after_unmirrored_expiry();
    let mut index = Index::default();
    index.apply_lease(lease, now);
    index.apply_claim(a, now);
    index.apply_claim(claim("b", "u2", 1), now);
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let granted = d.granted.first().expect("b waits and is granted");
    assert_eq!(granted.claim, "b");
    assert!(granted.token > 50);
    let mark = d.mirrors.iter().find(|m| m.name == "a").unwrap();
    assert_eq!(mark.status.phase, Some(ClaimPhase::Expired));
    // Alone, it is not granted either: the Lease stays free.
    let (lease, a) = freed_after_unmirrored_expiry();
    let mut index = Index::default();
    index.apply_lease(lease, now);
    index.apply_claim(a, now);
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    assert_eq!(d.granted, vec![], "{d:?}");
    let holder = d.lease_status.as_ref().and_then(|s| s.holder.as_ref());
    assert_eq!(holder, None, "{d:?}");
    let mark = d.mirrors.iter().find(|m| m.name == "a").unwrap();
    assert_eq!(mark.status.phase, Some(ClaimPhase::Expired));
}
