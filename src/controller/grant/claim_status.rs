//! Phase 5 of the grant decision: what each claim's status says (its place in the
//! queue, its grant, how its grant ended), and the condition helper both the Lease
//! and the claims' statuses are written with.
//!
//! # Claim mirrors
//!
//! Claim mirrors are written after the Lease with a JSON patch that first tests the
//! claim's UID (so a claim re-created under the same name is never touched). They
//! are not conditioned on the claim's resourceVersion: the holder's renewals change
//! it constantly, and the mirror is not the authority (rule 1). A claim's status
//! never moves back, whoever writes it: the CRD's transition rules refuse a status
//! that leaves a final phase, goes from `Granted` to `Pending`, or changes a fencing
//! token once set (422). So a second writer (an ex-leader's pass in flight, two
//! replicas with `leaderElection.enabled=false`) cannot make an ended grant's renewals
//! count again or grant a claim twice; a mirror refused that way is dropped, and the
//! claim's watch event brings a new decision.
//!
//! A pass writes its mirrors after its Lease write, up to 4 at once (different
//! claims; `write_pass`). Letting the next decision on a Lease run before they finish
//! was tried: no faster handover, and 100 MiB instead of 60 at 10,000 Leases.
//!
//! **Writes per handover.** One Lease status write, then one status write per claim
//! whose mirror changed (the new holder, the old holder if it still exists, and each
//! waiter whose `position` moved). A renewal costs the holder's one write and no
//! controller write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::{Check, ClaimUpdate, Decision, Ending, held_a_deleted_lease, is_pending, marks_first};
use crate::conditions::{messages, reasons, types};
use crate::controller::index::{ClaimView, LeaseView, PodProblem};
use crate::crd::{ClaimPhase, LeaseClaimStatus, LeaseStatus};
use crate::permits::SlotGrant;

