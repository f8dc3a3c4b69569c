//! The controller's one task: [`Loop`] owns the index and the work queue, decides
//! dirty Leases, starts their write passes and applies what they report.
//!
//! # Outcomes per object
//!
//! A write's result (the Lease as written, or found gone on a re-read) is applied to
//! the index only while it still holds the Lease object (UID) the write was computed
//! for, so a Lease deleted and re-created under the same name while a write was in
//! flight is never overwritten or forgotten. Likewise a pass's claims (those it
//! wrote, or read to refute a decision) are applied only for claims whose UID the
//! index still holds (`Index::apply_outcome`): a delete event that arrived while the
//! pass ran wins. Found by the storm model (`model_tests`): before, a claim deleted
//! during a pass came back as a ghost that could be granted the Lease (and then
//! expired, a lease duration lost).

use std::sync::Arc;
use std::time::Instant;

use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::watcher::Event;

use super::api_server::ApiServer;
use super::events::{self, Publisher};
use super::grant::{self, Work};
use super::index::{Index, LeaseKey};
use super::metrics::Metrics;
use super::queue::WorkQueue;
use super::write_pass::{Next, Outcome, Pass, WritePass};
use super::{ControllerConfig, Input};
use crate::admin::Readiness;
use crate::conditions;

#[cfg(test)]
mod tests;

/// One controller's state: the index, the work queue and how to write. It decides
/// and starts write passes; [`run`](super::run) (or a test) runs them and hands their outcomes
/// back to [`Loop::finish`]. Every step takes the controller's clock reading.
pub(crate) struct Loop<S> {
    api: S,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    events: Publisher,
    index: Index,
    queue: WorkQueue<LeaseKey>,
    /// Passes in flight, by kind.
    decision_passes: usize,
    mirror_passes: usize,
}

impl<S: ApiServer> Loop<S> {
    pub fn new(api: S, config: ControllerConfig, metrics: Arc<Metrics>, events: Publisher) -> Self {
        Loop {
            api,
            config,
            metrics,
            events,
            index: Index::default(),
            queue: WorkQueue::default(),
            decision_passes: 0,
            mirror_passes: 0,
        }
    }

    /// A decision is waiting or being written: Events hold back until it is done.
    pub fn has_urgent_work(&self) -> bool {
        !self.queue.is_empty() || self.decision_passes > 0
    }

    /// Every watch has delivered its initial list.
    pub fn is_synced(&self) -> bool {
        self.index.is_synced()
    }

    #[cfg(test)]
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Queues the Lease for a decision.
    pub fn mark_dirty(&mut self, key: LeaseKey, now: Instant) {
        self.queue.mark_dirty(key, now);
    }

    /// Write passes that may run at once.
    pub fn concurrency(&self) -> usize {
        self.config.concurrency
    }

    /// Waits for the next timer (an expiry, a pod recheck, a retry) and queues its
    /// Lease; None at once when no timer is set.
    pub async fn expired(&mut self) -> Option<LeaseKey> {
        self.queue.expired().await
    }

    /// On becoming leader (after the caches synced): every Lease is decided. Holder
    /// clocks are not restarted: they started when this process first saw each holder
    /// or its latest renewal, which is never before that write landed, so they give a
    /// holder at least its duration (DESIGN rule 4), and leadership that changes often
    /// cannot postpone an expiry; a renewal this replica missed fails the ending's
    /// confirmation ("Endings are confirmed").
    pub fn take_leadership(&mut self, now: Instant) {
        for key in self.index.keys() {
            self.mark_dirty(key, now);
        }
    }

    /// Unwraps a guarded watch event; an unreadable object is reported (log, metric,
    /// Warning event on it) and dropped, and the last readable version stays in the index.
    fn screen<K>(&self, ev: Event<DeserializeGuard<K>>) -> Option<Event<K>>
    where
        K: Resource<DynamicType = ()>,
    {
        let take = |guard: DeserializeGuard<K>| match guard.0 {
            Ok(object) => Some(object),
            Err(invalid) => {
                self.report_invalid::<K>(invalid);
                None
            }
        };
        match ev {
            Event::Apply(g) => take(g).map(Event::Apply),
            Event::Delete(g) => take(g).map(Event::Delete),
            Event::InitApply(g) => take(g).map(Event::InitApply),
            Event::Init => Some(Event::Init),
            Event::InitDone => Some(Event::InitDone),
        }
    }

