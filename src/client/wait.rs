//! Waiting for the grant: the Lease's and the claim's watches, until the Lease names
//! the claim or the claim ends; and what a Lease or a claim says about a grant, which
//! the keeper also reads while the grant is held.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::{Instant, timeout_at};

use super::claim::ClaimGuard;
use super::clock::BootInstant;
use super::connections::WatchConnections;
use super::head::EarlyConfirmation;
use super::object_watch::Events;
use super::{Error, LostReason, WatchPeriods};
use crate::crd::{ClaimPhase, Lease, LeaseClaim, MAX_LEASE_DURATION_SECONDS};

/// A grant, as the wait saw it: the claim (guarded), the Lease that names it, when
/// that was seen, the send time of the latest write of this claim whose response
/// showed it not ended (its create, or an early confirmation: `head`), and the
/// watches a holder goes on with.
pub(super) struct Granted {
    pub(super) guard: ClaimGuard,
    pub(super) lease: Lease,
    pub(super) observed_at: BootInstant,
    pub(super) written_at: Option<BootInstant>,
    pub(super) lease_events: Events<Lease>,
    pub(super) claim_events: Events<LeaseClaim>,
}

/// Waits, until `deadline` if any, for the Lease `lease` to name the claim of `guard`
/// (created no earlier than `created_at`). When the wait fails or times out
/// (`timed_out`), the claim is deleted before this returns.
#[allow(clippy::too_many_arguments)]
pub(super) async fn await_grant(
    watches: &WatchConnections,
    namespace: &str,
    lease: &str,
    guard: ClaimGuard,
    created_at: BootInstant,
    periods: WatchPeriods,
    deadline: Option<Instant>,
    timed_out: impl FnOnce() -> Error,
) -> Result<Granted, Error> {
    // Watch both before deciding anything: the first event of each is the current state.
    let mut lease_events = watches.watch::<Lease>(namespace, lease, periods.grant_secs);
    let mut claim_events = watches.watch::<LeaseClaim>(namespace, &guard.name, periods.quiet_secs);
    let mut early = EarlyConfirmation::new(&guard, created_at, watches, periods.quiet_secs);
    let waited = until_deadline(
        deadline,
        wait_for_grant(
            lease,
            &guard,
            &mut lease_events,
            &mut claim_events,
            &mut early,
        ),
    )
    .await;
    let granted = match waited {
        Some(Ok(granted)) => granted,
        Some(Err(e)) => {
            guard.delete_or_warn().await;
            return Err(e);
        }
        None => {
            // Delete before returning, so that a caller that exits at once leaves nothing behind.
            guard.delete_or_warn().await;
            return Err(timed_out());
        }
    };
    let observed_at = BootInstant::now();
    let written_at = early.settle().await;
    // The holder's Lease watch on the quiet period. When that is the grant period too
    // (PINGed connections), the same watch goes on; otherwise a new one starts, its
    // first event the Lease now, so nothing since the grant is missed.
    let lease_events = if periods.quiet_secs == periods.grant_secs {
        lease_events
    } else {
        drop(lease_events);
        watches.watch::<Lease>(namespace, lease, periods.quiet_secs)
    };
    Ok(Granted {
        guard,
        lease: granted,
        observed_at,
        written_at,
        lease_events,
        claim_events,
    })
}

pub(super) async fn until_deadline<T>(
    deadline: Option<Instant>,
    fut: impl Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(deadline) => timeout_at(deadline, fut).await.ok(),
        None => Some(fut.await),
    }
}

fn holds(lease: &Lease, claim_uid: &str) -> bool {
    lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .is_some_and(|h| h.claim_uid == claim_uid)
}

/// The Lease still publishes this claim's grant: the claim as holder, with the token
/// it was granted (a Lease re-created under the name and granted to the same claim
/// would publish another).
pub(super) fn holds_grant(lease: &Lease, claim_uid: &str, token: i64) -> bool {
    holds(lease, claim_uid) && lease.status.as_ref().and_then(|s| s.fencing_token) == Some(token)
}

/// The duration a holder may rely on: `leaseDurationSeconds`, but never more than the
/// grant was made with (`status.holder.leaseDurationSeconds`, which the controller
/// applies at least), so a spec raised between the grant and this process seeing it
/// is not believed either.
pub(super) fn lease_duration(lease: &Lease) -> Duration {
    let spec = lease.spec.lease_duration_seconds;
    let granted_with = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .and_then(|h| h.lease_duration_seconds);
    let seconds = granted_with.map_or(spec, |g| spec.min(g));
    Duration::from_secs(seconds.clamp(1, MAX_LEASE_DURATION_SECONDS) as u64)
}

