//! One write pass: runs a decision's plan, step by step (confirm what it relies on,
//! then write it, each call conditioned on what the decision was computed from:
//! DESIGN rule 2, "Endings are confirmed"), and reports what it learned and one
//! [`Next`]: when to decide the Lease again. It holds no rules: a refused call ends
//! the pass, and which refusal means what is `crate::kube_error`'s.
//!
//! # Endings are confirmed
//!
//! The controller's watches of Leases, claims and pods are separate streams and any
//! of them can lag (a cut link, a failover, a second controller with election off),
//! so no grant ends on the index alone. Before it writes anything, the pass confirms
//! what the decision relies on with quorum reads (a GET without a resourceVersion is
//! served from etcd): `Released` that the holder's claim is gone, being deleted or
//! re-created (unless a watch event showed its deletion or its deletion mark, which
//! are final for that UID whichever cache served them; a claim left out of a relist
//! is read); `PodGone` (holder or pending claim) that the pod is missing, being
//! deleted, replaced or terminal; `LeaseDeleted` that no Lease of that name exists;
//! `Superseded` without a Lease write that the Lease still has the resourceVersion
//! decided from. For `Expired` (of a holder whose claim shows no renewal of the
//! grant: `index::holder`, "Expiry is one write") and every `Revoked` of the holder,
//! the holder's claim is marked ended *before* the Lease is handed on, with a JSON
//! patch that tests the claim's UID and resourceVersion: a renewal that landed since
//! (seen by the watches or not) makes that write fail, the controller re-reads the
//! claim (counting the changed `renewTime` as an observed renewal) and keeps the
//! grant; a renewal that lands after it finds the claim ended in its own response.
//!
//! A refuting read corrects the index only for objects (UIDs) the index holds, so a
//! read never resurrects a deleted object; otherwise the Lease is decided again
//! 0.5 s later. A refused mark whose claim re-reads unchanged (same UID and
//! resourceVersion) was refused by a validation rule or an admission policy, not by
//! a renewal: it counts as an error (`palisade_write_errors_total{kind="claim"}`, an
//! error log naming the refusal) and the grant is kept until the write is allowed,
//! since handing on unmarked could let the holder's first renewal count after the
//! handover. Cost: one GET or one conditional claim write before the handover's
//! Lease write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::ResourceExt;

use super::api_server::ApiServer;
use super::error::Result;
use super::events::{self, Publisher};
use super::grant::{Check, ClaimUpdate, Decision, Ending};
use super::index::{ExpiryConfirmed, Learned, LeaseKey, PodEntry};
use super::metrics::{Metrics, WriteLabels};
use crate::conditions;
use crate::crd::{Lease, LeaseStatus};
use crate::kube_error::ApiErrorKind::{Conflict, Invalid, NotFound};

#[cfg(test)]
mod tests;

/// When a Lease is decided again after a pass: the one answer a pass gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// At the Lease's next deadline (an expiry, a pod recheck), if it has one: the
    /// pass did what the decision asked.
    AtDeadline,
    /// At once: the pass read (or wrote) what the next decision needs, e.g. the Lease
    /// after a conflict.
    Now,
    /// After [`Next::AFTER_ERROR`]: a call failed (no answer, a 5xx, a refusal we did
    /// not expect).
    AfterError,
    /// A quorum read refuted an ending: at once when what it read corrected the
    /// index; otherwise only the watches can, so after [`Next::AFTER_REFUTED`].
    Refuted,
}

impl Next {
    pub const AFTER_ERROR: Duration = Duration::from_millis(500);
    pub const AFTER_REFUTED: Duration = Duration::from_millis(500);
}

/// What one write pass reports back to the loop.
pub struct Outcome {
    pub(super) key: LeaseKey,
    /// Which kind of pass this was.
    pub(super) pass: Pass,
    /// What the pass wrote or read, for the index ([`super::index::Index::apply_outcome`]).
    pub(super) learned: Learned,
    pub(super) next: Next,
    /// The Lease status was written (a grant, a handover or a free).
    pub(super) wrote_lease: bool,
    /// The decision had claim mirrors this pass did not write ([`Pass::Decision`]).
    pub(super) mirrors_due: bool,
}

/// A pass either acts on a decision (confirm, the ended holder's claim, the Lease),
/// leaving the other claims' mirrors for later, or writes those mirrors only, from a
/// fresh decision, when nothing else waits (see `queue.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Decision,
    Mirrors,
}

