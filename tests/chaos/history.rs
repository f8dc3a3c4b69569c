//! The recorded history of a chaos run, and the checker that judges it.
//!
//! Workers append [`Event`]s to a file each (one JSON line per event, written with
//! one `write` call, so a SIGKILL can at most tear the last line); the harness
//! appends what it observed through its own watches and the faults it injected.
//! The file-backed fence keeps its own journal, in the order it accepted writes.
//! The checker reads all of it after the run; it never trusts a single source.
//!
//! What it calls a violation. Tokens are compared per Lease in the Lease's
//! resourceVersion order, and per store in commit order (the file fence's journal; the
//! ConfigMap's resourceVersions, from accepted responses and the harness's watch
//! together); every version of a Lease's fenced ConfigMap the watch sees still names
//! that Lease in its label (a stale worker tries to move it to another Lease or a
//! missing one). "Stale" in real time means a write that *started* after a higher
//! token's write had been *acknowledged*, on the machine-wide monotonic clock; writes
//! that overlap are ordered by the store, and only the commit-order rule applies to
//! them. A write whose outcome is unknown (timeout, cut connection) is judged by what
//! the store shows. Timing contract: each worker's renewals are recorded with their
//! send time and response; a renewal with a 2xx response in which the claim has not
//! ended makes its holder believe it holds the Lease until send time + two thirds of
//! the duration, and a Lease version naming another holder (or none), seen by the
//! harness before that, is a violation unless the holder had released. The first
//! belief of a holder needs no rule of its own: `acquire` returns only after a renewal
//! counted, and that renewal is recorded like every other. Claim phases: the
//! renewals' responses, in send order, never show a claim's phase move back (out of a
//! final phase, or from `Granted` to `Pending`). Liveness: once the faults stop, every
//! Lease is granted again within its duration plus 10 s (watches cut by the faults
//! reconnect with the backoff of `src/watch_backoff.rs`) plus the election's takeover
//! (1 s lease, 250 ms retry: the suite runs two elected replicas, and the last fault
//! may have killed the leader). Expiry under changing leadership: a holder
//! `flap_leadership` stops (`Silenced`) must be replaced (another holder or none)
//! within the duration plus 5 s while leadership changes hands about once a second.
//! The HA plane's rules (a resourceVersion never going back through one server, no
//! lower token at a newer one across servers, no fenced write accepted below a grant
//! its server had shown 2 s before) are in `watch_caches.rs`. The fenced operators'
//! (per object, in resourceVersion order, no write of a deposed leader lands after its
//! successor's first landed write; a refusal names the write's token as stale; an
//! operator writes again after healing) are in `history/operator.rs`.

mod operator;
mod record;
mod self_check;

use std::collections::{BTreeMap, HashMap};

pub use record::{Event, JournalWrite, Outcome, Recorder, read_dir};
pub use self_check::self_check;

#[derive(Debug, Default)]
pub struct Verdict {
    /// Distinct (lease, token) grants seen by workers or the harness's watch.
    pub grants: usize,
    pub faults: BTreeMap<String, usize>,
    /// Stale write attempts the stores rejected, per store.
    pub stale_rejected: BTreeMap<String, usize>,
    /// Writes refused because the store had lost the mark, per store.
    pub no_mark_refused: BTreeMap<String, usize>,
    /// Writes accepted although a higher token had been accepted before they started.
    pub stale_accepted: usize,
    /// Writes whose outcome is unknown (timeouts, cut connections).
    pub unknown_outcomes: usize,
    pub accepted: BTreeMap<String, usize>,
    /// Per Lease: how long after healing it was granted again.
    pub recovery_ms: BTreeMap<String, u64>,
    /// Stale writes rejected (any store) by the fault kind last begun before each
    /// was sent.
    pub stale_after: BTreeMap<String, usize>,
    /// The HA plane's watch caches: how far one lagged the other (none: one server).
    pub cache_lag: Option<crate::watch_caches::CacheLag>,
    pub operators: operator::OperatorCounts,
    pub violations: Vec<String>,
}

