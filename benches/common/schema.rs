//! The result schema every benchmark program writes (`target/bench/<source>.json`)
//! and `benches/report.rs` merges. Go and the Rust peer crates write the same JSON.
//!
//! ```json
//! {"source": "palisade-handover", "versions": {"palisade": "0.1.0", "kubernetes": "v1.37.2"},
//!  "latency": [{"system": "palisade", "config": "default", "scenario": "release", "unit": "ms",
//!    "n": 200, "p50": 0, "p95": 0, "p99": 0, "min": 0, "max": 0, "mean": 0,
//!    "samples": [], "note": ""}],
//!  "figures": [{"system": "palisade", "name": "lease_requests_per_s_1_holder_3_waiters",
//!    "value": 0.1, "unit": "req/s", "note": ""}]}
//! ```
//!
//! Scenarios are exactly [`SCENARIOS`] (the handover table), [`OTHER_SCENARIOS`]
//! (failover, storm), those of [`HA_ROWS`] (the HA control plane) and
//! [`OPERATOR_SCENARIOS`] (fenced operators); one that does not apply has `n = 0` and
//! a note saying why. Percentiles are nearest-rank.
//!
//! No figure is clamped. `expiry-past-duration` and `storm-past-duration` samples are signed: a handover that
//! landed before the duration (as the bench saw the grant) is negative. A server-side
//! rate less an idle rate is written as it came out, negative too; the report shows
//! a negative rate as invalid.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// The handover scenarios, in table order.
pub const SCENARIOS: [&str; 3] = ["release", "pod-deletion", "expiry-past-duration"];

/// Latency scenarios outside the handover table, each with a table of its own:
/// `failover` (from SIGKILL of the leading replica to the new leader's first grant, as
/// the bench's watch saw it; config `default`/`before`/`tuned`) and
/// `storm-past-duration` (N holders silent at once: each re-grant past its due
/// instant, /readyz + D, signed; config `N` with bare-claim waiters, the Lease write as
/// the bench's watch saw it, `N-library` with library waiters, `acquire` returning, or
/// `N-semaphore`: N semaphores, every slot's holder silent, a bare claim waiting per
/// slot, each slot's re-grant as the bench's watch saw it).
pub const OTHER_SCENARIOS: [&str; 2] = ["failover", "storm-past-duration"];

/// The rows of the HA bench (`benches/ha/`, source `ha`), each (scenario, config),
/// with a table of their own: release handovers across the two API servers of the
/// replicated control plane, holder on kube-apiserver-0 (with the controller) and
/// waiter on -1, then back; and the failover gap from SIGKILL of the leading
/// replica's API server to the waiter's grant.
pub const HA_ROWS: [(&str, &str); 3] = [
    ("ha-release", "holder-0-waiter-1"),
    ("ha-release", "holder-1-waiter-0"),
    ("ha-apiserver-failover", "leader-apiserver-killed"),
];

/// The fenced operators' scenarios (`benches/operator/`, and client-go's failover
/// mode), each with a table of its own: `operator-admission` (one write's latency,
/// config one of [`OPERATOR_ADMISSION_CONFIGS`]) and `operator-failover` (from SIGKILL
/// of the leading operator process, on the harness's clock, to the new leader's first
/// accepted write; config the timings: palisade `lease-<N>s`, client-go
/// `default`/`tuned`).
pub const OPERATOR_SCENARIOS: [&str; 2] = ["operator-admission", "operator-failover"];

/// The writes of `operator-admission`, in table order: the service account named in
/// the chart's `policies.operators`, stamped with its Lease's current token (the
/// policy judges it); an identical account not named (the policy's match condition is
/// false); then both again once the operators policy is uninstalled.
pub const OPERATOR_ADMISSION_CONFIGS: [&str; 4] = [
    "named",
    "not-named",
    "named-no-policy",
    "not-named-no-policy",
];

/// The admission cost's figures, ms: what the policy adds to the named account's write
/// against the not-named one's in the same run (p50 less p50, p99 less p99, the median
/// of the per-round differences); and, with no operators policy, the two accounts'
/// p50s apart (the noise between them).
pub const OPERATOR_ADMISSION_ADDED: [&str; 3] = [
    "operator_admission_added_p50",
    "operator_admission_added_p99",
    "operator_admission_added_median_of_pairs",
];
pub const OPERATOR_ADMISSION_NO_POLICY_DIFFERENCE: &str =
    "operator_admission_no_policy_difference_p50";

/// The operator failover's figures beside its latency: from the kill to the new
/// leader's code starting (palisade: its grant confirmed; client-go: OnStartedLeading),
/// nearest rank, one per system and config.
pub const OPERATOR_TO_LEADING: [&str; 2] = [
    "operator_failover_to_leading_p50",
    "operator_failover_to_leading_p99",
];

