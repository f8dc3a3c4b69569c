//! Concurrent writers at each isolation level: no lower token ever commits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::fence::Stale;
use palisade::fence::postgres::{self, Error};
use proptest::prelude::*;
use tokio_postgres::{Client, IsolationLevel};

use support::databases::{self, runtime};

use crate::{SERVER, connect, connect_app, mark, setup};

/// One planned transaction: writer, key, token jitter, and a pause between the snapshot
/// and the check (so snapshots predate other commits).
type Op = (u8, u8, u64, u8);

#[derive(Debug, Clone)]
struct Committed {
    key: String,
    token: u64,
    id: i64,
    began: Instant,
    acked: Instant,
}

#[derive(Default, Debug)]
struct Outcomes {
    committed: Vec<Committed>,
    /// (key, token, highest named in the error)
    stale: Vec<(String, u64, u64)>,
    conflicts: usize,
}

async fn run_plan(level: IsolationLevel, prefix: &str, ops: &[Op], writers: u8) -> Outcomes {
    let outcomes = Arc::new(std::sync::Mutex::new(Outcomes::default()));
    let mut tasks = Vec::new();
    for w in 0..writers {
        // Tokens rise along the plan, with jitter: overlapping writers meet both
        // higher and lower tokens than their own.
        let mine: Vec<Op> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.0 % writers == w)
            .map(|(i, &(wr, key, jitter, pause))| (wr, key, i as u64 / 2 + jitter, pause))
            .collect();
        let outcomes = outcomes.clone();
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            // The writers have only docs/fences.md's grants.
            let mut client = connect_app().await;
            for (_, key, token, pause) in mine {
                let key = format!("{prefix}-{key}");
                let began = Instant::now();
                let tx = client
                    .build_transaction()
                    .isolation_level(level)
                    .start()
                    .await
                    .unwrap();
                // Take the snapshot now; the check comes after a pause.
                tx.query_one("SELECT count(*) FROM public.fenced_writes", &[])
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(pause as u64)).await;
                let result = postgres::admit(&tx, &key, token).await;
                match result {
                    Ok(_) => {
                        let row = tx
                            .query_one(
                                "INSERT INTO public.fenced_writes (key, token, writer) \
                                 VALUES ($1, $2, $3) RETURNING id",
                                &[&key, &(token as i64), &(w as i32)],
                            )
                            .await;
                        let id: i64 = match row {
                            Ok(row) => row.get(0),
                            // SERIALIZABLE may refuse the write itself (SSI).
                            Err(e)
                                if e.code()
                                    == Some(
                                        &tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE,
                                    ) =>
                            {
                                outcomes.lock().unwrap().conflicts += 1;
                                tx.rollback().await.unwrap();
                                continue;
                            }
                            Err(e) => panic!("insert after an admit: {e}"),
                        };
                        match tx.commit().await {
                            Ok(()) => outcomes.lock().unwrap().committed.push(Committed {
                                key,
                                token,
                                id,
                                began,
                                acked: Instant::now(),
                            }),
                            Err(e) => {
                                let code = e.code().cloned();
                                assert_eq!(
                                    code,
                                    Some(
                                        tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                                    ),
                                    "commit failed otherwise: {e}"
                                );
                                outcomes.lock().unwrap().conflicts += 1;
                            }
                        }
                    }
                    Err(Error::Stale(Stale {
                        key: k,
                        token: t,
                        highest,
                    })) => {
                        assert_eq!((k.as_str(), t), (key.as_str(), token));
                        outcomes.lock().unwrap().stale.push((k, t, highest));
                        tx.rollback().await.unwrap();
                    }
                    Err(e @ Error::Conflict(_)) => {
                        assert!(e.is_retryable());
                        outcomes.lock().unwrap().conflicts += 1;
                        tx.rollback().await.unwrap();
                    }
                    Err(e) => panic!("unexpected error: {e:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
    Arc::try_unwrap(outcomes).unwrap().into_inner().unwrap()
}

fn judge(
    client: &Client,
    rt: &tokio::runtime::Handle,
    out: &Outcomes,
) -> Result<(), TestCaseError> {
    let mut by_key: BTreeMap<&str, Vec<&Committed>> = BTreeMap::new();
    for c in &out.committed {
        by_key.entry(&c.key).or_default().push(c);
    }
    for (key, mut writes) in by_key {
        // Commit order per key: the id was drawn under the mark's row lock, which is
        // held until commit.
        writes.sort_by_key(|c| c.id);
        for pair in writes.windows(2) {
            prop_assert!(
                pair[0].token <= pair[1].token,
                "{}: token {} committed after {}",
                key,
                pair[1].token,
                pair[0].token
            );
        }
        // Real time, independent of the ids: nothing committed that began after a
        // higher token's commit was acknowledged.
        for a in &writes {
            for b in &writes {
                if a.acked < b.began {
                    prop_assert!(
                        a.token <= b.token,
                        "{}: stale {} committed after {} was acknowledged",
                        key,
                        b.token,
                        a.token
                    );
                }
            }
        }
        let highest = writes.iter().map(|c| c.token).max().unwrap();
        let stored = rt.block_on(mark(client, key));
        prop_assert_eq!(stored, Some(highest as i64), "{}", key);
    }
    // A refusal names a token that was committed for the key, above the stale one.
    for (key, token, highest) in &out.stale {
        prop_assert!(token < highest);
        prop_assert!(
            out.committed
                .iter()
                .any(|c| &c.key == key && c.token == *highest),
            "{} refused {} naming {} that was never committed",
            key,
            token,
            highest
        );
    }
    Ok(())
}

/// Plans per isolation level x transactions per plan = transactions per level.
const CASES: u32 = 6;
const TXNS_PER_CASE: usize = 120;

fn concurrency_at(level: IsolationLevel, name: &str) {
    let _server = SERVER.read().unwrap();
    let rt = runtime();
    let client = rt.block_on(setup());
    let total = std::cell::RefCell::new(Outcomes::default());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    });
    let plan = prop::collection::vec((0u8..8, 0u8..3, 0u64..30, 0u8..4), TXNS_PER_CASE);
    runner
        .run(&plan, |ops| {
            let prefix = databases::unique(&format!("conc-{name}"));
            let out = rt.block_on(run_plan(level, &prefix, &ops, 8));
            judge(&client, rt.handle(), &out)?;
            let mut total = total.borrow_mut();
            total.committed.extend(out.committed);
            total.stale.extend(out.stale);
            total.conflicts += out.conflicts;
            Ok(())
        })
        .unwrap();
    let total = total.into_inner();
    println!(
        "{name}: {} transactions, {} committed, {} stale refused, {} serialization failures",
        CASES as usize * TXNS_PER_CASE,
        total.committed.len(),
        total.stale.len(),
        total.conflicts
    );
    assert!(
        !total.stale.is_empty(),
        "no stale token met: the plans prove nothing"
    );
}