    fn report_invalid<K: Resource<DynamicType = ()>>(&self, invalid: InvalidObject) {
        let meta = invalid.metadata;
        tracing::warn!(
            kind = %K::kind(&()),
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            name = meta.name.as_deref().unwrap_or_default(),
            error = %invalid.error,
            "skipping an object that cannot be read"
        );
        self.metrics.invalid_objects.inc();
        let reference = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            ..Default::default()
        };
        self.events.publish(
            reference,
            events::Kind::Warning,
            conditions::reasons::INVALID_OBJECT,
            conditions::messages::invalid_object(&invalid.error),
        );
    }

    /// Feeds one watch item to the index and queues the Leases it touched.
    pub fn handle_input(&mut self, input: Input, ready: &Readiness, now: Instant) {
        let touched = match input {
            Input::Lease(Ok(ev)) => self
                .screen(ev)
                .map(|ev| self.index.handle(ev, now))
                .unwrap_or_default(),
            Input::Claim(Ok(ev)) => self
                .screen(ev)
                .map(|ev| self.index.handle(ev, now))
                .unwrap_or_default(),
            Input::Pod(Ok(ev)) => self.index.handle(ev, now),
            Input::Lease(Err(e)) | Input::Claim(Err(e)) | Input::Pod(Err(e)) => {
                // The watcher retries with backoff; a malformed object shows up here too.
                tracing::warn!(error = %e, "watch error");
                Vec::new()
            }
        };
        if self.is_synced() && !ready.get() {
            tracing::info!(leases = self.index.lease_count(), "caches synced");
            ready.set(true);
            for key in self.index.keys() {
                self.mark_dirty(key, now);
            }
        }
        for key in touched {
            self.mark_dirty(key, now);
        }
        self.publish_counts();
    }

    /// The index's running counts, as gauges.
    fn publish_counts(&self) {
        let m = &self.metrics;
        m.leases.set(self.index.lease_count() as i64);
        m.leases_held.set(self.index.held_count() as i64);
        m.claims_waiting.set(self.index.waiting_count() as i64);
        m.longest_queue.set(self.index.longest_queue() as i64);
    }

    /// Decides dirty Leases (that have no write in flight) until one needs a write, and
    /// returns it; with none dirty, writes the claim mirrors of one deferred Lease.
    pub fn next_write(&mut self, now: Instant) -> Option<BoxFuture<'static, Outcome>> {
        loop {
            let (key, dirty_since, pass) = match self.queue.next_ready(now) {
                Some((key, since)) => (key, since, Pass::Decision),
                // Mirrors keep at most half the slots, so a grant that comes up while
                // they are written finds one free.
                None if self.mirror_passes < self.mirror_slots() => {
                    (self.queue.next_deferred()?, now, Pass::Mirrors)
                }
                None => return None,
            };
            let Some(view) = self.index.view(&key, now) else {
                continue;
            };
            // Decided afresh for mirrors too: they show the latest state, never one
            // older than a write already made, and never a claim deleted since.
            let decision = grant::decide(&view, now, Timestamp::now());
            let lease = view.lease.cloned();
            let wake_at = view.wake_at();
            let pass = match (decision.work(), pass) {
                (Work::Urgent, _) => Pass::Decision,
                (Work::Mirrors, Pass::Mirrors) => Pass::Mirrors,
                (Work::Mirrors, Pass::Decision) => {
                    self.queue.defer(key.clone());
                    self.queue.schedule(&key, wake_at);
                    continue;
                }
                (Work::None, _) => {
                    self.queue.schedule(&key, wake_at);
                    continue;
                }
            };
            self.begin(key.clone(), pass);
            let writer = WritePass {
                api: self.api.clone(),
                key,
                metrics: self.metrics.clone(),
                events: self.events.clone(),
            };
            return Some(writer.write(lease, decision, dirty_since, pass).boxed());
        }
    }

    /// A pass for `key` is in flight.
    fn begin(&mut self, key: LeaseKey, pass: Pass) {
        match pass {
            Pass::Decision => self.decision_passes += 1,
            Pass::Mirrors => self.mirror_passes += 1,
        }
        self.queue.start(key);
    }

    fn mirror_slots(&self) -> usize {
        self.config.concurrency.div_ceil(2)
    }

    /// Applies a write pass's outcome to the index and decides when to look again.
    pub fn finish(&mut self, outcome: Outcome, now: Instant) {
        let key = outcome.key;
        self.queue.finish(&key);
        match outcome.pass {
            Pass::Decision => self.decision_passes -= 1,
            Pass::Mirrors => self.mirror_passes -= 1,
        }
        if outcome.mirrors_due {
            self.queue.defer(key.clone());
        }
        let refreshed = self.index.apply_outcome(&key, outcome.learned, now);
        if outcome.wrote_lease {
            self.publish_counts();
        }
        self.metrics
            .mirrors_deferred
            .set(self.queue.deferred_len() as i64);
        match outcome.next {
            Next::Now => self.mark_dirty(key, now),
            // With the index corrected, decide at once; otherwise wait for the watches.
            Next::Refuted if refreshed => self.mark_dirty(key, now),
            Next::Refuted => self.queue.schedule(&key, Some(now + Next::AFTER_REFUTED)),
            Next::AfterError => self.queue.schedule(&key, Some(now + Next::AFTER_ERROR)),
            Next::AtDeadline => {
                let deadline = self.index.view(&key, now).and_then(|v| v.wake_at());
                self.queue.schedule(&key, deadline);
            }
        }
    }
}
