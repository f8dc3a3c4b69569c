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
//! Scenarios are exactly [`SCENARIOS`]; one that does not apply has `n = 0` and a
//! note saying why. Percentiles are nearest-rank.
//!
//! No figure is clamped. `expiry-past-duration` samples are signed: a handover that
//! landed before the duration (as the bench saw the grant) is negative. A server-side
//! rate less an idle rate is written as it came out, negative too; the report shows
//! a negative rate as invalid.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// The handover scenarios, in table order.
pub const SCENARIOS: [&str; 3] = ["release", "pod-deletion", "expiry-past-duration"];

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
