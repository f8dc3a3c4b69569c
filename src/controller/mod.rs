//! The lease controller: watches feed the `Index`; dirty Leases are decided
//! by `grant::decide` and written, one Lease status write per decision,
//! conditioned on the resourceVersion it was computed from (DESIGN rule 2).
//!
//! One task owns the index and the work queue, so no locks; the API writes run
//! concurrently (never two for the same Lease) and report back to that task.
//! We use kube-runtime's watcher (relist, backoff) but not its `Controller`:
//! our unit of work is a Lease *name*, which claims may name before the Lease
//! exists, and expiry needs per-holder timers on the controller's own clock.
//!
//! Under load only the Lease write is urgent: a pass acts on a decision (confirm,
//! the ended holder's claim, the Lease) and leaves the other claims' status mirrors
//! to a [`Pass::Mirrors`] of their own, started when no Lease is dirty, decided
//! afresh, on at most half the write slots; Events are held back while a decision
//! waits or is written (DESIGN.md, "Storms").
//!
//! The parts: [`WorkQueue`] (which Leases to decide, and when), `Index::handle`
//! (every watch event, relists included), `ApiServer` (the API calls a write pass
//! makes, with [`KubeApiServer`] the API server), a write pass with its named [`Retry`]
//! policies, and [`Error`]. `Loop` joins them; [`run`] feeds it from the watches,
//! and tests drive it directly (`model_tests.rs`).

mod api_server;
#[doc(hidden)]
pub mod election;
mod error;
mod events;
mod grant;
mod index;
pub mod metrics;
#[cfg(test)]
mod model_tests;
mod queue;
mod slim;
mod write_pass;

pub(crate) use api_server::ApiServer;
pub use api_server::KubeApiServer;
pub use error::{Error, Result};
use events::Publisher;
use index::{Index, LeaseKey};
use metrics::Metrics;
pub use queue::WorkQueue;
pub(crate) use write_pass::Outcome;
use write_pass::WritePass;
pub use write_pass::{Pass, Retry};

use std::sync::Arc;
use std::time::Instant;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admin::Readiness;
use crate::api::{Lease, LeaseClaim};
use crate::conditions;
use crate::kube_client::CONTROLLER_WATCH_TIMEOUT_SECS;
use crate::watch_backoff::backoff;

#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Watch one namespace, or all when None.
    pub namespace: Option<String>,
    /// Concurrent Lease writes (different Leases).
    pub concurrency: usize,
    /// Name reported in Events.
    pub instance: String,
}

/// One item of the three watch streams.
// Each input is moved once from the watch stream into the index; boxing buys nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Input {
    Lease(Result<Event<DeserializeGuard<Lease>>, watcher::Error>),
    Claim(Result<Event<DeserializeGuard<LeaseClaim>>, watcher::Error>),
    Pod(Result<Event<Pod>, watcher::Error>),
}

