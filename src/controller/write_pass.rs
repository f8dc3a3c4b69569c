//! One write pass: confirm what a decision relies on, then write it, each call
//! conditioned on what the decision was computed from (DESIGN rule 2, "Endings are
//! confirmed"); and when to decide the Lease again if the pass did not settle it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::api_server::ApiServer;
use super::error::Result;
use super::events::{self, Publisher};
use super::grant::{Check, ClaimUpdate, Decision, Ending};
use super::index::{LeaseKey, PodEntry};
use super::metrics::{Metrics, WriteLabels};
use crate::api::{Lease, LeaseClaim};
use crate::api_error::ApiErrorKind::{Conflict, Invalid, NotFound};
use crate::conditions;

/// The named retry policies: when a Lease is decided again after a pass that left it
/// unsettled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// At once: the pass read (or wrote) what the next decision needs, e.g. the Lease
    /// after a conflict.
    Now,
    /// After [`Retry::AFTER_ERROR`]: a call failed (no answer, a 5xx, a refusal we did
    /// not expect).
    AfterError,
    /// After [`Retry::AFTER_REFUTED`]: a quorum read refuted an ending but showed an
    /// object the index does not hold, so only the watches can correct the index.
    AfterRefuted,
}

impl Retry {
    pub const AFTER_ERROR: Duration = Duration::from_millis(500);
    pub const AFTER_REFUTED: Duration = Duration::from_millis(500);

    pub fn delay(self) -> Duration {
        match self {
            Retry::Now => Duration::ZERO,
            Retry::AfterError => Self::AFTER_ERROR,
            Retry::AfterRefuted => Self::AFTER_REFUTED,
        }
    }
}