impl Verdict {
    pub fn stale_rejected_total(&self) -> usize {
        self.stale_rejected.values().sum()
    }

    pub fn summary(&self) -> String {
        let faults: usize = self.faults.values().sum();
        let by_kind: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let stale_after: Vec<String> = self
            .faults
            .keys()
            .map(|k| format!("{k} {}", self.stale_after.get(k).copied().unwrap_or(0)))
            .collect();
        let lag = self.cache_lag.map_or(String::new(), |l| {
            format!(
                "; watch caches: {} versions seen through both, lag p99 {} ms, max {} ms",
                l.versions, l.p99_ms, l.max_ms
            )
        });
        format!(
            "chaos: {} grants, {} faults ({}), {} stale writes rejected (after each kind: {}), \
             {} refused for a lost mark, {} accepted, {} violations{lag}; {}",
            self.grants,
            faults,
            by_kind.join(", "),
            self.stale_rejected_total(),
            stale_after.join(", "),
            self.no_mark_refused.values().sum::<usize>(),
            self.stale_accepted,
            self.violations.len(),
            self.operators.summary()
        )
    }
}

/// What the checker needs besides the events.
pub struct Expectations {
    pub leases: Vec<String>,
    /// After `Healed`, every Lease must be granted again within this long
    /// (its duration plus the stated bound).
    pub liveness_ns: u64,
    /// How long after *sending* a successful renewal a holder may believe it holds
    /// the Lease (the client library's two thirds of the duration).
    pub holder_deadline_ns: u64,
}

/// Judges a history. Every rule that fails adds a violation naming what broke.
pub fn check(events: &[Event], journal: &[JournalWrite], expect: &Expectations) -> Verdict {
    check_with_stores(events, journal, &BTreeMap::new(), expect)
}

/// [`check`], with more stores that keep a commit order of their own (PostgreSQL,
/// Redis: see dbstores.rs), by store name; the file fence's rules apply to each.
/// For a lossy store (dbstores.rs's `LOSSY`) that is what it holds after the run,
/// and [`check_lost_marks`] applies.
pub fn check_with_stores(
    events: &[Event],
    journal: &[JournalWrite],
    stores: &BTreeMap<String, Vec<JournalWrite>>,
    expect: &Expectations,
) -> Verdict {
    let mut v = Verdict::default();
    check_grants(events, &mut v);
    check_store_order(events, journal, &mut v);
    for (store, journal) in stores {
        check_journal_order(store, journal, &mut v);
    }
    check_stale_accepted(events, &mut v);
    check_labels_kept(events, expect, &mut v);
    check_stale_rejections(events, journal, stores, &mut v);
    check_lost_marks(events, stores, &mut v);
    check_tokens_issued(events, &mut v);
    check_liveness(events, expect, &mut v);
    check_silenced_holders_expire(events, &mut v);
    check_claim_phases(events, &mut v);
    check_renewal_contract(events, expect, &mut v);
    v.operators = operator::check(events, &mut v.violations);
    if events.iter().any(|e| {
        matches!(
            e,
            Event::LeaseSeen {
                server: Some(_),
                ..
            }
        )
    }) {
        v.cache_lag = Some(crate::watch_caches::check(events, &mut v.violations));
    }
    v.stale_after = stale_after_each_kind(events);
    for e in events {
        match e {
            Event::Fault { fault, .. } => *v.faults.entry(fault.clone()).or_default() += 1,
            Event::Write { store, outcome, .. } => match outcome {
                Outcome::Stale => *v.stale_rejected.entry(store.clone()).or_default() += 1,
                Outcome::Accepted => *v.accepted.entry(store.clone()).or_default() += 1,
                Outcome::Error => v.unknown_outcomes += 1,
                Outcome::NoMark => *v.no_mark_refused.entry(store.clone()).or_default() += 1,
            },
            _ => {}
        }
    }
    v
}