/// Runs until `shutdown`; grants only while `leading` is true.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    ready: Readiness,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    // DeserializeGuard: an object we cannot read is reported and skipped instead
    // of failing (and endlessly restarting) the whole watch (DESIGN rule 8).
    type Leases = Api<DeserializeGuard<Lease>>;
    type Claims = Api<DeserializeGuard<LeaseClaim>>;
    let (leases, claims, pods): (Leases, Claims, Api<Pod>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    // Short server-side timeouts, so the read timeout of the controller's client
    // (`crate::kube_client`) notices a dead watch connection within seconds.
    let wc = watcher::Config::default().timeout(CONTROLLER_WATCH_TIMEOUT_SECS);
    // Objects are slimmed as they arrive, before the index holds on to them: it
    // keeps only what decisions need (see `slim`).
    let inputs = futures::stream::select_all(vec![
        watcher::watcher(leases, wc.clone())
            .modify(slim::slim_guarded::<Lease>)
            .backoff(backoff())
            .map(Input::Lease)
            .boxed(),
        watcher::watcher(claims, wc.clone())
            .modify(slim::slim_guarded::<LeaseClaim>)
            .backoff(backoff())
            .map(Input::Claim)
            .boxed(),
        watcher::watcher(pods, wc)
            .modify(slim::slim_pod)
            .backoff(backoff())
            .map(Input::Pod)
            .boxed(),
    ]);
    let mut inputs = Box::pin(inputs.take_until(shutdown.clone().cancelled_owned()));

    let (busy, events_wait) = watch::channel(false);
    let events = Publisher::spawn_behind(
        client.clone(),
        &config.instance,
        metrics.clone(),
        events_wait,
    );
    let mut state = Loop::new(KubeApiServer::new(client), config, metrics, events);
    let mut writes = FuturesUnordered::new();
    let mut was_leading = false;

    loop {
        let is_leading = *leading.borrow();
        if is_leading && !was_leading && state.is_synced() {
            state.take_leadership(Instant::now());
            was_leading = true;
        }
        // Stepped down: start nothing (writes in flight finish; they are
        // compare-and-swap), and take leadership afresh if it comes back.
        was_leading &= is_leading;
        busy.send_if_modified(|busy| {
            let now = is_leading && state.has_urgent_work();
            std::mem::replace(busy, now) != now
        });
        if is_leading && state.is_synced() {
            while writes.len() < state.config.concurrency {
                let Some(fut) = state.next_write(Instant::now()) else {
                    break;
                };
                writes.push(fut);
            }
        }
        tokio::select! {
            input = inputs.next() => match input {
                Some(input) => state.handle_input(input, &ready, Instant::now()),
                None => break, // shutdown
            },
            Some(_) = state.queue.expired() => {}
            Some(outcome) = writes.next() => state.finish(outcome, Instant::now()),
            changed = leading.changed() => {
                if changed.is_err() { break; }
            }
        }
    }
    // Stop granting; let in-flight writes finish so no decision is left half-written.
    ready.set(false);
    while let Some(outcome) = writes.next().await {
        state.finish(outcome, Instant::now());
    }
    tracing::info!("controller stopped");
}