/// Claim status writes in flight at once for one pass.
const CLAIM_WRITE_CONCURRENCY: usize = 4;

/// One pass's writes for one Lease: it runs the steps of a [`Decision`] in their
/// order, one short function each, and holds no rules of its own.
pub(super) struct WritePass<S> {
    pub(super) api: S,
    pub(super) key: LeaseKey,
    pub(super) metrics: Arc<Metrics>,
    pub(super) events: Publisher,
}

/// A step either lets the pass go on, or ends it with when to decide again.
type Step = std::result::Result<(), Next>;

impl<S: ApiServer> WritePass<S> {
    pub(super) async fn write(
        self,
        lease: Option<Lease>,
        decision: Decision,
        dirty_since: Instant,
        pass: Pass,
    ) -> Outcome {
        let mut outcome = Outcome {
            key: self.key.clone(),
            pass,
            learned: Learned {
                lease_uid: lease.as_ref().and_then(|l| l.metadata.uid.clone()),
                ..Learned::default()
            },
            next: Next::AtDeadline,
            wrote_lease: false,
            mirrors_due: false,
        };
        let steps = self.run(lease.as_ref(), &decision, dirty_since, &mut outcome);
        if let Err(next) = steps.await {
            outcome.next = next;
        }
        outcome
    }

    async fn run(
        &self,
        lease: Option<&Lease>,
        decision: &Decision,
        dirty_since: Instant,
        outcome: &mut Outcome,
    ) -> Step {
        self.confirm(lease, &decision.confirm, &mut outcome.learned)
            .await?;
        if !decision.confirm_expiry_early.is_empty() {
            self.confirm(lease, &decision.confirm_expiry_early, &mut outcome.learned)
                .await?;
        }
        if outcome.pass == Pass::Mirrors {
            return self
                .write_mirrors(&decision.mirrors, &mut outcome.learned)
                .await;
        }
        for mark in &decision.end_holder {
            self.end_holder(mark, &mut outcome.learned).await?;
        }
        if let (Some(status), Some(current)) = (&decision.lease_status, lease) {
            let written = self
                .write_lease(current, status, &mut outcome.learned)
                .await?;
            self.record_lease_write(&written, decision, dirty_since);
            outcome.learned.lease = Some(written);
            outcome
                .learned
                .expired_unmarked
                .clone_from(&decision.expired_unmarked);
            outcome.wrote_lease = true;
        }
        outcome.mirrors_due = !decision.mirrors.is_empty();
        Ok(())
    }

    /// Step 1. No ending on a stale view: confirms each check with a quorum read (a
    /// GET without a resourceVersion is served from etcd, not from a cache), and
    /// keeps what a refuting read showed.
    async fn confirm(
        &self,
        lease: Option<&Lease>,
        checks: &[Check],
        learned: &mut Learned,
    ) -> Step {
        let mut refuted = None;
        for check in checks {
            match self.confirm_one(lease, check, learned).await {
                Ok(true) => {}
                // The Lease moved on: the read has it, so decide again at once.
                Ok(false) if *check == Check::LeaseUnchanged => refuted = Some(Next::Now),
                Ok(false) => refuted = refuted.or(Some(Next::Refuted)),
                Err(e) => {
                    tracing::warn!(lease = %self.key, error = %e, reason = e.label(), "confirming a decision failed");
                    return Err(Next::AfterError);
                }
            }
        }
        match refuted {
            None => Ok(()),
            Some(next) => {
                tracing::info!(lease = %self.key, ?checks, "a fresh read refuted the decision; deciding again");
                Err(next)
            }
        }
    }