/// Stale writes rejected, by the kind of the fault last begun before each was sent.
fn stale_after_each_kind(events: &[Event]) -> BTreeMap<String, usize> {
    let mut faults: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Fault {
                fault, start_ns, ..
            } => Some((*start_ns, fault.as_str())),
            _ => None,
        })
        .collect();
    faults.sort_unstable();
    let mut counts = BTreeMap::new();
    for e in events {
        if let Event::Write {
            start_ns,
            outcome: Outcome::Stale,
            ..
        } = e
        {
            let before = faults.partition_point(|(t, _)| t <= start_ns);
            if let Some((_, kind)) = before.checked_sub(1).map(|i| faults[i]) {
                *counts.entry(kind.to_string()).or_default() += 1;
            }
        }
    }
    counts
}

/// Tokens per Lease are issued once (one claim per token) and, along the Lease's
/// versions, never decrease and strictly increase when the holder changes.
fn check_grants(events: &[Event], v: &mut Verdict) {
    let mut holders: HashMap<(&str, u64), &str> = HashMap::new();
    let mut seen: BTreeMap<&str, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for e in events {
        let (lease, token, uid) = match e {
            Event::Grant {
                lease,
                token,
                claim_uid,
                ..
            } => (lease, *token, claim_uid),
            Event::LeaseSeen {
                lease,
                rv,
                holder_uid,
                token,
                ..
            } => {
                seen.entry(lease)
                    .or_default()
                    .push((*rv, holder_uid, *token));
                if holder_uid.is_empty() {
                    continue;
                }
                (lease, *token, holder_uid)
            }
            _ => continue,
        };
        match holders.get(&(lease.as_str(), token)) {
            Some(other) if *other != uid => v.violations.push(format!(
                "lease {lease}: token {token} was issued twice, to claims {other} and {uid}"
            )),
            _ => {
                holders.insert((lease, token), uid);
            }
        }
    }
    v.grants = holders.len();
    for (lease, mut versions) in seen {
        versions.sort_by_key(|(rv, _, _)| *rv);
        versions.dedup();
        let mut last: Option<(u64, &str, u64)> = None;
        let mut last_holder: Option<(&str, u64)> = None;
        for (rv, uid, token) in versions {
            if let Some((prev_rv, _, prev_token)) = last
                && token < prev_token
            {
                v.violations.push(format!(
                    "lease {lease}: token went down from {prev_token} (rv {prev_rv}) to {token} (rv {rv})"
                ));
            }
            if !uid.is_empty() {
                if let Some((prev_uid, prev_token)) = last_holder
                    && prev_uid != uid
                    && token <= prev_token
                {
                    v.violations.push(format!(
                        "lease {lease}: holder changed from {prev_uid} to {uid} at rv {rv} \
                         without a higher token ({prev_token} -> {token})"
                    ));
                }
                last_holder = Some((uid, token));
            }
            last = Some((rv, uid, token));
        }
    }
}

