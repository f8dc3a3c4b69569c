//! The self-check's semaphore: Lease `s` with 3 permits beside the lock `l`, a clean
//! history of its slots, and a violation of each per-slot rule planted in it.

use std::collections::BTreeMap;

use super::{
    Fixture, renewal, slot_configmap_seen, slot_grant, slot_jw, slot_seen, slot_silenced,
    slot_write,
};
use crate::cluster::ChaosLease;
use crate::history::{Event, Expectations, JournalWrite, Outcome, check_with_stores};

/// (name, extra events, file journal, PostgreSQL journal, what the report must contain)
type Case = (
    &'static str,
    Vec<Event>,
    Vec<JournalWrite>,
    Vec<JournalWrite>,
    &'static str,
);

/// Slot `slot` of the semaphore.
fn s(slot: i32) -> (&'static str, i32) {
    ("s", slot)
}

impl Fixture {
    /// p and q are granted slots 0 and 1 in one write (token 40 each), r slot 2 (45);
    /// r writes 45 and then q 40, each under its own slot's key; q's slot expires and t
    /// takes it with 50; q's late writes there are refused; after healing v takes slot
    /// 0 with 60. Three hold at once, as the permits allow. Returns how many violations
    /// were planted in it.
    pub(super) fn semaphore(&self) -> Result<usize, String> {
        let mut expect = Expectations {
            leases: self.expect.leases.clone(),
            ..self.expect
        };
        expect.leases.push(ChaosLease {
            name: "s".into(),
            permits: 3,
        });
        let accepted = Outcome::Accepted;
        let clean_slots = vec![
            renewal("up", 95, 200, "Granted"),
            renewal("uq", 98, 200, "Granted"),
            slot_grant("s", 0, "p", 40, "up", 100),
            slot_grant("s", 1, "q", 40, "uq", 100),
            slot_seen(s(0), 100, "up", 40),
            slot_seen(s(1), 100, "uq", 40),
            slot_silenced(s(1), "uq", 101, 50),
            renewal("ur", 104, 200, "Granted"),
            slot_grant("s", 2, "r", 45, "ur", 105),
            slot_seen(s(0), 105, "up", 40),
            slot_seen(s(1), 105, "uq", 40),
            slot_seen(s(2), 105, "ur", 45),
            slot_write(s(2), "r", "file", 45, 106, accepted),
            slot_write(s(1), "q", "file", 40, 112, accepted),
            slot_write(s(1), "q", "configmap", 40, 113, accepted),
            renewal("ut", 129, 200, "Granted"),
            slot_seen(s(0), 130, "up", 40),
            slot_seen(s(1), 130, "ut", 50),
            slot_seen(s(2), 130, "ur", 45),
            slot_grant("s", 1, "t", 50, "ut", 130),
            slot_write(s(1), "t", "file", 50, 131, accepted),
            slot_write(s(1), "t", "configmap", 50, 132, accepted),
            slot_configmap_seen(s(1), s(1), 133, 50),
            slot_write(s(1), "q", "file", 40, 140, Outcome::Stale),
            slot_write(s(1), "q", "configmap", 40, 141, Outcome::Stale),
            slot_seen(s(0), 260, "uv", 60),
            slot_grant("s", 0, "v", 60, "uv", 260),
        ];
        let slot_writes = vec![
            slot_jw(s(2), 45, "r"),
            slot_jw(s(1), 40, "q"),
            slot_jw(s(1), 50, "t"),
        ];
        let mut journal = self.clean_journal.clone();
        journal.extend(slot_writes.clone());
        let judge = |extra: Vec<Event>, journal: &[JournalWrite], postgres: Vec<JournalWrite>| {
            let events = self.with(clean_slots.iter().cloned().chain(extra).collect());
            let stores = BTreeMap::from([("postgres".to_string(), postgres)]);
            check_with_stores(&events, journal, &stores, &expect)
        };
        let verdict = judge(vec![], &journal, slot_writes.clone());
        if !verdict.violations.is_empty() || verdict.most_held.get("s") != Some(&3) {
            return Err(format!(
                "a clean semaphore history was flagged or miscounted: {:?} {:?}",
                verdict.violations, verdict.most_held
            ));
        }
        let cases = self.semaphore_cases(&journal, &slot_writes);
        for (name, extra, journal, postgres, needle) in &cases {
            let verdict = judge(extra.clone(), journal, postgres.clone());
            if !verdict.violations.iter().any(|m| m.contains(needle)) {
                return Err(format!(
                    "planted violation \"{name}\" was not reported (got {:?})",
                    verdict.violations
                ));
            }
        }
        Ok(cases.len())
    }

