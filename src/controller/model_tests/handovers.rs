//! Schedules of the model test (`model`) around a handover: the write a waiter makes
//! before its grant, and the endings a watch event shows final (no quorum read).

use crate::crd::ClaimPhase;

use super::model::{Op, granted_and_renewed_once, holder_and_phase, run_ops};
use super::server::World;

/// A head waiter writes its claim in the holder's last sixth; the expiry's Lease
/// write follows, and the new holder believes its grant from that earlier write (two
/// thirds of the duration after its send), never past the controller's clock for it.
#[test]
fn a_write_before_the_grant_vouches_for_it_and_nothing_expires_it_early() {
    let mut ops = granted_and_renewed_once();
    ops.extend([
        Op::AdvanceMs(1700),
        Op::EarlyWrite(1),
        Op::Sync(0),
        Op::Finish(0),
        Op::AdvanceMs(400),
        Op::Sync(0),
        Op::Finish(0),
        Op::Sync(0),
        Op::Finish(0),
    ]);
    let world = run_ops(ops.clone()).unwrap();
    assert_eq!(holder_and_phase(&world, "c001").0, Some("c001".into()));
    let belief = world.beliefs["u1"];
    assert_eq!(belief.last_counted, world.written.get("u1").copied());
    // Silent since: the controller expires it no sooner than a duration after the grant.
    ops.extend([
        Op::AdvanceMs(1500),
        Op::Sync(0),
        Op::Finish(0),
        Op::Sync(0),
        Op::Finish(0),
    ]);
    let world = run_ops(ops).unwrap();
    assert_eq!(holder_and_phase(&world, "c001").0, Some("c001".into()));
}

/// A release the controller learns of from the claim's DELETED event is a fact: it
/// hands the Lease on without reading the claim again. Learned from a relist that
/// leaves the claim out (which a lagging cache could serve), it reads first.
#[test]
fn a_release_seen_as_a_delete_event_is_handed_on_without_a_read() {
    let mut released = granted_and_renewed_once();
    released.push(Op::DeleteClaim(0));
    let before = run_ops(released.clone()).unwrap().claim_reads;
    let handed_on = |world: &World| {
        let holder = world
            .lease
            .as_ref()
            .and_then(|l| l.status.as_ref()?.holder.clone());
        holder.map(|h| h.claim)
    };

    let mut deleted = released.clone();
    deleted.extend([Op::Sync(0), Op::Finish(0)]);
    let world = run_ops(deleted).unwrap();
    assert_eq!(handed_on(&world), Some("c001".to_string()));
    assert_eq!(
        world.claim_reads, before,
        "a quorum read before the handover"
    );

    let mut relisted = released;
    relisted.extend([Op::Relist(0), Op::Finish(0)]);
    let world = run_ops(relisted).unwrap();
    assert_eq!(handed_on(&world), Some("c001".to_string()));
    assert_eq!(world.claim_reads, before + 1, "no read after a relist");
}

/// The same for a revocation: a pod's DELETED event is final for its UID, so the
/// holder's claim is marked and the Lease handed on without reading the pod; after a
/// relist that leaves the pod out, the pod is read first.
#[test]
fn a_revocation_on_a_pod_delete_event_is_made_without_a_read() {
    let mut deleted = vec![
        Op::AddClaim {
            with_pod: true,
            slot: None,
        },
        Op::AddClaim {
            with_pod: true,
            slot: None,
        },
        Op::Sync(0),
        Op::Finish(0),
        Op::Sync(0),
        Op::Finish(0),
        Op::DeletePod(0),
    ];
    let before = run_ops(deleted.clone()).unwrap().pod_reads;
    let mut relisted = deleted.clone();
    deleted.extend([Op::Sync(0), Op::Finish(0), Op::Sync(0), Op::Finish(0)]);
    let world = run_ops(deleted).unwrap();
    assert_eq!(
        holder_and_phase(&world, "c000"),
        (Some("c001".into()), Some(ClaimPhase::Revoked))
    );
    assert_eq!(
        world.pod_reads, before,
        "a quorum read before the revocation"
    );

    relisted.extend([Op::Relist(0), Op::Finish(0), Op::Sync(0), Op::Finish(0)]);
    let world = run_ops(relisted).unwrap();
    assert_eq!(holder_and_phase(&world, "c000").0, Some("c001".into()));
    assert!(world.pod_reads > before, "no read after a relist");
}