/// What the claim itself says about a grant that ended (None: nothing ended).
pub(super) fn claim_ending(claim: Option<&LeaseClaim>) -> Option<LostReason> {
    let Some(claim) = claim else {
        return Some(LostReason::ClaimDeleted);
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Some(LostReason::ClaimDeleted);
    }
    match claim.status.as_ref().and_then(|s| s.phase)? {
        ClaimPhase::Pending | ClaimPhase::Granted => None,
        ClaimPhase::Expired => Some(LostReason::Expired),
        ClaimPhase::Revoked => Some(LostReason::Revoked),
        ClaimPhase::Released => Some(LostReason::ClaimDeleted),
    }
}

/// Until the Lease names the claim: returns that Lease. A claim that ends first
/// (its pod is gone, someone deleted it) is an error; a missing Lease is waited for.
async fn wait_for_grant(
    lease: &str,
    guard: &ClaimGuard,
    lease_events: &mut Events<Lease>,
    claim_events: &mut Events<LeaseClaim>,
    early: &mut EarlyConfirmation,
) -> Result<Lease, Error> {
    loop {
        tokio::select! {
            Some(event) = lease_events.next() => match event {
                Ok(Some(l)) if holds(&l, &guard.uid) => return Ok(l),
                Ok(l) => early.lease_seen(l.as_ref()),
                // Warned: a watch that keeps failing (e.g. forbidden) would otherwise wait silently.
                Err(e) => tracing::warn!(%lease, error = %e, "lease watch error; retrying"),
            },
            Some(event) = claim_events.next() => match event {
                Ok(claim) => {
                    if let Some(reason) = claim_ending(claim.as_ref()) {
                        return Err(Error::NotGranted {
                            lease: lease.to_string(),
                            claim: guard.name.clone(),
                            reason,
                        });
                    }
                }
                Err(e) => tracing::warn!(claim = %guard.name, error = %e, "claim watch error; retrying"),
            },
            () = early.step() => {}
            else => return Err(Error::WatchEnded { lease: lease.to_string() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::LeaseClaimSpec;
    use crate::fixtures::LeaseBuilder;

    #[test]
    fn a_grant_is_held_for_no_longer_than_the_duration_it_was_made_with() {
        let held = |spec: i64, recorded: Option<i64>| {
            let lease = LeaseBuilder::new("l")
                .no_namespace()
                .duration(spec)
                .holder("c", "u", "i")
                .granted_with(recorded)
                .build();
            lease_duration(&lease)
        };
        // Raised from 3 s to 600 s before this process saw the grant: 3 s.
        assert_eq!(held(600, Some(3)), Duration::from_secs(3));
        // Lowered since the grant: the lower spec.
        assert_eq!(held(2, Some(10)), Duration::from_secs(2));
        // A grant made by a controller that records no duration: the spec.
        assert_eq!(held(15, None), Duration::from_secs(15));
    }

    /// A Lease re-created under the name and granted to the same claim publishes
    /// another token: the holder of the old one no longer holds.
    #[test]
    fn a_grant_is_held_only_while_the_lease_publishes_its_claim_with_its_token() {
        let lease = |uid: &str, token: i64| -> Lease {
            LeaseBuilder::new("l")
                .no_namespace()
                .token(token)
                .holder("c", uid, "i")
                .build()
        };
        assert!(holds_grant(&lease("u", 7), "u", 7));
        assert!(!holds_grant(&lease("u", 9), "u", 7), "another token");
        assert!(!holds_grant(&lease("v", 7), "u", 7), "another claim");
    }

    #[test]
    fn only_final_claim_phases_end_a_grant() {
        let mut claim = LeaseClaim::new("c", LeaseClaimSpec::default());
        assert_eq!(claim_ending(Some(&claim)), None);
        for (phase, reason) in [
            (ClaimPhase::Pending, None),
            (ClaimPhase::Granted, None),
            (ClaimPhase::Expired, Some(LostReason::Expired)),
            (ClaimPhase::Revoked, Some(LostReason::Revoked)),
            (ClaimPhase::Released, Some(LostReason::ClaimDeleted)),
        ] {
            claim.status = Some(crate::crd::LeaseClaimStatus {
                phase: Some(phase),
                ..Default::default()
            });
            assert_eq!(claim_ending(Some(&claim)), reason, "{phase:?}");
        }
        assert_eq!(claim_ending(None), Some(LostReason::ClaimDeleted));
    }
}