    /// Step 2. The ended holder's claim, before the Lease and conditioned on its
    /// resourceVersion, so a renewal that landed since keeps the grant.
    async fn end_holder(&self, mark: &ClaimUpdate, learned: &mut Learned) -> Step {
        let namespace = &self.key.namespace;
        match self.api.patch_claim_status(namespace, mark).await {
            Ok(written) => learned.written_claims.push(written),
            // Deleted meanwhile: the grant ends all the same (released).
            Err(e) if e.is(&[NotFound]) => {}
            Err(e) if e.is(&[Conflict, Invalid]) => {
                match self.api.get_claim(namespace, &mark.name).await {
                    // Unchanged: the guard held, so the refusal is a validation rule's
                    // or an admission policy's, not a renewal. Reading it as one would
                    // keep a dead holder's grant for ever.
                    Ok(Some(fresh))
                        if fresh.uid().as_deref() == Some(mark.uid.as_str())
                            && fresh.resource_version() == mark.condition_on =>
                    {
                        self.count_error("claim");
                        tracing::error!(lease = %self.key, claim = %mark.name, error = %e, reason = e.label(), "the API server refused the mark that ends the holder's grant, and the claim has not changed: an admission policy or validation rule refuses the controller's write; the grant cannot end until it is allowed");
                        return Err(Next::AfterError);
                    }
                    Ok(Some(fresh)) if fresh.uid().as_deref() == Some(mark.uid.as_str()) => {
                        tracing::info!(lease = %self.key, claim = %mark.name, "the holder's claim changed since the decision (a renewal?); deciding again");
                        learned.read_claims.push(fresh);
                    }
                    // Gone, or re-created under another UID: the grant ends all the same.
                    Ok(_) => return Ok(()),
                    Err(e) => {
                        tracing::warn!(lease = %self.key, error = %e, reason = e.label(), "re-reading a claim failed")
                    }
                }
                return Err(Next::Refuted);
            }
            Err(e) => {
                self.count_error("claim");
                tracing::warn!(lease = %self.key, claim = %mark.name, error = %e, reason = e.label(), "claim status write failed");
                return Err(Next::AfterError);
            }
        }
        Ok(())
    }

    /// Step 3. The Lease status, by compare-and-swap: PUT /status carries
    /// metadata.resourceVersion, and the API server refuses it with 409 if the Lease
    /// changed since we decided (DESIGN rule 2). On failure, reads the Lease again.
    async fn write_lease(
        &self,
        current: &Lease,
        status: &LeaseStatus,
        learned: &mut Learned,
    ) -> std::result::Result<Lease, Next> {
        let mut desired = current.clone();
        desired.status = Some(status.clone());
        let e = match self.api.replace_lease_status(&self.key, &desired).await {
            Ok(written) => return Ok(written),
            Err(e) => e,
        };
        let changed = e.is(&[Conflict, NotFound]);
        if changed {
            self.metrics
                .write_conflicts
                .get_or_create(&WriteLabels { kind: "lease" })
                .inc();
            tracing::debug!(lease = %self.key, "lease changed since read; re-reading");
        } else {
            self.count_error("lease");
            tracing::warn!(lease = %self.key, error = %e, reason = e.label(), "lease status write failed");
        }
        let next = if changed { Next::Now } else { Next::AfterError };
        Err(self.reread(learned, next).await)
    }

    /// Step 4 (a pass of its own). The claims' mirrors, a few at a time (different
    /// claims, so their order is free).
    async fn write_mirrors(&self, mirrors: &[ClaimUpdate], learned: &mut Learned) -> Step {
        // Owned, not borrowed: the pass is a boxed future, and a stream of borrowing
        // futures inside one trips the compiler's higher-ranked lifetime check.
        let mut results = futures::stream::iter(mirrors.to_vec())
            .map(|update| {
                let (api, namespace) = (self.api.clone(), self.key.namespace.clone());
                async move {
                    let result = api.patch_claim_status(&namespace, &update).await;
                    (update, result)
                }
            })
            .buffer_unordered(CLAIM_WRITE_CONCURRENCY);
        let mut step = Ok(());
        while let Some((update, result)) = results.next().await {
            match result {
                // Keep the index at least as new as our own writes, so the next
                // decision does not work from the mirror as it was before them.
                Ok(written) => learned.written_claims.push(written),
                // Deleted, or re-created (the UID test failed): its own watch event re-decides.
                Err(e) if e.is(&[NotFound, Conflict, Invalid]) => {}
                Err(e) => {
                    self.count_error("claim");
                    tracing::warn!(lease = %self.key, claim = %update.name, error = %e, reason = e.label(), "claim status write failed");
                    step = Err(Next::AfterError);
                }
            }
        }
        step
    }

    fn count_error(&self, kind: &'static str) {
        self.metrics
            .write_errors
            .get_or_create(&WriteLabels { kind })
            .inc();
    }