/// What one write pass reports back to the loop.
pub struct Outcome {
    pub(super) key: LeaseKey,
    /// The UID of the Lease object the decision was computed for: the outcome
    /// applies to that object only, never to one re-created under the same name.
    pub(super) lease_uid: Option<String>,
    /// The Lease as written, or as freshly read after a conflict.
    pub(super) lease: Option<Lease>,
    /// The Lease no longer exists (read after a conflict).
    pub(super) lease_gone: bool,
    /// Claims as written by this pass.
    pub(super) claims: Vec<LeaseClaim>,
    /// Claims and pods as a quorum read showed them when it refuted an ending: applied
    /// only to the objects (UIDs) the index holds, so a read never resurrects one.
    pub(super) fresh_claims: Vec<LeaseClaim>,
    pub(super) fresh_pods: Vec<Pod>,
    /// A quorum read refuted the decision: nothing was written; decide again.
    pub(super) refuted: bool,
    /// When to decide again; None: at the Lease's next deadline (expiry, pod recheck).
    pub(super) retry_after: Option<Retry>,
    pub(super) handed_over: bool,
    /// Which kind of pass this was.
    pub(super) pass: Pass,
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

/// One pass's writes for one Lease, in DESIGN's order: confirm, the holder's claim,
/// the Lease; the other claims' mirrors in a pass of their own ([`Pass::Mirrors`]).
pub(super) struct WritePass<S> {
    pub(super) api: S,
    pub(super) metrics: Arc<Metrics>,
    pub(super) events: Publisher,
}

impl<S: ApiServer> WritePass<S> {
    pub(super) async fn write(
        self,
        key: LeaseKey,
        lease: Option<Lease>,
        decision: Decision,
        dirty_since: Instant,
        pass: Pass,
    ) -> Outcome {
        let mut outcome = Outcome {
            key: key.clone(),
            lease_uid: lease.as_ref().and_then(|l| l.metadata.uid.clone()),
            lease: None,
            lease_gone: false,
            claims: Vec::new(),
            fresh_claims: Vec::new(),
            fresh_pods: Vec::new(),
            refuted: false,
            retry_after: None,
            handed_over: false,
            pass,
            mirrors_due: false,
        };
        // 1. No ending on a stale view: confirm what it relies on with quorum reads.
        match self
            .confirm(&key, lease.as_ref(), &decision.checks, &mut outcome)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(lease = %key, checks = ?decision.checks, "a fresh read refuted the decision; deciding again");
                outcome.refuted = true;
                return outcome;
            }
            Err(e) => {
                tracing::warn!(lease = %key, error = %e, reason = e.label(), "confirming a decision failed");
                outcome.retry_after = Some(Retry::AfterError);
                return outcome;
            }
        }
        // 2. The holder's claim, when its grant ends: before the Lease, conditioned on
        // its resourceVersion, so a renewal that landed since keeps the grant.
        let (first, rest): (Vec<ClaimUpdate>, Vec<ClaimUpdate>) = decision
            .claim_updates
            .iter()
            .cloned()
            .partition(|u| u.condition_on.is_some());
        for update in &first {
            match self.api.patch_claim_status(&key.namespace, update).await {
                Ok(written) => outcome.claims.push(written),
                // Deleted meanwhile: the grant ends all the same (released).
                Err(e) if e.is(&[NotFound]) => {}
                Err(e) if e.is(&[Conflict, Invalid]) => {
                    tracing::info!(lease = %key, claim = %update.name, "the holder's claim changed since the decision (a renewal?); deciding again");
                    match self.api.get_claim(&key.namespace, &update.name).await {
                        Ok(Some(fresh)) if fresh.uid().as_deref() == Some(update.uid.as_str()) => {
                            outcome.fresh_claims.push(fresh);
                        }
                        // Gone, or re-created under another UID: the grant ends all the same.
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::warn!(lease = %key, error = %e, reason = e.label(), "re-reading a claim failed")
                        }
                    }
                    outcome.refuted = true;
                    return outcome;
                }
                Err(e) => {
                    self.metrics
                        .write_errors
                        .get_or_create(&WriteLabels { kind: "claim" })
                        .inc();
                    tracing::warn!(lease = %key, claim = %update.name, error = %e, reason = e.label(), "claim status write failed");
                    outcome.retry_after = Some(Retry::AfterError);
                    return outcome;
                }
            }
        }
        let mut wrote_lease = false;
        if let (Some(status), Some(current)) = (&decision.lease_status, &lease) {
            let mut desired = current.clone();
            desired.status = Some(status.clone());
            // PUT /status carries metadata.resourceVersion: the API server refuses it
            // with 409 if the Lease changed since we decided (DESIGN rule 2).
            match self.api.replace_lease_status(&key, &desired).await {
                Ok(written) => {
                    wrote_lease = true;
                    outcome.lease = Some(written.clone());
                    self.record_lease_write(&key, &written, &decision, dirty_since);
                }
                Err(e) => {
                    let changed = e.is(&[Conflict, NotFound]);
                    if changed {
                        self.metrics
                            .write_conflicts
                            .get_or_create(&WriteLabels { kind: "lease" })
                            .inc();
                        tracing::debug!(lease = %key, "lease changed since read; re-reading");
                    } else {
                        self.metrics
                            .write_errors
                            .get_or_create(&WriteLabels { kind: "lease" })
                            .inc();
                        tracing::warn!(lease = %key, error = %e, reason = e.label(), "lease status write failed");
                    }
                    let retry = if changed {
                        Retry::Now
                    } else {
                        Retry::AfterError
                    };
                    return self.reread(outcome, retry).await;
                }
            }
        }
        // 3. The claims' mirrors, a few at a time (different claims, so their order is free).
        if pass == Pass::Decision {
            outcome.mirrors_due = !rest.is_empty();
            outcome.handed_over = wrote_lease;
            return outcome;
        }
        let mut results = futures::stream::iter(rest)
            .map(|update| {
                let api = self.api.clone();
                let namespace = key.namespace.clone();
                async move {
                    let result = api.patch_claim_status(&namespace, &update).await;
                    (update.name, result)
                }
            })
            .buffer_unordered(CLAIM_WRITE_CONCURRENCY);
        while let Some((name, result)) = results.next().await {
            match result {
                // Keep the index at least as new as our own writes, so the next
                // decision does not work from the mirror as it was before them.
                Ok(written) => outcome.claims.push(written),
                // Deleted, or re-created (the UID test failed): its own watch event re-decides.
                Err(e) if e.is(&[NotFound, Conflict, Invalid]) => {}
                Err(e) => {
                    self.metrics
                        .write_errors
                        .get_or_create(&WriteLabels { kind: "claim" })
                        .inc();
                    tracing::warn!(lease = %key, claim = %name, error = %e, reason = e.label(), "claim status write failed");
                    outcome.retry_after = Some(Retry::AfterError);
                }
            }
        }
        outcome.handed_over = wrote_lease;
        outcome
    }

    fn record_lease_write(
        &self,
        key: &LeaseKey,
        written: &Lease,
        decision: &Decision,
        dirty_since: Instant,
    ) {
        if let Some(ended) = &decision.ended {
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
            tracing::info!(lease = %key, claim = %ended.claim, token = ?ended.token, reason = ended.how.reason(), %why, "grant ended");
            self.events.publish_on(
                written,
                kind,
                ended.how.reason(),
                conditions::messages::ended_event(
                    &key.name,
                    &ended.identity,
                    ended.token.unwrap_or_default(),
                    &why,
                ),
            );
        }
        if let Some(granted) = &decision.granted {
            self.metrics.grants.inc();
            if decision.ended.is_some() {
                self.metrics
                    .handover_latency
                    .observe(dirty_since.elapsed().as_secs_f64());
            }
            tracing::info!(lease = %key, claim = %granted.claim, holder = %granted.identity, token = granted.token, "granted");
            self.events.publish_on(
                written,
                events::Kind::Normal,
                conditions::reasons::GRANTED,
                conditions::messages::granted_event(
                    &granted.identity,
                    &granted.claim,
                    granted.token,
                ),
            );
        }
    }

    /// Confirms each check with a quorum read (a GET without a resourceVersion is
    /// served from etcd, not from a cache). Ok(false): one was refuted; what the read
    /// showed is in `outcome`.
    async fn confirm(
        &self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        checks: &[Check],
        outcome: &mut Outcome,
    ) -> Result<bool> {
        let mut confirmed = true;
        for check in checks {
            match check {
                Check::ClaimGone { name, uid } => {
                    if let Some(claim) = self.api.get_claim(&key.namespace, name).await?
                        && claim.uid().as_deref() == Some(uid.as_str())
                        && claim.metadata.deletion_timestamp.is_none()
                    {
                        outcome.fresh_claims.push(claim);
                        confirmed = false;
                    }
                }
                Check::PodGone { name, uid } => {
                    if let Some(pod) = self.api.get_pod(&key.namespace, name).await?
                        && PodEntry::of(&pod).problem(uid.as_deref()).is_none()
                    {
                        outcome.fresh_pods.push(pod);
                        confirmed = false;
                    }
                }
                Check::LeaseGone => {
                    if self.api.get_lease(key).await?.is_some() {
                        // The index missed it: wait for the Lease watch to deliver it.
                        confirmed = false;
                    }
                }
                Check::LeaseUnchanged => {
                    let current_rv = lease.and_then(|l| l.resource_version());
                    match self.api.get_lease(key).await? {
                        Some(fresh) if fresh.resource_version() == current_rv => {}
                        Some(fresh) => {
                            outcome.lease = Some(fresh);
                            outcome.retry_after = Some(Retry::Now);
                            confirmed = false;
                        }
                        None => {
                            outcome.lease_gone = true;
                            outcome.retry_after = Some(Retry::Now);
                            confirmed = false;
                        }
                    }
                }
            }
        }
        Ok(confirmed)
    }

    /// After a failed write: read the Lease again and decide once more.
    async fn reread(&self, mut outcome: Outcome, retry: Retry) -> Outcome {
        match self.api.get_lease(&outcome.key).await {
            Ok(Some(fresh)) => outcome.lease = Some(fresh),
            Ok(None) => outcome.lease_gone = true,
            Err(e) => {
                tracing::warn!(lease = %outcome.key, error = %e, reason = e.label(), "re-reading lease failed");
                outcome.retry_after = Some(Retry::AfterError);
                return outcome;
            }
        }
        outcome.retry_after = Some(retry);
        outcome
    }
}
