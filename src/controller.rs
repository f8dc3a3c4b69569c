//! The lease controller: watches feed the [`Index`]; dirty Leases are decided
//! by [`grant::decide`] and written, one Lease status write per decision,
//! conditioned on the resourceVersion it was computed from (DESIGN rule 2).
//!
//! One task owns the index and the work queue, so no locks; the API writes run
//! concurrently (never two for the same Lease) and report back to that task.
//! We use kube-runtime's watcher (relist, backoff) but not its `Controller`:
//! our unit of work is a Lease *name*, which claims may name before the Lease
//! exists, and expiry needs per-holder timers on the controller's own clock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::api::{CONTROLLER_MANAGER, Lease, LeaseClaim};
use crate::conditions;
use crate::events::{self, Publisher};
use crate::grant::{self, Check, ClaimUpdate, Decision, Ending};
use crate::index::{Index, LeaseKey};
use crate::kube_client::{CALL_DEADLINE, WATCH_TIMEOUT_SECS, within};
use crate::telemetry::{Metrics, Readiness, WriteLabels};

#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Watch one namespace, or all when None.
    pub namespace: Option<String>,
    /// Concurrent Lease writes (different Leases).
    pub concurrency: usize,
    /// Name reported in Events.
    pub instance: String,
}

// Each input is moved once from the watch stream into the index; boxing buys nothing.
#[allow(clippy::large_enum_variant)]
enum Input {
    Lease(Result<Event<DeserializeGuard<Lease>>, watcher::Error>),
    Claim(Result<Event<DeserializeGuard<LeaseClaim>>, watcher::Error>),
    Pod(Result<Event<Pod>, watcher::Error>),
}

/// What one write pass reports back to the loop.
struct Outcome {
    key: LeaseKey,
    /// The UID of the Lease object the decision was computed for: the outcome
    /// applies to that object only, never to one re-created under the same name.
    lease_uid: Option<String>,
    /// The Lease as written, or as freshly read after a conflict.
    lease: Option<Lease>,
    /// The Lease no longer exists (read after a conflict).
    lease_gone: bool,
    /// Claims as written by this pass.
    claims: Vec<LeaseClaim>,
    /// Claims and pods as a quorum read showed them when it refuted an ending: applied
    /// only to the objects (UIDs) the index holds, so a read never resurrects one.
    fresh_claims: Vec<LeaseClaim>,
    fresh_pods: Vec<Pod>,
    /// A quorum read refuted the decision: nothing was written; decide again.
    refuted: bool,
    retry_after: Option<Duration>,
    handed_over: bool,
}

/// Claim status writes in flight at once for one pass.
const CLAIM_WRITE_CONCURRENCY: usize = 4;

/// How soon to decide again after a quorum read refuted an ending that the index
/// could not be corrected for (the object is one the watches have not delivered).
const REFUTED_RETRY: Duration = Duration::from_millis(500);

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
    let wc = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    // Objects are slimmed as they arrive, before the index holds on to them: it
    // keeps only what decisions need (see `crate::watch`).
    let inputs = futures::stream::select_all(vec![
        watcher::watcher(leases, wc.clone())
            .modify(crate::watch::slim_guarded::<Lease>)
            .backoff(crate::watch::backoff())
            .map(Input::Lease)
            .boxed(),
        watcher::watcher(claims, wc.clone())
            .modify(crate::watch::slim_guarded::<LeaseClaim>)
            .backoff(crate::watch::backoff())
            .map(Input::Claim)
            .boxed(),
        watcher::watcher(pods, wc)
            .modify(crate::watch::slim_pod)
            .backoff(crate::watch::backoff())
            .map(Input::Pod)
            .boxed(),
    ]);
    let mut inputs = Box::pin(inputs.take_until(shutdown.clone().cancelled_owned()));

    let mut state = Loop::new(client, config, metrics);
    let mut writes = FuturesUnordered::new();
    let mut was_leading = false;

    loop {
        let is_leading = *leading.borrow();
        if is_leading && !was_leading && state.is_synced() {
            // Failover: every held lease gets a fresh full duration (DESIGN rule 4).
            state.index.restart_holder_clocks(Instant::now());
            for key in state.index.keys() {
                state.mark_dirty(key, Instant::now());
            }
            was_leading = true;
        }
        if is_leading && state.is_synced() {
            while writes.len() < state.config.concurrency {
                let Some(fut) = state.next_write() else { break };
                writes.push(fut);
            }
        }
        tokio::select! {
            input = inputs.next() => match input {
                Some(input) => state.handle_input(input, &ready),
                None => break, // shutdown
            },
            Some(expired) = state.timers.next() => {
                let key = expired.into_inner();
                state.timer_keys.remove(&key);
                state.mark_dirty(key, Instant::now());
            }
            Some(outcome) = writes.next() => state.finish(outcome),
            changed = leading.changed() => {
                if changed.is_err() { break; }
            }
        }
    }
    // Stop granting; let in-flight writes finish so no decision is left half-written.
    ready.set(false);
    while let Some(outcome) = writes.next().await {
        state.finish(outcome);
    }
    tracing::info!("controller stopped");
}

