//! The grant decision: observed state in, desired statuses out. Pure; no I/O.
//!
//! Given one Lease (or its absence), the claims naming it, what their pods say
//! and whether the holder's time ran out, [`decide`] returns the Lease status to
//! write (at most one write: grant, handover and free happen together, DESIGN
//! rule 5), the claim status mirrors to write after it, and the events to publish.

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::index::{ClaimView, LeaseView, PodProblem};
use crate::api::{ClaimPhase, Holder, Lease, LeaseClaimStatus, LeasePhase, LeaseStatus};
use crate::conditions::{messages, reasons, types};
use crate::token::{MAX_TOKEN, TokensExhausted, next_token};

/// How many waiting claims `status.waiting` lists.
pub const WAITING_LISTED: usize = 10;

/// Why a grant ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The holder deleted its claim.
    Released,
    /// No renewal observed within the lease duration.
    Expired,
    /// The claim's pod is gone or terminal, or the claim was marked lost.
    Revoked(String),
}

impl Ending {
    pub fn reason(&self) -> &'static str {
        match self {
            Ending::Released => reasons::RELEASED,
            Ending::Expired => reasons::EXPIRED,
            Ending::Revoked(_) => reasons::REVOKED,
        }
    }
}

/// The claim a decision grants the Lease to, with its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHolder {
    pub claim: String,
    pub identity: String,
    pub token: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub claim: String,
    pub identity: String,
    pub token: Option<i64>,
    pub how: Ending,
}

/// A claim status to write (after the Lease write, if any).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimUpdate {
    pub name: String,
    pub uid: String,
    pub status: LeaseClaimStatus,
    /// Ends the holder's grant: written *before* the Lease, on the condition that the
    /// claim still has this resourceVersion. A renewal that landed since (seen by the
    /// controller or not) makes the write fail, and the grant is kept; one that lands
    /// after it sees the ended phase in its response.
    pub condition_on: Option<String>,
}

/// A fact a decision to end or take away a grant relies on, that a stale cache
/// could have wrong. The writer confirms each with a quorum read (a GET without a
/// resourceVersion) before it writes anything, and writes nothing if one fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// `Released`: the claim is gone, being deleted, or re-created under another UID.
    ClaimGone { name: String, uid: String },
    /// `PodGone`: the pod is missing, being deleted, replaced (another UID) or terminal.
    PodGone { name: String, uid: Option<String> },
    /// `LeaseDeleted`: no Lease of this name exists.
    LeaseGone,
    /// `Superseded` without a Lease write: the Lease still has the resourceVersion
    /// the decision was computed from.
    LeaseUnchanged,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Decision {
    /// The new Lease status, when it differs from the observed one.
    pub lease_status: Option<LeaseStatus>,
    pub granted: Option<NewHolder>,
    pub ended: Option<Ended>,
    pub claim_updates: Vec<ClaimUpdate>,
    /// What the writer confirms before writing anything (each at most once).
    pub checks: Vec<Check>,
}

impl Decision {
    fn check(&mut self, check: Check) {
        if !self.checks.contains(&check) {
            self.checks.push(check);
        }
    }
}

/// Decides who holds the Lease, with which token, and who waits. Reads as its
/// phases: how the current grant ends (if it does), who waits, the handover, what
/// the Lease status says, and the claims' mirrors.
pub fn decide(view: &LeaseView<'_>, now: Instant, wall: Timestamp) -> Decision {
    let claims = in_fifo_order(view);
    let Some(lease) = view.lease else {
        return decide_without_lease(view, &claims, wall);
    };
    let observed = lease.status.clone().unwrap_or_default();
    let generation = lease.metadata.generation;
    let mut decision = Decision::default();

    // 1. Does the current holder keep the lease?
    let holder = observed.holder.as_ref();
    let ending = holder.and_then(|h| holder_ending(view, h, &claims, now, &mut decision));
    let (ended_uid, kept_uid) = match (holder, ending) {
        (None, _) => (None, None),
        (Some(h), None) => (None, Some(h.claim_uid.as_str())),
        (Some(h), Some(how)) => {
            decision.ended = Some(Ended {
                claim: h.claim.clone(),
                identity: h.identity.clone(),
                token: observed.fencing_token,
                how,
            });
            (Some(h.claim_uid.as_str()), None)
        }
    };

    // 2. Who waits: pending claims whose pods (if any) are alive, in FIFO order.
    let waiting = waiting_claims(view, &claims, ended_uid, kept_uid);

    // 3. Hand over in the same write (or free the Lease), unless the holder keeps it.
    let mut status = observed.clone();
    let (waiters, exhausted) = match kept_uid {
        Some(_) => (waiting.as_slice(), None),
        None => hand_over(lease, &waiting, &mut status, &mut decision, wall),
    };

    // 4. The phase, the queue and the Held condition.
    describe_lease(&mut status, waiters, exhausted, generation, wall);
    if status != observed {
        decision.lease_status = Some(status.clone());
    }

    // 5. Claim mirrors, written after the Lease.
    mirror_waiters(view, waiters, &mut decision, wall);
    mirror_claims(view, &claims, &status, ended_uid, &mut decision, wall);

    decision
}

