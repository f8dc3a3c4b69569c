//! The grant decision: observed state in, desired statuses out. Pure; no I/O.
//!
//! Given one Lease (or its absence), the claims naming it, what their pods say
//! and whether the holder's time ran out, [`decide`] returns a [`Decision`]: the
//! write plan, in the order its steps run (what to confirm first, the ended holder's
//! claim, the Lease status, which is at most one write since grant, handover and
//! free happen together, DESIGN rule 5, and the claims' mirrors), with what it
//! grants and ends for the events. Every rule lives here; the write pass only runs
//! the plan.
//!
//! # FIFO order
//!
//! Claims are granted in `(metadata.creationTimestamp, metadata.name)` order.
//! creationTimestamp has one-second resolution, so claims created within the same
//! second are ordered by name.
//!
//! # Slots
//!
//! A semaphore (`spec.permits` N above 1) runs every rule above per slot: each
//! holder's grant ends (or not) on its own clock and checks, and one write hands
//! every free slot below N to the waiters in that one FIFO queue. A waiter that asks
//! for a slot (`spec.slot`) takes only that one and lets those behind it take the
//! others meanwhile; any other waiter takes the lowest free slot. Slots at or above
//! a lowered N end as revoked (marked first), and are not granted again until N is
//! raised. Tokens: [`crate::permits`], "Tokens per slot".

mod claim_status;

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::index::{ClaimView, HolderView, LeaseView, PodProblem};
use crate::conditions::{messages, reasons, types};
use crate::crd::{
    ClaimPhase, Holder, Lease, LeaseClaimStatus, LeasePhase, LeaseStatus, SlotStatus,
};
use crate::token::{MAX_TOKEN, TokensExhausted, next_token};
use claim_status::{
    check_pod_gone, lost, mirror_claims, mirror_waiters, push_mirror, set_condition,
};

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

/// A claim a decision grants a slot of the Lease to, with its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHolder {
    pub slot: i32,
    pub claim: String,
    pub identity: String,
    pub token: i64,
}

/// A slot's grant that a decision ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub slot: i32,
    pub claim: String,
    pub uid: String,
    pub identity: String,
    pub token: Option<i64>,
    pub how: Ending,
}

/// A claim status to write: the ended holder's mark, or a mirror.
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
    /// `Released`, when a relist left the claim out (a lagging cache may have): the
    /// claim is gone, being deleted, or re-created under another UID.
    ClaimGone { name: String, uid: String },
    /// `PodGone`: the pod is missing, being deleted, replaced (another UID) or terminal.
    PodGone { name: String, uid: Option<String> },
    /// `LeaseDeleted`: no Lease of this name exists.
    LeaseGone,
    /// `Superseded` without a Lease write: the Lease still has the resourceVersion
    /// the decision was computed from.
    LeaseUnchanged,
    /// `Expired`, its mark deferred: the holder's claim (this UID) still shows the
    /// renewal last observed, or is gone. Made in the holder's last sixth, ahead of
    /// the expiry, or at it if the early read did not happen.
    NotRenewed {
        name: String,
        uid: String,
        renew_time: Option<Timestamp>,
        /// The token of the grant it ends, for the index to keep the answer by.
        token: i64,
    },
}

/// A decision is a write plan: its steps are its fields, in the order rule 2 and
/// "Endings are confirmed" (`write_pass`) have them run. The write pass runs them in that
/// order and decides nothing; [`Decision::work`] says which of them are urgent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Decision {
    /// 1. What a quorum read confirms before anything is written (each at most once).
    pub confirm: Vec<Check>,
    /// 1a. Holders that keep their grants, but whose expiry can be confirmed now,
    ///    ahead of it, so that the expiry itself is the Lease write alone.
    pub confirm_expiry_early: Vec<Check>,
    /// 2. The ended holders' claims, marked before the Lease and conditioned on
    ///    their resourceVersions ([`ClaimUpdate::condition_on`]).
    pub end_holder: Vec<ClaimUpdate>,
    /// 3. The new Lease status (compare-and-swap), when it differs from the observed one.
    pub lease_status: Option<LeaseStatus>,
    /// 3a. Once the Lease is written: the expired holders' claims whose marks are
    ///    among the deferred mirrors, for the index to remember how their grants ended.
    pub expired_unmarked: Vec<String>,
    /// 4. Every other claim's status mirror, deferred to a pass of their own.
    pub mirrors: Vec<ClaimUpdate>,
    /// What the Lease write does, for its events and metrics, in slot order.
    pub granted: Vec<NewHolder>,
    pub ended: Vec<Ended>,
}

