//! The checker must be able to fail: each kind of violation, planted in an otherwise
//! clean history, must be reported.

mod slots;

use std::collections::BTreeMap;

use super::{Event, Expectations, JournalWrite, Outcome, check, check_with_stores};
use crate::cluster::ChaosLease;

/// Plants each kind of violation in an otherwise clean history and makes sure it is
/// reported. Run before every chaos run; returns how many were planted.
pub fn self_check() -> Result<usize, String> {
    let fx = Fixture::new();
    let verdict = check(&fx.clean, &fx.clean_journal, &fx.expect);
    if !verdict.violations.is_empty() {
        return Err(format!(
            "a clean history was flagged: {:?}",
            verdict.violations
        ));
    }
    let cases = fx.planted_cases();
    let mut n = cases.len();
    for (name, events, journal, needle) in cases {
        fx.plant(name, events, journal, needle)?;
    }
    n += fx.database_stores()?;
    n += fx.lossy_store()?;
    n += fx.operators()?;
    n += fx.semaphore()?;
    Ok(n)
}

/// A clean history of Lease `l`, and what the checker expects of it.
struct Fixture {
    clean: Vec<Event>,
    clean_journal: Vec<JournalWrite>,
    expect: Expectations,
}

type Case = (&'static str, Vec<Event>, Vec<JournalWrite>, &'static str);

impl Fixture {
    // A clean history: a holds 10 and writes, b takes over with 20 and writes, a's
    // late write with 10 is rejected, and after healing at 200, c is granted 30.
    // a renewed last at 5 (its deadline: 25, before b's grant at 30); b renewed at 240
    // but released at 245, and a renewal that found its claim ended does not count.
    fn new() -> Self {
        let clean = vec![
            grant("a", 10, "ua", 1),
            seen(1, "ua", 10),
            silenced("ua", 2, 40),
            renewal("ua", 5, 200, "Granted"),
            renewal("ua", 12, 200, "Expired"),
            renewal("ua", 14, 0, ""),
            write("a", "file", 10, 10, Outcome::Accepted),
            write("a", "configmap", 10, 20, Outcome::Accepted),
            grant("b", 20, "ub", 30),
            seen(30, "ub", 20),
            write("b", "file", 20, 40, Outcome::Accepted),
            write("b", "configmap", 20, 50, Outcome::Accepted),
            write("a", "file", 10, 60, Outcome::Stale),
            write("a", "configmap", 10, 70, Outcome::Stale),
            Event::Healed { t_ns: 200 },
            renewal("ub", 240, 200, "Granted"),
            Event::Release {
                worker: "b".into(),
                claim: "ub".into(),
                claim_uid: "ub".into(),
                t_ns: 245,
            },
            seen(250, "uc", 30),
            grant("c", 30, "uc", 250),
        ];
        Fixture {
            clean,
            clean_journal: vec![jw(10, "a"), jw(20, "b")],
            expect: Expectations {
                leases: vec![ChaosLease {
                    name: "l".into(),
                    permits: 1,
                }],
                liveness_ns: 100,
                holder_deadline_ns: 20,
            },
        }
    }

    /// The clean history with `extra` events after it.
    fn with(&self, extra: Vec<Event>) -> Vec<Event> {
        let mut events = self.clean.clone();
        events.extend(extra);
        events
    }

    fn plant(
        &self,
        name: &str,
        events: Vec<Event>,
        journal: Vec<JournalWrite>,
        needle: &str,
    ) -> Result<(), String> {
        let verdict = check(&events, &journal, &self.expect);
        if verdict.violations.iter().any(|m| m.contains(needle)) {
            Ok(())
        } else {
            Err(format!(
                "planted violation \"{name}\" was not reported (got {:?})",
                verdict.violations
            ))
        }
    }

