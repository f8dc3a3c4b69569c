//! Every condition type, reason and message palisade writes or reports, in one place.
//!
//! The grant decision (`controller::grant`) writes them into `Lease.status.conditions`
//! and `LeaseClaim.status.conditions`; the controller repeats them in Events and logs;
//! the client library words why a grant was lost ([`crate::client::LostReason`]) next
//! to what the controller wrote. A *type* or *reason* is a CamelCase word that users
//! match on (`kubectl wait --for=condition=Held`, alerts, scripts): change one only
//! together with DESIGN.md. A *message* is for people and may say more.

/// Condition types.
pub mod types {
    /// Lease: True while the Lease has a holder; its reason says why (not).
    pub const HELD: &str = "Held";
    /// Lease: whether the last token came from the resourceVersion (DESIGN rule 3).
    pub const TOKEN_FROM_RESOURCE_VERSION: &str = "TokenFromResourceVersion";
    /// LeaseClaim: True while the claim holds the Lease; its reason says why not.
    pub const GRANTED: &str = "Granted";
    /// LeaseClaim: the Lease named in `spec.leaseName` does not exist (yet).
    pub const LEASE_NOT_FOUND: &str = "LeaseNotFound";
}

/// Condition and Event reasons.
pub mod reasons {
    /// Lease `Held` True; claim `Granted` True; the Event of a grant.
    pub const GRANTED: &str = "Granted";
    /// Lease `Held` False: no claim is waiting.
    pub const FREE: &str = "Free";
    /// Lease `Held` False: no higher token fits (`crate::token`, "Token ceiling").
    pub const TOKENS_EXHAUSTED: &str = "TokensExhausted";
    /// Lease `TokenFromResourceVersion` True.
    pub const INTEGER: &str = "Integer";
    /// Lease `TokenFromResourceVersion` False: the token fell back to `fencingToken + 1`.
    pub const NOT_AN_INTEGER: &str = "NotAnInteger";
    /// Claim `Granted` False while the claim waits in the queue.
    pub const WAITING: &str = "Waiting";
    /// Claim `LeaseNotFound` True.
    pub const LEASE_NOT_FOUND: &str = "LeaseNotFound";

    // How a grant ends: the claim's `Granted` reason, the Event's reason and the log's
    // `reason` field (see [`crate::controller::grant::Ending`]).
    /// The holder deleted its claim.
    pub const RELEASED: &str = "Released";
    /// No renewal observed within the lease duration.
    pub const EXPIRED: &str = "Expired";
    /// The holder's pod is gone or terminal, or its claim was already marked ended.
    pub const REVOKED: &str = "Revoked";

    // Why a claim that is not the holder's is marked ended.
    /// Granted in the claim's mirror, but the Lease names another holder.
    pub const SUPERSEDED: &str = "Superseded";
    /// A pending claim's pod is gone or terminal: it is never granted.
    pub const POD_GONE: &str = "PodGone";
    /// The Lease that granted the claim was deleted.
    pub const LEASE_DELETED: &str = "LeaseDeleted";

    /// The Event on a watched object the controller cannot read.
    pub const INVALID_OBJECT: &str = "InvalidObject";
}

/// Condition and Event messages.
pub mod messages {
    /// Lease `Held` False, reason `Free`.
    pub const NO_CLAIM_WAITING: &str = "no claim is waiting";
    /// Lease `TokenFromResourceVersion` True.
    pub const TOKENS_FROM_RESOURCE_VERSION: &str =
        "tokens are derived from the Lease resourceVersion";
    /// Claim `LeaseNotFound` True.
    pub const LEASE_NOT_FOUND: &str =
        "the Lease named in spec.leaseName does not exist (yet); the claim waits for it";
    /// Why an `Expired` grant ended: the claim's message and the Event's.
    pub const NO_RENEWAL: &str = "no renewal observed within the lease duration";
    /// Claim `Granted` False, reason `Released`.
    pub const RELEASED: &str = "released";
    /// Why a `Released` grant ended, in its Event.
    pub const CLAIM_DELETED: &str = "claim deleted";
    /// Claim `Granted` False, reason `LeaseDeleted`; also the client's
    /// [`LostReason::LeaseDeleted`](crate::client::LostReason::LeaseDeleted).
    pub const LEASE_DELETED: &str = "the Lease was deleted";

    /// Lease `TokenFromResourceVersion` False.
    pub fn token_fallback(resource_version: &str) -> String {
        format!(
            "resourceVersion {resource_version:?} is not an integer: token fell back to fencingToken + 1"
        )
    }