/// Phase 5a: each waiter's place in the queue.
pub(super) fn mirror_waiters(
    view: &LeaseView<'_>,
    waiters: &[&ClaimView<'_>],
    decision: &mut Decision,
    wall: Timestamp,
) {
    for (position, c) in waiters.iter().enumerate() {
        let mut s = c.claim.status.clone();
        s.phase = Some(ClaimPhase::Pending);
        s.position = Some(position as i64 + 1);
        remove_condition(&mut s.conditions, types::LEASE_NOT_FOUND);
        set_condition(
            &mut s.conditions,
            types::GRANTED,
            false,
            reasons::WAITING,
            &messages::waiting(&view.key.name, position + 1),
            c.claim.generation,
            wall,
        );
        push_mirror(decision, c, s);
    }
}

/// Phase 5b: every other claim that is not final yet: the holder's grant, the end of
/// the grant that ended (conditioned on the claim's resourceVersion when it is marked
/// before the Lease), an expiry written earlier without a mark, a grant that a later
/// one superseded, and a pending claim whose pod is gone.
pub(super) fn mirror_claims(
    view: &LeaseView<'_>,
    claims: &[&ClaimView<'_>],
    status: &LeaseStatus,
    decision: &mut Decision,
    wall: Timestamp,
) {
    let wrote_lease = decision.lease_status.is_some();
    let highest_token = status.highest_token();
    for c in claims {
        let uid = c.claim.uid.as_str();
        if c.claim.deleting || c.claim.status.phase.is_some_and(ClaimPhase::is_final) {
            continue;
        }
        if let Some(grant) = status.grant_of(uid) {
            if c.claim.status.phase != Some(ClaimPhase::Granted) {
                push_mirror(decision, c, granted(view, c, status, &grant, wall));
            }
        } else if let Some(how) = decision
            .ended
            .iter()
            .find(|e| e.uid == uid)
            .map(|e| e.how.clone())
        {
            let mark = ended(c, &how, wall);
            if marks_first(view.holder(uid), &how) {
                let update = claim_update(c, mark, Some(c.claim.resource_version.clone()));
                decision.end_holder.extend(update);
            } else {
                decision.expired_unmarked.push(uid.to_string());
                push_mirror(decision, c, mark);
            }
        } else if view.expired_holders.iter().any(|u| u == uid) {
            push_mirror(decision, c, ended(c, &Ending::Expired, wall));
        } else if held_a_deleted_lease(view, c) {
            // The Lease it held was deleted (this one is a new object of the name).
            let why = messages::LEASE_DELETED;
            let s = lost(c, ClaimPhase::Revoked, reasons::LEASE_DELETED, why, wall);
            push_mirror(decision, c, s);
        } else if c.claim.status.phase == Some(ClaimPhase::Granted) {
            // Granted in its mirror, but the Lease names someone else: a later grant superseded it.
            let token = highest_token.unwrap_or_default();
            let why = messages::superseded(&view.key.name, token);
            if !wrote_lease {
                decision.check(Check::LeaseUnchanged);
            }
            let s = lost(c, ClaimPhase::Revoked, reasons::SUPERSEDED, &why, wall);
            push_mirror(decision, c, s);
        } else if let Some(renewed) = c.claim.renewed_token
            && highest_token.is_some_and(|t| renewed <= t)
        {
            // It renewed a grant the Lease has moved on from, before its `Granted`
            // mirror landed: that grant expired (a renewal newer than every token of
            // the Lease we see means our copy of the Lease is stale, and we wait for
            // it; a token at least as high was written with or after that grant).
            if !wrote_lease {
                decision.check(Check::LeaseUnchanged);
            }
            push_mirror(decision, c, ended(c, &Ending::Expired, wall));
        } else if is_pending(c)
            && let Some(problem) = &c.pod_problem
            && *problem != PodProblem::NotSeenYet
        {
            let pod = c.claim.pod.as_ref().map(|p| p.name.as_str());
            let why = problem.describe(pod.unwrap_or_default());
            check_pod_gone(decision, c);
            let s = lost(c, ClaimPhase::Revoked, reasons::POD_GONE, &why, wall);
            push_mirror(decision, c, s);
        }
    }
}

/// A new holder's mirror: granted, with its slot's token and grant time (and the
/// slot, on a semaphore).
fn granted(
    view: &LeaseView<'_>,
    c: &ClaimView<'_>,
    status: &LeaseStatus,
    grant: &SlotGrant<'_>,
    wall: Timestamp,
) -> LeaseClaimStatus {
    let token = grant.token;
    let mut s = c.claim.status.clone();
    s.phase = Some(ClaimPhase::Granted);
    s.fencing_token = token;
    s.slot = status.held.is_some().then_some(grant.slot);
    s.grant_time = status
        .slot_rows()
        .into_iter()
        .find(|r| r.slot == grant.slot)
        .and_then(|r| r.acquire_time);
    s.position = None;
    remove_condition(&mut s.conditions, types::LEASE_NOT_FOUND);
    set_condition(
        &mut s.conditions,
        types::GRANTED,
        true,
        reasons::GRANTED,
        &match s.slot {
            Some(slot) => messages::granted_slot(&view.key.name, slot, token.unwrap_or_default()),
            None => messages::granted(&view.key.name, token.unwrap_or_default()),
        },
        c.claim.generation,
        wall,
    );
    s
}

/// The ended holder's mark: the phase and message that say how its grant ended.
fn ended(c: &ClaimView<'_>, how: &Ending, wall: Timestamp) -> LeaseClaimStatus {
    let (phase, message) = match how {
        Ending::Expired => (ClaimPhase::Expired, messages::NO_RENEWAL.to_string()),
        Ending::Revoked(why) => (ClaimPhase::Revoked, why.clone()),
        Ending::Released => (ClaimPhase::Released, messages::RELEASED.to_string()),
    };
    lost(c, phase, how.reason(), &message, wall)
}

/// A decision that ends a grant because the claim's pod is gone has the writer
/// confirm it (when the claim names a pod), unless the index knows it final for
/// that pod (`index::pods`).
pub(super) fn check_pod_gone(decision: &mut Decision, c: &ClaimView<'_>) {
    if c.pod_gone_for_certain {
        return;
    }
    if let Some(pod) = &c.claim.pod {
        decision.check(Check::PodGone {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        });
    }
}

pub(super) fn lost(
    c: &ClaimView<'_>,
    phase: ClaimPhase,
    reason: &str,
    message: &str,
    wall: Timestamp,
) -> LeaseClaimStatus {
    let mut s = c.claim.status.clone();
    s.phase = Some(phase);
    s.position = None;
    set_condition(
        &mut s.conditions,
        types::GRANTED,
        false,
        reason,
        message,
        c.claim.generation,
        wall,
    );
    s
}

/// A mirror to write, when `status` differs from the claim's.
pub(super) fn push_mirror(decision: &mut Decision, c: &ClaimView<'_>, status: LeaseClaimStatus) {
    decision.mirrors.extend(claim_update(c, status, None));
}

fn claim_update(
    c: &ClaimView<'_>,
    mut status: LeaseClaimStatus,
    condition_on: Option<String>,
) -> Option<ClaimUpdate> {
    status.observed_generation = c.claim.generation;
    (status != c.claim.status).then(|| ClaimUpdate {
        name: c.claim.name.clone(),
        uid: c.claim.uid.clone(),
        status,
        condition_on,
    })
}

/// Sets a condition, keeping its lastTransitionTime unless its status changed.
pub(super) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    wall: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let existing = conditions.iter_mut().find(|c| c.type_ == type_);
    match existing {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(wall);
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message: message.to_string(),
            observed_generation: generation,
            last_transition_time: Time(wall),
        }),
    }
}

fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}
