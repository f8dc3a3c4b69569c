//! The held grant and its keeper: [`Grant`], what the application holds, and
//! [`Keeper`], the background task that renews it, watches for its loss, and deletes
//! its claim when it is released or dropped.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::ResourceExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::claim::{ClaimGuard, touch};
use super::clock::{BootInstant, BootTimer};
use super::object_watch::Events;
use super::wait::{Granted, claim_ending, grant_in, holds_grant, lease_duration};
use super::{CALL_TIMEOUT, Error, LostReason};
use crate::crd::{ClaimPhase, Lease, LeaseClaim};
use crate::kube_error::ApiErrorKind;
use crate::permits;

/// A held Lease. Renewed in the background until released, dropped or lost.
pub struct Grant {
    namespace: String,
    lease: String,
    identity: String,
    claim: String,
    claim_uid: String,
    /// The slot this grant holds: 0 on a lock (`crate::permits`).
    slot: i32,
    token: i64,
    lost: watch::Receiver<Option<LostReason>>,
    duration: watch::Receiver<Duration>,
    deadline: watch::Receiver<Duration>,
    /// Tells the keeper to stop renewing and delete the claim.
    stop: CancellationToken,
    keeper: Option<JoinHandle<Result<(), Error>>>,
    cleanup: TaskTracker,
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("claim", &self.claim)
            .field("identity", &self.identity)
            .field("slot", &self.slot)
            .field("token", &self.token)
            .field("lost", &*self.lost.borrow())
            .finish()
    }
}

impl Grant {
    /// The grant the wait `found`, believed from the send of the claim's latest write
    /// that counted when the grant was seen within a third of a duration of it (`head`),
    /// else once a first renewal sent now has counted ([`Keeper::confirm`]); from then
    /// on its keeper holds it in the background. When that renewal does not count, the
    /// claim is deleted and the grant not believed.
    pub(super) async fn confirmed(
        namespace: &str,
        lease: &str,
        identity: String,
        timer: BootTimer,
        found: Granted,
        cleanup: &TaskTracker,
    ) -> Result<Grant, Error> {
        let Granted {
            guard,
            lease: granted,
            observed_at,
            written_at,
            lease_events,
            claim_events,
        } = found;
        // The wait returned this Lease because some slot names the claim.
        let (slot, token) = grant_in(&granted, &guard.uid).unwrap_or_default();
        let token = token.unwrap_or_default();
        let (lost_tx, lost_rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let (claim, claim_uid) = (guard.name.clone(), guard.uid.clone());
        let duration = lease_duration(&granted, &guard.uid);
        let (duration_tx, duration_rx) = watch::channel(duration);
        let (deadline_tx, deadline_rx) = watch::channel((observed_at + duration / 3).since_boot());
        let keeper = Keeper {
            duration: duration_tx,
            deadline: deadline_tx,
            slot,
            token,
            guard,
            lost: lost_tx,
            stop: stop.clone(),
            timer,
        };
        let early = written_at.filter(|w| observed_at < *w + keeper.duration() / 3);
        let confirmed = match early {
            Some(written_at) => Ok(written_at),
            None => keeper.confirm(observed_at).await,
        };
        let confirmed_at = match confirmed {
            Ok(sent_at) => {
                keeper
                    .deadline
                    .send_replace((sent_at + keeper.deadline_after_renewal()).since_boot());
                sent_at
            }
            Err(reason) => {
                let claim = keeper.guard.name.clone();
                keeper.guard.delete_or_warn().await;
                return Err(Error::NotGranted {
                    lease: lease.to_string(),
                    claim,
                    reason,
                });
            }
        };
        Ok(Grant {
            namespace: namespace.to_string(),
            lease: lease.to_string(),
            identity,
            claim,
            claim_uid,
            slot,
            token,
            lost: lost_rx,
            duration: duration_rx,
            deadline: deadline_rx,
            stop,
            keeper: Some(tokio::spawn(keeper.run(
                confirmed_at,
                lease_events,
                claim_events,
            ))),
            cleanup: cleanup.clone(),
        })
    }

    /// The fencing token of this grant: send it with every write to the protected
    /// resource, under [`Grant::fence_key`].
    pub fn token(&self) -> i64 {
        self.token
    }

    /// The slot this grant holds: `0..permits` on a semaphore, always 0 on a lock.
    pub fn slot(&self) -> i32 {
        self.slot
    }

    /// The key a fence keeps this grant's marks under ([`permits::fence_key`]):
    /// `<namespace>/<lease>` for slot 0 (a lock's key), `<namespace>/<lease>#<slot>`
    /// for the others, so that the holders of different slots never refuse each other.
    pub fn fence_key(&self) -> String {
        permits::fence_key(&self.namespace, &self.lease, self.slot)
    }

    pub fn lease(&self) -> &str {
        &self.lease
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn claim_name(&self) -> &str {
        &self.claim
    }

    pub fn claim_uid(&self) -> &str {
        &self.claim_uid
    }

    /// The lease duration this grant is held under: `leaseDurationSeconds` as the
    /// grant was observed, or a shorter value seen since; an edit never makes it
    /// longer. The local deadline is two thirds of it after the last renewal sent.
    pub fn lease_duration(&self) -> Duration {
        *self.duration.borrow()
    }

    /// Why the grant was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
    }

    /// The local deadline, as a time on `CLOCK_BOOTTIME` (since boot, suspensions
    /// included): unless a renewal counts before it, this process stops believing it
    /// holds the grant then. Later with every renewal that counts, earlier when the
    /// Lease is shortened. For a supervisor that must act even when this process
    /// cannot (`palisade lock`'s watchdog).
    pub fn local_deadline(&self) -> watch::Receiver<Duration> {
        self.deadline.clone()
    }

    /// Whether the grant is held as far as this process knows right now: not lost,
    /// and its local deadline not passed on the clock, which is read here, so the
    /// answer is right even before the keeper has run after a pause.
    pub fn is_held(&self) -> bool {
        self.lost_reason().is_none() && BootInstant::now().since_boot() < *self.deadline.borrow()
    }

    /// Completes when the grant is lost. Does not borrow the grant, so it can be
    /// awaited next to work that uses it.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut lost = self.lost.clone();
        async move {
            match lost.wait_for(Option::is_some).await {
                Ok(reason) => reason.expect("waited for Some"),
                // The keeper is gone without saying why: only when its runtime shut down.
                Err(_) => LostReason::LocalDeadline,
            }
        }
    }