/// One controller's state: the index, the work queue and how to write. It decides
/// and starts write passes; [`run`] (or a test) runs them and hands their outcomes
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

    /// Waits for the next timer (an expiry, a pod recheck, a retry) and queues its
    /// Lease; None at once when no timer is set. ([`run`] polls its queue directly.)
    #[cfg(test)]
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
        self.metrics.leases.set(self.index.lease_count() as i64);
        self.metrics.leases_held.set(self.index.held_count() as i64);
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
            let wake_at = earliest(view.holder_deadline, view.pod_recheck);
            let urgent = decision.lease_status.is_some()
                || decision
                    .claim_updates
                    .iter()
                    .any(|u| u.condition_on.is_some());
            let mirrors = decision
                .claim_updates
                .iter()
                .any(|u| u.condition_on.is_none());
            let pass = match (urgent, mirrors, pass) {
                (true, _, _) => Pass::Decision,
                (false, true, Pass::Mirrors) => Pass::Mirrors,
                (false, true, Pass::Decision) => {
                    self.queue.defer(key.clone());
                    self.queue.schedule(&key, wake_at);
                    continue;
                }
                (false, false, _) => {
                    self.queue.schedule(&key, wake_at);
                    continue;
                }
            };
            self.begin(key.clone(), pass);
            let writer = WritePass {
                api: self.api.clone(),
                metrics: self.metrics.clone(),
                events: self.events.clone(),
            };
            return Some(
                writer
                    .write(key, lease, decision, dirty_since, pass)
                    .boxed(),
            );
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
    pub fn finish(&mut self, mut outcome: Outcome, now: Instant) {
        self.queue.finish(&outcome.key);
        match outcome.pass {
            Pass::Decision => self.decision_passes -= 1,
            Pass::Mirrors => self.mirror_passes -= 1,
        }
        if outcome.mirrors_due {
            self.queue.defer(outcome.key.clone());
        }
        // Only to the object the write was computed for, and only while the index still
        // holds it: a delete event that arrived while the write was in flight wins
        // (re-adding the object would leave a ghost Lease that nothing corrects), and a
        // Lease re-created under the same name is never overwritten or removed.
        let held = self
            .index
            .lease(&outcome.key)
            .map(|l| l.metadata.uid.clone());
        let ours = held.is_some() && held == Some(outcome.lease_uid.clone());
        if let Some(lease) = outcome.lease {
            if ours {
                // Its new version, or (read after a failed write) its successor.
                self.index.apply_lease(lease, now);
            }
        } else if outcome.lease_gone
            && ours
            && let Some(lease) = self.index.lease(&outcome.key).map(|l| (**l).clone())
        {
            self.index.delete_lease(&lease);
        }
        // Claims as written, or as a quorum read showed them: applied only to the
        // objects (UIDs) the index still holds, so neither resurrects a claim whose
        // delete event arrived while the pass ran (a ghost that could be granted).
        for claim in outcome.claims {
            if self.index_holds_claim(&claim) {
                self.index.apply_claim(claim, now);
            }
        }
        let mut refreshed = false;
        for claim in outcome.fresh_claims {
            if self.index_holds_claim(&claim) {
                refreshed |= !self.index.apply_claim(claim, now).is_empty();
            }
        }
        for mut pod in outcome.fresh_pods {
            slim::slim_pod(&mut pod);
            let namespace = pod.namespace().unwrap_or_default();
            if self.index.pod_uid(&namespace, &pod.name_any()) == pod.uid().as_deref() {
                refreshed |= !self.index.apply_pod(&pod).is_empty();
            }
        }
        if outcome.refuted && outcome.retry_after.is_none() {
            // With the index corrected, decide at once; otherwise wait for the watches.
            outcome.retry_after = Some(if refreshed {
                Retry::Now
            } else {
                Retry::AfterRefuted
            });
        }
        if outcome.handed_over {
            self.metrics.leases_held.set(self.index.held_count() as i64);
        }
        self.metrics
            .mirrors_deferred
            .set(self.queue.deferred_len() as i64);
        match outcome.retry_after {
            Some(Retry::Now) => self.mark_dirty(outcome.key, now),
            Some(retry) => self.queue.schedule(&outcome.key, Some(now + retry.delay())),
            None => {
                let deadline = self
                    .index
                    .view(&outcome.key, now)
                    .and_then(|v| earliest(v.holder_deadline, v.pod_recheck));
                self.queue.schedule(&outcome.key, deadline);
            }
        }
    }
}