/// In the order each store committed writes, tokens per key never decrease: the
/// file fence's journal, and the ConfigMap's versions (accepted responses and
/// watch events together, ordered by resourceVersion).
fn check_store_order(events: &[Event], journal: &[JournalWrite], v: &mut Verdict) {
    let mut highest: HashMap<&str, &JournalWrite> = HashMap::new();
    for (i, w) in journal.iter().enumerate() {
        if let Some(prev) = highest.get(w.lease.as_str())
            && w.token < prev.token
        {
            v.violations.push(format!(
                "file store, key {}: journal entry {} accepted token {} (worker {} write {}) \
                 after token {} (worker {} write {})",
                w.lease, i, w.token, w.worker, w.seq, prev.token, prev.worker, prev.seq
            ));
        }
        if highest
            .get(w.lease.as_str())
            .is_none_or(|p| w.token >= p.token)
        {
            highest.insert(&w.lease, w);
        }
    }
    let mut versions: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for e in events {
        match e {
            Event::Write {
                lease,
                store,
                token,
                outcome: Outcome::Accepted,
                rv: Some(rv),
                ..
            } if store == "configmap" => versions.entry(lease).or_default().push((*rv, *token)),
            Event::ConfigMapSeen {
                lease, rv, token, ..
            } => versions.entry(lease).or_default().push((*rv, *token)),
            _ => {}
        }
    }
    for (lease, mut vs) in versions {
        vs.sort();
        vs.dedup();
        for pair in vs.windows(2) {
            let ((rv_a, a), (rv_b, b)) = (pair[0], pair[1]);
            if rv_a == rv_b && a != b {
                v.violations.push(format!(
                    "configmap of {lease}: version {rv_a} seen with tokens {a} and {b}"
                ));
            } else if b < a {
                v.violations.push(format!(
                    "configmap of {lease}: token went down from {a} (rv {rv_a}) to {b} (rv {rv_b})"
                ));
            }
        }
    }
}

/// No store accepted a write that started after a higher token's write had
/// already been accepted (real time on the shared monotonic clock): the stale
/// writes that must be rejected whatever order the store chose for concurrent ones.
fn check_stale_accepted(events: &[Event], v: &mut Verdict) {
    // (store, key) -> accepted writes as (end, start, token, worker, seq)
    type Timed<'a> = (u64, u64, u64, &'a str, u64);
    let mut accepted: BTreeMap<(&str, &str), Vec<Timed>> = BTreeMap::new();
    for e in events {
        if let Event::Write {
            worker,
            lease,
            store,
            token,
            seq,
            start_ns,
            end_ns,
            outcome: Outcome::Accepted,
            ..
        } = e
        {
            accepted
                .entry((store, lease))
                .or_default()
                .push((*end_ns, *start_ns, *token, worker, *seq));
        }
    }
    for ((store, lease), mut writes) in accepted {
        writes.sort();
        // The highest token among writes that ended at or before each end time.
        let mut best = Vec::with_capacity(writes.len());
        let mut max: Option<(u64, &str, u64)> = None;
        for &(_, _, token, worker, seq) in &writes {
            if max.is_none_or(|(t, _, _)| token > t) {
                max = Some((token, worker, seq));
            }
            best.push(max.expect("set just above"));
        }
        for &(_, start, token, worker, seq) in &writes {
            let ended_before = writes.partition_point(|w| w.0 < start);
            if ended_before == 0 {
                continue;
            }
            let (high, by, by_seq) = best[ended_before - 1];
            if token < high {
                v.stale_accepted += 1;
                v.violations.push(format!(
                    "{store} store, key {lease}: accepted stale write {seq} of {worker} with token \
                     {token}, after write {by_seq} of {by} with token {high} had been accepted"
                ));
            }
        }
    }
}

/// Every version of a Lease's fenced ConfigMap is still fenced by that Lease: the label's
/// value never changes (docs/fences.md, "Why the policy is built this way"). A stale holder that moved the
/// object to another Lease, or to none that exists, would be judged against that one.
fn check_labels_kept(events: &[Event], expect: &Expectations, v: &mut Verdict) {
    for e in events {
        if let Event::ConfigMapSeen {
            lease, name, rv, ..
        } = e
            && let Some(owner) = expect
                .leases
                .iter()
                .find(|l| crate::worker::configmap_name(l) == *name)
            && owner != lease
        {
            v.violations.push(format!(
                "configmap {name}: version {rv} is fenced by Lease {lease:?}, not by {owner}: \
                 its label palisade.dev/fenced-by was changed"
            ));
        }
    }
}