    /// Stops renewing and deletes the claim, which frees the Lease for the next waiter.
    pub async fn release(mut self) -> Result<(), Error> {
        self.stop.cancel();
        match self.keeper.take() {
            Some(keeper) => match keeper.await {
                Ok(deleted) => deleted,
                // The keeper panicked or its runtime is shutting down; the controller expires the claim.
                Err(_) => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        // The keeper deletes the claim when it sees this (see `release`); tracked, for `flush`.
        self.stop.cancel();
        if let (Some(keeper), Ok(runtime)) =
            (self.keeper.take(), tokio::runtime::Handle::try_current())
        {
            self.cleanup.spawn_on(keeper, &runtime);
        }
    }
}

/// The background task of a [`Grant`]: renews, watches for the loss, and deletes
/// the claim when the grant is released or dropped.
struct Keeper {
    /// The lease duration this grant is held under: the one the grant was observed
    /// with, lowered by every shorter one seen since, never raised (DESIGN.md, "Client deadlines").
    duration: watch::Sender<Duration>,
    /// The grant's slot: the Lease names the claim there while the grant is held.
    slot: i32,
    /// The grant's fencing token: a renewal counts only when the claim shows this grant.
    token: i64,
    guard: ClaimGuard,
    lost: watch::Sender<Option<LostReason>>,
    /// The local deadline, published for [`Grant::local_deadline`] and [`Grant::is_held`].
    deadline: watch::Sender<Duration>,
    stop: CancellationToken,
    /// Fires at the local deadline, on CLOCK_BOOTTIME.
    timer: BootTimer,
}

impl Keeper {
    async fn run(
        mut self,
        confirmed_at: BootInstant,
        lease_events: Events<Lease>,
        claim_events: Events<LeaseClaim>,
    ) -> Result<(), Error> {
        // The watches end with `hold`: nothing more to learn once the grant is over.
        if let Some(reason) = self.hold(confirmed_at, lease_events, claim_events).await {
            tracing::info!(claim = %self.guard.name, %reason, "grant lost");
            self.lost.send_replace(Some(reason));
            // The claim stays (its status says what happened) until the owner lets go.
            self.stop.cancelled().await;
        }
        self.guard.delete().await
    }

    fn duration(&self) -> Duration {
        *self.duration.borrow()
    }

    /// How long after the send time of its last renewal that counted this holder
    /// stops believing: two thirds of the duration (see the docs of `client`).
    fn deadline_after_renewal(&self) -> Duration {
        self.duration() * 2 / 3
    }

    /// The first renewal, before [`LeaseClient::acquire`] returns: the send time of
    /// one that counted within a third of a duration of `observed_at` (the
    /// controller's clock started at the grant, possibly well before the watch
    /// showed it), or why the grant is not to be believed.
    ///
    /// [`LeaseClient::acquire`]: super::LeaseClient::acquire
    async fn confirm(&self, observed_at: BootInstant) -> Result<BootInstant, LostReason> {
        let limit = self.duration() / 3;
        let deadline = observed_at + limit;
        match tokio::time::timeout(limit, self.renewal()).await {
            Ok(Ok(sent_at)) if BootInstant::now() < deadline => Ok(sent_at),
            Ok(Ok(_)) | Err(_) => Err(LostReason::LocalDeadline),
            Ok(Err(RenewalError::Ended(reason))) => Err(reason),
            Ok(Err(_)) => Err(LostReason::ClaimDeleted),
        }
    }

    /// Renews until the grant is lost (returns why) or the owner stops it (returns None).
    async fn hold(
        &mut self,
        confirmed_at: BootInstant,
        mut lease_events: Events<Lease>,
        mut claim_events: Events<LeaseClaim>,
    ) -> Option<LostReason> {
        // The send time of the last renewal that counted: the first is the confirmation.
        let mut last_renewal = confirmed_at;
        // When to renew next: only a schedule, so tokio's (monotonic) timers do.
        let mut next_renewal = Instant::now()
            + (confirmed_at + self.duration() / 3).saturating_duration_since(BootInstant::now());
        let mut renewing: Option<BoxFuture<'static, Result<BootInstant, RenewalError>>> = None;
        loop {
            let deadline = last_renewal + self.deadline_after_renewal();
            let since_boot = deadline.since_boot();
            self.deadline
                .send_if_modified(|d| std::mem::replace(d, since_boot) != since_boot);
            // Every wake-up checks the deadline first: after a pause or a suspension
            // it has passed, whatever else is ready.
            if BootInstant::now() >= deadline {
                return Some(LostReason::LocalDeadline);
            }
            if let Err(e) = self.timer.arm(deadline) {
                tracing::error!(claim = %self.guard.name, error = %e, "cannot arm the deadline timer");
                return Some(LostReason::LocalDeadline);
            }
            tokio::select! {
                // Checked first: an overdue deadline wins over a renewal that
                // completes in the same instant.
                biased;
                _ = self.stop.cancelled() => return None,
                _ = self.timer.fired() => {}
                Some(event) = lease_events.next() => {
                    if let Some(reason) = self.lease_changed(event) {
                        return Some(reason);
                    }
                }
                Some(event) = claim_events.next() => match event {
                    Ok(claim) => {
                        if let Some(reason) = claim_ending(claim.as_ref()) {
                            return Some(reason);
                        }
                    }
                    Err(e) => tracing::debug!(claim = %self.guard.name, error = %e, "claim watch error; retrying"),
                },
                renewed = async { renewing.as_mut().expect("guarded by is_some").await }, if renewing.is_some() => {
                    renewing = None;
                    match renewed {
                        // Too late counts for nothing: the deadline passing is final.
                        Ok(_) if BootInstant::now() >= deadline => return Some(LostReason::LocalDeadline),
                        Ok(sent_at) => {
                            last_renewal = sent_at;
                            next_renewal = Instant::now()
                                + (sent_at + self.duration() / 3)
                                    .saturating_duration_since(BootInstant::now());
                        }
                        Err(RenewalError::Ended(reason)) => {
                            tracing::warn!(claim = %self.guard.name, %reason, "a renewal found the grant ended");
                            return Some(reason);
                        }
                        Err(e) => {
                            tracing::warn!(claim = %self.guard.name, error = %e, "renewal refused: the claim is gone");
                            return Some(LostReason::ClaimDeleted);
                        }
                    }
                }
                _ = sleep_until(next_renewal), if renewing.is_none() => {
                    renewing = Some(self.renewal().boxed());
                }
            }
        }
    }

    /// What a change of the Lease says about the grant: why it ended, or None while it
    /// is held (a shorter duration is taken on at once).
    fn lease_changed(&self, event: Result<Option<Lease>, Error>) -> Option<LostReason> {
        match event {
            Ok(None) => Some(LostReason::LeaseDeleted),
            Ok(Some(lease)) if !holds_grant(&lease, &self.guard.uid, self.slot, self.token) => {
                Some(LostReason::Superseded)
            }
            // An edit may shorten the duration (the controller may apply it at
            // once); a longer one is never believed.
            Ok(Some(lease)) => {
                let seen = lease_duration(&lease, &self.guard.uid);
                self.duration.send_if_modified(|d| {
                    let shorter = seen < *d;
                    *d = (*d).min(seen);
                    shorter
                });
                None
            }
            Err(e) => {
                tracing::debug!(claim = %self.guard.name, error = %e, "lease watch error; retrying");
                None
            }
        }
    }

    /// One renewal, retried on any failure except "this claim is gone" (see
    /// [`ApiErrorKind`]): not found, or a conflict or invalid (409/422) when the name now
    /// belongs to another object (the UID in the patch cannot change),
    /// and except a response that shows the grant ended. Returns the send time of the
    /// attempt that succeeded: the retries never extend the deadline, only a success
    /// does, and a success is a response that shows this claim's grant not ended
    /// ([`judge_renewal`]). Each attempt is bounded, so one hung request
    /// cannot use up the whole deadline.
    fn renewal(&self) -> impl Future<Output = Result<BootInstant, RenewalError>> + Send + 'static {
        let claims = self.guard.claims.clone();
        let name = self.guard.name.clone();
        let uid = self.guard.uid.clone();
        let token = self.token;
        let attempt_limit = (self.duration() / 6).min(CALL_TIMEOUT);
        let attempt = move || {
            let (claims, name, uid) = (claims.clone(), name.clone(), uid.clone());
            async move {
                let sent_at = BootInstant::now();
                match tokio::time::timeout(attempt_limit, touch(&claims, &name, &uid, Some(token)))
                    .await
                {
                    Ok(Ok(claim)) => judge_renewal(&claim, &uid, token).map(|()| sent_at),
                    Ok(Err(e)) => Err(RenewalError::Api(e)),
                    Err(_) => Err(RenewalError::TimedOut(attempt_limit)),
                }
            }
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay((self.duration() / 6).max(Duration::from_millis(50)))
            .without_max_times()
            .with_jitter();
        attempt
            .retry(backoff)
            .when(RenewalError::is_retried)
            .notify(|e, after| tracing::debug!(error = %e, ?after, "renewal failed; retrying"))
    }
}

/// Why a renewal attempt did not count.
#[derive(Debug, thiserror::Error)]
enum RenewalError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("no response within {0:?}")]
    TimedOut(Duration),
    /// The response shows that the grant ended (a final phase, a deletion, another token).
    #[error("the claim shows the grant ended: {0}")]
    Ended(LostReason),
}

