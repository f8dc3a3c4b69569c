//! The controller's Prometheus metrics ([`crate::admin`] serves them at `/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::admin;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `lease` or `claim`.
    pub kind: &'static str,
}

/// The controller's metrics, all prefixed `palisade_`.
pub struct Metrics {
    pub registry: Registry,
    pub grants: Counter,
    /// Grants ended with reason [`Released`](crate::conditions::reasons::RELEASED).
    pub releases: Counter,
    /// Grants ended with reason [`Expired`](crate::conditions::reasons::EXPIRED).
    pub expirations: Counter,
    /// Grants ended with reason [`Revoked`](crate::conditions::reasons::REVOKED).
    pub revocations: Counter,
    pub write_conflicts: Family<WriteLabels, Counter>,
    pub write_errors: Family<WriteLabels, Counter>,
    /// From the event that ended a grant reaching the controller to the handover write succeeding.
    pub handover_latency: Histogram,
    pub leases_held: Gauge,
    pub leases: Gauge,
    pub is_leader: Gauge,
    pub invalid_objects: Counter,
    /// Events not published because the queue was full (the API server lagging behind).
    pub events_dropped: Counter,
    /// Events the API server refused or that failed in transit.
    pub events_failed: Counter,
    /// Leases whose claim mirrors wait behind grant work (DESIGN.md, "Storms").
    pub mirrors_deferred: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("palisade");
        let grants = Counter::default();
        let releases = Counter::default();
        let expirations = Counter::default();
        let revocations = Counter::default();
        let write_conflicts = Family::<WriteLabels, Counter>::default();
        let write_errors = Family::<WriteLabels, Counter>::default();
        // 0.5 ms .. ~16 s
        let handover_latency = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 16),
        );
        let leases_held = Gauge::default();
        let leases = Gauge::default();
        let is_leader = Gauge::default();
        let invalid_objects = Counter::default();
        let events_dropped = Counter::default();
        let events_failed = Counter::default();
        let mirrors_deferred = Gauge::default();
        registry.register(
            "grants",
            "Grants made (each with a new fencing token)",
            grants.clone(),
        );
        registry.register(
            "releases",
            "Grants ended because the holder deleted its claim",
            releases.clone(),
        );
        registry.register(
            "expirations",
            "Grants ended because no renewal was observed in time",
            expirations.clone(),
        );
        registry.register(
            "revocations",
            "Grants ended because the holder's pod is gone or terminal",
            revocations.clone(),
        );
        registry.register(
            "write_conflicts",
            "Status writes refused because the object changed since it was read (resourceVersion precondition)",
            write_conflicts.clone(),
        );
        registry.register(
            "write_errors",
            "Status writes that failed for another reason",
            write_errors.clone(),
        );
        registry.register_with_unit(
            "handover_latency",
            "Time from the event that ended a grant to the write that granted the next claim",
            prometheus_client::registry::Unit::Seconds,
            handover_latency.clone(),
        );
        registry.register(
            "leases_held",
            "Leases that currently have a holder",
            leases_held.clone(),
        );
        registry.register("leases", "Leases known to the controller", leases.clone());
        registry.register(
            "is_leader",
            "1 while this replica is the active controller",
            is_leader.clone(),
        );
        registry.register(
            "invalid_objects",
            "Watched objects that could not be read and were skipped",
            invalid_objects.clone(),
        );
        registry.register(
            "events_dropped",
            "Kubernetes Events dropped because the publish queue was full",
            events_dropped.clone(),
        );
        registry.register(
            "events_failed",
            "Kubernetes Events whose create failed",
            events_failed.clone(),
        );
        registry.register(
            "claim_mirrors_deferred",
            "Leases whose claims' status mirrors wait until no grant, expiry or revocation is pending",
            mirrors_deferred.clone(),
        );
        Self {
            registry,
            grants,
            releases,
            expirations,
            revocations,
            write_conflicts,
            write_errors,
            handover_latency,
            leases_held,
            leases,
            is_leader,
            invalid_objects,
            events_dropped,
            events_failed,
            mirrors_deferred,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        admin::encode(&self.registry)
    }
}
