//! Single decisions on semaphores (`spec.permits` above 1): slots granted in one
//! write, a waiter that asks for one slot, and `permits` raised and lowered.

use std::time::Instant;

use k8s_openapi::jiff::Timestamp;

use crate::controller::grant::{Decision, Ending, decide};
use crate::controller::index::Index;
use crate::crd::{ClaimPhase, Lease, LeaseStatus};
use crate::fixtures::{ClaimBuilder, LeaseBuilder};

use super::{NAME, claim, key};

fn semaphore(permits: i32, rv: u64) -> Lease {
    LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(rv)
        .generation(1)
        .duration(15)
        .permits(permits)
        .build()
}

fn decided(index: &Index, now: Instant) -> Decision {
    decide(&index.view(&key(), now).unwrap(), now, Timestamp::now())
}

/// (slot, holder's claim name, token) of every held slot.
fn held(status: &LeaseStatus) -> Vec<(i32, String, i64)> {
    status
        .slot_rows()
        .into_iter()
        .filter_map(|r| Some((r.slot, r.holder?.claim, r.fencing_token?)))
        .collect()
}

/// The Lease as the decision wrote it, with a newer resourceVersion, applied.
fn written(index: &mut Index, d: &Decision, rv: u64, permits: i32, now: Instant) -> LeaseStatus {
    let status = d.lease_status.clone().expect("a Lease write");
    let mut lease = semaphore(permits, rv);
    lease.status = Some(status.clone());
    index.apply_lease(lease, now);
    status
}

#[test]
fn one_write_grants_every_free_slot_in_fifo_order_with_one_token() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(semaphore(3, 100), now);
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        index.apply_claim(claim(name, &format!("u{i}"), i as i64), now);
    }
    let d = decided(&index, now);
    let status = d.lease_status.clone().unwrap();
    assert_eq!(
        held(&status),
        vec![
            (0, "a".into(), 101),
            (1, "b".into(), 101),
            (2, "c".into(), 101)
        ]
    );
    assert_eq!(status.held.as_deref(), Some("3/3"));
    assert_eq!(status.waiting, vec!["d"]);
    assert_eq!(status.grants, Some(3));
    let slots: Vec<i32> = d.granted.iter().map(|g| g.slot).collect();
    assert_eq!(slots, vec![0, 1, 2]);
    let mirror = |name: &str| d.mirrors.iter().find(|u| u.name == name).unwrap();
    assert_eq!(mirror("b").status.slot, Some(1));
    assert_eq!(mirror("b").status.fencing_token, Some(101));
    assert_eq!(mirror("d").status.position, Some(1));
}

#[test]
fn a_released_slot_goes_to_the_head_of_the_queue_with_a_higher_token() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(semaphore(2, 100), now);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        index.apply_claim(claim(name, &format!("u{i}"), i as i64), now);
    }
    let first = decided(&index, now);
    written(&mut index, &first, 110, 2, now);
    // b releases slot 1: c takes it, a keeps slot 0.
    index.delete_claim(&claim("b", "u1", 1));
    let d = decided(&index, now);
    let status = d.lease_status.clone().unwrap();
    assert_eq!(
        held(&status),
        vec![(0, "a".into(), 101), (1, "c".into(), 111)]
    );
    assert_eq!(d.ended.len(), 1);
    assert_eq!((d.ended[0].slot, &d.ended[0].how), (1, &Ending::Released));
}

#[test]
fn a_waiter_for_one_slot_lets_those_behind_it_take_the_others() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(semaphore(3, 100), now);
    index.apply_claim(claim("a", "u0", 0), now);
    let first = decided(&index, now);
    written(&mut index, &first, 110, 3, now);
    // "b" wants slot 0 (held by a); "c", behind it, takes the lowest free slot.
    let wants_zero = ClaimBuilder::new("b", NAME)
        .uid("u1")
        .resource_version(1)
        .created(1)
        .slot(0)
        .build();
    index.apply_claim(wants_zero, now);
    index.apply_claim(claim("c", "u2", 2), now);
    let d = decided(&index, now);
    let status = d.lease_status.clone().unwrap();
    assert_eq!(
        held(&status),
        vec![(0, "a".into(), 101), (1, "c".into(), 111)]
    );
    assert_eq!(status.waiting, vec!["b"]);
    // Slot 0 freed: b gets it, not a later waiter.
    written(&mut index, &d, 120, 3, now);
    index.apply_claim(claim("e", "u4", 4), now);
    index.delete_claim(&claim("a", "u0", 0));
    let d = decided(&index, now);
    let status = d.lease_status.clone().unwrap();
    assert_eq!(
        held(&status),
        vec![
            (0, "b".into(), 121),
            (1, "c".into(), 111),
            (2, "e".into(), 121)
        ]
    );
}

#[test]
fn lowering_permits_revokes_the_highest_slots_marked_first_and_raising_grants_at_once() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(semaphore(3, 100), now);
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        index.apply_claim(claim(name, &format!("u{i}"), i as i64), now);
    }
    let first = decided(&index, now);
    let mut status = written(&mut index, &first, 110, 3, now);
    // permits 3 -> 1: slots 1 and 2 end, their claims marked before the Lease write.
    let mut lowered = semaphore(1, 111);
    lowered.status = Some(status.clone());
    index.apply_lease(lowered, now);
    let d = decided(&index, now);
    let ended: Vec<(i32, &str)> = d.ended.iter().map(|e| (e.slot, e.claim.as_str())).collect();
    assert_eq!(ended, vec![(1, "b"), (2, "c")]);
    assert!(d.ended.iter().all(|e| matches!(e.how, Ending::Revoked(_))));
    let marked: Vec<&str> = d.end_holder.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(marked, vec!["b", "c"]);
    assert!(
        d.end_holder
            .iter()
            .all(|u| u.status.phase == Some(ClaimPhase::Revoked) && u.condition_on.is_some())
    );
    // The marks landed (the write pass applies what it wrote), then the Lease.
    for (i, mark) in d.end_holder.iter().enumerate() {
        let mut marked = claim(&mark.name, &mark.uid, 1 + i as i64);
        marked.metadata.resource_version = Some("2".into());
        marked.status = Some(mark.status.clone());
        index.apply_claim(marked, now);
    }
    status = written(&mut index, &d, 112, 1, now);
    assert_eq!(held(&status), vec![(0, "a".into(), 101)]);
    assert_eq!(status.held.as_deref(), Some("1/1"), "the rows stay, free");
    assert_eq!(status.slots.len(), 2);
    assert_eq!(status.waiting, vec!["d"], "d still waits");
    // permits 1 -> 2: d is granted slot 1 at once, above slot 1's last token.
    let mut raised = semaphore(2, 113);
    raised.status = Some(status);
    index.apply_lease(raised, now);
    let d = decided(&index, now);
    let status = d.lease_status.clone().unwrap();
    assert_eq!(
        held(&status),
        vec![(0, "a".into(), 101), (1, "d".into(), 114)]
    );
}

#[test]
fn a_lock_keeps_todays_status_fields() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(semaphore(1, 100), now);
    index.apply_claim(claim("a", "u0", 0), now);
    let d = decided(&index, now);
    let status = d.lease_status.clone().unwrap();
    assert_eq!(status.holder.as_ref().map(|h| h.claim.as_str()), Some("a"));
    assert!(status.slots.is_empty() && status.held.is_none());
    let mirror = d.mirrors.iter().find(|u| u.name == "a").unwrap();
    assert_eq!(mirror.status.slot, None);
}