    /// Lease `Held` True.
    pub fn held_by(identity: &str, claim: &str, token: i64) -> String {
        format!("held by {identity} (claim {claim}) with fencing token {token}")
    }

    /// Lease `Held` True on a semaphore: `held` is `status.held`, e.g. `2/3`.
    pub fn permits_held(held: &str) -> String {
        format!("{held} permits held (status.slots has each slot's holder and token)")
    }

    /// Why a holder of a slot at or above a lowered `spec.permits` is `Revoked`.
    pub fn permits_lowered(slot: i32, permits: i32) -> String {
        format!("spec.permits was lowered to {permits}: slot {slot} no longer exists")
    }

    /// Lease `Held` False, reason `TokensExhausted`.
    pub fn tokens_exhausted(last: i64, max: i64, needed: i64) -> String {
        format!(
            "not granted: fencingToken {last} leaves no higher token up to {max} (the next \
             would be {needed}); delete and re-create the Lease to start over above its \
             resourceVersion, knowing that fenced resources which admitted token {last} \
             refuse every lower one"
        )
    }

    /// Claim `Granted` False, reason `Waiting`.
    pub fn waiting(lease: &str, position: usize) -> String {
        format!("waiting for lease {lease} at position {position}")
    }

    /// Claim `Granted` True.
    pub fn granted(lease: &str, token: i64) -> String {
        format!("granted lease {lease} with fencing token {token}")
    }

    /// Claim `Granted` True on a semaphore.
    pub fn granted_slot(lease: &str, slot: i32, token: i64) -> String {
        format!("granted slot {slot} of lease {lease} with fencing token {token}")
    }

    /// Claim `Granted` False, reason `Superseded`.
    pub fn superseded(lease: &str, token: i64) -> String {
        format!("lease {lease} is held by another claim (fencing token {token})")
    }

    /// Why a holder whose claim already shows a final phase is `Revoked`.
    pub fn already_marked(claim: &str, phase: impl std::fmt::Debug) -> String {
        format!("claim {claim} was already marked {phase:?}")
    }

    // Why a claim's pod counts as gone (reason `Revoked` for the holder, `PodGone` for
    // a pending claim); see [`crate::controller::index::PodProblem`].
    pub fn pod_not_seen(pod: &str) -> String {
        format!("pod {pod} has not been seen yet")
    }
    pub fn pod_deleted(pod: &str) -> String {
        format!("pod {pod} was deleted")
    }
    pub fn pod_replaced(pod: &str) -> String {
        format!("pod {pod} was replaced by another pod with a different UID")
    }
    pub fn pod_terminal(pod: &str, phase: &str) -> String {
        format!("pod {pod} is {phase}")
    }

    /// The Event of a grant.
    /// `slot` on a semaphore.
    pub fn granted_event(identity: &str, claim: &str, slot: Option<i32>, token: i64) -> String {
        match slot {
            Some(slot) => format!(
                "slot {slot} granted to {identity} (claim {claim}) with fencing token {token}"
            ),
            None => format!("granted to {identity} (claim {claim}) with fencing token {token}"),
        }
    }

    /// The Event of a grant's end; `why` is the claim's message or [`CLAIM_DELETED`].
    /// `slot` on a semaphore.
    pub fn ended_event(
        lease: &str,
        identity: &str,
        slot: Option<i32>,
        token: i64,
        why: &str,
    ) -> String {
        match slot {
            Some(slot) => {
                format!("grant of {lease} slot {slot} to {identity} (token {token}) ended: {why}")
            }
            None => format!("grant of {lease} to {identity} (token {token}) ended: {why}"),
        }
    }

    /// The Event on an object the controller cannot read.
    pub fn invalid_object(error: impl std::fmt::Display) -> String {
        format!("palisade cannot read this object and ignores it: {error}")
    }
}

/// How the client library words a lost grant ([`crate::client::LostReason`]).
pub mod lost {
    /// Claim phase `Revoked`.
    pub const REVOKED: &str = "revoked by the controller";
    /// Claim phase `Expired` (the controller's message is [`super::messages::NO_RENEWAL`]).
    pub const EXPIRED: &str = "expired: the controller observed no renewal in time";
    /// `Lease.status` names another holder, or none.
    pub const SUPERSEDED: &str = "the Lease no longer names this claim as its holder";
    /// The Lease is gone: the controller's words for it.
    pub const LEASE_DELETED: &str = super::messages::LEASE_DELETED;
    pub const CLAIM_DELETED: &str = "the claim was deleted";
    /// This process gave up on its own clock.
    pub const LOCAL_DEADLINE: &str = "no renewal succeeded before the local renewal deadline";
}
