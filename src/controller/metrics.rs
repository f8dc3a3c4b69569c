//! The controller's Prometheus metrics ([`crate::admin`] serves them at `/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry, Unit};

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
    /// Claims waiting for a Lease, over all Leases (their `status.waitingCount`).
    pub claims_waiting: Gauge,
    /// The most claims waiting for any one Lease.
    pub longest_queue: Gauge,
    pub is_leader: Gauge,
    pub invalid_objects: Counter,
    /// Events not published because the queue was full (the API server lagging behind).
    pub events_dropped: Counter,
    /// Events the API server refused or that failed in transit.
    pub events_failed: Counter,
    /// Leases whose claim mirrors wait behind grant work (the controller's work queue: "Storms").
    pub mirrors_deferred: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self::unlabelled();
        // Every `kind` from the start, at 0: a series that first appears at 1 hides its
        // first write from rate() and increase() (alerts on write errors would miss it).
        for kind in WriteLabels::KINDS {
            let _ = metrics.write_conflicts.get_or_create(&WriteLabels { kind });
            let _ = metrics.write_errors.get_or_create(&WriteLabels { kind });
        }
        metrics
    }
}

impl WriteLabels {
    pub const KINDS: [&'static str; 2] = ["lease", "claim"];
}

impl Metrics {
    /// The metrics, registered; label families without series yet.
    fn unlabelled() -> Self {
        let mut registry = Registry::with_prefix("palisade");
        let r = &mut registry;
        Self {
            grants: register(r, "grants", "Grants made (each with a new fencing token)"),
            releases: register(
                r,
                "releases",
                "Grants ended because the holder deleted its claim",
            ),
            expirations: register(
                r,
                "expirations",
                "Grants ended because no renewal was observed in time",
            ),
            revocations: register(
                r,
                "revocations",
                "Grants ended because the holder's pod is gone or terminal",
            ),
            write_conflicts: register(
                r,
                "write_conflicts",
                "Status writes refused because the object changed since it was read (resourceVersion precondition)",
            ),
            write_errors: register(
                r,
                "write_errors",
                "Status writes that failed for another reason",
            ),
            handover_latency: {
                // 0.5 ms .. ~16 s
                let buckets = exponential_buckets(0.0005, 2.0, 16);
                let histogram = Histogram::new(buckets);
                r.register_with_unit(
                    "handover_latency",
                    "Time from the event that ended a grant to the write that granted the next claim",
                    Unit::Seconds,
                    histogram.clone(),
                );
                histogram
            },
            leases_held: register(r, "leases_held", "Leases that currently have a holder"),
            leases: register(r, "leases", "Leases known to the controller"),
            claims_waiting: register(
                r,
                "claims_waiting",
                "Claims waiting for a Lease, summed over the Leases' status.waitingCount",
            ),
            longest_queue: register(
                r,
                "longest_queue",
                "The most claims waiting for any one Lease (its status.waitingCount)",
            ),
            is_leader: register(
                r,
                "is_leader",
                "1 while this replica is the active controller",
            ),
            invalid_objects: register(
                r,
                "invalid_objects",
                "Watched objects that could not be read and were skipped",
            ),
            events_dropped: register(
                r,
                "events_dropped",
                "Kubernetes Events dropped because the publish queue was full",
            ),
            events_failed: register(r, "events_failed", "Kubernetes Events whose create failed"),
            mirrors_deferred: register(
                r,
                "claim_mirrors_deferred",
                "Leases whose claims' status mirrors wait until no grant, expiry or revocation is pending",
            ),
            registry,
        }
    }
}

/// A new metric, registered under `name`.
fn register<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    pub fn encode(&self) -> String {
        admin::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_kind_and_the_queue_gauges_are_exposed_from_the_start() {
        let text = Metrics::default().encode();
        for line in [
            "palisade_write_errors_total{kind=\"lease\"} 0",
            "palisade_write_errors_total{kind=\"claim\"} 0",
            "palisade_write_conflicts_total{kind=\"lease\"} 0",
            "palisade_write_conflicts_total{kind=\"claim\"} 0",
            "palisade_claims_waiting 0",
            "palisade_longest_queue 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }
}
