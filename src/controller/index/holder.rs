//! The holder's clock (DESIGN rule 4): when its grant expires, whether its claim
//! shows a renewal of this grant, and whether a quorum read confirmed its expiry
//! ahead of it ("Expiry is one write").

use std::time::{Duration, Instant};

use super::entries::LeaseEntry;
use crate::api::MAX_LEASE_DURATION_SECONDS;

/// The holder expires a lease duration after the later of: when the index
/// first saw it hold the lease (so a restarted controller gives it a fresh full
/// duration), and its last observed renewal. The duration is the longer of `leaseDurationSeconds` now and
/// the one the grant was made with (`status.holder.leaseDurationSeconds`): the
/// holder's client keeps the latter, so a shortened spec must not cut its grant
/// short, while a lengthened one may extend it on this side only.
/// Returns that instant of last sight and the duration.
pub(super) fn holder_clock(entry: &LeaseEntry) -> Option<(Instant, Duration)> {
    let lease = entry.lease.as_ref()?;
    let (uid, since) = entry.holder_since.as_ref()?;
    let claim = entry.claims.iter().find(|c| &c.uid == uid);
    let last_seen_alive = claim.map_or(*since, |c| c.renew_observed_at.max(*since));
    let granted_with = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .and_then(|h| h.lease_duration_seconds);
    let seconds = lease
        .spec
        .lease_duration_seconds
        .max(granted_with.unwrap_or(0))
        .clamp(1, MAX_LEASE_DURATION_SECONDS);
    Some((last_seen_alive, Duration::from_secs(seconds as u64)))
}

/// Whether an early quorum read confirmed the holder's claim as the index shows it,
/// under the Lease's current token.
pub(super) fn expiry_confirmed(entry: &LeaseEntry) -> bool {
    let Some(confirmed) = &entry.expiry_confirmed else {
        return false;
    };
    let status = entry.lease.as_ref().and_then(|l| l.status.as_ref());
    let holder = status.and_then(|s| s.holder.as_ref());
    holder.is_some_and(|h| h.claim_uid == confirmed.uid)
        && status.and_then(|s| s.fencing_token) == Some(confirmed.token)
        && entry
            .claims
            .iter()
            .any(|c| c.uid == confirmed.uid && c.renew_time == confirmed.renew_time)
}

/// Whether the holder's claim shows a renewal of the Lease's current grant.
pub(super) fn holder_renewed(entry: &LeaseEntry) -> bool {
    let Some(status) = entry.lease.as_ref().and_then(|l| l.status.as_ref()) else {
        return false;
    };
    let (Some(holder), Some(token)) = (&status.holder, status.fencing_token) else {
        return false;
    };
    entry
        .claims
        .iter()
        .any(|c| c.uid == holder.claim_uid && c.renewed_token == Some(token))
}