/// What a decision asks of the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Nothing to write.
    None,
    /// Only claim mirrors: they wait until no Lease is dirty (`queue`, "Storms").
    Mirrors,
    /// A Lease status or an ended holder's claim: written as soon as a slot is free.
    Urgent,
}

impl Decision {
    fn check(&mut self, check: Check) {
        if !self.confirm.contains(&check) {
            self.confirm.push(check);
        }
    }

    pub fn work(&self) -> Work {
        if self.lease_status.is_some()
            || !self.end_holder.is_empty()
            || !self.confirm_expiry_early.is_empty()
        {
            Work::Urgent
        } else if !self.mirrors.is_empty() {
            Work::Mirrors
        } else {
            Work::None
        }
    }

    /// Every claim write, the holder's mark first.
    #[cfg(test)]
    pub fn claim_updates(&self) -> Vec<ClaimUpdate> {
        self.end_holder
            .iter()
            .chain(&self.mirrors)
            .cloned()
            .collect()
    }
}

/// Decides who holds each slot of the Lease, with which token, and who waits. Reads
/// as its phases: how the current grants end (if they do), who waits, the handover,
/// what the Lease status says, and the claims' mirrors.
pub fn decide(view: &LeaseView<'_>, now: Instant, wall: Timestamp) -> Decision {
    let claims = in_fifo_order(view);
    let Some(lease) = view.lease else {
        return decide_without_lease(view, &claims, wall);
    };
    let observed = lease.status.clone().unwrap_or_default();
    let generation = lease.metadata.generation;
    let mut decision = Decision::default();

    // 1. Does each holder keep its slot?
    let mut rows = observed.slot_rows();
    let mut kept = Vec::new();
    for row in &mut rows {
        let Some(h) = row.holder.as_ref() else {
            continue;
        };
        // A slot above `permits` ends as a revocation, marked first, so its holder's
        // claim must be in view; one that is not is judged as a holder whose claim is
        // missing (released, once a quorum read shows it gone; else no write).
        let in_view = claims.iter().any(|c| c.claim.uid == h.claim_uid);
        let ending = if row.slot >= lease.spec.permits && in_view {
            let why = messages::permits_lowered(row.slot, lease.spec.permits);
            Some(Ending::Revoked(why))
        } else {
            let clock = view.holder(&h.claim_uid);
            holder_ending(clock, row, &claims, now, &mut decision)
        };
        match ending {
            None => kept.push(h.claim_uid.clone()),
            Some(how) => {
                decision.ended.push(Ended {
                    slot: row.slot,
                    claim: h.claim.clone(),
                    uid: h.claim_uid.clone(),
                    identity: h.identity.clone(),
                    token: row.fencing_token,
                    how,
                });
                row.holder = None;
                row.acquire_time = None;
            }
        }
    }

    // 2. Who waits: pending claims whose pods (if any) are alive, in FIFO order.
    let waiting = waiting_claims(view, &claims, &decision.ended, &kept);

    // 3. Hand the free slots over in the same write (DESIGN rule 5).
    let mut status = observed.clone();
    let (waiters, exhausted) =
        hand_over(lease, &waiting, &mut rows, &mut status, &mut decision, wall);
    status.set_slot_rows(rows, lease.spec.permits);

    // 4. The phase, the queue and the Held condition.
    describe_lease(&mut status, &waiters, exhausted, generation, wall);
    if status != observed {
        decision.lease_status = Some(status.clone());
    }

    // 5. Claim mirrors, written after the Lease.
    mirror_waiters(view, &waiters, &mut decision, wall);
    mirror_claims(view, &claims, &status, &mut decision, wall);

    decision
}

/// The claims in grant order (module docs, "FIFO order").
fn in_fifo_order<'v>(view: &'v LeaseView<'v>) -> Vec<&'v ClaimView<'v>> {
    let mut claims: Vec<&ClaimView<'_>> = view.claims.iter().collect();
    claims.sort_by(|a, b| (a.claim.created, &a.claim.name).cmp(&(b.claim.created, &b.claim.name)));
    claims
}