    /// Violations of the Lease, the file fence and the ConfigMap store: (name,
    /// events, file journal, what the report must contain).
    fn planted_cases(&self) -> Vec<Case> {
        let journal = &self.clean_journal;
        vec![
            (
                "token issued twice",
                self.with(vec![grant("d", 20, "ud", 35)]),
                journal.clone(),
                "issued twice",
            ),
            (
                "token goes down",
                self.with(vec![seen(40, "ua", 10)]),
                journal.clone(),
                "token went down",
            ),
            (
                "holder changes without a higher token",
                self.with(vec![seen(41, "ud", 20)]),
                journal.clone(),
                "without a higher token",
            ),
            (
                "file journal out of order",
                self.clean.clone(),
                vec![jw(10, "a"), jw(20, "b"), jw(10, "a")],
                "journal entry 2",
            ),
            (
                "configmap version with a lower token",
                self.with(vec![configmap_seen("l", 80, 10)]),
                journal.clone(),
                "configmap of l: token went down",
            ),
            (
                "fenced configmap relabelled",
                self.with(vec![configmap_seen("m", 85, 20)]),
                journal.clone(),
                "its label palisade.dev/fenced-by was changed",
            ),
            (
                "stale write accepted",
                self.with(vec![write("a", "file", 10, 90, Outcome::Accepted)]),
                journal.clone(),
                "accepted stale write",
            ),
            (
                "rejection without a higher token",
                self.with(vec![write("b", "file", 20, 95, Outcome::Stale)]),
                journal.clone(),
                "no higher token was ever accepted",
            ),
            (
                "write with a token never granted",
                self.with(vec![write("z", "file", 25, 96, Outcome::Accepted)]),
                journal.clone(),
                "never granted",
            ),
            (
                "no grant after healing",
                self.clean[..self.clean.len() - 1].to_vec(),
                journal.clone(),
                "not granted again",
            ),
            (
                "claim phase goes back",
                self.with(vec![
                    renewal("ua", 16, 200, "Granted"),
                    renewal("ua", 17, 200, "Expired"),
                    renewal("ua", 18, 200, "Granted"),
                ]),
                journal.clone(),
                "phase went back from Expired to Granted",
            ),
            (
                "silenced holder not expired in time",
                self.with(vec![silenced("ub", 31, 50)]),
                journal.clone(),
                "was not expired within",
            ),
            (
                "grant ended within its holder's deadline",
                self.with(vec![renewal("ua", 15, 200, "Granted")]),
                journal.clone(),
                "before its holder's deadline",
            ),
            (
                "grant ended within the deadline of a write that showed no phase (a create)",
                self.with(vec![renewal("ua", 15, 201, "")]),
                journal.clone(),
                "before its holder's deadline",
            ),
        ]
    }

    /// The database stores: their commit order, and a rejection without a higher
    /// commit. Returns how many violations were planted.
    fn database_stores(&self) -> Result<usize, String> {
        let stores = |order: Vec<JournalWrite>| BTreeMap::from([("postgres".to_string(), order)]);
        let db_clean = self.with(vec![
            write("a", "postgres", 10, 11, Outcome::Accepted),
            write("b", "postgres", 20, 41, Outcome::Accepted),
            write("a", "postgres", 10, 61, Outcome::Stale),
        ]);
        let verdict = check_with_stores(
            &db_clean,
            &self.clean_journal,
            &stores(vec![jw(10, "a"), jw(20, "b")]),
            &self.expect,
        );
        if !verdict.violations.is_empty() {
            return Err(format!(
                "a clean database history was flagged: {:?}",
                verdict.violations
            ));
        }
        let mut n = 0;
        for (name, order, needle) in [
            (
                "postgres commit order out of order",
                vec![jw(10, "a"), jw(20, "b"), jw(10, "a")],
                "postgres store, key l: commit 2",
            ),
            (
                "postgres rejection without a higher commit",
                vec![jw(10, "a")],
                "no higher token was ever accepted",
            ),
        ] {
            let verdict =
                check_with_stores(&db_clean, &self.clean_journal, &stores(order), &self.expect);
            if !verdict.violations.iter().any(|m| m.contains(needle)) {
                return Err(format!(
                    "planted violation \"{name}\" was not reported (got {:?})",
                    verdict.violations
                ));
            }
            n += 1;
        }
        Ok(n)
    }

