//! The lease controller: watches feed the index; dirty Leases are decided by
//! `grant::decide` and written, one Lease status write per decision, conditioned on
//! the resourceVersion it was computed from (DESIGN rule 2).
//!
//! One task owns the index and the work queue, so no locks; the API writes run
//! concurrently (never two for the same Lease) and report back to that task.
//! We use kube-runtime's watcher (relist, backoff) but not its `Controller`:
//! our unit of work is a Lease *name*, which claims may name before the Lease
//! exists, and expiry needs per-holder timers on the controller's own clock.
//!
//! Data flows one way, each step in one module:
//!
//! 1. a watch event goes into the index (`index`: `Index::handle`, the one entry
//!    point for all three kinds, relists included), which returns the Leases it
//!    touched;
//! 2. the work queue (`WorkQueue`) says which Lease to decide next, and when;
//! 3. `grant::decide` turns the index's view of one Lease into a `Decision`: a
//!    write plan whose fields are its steps in order (what to confirm by a quorum
//!    read, the ended holder's claim mark, the Lease status, the other claims'
//!    mirrors), and `Decision::work` says once whether it is urgent;
//! 4. a write pass (`write_pass`) runs the plan's steps through `ApiServer`
//!    (`KubeApiServer`, or the model server of `model_tests`), one short function
//!    each, and holds no rules of its own;
//! 5. its `Outcome` comes back with what it learned, which only
//!    `Index::apply_outcome` applies (the UID guards live there), and one `Next`:
//!    when to decide the Lease again.
//!
//! `Loop` (`control_loop`) joins them and is what tests drive; [`run`] feeds it from
//! the watches.
//!
//! Under load only the Lease write is urgent: a pass acts on a decision (confirm,
//! the ended holder's claim, the Lease) and leaves the other claims' status mirrors
//! to a `Pass::Mirrors` of their own, started when no Lease is dirty, decided
//! afresh, on at most half the write slots; Events are held back while a decision
//! waits or is written (`queue`, "Storms: only the Lease write is urgent").
//!
//! # Unit of work
//!
//! The controller decides per Lease *name* (namespace/name), not per Lease object:
//! claims may name a Lease before it exists. kube-runtime's `watcher` feeds one
//! index; the work queue and expiry timers are ours, because kube-runtime's
//! `Controller` reconciles existing objects of one kind only. After a pass that did
//! not settle its Lease, its one `Next` says when to decide again: `Now` (the pass
//! read what the next decision needs, e.g. the Lease after a conflict), `AfterError`
//! (0.5 s: a call failed) and `Refuted` (a quorum read refuted an ending: at once if
//! what it read corrected the index, otherwise after 0.5 s, as only the watches can
//! correct it); otherwise the Lease is decided again at its next deadline (the
//! holder's expiry, a pod recheck).
//!
//! # Unreadable objects
//!
//! Leases and claims are watched through kube's `DeserializeGuard`: an object that
//! passes the API server's validation but cannot be read (for example a `renewTime`
//! with more than nine fraction digits, valid RFC 3339) is logged, counted in
//! `palisade_invalid_objects_total`, reported with a Warning Event `InvalidObject`
//! on it, and ignored; it never stops the watch or other Leases (DESIGN.md rule 8).
//!
//! # Leader election
//!
//! A `coordination.k8s.io/v1` Lease written only with resourceVersion preconditions
//! (`election`, which also says how a slow API server costs latency, not
//! leadership). Timings: 1 s lease, 750 ms renew deadline, 250 ms retry
//! (`--leader-elect-lease-duration`, `-renew-deadline`, `-retry-period`; chart values
//! `controller.leaderElection.*`). Not client-go's 15 s / 10 s / 2 s: those guard
//! controllers whose correctness rests on the election, and ours does not (a stale
//! leader's writes fail their compare-and-swap, rule 2), so the only cost of a short
//! lease is the election's own traffic: the leader renews 4 times a second (one PUT
//! of the record it wrote last, no read first) and each standby reads 4 times a
//! second, 8 small requests a second with two replicas (measured: 8.2/s against
//! 0.2/s without the controller), per cluster, not per Lease. client-go's defaults
//! cost 1.5/s; a standby that watched the record instead of reading it would save
//! its 4. Whole seconds because the record's `leaseDurationSeconds` is; 1 s is its
//! floor. A SIGKILLed leader is replaced within 1 s plus one retry and the gap to the
//! first grant stays under 2 s (`make bench`, "failover", docs/performance.md).
//!
//! A leader steps down when it finds another holder, or when a renewal fails and
//! none has succeeded for the renew deadline; until then two replicas may both act,
//! which rule 2 makes safe. A leader that steps down stands by with warm caches
//! instead of exiting: a renewal delayed by a loaded API server must cost about a
//! second, not a pod restart and a relist. On SIGTERM it stops granting, lets
//! in-flight writes finish, and releases the election lease so a standby takes over
//! at once. Standbys keep their caches warm, and a new leader keeps the holder
//! clocks its watches started (rule 4): a leadership that flaps cannot postpone an
//! expiry.

mod api_server;
mod control_loop;
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

pub(crate) use api_server::KubeApiServer;
pub(crate) use control_loop::Loop;
pub use error::{Error, Result};
use events::Publisher;
use metrics::Metrics;

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admin::Readiness;
use crate::crd::{Lease, LeaseClaim};
use crate::kube_client::ControllerClients;
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
    clients: ControllerClients,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    ready: Readiness,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let inputs = watch_inputs(&clients, config.namespace.as_deref());
    let client = clients.calls;
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
            while writes.len() < state.concurrency() {
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
            Some(_) = state.expired() => {}
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

/// The three watches (Leases, claims, pods) as one stream of [`Input`]s.
fn watch_inputs(
    clients: &ControllerClients,
    namespace: Option<&str>,
) -> impl futures::Stream<Item = Input> + Send + use<> {
    let client = &clients.watches;
    // DeserializeGuard: an object we cannot read is reported and skipped instead
    // of failing (and endlessly restarting) the whole watch (DESIGN rule 8).
    type Leases = Api<DeserializeGuard<Lease>>;
    type Claims = Api<DeserializeGuard<LeaseClaim>>;
    let (leases, claims, pods): (Leases, Claims, Api<Pod>) = match namespace {
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
    // PINGed connections, or short server-side timeouts, notice a dead watch
    // connection within seconds (`crate::kube_client`).
    let wc = watcher::Config::default().timeout(clients.watch_timeout_secs);
    // Objects are slimmed as they arrive, before the index holds on to them: it
    // keeps only what decisions need (see `slim`).
    futures::stream::select_all(vec![
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
    ])
}