/// In a database store's commit order, tokens per key never decrease.
fn check_journal_order(store: &str, journal: &[JournalWrite], v: &mut Verdict) {
    let mut highest: HashMap<&str, &JournalWrite> = HashMap::new();
    for (i, w) in journal.iter().enumerate() {
        match highest.get(w.lease.as_str()) {
            Some(prev) if w.token < prev.token => v.violations.push(format!(
                "{store} store, key {}: commit {} accepted token {} (worker {} write {}) \
                 after token {} (worker {} write {})",
                w.lease, i, w.token, w.worker, w.seq, prev.token, prev.worker, prev.seq
            )),
            _ => {
                highest.insert(&w.lease, w);
            }
        }
    }
}

/// Once a lossy store has lost its marks (the end of its first loss fault), no
/// write that starts later is admitted: neither reported accepted nor found in
/// what the store holds after the run (an admit whose answer was lost shows there).
fn check_lost_marks(
    events: &[Event],
    stores: &BTreeMap<String, Vec<JournalWrite>>,
    v: &mut Verdict,
) {
    for lossy in crate::dbstores::LOSSY {
        let Some(lost_ns) = events
            .iter()
            .filter_map(|e| match e {
                Event::Fault { fault, end_ns, .. } if fault == lossy.fault.name() => Some(*end_ns),
                _ => None,
            })
            .min()
        else {
            continue;
        };
        let mut started: HashMap<(&str, u64), u64> = HashMap::new();
        for e in events {
            if let Event::Write {
                worker,
                lease,
                store,
                token,
                seq,
                start_ns,
                outcome,
                ..
            } = e
                && store == lossy.store
            {
                started.insert((worker, *seq), *start_ns);
                if *outcome == Outcome::Accepted && *start_ns > lost_ns {
                    v.violations.push(format!(
                        "{store} store, key {lease}: write {seq} of {worker} with token {token} \
                         was accepted after the store lost its marks: the fence started over"
                    ));
                }
            }
        }
        for w in stores.get(lossy.store).into_iter().flatten() {
            // A write with no recorded start (its worker died first) is judged as late.
            if started
                .get(&(w.worker.as_str(), w.seq))
                .is_none_or(|start| *start > lost_ns)
            {
                v.violations.push(format!(
                    "{} store, key {}: holds write {} of {} with token {}, admitted after the \
                     store lost its marks: the fence started over",
                    lossy.store, w.lease, w.seq, w.worker, w.token
                ));
            }
        }
    }
}

/// A write rejected as stale must have met a higher token that the store accepted.
/// Not judged for a lossy store: the accepted writes that justify its refusals are
/// what its loss erased.
fn check_stale_rejections(
    events: &[Event],
    journal: &[JournalWrite],
    stores: &BTreeMap<String, Vec<JournalWrite>>,
    v: &mut Verdict,
) {
    let mut accepted: Vec<(&str, &str, u64)> = journal
        .iter()
        .map(|w| ("file", w.lease.as_str(), w.token))
        .collect();
    for (store, journal) in stores {
        accepted.extend(
            journal
                .iter()
                .map(|w| (store.as_str(), w.lease.as_str(), w.token)),
        );
    }
    for e in events {
        match e {
            Event::ConfigMapSeen { lease, token, .. } => {
                accepted.push(("configmap", lease, *token))
            }
            Event::Write {
                store,
                lease,
                token,
                outcome: Outcome::Accepted,
                ..
            } if store == "configmap" => accepted.push(("configmap", lease, *token)),
            _ => {}
        }
    }
    let mut highest: HashMap<(&str, &str), u64> = HashMap::new();
    for (store, lease, token) in accepted {
        let entry = highest.entry((store, lease)).or_default();
        *entry = (*entry).max(token);
    }
    for e in events {
        if let Event::Write {
            worker,
            lease,
            store,
            token,
            seq,
            outcome: Outcome::Stale,
            ..
        } = e
            && !crate::dbstores::LOSSY.iter().any(|l| l.store == store)
        {
            let high = highest
                .get(&(store.as_str(), lease.as_str()))
                .copied()
                .unwrap_or(0);
            if high <= *token {
                v.violations.push(format!(
                    "{store} store, key {lease}: write {seq} of {worker} with token {token} was \
                     rejected as stale, but no higher token was ever accepted (highest {high})"
                ));
            }
        }
    }
}

