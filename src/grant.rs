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

use crate::api::{ClaimPhase, Holder, LeaseClaimStatus, LeasePhase, LeaseStatus};
use crate::index::{ClaimView, LeaseView, PodProblem};
use crate::token::{MAX_TOKEN, next_token};

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
            Ending::Released => "Released",
            Ending::Expired => "Expired",
            Ending::Revoked(_) => "Revoked",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
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
    pub granted: Option<Grant>,
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

/// Decides who holds the Lease, with which token, and who waits.
pub fn decide(view: &LeaseView<'_>, now: Instant, wall: Timestamp) -> Decision {
    let mut claims: Vec<&ClaimView<'_>> = view.claims.iter().collect();
    claims.sort_by(|a, b| (a.claim.created, &a.claim.name).cmp(&(b.claim.created, &b.claim.name)));

    let Some(lease) = view.lease else {
        return decide_without_lease(&claims, wall);
    };
    let observed = lease.status.clone().unwrap_or_default();
    let generation = lease.metadata.generation;
    let mut status = observed.clone();
    let mut decision = Decision::default();

    // 1. Does the current holder keep the lease?
    let holder = observed.holder.as_ref();
    let holder_claim = holder.and_then(|h| claims.iter().find(|c| c.claim.uid == h.claim_uid));
    let released = |h: &Holder| Check::ClaimGone {
        name: h.claim.clone(),
        uid: h.claim_uid.clone(),
    };
    let ending = match (holder, holder_claim) {
        (None, _) => None,
        (Some(h), None) => {
            decision.check(released(h));
            Some(Ending::Released)
        }
        (Some(h), Some(c)) if c.claim.deleting => {
            decision.check(released(h));
            Some(Ending::Released)
        }
        (Some(h), Some(c)) => match &c.pod_problem {
            Some(problem) if *problem != PodProblem::NotSeenYet => {
                let pod = c.claim.pod.as_ref();
                if let Some(pod) = pod {
                    decision.check(Check::PodGone {
                        name: pod.name.clone(),
                        uid: pod.uid.clone(),
                    });
                }
                Some(Ending::Revoked(
                    problem.describe(
                        &pod.map(|p| p.name.clone())
                            .unwrap_or_else(|| h.identity.clone()),
                    ),
                ))
            }
            _ if view.holder_deadline.is_some_and(|d| now >= d) => Some(Ending::Expired),
            _ if c.claim.status.phase.is_some_and(ClaimPhase::is_final) => {
                Some(Ending::Revoked(format!(
                    "claim {} was already marked {:?}",
                    c.claim.name,
                    c.claim.status.phase.unwrap()
                )))
            }
            _ => None,
        },
    };
    if let (Some(h), Some(how)) = (holder, &ending) {
        decision.ended = Some(Ended {
            claim: h.claim.clone(),
            identity: h.identity.clone(),
            token: observed.fencing_token,
            how: how.clone(),
        });
    }
    let ended_uid = ending.as_ref().and(holder).map(|h| h.claim_uid.as_str());
    let kept_uid = if ending.is_none() {
        holder.map(|h| h.claim_uid.as_str())
    } else {
        None
    };

    // 2. Who waits: pending claims whose pods (if any) are alive, in FIFO order.
    let waiting: Vec<&ClaimView<'_>> = claims
        .iter()
        .copied()
        .filter(|c| {
            is_waiting(c)
                && Some(c.claim.uid.as_str()) != ended_uid
                && Some(c.claim.uid.as_str()) != kept_uid
        })
        .collect();

    // 3. Hand over in the same write.
    let mut waiters = waiting.as_slice();
    let mut exhausted = None;
    let rv = lease.resource_version().unwrap_or_default();
    let next = match waiting.first() {
        Some(next) if kept_uid.is_none() => match next_token(observed.fencing_token, &rv) {
            Ok(token) => Some((next, token)),
            Err(e) => {
                exhausted = Some(e);
                None
            }
        },
        _ => None,
    };
    if kept_uid.is_none() {
        if let Some((next, next_token)) = next {
            let rest = &waiting[1..];
            status.holder = Some(Holder {
                claim: next.claim.name.clone(),
                claim_uid: next.claim.uid.clone(),
                identity: next.claim.holder_identity.clone(),
                // What the holder's client will believe (DESIGN "Client deadlines").
                lease_duration_seconds: Some(lease.spec.lease_duration_seconds),
            });
            status.fencing_token = Some(next_token.token);
            status.grants = Some(observed.grants.unwrap_or(0) + 1);
            status.acquire_time = Some(MicroTime(wall));
            status.phase = Some(LeasePhase::Held);
            set_condition(
                &mut status.conditions,
                "TokenFromResourceVersion",
                next_token.from_resource_version,
                if next_token.from_resource_version {
                    "Integer"
                } else {
                    "NotAnInteger"
                },
                &if next_token.from_resource_version {
                    "tokens are derived from the Lease resourceVersion".to_string()
                } else {
                    format!(
                        "resourceVersion {rv:?} is not an integer: token fell back to fencingToken + 1"
                    )
                },
                generation,
                wall,
            );
            decision.granted = Some(Grant {
                claim: next.claim.name.clone(),
                identity: next.claim.holder_identity.clone(),
                token: next_token.token,
            });
            waiters = rest;
        } else {
            status.holder = None;
            status.phase = Some(LeasePhase::Free);
            status.acquire_time = None;
        }
    }
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
    let (held, reason, message) = match &status.holder {
        Some(h) => (
            true,
            "Granted",
            format!(
                "held by {} (claim {}) with fencing token {}",
                h.identity,
                h.claim,
                status.fencing_token.unwrap_or_default()
            ),
        ),
        None => match exhausted {
            // Issue no token rather than repeat or saturate one (DESIGN "Decisions": token edges).
            Some(e) => (
                false,
                "TokensExhausted",
                format!(
                    "not granted: fencingToken {} leaves no higher token up to {} (the next \
                     would be {}); delete and re-create the Lease to start over above its \
                     resourceVersion, knowing that fenced resources which admitted token {} \
                     refuse every lower one",
                    observed.fencing_token.unwrap_or_default(),
                    MAX_TOKEN,
                    e.needed,
                    observed.fencing_token.unwrap_or_default(),
                ),
            ),
            None => (false, "Free", "no claim is waiting".to_string()),
        },
    };
    set_condition(
        &mut status.conditions,
        "Held",
        held,
        reason,
        &message,
        generation,
        wall,
    );
    if status != observed {
        decision.lease_status = Some(status.clone());
    }
    let wrote_lease = decision.lease_status.is_some();

    // 4. Claim mirrors, written after the Lease.
    let holder_uid = status.holder.as_ref().map(|h| h.claim_uid.as_str());
    let lease_token = status.fencing_token;
    for (position, c) in waiters.iter().enumerate() {
        let mut s = c.claim.status.clone();
        s.phase = Some(ClaimPhase::Pending);
        s.position = Some(position as i64 + 1);
        remove_condition(&mut s.conditions, "LeaseNotFound");
        set_condition(
            &mut s.conditions,
            "Granted",
            false,
            "Waiting",
            &format!(
                "waiting for lease {} at position {}",
                view.key.name,
                position + 1
            ),
            c.claim.generation,
            wall,
        );
        push_claim_update(&mut decision, c, s, None);
    }
    for c in &claims {
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
                remove_condition(&mut s.conditions, "LeaseNotFound");
                set_condition(
                    &mut s.conditions,
                    "Granted",
                    true,
                    "Granted",
                    &format!(
                        "granted lease {} with fencing token {}",
                        view.key.name,
                        lease_token.unwrap_or_default()
                    ),
                    c.claim.generation,
                    wall,
                );
                push_claim_update(&mut decision, c, s, None);
            }
        } else if Some(uid) == ended_uid {
            let how = decision
                .ended
                .as_ref()
                .expect("ended_uid implies ended")
                .how
                .clone();
            let (phase, message) = match &how {
                Ending::Expired => (
                    ClaimPhase::Expired,
                    "no renewal observed within the lease duration".to_string(),
                ),
                Ending::Revoked(why) => (ClaimPhase::Revoked, why.clone()),
                Ending::Released => (ClaimPhase::Released, "released".to_string()),
            };
            push_claim_update(
                &mut decision,
                c,
                lost(c, phase, how.reason(), &message, wall),
                Some(c.claim.resource_version.clone()),
            );
        } else if c.claim.status.phase == Some(ClaimPhase::Granted) {
            // Granted in its mirror, but the Lease names someone else: a later grant superseded it.
            let message = format!(
                "lease {} is held by another claim (fencing token {})",
                view.key.name,
                lease_token.unwrap_or_default()
            );
            if !wrote_lease {
                decision.check(Check::LeaseUnchanged);
            }
            push_claim_update(
                &mut decision,
                c,
                lost(c, ClaimPhase::Revoked, "Superseded", &message, wall),
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
            if let Some(p) = &c.claim.pod {
                decision.check(Check::PodGone {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                });
            }
            push_claim_update(
                &mut decision,
                c,
                lost(
                    c,
                    ClaimPhase::Revoked,
                    "PodGone",
                    &problem.describe(pod),
                    wall,
                ),
                None,
            );
        }
    }

    decision
}

fn decide_without_lease(claims: &[&ClaimView<'_>], wall: Timestamp) -> Decision {
    let mut decision = Decision::default();
    let mut position = 0;
    for c in claims {
        if c.claim.deleting || c.claim.status.phase.is_some_and(ClaimPhase::is_final) {
            continue;
        }
        let s = if c.claim.status.phase == Some(ClaimPhase::Granted) {
            decision.check(Check::LeaseGone);
            lost(
                c,
                ClaimPhase::Revoked,
                "LeaseDeleted",
                "the Lease was deleted",
                wall,
            )
        } else {
            position += 1;
            let mut s = c.claim.status.clone();
            s.phase = Some(ClaimPhase::Pending);
            s.position = Some(position);
            set_condition(
                &mut s.conditions,
                "LeaseNotFound",
                true,
                "LeaseNotFound",
                "the Lease named in spec.leaseName does not exist (yet); the claim waits for it",
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
        "Granted",
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