/// Phase 1: why the grant of a slot (`row`, with its holder's clock) ends now, if
/// it does, with the facts the writer must confirm first ([`Check`]).
fn holder_ending(
    clock: Option<&HolderView>,
    row: &SlotStatus,
    claims: &[&ClaimView<'_>],
    now: Instant,
    decision: &mut Decision,
) -> Option<Ending> {
    let h = row.holder.as_ref()?;
    let released = Check::ClaimGone {
        name: h.claim.clone(),
        uid: h.claim_uid.clone(),
    };
    // A deletion seen as such (a watch event, a deletion mark) is final for that UID,
    // whichever cache showed it; an absence after a relist may be a lagging cache's
    // view, which a quorum read confirms.
    let Some(c) = claims.iter().find(|c| c.claim.uid == h.claim_uid) else {
        if !clock.is_some_and(|k| k.deleted) {
            decision.check(released);
        }
        return Some(Ending::Released);
    };
    if c.claim.deleting {
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
        _ if clock.and_then(|k| k.deadline).is_some_and(|d| now >= d) => {
            if !marks_first(clock, &Ending::Expired) && !clock.is_some_and(|k| k.expiry_confirmed) {
                decision.check(not_renewed(row, c));
            }
            Some(Ending::Expired)
        }
        _ => {
            let marked = c.claim.status.phase.filter(|p| p.is_final());
            let check_due = clock
                .and_then(|k| k.expiry_check_at)
                .is_some_and(|at| now >= at);
            if marked.is_none() && check_due {
                decision.confirm_expiry_early.push(not_renewed(row, c));
            }
            marked.map(|phase| Ending::Revoked(messages::already_marked(&c.claim.name, phase)))
        }
    }
}

/// The quorum read that confirms the slot holder's claim `c` was not renewed since
/// the index last observed it.
fn not_renewed(row: &SlotStatus, c: &ClaimView<'_>) -> Check {
    Check::NotRenewed {
        name: c.claim.name.clone(),
        uid: c.claim.uid.clone(),
        renew_time: c.claim.renew_time,
        token: row.fencing_token.unwrap_or_default(),
    }
}

/// Whether the ended holder's claim is marked before the Lease is handed on
/// (`write_pass`, "Endings are confirmed"): always, except an expiry whose holder's
/// claim shows a renewal of this grant (`index::holder`, "Expiry is one write"). That holder's client has counted
/// its first renewal or given up, so a renewal landing after the quorum read comes
/// after its local deadline and counts for nothing; the claim's `Expired` is then an
/// ordinary deferred mirror, and the Lease the one urgent write.
pub(super) fn marks_first(clock: Option<&HolderView>, how: &Ending) -> bool {
    !(*how == Ending::Expired && clock.is_some_and(|k| k.renewed))
}

/// Phase 2: the claims that wait, in grant order: pending, pods alive (or not seen
/// yet), never granted before, and neither the holder that keeps the grant nor the
/// one whose grant ended.
fn waiting_claims<'v>(
    view: &LeaseView<'_>,
    claims: &[&'v ClaimView<'v>],
    ended: &[Ended],
    kept: &[String],
) -> Vec<&'v ClaimView<'v>> {
    claims
        .iter()
        .copied()
        .filter(|c| {
            is_waiting(c)
                && !held_a_deleted_lease(view, c)
                && !renewed_a_grant(c)
                && !ended.iter().any(|e| e.uid == c.claim.uid)
                && !kept.contains(&c.claim.uid)
        })
        .collect()
}

/// The claim held a Lease object of this name that is gone: its grant ended with
/// that object, whether or not its `Granted` mirror was ever written.
fn held_a_deleted_lease(view: &LeaseView<'_>, c: &ClaimView<'_>) -> bool {
    view.deleted_holders.contains(&c.claim.uid)
}