/// The claims in grant order: `(creationTimestamp, name)` (DESIGN "Decisions": FIFO order).
fn in_fifo_order<'v>(view: &'v LeaseView<'v>) -> Vec<&'v ClaimView<'v>> {
    let mut claims: Vec<&ClaimView<'_>> = view.claims.iter().collect();
    claims.sort_by(|a, b| (a.claim.created, &a.claim.name).cmp(&(b.claim.created, &b.claim.name)));
    claims
}

/// Phase 1: why the holder's grant ends now, if it does, with the facts the writer
/// must confirm first ([`Check`]).
fn holder_ending(
    view: &LeaseView<'_>,
    h: &Holder,
    claims: &[&ClaimView<'_>],
    now: Instant,
    decision: &mut Decision,
) -> Option<Ending> {
    let released = Check::ClaimGone {
        name: h.claim.clone(),
        uid: h.claim_uid.clone(),
    };
    let Some(c) = claims.iter().find(|c| c.claim.uid == h.claim_uid) else {
        decision.check(released);
        return Some(Ending::Released);
    };
    if c.claim.deleting {
        decision.check(released);
        return Some(Ending::Released);
    }
    match &c.pod_problem {
        Some(problem) if *problem != PodProblem::NotSeenYet => {
            check_pod_gone(decision, c);
            let pod = c.claim.pod.as_ref();
            Some(Ending::Revoked(problem.describe(
                &pod.map_or_else(|| h.identity.clone(), |p| p.name.clone()),
            )))
        }
        _ if view.holder_deadline.is_some_and(|d| now >= d) => Some(Ending::Expired),
        _ => c
            .claim
            .status
            .phase
            .filter(|p| p.is_final())
            .map(|phase| Ending::Revoked(messages::already_marked(&c.claim.name, phase))),
    }
}

/// Phase 2: the claims that wait, in grant order: pending, pods alive (or not seen
/// yet), and neither the holder that keeps the grant nor the one whose grant ended.
fn waiting_claims<'v>(
    view: &LeaseView<'_>,
    claims: &[&'v ClaimView<'v>],
    ended_uid: Option<&str>,
    kept_uid: Option<&str>,
) -> Vec<&'v ClaimView<'v>> {
    claims
        .iter()
        .copied()
        .filter(|c| {
            is_waiting(c)
                && !held_a_deleted_lease(view, c)
                && Some(c.claim.uid.as_str()) != ended_uid
                && Some(c.claim.uid.as_str()) != kept_uid
        })
        .collect()
}

/// The claim held a Lease object of this name that is gone: its grant ended with
/// that object, whether or not its `Granted` mirror was ever written.
fn held_a_deleted_lease(view: &LeaseView<'_>, c: &ClaimView<'_>) -> bool {
    view.deleted_holders.contains(&c.claim.uid)
}