impl<S> Loop<S> {
    fn index_holds_claim(&self, claim: &LeaseClaim) -> bool {
        let namespace = claim.namespace().unwrap_or_default();
        self.index.claim_uid(&namespace, &claim.name_any()) == claim.uid().as_deref()
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LeasePhase;
    use crate::fixtures::LeaseBuilder;

    /// A client for tests that never reach the API server (its calls fail at once).
    fn offline_client() -> Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, tower::BoxError>("offline".into())
        });
        Client::new(service, "default")
    }

    fn outcome(lease_uid: &str, lease: Option<Lease>, lease_gone: bool) -> Outcome {
        Outcome {
            key: LeaseKey::new("ns", "db"),
            lease_uid: Some(lease_uid.to_string()),
            lease,
            lease_gone,
            claims: Vec::new(),
            fresh_claims: Vec::new(),
            fresh_pods: Vec::new(),
            refuted: false,
            retry_after: Some(Retry::AfterError),
            handed_over: false,
            pass: Pass::Decision,
            mirrors_due: false,
        }
    }

    /// A write's outcome for a deleted Lease must neither overwrite
    /// nor remove the Lease re-created under the same name.
    #[tokio::test]
    async fn an_outcome_applies_only_to_the_lease_object_it_was_computed_for() {
        let config = ControllerConfig {
            namespace: None,
            concurrency: 1,
            instance: "test".into(),
        };
        let metrics = Arc::new(Metrics::default());
        let events = Publisher::spawn(offline_client(), "test", metrics.clone());
        let mut state = Loop::new(
            KubeApiServer::new(offline_client()),
            config,
            metrics,
            events,
        );
        let key = LeaseKey::new("ns", "db");
        let now = Instant::now();
        let old = LeaseBuilder::new("db")
            .uid("uid-old")
            .resource_version(10)
            .phase(LeasePhase::Free)
            .token(10)
            .build();
        let uid = |state: &Loop<KubeApiServer>| {
            state.index.lease(&key).and_then(|l| l.metadata.uid.clone())
        };

        // A write computed for the old Lease is in flight when the watch reports it
        // deleted and re-created; then the write's outcome arrives.
        state.index.apply_lease(old.clone(), now);
        state.index.delete_lease(&old);
        let new = LeaseBuilder::new("db")
            .uid("uid-new")
            .resource_version(20)
            .phase(LeasePhase::Free)
            .token(20)
            .build();
        state.index.apply_lease(new, now);
        state.begin(key.clone(), Pass::Decision);
        let old_written = LeaseBuilder::new("db")
            .uid("uid-old")
            .resource_version(11)
            .phase(LeasePhase::Held)
            .token(11)
            .holder("a", "a", "a")
            .build();
        state.finish(outcome("uid-old", Some(old_written), false), now);
        assert_eq!(uid(&state).as_deref(), Some("uid-new"), "overwritten");
        assert!(
            state
                .index
                .view(&key, now)
                .unwrap()
                .lease
                .unwrap()
                .status
                .as_ref()
                .unwrap()
                .holder
                .is_none()
        );

        // A failed write of the old Lease, whose re-read found no Lease (before the new
        // one was created): the new one stays.
        state.begin(key.clone(), Pass::Decision);
        state.finish(outcome("uid-old", None, true), now);
        assert_eq!(uid(&state).as_deref(), Some("uid-new"), "removed");

        // The outcome of a write to the object the index holds still applies.
        state.begin(key.clone(), Pass::Decision);
        let new_written = LeaseBuilder::new("db")
            .uid("uid-new")
            .resource_version(21)
            .phase(LeasePhase::Held)
            .token(21)
            .holder("b", "b", "b")
            .build();
        state.finish(outcome("uid-new", Some(new_written), false), now);
        assert_eq!(
            state
                .index
                .lease(&key)
                .unwrap()
                .resource_version()
                .as_deref(),
            Some("21")
        );
        state.begin(key.clone(), Pass::Decision);
        state.finish(outcome("uid-new", None, true), now);
        assert_eq!(uid(&state), None);
    }
}

/// The named retry policies, through the loop: a pass whose Lease write fails is
/// decided again at once after a conflict and [`Retry::AFTER_ERROR`] later after an
/// error, on the work queue's timers (paused time).
#[cfg(test)]
mod retry_tests {
    use std::sync::Mutex;

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    use super::grant::ClaimUpdate;
    use super::metrics::WriteLabels;
    use super::*;
    use crate::fixtures::{ClaimBuilder, LeaseBuilder};

    /// Answers reads with its Lease and every Lease write with `refusal`.
    #[derive(Clone)]
    struct Refusing {
        lease: Lease,
        refusal: Arc<Mutex<u16>>,
    }

    fn refused(code: u16) -> Error {
        Error::api("test", crate::api_error::refusal(code, "test"))
    }

