//! The waiter's early confirmation: the write of its own that a grant is believed
//! from, made before the grant when this client can tell the grant is coming
//! (DESIGN.md, "Client deadlines").
//!
//! A grant is believed from the send of a write of the waiter's own whose response
//! showed its claim not ended. Nothing requires that write to come after the grant:
//!
//! - **It lands before the grant.** The controller's clock for the grant starts when
//!   it first sees the grant, later than the write, so the client's deadline (the
//!   write's send + 2D/3) comes at least D/3 before any expiry. Every other ending
//!   marks the claim first or deletes it, and the keeper's next renewal (at the
//!   send + D/3, naming the token) finds that mark in its response, as a holder's
//!   renewal finds a revocation made just after its previous one.
//! - **It lands after the grant.** It is a renewal: the controller observes its
//!   `renewTime`, no earlier than it was sent; it counts only if its response shows the
//!   claim not ended, and an ending without a mark is the expiry of a holder whose
//!   claim shows a renewal naming the new token, which this write cannot name.
//!
//! So the head of the queue sends that write as soon as it learns the grant is near,
//! and the controller's Lease write and this write run side by side: when the
//! holder's claim is deleted (a release) or marked ended (its Pod deleted: a
//! revocation), or when the holder's `renewTime` has not changed for 5/6 of the
//! duration on this client's clock (an expiry). The claim's create counts too: on a
//! free Lease the grant follows it at once. Writes per handover stay the same (the
//! write moves, the keeper's first renewal follows a third of a duration later
//! instead of at once); one serial write leaves the critical path of every handover.
//! The head waiter holds one more watch, of the holder's claim.
//!
//! A write is used only when the grant is seen within D/3 of its send, the keeper's
//! usual margin before its next renewal; otherwise the grant is confirmed after it
//! is seen, as before (`Keeper::confirm`). Nothing here is needed for safety: which
//! waiter writes, and when, only decides whether `acquire` waits for one more write.
//!
//! # Semaphores: the create only
//!
//! On a Lease where more than one slot may be held (`spec.permits` above 1, or a row
//! of `status.slots` still held after `permits` was lowered) the head of the queue
//! watches no holder and makes no early write; the claim's create still anchors a
//! grant seen within D/3 of it (a free slot is granted at once), and any other grant
//! is believed from the keeper's first renewal, which must count within D/3 of
//! seeing the grant (DESIGN.md, "Client deadlines"). Not for safety: the argument
//! above is about this claim's own write and the grant that goes to *this* claim,
//! in whatever slot, and holds as well on a semaphore. But the write is only worth
//! making when it tells which grant comes next, and on a semaphore the holder of
//! `status.holder` (slot 0) is one of up to 64: the next slot to free may be any of
//! them, and a claim asking for one slot (`spec.slot`) waits for that slot alone,
//! so the head of `status.waiting` need not be the next granted. Watching every
//! holder's claim would cost a head waiter up to 64 watches to save one write of a
//! few milliseconds per handover, and writing on slot 0's signs alone would spend
//! writes on grants that go elsewhere (harmless: a write counts only within D/3,
//! and names no token). So semaphores take the plain path, one write on the
//! handover's critical path, and locks keep theirs.

use std::future::pending;
use std::time::Duration;

use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use tokio::time::{Instant, sleep_until};

use super::CALL_TIMEOUT;
use super::claim::{ClaimGuard, touch};
use super::clock::BootInstant;
use super::connections::WatchConnections;
use super::object_watch::Events;
use super::wait::claim_ending;
use crate::crd::{Lease, LeaseClaim, MAX_LEASE_DURATION_SECONDS};

/// What made the head of the queue write early, once each: a second write for the
/// same reason would only cost a request.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reason {
    /// The holder's claim (this UID) is deleted or marked ended.
    HolderEnded(String),
    /// The holder's claim (this UID) showed this `renewTime` for 5/6 of the duration.
    HolderSilent(String, Option<Timestamp>),
}