/// Phase 3: grants the Lease to the first waiter with the next token (DESIGN rules 3
/// and 5), or frees it when nobody waits or no token is left. Returns the claims
/// still waiting after it, and whether the tokens ran out.
fn hand_over<'w>(
    lease: &Lease,
    waiting: &'w [&'w ClaimView<'w>],
    status: &mut LeaseStatus,
    decision: &mut Decision,
    wall: Timestamp,
) -> (&'w [&'w ClaimView<'w>], Option<TokensExhausted>) {
    let rv = lease.resource_version().unwrap_or_default();
    let (next, token) = match waiting
        .first()
        .map(|next| (next, next_token(status.fencing_token, &rv)))
    {
        Some((next, Ok(token))) => (next, token),
        unable => {
            status.holder = None;
            status.phase = Some(LeasePhase::Free);
            status.acquire_time = None;
            return (waiting, unable.and_then(|(_, t)| t.err()));
        }
    };
    status.holder = Some(Holder {
        claim: next.claim.name.clone(),
        claim_uid: next.claim.uid.clone(),
        identity: next.claim.holder_identity.clone(),
        // What the holder's client will believe (DESIGN "Client deadlines").
        lease_duration_seconds: Some(lease.spec.lease_duration_seconds),
    });
    status.fencing_token = Some(token.token);
    status.grants = Some(status.grants.unwrap_or(0) + 1);
    status.acquire_time = Some(MicroTime(wall));
    status.phase = Some(LeasePhase::Held);
    let (reason, message) = if token.from_resource_version {
        (
            reasons::INTEGER,
            messages::TOKENS_FROM_RESOURCE_VERSION.to_string(),
        )
    } else {
        (reasons::NOT_AN_INTEGER, messages::token_fallback(&rv))
    };
    set_condition(
        &mut status.conditions,
        types::TOKEN_FROM_RESOURCE_VERSION,
        token.from_resource_version,
        reason,
        &message,
        lease.metadata.generation,
        wall,
    );
    decision.granted = Some(NewHolder {
        claim: next.claim.name.clone(),
        identity: next.claim.holder_identity.clone(),
        token: token.token,
    });
    (&waiting[1..], None)
}

/// Phase 4: the Lease's phase, its queue, and its `Held` condition.
fn describe_lease(
    status: &mut LeaseStatus,
    waiters: &[&ClaimView<'_>],
    exhausted: Option<TokensExhausted>,
    generation: Option<i64>,
    wall: Timestamp,
) {
    status.phase = Some(if status.holder.is_some() {
        LeasePhase::Held
    } else {
        LeasePhase::Free
    });
    status.waiting = waiters
        .iter()
        .take(WAITING_LISTED)
        .map(|c| c.claim.name.clone())
        .collect();
    status.waiting_count = Some(waiters.len() as i64);
    status.observed_generation = generation;
    let (held, reason, message) = match (&status.holder, exhausted) {
        (Some(h), _) => (
            true,
            reasons::GRANTED,
            messages::held_by(
                &h.identity,
                &h.claim,
                status.fencing_token.unwrap_or_default(),
            ),
        ),
        // Issue no token rather than repeat or saturate one (DESIGN "Token
        // ceiling"). Nothing was granted, so fencingToken is still the last one issued.
        (None, Some(e)) => (
            false,
            reasons::TOKENS_EXHAUSTED,
            messages::tokens_exhausted(
                status.fencing_token.unwrap_or_default(),
                MAX_TOKEN,
                e.needed,
            ),
        ),
        (None, None) => (false, reasons::FREE, messages::NO_CLAIM_WAITING.to_string()),
    };
    set_condition(
        &mut status.conditions,
        types::HELD,
        held,
        reason,
        &message,
        generation,
        wall,
    );
}

/// Phase 5a: each waiter's place in the queue.
fn mirror_waiters(
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
        push_claim_update(decision, c, s, None);
    }
}