    /// A lossy store: after its loss, a write accepted or found in the store.
    /// Returns how many violations were planted.
    fn lossy_store(&self) -> Result<usize, String> {
        let lossy = crate::dbstores::LOSSY[0];
        let loss = Event::Fault {
            fault: lossy.fault.name().into(),
            target: String::new(),
            start_ns: 100,
            end_ns: 105,
        };
        let lossy_clean = self.with(vec![
            write("b", lossy.store, 20, 41, Outcome::Accepted),
            loss.clone(),
            write("b", lossy.store, 20, 110, Outcome::NoMark),
            write("a", lossy.store, 10, 120, Outcome::NoMark),
        ]);
        let lossy_stores =
            |order: Vec<JournalWrite>| BTreeMap::from([(lossy.store.to_string(), order)]);
        let verdict = check_with_stores(
            &lossy_clean,
            &self.clean_journal,
            &lossy_stores(vec![]),
            &self.expect,
        );
        if !verdict.violations.is_empty() || verdict.no_mark_refused.get(lossy.store) != Some(&2) {
            return Err(format!(
                "a clean lossy-store history was flagged or miscounted: {:?} {:?}",
                verdict.violations, verdict.no_mark_refused
            ));
        }
        let mut late = jw(20, "b");
        late.seq = 130;
        let mut n = 0;
        for (name, events, order) in [
            (
                "a write accepted after the store lost its marks",
                self.with(vec![
                    loss.clone(),
                    write("b", lossy.store, 20, 130, Outcome::Accepted),
                ]),
                vec![],
            ),
            (
                "a write admitted after the loss, its answer lost",
                self.with(vec![
                    loss.clone(),
                    write("b", lossy.store, 20, 130, Outcome::Error),
                ]),
                vec![late],
            ),
        ] {
            let verdict = check_with_stores(
                &events,
                &self.clean_journal,
                &lossy_stores(order),
                &self.expect,
            );
            if !verdict
                .violations
                .iter()
                .any(|m| m.contains("the fence started over"))
            {
                return Err(format!(
                    "planted violation \"{name}\" was not reported (got {:?})",
                    verdict.violations
                ));
            }
            n += 1;
        }
        Ok(n)
    }
}

impl Fixture {
    /// The fenced operators: o0 leads with 10 and writes, o1 with 20 and writes, o0's
    /// late write is refused, and o1 writes again after healing. Then a deposed
    /// leader's write (answered, or only seen by the watch) landing after o1's first,
    /// a refusal for another reason than the token, and no leader after healing.
    /// Returns how many violations were planted.
    fn operators(&self) -> Result<usize, String> {
        let refusal = "UPDATE configmaps chaos/state refused: stale fencing token 10 of \
                       system:serviceaccount:chaos:op is lower than the current token 20";
        let clean = vec![
            op_write("o0", 10, 20, Outcome::Accepted, Some(100), ""),
            op_seen(100, 10),
            op_write("o1", 20, 40, Outcome::Accepted, Some(110), ""),
            op_write("o0", 10, 60, Outcome::Stale, None, refusal),
            op_seen(110, 20),
            op_write("o1", 20, 210, Outcome::Accepted, Some(120), ""),
        ];
        let verdict = check(&self.with(clean.clone()), &self.clean_journal, &self.expect);
        let counts = &verdict.operators;
        if !verdict.violations.is_empty()
            || (counts.accepted, counts.refused, counts.landed_late) != (3, 1, 0)
            || counts.handovers.get("configmap/state") != Some(&1)
        {
            return Err(format!(
                "a clean operator history was flagged or miscounted: {:?} {counts:?}",
                verdict.violations
            ));
        }
        // No leader after healing, but an API server had just started: not judged.
        let mut restarted = self.with(clean[..clean.len() - 1].to_vec());
        restarted.push(Event::Fault {
            fault: "kill_apiserver".into(),
            target: String::new(),
            start_ns: 150,
            end_ns: 190,
        });
        let verdict = check(&restarted, &self.clean_journal, &self.expect);
        if !verdict.violations.is_empty() {
            return Err(format!(
                "operators' liveness was judged right after an API server started: {:?}",
                verdict.violations
            ));
        }
        let with_clean =
            |extra: Vec<Event>| self.with(clean.iter().cloned().chain(extra).collect());
        let cases = [
            (
                "a deposed operator's write landed after its successor's first",
                with_clean(vec![op_write(
                    "o0",
                    10,
                    70,
                    Outcome::Accepted,
                    Some(115),
                    "",
                )]),
                "landed after its successor's first write",
            ),
            (
                "a deposed operator's version, seen only by the watch, after its successor's",
                with_clean(vec![op_seen(116, 10)]),
                "landed after its successor's first write",
            ),
            (
                "an operator write refused for another reason than a stale token",
                with_clean(vec![op_write(
                    "o1",
                    20,
                    80,
                    Outcome::Stale,
                    None,
                    "carries no fencing token",
                )]),
                "not for that token being stale",
            ),
            (
                "no operator leads after healing",
                self.with(clean[..clean.len() - 1].to_vec()),
                "none leads again",
            ),
        ];
        let planted = cases.len();
        for (name, events, needle) in cases {
            let verdict = check(&events, &self.clean_journal, &self.expect);
            if !verdict.violations.iter().any(|m| m.contains(needle)) {
                return Err(format!(
                    "planted violation \"{name}\" was not reported (got {:?})",
                    verdict.violations
                ));
            }
        }
        Ok(planted)
    }
}

