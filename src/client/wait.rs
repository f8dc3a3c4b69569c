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

/// The slot whose holder the Lease names as this claim, with its token: slot 0 of a
/// lock (or of a semaphore) is the top-level `status.holder`, the others are rows of
/// `status.slots` (`crate::permits`).
pub(super) fn grant_in(lease: &Lease, claim_uid: &str) -> Option<(i32, Option<i64>)> {
    let grant = lease.status.as_ref()?.grant_of(claim_uid)?;
    Some((grant.slot, grant.token))
}

fn holds(lease: &Lease, claim_uid: &str) -> bool {
    grant_in(lease, claim_uid).is_some()
}

/// The Lease still publishes this claim's grant: the claim as the holder of `slot`,
/// with the token it was granted (a Lease re-created under the name and granted to the
/// same claim would publish another). A grant is one slot and one token: the claim
/// named in another slot is not this grant either, since the fences key slots apart.
pub(super) fn holds_grant(lease: &Lease, claim_uid: &str, slot: i32, token: i64) -> bool {
    grant_in(lease, claim_uid) == Some((slot, Some(token)))
}

/// The duration a holder may rely on: `leaseDurationSeconds`, but never more than the
/// grant was made with (the `leaseDurationSeconds` of the slot's holder, which the
/// controller applies at least), so a spec raised between the grant and this process
/// seeing it is not believed either.
pub(super) fn lease_duration(lease: &Lease, claim_uid: &str) -> Duration {
    let spec = lease.spec.lease_duration_seconds;
    let granted_with = lease
        .status
        .as_ref()
        .and_then(|s| s.grant_of(claim_uid))
        .and_then(|g| g.holder.lease_duration_seconds);
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
            lease_duration(&lease, "u")
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
        assert!(holds_grant(&lease("u", 7), "u", 0, 7));
        assert!(!holds_grant(&lease("u", 9), "u", 0, 7), "another token");
        assert!(!holds_grant(&lease("v", 7), "u", 0, 7), "another claim");
        assert!(!holds_grant(&lease("u", 7), "u", 1, 7), "another slot");
    }

    /// A semaphore: slot 0 on top, the others in rows, each with its own token.
    fn semaphore() -> Lease {
        LeaseBuilder::new("s")
            .no_namespace()
            .permits(3)
            .duration(30)
            .holder("a", "ua", "a")
            .token(4)
            .free_slot(1, 3)
            .slot_holder(2, "c", "uc", "c", 6)
            .build()
    }

    #[test]
    fn a_claim_holds_a_semaphore_in_the_slot_that_names_it_with_that_slots_token() {
        let lease = semaphore();
        assert_eq!(grant_in(&lease, "uc"), Some((2, Some(6))));
        assert_eq!(grant_in(&lease, "ua"), Some((0, Some(4))));
        assert!(holds(&lease, "uc"));
        assert!(holds_grant(&lease, "uc", 2, 6));
        assert!(holds_grant(&lease, "ua", 0, 4));
        // Slot 0's token is not slot 2's, nor the other way round.
        assert!(!holds_grant(&lease, "uc", 2, 4), "slot 0's token");
        assert!(!holds_grant(&lease, "ua", 0, 6), "slot 2's token");
        assert!(!holds_grant(&lease, "uc", 1, 6), "another slot");
        // Absent from every slot: not held, whatever the token (slot 1's last one too).
        assert_eq!(grant_in(&lease, "ub"), None);
        assert!(!holds(&lease, "ub"));
        assert!(!holds_grant(&lease, "ub", 1, 3));
    }

    #[test]
    fn a_semaphore_grant_is_held_for_no_longer_than_its_own_slot_was_granted_with() {
        let lease = LeaseBuilder::new("s")
            .no_namespace()
            .permits(3)
            .duration(30)
            .holder("a", "ua", "a")
            .granted_with(20)
            .token(4)
            .slot_holder(2, "c", "uc", "c", 6)
            .slot_granted_with(2, 5)
            .build();
        assert_eq!(lease_duration(&lease, "uc"), Duration::from_secs(5));
        assert_eq!(lease_duration(&lease, "ua"), Duration::from_secs(20));
        // Slot 0's recorded duration is not another slot's.
        assert_eq!(lease_duration(&semaphore(), "uc"), Duration::from_secs(30));
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
