//! Output.

use super::*;

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) figures: Vec<Value>,
    /// Failover gaps and storm delays, in the schema of `benches/common/schema.rs`.
    pub(crate) latency: Vec<schema::Latency>,
}

impl Report {
    pub(crate) fn fig(&mut self, n: usize, name: &str, value: f64, unit: &str, note: String) {
        // Not finite (not measured): written as null, never as 0.
        let value = if value.is_finite() {
            (value * 1000.0).round() / 1000.0
        } else {
            f64::NAN
        };
        println!("scale: leases_{n}_{name} = {value} {unit}");
        self.figures.push(json!({
            "system": "palisade",
            "name": format!("leases_{n}_{name}"),
            "value": value,
            "unit": unit,
            "note": note,
        }));
    }

    /// A latency row (milliseconds), printed as a summary line.
    pub(crate) fn latency(&mut self, l: schema::Latency) {
        println!(
            "scale: latency {}/{}/{}: p50 {:.1} p95 {:.1} p99 {:.1} max {:.1} ms (n={})",
            l.system, l.config, l.scenario, l.p50, l.p95, l.p99, l.max, l.n
        );
        self.latency.push(l);
    }

    pub(crate) fn value(&self, n: usize, name: &str) -> Option<f64> {
        let name = format!("leases_{n}_{name}");
        self.figures
            .iter()
            .find(|f| f["name"] == name.as_str())?
            .get("value")?
            .as_f64()
    }

    pub(crate) fn table(&self) -> String {
        let mut md = String::from("| figure | value | unit | note |\n|---|---|---|---|\n");
        for f in &self.figures {
            md += &format!(
                "| {} | {} | {} | {} |\n",
                f["name"].as_str().unwrap_or_default(),
                f["value"],
                f["unit"].as_str().unwrap_or_default(),
                f["note"].as_str().unwrap_or_default()
            );
        }
        md
    }
}