/// Phase 3: grants every free slot below `spec.permits` to the waiters in FIFO order
/// (module docs, "Slots"), all with the next token (DESIGN rules 3 and 5;
/// [`crate::permits`]), or none when no token is left. Returns the claims still
/// waiting after it, and whether the tokens ran out.
fn hand_over<'w>(
    lease: &Lease,
    waiting: &[&'w ClaimView<'w>],
    rows: &mut Vec<SlotStatus>,
    status: &mut LeaseStatus,
    decision: &mut Decision,
    wall: Timestamp,
) -> (Vec<&'w ClaimView<'w>>, Option<TokensExhausted>) {
    let mut free: Vec<i32> = (0..lease.spec.permits)
        .filter(|slot| !rows.iter().any(|r| r.slot == *slot && r.holder.is_some()))
        .collect();
    let mut waiters = Vec::new();
    let mut grants = Vec::new();
    for &c in waiting {
        let slot = match c.claim.slot {
            Some(wanted) => free.iter().position(|s| *s == wanted),
            None => (!free.is_empty()).then_some(0),
        };
        match slot {
            Some(i) => grants.push((free.remove(i), c)),
            None => waiters.push(c),
        }
    }
    if grants.is_empty() {
        return (waiters, None);
    }
    let rv = lease.resource_version().unwrap_or_default();
    let token = match next_token(status.highest_token(), &rv) {
        Ok(token) => token,
        Err(exhausted) => return (waiting.to_vec(), Some(exhausted)),
    };
    for (slot, next) in grants {
        let row = SlotStatus {
            slot,
            holder: Some(Holder {
                claim: next.claim.name.clone(),
                claim_uid: next.claim.uid.clone(),
                identity: next.claim.holder_identity.clone(),
                // What the holder's client will believe (DESIGN.md, "Client deadlines").
                lease_duration_seconds: Some(lease.spec.lease_duration_seconds),
            }),
            fencing_token: Some(token.token),
            acquire_time: Some(MicroTime(wall)),
        };
        match rows.iter_mut().find(|r| r.slot == slot) {
            Some(existing) => *existing = row,
            None => rows.push(row),
        }
        decision.granted.push(NewHolder {
            slot,
            claim: next.claim.name.clone(),
            identity: next.claim.holder_identity.clone(),
            token: token.token,
        });
    }
    rows.sort_by_key(|r| r.slot);
    status.grants = Some(status.grants.unwrap_or(0) + decision.granted.len() as i64);
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
    (waiters, None)
}

/// Phase 4: the Lease's phase, its queue, and its `Held` condition.
fn describe_lease(
    status: &mut LeaseStatus,
    waiters: &[&ClaimView<'_>],
    exhausted: Option<TokensExhausted>,
    generation: Option<i64>,
    wall: Timestamp,
) {
    let held = status.held_count();
    status.phase = Some(if held > 0 {
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
    let (held, reason, message) = match (&status.holder, &status.held, exhausted) {
        (_, Some(permits), _) if held > 0 => {
            (true, reasons::GRANTED, messages::permits_held(permits))
        }
        (Some(h), None, _) => (
            true,
            reasons::GRANTED,
            messages::held_by(
                &h.identity,
                &h.claim,
                status.fencing_token.unwrap_or_default(),
            ),
        ),
        // Issue no token rather than repeat or saturate one (`token`, "Token
        // ceiling"). Nothing was granted, so the tokens are still the last ones issued.
        (_, _, Some(e)) => (
            false,
            reasons::TOKENS_EXHAUSTED,
            messages::tokens_exhausted(
                status.highest_token().unwrap_or_default(),
                MAX_TOKEN,
                e.needed,
            ),
        ),
        _ => (false, reasons::FREE, messages::NO_CLAIM_WAITING.to_string()),
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
        push_mirror(&mut decision, c, s);
    }
    decision
}

/// The claim's client renewed a grant of it (`palisade.dev/renewed-token`), so it
/// was granted once, whatever its status says: an expiry that defers the holder's
/// mark ("Expiry is one write") may leave it `Pending` when its `Granted` mirror
/// never landed, and a controller elected since has no memory of the grant. The
/// annotation is on the claim itself, so every controller reads the same answer: a
/// claim that has lost its grant never gets it back (rule 2).
fn renewed_a_grant(c: &ClaimView<'_>) -> bool {
    c.claim.renewed_token.is_some()
}

fn is_pending(c: &ClaimView<'_>) -> bool {
    !c.claim.deleting && matches!(c.claim.status.phase, None | Some(ClaimPhase::Pending))
}

fn is_waiting(c: &ClaimView<'_>) -> bool {
    is_pending(c) && c.pod_problem.is_none()
}