impl RenewalError {
    fn is_retried(&self) -> bool {
        match self {
            RenewalError::Api(e) => match ApiErrorKind::of(e) {
                // Invalid (422): the UID in the patch cannot change, another object has
                // the name. A BadRequest (400, an admission webhook's default refusal)
                // says nothing of the kind, and is retried like any other failure.
                ApiErrorKind::NotFound | ApiErrorKind::Conflict | ApiErrorKind::Invalid => false,
                _ => true,
            },
            RenewalError::TimedOut(_) => true,
            RenewalError::Ended(_) => false,
        }
    }
}

/// What the claim in a renewal's response says about the grant with `token`: it
/// counts while the claim shows this grant (`Granted` with that token) or none yet. A
/// final phase, a deletion mark or another token is the grant's end, reported at
/// once, even when the watches (stalled, say) have not said so.
fn judge_renewal(claim: &LeaseClaim, uid: &str, token: i64) -> Result<(), RenewalError> {
    if claim.uid().as_deref() != Some(uid) {
        return Err(RenewalError::Ended(LostReason::ClaimDeleted));
    }
    if let Some(reason) = claim_ending(Some(claim)) {
        return Err(RenewalError::Ended(reason));
    }
    let status = claim.status.as_ref();
    match status.and_then(|s| s.phase) {
        Some(ClaimPhase::Granted) if status.and_then(|s| s.fencing_token) == Some(token) => Ok(()),
        // A claim is granted once: Granted with another token is not this grant.
        Some(ClaimPhase::Granted) => Err(RenewalError::Ended(LostReason::Superseded)),
        // Pending or no status (final phases returned above): not mirrored yet, since
        // the Lease is written first and in a storm the mirror waits behind every
        // pending grant. The grant has not ended: the controller marks the claim
        // before it hands the Lease on (controller `write_pass`, "Endings confirmed"), unless this
        // client had renewed the grant, whose later renewals come after its local
        // deadline by then ("Expiry is one write").
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::LeaseClaimSpec;

    #[test]
    fn a_renewal_counts_unless_the_claim_shows_another_grant_or_an_end() {
        let mut claim = LeaseClaim::new("c", LeaseClaimSpec::default());
        claim.metadata.uid = Some("u1".into());
        let with = |phase, token| crate::crd::LeaseClaimStatus {
            phase: Some(phase),
            fencing_token: token,
            ..Default::default()
        };
        claim.status = Some(with(ClaimPhase::Granted, Some(7)));
        assert!(judge_renewal(&claim, "u1", 7).is_ok());
        // Another object under the name, or another grant: not this one.
        assert!(matches!(
            judge_renewal(&claim, "u2", 7),
            Err(RenewalError::Ended(LostReason::ClaimDeleted))
        ));
        assert!(matches!(
            judge_renewal(&claim, "u1", 8),
            Err(RenewalError::Ended(LostReason::Superseded))
        ));
        // The grant is not mirrored yet: it has not ended, so the renewal counts.
        claim.status = Some(with(ClaimPhase::Pending, None));
        assert!(judge_renewal(&claim, "u1", 7).is_ok());
        claim.status = None;
        assert!(judge_renewal(&claim, "u1", 7).is_ok());
        for (phase, reason) in [
            (ClaimPhase::Expired, LostReason::Expired),
            (ClaimPhase::Revoked, LostReason::Revoked),
            (ClaimPhase::Released, LostReason::ClaimDeleted),
        ] {
            claim.status = Some(with(phase, Some(7)));
            let ended = judge_renewal(&claim, "u1", 7).unwrap_err();
            assert!(!ended.is_retried(), "{phase:?}");
            assert!(
                matches!(ended, RenewalError::Ended(r) if r == reason),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn a_renewal_gives_up_only_when_the_claim_is_gone() {
        let refused = |code: u16| RenewalError::Api(crate::kube_error::refusal(code, "refused"));
        for code in [404, 409, 422] {
            assert!(!refused(code).is_retried(), "{code}");
        }
        for code in [400, 401, 403, 410, 429, 500, 503] {
            assert!(refused(code).is_retried(), "{code}");
        }
        let unreachable = RenewalError::Api(kube::Error::Service("connection reset".into()));
        assert!(unreachable.is_retried());
        assert!(RenewalError::TimedOut(Duration::from_secs(1)).is_retried());
    }
}