/// Every accepted write carries a token that was granted for its Lease.
fn check_tokens_issued(events: &[Event], v: &mut Verdict) {
    let mut issued: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in events {
        match e {
            Event::Grant { lease, token, .. } | Event::LeaseSeen { lease, token, .. } => {
                issued.entry(lease).or_default().push(*token)
            }
            _ => {}
        }
    }
    for e in events {
        if let Event::Write {
            worker,
            lease,
            store,
            token,
            seq,
            outcome: Outcome::Accepted,
            ..
        } = e
            && !issued
                .get(lease.as_str())
                .is_some_and(|t| t.contains(token))
        {
            v.violations.push(format!(
                "{store} store, key {lease}: accepted write {seq} of {worker} carries token \
                 {token}, which was never granted"
            ));
        }
    }
}

/// After `Healed`, each Lease gets a new holder within the stated bound.
/// A holder the harness silenced is expired in time, however the controller's
/// leadership changed meanwhile: its Lease names another holder (or none) within the
/// bound the fault recorded, as the harness's watch or another worker's grant shows.
fn check_silenced_holders_expire(events: &[Event], v: &mut Verdict) {
    for e in events {
        let Event::Silenced {
            lease,
            claim_uid,
            t_ns,
            within_ns,
        } = e
        else {
            continue;
        };
        // Either sighting proves the Lease had moved on by then: the harness's watch
        // (which may lag, its connection cut by a fault) or another worker's grant.
        let within = |at: &u64| *at > *t_ns && *at <= t_ns + within_ns;
        let moved_on = events.iter().any(|seen| match seen {
            Event::LeaseSeen {
                lease: l,
                holder_uid,
                t_ns: at,
                ..
            } => l == lease && holder_uid != claim_uid && within(at),
            Event::Grant {
                lease: l,
                claim_uid: granted,
                t_ns: at,
                ..
            } => l == lease && granted != claim_uid && within(at),
            _ => false,
        });
        if !moved_on {
            v.violations.push(format!(
                "lease {lease}: holder {claim_uid}, silent from {} ms, was not expired within \
                 {} ms",
                t_ns / 1_000_000,
                within_ns / 1_000_000
            ));
        }
    }
}

/// A claim's phase never moves back: once a renewal's response showed a final phase
/// (Expired, Revoked, Released), no later response (by send time) shows it Pending or
/// Granted again, and once it showed Granted, none shows it Pending.
fn check_claim_phases(events: &[Event], v: &mut Verdict) {
    let mut responses: BTreeMap<&str, Vec<(u64, &str)>> = BTreeMap::new();
    for e in events {
        if let Event::Renewal {
            claim_uid,
            send_ns,
            status,
            phase,
            ..
        } = e
            && (200..300).contains(status)
            && !phase.is_empty()
        {
            responses
                .entry(claim_uid)
                .or_default()
                .push((*send_ns, phase));
        }
    }
    let rank = |phase: &str| match phase {
        "Pending" => 0,
        "Granted" => 1,
        _ => 2,
    };
    for (claim, mut seen) in responses {
        seen.sort();
        for pair in seen.windows(2) {
            let ((_, before), (at, after)) = (pair[0], pair[1]);
            if rank(after) < rank(before) || (rank(before) == 2 && after != before) {
                v.violations.push(format!(
                    "claim {claim}: its phase went back from {before} to {after} (renewal sent at \
                     {} ms)",
                    at / 1_000_000
                ));
                break;
            }
        }
    }
}