/// The rows of the semaphore bench (`benches/semaphore.rs`), each (scenario, config), in
/// a table of their own: release handovers on a lock and on slot 0 of a semaphore of 3,
/// interleaved in one run; and the waits of contenders on a semaphore (how many of
/// each: the row's note and the source's parameters).
pub const SEMAPHORE_ROWS: [(&str, &str); 3] = [
    ("slot-release", "lock"),
    ("slot-release", "semaphore-3"),
    ("semaphore-wait", "contended"),
];

/// The HA bench's figure: in how many failover rounds the standby led afterwards
/// (its note says, per round, who led).
pub const HA_LEADER_MOVED: &str = "ha_failover_leader_moved_rounds";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Source {
    pub source: String,
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
    #[serde(default)]
    pub latency: Vec<Latency>,
    #[serde(default)]
    pub figures: Vec<Figure>,
    /// How the source ran (rounds, lanes, windows): free-form.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, serde_json::Value>,
}

impl Source {
    /// Writes `dir/<source>.json`; its path.
    pub fn write_to(&self, dir: &std::path::Path) -> std::path::PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!("{}.json", self.source));
        std::fs::write(&path, serde_json::to_string_pretty(self).unwrap()).unwrap();
        path
    }

    /// What a bench prints at the end: its latency table (rows named by `label`) and
    /// its other figures.
    pub fn summary(&self, title: &str, label: impl Fn(&Latency) -> &str) -> String {
        let mut md =
            format!("| {title} | n | p50 | p95 | p99 | max |\n|---|---|---|---|---|---|\n");
        for l in &self.latency {
            md += &format!(
                "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |\n",
                label(l),
                l.n,
                l.p50,
                l.p95,
                l.p99,
                l.max
            );
        }
        for f in &self.figures {
            md += &format!("\n{}: {:.3} {}", f.name, f.value, f.unit);
        }
        md
    }
}

/// The versions a palisade bench ran with: this crate's, and the API server's
/// (`git_version`) when the bench has one.
pub fn palisade_versions(kubernetes: Option<String>) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::from([(
        "palisade".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    )]);
    if let Some(kubernetes) = kubernetes {
        versions.insert("kubernetes".to_string(), kubernetes);
    }
    versions
}

/// A bench's parameters: its own, then its build profile and its wall time.
pub fn parameters(
    own: Vec<(&str, serde_json::Value)>,
    started: std::time::Instant,
) -> BTreeMap<String, serde_json::Value> {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    own.into_iter()
        .chain([
            ("profile", serde_json::json!(profile)),
            (
                "wall_seconds",
                serde_json::json!(started.elapsed().as_secs_f64().round()),
            ),
        ])
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    pub system: String,
    #[serde(default)]
    pub config: String,
    pub scenario: String,
    #[serde(default = "ms")]
    pub unit: String,
    #[serde(default)]
    pub n: usize,
    #[serde(default, deserialize_with = "number_or_null")]
    pub p50: f64,
    #[serde(default, deserialize_with = "number_or_null")]
    pub p95: f64,
    #[serde(default, deserialize_with = "number_or_null")]
    pub p99: f64,
    #[serde(default, deserialize_with = "number_or_null")]
    pub min: f64,
    #[serde(default, deserialize_with = "number_or_null")]
    pub max: f64,
    #[serde(default, deserialize_with = "number_or_null")]
    pub mean: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
    #[serde(default)]
    pub note: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Figure {
    pub system: String,
    /// Optional: which configuration of the system (client-go's `default` / `tuned`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config: String,
    pub name: String,
    #[serde(deserialize_with = "number_or_null")]
    pub value: f64,
    pub unit: String,
    #[serde(default)]
    pub note: String,
}

fn ms() -> String {
    "ms".to_string()
}

/// `null` (what a writer without NaN makes of "no value") reads as NaN.
fn number_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Latency units the report converts to milliseconds.
pub const UNITS: [&str; 5] = ["ms", "s", "us", "µs", "ns"];

impl Source {
    /// What in this source breaks the schema; empty when it keeps to it. Values may be
    /// negative (an expiry landing before the duration, a rate less an idle rate) and a
    /// figure may be null (not measured); nothing else is loose.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.source.is_empty() {
            out.push("`source` is empty".to_string());
        }
        for l in &self.latency {
            let at = format!("latency {}/{}/{}", l.system, l.config, l.scenario);
            if l.system.is_empty() {
                out.push(format!("{at}: `system` is empty"));
            }
            if !SCENARIOS.contains(&l.scenario.as_str())
                && !OTHER_SCENARIOS.contains(&l.scenario.as_str())
                && !HA_ROWS.iter().any(|(s, _)| *s == l.scenario)
                && !OPERATOR_SCENARIOS.contains(&l.scenario.as_str())
                && !SEMAPHORE_ROWS.iter().any(|(s, _)| *s == l.scenario)
            {
                out.push(format!(
                    "{at}: scenario not one of {SCENARIOS:?}, {OTHER_SCENARIOS:?}, {HA_ROWS:?}, {OPERATOR_SCENARIOS:?} or {SEMAPHORE_ROWS:?}"
                ));
            }
            if l.scenario == OPERATOR_SCENARIOS[0]
                && !OPERATOR_ADMISSION_CONFIGS.contains(&l.config.as_str())
            {
                out.push(format!(
                    "{at}: an admission row's config is one of {OPERATOR_ADMISSION_CONFIGS:?}"
                ));
            }
            if HA_ROWS.iter().any(|(s, _)| *s == l.scenario)
                && !HA_ROWS.contains(&(l.scenario.as_str(), l.config.as_str()))
            {
                out.push(format!("{at}: not one of the HA rows {HA_ROWS:?}"));
            }
            if !UNITS.contains(&l.unit.as_str()) {
                out.push(format!("{at}: unit {:?} not one of {UNITS:?}", l.unit));
            }
            if l.scenario == "failover" && l.config.is_empty() {
                out.push(format!(
                    "{at}: a failover row needs its config (default, before, tuned)"
                ));
            }
            if l.scenario == OPERATOR_SCENARIOS[1] && l.config.is_empty() {
                out.push(format!(
                    "{at}: an operator failover row needs its config (its timings)"
                ));
            }
            if l.scenario == "storm-past-duration" && storm_size(&l.config).is_none() {
                out.push(format!(
                    "{at}: a storm row's config is its number of Leases, or that and `-library` or `-semaphore`"
                ));
            }
            if l.n == 0 {
                if l.note.is_empty() {
                    out.push(format!("{at}: n = 0 without a note saying why"));
                }
                continue;
            }
            if l.samples.len() != l.n {
                out.push(format!("{at}: n = {} but {} samples", l.n, l.samples.len()));
            }
            let summary = [l.min, l.p50, l.p95, l.p99, l.max, l.mean];
            if summary.iter().chain(&l.samples).any(|v| !v.is_finite()) {
                out.push(format!("{at}: a value that is not a finite number"));
            } else if !in_order(l) {
                out.push(format!(
                    "{at}: summary out of order (min {} p50 {} p95 {} p99 {} max {} mean {})",
                    l.min, l.p50, l.p95, l.p99, l.max, l.mean
                ));
            }
        }
        for f in &self.figures {
            if f.system.is_empty() || f.name.is_empty() || f.unit.is_empty() {
                out.push(format!(
                    "figure {}/{}: `system`, `name` and `unit` must be set",
                    f.system, f.name
                ));
            }
        }
        out
    }
}