    impl ApiServer for Refusing {
        async fn get_lease(&self, _: &LeaseKey) -> Result<Option<Lease>> {
            Ok(Some(self.lease.clone()))
        }
        async fn get_claim(&self, _: &str, _: &str) -> Result<Option<LeaseClaim>> {
            Ok(None)
        }
        async fn get_pod(&self, _: &str, _: &str) -> Result<Option<Pod>> {
            Ok(None)
        }
        async fn replace_lease_status(&self, _: &LeaseKey, _: &Lease) -> Result<Lease> {
            Err(refused(*self.refusal.lock().unwrap()))
        }
        async fn patch_claim_status(&self, _: &str, _: &ClaimUpdate) -> Result<LeaseClaim> {
            Err(refused(404))
        }
    }

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lease_write_is_retried_at_once_after_a_conflict_and_later_after_an_error() {
        let lease = LeaseBuilder::new("db").uid("L").resource_version(5).build();
        let claim = ClaimBuilder::new("a", "db")
            .uid("u1")
            .resource_version(6)
            .build();
        let refusal = Arc::new(Mutex::new(503));
        let store = Refusing {
            lease: lease.clone(),
            refusal: refusal.clone(),
        };
        let metrics = Arc::new(Metrics::default());
        let (events, _events) = Publisher::detached("test", metrics.clone());
        let config = ControllerConfig {
            namespace: None,
            concurrency: 1,
            instance: "test".into(),
        };
        let mut state = Loop::new(store, config, metrics.clone(), events);
        let ready = Readiness::default();
        let inputs = [
            Input::Lease(Ok(Event::Init)),
            Input::Lease(Ok(Event::InitApply(DeserializeGuard(Ok(lease))))),
            Input::Lease(Ok(Event::InitDone)),
            Input::Claim(Ok(Event::Init)),
            Input::Claim(Ok(Event::InitApply(DeserializeGuard(Ok(claim))))),
            Input::Claim(Ok(Event::InitDone)),
            Input::Pod(Ok(Event::Init)),
            Input::Pod(Ok(Event::InitDone)),
        ];
        for input in inputs {
            state.handle_input(input, &ready, now());
        }
        assert!(state.is_synced() && ready.get());
        let counter = |family: &Family<WriteLabels, Counter>| {
            family.get_or_create(&WriteLabels { kind: "lease" }).get()
        };

        // An error (503): decided again after AFTER_ERROR, not before.
        let pass = state.next_write(now()).expect("a grant to write");
        let outcome = pass.await;
        state.finish(outcome, now());
        assert_eq!(counter(&metrics.write_errors), 1);
        assert!(state.next_write(now()).is_none(), "not at once");
        let start = now();
        assert_eq!(state.expired().await, Some(LeaseKey::new("ns", "db")));
        assert_eq!(now() - start, Retry::AFTER_ERROR);
        assert_eq!(Retry::AFTER_ERROR, std::time::Duration::from_millis(500));

        // A conflict (409): the Lease is re-read and decided again at once.
        *refusal.lock().unwrap() = 409;
        let pass = state.next_write(now()).expect("decided again");
        state.finish(pass.await, now());
        assert_eq!(counter(&metrics.write_conflicts), 1);
        assert!(state.next_write(now()).is_some(), "at once");
    }
}

/// Under load only the Lease write is urgent. Claim mirrors wait until no
/// Lease is dirty, are decided afresh when written (coalesced: one pass however many
/// grants went before), and never take more than half the write slots.
#[cfg(test)]
mod mirror_tests {
    use super::grant::ClaimUpdate;
    use super::*;
    use crate::api::LeasePhase;
    use crate::fixtures::{ClaimBuilder, LeaseBuilder};

    /// Accepts every write, as written.
    #[derive(Clone)]
    struct Accepting;