fn check_liveness(events: &[Event], expect: &Expectations, v: &mut Verdict) {
    let Some(healed) = events.iter().find_map(|e| match e {
        Event::Healed { t_ns } => Some(*t_ns),
        _ => None,
    }) else {
        v.violations
            .push("the run never healed (no Healed event): liveness unchecked".into());
        return;
    };
    for lease in &expect.leases {
        let first = events
            .iter()
            .filter_map(|e| match e {
                Event::Grant { lease: l, t_ns, .. } if l == lease && *t_ns > healed => Some(*t_ns),
                _ => None,
            })
            .min();
        match first {
            Some(t) if t - healed <= expect.liveness_ns => {
                v.recovery_ms
                    .insert(lease.clone(), (t - healed) / 1_000_000);
            }
            Some(t) => v.violations.push(format!(
                "lease {lease}: granted again only {} ms after the faults stopped (bound {} ms)",
                (t - healed) / 1_000_000,
                expect.liveness_ns / 1_000_000
            )),
            None => v.violations.push(format!(
                "lease {lease}: not granted again after the faults stopped (bound {} ms)",
                expect.liveness_ns / 1_000_000
            )),
        }
    }
}

/// The timing contract: the controller never ends a grant while its holder's last
/// successful renewal is within the holder's own deadline (workers have no pods, so
/// their pods never go away). A renewal (or the claim's create, or a waiter's early
/// confirmation: a grant is believed from the latest of these sent before it, DESIGN.md
/// "Client deadlines", so each counts whether it came before the grant or after) is
/// successful when it got a 2xx response in
/// which the claim had not ended, within the holder's deadline; the holder then
/// believes it holds the Lease until send time + `holder_deadline_ns`. An ending is
/// the first Lease version (in resourceVersion order) that names another holder or
/// none, at the time the harness's watch saw it: no earlier than the controller's
/// write, so a violation found this way is certain. Grants whose worker deleted its
/// claim (released) before that are left out.
fn check_renewal_contract(events: &[Event], expect: &Expectations, v: &mut Verdict) {
    let mut believed_until: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut released: HashMap<&str, u64> = HashMap::new();
    let mut versions: BTreeMap<&str, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for e in events {
        match e {
            Event::Renewal {
                claim_uid,
                send_ns,
                end_ns,
                status,
                phase,
                ..
            } if (200..300).contains(status)
                && !matches!(phase.as_str(), "Expired" | "Revoked" | "Released")
                && *end_ns < send_ns + expect.holder_deadline_ns =>
            {
                let until = send_ns + expect.holder_deadline_ns;
                let entry = believed_until.entry(claim_uid).or_insert((until, *send_ns));
                if until > entry.0 {
                    *entry = (until, *send_ns);
                }
            }
            Event::Release {
                claim_uid, t_ns, ..
            } => {
                let first = released.entry(claim_uid).or_insert(*t_ns);
                *first = (*first).min(*t_ns);
            }
            Event::LeaseSeen {
                lease,
                rv,
                holder_uid,
                t_ns,
                ..
            } => versions
                .entry(lease)
                .or_default()
                .push((*rv, holder_uid, *t_ns)),
            _ => {}
        }
    }
    for (lease, mut seen) in versions {
        seen.sort_by_key(|(rv, _, _)| *rv);
        seen.dedup_by_key(|(rv, _, _)| *rv);
        for pair in seen.windows(2) {
            let ((_, held, _), (rv, next, t_obs)) = (pair[0], pair[1]);
            if held.is_empty() || held == next {
                continue;
            }
            if released.get(held).is_some_and(|t| *t <= t_obs) {
                continue;
            }
            if let Some((until, sent)) = believed_until.get(held)
                && *until > t_obs
            {
                v.violations.push(format!(
                    "lease {lease}: the grant of claim {held} ended (seen at rv {rv}) {} ms \
                     before its holder's deadline: a renewal sent {} ms before the ending \
                     had succeeded",
                    (until - t_obs) / 1_000_000,
                    t_obs.saturating_sub(*sent) / 1_000_000
                ));
            }
        }
    }
}