    fn record_lease_write(&self, written: &Lease, decision: &Decision, dirty_since: Instant) {
        let semaphore = written.status.as_ref().is_some_and(|s| s.held.is_some());
        for ended in &decision.ended {
            let (counter, kind) = match ended.how {
                Ending::Released => (&self.metrics.releases, events::Kind::Normal),
                Ending::Expired => (&self.metrics.expirations, events::Kind::Warning),
                Ending::Revoked(_) => (&self.metrics.revocations, events::Kind::Warning),
            };
            counter.inc();
            let why = match &ended.how {
                Ending::Released => conditions::messages::CLAIM_DELETED.to_string(),
                Ending::Expired => conditions::messages::NO_RENEWAL.to_string(),
                Ending::Revoked(why) => why.clone(),
            };
            tracing::info!(lease = %self.key, slot = ended.slot, claim = %ended.claim, token = ?ended.token, reason = ended.how.reason(), %why, "grant ended");
            self.events.publish_on(
                written,
                kind,
                ended.how.reason(),
                conditions::messages::ended_event(
                    &self.key.name,
                    &ended.identity,
                    semaphore.then_some(ended.slot),
                    ended.token.unwrap_or_default(),
                    &why,
                ),
            );
        }
        for granted in &decision.granted {
            self.metrics.grants.inc();
            // A handover: the slot's grant ended in this same write.
            if decision.ended.iter().any(|e| e.slot == granted.slot) {
                self.metrics
                    .handover_latency
                    .observe(dirty_since.elapsed().as_secs_f64());
            }
            tracing::info!(lease = %self.key, slot = granted.slot, claim = %granted.claim, holder = %granted.identity, token = granted.token, "granted");
            self.events.publish_on(
                written,
                events::Kind::Normal,
                conditions::reasons::GRANTED,
                conditions::messages::granted_event(
                    &granted.identity,
                    &granted.claim,
                    semaphore.then_some(granted.slot),
                    granted.token,
                ),
            );
        }
    }

    /// One check: Ok(false) when the read refutes it.
    async fn confirm_one(
        &self,
        lease: Option<&Lease>,
        check: &Check,
        learned: &mut Learned,
    ) -> Result<bool> {
        let (key, namespace) = (&self.key, &*self.key.namespace);
        match check {
            Check::ClaimGone { name, uid } => {
                if let Some(claim) = self.api.get_claim(namespace, name).await?
                    && claim.uid().as_deref() == Some(uid.as_str())
                    && claim.metadata.deletion_timestamp.is_none()
                {
                    learned.read_claims.push(claim);
                    return Ok(false);
                }
            }
            Check::PodGone { name, uid } => {
                if let Some(pod) = self.api.get_pod(namespace, name).await?
                    && PodEntry::of(&pod).problem(uid.as_deref()).is_none()
                {
                    learned.read_pods.push(pod);
                    return Ok(false);
                }
            }
            Check::NotRenewed {
                name,
                uid,
                renew_time,
                token,
            } => {
                if let Some(claim) = self.api.get_claim(namespace, name).await?
                    && claim.uid().as_deref() == Some(uid.as_str())
                    && claim.spec.renew_time.as_ref().map(|t| t.0) != *renew_time
                {
                    learned.read_claims.push(claim);
                    return Ok(false);
                }
                learned.expiries_confirmed.push(ExpiryConfirmed {
                    uid: uid.clone(),
                    renew_time: *renew_time,
                    token: *token,
                });
            }
            // The index missed it: wait for the Lease watch to deliver it.
            Check::LeaseGone => return Ok(self.api.get_lease(key).await?.is_none()),
            Check::LeaseUnchanged => {
                let current_rv = lease.and_then(|l| l.resource_version());
                match self.api.get_lease(key).await? {
                    Some(fresh) if fresh.resource_version() == current_rv => {}
                    Some(fresh) => {
                        learned.lease = Some(fresh);
                        return Ok(false);
                    }
                    None => {
                        learned.lease_gone = true;
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// After a failed Lease write: reads the Lease again, for the next decision.
    async fn reread(&self, learned: &mut Learned, next: Next) -> Next {
        match self.api.get_lease(&self.key).await {
            Ok(Some(fresh)) => learned.lease = Some(fresh),
            Ok(None) => learned.lease_gone = true,
            Err(e) => {
                tracing::warn!(lease = %self.key, error = %e, reason = e.label(), "re-reading lease failed");
                return Next::AfterError;
            }
        }
        next
    }
}
