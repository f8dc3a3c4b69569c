//! Kubernetes Events (`events.k8s.io/v1`) about Leases, published off the write path.
//!
//! Written by hand rather than with kube-runtime's `Recorder`, which keys its
//! series on (reason, object reference) and not on the note:
//! - with the Lease's resourceVersion in the reference (as `object_ref` gives it),
//!   no two Events ever match, yet it keeps every Event of the last six minutes
//!   and scans them all on each publish: O(n) per Event and megabytes at
//!   thousands of grants a minute;
//! - without it, "granted with token 7" would be folded into the Event of token 6.
//!
//! Events are best effort: a queue of [`QUEUE`] (1,024), 2 creates in flight, and when the
//! API server cannot keep up, Events are dropped and counted
//! (`palisade_events_dropped_total`) rather than buffered without limit. A grant
//! never waits for its Event, and Events wait for grants: the controller holds
//! them back while a decision is waiting or being written
//! ([`Publisher::spawn_behind`]), so in a storm the API server's capacity goes to
//! the Lease writes first. `eventTime` is the moment of the decision, not of
//! the create, so concurrent creates still sort in the order things happened.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource};
use tokio::sync::{mpsc, watch};

use super::metrics::Metrics;
use crate::crd::CONTROLLER_MANAGER;

/// Events waiting to be created; beyond this they are dropped and counted.
pub const QUEUE: usize = 1024;
/// Event creates in flight at once.
pub const CONCURRENCY: usize = 2;

/// `Normal` or `Warning`, the two types Kubernetes knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

/// Queues Events for the background publisher; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    queue: mpsc::Sender<Event>,
    instance: Arc<str>,
    metrics: Arc<Metrics>,
}

impl Publisher {
    /// Starts the background task that creates the queued Events.
    #[cfg(test)]
    pub fn spawn(client: Client, instance: &str, metrics: Arc<Metrics>) -> Self {
        Self::spawn_behind(client, instance, metrics, watch::channel(false).1)
    }

    /// Starts the background task that creates the queued Events; no create starts
    /// while `busy` is true.
    pub fn spawn_behind(
        client: Client,
        instance: &str,
        metrics: Arc<Metrics>,
        busy: watch::Receiver<bool>,
    ) -> Self {
        let (queue, mut rx) = mpsc::channel::<Event>(QUEUE);
        let failures = metrics.clone();
        let queued = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        tokio::spawn(queued.for_each_concurrent(CONCURRENCY, move |event| {
            let client = client.clone();
            let failures = failures.clone();
            let mut busy = busy.clone();
            async move {
                // Err: the controller is gone; publish what is left.
                let _ = busy.wait_for(|busy| !*busy).await;
                let namespace = event.metadata.namespace.clone().unwrap_or_default();
                let api: Api<Event> = Api::namespaced(client, &namespace);
                if let Err(e) = api.create(&PostParams::default(), &event).await {
                    failures.events_failed.inc();
                    tracing::debug!(error = %e, "publishing event failed");
                }
            }
        }));
        Self {
            queue,
            instance: instance.into(),
            metrics,
        }
    }

    /// A publisher whose Events wait in the returned receiver instead of going to an
    /// API server (for tests that drive the controller without one).
    #[cfg(test)]
    pub fn detached(instance: &str, metrics: Arc<Metrics>) -> (Self, mpsc::Receiver<Event>) {
        let (queue, rx) = mpsc::channel::<Event>(QUEUE);
        let publisher = Self {
            queue,
            instance: instance.into(),
            metrics,
        };
        (publisher, rx)
    }

    /// Queues one Event about `regarding`; never waits.
    pub fn publish(&self, regarding: ObjectReference, kind: Kind, reason: &str, note: String) {
        let event = build(
            regarding,
            kind,
            reason,
            note,
            &self.instance,
            Timestamp::now(),
        );
        if self.queue.try_send(event).is_err() {
            self.metrics.events_dropped.inc();
        }
    }

    /// Queues one Event about a Kubernetes object.
    pub fn publish_on<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        kind: Kind,
        reason: &str,
        note: String,
    ) {
        self.publish(object.object_ref(&()), kind, reason, note);
    }
}

/// The Event object: named like kube-runtime's (`<object>.<nanoseconds in hex>`),
/// reported by the controller manager and this replica.
pub fn build(
    mut regarding: ObjectReference,
    kind: Kind,
    reason: &str,
    note: String,
    instance: &str,
    at: Timestamp,
) -> Event {
    // The Event is about the object, not about one of its versions.
    regarding.resource_version = None;
    let object = regarding.name.clone().unwrap_or_else(|| "palisade".into());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", at.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..Default::default()
        },
        event_time: Some(MicroTime(at)),
        type_: Some(match kind {
            Kind::Normal => "Normal".into(),
            Kind::Warning => "Warning".into(),
        }),
        reason: Some(reason.to_string()),
        action: Some(reason.to_string()),
        // The API server limits a note to 1 kB.
        note: Some(truncate(note, 1024)),
        reporting_controller: Some(CONTROLLER_MANAGER.to_string()),
        reporting_instance: Some(truncate(instance.to_string(), 128)),
        regarding: Some(regarding),
        ..Default::default()
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_the_object_not_its_version() {
        let regarding = ObjectReference {
            kind: Some("Lease".into()),
            namespace: Some("ns".into()),
            name: Some("db".into()),
            resource_version: Some("42".into()),
            ..Default::default()
        };
        let at = Timestamp::from_nanosecond(0x1234).unwrap();
        let e = build(regarding, Kind::Warning, "Expired", "n".into(), "pod-1", at);
        assert_eq!(e.metadata.name.as_deref(), Some("db.1234"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(e.regarding.unwrap().resource_version, None);
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.event_time, Some(MicroTime(at)));
        assert_eq!(e.reporting_controller.as_deref(), Some(CONTROLLER_MANAGER));
    }

    #[test]
    fn notes_are_cut_to_the_api_limit_on_a_char_boundary() {
        let note = "é".repeat(600); // 1200 bytes
        let cut = truncate(note, 1024);
        assert_eq!(cut.len(), 1024);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(truncate("short".into(), 1024), "short");
    }
}