/// The holder's claim, watched while this claim is first in the queue.
struct Holder {
    uid: String,
    events: Events<LeaseClaim>,
    /// Its `renewTime` as last seen, and when that was first seen on this client's
    /// clock (`None` until the watch's first event).
    renew_time: Option<(Option<Timestamp>, Instant)>,
    /// The longest duration the controller may hold it for (the longer of the spec
    /// and the one the grant was made with).
    duration: Duration,
}

/// A waiter's early confirmation: watches the holder while this claim heads the
/// queue, writes when the grant is near, and keeps the send time of its latest own
/// write that counted.
pub(super) struct EarlyConfirmation {
    claims: Api<LeaseClaim>,
    namespace: String,
    watches: WatchConnections,
    name: String,
    uid: String,
    watch_secs: u32,
    holder: Option<Holder>,
    last_reason: Option<Reason>,
    /// The write in flight: its send time if its response showed the claim not ended.
    writing: Option<BoxFuture<'static, Option<BootInstant>>>,
    /// The send time of the latest write that counted.
    anchor: Option<BootInstant>,
}

impl EarlyConfirmation {
    /// For the claim of `guard`, whose create was sent at `created_at` (no later).
    pub(super) fn new(
        guard: &ClaimGuard,
        created_at: BootInstant,
        watches: &WatchConnections,
        watch_secs: u32,
    ) -> Self {
        EarlyConfirmation {
            claims: guard.claims.clone(),
            namespace: guard.claims.namespace().unwrap_or_default().to_string(),
            watches: watches.clone(),
            name: guard.name.clone(),
            uid: guard.uid.clone(),
            watch_secs,
            holder: None,
            last_reason: None,
            writing: None,
            anchor: Some(created_at),
        }
    }

    /// A Lease version that does not name this claim: who holds it, and whether this
    /// claim is next (on a lock only: see the module docs, "Semaphores").
    pub(super) fn lease_seen(&mut self, lease: Option<&Lease>) {
        let status = lease.and_then(|l| l.status.as_ref());
        let first = status.is_some_and(|s| s.waiting.first() == Some(&self.name))
            && !lease.is_some_and(several_slots);
        // Free (a grant follows at once; the create is the write it is believed from),
        // gone, or not next: nothing to watch.
        let (Some(lease), Some(holder), true) =
            (lease, status.and_then(|s| s.holder.as_ref()), first)
        else {
            self.holder = None;
            return;
        };
        let duration = longest_duration(lease);
        match &mut self.holder {
            Some(watched) if watched.uid == holder.claim_uid => watched.duration = duration,
            _ => {
                self.holder = Some(Holder {
                    uid: holder.claim_uid.clone(),
                    events: self
                        .watches
                        .watch(&self.namespace, &holder.claim, self.watch_secs),
                    renew_time: None,
                    duration,
                })
            }
        }
    }

    /// Waits for the next thing that concerns it (the holder's claim changing or
    /// falling silent, its write answering) and acts on it. Cancel-safe: nothing is
    /// lost when another branch of a `select!` wins.
    pub(super) async fn step(&mut self) {
        let silent_at = self.holder.as_ref().and_then(|h| {
            let (renew_time, seen_at) = h.renew_time?;
            let reason = Reason::HolderSilent(h.uid.clone(), renew_time);
            (self.last_reason != Some(reason)).then(|| seen_at + h.duration * 5 / 6)
        });
        tokio::select! {
            event = next_event(self.holder.as_mut()) => self.holder_changed(event),
            _ = sleep_until_some(silent_at) => {
                if let Some(h) = &self.holder {
                    let renew_time = h.renew_time.and_then(|(t, _)| t);
                    self.write(Reason::HolderSilent(h.uid.clone(), renew_time));
                }
            }
            counted = poll_write(&mut self.writing) => {
                self.writing = None;
                if counted.is_some() {
                    self.anchor = counted;
                }
            }
        }
    }

    /// The send time of the latest write that counted, once the one in flight (if
    /// any) has answered.
    pub(super) async fn settle(mut self) -> Option<BootInstant> {
        if let Some(writing) = self.writing.take()
            && let Some(sent_at) = writing.await
        {
            self.anchor = Some(sent_at);
        }
        self.anchor
    }

