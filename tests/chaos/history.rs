//! The recorded history of a chaos run, and the checker that judges it.
//!
//! Workers append [`Event`]s to a file each (one JSON line per event, written with
//! one `write` call, so a SIGKILL can at most tear the last line); the harness
//! appends what it observed through its own watches and the faults it injected.
//! The file-backed fence keeps its own journal, in the order it accepted writes.
//! The checker reads all of it after the run; it never trusts a single source.
//!
//! What it calls a violation. Every rule on tokens is per *key*: a slot of a Lease (a
//! lock has slot 0 only; a semaphore's slots are independent sequences, their grants of
//! one write sharing a token), which the stores fence under the slot's fence key.
//! Tokens are compared per slot in the Lease's resourceVersion order (issued once per
//! slot, never going back, higher at each change of holder: history/leases.rs), and per
//! store and key in commit order (the file fence's journal; the ConfigMap's
//! resourceVersions, from accepted responses and the harness's watch together); every
//! version of a slot's fenced ConfigMap the watch sees still names that Lease and slot
//! in its labels (a stale worker tries to move it to another Lease, another slot or a
//! missing one). "Stale" in real time means a write that *started* after a higher
//! token's write had been *acknowledged*, on the machine-wide monotonic clock; writes
//! that overlap are ordered by the store, and only the commit-order rule applies to
//! them. A write whose outcome is unknown (timeout, cut connection) is judged by what
//! the store shows. Timing contract: each worker's renewals are recorded with their
//! send time and response; a renewal with a 2xx response in which the claim has not
//! ended makes its holder believe it holds its slot until send time + two thirds of
//! the duration, and a Lease version naming another holder (or none) in that slot, seen
//! by the harness before that, is a violation unless the holder had released. At most
//! `permits` per Lease: no version names more holders, and no more holders believe at
//! any instant (history/leases.rs). The first
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

mod leases;
mod operator;
mod record;
mod self_check;

use std::collections::{BTreeMap, HashMap};

pub use record::{Event, JournalWrite, Outcome, Recorder, read_dir, slot_key};
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
    /// Per Lease: the most holders one of its versions named (a semaphore's, at once).
    pub most_held: BTreeMap<String, usize>,
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
    /// The Leases workers contend for, with their permits.
    pub leases: Vec<crate::cluster::ChaosLease>,
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
    leases::check_grants(events, &mut v);
    leases::check_holders_within_permits(events, expect, &mut v);
    check_store_order(events, journal, &mut v);
    for (store, journal) in stores {
        check_journal_order(store, journal, &mut v);
    }
    check_stale_accepted(events, &mut v);
    check_labels_kept(events, expect, &mut v);
    check_stale_rejections(events, journal, stores, &mut v);
    check_lost_marks(events, stores, &mut v);
    check_tokens_issued(events, &mut v);
    leases::check_liveness(events, expect, &mut v);
    leases::check_silenced_holders_expire(events, &mut v);
    leases::check_claim_phases(events, &mut v);
    leases::check_renewal_contract(events, expect, &mut v);
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

/// In the order each store committed writes, tokens per key never decrease: the
/// file fence's journal, and the ConfigMap's versions (accepted responses and
/// watch events together, ordered by resourceVersion).
fn check_store_order(events: &[Event], journal: &[JournalWrite], v: &mut Verdict) {
    let mut highest: HashMap<(&str, i32), &JournalWrite> = HashMap::new();
    for (i, w) in journal.iter().enumerate() {
        let key = (w.lease.as_str(), w.slot);
        if let Some(prev) = highest.get(&key)
            && w.token < prev.token
        {
            v.violations.push(format!(
                "file store, key {}: journal entry {} accepted token {} (worker {} write {}) \
                 after token {} (worker {} write {})",
                slot_key(&w.lease, w.slot),
                i,
                w.token,
                w.worker,
                w.seq,
                prev.token,
                prev.worker,
                prev.seq
            ));
        }
        if highest.get(&key).is_none_or(|p| w.token >= p.token) {
            highest.insert(key, w);
        }
    }
    let mut versions: BTreeMap<(&str, i32), Vec<(u64, u64)>> = BTreeMap::new();
    for e in events {
        match e {
            Event::Write {
                lease,
                slot,
                store,
                token,
                outcome: Outcome::Accepted,
                rv: Some(rv),
                ..
            } if store == "configmap" => versions
                .entry((lease, *slot))
                .or_default()
                .push((*rv, *token)),
            Event::ConfigMapSeen {
                lease,
                slot,
                rv,
                token,
                ..
            } => versions
                .entry((lease, *slot))
                .or_default()
                .push((*rv, *token)),
            _ => {}
        }
    }
    for ((lease, slot), mut vs) in versions {
        let key = slot_key(lease, slot);
        vs.sort();
        vs.dedup();
        for pair in vs.windows(2) {
            let ((rv_a, a), (rv_b, b)) = (pair[0], pair[1]);
            if rv_a == rv_b && a != b {
                v.violations.push(format!(
                    "configmap of {key}: version {rv_a} seen with tokens {a} and {b}"
                ));
            } else if b < a {
                v.violations.push(format!(
                    "configmap of {key}: token went down from {a} (rv {rv_a}) to {b} (rv {rv_b})"
                ));
            }
        }
    }
}