fn op_write(
    w: &str,
    token: u64,
    start_ns: u64,
    outcome: Outcome,
    rv: Option<u64>,
    detail: &str,
) -> Event {
    Event::OperatorWrite {
        worker: w.into(),
        token,
        object: "configmap/state".into(),
        seq: start_ns,
        start_ns,
        end_ns: start_ns + 5,
        outcome,
        rv,
        detail: detail.into(),
    }
}

fn op_seen(rv: u64, token: u64) -> Event {
    Event::OperatorObjectSeen {
        object: "configmap/state".into(),
        rv,
        token,
        t_ns: rv,
    }
}

fn grant(w: &str, token: u64, uid: &str, t_ns: u64) -> Event {
    slot_grant("l", 0, w, token, uid, t_ns)
}

fn slot_grant(lease: &str, slot: i32, w: &str, token: u64, uid: &str, t_ns: u64) -> Event {
    Event::Grant {
        worker: w.into(),
        lease: lease.into(),
        slot,
        token,
        claim_uid: uid.into(),
        t_ns,
    }
}

fn write(w: &str, store: &str, token: u64, start_ns: u64, outcome: Outcome) -> Event {
    slot_write(("l", 0), w, store, token, start_ns, outcome)
}

/// A write of `w` to slot `at` (Lease, slot).
fn slot_write(
    at: (&str, i32),
    w: &str,
    store: &str,
    token: u64,
    start_ns: u64,
    outcome: Outcome,
) -> Event {
    Event::Write {
        worker: w.into(),
        lease: at.0.into(),
        slot: at.1,
        store: store.into(),
        token,
        seq: start_ns,
        start_ns,
        end_ns: start_ns + 5,
        outcome,
        rv: (store == "configmap" && outcome == Outcome::Accepted).then_some(start_ns),
        detail: String::new(),
    }
}

fn seen(rv: u64, uid: &str, token: u64) -> Event {
    slot_seen(("l", 0), rv, uid, token)
}

/// The harness's watch saw version `rv` of slot `at` (Lease, slot).
fn slot_seen(at: (&str, i32), rv: u64, uid: &str, token: u64) -> Event {
    Event::LeaseSeen {
        lease: at.0.into(),
        slot: at.1,
        rv,
        holder_uid: uid.into(),
        token,
        t_ns: rv,
        server: None,
    }
}

/// Lease `lease`'s label on Lease `l`'s ConfigMap, at version `rv` with `token`.
fn configmap_seen(lease: &str, rv: u64, token: u64) -> Event {
    slot_configmap_seen(("l", 0), (lease, 0), rv, token)
}

/// The labels `labels` (Lease, slot) on the ConfigMap of slot `of`, at version `rv`
/// with `token`.
fn slot_configmap_seen(of: (&str, i32), labels: (&str, i32), rv: u64, token: u64) -> Event {
    Event::ConfigMapSeen {
        lease: labels.0.into(),
        slot: labels.1,
        name: crate::worker::configmap_name(of.0, of.1),
        rv,
        token,
        t_ns: rv,
    }
}

fn jw(token: u64, w: &str) -> JournalWrite {
    slot_jw(("l", 0), token, w)
}

fn slot_jw(at: (&str, i32), token: u64, w: &str) -> JournalWrite {
    JournalWrite {
        lease: at.0.into(),
        slot: at.1,
        token,
        worker: w.into(),
        seq: 0,
    }
}

fn renewal(uid: &str, send_ns: u64, status: u16, phase: &str) -> Event {
    Event::Renewal {
        worker: "w".into(),
        claim: uid.into(),
        claim_uid: uid.into(),
        send_ns,
        end_ns: send_ns + 1,
        status,
        phase: phase.into(),
    }
}

fn silenced(uid: &str, t_ns: u64, within_ns: u64) -> Event {
    slot_silenced(("l", 0), uid, t_ns, within_ns)
}

fn slot_silenced(at: (&str, i32), uid: &str, t_ns: u64, within_ns: u64) -> Event {
    Event::Silenced {
        lease: at.0.into(),
        slot: at.1,
        claim_uid: uid.into(),
        t_ns,
        within_ns,
    }
}