#[test]
fn concurrent_writers_read_committed() {
    concurrency_at(IsolationLevel::ReadCommitted, "read-committed");
}

#[test]
fn concurrent_writers_repeatable_read() {
    concurrency_at(IsolationLevel::RepeatableRead, "repeatable-read");
}

#[test]
fn concurrent_writers_serializable() {
    concurrency_at(IsolationLevel::Serializable, "serializable");
}

/// Under REPEATABLE READ, a transaction whose snapshot predates another's mark must
/// fail to serialize, not compare against the old mark it sees.
#[test]
fn repeatable_read_with_an_old_snapshot_is_a_serialization_failure() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("old-snapshot");
        let mut a = setup().await;
        let b = connect().await;
        for first in [true, false] {
            // first: the key has no mark yet (the INSERT path); then: it has one (the lock path).
            let tx = a
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .start()
                .await
                .unwrap();
            tx.query_one("SELECT count(*) FROM palisade.marks", &[])
                .await
                .unwrap();
            let newer = if first { 10 } else { 20 };
            postgres::admit_with(&b, &key, newer).await.unwrap();
            let err = postgres::admit(&tx, &key, newer - 5).await.unwrap_err();
            assert!(err.is_retryable(), "first={first}: {err:?}");
            tx.rollback().await.unwrap();
        }
        assert_eq!(mark(&a, &key).await, Some(20));
    });
}
