//! Racing writers with interleaved tokens at each isolation level: with the fence no
//! token lower than an earlier committed one ever commits; without it, the same race
//! commits stale writes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, TxOpts};
use palisade::fence::Stale;
use palisade::fence::mysql::{self, Error};

use support::databases::{self, runtime};

use crate::{SERVER, TEST_DB, connect, connect_app, mark, setup};

const WRITERS: u64 = 6;
const TXNS_PER_WRITER: u64 = 20;
const KEYS: u64 = 3;
/// ER_LOCK_DEADLOCK: InnoDB rolled the transaction back.
const DEADLOCK: u16 = 1213;

#[derive(Debug, Clone)]
struct Committed {
    key: String,
    token: u64,
    id: u64,
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

/// One planned transaction: (key, token, pause in ms between the snapshot and the
/// write). Tokens rise along the plan with jitter, so overlapping writers meet both
/// higher and lower tokens than their own. A fixed generator: the same plan each run.
fn plan(writer: u64) -> Vec<(u64, u64, u64)> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (writer + 1);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..TXNS_PER_WRITER)
        .map(|i| {
            let step = i * WRITERS + writer;
            (next() % KEYS, step / 2 + next() % 30, next() % 4)
        })
        .collect()
}

/// The race: each writer (as the least-privilege account) begins a transaction with a
/// snapshot, pauses, then fences (unless `fenced` is false) and appends to the journal.
async fn race(level: IsolationLevel, prefix: &str, fenced: bool) -> Outcomes {
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (outcomes, prefix) = (outcomes.clone(), prefix.to_owned());
        writers.push(tokio::spawn(async move {
            let mut conn = connect_app().await;
            for (key, token, pause) in plan(w) {
                let key = format!("{prefix}-{key}");
                let began = Instant::now();
                let mut opts = TxOpts::new();
                opts.with_isolation_level(level).with_consistent_snapshot(true);
                let mut tx = conn.start_transaction(opts).await.unwrap();
                tokio::time::sleep(Duration::from_millis(pause)).await;
                if fenced {
                    match mysql::admit(&mut tx, &key, token).await {
                        Ok(_) => {}
                        Err(Error::Stale(Stale { key: k, token: t, highest })) => {
                            assert_eq!((k.as_str(), t), (key.as_str(), token));
                            outcomes.lock().unwrap().stale.push((k, t, highest));
                            tx.rollback().await.unwrap();
                            continue;
                        }
                        Err(e) if e.is_retryable() => {
                            outcomes.lock().unwrap().conflicts += 1;
                            tx.rollback().await.unwrap();
                            continue;
                        }
                        Err(e) => panic!("unexpected error: {e:?}"),
                    }
                }
                let insert = tx
                    .exec_drop(
                        format!("INSERT INTO {TEST_DB}.fenced_writes (k, token, writer) VALUES (?, ?, ?)"),
                        (&key, token, w),
                    )
                    .await;
                match insert {
                    Ok(()) => {}
                    Err(mysql_async::Error::Server(e)) if e.code == DEADLOCK => {
                        outcomes.lock().unwrap().conflicts += 1;
                        tx.rollback().await.unwrap();
                        continue;
                    }
                    Err(e) => panic!("insert: {e}"),
                }
                let id = tx.last_insert_id().expect("an AUTO_INCREMENT id");
                tx.commit().await.unwrap();
                let acked = Instant::now();
                let done = Committed { key, token, id, began, acked };
                outcomes.lock().unwrap().committed.push(done);
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer task");
    }
    Arc::try_unwrap(outcomes).unwrap().into_inner().unwrap()
}

/// Stale commits: a write committed with a token lower than one of its key whose
/// commit was acknowledged before it began, or lower than one committed (by id)
/// before it. Each as "key: token after higher".
fn stale_commits(out: &Outcomes) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<&Committed>> = BTreeMap::new();
    for c in &out.committed {
        by_key.entry(&c.key).or_default().push(c);
    }
    let mut found = Vec::new();
    for (key, mut writes) in by_key {
        writes.sort_by_key(|c| c.id);
        for (i, b) in writes.iter().enumerate() {
            let earlier = writes[..i].iter().map(|a| a.token).max();
            let acked_before = writes
                .iter()
                .filter(|a| a.acked < b.began)
                .map(|a| a.token)
                .max();
            if let Some(higher) = earlier.max(acked_before).filter(|&h| h > b.token) {
                found.push(format!("{key}: {} after {higher}", b.token));
            }
        }
    }
    found
}

fn fenced_race_at(level: IsolationLevel, name: &str) {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let _ = rt.block_on(setup());
    let prefix = databases::unique(&format!("race-{name}"));
    let out = rt.block_on(race(level, &prefix, true));
    let stale = stale_commits(&out);
    assert!(
        stale.is_empty(),
        "{name}: stale writes committed: {stale:?}"
    );
    let mut admin = rt.block_on(connect());
    for key in (0..KEYS).map(|k| format!("{prefix}-{k}")) {
        let highest = out
            .committed
            .iter()
            .filter(|c| c.key == key)
            .map(|c| c.token as i64)
            .max();
        assert_eq!(rt.block_on(mark(&mut admin, &key)), highest, "{key}");
    }
    // A refusal names a token that was committed for its key, above the stale one.
    for (key, token, highest) in &out.stale {
        assert!(token < highest);
        assert!(
            out.committed
                .iter()
                .any(|c| &c.key == key && c.token == *highest),
            "{key} refused {token} naming {highest}, never committed"
        );
    }
    println!(
        "{name}: {} transactions, {} committed, {} stale refused, {} deadlocks",
        WRITERS * TXNS_PER_WRITER,
        out.committed.len(),
        out.stale.len(),
        out.conflicts
    );
    assert!(
        !out.stale.is_empty(),
        "no stale token met: the race proves nothing"
    );
}

#[test]
fn racing_writers_read_committed() {
    fenced_race_at(IsolationLevel::ReadCommitted, "read-committed");
}

#[test]
fn racing_writers_repeatable_read() {
    fenced_race_at(IsolationLevel::RepeatableRead, "repeatable-read");
}

#[test]
fn racing_writers_serializable() {
    fenced_race_at(IsolationLevel::Serializable, "serializable");
}

/// The same race without the fence commits stale writes at both levels: what the
/// fenced races above prevent is there to prevent.
#[test]
fn without_the_fence_the_same_race_commits_stale_writes() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let _ = rt.block_on(setup());
    for (level, name) in [
        (IsolationLevel::RepeatableRead, "repeatable-read"),
        (IsolationLevel::Serializable, "serializable"),
    ] {
        let prefix = databases::unique(&format!("unfenced-{name}"));
        let out = rt.block_on(race(level, &prefix, false));
        let stale = stale_commits(&out);
        println!(
            "{name} without the fence: {} stale writes committed",
            stale.len()
        );
        assert!(
            !stale.is_empty(),
            "{name}: the race without the fence committed nothing stale"
        );
    }
}

/// A transaction whose snapshot predates another's mark compares against that newer
/// mark (the locking read), for a new key and for an existing one, where a read of
/// its snapshot would admit the stale token.
#[test]
fn an_old_snapshot_never_admits_a_token_below_a_newer_mark() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let _ = setup().await;
        for (level, name) in [
            (IsolationLevel::RepeatableRead, "repeatable-read"),
            (IsolationLevel::Serializable, "serializable"),
        ] {
            let key = databases::unique(&format!("old-snapshot-{name}"));
            let mut a = connect_app().await;
            let mut b = connect_app().await;
            for newer in [10, 20] {
                // 10: the key has no mark yet (the INSERT path); 20: it has one.
                // The other tests' writers share the marks' index, so InnoDB's gap
                // locks can make either step a deadlock victim (Conflict, "retry the
                // transaction"): retried, a few times at most.
                let mut attempts = 0;
                let err = loop {
                    attempts += 1;
                    assert!(attempts <= 5, "{name} {newer}: 5 deadlocks in a row");
                    let mut opts = TxOpts::new();
                    opts.with_isolation_level(level)
                        .with_consistent_snapshot(true);
                    let mut tx = a.start_transaction(opts).await.unwrap();
                    if let Err(Error::Conflict(_)) = mysql::admit_with(&mut b, &key, newer).await {
                        tx.rollback().await.unwrap();
                        continue;
                    }
                    let err = mysql::admit(&mut tx, &key, newer - 5).await.unwrap_err();
                    tx.rollback().await.unwrap();
                    if !matches!(err, Error::Conflict(_)) {
                        break err;
                    }
                };
                assert!(
                    matches!(&err, Error::Stale(s) if s.highest == newer),
                    "{name} {newer}: {err:?}"
                );
            }
            assert_eq!(mark(&mut connect().await, &key).await, Some(20), "{name}");
        }
    });
}