    /// The semaphore's planted violations, each in its clean history (its file journal
    /// `journal`, its PostgreSQL journal `postgres`).
    fn semaphore_cases(&self, journal: &[JournalWrite], postgres: &[JournalWrite]) -> Vec<Case> {
        let same = |extra: Vec<Event>| (extra, journal.to_vec(), postgres.to_vec());
        let cases = [
            (
                "two believed holders in one slot",
                same(vec![
                    renewal("ut", 140, 200, "Granted"),
                    slot_seen(s(1), 150, "uw", 55),
                ]),
                "lease s#1: the grant of claim ut ended",
            ),
            (
                "4 believed holders on a 3-permit Lease",
                same(vec![
                    renewal("uz", 107, 200, "Granted"),
                    slot_grant("s", 3, "z", 46, "uz", 108),
                ]),
                "lease s: 4 holders believed they held it at once (permits 3)",
            ),
            (
                "a version naming 4 holders on a 3-permit Lease",
                same(vec![slot_seen(s(3), 105, "uz", 46)]),
                "version 105 names 4 holders in 4 slots",
            ),
            (
                "a version naming one claim in two slots",
                same(vec![slot_seen(s(2), 100, "up", 40)]),
                "version 100 names 2 holders in 3 slots",
            ),
            (
                "a slot's token going back",
                same(vec![slot_seen(s(1), 150, "ut", 45)]),
                "lease s#1: token went down from 50",
            ),
            (
                "a slot's token issued twice",
                same(vec![slot_grant("s", 1, "o", 40, "uo", 120)]),
                "lease s#1: token 40 was issued twice",
            ),
            (
                "a slot's stale write accepted",
                same(vec![slot_write(
                    s(1),
                    "q",
                    "file",
                    40,
                    145,
                    Outcome::Accepted,
                )]),
                "file store, key s#1: accepted stale write",
            ),
            (
                "a write with another slot's token",
                same(vec![slot_write(
                    s(2),
                    "r",
                    "file",
                    50,
                    150,
                    Outcome::Accepted,
                )]),
                "key s#2: accepted write 150 of r carries token 50, which was never granted",
            ),
            (
                "a slot's silenced holder not expired while other slots moved on",
                same(vec![slot_silenced(s(2), "ur", 106, 50)]),
                "lease s#2: holder ur, silent",
            ),
            (
                "a slot's ConfigMap moved to another slot",
                same(vec![slot_configmap_seen(s(1), s(0), 134, 50)]),
                "its label palisade.dev/fenced-slot was changed",
            ),
            (
                "a slot's ConfigMap version with a lower token",
                same(vec![slot_configmap_seen(s(1), s(1), 135, 40)]),
                "configmap of s#1: token went down",
            ),
            (
                "a slot's file journal out of order",
                (
                    vec![],
                    [journal, &[slot_jw(s(1), 40, "q")]].concat(),
                    postgres.to_vec(),
                ),
                "file store, key s#1: journal entry",
            ),
            (
                "a slot's PostgreSQL commit order out of order",
                (
                    vec![],
                    journal.to_vec(),
                    [postgres, &[slot_jw(s(1), 40, "q")]].concat(),
                ),
                "postgres store, key s#1: commit 3",
            ),
        ];
        cases
            .into_iter()
            .map(|(name, (extra, journal, postgres), needle)| {
                (name, extra, journal, postgres, needle)
            })
            .collect()
    }
}