    fn holder_changed(&mut self, event: Option<Result<Option<LeaseClaim>, super::Error>>) {
        let Some(h) = self.holder.as_mut() else {
            return;
        };
        let claim = match event {
            Some(Ok(claim)) => claim,
            Some(Err(e)) => {
                tracing::debug!(claim = %self.name, error = %e, "holder's claim watch error; retrying");
                return;
            }
            None => return,
        };
        let ended = claim
            .as_ref()
            .is_none_or(|c| c.uid().as_deref() != Some(&h.uid))
            || claim_ending(claim.as_ref()).is_some();
        if ended {
            let uid = h.uid.clone();
            self.write(Reason::HolderEnded(uid));
            return;
        }
        let renew_time = claim.and_then(|c| c.spec.renew_time).map(|t| t.0);
        if h.renew_time.is_none_or(|(seen, _)| seen != renew_time) {
            h.renew_time = Some((renew_time, Instant::now()));
        }
    }

    /// Starts the early write for `reason`, unless one is in flight or was made for it.
    fn write(&mut self, reason: Reason) {
        if self.writing.is_some() || self.last_reason.as_ref() == Some(&reason) {
            return;
        }
        self.last_reason = Some(reason);
        let (claims, name, uid) = (self.claims.clone(), self.name.clone(), self.uid.clone());
        self.writing = Some(
            async move {
                let sent_at = BootInstant::now();
                match tokio::time::timeout(CALL_TIMEOUT, touch(&claims, &name, &uid, None)).await {
                    Ok(Ok(claim))
                        if claim.uid().as_deref() == Some(uid.as_str())
                            && claim_ending(Some(&claim)).is_none() =>
                    {
                        Some(sent_at)
                    }
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => {
                        tracing::debug!(claim = %name, error = %e, "early confirmation failed");
                        None
                    }
                    Err(_) => None,
                }
            }
            .boxed(),
        );
    }
}

/// More than one slot may be held at once: a semaphore, or a Lease whose `permits`
/// was lowered while a slot above 0 was held (its grant is ended like a revocation).
fn several_slots(lease: &Lease) -> bool {
    lease.spec.permits > 1
        || lease
            .status
            .as_ref()
            .is_some_and(|s| s.slots.iter().any(|row| row.holder.is_some()))
}

/// The longer of the Lease's duration and the one its grant was made with: how long
/// the controller may wait for the holder's next renewal.
fn longest_duration(lease: &Lease) -> Duration {
    let granted_with = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .and_then(|h| h.lease_duration_seconds)
        .unwrap_or(0);
    let seconds = lease.spec.lease_duration_seconds.max(granted_with);
    Duration::from_secs(seconds.clamp(1, MAX_LEASE_DURATION_SECONDS) as u64)
}

async fn next_event(
    holder: Option<&mut Holder>,
) -> Option<Result<Option<LeaseClaim>, super::Error>> {
    match holder {
        Some(h) => h.events.next().await,
        None => pending().await,
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => pending().await,
    }
}

async fn poll_write(
    writing: &mut Option<BoxFuture<'static, Option<BootInstant>>>,
) -> Option<BootInstant> {
    match writing {
        Some(w) => w.await,
        None => pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::LeaseBuilder;

    #[test]
    fn only_a_lock_has_a_single_holder_to_watch() {
        let lock = LeaseBuilder::new("l").holder("a", "ua", "a").token(3);
        assert!(!several_slots(&lock.build()));
        let semaphore = LeaseBuilder::new("s").permits(3).holder("a", "ua", "a");
        assert!(several_slots(&semaphore.build()));
        // Lowered to 1 while slot 2 was held: two holders until that grant ends.
        let lowered = LeaseBuilder::new("s")
            .holder("a", "ua", "a")
            .slot_holder(2, "c", "uc", "c", 6);
        assert!(several_slots(&lowered.build()));
        // Lowered to 1, the rows above kept free: a lock again.
        let settled = LeaseBuilder::new("s")
            .holder("a", "ua", "a")
            .free_slot(2, 6);
        assert!(!several_slots(&settled.build()));
    }
}