/// What a watch (re)list has delivered so far. Its objects go into the index as they
/// come (holding 30,000 of them until the list ends would double the controller's
/// memory at 10,000 Leases); at its end, whatever it did not list is forgotten.
#[derive(Default)]
struct Relist {
    leases: HashSet<LeaseKey>,
    claims: HashSet<(String, String)>,
    pods: HashSet<(String, String)>,
}

fn name_of(object: &impl Resource) -> (String, String) {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

struct Loop {
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    events: Publisher,
    index: Index,
    /// Leases, claims, pods: initial list delivered.
    synced: [bool; 3],
    relist: Relist,
    queue: VecDeque<LeaseKey>,
    queued: HashSet<LeaseKey>,
    /// When each queued key first became dirty: the start of a handover's latency.
    dirty_since: HashMap<LeaseKey, Instant>,
    in_flight: HashSet<LeaseKey>,
    timers: DelayQueue<LeaseKey>,
    timer_keys: HashMap<LeaseKey, delay_queue::Key>,
}

impl Loop {
    fn new(client: Client, config: ControllerConfig, metrics: Arc<Metrics>) -> Self {
        let events = Publisher::spawn(client.clone(), &config.instance, metrics.clone());
        Loop {
            client,
            config,
            metrics,
            events,
            index: Index::default(),
            synced: [false; 3],
            relist: Relist::default(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            dirty_since: HashMap::new(),
            in_flight: HashSet::new(),
            timers: DelayQueue::new(),
            timer_keys: HashMap::new(),
        }
    }

    fn is_synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    fn mark_dirty(&mut self, key: LeaseKey, now: Instant) {
        self.dirty_since.entry(key.clone()).or_insert(now);
        if self.queued.insert(key.clone()) {
            self.queue.push_back(key);
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

    fn handle_input(&mut self, input: Input, ready: &Readiness) {
        let now = Instant::now();
        let touched = match input {
            Input::Lease(Ok(ev)) => match self.screen(ev) {
                None => Vec::new(),
                Some(Event::Apply(l)) => self.index.apply_lease(l, now).into_iter().collect(),
                Some(Event::Delete(l)) => self.index.delete_lease(&l).into_iter().collect(),
                Some(Event::Init) => {
                    self.relist.leases.clear();
                    Vec::new()
                }
                Some(Event::InitApply(l)) => {
                    let (namespace, name) = name_of(&l);
                    self.relist.leases.insert(LeaseKey::new(namespace, name));
                    self.index.apply_lease(l, now).into_iter().collect()
                }
                Some(Event::InitDone) => {
                    self.synced[0] = true;
                    self.index
                        .retain_leases(&std::mem::take(&mut self.relist.leases))
                }
            },
            Input::Claim(Ok(ev)) => match self.screen(ev) {
                None => Vec::new(),
                Some(Event::Apply(c)) => self.index.apply_claim(c, now),
                Some(Event::Delete(c)) => self.index.delete_claim(&c),
                Some(Event::Init) => {
                    self.relist.claims.clear();
                    Vec::new()
                }
                Some(Event::InitApply(c)) => {
                    self.relist.claims.insert(name_of(&c));
                    self.index.apply_claim(c, now)
                }
                Some(Event::InitDone) => {
                    self.synced[1] = true;
                    self.index
                        .retain_claims(&std::mem::take(&mut self.relist.claims))
                }
            },
            Input::Pod(Ok(ev)) => match ev {
                Event::Apply(p) => self.index.apply_pod(&p),
                Event::Delete(p) => self.index.delete_pod(&p),
                Event::Init => {
                    self.relist.pods.clear();
                    Vec::new()
                }
                Event::InitApply(p) => {
                    self.relist.pods.insert(name_of(&p));
                    self.index.apply_pod(&p)
                }
                Event::InitDone => {
                    self.synced[2] = true;
                    self.index
                        .retain_pods(&std::mem::take(&mut self.relist.pods))
                }
            },
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

    /// Decides dirty Leases (that have no write in flight) until one needs a write, and returns it.
    fn next_write(&mut self) -> Option<BoxFuture<'static, Outcome>> {
        loop {
            let position = self
                .queue
                .iter()
                .position(|k| !self.in_flight.contains(k))?;
            let key = self.queue.remove(position)?;
            self.queued.remove(&key);
            let dirty_since = self.dirty_since.remove(&key).unwrap_or_else(Instant::now);
            let Some(view) = self.index.view(&key, Instant::now()) else {
                continue;
            };
            let decision = grant::decide(&view, Instant::now(), Timestamp::now());
            let lease = view.lease.cloned();
            let wake_at = earliest(view.holder_deadline, view.pod_recheck);
            if decision.lease_status.is_none() && decision.claim_updates.is_empty() {
                self.schedule(&key, wake_at);
                continue;
            }
            self.in_flight.insert(key.clone());
            let writer = Writer {
                client: self.client.clone(),
                metrics: self.metrics.clone(),
                events: self.events.clone(),
            };
            return Some(writer.write(key, lease, decision, dirty_since).boxed());
        }
    }

    fn finish(&mut self, mut outcome: Outcome) {
        let now = Instant::now();
        self.in_flight.remove(&outcome.key);
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
        for claim in outcome.claims {
            self.index.apply_claim(claim, now);
        }
        let mut refreshed = false;
        for claim in outcome.fresh_claims {
            let namespace = claim.namespace().unwrap_or_default();
            if self.index.claim_uid(&namespace, &claim.name_any()) == claim.uid().as_deref() {
                refreshed |= !self.index.apply_claim(claim, now).is_empty();
            }
        }
        for mut pod in outcome.fresh_pods {
            crate::watch::slim_pod(&mut pod);
            let namespace = pod.namespace().unwrap_or_default();
            if self.index.pod_uid(&namespace, &pod.name_any()) == pod.uid().as_deref() {
                refreshed |= !self.index.apply_pod(&pod).is_empty();
            }
        }
        if outcome.refuted && outcome.retry_after.is_none() {
            // With the index corrected, decide at once; otherwise wait for the watches.
            outcome.retry_after = Some(if refreshed {
                Duration::ZERO
            } else {
                REFUTED_RETRY
            });
        }
        if outcome.handed_over {
            self.metrics.leases_held.set(self.index.held_count() as i64);
        }
        match outcome.retry_after {
            Some(delay) if delay.is_zero() => self.mark_dirty(outcome.key, now),
            Some(delay) => self.schedule(&outcome.key, Some(now + delay)),
            None => {
                let deadline = self
                    .index
                    .view(&outcome.key, now)
                    .and_then(|v| earliest(v.holder_deadline, v.pod_recheck));
                self.schedule(&outcome.key, deadline);
            }
        }
    }

    /// Wakes the Lease at `at` (its holder's expiry, or a retry), replacing any earlier timer.
    fn schedule(&mut self, key: &LeaseKey, at: Option<Instant>) {
        if let Some(old) = self.timer_keys.remove(key) {
            self.timers.remove(&old);
        }
        if let Some(at) = at {
            let handle = self.timers.insert_at(key.clone(), at.into());
            self.timer_keys.insert(key.clone(), handle);
        }
    }
}

struct Writer {
    client: Client,
    metrics: Arc<Metrics>,
    events: Publisher,
}

impl Writer {
    async fn write(
        self,
        key: LeaseKey,
        lease: Option<Lease>,
        decision: Decision,
        dirty_since: Instant,
    ) -> Outcome {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
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
        };
        let claims: Api<LeaseClaim> = Api::namespaced(self.client.clone(), &key.namespace);
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
                tracing::warn!(lease = %key, error = %e, "confirming a decision failed");
                outcome.retry_after = Some(Duration::from_millis(500));
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
            match write_claim_status(&claims, update).await {
                Ok(written) => outcome.claims.push(written),
                // Deleted meanwhile: the grant ends all the same (released).
                Err(e) if is_not_found(&e) => {}
                Err(e) if is_conflict(&e) || is_invalid(&e) => {
                    tracing::info!(lease = %key, claim = %update.name, "the holder's claim changed since the decision (a renewal?); deciding again");
                    match within(CALL_DEADLINE, claims.get_opt(&update.name)).await {
                        Ok(Some(fresh)) if fresh.uid().as_deref() == Some(update.uid.as_str()) => {
                            outcome.fresh_claims.push(fresh);
                        }
                        // Gone, or re-created under another UID: the grant ends all the same.
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::warn!(lease = %key, error = %e, "re-reading a claim failed")
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
                    tracing::warn!(lease = %key, claim = %update.name, error = %e, "claim status write failed");
                    outcome.retry_after = Some(Duration::from_millis(500));
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
            match within(
                CALL_DEADLINE,
                leases.replace_status(&key.name, &post_params(), &desired),
            )
            .await
            {
                Ok(written) => {
                    wrote_lease = true;
                    outcome.lease = Some(written.clone());
                    self.record_lease_write(&key, &written, &decision, dirty_since);
                }
                Err(e) => {
                    if is_conflict(&e) || is_not_found(&e) {
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
                        tracing::warn!(lease = %key, error = %e, "lease status write failed");
                    }
                    return self
                        .reread(
                            &leases,
                            outcome,
                            if is_conflict(&e) || is_not_found(&e) {
                                Duration::ZERO
                            } else {
                                Duration::from_millis(500)
                            },
                        )
                        .await;
                }
            }
        }
        // 3. The claims' mirrors, a few at a time (different claims, so their order is free).
        let mut results = futures::stream::iter(rest)
            .map(|update| {
                let claims = claims.clone();
                async move {
                    let result = write_claim_status(&claims, &update).await;
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
                Err(e) if is_not_found(&e) || is_conflict(&e) || is_invalid(&e) => {}
                Err(e) => {
                    self.metrics
                        .write_errors
                        .get_or_create(&WriteLabels { kind: "claim" })
                        .inc();
                    tracing::warn!(lease = %key, claim = %name, error = %e, "claim status write failed");
                    outcome.retry_after = Some(Duration::from_millis(500));
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
    ) -> Result<bool, kube::Error> {
        let mut confirmed = true;
        for check in checks {
            match check {
                Check::ClaimGone { name, uid } => {
                    let api: Api<LeaseClaim> = Api::namespaced(self.client.clone(), &key.namespace);
                    if let Some(claim) = within(CALL_DEADLINE, api.get_opt(name)).await?
                        && claim.uid().as_deref() == Some(uid.as_str())
                        && claim.metadata.deletion_timestamp.is_none()
                    {
                        outcome.fresh_claims.push(claim);
                        confirmed = false;
                    }
                }
                Check::PodGone { name, uid } => {
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
                    if let Some(pod) = within(CALL_DEADLINE, api.get_opt(name)).await?
                        && pod.metadata.deletion_timestamp.is_none()
                        && uid
                            .as_ref()
                            .is_none_or(|uid| pod.uid().as_ref() == Some(uid))
                        && !pod
                            .status
                            .as_ref()
                            .and_then(|s| s.phase.as_deref())
                            .is_some_and(|p| p == "Succeeded" || p == "Failed")
                    {
                        outcome.fresh_pods.push(pod);
                        confirmed = false;
                    }
                }
                Check::LeaseGone => {
                    let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
                    if within(CALL_DEADLINE, api.get_opt(&key.name))
                        .await?
                        .is_some()
                    {
                        // The index missed it: wait for the Lease watch to deliver it.
                        confirmed = false;
                    }
                }
                Check::LeaseUnchanged => {
                    let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
                    let current_rv = lease.and_then(|l| l.resource_version());
                    match within(CALL_DEADLINE, api.get_opt(&key.name)).await? {
                        Some(fresh) if fresh.resource_version() == current_rv => {}
                        Some(fresh) => {
                            outcome.lease = Some(fresh);
                            outcome.retry_after = Some(Duration::ZERO);
                            confirmed = false;
                        }
                        None => {
                            outcome.lease_gone = true;
                            outcome.retry_after = Some(Duration::ZERO);
                            confirmed = false;
                        }
                    }
                }
            }
        }
        Ok(confirmed)
    }

    /// After a failed write: read the Lease again and decide once more.
    async fn reread(&self, leases: &Api<Lease>, mut outcome: Outcome, retry: Duration) -> Outcome {
        match within(CALL_DEADLINE, leases.get_opt(&outcome.key.name)).await {
            Ok(Some(fresh)) => outcome.lease = Some(fresh),
            Ok(None) => outcome.lease_gone = true,
            Err(e) => {
                tracing::warn!(lease = %outcome.key, error = %e, "re-reading lease failed");
                outcome.retry_after = Some(Duration::from_millis(500));
                return outcome;
            }
        }
        outcome.retry_after = Some(retry);
        outcome
    }
}

async fn write_claim_status(
    claims: &Api<LeaseClaim>,
    update: &ClaimUpdate,
) -> Result<LeaseClaim, kube::Error> {
    // A JSON patch that tests the UID, so a claim re-created under the same name is
    // left alone; and, when it ends a grant, the resourceVersion (a failed test: 422).
    let mut ops =
        vec![serde_json::json!({"op": "test", "path": "/metadata/uid", "value": update.uid})];
    if let Some(rv) = &update.condition_on {
        ops.push(
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
        );
    }
    ops.push(serde_json::json!({"op": "add", "path": "/status", "value": update.status}));
    let patch = serde_json::Value::Array(ops);
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a well-formed JSON patch");
    within(
        CALL_DEADLINE,
        claims.patch_status(
            &update.name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        ),
    )
    .await
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(CONTROLLER_MANAGER.to_string()),
        ..Default::default()
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// 422: what a failed JSON-patch `test` (another claim UID under the same name) returns.
fn is_invalid(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client for tests that never reach the API server (its calls fail at once).
    fn offline_client() -> Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, tower::BoxError>("offline".into())
        });
        Client::new(service, "default")
    }

    fn lease(uid: &str, rv: u64, holder: Option<&str>) -> Lease {
        let mut status = serde_json::json!({"phase": "Free", "fencingToken": rv});
        if let Some(h) = holder {
            status = serde_json::json!({"phase": "Held", "fencingToken": rv,
                "holder": {"claim": h, "claimUID": h, "identity": h}});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
            "metadata": {"name": "db", "namespace": "ns", "uid": uid, "resourceVersion": rv.to_string()},
            "spec": {"leaseDurationSeconds": 15},
            "status": status,
        }))
        .unwrap()
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
            retry_after: Some(Duration::from_secs(60)),
            handed_over: false,
        }
    }

    /// Issue 13, item 9: a write's outcome for a deleted Lease must neither overwrite
    /// nor remove the Lease re-created under the same name.
    #[tokio::test]
    async fn an_outcome_applies_only_to_the_lease_object_it_was_computed_for() {
        let config = ControllerConfig {
            namespace: None,
            concurrency: 1,
            instance: "test".into(),
        };
        let mut state = Loop::new(offline_client(), config, Arc::new(Metrics::default()));
        let key = LeaseKey::new("ns", "db");
        let now = Instant::now();
        let old = lease("uid-old", 10, None);
        let uid = |state: &Loop| state.index.lease(&key).and_then(|l| l.metadata.uid.clone());

        // A write computed for the old Lease is in flight when the watch reports it
        // deleted and re-created; then the write's outcome arrives.
        state.index.apply_lease(old.clone(), now);
        state.index.delete_lease(&old);
        state.index.apply_lease(lease("uid-new", 20, None), now);
        state.in_flight.insert(key.clone());
        state.finish(outcome(
            "uid-old",
            Some(lease("uid-old", 11, Some("a"))),
            false,
        ));
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
        state.in_flight.insert(key.clone());
        state.finish(outcome("uid-old", None, true));
        assert_eq!(uid(&state).as_deref(), Some("uid-new"), "removed");

        // The outcome of a write to the object the index holds still applies.
        state.in_flight.insert(key.clone());
        state.finish(outcome(
            "uid-new",
            Some(lease("uid-new", 21, Some("b"))),
            false,
        ));
        assert_eq!(
            state
                .index
                .lease(&key)
                .unwrap()
                .resource_version()
                .as_deref(),
            Some("21")
        );
        state.in_flight.insert(key.clone());
        state.finish(outcome("uid-new", None, true));
        assert_eq!(uid(&state), None);
    }
}