    impl ApiServer for Accepting {
        async fn get_lease(&self, _: &LeaseKey) -> Result<Option<Lease>> {
            Ok(None)
        }
        async fn get_claim(&self, _: &str, _: &str) -> Result<Option<LeaseClaim>> {
            Ok(None)
        }
        async fn get_pod(&self, _: &str, _: &str) -> Result<Option<Pod>> {
            Ok(None)
        }
        async fn replace_lease_status(&self, _: &LeaseKey, desired: &Lease) -> Result<Lease> {
            let mut written = desired.clone();
            let rv: u64 = written.resource_version().unwrap().parse().unwrap();
            written.metadata.resource_version = Some((rv + 1000).to_string());
            Ok(written)
        }
        async fn patch_claim_status(&self, ns: &str, update: &ClaimUpdate) -> Result<LeaseClaim> {
            let mut claim = ClaimBuilder::new(&update.name, "l")
                .namespace(ns)
                .uid(&update.uid)
                .resource_version(1)
                .created_at(&format!("2026-01-01T00:00:{:02}Z", update.name.len()))
                .build();
            claim.status = Some(update.status.clone());
            Ok(claim)
        }
    }

    fn state(concurrency: usize) -> Loop<Accepting> {
        let metrics = Arc::new(Metrics::default());
        let (events, _) = Publisher::detached("test", metrics.clone());
        let config = ControllerConfig {
            namespace: None,
            concurrency,
            instance: "test".into(),
        };
        Loop::new(Accepting, config, metrics, events)
    }

    #[tokio::test]
    async fn mirrors_wait_for_every_grant_and_are_written_once_from_the_latest_decision() {
        let mut state = state(4);
        let now = Instant::now();
        // "a" gets the Lease; two waiters queue behind it.
        state.index.apply_lease(
            LeaseBuilder::new("a").uid("a").resource_version(10).build(),
            now,
        );
        for name in ["h", "w1", "w2"] {
            let claim = ClaimBuilder::new(name, "a")
                .uid(&format!("u-{name}"))
                .resource_version(1)
                .created_at(&format!("2026-01-01T00:00:{:02}Z", name.len()))
                .build();
            state.index.apply_claim(claim, now);
        }
        let a = LeaseKey::new("ns", "a");
        state.mark_dirty(a.clone(), now);
        let grant = state.next_write(now).unwrap().await;
        assert_eq!((grant.pass, grant.mirrors_due), (Pass::Decision, true));
        assert!(grant.claims.is_empty(), "the grant pass wrote no mirror");

        // Before its outcome is back, another Lease needs a grant.
        state.index.apply_lease(
            LeaseBuilder::new("b").uid("b").resource_version(20).build(),
            now,
        );
        state.index.apply_claim(
            ClaimBuilder::new("x", "b")
                .uid("u-x")
                .resource_version(1)
                .created_at("2026-01-01T00:00:01Z")
                .build(),
            now,
        );
        let b = LeaseKey::new("ns", "b");
        state.mark_dirty(b.clone(), now);
        state.finish(grant, now);
        assert_eq!(state.queue.deferred_len(), 1);
        let next = state.next_write(now).unwrap().await;
        assert_eq!(
            (next.key.clone(), next.pass),
            (b.clone(), Pass::Decision),
            "a dirty Lease goes before deferred mirrors"
        );
        // Nothing dirty now: a's mirrors may go while b's grant is written.
        let mut written = Vec::new();
        let mut record = |outcome: &Outcome| {
            assert_eq!(outcome.pass, Pass::Mirrors);
            written.extend(outcome.claims.iter().map(|c| {
                let s = c.status.as_ref().unwrap();
                (c.metadata.name.clone(), s.phase, s.position)
            }));
        };
        let mirrors_a = state.next_write(now).unwrap().await;
        assert_eq!(mirrors_a.key, a);
        record(&mirrors_a);
        assert!(
            state.next_write(now).is_none(),
            "b's mirrors wait for its pass"
        );
        state.finish(mirrors_a, now);
        state.finish(next, now);
        let mirrors_b = state.next_write(now).unwrap().await;
        assert_eq!(mirrors_b.key, b);
        record(&mirrors_b);
        state.finish(mirrors_b, now);
        written.sort_by(|x, y| x.0.cmp(&y.0));
        use crate::api::ClaimPhase::{Granted, Pending};
        assert_eq!(
            written,
            [
                (Some("h".into()), Some(Granted), None),
                (Some("w1".into()), Some(Pending), Some(1)),
                (Some("w2".into()), Some(Pending), Some(2)),
                (Some("x".into()), Some(Granted), None),
            ]
        );
        assert_eq!(state.queue.deferred_len(), 0);
        assert!(state.next_write(now).is_none(), "settled: nothing to write");
    }

