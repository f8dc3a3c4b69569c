//! The fenced operators' rules: their writes to the API server (operator_worker.rs)
//! and the harness's watch of their objects. Per object, its versions are put in
//! resourceVersion order (etcd's revision: the order the writes landed), from the
//! accepted writes' responses and the watch together (the watch also shows a write
//! whose answer was lost):
//!
//! - no write of a deposed leader lands after its successor's first landed write:
//!   along the versions, a token never comes after a higher one (each version that
//!   does counts once in `landed_late`, which must stay 0; writes of a deposed leader
//!   that land before its successor's first are no breach: the successor has not
//!   written yet, and will write over them);
//! - one version is one write: a resourceVersion never shows two tokens;
//! - a refusal is the fence's verdict on the write's own token: its message names that
//!   token as stale (a stamp lost or mangled on the way is refused too, but for
//!   another reason, and is a bug);
//! - after the faults stop, an operator leads and writes again: an operator write
//!   sent after healing is accepted. Not judged when an API server started less than
//!   [`SETTLE_NS`] before healing: until its admission knows the policy's paramKind
//!   (up to 30 s) it refuses every operator write and the new leader's confirmation,
//!   which then times out (20 s) before the next candidate tries (operator_setup.rs,
//!   `chart_value`).
//!
//! What it counts: writes accepted, refused and of unknown outcome, and each object's
//! handovers (a higher token along its versions).

use std::collections::BTreeMap;

use super::{Event, Outcome};

/// How long after an API server's start the operators' liveness is not judged.
pub const SETTLE_NS: u64 = 60_000_000_000;

/// The faults that end with an API server started again.
const STARTS_APISERVER: [&str; 2] = ["restart_apiserver", "kill_apiserver"];

#[derive(Debug, Default)]
pub struct OperatorCounts {
    pub accepted: usize,
    /// Refused by the operators policy (a stale token).
    pub refused: usize,
    /// Timed out or failed otherwise: judged by what the watch saw.
    pub unknown: usize,
    /// Versions a deposed leader made after its successor's first (must be 0).
    pub landed_late: usize,
    /// Per object, how often the token rose along its versions.
    pub handovers: BTreeMap<String, usize>,
    /// Writes sent after healing and accepted.
    pub after_healing: usize,
}

impl OperatorCounts {
    pub fn summary(&self) -> String {
        let handovers: Vec<String> = self
            .handovers
            .iter()
            .map(|(object, n)| format!("{object} {n}"))
            .collect();
        format!(
            "operator writes: {} accepted ({} after healing), {} refused, {} unknown, {} landed \
             after a successor's first (handovers: {})",
            self.accepted,
            self.after_healing,
            self.refused,
            self.unknown,
            self.landed_late,
            handovers.join(", ")
        )
    }
}

/// One version of an object: its token, and the write that made it when its answer
/// said so (none: seen by the harness's watch).
#[derive(Clone, Copy)]
struct Version<'a> {
    rv: u64,
    token: u64,
    by: Option<(&'a str, u64)>,
}

impl Version<'_> {
    fn describe(&self) -> String {
        match self.by {
            Some((worker, seq)) => format!(
                "write {seq} of {worker} with token {} (rv {})",
                self.token, self.rv
            ),
            None => format!(
                "a version with token {} (rv {}, seen by the watch)",
                self.token, self.rv
            ),
        }
    }
}

/// Adds a violation for each break of the rules above; returns the counts.
pub fn check(events: &[Event], violations: &mut Vec<String>) -> OperatorCounts {
    let mut counts = OperatorCounts::default();
    let healed = events.iter().find_map(|e| match e {
        Event::Healed { t_ns } => Some(*t_ns),
        _ => None,
    });
    let mut by_object: BTreeMap<&str, Vec<Version>> = BTreeMap::new();
    for e in events {
        match e {
            Event::OperatorWrite {
                worker,
                token,
                object,
                seq,
                start_ns,
                outcome,
                rv,
                detail,
                ..
            } => {
                match outcome {
                    Outcome::Accepted => counts.accepted += 1,
                    Outcome::Stale => counts.refused += 1,
                    Outcome::Error | Outcome::NoMark => counts.unknown += 1,
                }
                if *outcome == Outcome::Accepted {
                    if healed.is_some_and(|t| *start_ns > t) {
                        counts.after_healing += 1;
                    }
                    if let Some(rv) = rv {
                        by_object.entry(object).or_default().push(Version {
                            rv: *rv,
                            token: *token,
                            by: Some((worker, *seq)),
                        });
                    }
                }
                if *outcome == Outcome::Stale
                    && !detail.contains(&format!("stale fencing token {token} "))
                {
                    violations.push(format!(
                        "operator object {object}: write {seq} of {worker} with token {token} \
                         was refused, but not for that token being stale: {detail}"
                    ));
                }
            }
            Event::OperatorObjectSeen {
                object, rv, token, ..
            } => by_object.entry(object).or_default().push(Version {
                rv: *rv,
                token: *token,
                by: None,
            }),
            _ => {}
        }
    }
    for (object, versions) in by_object.iter_mut() {
        let handovers = judge_versions(object, versions, &mut counts, violations);
        counts.handovers.insert(object.to_string(), handovers);
    }
    let started = events
        .iter()
        .filter_map(|e| match e {
            Event::Fault { fault, end_ns, .. } if STARTS_APISERVER.contains(&fault.as_str()) => {
                Some(*end_ns)
            }
            _ => None,
        })
        .max();
    let settled = healed.is_some_and(|t| started.is_none_or(|s| s + SETTLE_NS <= t));
    if settled && counts.accepted + counts.refused + counts.unknown > 0 && counts.after_healing == 0
    {
        violations.push(
            "operators: no operator write was accepted after the faults stopped: none leads again"
                .into(),
        );
    }
    counts
}

/// The rules on one object's versions; returns its handovers.
fn judge_versions(
    object: &str,
    versions: &mut Vec<Version>,
    counts: &mut OperatorCounts,
    violations: &mut Vec<String>,
) -> usize {
    // A write's own answer first among the sightings of its version: it names the write.
    versions.sort_by_key(|v| (v.rv, v.by.is_none()));
    versions.dedup_by(|later, first| later.rv == first.rv && later.token == first.token);
    let mut handovers = 0;
    let mut highest: Option<u64> = None;
    for (i, v) in versions.iter().enumerate() {
        if i > 0 && versions[i - 1].rv == v.rv {
            violations.push(format!(
                "operator object {object}: version {} shows two tokens: {} and {}",
                v.rv,
                versions[i - 1].describe(),
                v.describe()
            ));
            continue;
        }
        match highest {
            Some(high) if v.token < high => {
                counts.landed_late += 1;
                let successor = versions[..i]
                    .iter()
                    .find(|w| w.token > v.token)
                    .expect("a higher token came before");
                violations.push(format!(
                    "operator object {object}: {} landed after its successor's first write, \
                     {}",
                    v.describe(),
                    successor.describe()
                ));
            }
            Some(high) if v.token > high => {
                handovers += 1;
                highest = Some(v.token);
            }
            None => highest = Some(v.token),
            Some(_) => {}
        }
    }
    handovers
}
