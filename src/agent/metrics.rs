//! The agent's metrics, all prefixed `palisade_agent_`, on its admin port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route's path pattern, e.g. `/v1/sessions/{session}/leases`.
    pub route: String,
    pub method: String,
}

pub struct AgentMetrics {
    pub registry: Registry,
    pub held: Gauge,
    pub sessions: Gauge,
    losses: Family<ReasonLabels, Counter>,
    requests: Family<RouteLabels, Histogram>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("palisade_agent");
        let held = Gauge::default();
        registry.register(
            "grants_held",
            "Grants held for the pod's applications now",
            held.clone(),
        );
        let sessions = Gauge::default();
        registry.register(
            "sessions",
            "Application sessions open now",
            sessions.clone(),
        );
        let losses = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "grants_lost",
            "Grants that ended other than by a release, by lostReason",
            losses.clone(),
        );
        let requests = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            // 100 µs to about 30 s: the long polls are in the last buckets.
            Histogram::new(exponential_buckets(0.0001, 3.0, 13))
        });
        registry.register(
            "request_duration_seconds",
            "Time to answer a request of the local API, by route",
            requests.clone(),
        );
        Self {
            registry,
            held,
            sessions,
            losses,
            requests,
        }
    }
}

impl AgentMetrics {
    pub fn lost(&self, reason: &'static str) {
        self.losses.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn request(&self, route: String, method: String, seconds: f64) {
        self.requests
            .get_or_create(&RouteLabels { route, method })
            .observe(seconds);
    }
}