    #[tokio::test]
    async fn mirrors_take_at_most_half_the_write_slots() {
        let mut state = state(4);
        let now = Instant::now();
        for i in 0..5 {
            let name = format!("l{i}");
            state.index.apply_lease(
                LeaseBuilder::new(&name)
                    .uid(&name)
                    .resource_version(10 + i)
                    .build(),
                now,
            );
            for claim in [format!("h{i}"), format!("w{i}")] {
                let claim = ClaimBuilder::new(&claim, &name)
                    .uid(&format!("u-{claim}"))
                    .resource_version(1)
                    .created_at(&format!("2026-01-01T00:00:{:02}Z", claim.len()))
                    .build();
                state.index.apply_claim(claim, now);
            }
            state.mark_dirty(LeaseKey::new("ns", name.as_str()), now);
        }
        let mut grants = Vec::new();
        while let Some(pass) = state.next_write(now) {
            grants.push(pass.await);
        }
        assert_eq!(grants.len(), 5, "decisions are not limited by mirror slots");
        for outcome in grants {
            state.finish(outcome, now);
        }
        let mut mirrors = Vec::new();
        while let Some(pass) = state.next_write(now) {
            mirrors.push(pass.await);
        }
        assert_eq!(mirrors.len(), 2, "2 of 4 slots");
        assert!(!state.has_urgent_work());
        // A grant that comes up now is not held back by the mirrors in flight.
        state.index.apply_lease(
            LeaseBuilder::new("late")
                .uid("late")
                .resource_version(99)
                .build(),
            now,
        );
        state.index.apply_claim(
            ClaimBuilder::new("z", "late")
                .uid("u-z")
                .resource_version(1)
                .created_at("2026-01-01T00:00:01Z")
                .build(),
            now,
        );
        state.mark_dirty(LeaseKey::new("ns", "late"), now);
        assert!(state.has_urgent_work());
        let late = state.next_write(now).unwrap().await;
        assert_eq!(
            (late.key, late.pass),
            (LeaseKey::new("ns", "late"), Pass::Decision)
        );
    }

    /// Leadership that changes more often than once per lease duration (a replica that
    /// misses its renew deadline and takes its own record back) must not postpone a
    /// silent holder's expiry: a standby's clocks are its own observations, and an
    /// ending is confirmed by a read and a mark conditioned on the claim it saw.
    #[tokio::test]
    async fn taking_leadership_again_and_again_does_not_postpone_an_expiry() {
        let mut state = state(1);
        let seen = Instant::now();
        let held = LeaseBuilder::new("a")
            .uid("a")
            .resource_version(10)
            .phase(LeasePhase::Held)
            .token(11)
            .grants(1)
            .holder("h", "u-h", "h")
            .granted_with(15)
            .build();
        state.index.apply_lease(held, seen);
        state.index.apply_claim(
            ClaimBuilder::new("h", "a")
                .uid("u-h")
                .resource_version(1)
                .created_at("2026-01-01T00:00:01Z")
                .build(),
            seen,
        );
        let key = LeaseKey::new("ns", "a");
        let deadline =
            |state: &Loop<Accepting>, now| state.index.view(&key, now).unwrap().holder_deadline;
        let first = deadline(&state, seen).expect("the holder has a deadline");
        assert_eq!(first, seen + std::time::Duration::from_secs(15));
        // Leadership changes every half second for a whole lease duration and more.
        for flap in 1..=40u64 {
            let now = seen + std::time::Duration::from_millis(500 * flap);
            state.take_leadership(now);
            assert_eq!(
                deadline(&state, now),
                Some(first),
                "take-over {flap} moved the silent holder's expiry"
            );
        }
    }
}
