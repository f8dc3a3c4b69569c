//! The holder's clock (DESIGN.md rule 4): when its grant expires, whether its claim
//! shows a renewal of this grant, and whether a quorum read confirmed its expiry
//! ahead of it. A semaphore's holders (one per slot) each have a clock of their own,
//! by the same rules, against their slot's token.
//!
//! # Expiry is one write
//!
//! Each renewal of the client library sets the annotation `palisade.dev/renewed-token`
//! on its claim to the token of the grant it renews (it knows the token only once it
//! has seen the grant). An expiry whose holder's claim shows the Lease's current
//! token there is confirmed by a quorum read of the claim instead of the conditional
//! mark: if the claim (same UID) shows another `renewTime`, a renewal landed that the
//! watch has not delivered, the read corrects the index and the grant is kept;
//! otherwise the Lease is handed on and the claim's `Expired` is an ordinary deferred
//! mirror. One write (the Lease) is on the critical path instead of two, which is
//! what a storm of expiries is limited by. A claim without the annotation (its
//! client's first renewal has not landed, or a client of an earlier version) is
//! marked first.
//!
//! **Why it is safe.** The annotation says the client's first renewal of this grant
//! has landed, so the client counted it or gave up for good. From then on a renewal
//! counts only if its response arrives before the client's local deadline, two
//! thirds of a duration after the *send* of the last one that counted. That renewal
//! landed before the quorum read (the read shows its `renewTime`, or a later one), so
//! the controller observed it no earlier than it was sent and expires a full
//! duration after that observation (after a restart or failover, a full duration
//! after first seeing it): any renewal landing after the read answers at least a
//! third of a duration past the client's deadline and counts for nothing, whether
//! the Lease write has landed yet or not. The first renewal is different: after a
//! watch replayed a grant long since ended, it counts whenever it comes if the claim
//! does not show the end, which is why a claim without the annotation is marked
//! first. An annotation and not a spec field: controllers and clients of earlier
//! versions refuse claims with unknown spec fields, and a chart upgrade rolls the
//! controller and the clients at different times; an annotation passes through both.
//!
//! **The read comes ahead of the expiry.** The argument needs the read only to come
//! after the client's deadline: the controller makes it in the holder's last sixth
//! (five sixths of a duration after the observed renewal), as a pass of its own, and
//! the index keeps what it found (claim UID, `renewTime`, token) for as long as the
//! index shows the same three. The expiry itself is then the Lease write alone; a
//! renewal the watch delivers after the read restarts the holder's clock and voids
//! the read, and an expiry whose early read did not happen (a controller that
//! started late, a read that failed) reads at the expiry. The read stays a sixth of
//! a duration past the client's deadline, so a client clock that runs up to a fifth
//! slow against the controller's still gives up before it; a read made before that
//! deadline could confirm a holder whose next renewal still counts, which the model
//! test `a_renewal_before_the_early_read_keeps_the_grant` shows with the read moved
//! to half a duration. Cost: the same one GET per expiry, off the critical path; in
//! a storm the reads of Leases that expire together run in the sixth before them.
//!
//! The index remembers which claims it expired without a mark, so their deferred
//! mirror says `Expired` rather than `Revoked`/`Superseded`. A claim whose `Granted`
//! mirror never landed still says `Pending` when its grant expires this way, so the
//! annotation also keeps it out of the queue: a claim that shows a renewed token and
//! is not the holder was granted once and never waits again (rule 2), and its mirror
//! says `Expired` once the Lease's token is at least the renewed one (otherwise our
//! copy of the Lease is behind). The rule reads only the claim, so a leader elected
//! since the expiry applies it too.
//!
//! **Tested.** The model test (`controller::model_tests`) runs clients by the
//! library's rule (the first renewal of a grant counts whenever it comes; a renewal
//! that does not count ends the belief), lands renewals between a pass's quorum read
//! and its writes, and reports a renewal that counts while the Lease names another
//! holder, and an unmarked hand-on within a duration of the holder's last renewal
//! that counted. Its server enforces the CRD's transition rules on claim status, as
//! the API server does: without them, a stale controller's deferred `Pending` over a
//! `Revoked` let a revoked holder's renewal count in the model, which the real server
//! refuses. The chaos suite's timing-contract check is the same rule on real clients.

use std::time::{Duration, Instant};

use super::entries::LeaseEntry;
use crate::crd::{MAX_LEASE_DURATION_SECONDS, SlotStatus};

/// A holder (the claim of one slot's grant) expires a lease duration after the
/// later of: when the index first saw it hold the lease (so a restarted controller
/// gives it a fresh full duration), and its last observed renewal. The duration is
/// the longer of `leaseDurationSeconds` now and the one the grant was made with
/// (`holder.leaseDurationSeconds`): the holder's client keeps the latter, so a
/// shortened spec must not cut its grant short, while a lengthened one may extend it
/// on this side only. Returns that instant of last sight and the duration.
pub(super) fn holder_clock(entry: &LeaseEntry, row: &SlotStatus) -> Option<(Instant, Duration)> {
    let lease = entry.lease.as_ref()?;
    let holder = row.holder.as_ref()?;
    let uid = &holder.claim_uid;
    let (_, since) = entry.holders_since.iter().find(|(u, _)| u == uid)?;
    let claim = entry.claims.iter().find(|c| &c.uid == uid);
    let last_seen_alive = claim.map_or(*since, |c| c.renew_observed_at.max(*since));
    let seconds = lease
        .spec
        .lease_duration_seconds
        .max(holder.lease_duration_seconds.unwrap_or(0))
        .clamp(1, MAX_LEASE_DURATION_SECONDS);
    Some((last_seen_alive, Duration::from_secs(seconds as u64)))
}

/// Whether an early quorum read confirmed the slot holder's claim as the index
/// shows it, under the slot's current token.
pub(super) fn expiry_confirmed(entry: &LeaseEntry, row: &SlotStatus) -> bool {
    let Some(holder) = &row.holder else {
        return false;
    };
    entry.expiries_confirmed.iter().any(|confirmed| {
        holder.claim_uid == confirmed.uid
            && row.fencing_token == Some(confirmed.token)
            && entry
                .claims
                .iter()
                .any(|c| c.uid == confirmed.uid && c.renew_time == confirmed.renew_time)
    })
}

/// Whether the slot holder's claim shows a renewal of the slot's current grant.
pub(super) fn holder_renewed(entry: &LeaseEntry, row: &SlotStatus) -> bool {
    let (Some(holder), Some(token)) = (&row.holder, row.fencing_token) else {
        return false;
    };
    entry
        .claims
        .iter()
        .any(|c| c.uid == holder.claim_uid && c.renewed_token == Some(token))
}