/// Phase 5b: every other claim that is not final yet: the holder's grant, the end of
/// the grant that ended (conditioned on the claim's resourceVersion), a grant that a
/// later one superseded, and a pending claim whose pod is gone.
fn mirror_claims(
    view: &LeaseView<'_>,
    claims: &[&ClaimView<'_>],
    status: &LeaseStatus,
    ended_uid: Option<&str>,
    decision: &mut Decision,
    wall: Timestamp,
) {
    let wrote_lease = decision.lease_status.is_some();
    let holder_uid = status.holder.as_ref().map(|h| h.claim_uid.as_str());
    let lease_token = status.fencing_token;
    for c in claims {
        let uid = c.claim.uid.as_str();
        if c.claim.deleting || c.claim.status.phase.is_some_and(ClaimPhase::is_final) {
            continue;
        }
        if Some(uid) == holder_uid {
            let mut s = c.claim.status.clone();
            if s.phase != Some(ClaimPhase::Granted) {
                s.phase = Some(ClaimPhase::Granted);
                s.fencing_token = lease_token;
                s.grant_time = status.acquire_time.clone();
                s.position = None;
                remove_condition(&mut s.conditions, types::LEASE_NOT_FOUND);
                set_condition(
                    &mut s.conditions,
                    types::GRANTED,
                    true,
                    reasons::GRANTED,
                    &messages::granted(&view.key.name, lease_token.unwrap_or_default()),
                    c.claim.generation,
                    wall,
                );
                push_claim_update(decision, c, s, None);
            }
        } else if Some(uid) == ended_uid {
            let how = decision
                .ended
                .as_ref()
                .expect("ended_uid implies ended")
                .how
                .clone();
            let (phase, message) = match &how {
                Ending::Expired => (ClaimPhase::Expired, messages::NO_RENEWAL.to_string()),
                Ending::Revoked(why) => (ClaimPhase::Revoked, why.clone()),
                Ending::Released => (ClaimPhase::Released, messages::RELEASED.to_string()),
            };
            push_claim_update(
                decision,
                c,
                lost(c, phase, how.reason(), &message, wall),
                Some(c.claim.resource_version.clone()),
            );
        } else if held_a_deleted_lease(view, c) {
            // The Lease it held was deleted (this one is a new object of the name).
            push_claim_update(
                decision,
                c,
                lost(
                    c,
                    ClaimPhase::Revoked,
                    reasons::LEASE_DELETED,
                    messages::LEASE_DELETED,
                    wall,
                ),
                None,
            );
        } else if c.claim.status.phase == Some(ClaimPhase::Granted) {
            // Granted in its mirror, but the Lease names someone else: a later grant superseded it.
            let message = messages::superseded(&view.key.name, lease_token.unwrap_or_default());
            if !wrote_lease {
                decision.check(Check::LeaseUnchanged);
            }
            push_claim_update(
                decision,
                c,
                lost(c, ClaimPhase::Revoked, reasons::SUPERSEDED, &message, wall),
                None,
            );
        } else if is_pending(c)
            && let Some(problem) = &c.pod_problem
            && *problem != PodProblem::NotSeenYet
        {
            let pod = c
                .claim
                .pod
                .as_ref()
                .map(|p| p.name.as_str())
                .unwrap_or_default();
            check_pod_gone(decision, c);
            push_claim_update(
                decision,
                c,
                lost(
                    c,
                    ClaimPhase::Revoked,
                    reasons::POD_GONE,
                    &problem.describe(pod),
                    wall,
                ),
                None,
            );
        }
    }
}

/// A decision that ends a grant because the claim's pod is gone has the writer
/// confirm it (when the claim names a pod).
fn check_pod_gone(decision: &mut Decision, c: &ClaimView<'_>) {
    if let Some(pod) = &c.claim.pod {
        decision.check(Check::PodGone {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        });
    }
}

fn decide_without_lease(
    view: &LeaseView<'_>,
    claims: &[&ClaimView<'_>],
    wall: Timestamp,
) -> Decision {
    let mut decision = Decision::default();
    let mut position = 0;
    for c in claims {
        if c.claim.deleting || c.claim.status.phase.is_some_and(ClaimPhase::is_final) {
            continue;
        }
        let s =
            if c.claim.status.phase == Some(ClaimPhase::Granted) || held_a_deleted_lease(view, c) {
                decision.check(Check::LeaseGone);
                lost(
                    c,
                    ClaimPhase::Revoked,
                    reasons::LEASE_DELETED,
                    messages::LEASE_DELETED,
                    wall,
                )
            } else {
                position += 1;
                let mut s = c.claim.status.clone();
                s.phase = Some(ClaimPhase::Pending);
                s.position = Some(position);
                set_condition(
                    &mut s.conditions,
                    types::LEASE_NOT_FOUND,
                    true,
                    reasons::LEASE_NOT_FOUND,
                    messages::LEASE_NOT_FOUND,
                    c.claim.generation,
                    wall,
                );
                s
            };
        push_claim_update(&mut decision, c, s, None);
    }
    decision
}

fn is_pending(c: &ClaimView<'_>) -> bool {
    !c.claim.deleting && matches!(c.claim.status.phase, None | Some(ClaimPhase::Pending))
}

fn is_waiting(c: &ClaimView<'_>) -> bool {
    is_pending(c) && c.pod_problem.is_none()
}

fn lost(
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

fn push_claim_update(
    decision: &mut Decision,
    c: &ClaimView<'_>,
    mut status: LeaseClaimStatus,
    condition_on: Option<String>,
) {
    status.observed_generation = c.claim.generation;
    if status != c.claim.status {
        decision.claim_updates.push(ClaimUpdate {
            name: c.claim.name.clone(),
            uid: c.claim.uid.clone(),
            status,
            condition_on,
        });
    }
}

/// Sets a condition, keeping its lastTransitionTime unless its status changed.
pub fn set_condition(
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