/// The waiters of a storm row, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StormWaiters {
    /// Bare claims on locks (config `N`).
    Bare,
    /// The client library's `acquire` on locks (config `N-library`).
    Library,
    /// Bare claims, one per slot, on semaphores (config `N-semaphore`).
    Semaphore,
}

/// A storm row's number of Leases and its waiters: config `N`, `N-library` or
/// `N-semaphore`.
pub fn storm_size(config: &str) -> Option<(usize, StormWaiters)> {
    let (n, waiters) = if let Some(n) = config.strip_suffix("-library") {
        (n, StormWaiters::Library)
    } else if let Some(n) = config.strip_suffix("-semaphore") {
        (n, StormWaiters::Semaphore)
    } else {
        (config, StormWaiters::Bare)
    };
    Some((n.parse().ok()?, waiters))
}

/// min <= p50 <= p95 <= p99 <= max, and the mean within min..=max (to rounding).
fn in_order(l: &Latency) -> bool {
    let slack = 1e-9 * l.min.abs().max(l.max.abs()).max(1.0);
    [l.min, l.p50, l.p95, l.p99, l.max]
        .windows(2)
        .all(|w| w[0] <= w[1])
        && l.min - slack <= l.mean
        && l.mean <= l.max + slack
}

/// The nearest-rank percentile `q` (0..=1) of sorted `v`.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Latency {
    /// The summary of `samples` (milliseconds), keeping the raw samples in their order.
    pub fn of(system: &str, config: &str, scenario: &str, samples: Vec<f64>, note: &str) -> Self {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let (p50, p95, p99) = (
            nearest_rank(&sorted, 0.50),
            nearest_rank(&sorted, 0.95),
            nearest_rank(&sorted, 0.99),
        );
        let (min, max, mean) = if n == 0 {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            (
                sorted[0],
                sorted[n - 1],
                sorted.iter().sum::<f64>() / n as f64,
            )
        };
        let zero_if_empty = |v: f64| if n == 0 { 0.0 } else { v };
        Latency {
            system: system.to_string(),
            config: config.to_string(),
            scenario: scenario.to_string(),
            unit: ms(),
            n,
            p50: zero_if_empty(p50),
            p95: zero_if_empty(p95),
            p99: zero_if_empty(p99),
            min: zero_if_empty(min),
            max: zero_if_empty(max),
            mean: zero_if_empty(mean),
            samples,
            note: note.to_string(),
        }
    }
}