/// No store accepted a write that started after a higher token's write had
/// already been accepted (real time on the shared monotonic clock): the stale
/// writes that must be rejected whatever order the store chose for concurrent ones.
fn check_stale_accepted(events: &[Event], v: &mut Verdict) {
    // (store, Lease, slot) -> accepted writes as (end, start, token, worker, seq)
    type Timed<'a> = (u64, u64, u64, &'a str, u64);
    let mut accepted: BTreeMap<(&str, &str, i32), Vec<Timed>> = BTreeMap::new();
    for e in events {
        if let Event::Write {
            worker,
            lease,
            slot,
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
                .entry((store, lease, *slot))
                .or_default()
                .push((*end_ns, *start_ns, *token, worker, *seq));
        }
    }
    for ((store, lease, slot), mut writes) in accepted {
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
                    "{store} store, key {}: accepted stale write {seq} of {worker} with token \
                     {token}, after write {by_seq} of {by} with token {high} had been accepted",
                    slot_key(lease, slot)
                ));
            }
        }
    }
}

/// Every version of a slot's fenced ConfigMap is still fenced by that slot of that
/// Lease: the labels' values never change (docs/fences.md, "Why the policy is built
/// this way"). A stale holder that moved the object to another Lease, another slot, or
/// to none that exists, would be judged against that one.
fn check_labels_kept(events: &[Event], expect: &Expectations, v: &mut Verdict) {
    let owners: HashMap<String, (&str, i32)> = expect
        .leases
        .iter()
        .flat_map(|l| {
            l.slots().map(|slot| {
                (
                    crate::worker::configmap_name(&l.name, slot),
                    (l.name.as_str(), slot),
                )
            })
        })
        .collect();
    for e in events {
        let Event::ConfigMapSeen {
            lease,
            slot,
            name,
            rv,
            ..
        } = e
        else {
            continue;
        };
        let Some(&(owner, owner_slot)) = owners.get(name) else {
            continue;
        };
        if owner != lease {
            v.violations.push(format!(
                "configmap {name}: version {rv} is fenced by Lease {lease:?}, not by {owner}: \
                 its label palisade.dev/fenced-by was changed"
            ));
        } else if owner_slot != *slot {
            v.violations.push(format!(
                "configmap {name}: version {rv} is fenced by slot {slot} of {lease}, not by \
                 slot {owner_slot}: its label palisade.dev/fenced-slot was changed"
            ));
        }
    }
}

/// In a database store's commit order, tokens per key never decrease.
fn check_journal_order(store: &str, journal: &[JournalWrite], v: &mut Verdict) {
    let mut highest: HashMap<(&str, i32), &JournalWrite> = HashMap::new();
    for (i, w) in journal.iter().enumerate() {
        let key = (w.lease.as_str(), w.slot);
        match highest.get(&key) {
            Some(prev) if w.token < prev.token => v.violations.push(format!(
                "{store} store, key {}: commit {} accepted token {} (worker {} write {}) \
                 after token {} (worker {} write {})",
                slot_key(&w.lease, w.slot),
                i,
                w.token,
                w.worker,
                w.seq,
                prev.token,
                prev.worker,
                prev.seq
            )),
            _ => {
                highest.insert(key, w);
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
                slot,
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
                        "{store} store, key {}: write {seq} of {worker} with token {token} \
                         was accepted after the store lost its marks: the fence started over",
                        slot_key(lease, *slot)
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
                    lossy.store,
                    slot_key(&w.lease, w.slot),
                    w.seq,
                    w.worker,
                    w.token
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
    // (store, Lease, slot, token) of every write a store shows it accepted.
    let mut accepted: Vec<(&str, &str, i32, u64)> = journal
        .iter()
        .map(|w| ("file", w.lease.as_str(), w.slot, w.token))
        .collect();
    for (store, journal) in stores {
        accepted.extend(
            journal
                .iter()
                .map(|w| (store.as_str(), w.lease.as_str(), w.slot, w.token)),
        );
    }
    for e in events {
        match e {
            Event::ConfigMapSeen {
                lease, slot, token, ..
            } => accepted.push(("configmap", lease, *slot, *token)),
            Event::Write {
                store,
                lease,
                slot,
                token,
                outcome: Outcome::Accepted,
                ..
            } if store == "configmap" => accepted.push(("configmap", lease, *slot, *token)),
            _ => {}
        }
    }
    let mut highest: HashMap<(&str, &str, i32), u64> = HashMap::new();
    for (store, lease, slot, token) in accepted {
        let entry = highest.entry((store, lease, slot)).or_default();
        *entry = (*entry).max(token);
    }
    for e in events {
        if let Event::Write {
            worker,
            lease,
            slot,
            store,
            token,
            seq,
            outcome: Outcome::Stale,
            ..
        } = e
            && !crate::dbstores::LOSSY.iter().any(|l| l.store == store)
        {
            let high = highest
                .get(&(store.as_str(), lease.as_str(), *slot))
                .copied()
                .unwrap_or(0);
            if high <= *token {
                v.violations.push(format!(
                    "{store} store, key {}: write {seq} of {worker} with token {token} was \
                     rejected as stale, but no higher token was ever accepted (highest {high})",
                    slot_key(lease, *slot)
                ));
            }
        }
    }
}

/// Every accepted write carries a token that was granted for its slot of its Lease.
fn check_tokens_issued(events: &[Event], v: &mut Verdict) {
    let mut issued: HashMap<(&str, i32), Vec<u64>> = HashMap::new();
    for e in events {
        match e {
            Event::Grant {
                lease, slot, token, ..
            }
            | Event::LeaseSeen {
                lease, slot, token, ..
            } => issued.entry((lease, *slot)).or_default().push(*token),
            _ => {}
        }
    }
    for e in events {
        if let Event::Write {
            worker,
            lease,
            slot,
            store,
            token,
            seq,
            outcome: Outcome::Accepted,
            ..
        } = e
            && !issued
                .get(&(lease.as_str(), *slot))
                .is_some_and(|t| t.contains(token))
        {
            v.violations.push(format!(
                "{store} store, key {}: accepted write {seq} of {worker} carries token \
                 {token}, which was never granted",
                slot_key(lease, *slot)
            ));
        }
    }
}
