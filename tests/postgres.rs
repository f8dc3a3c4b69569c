//! `palisade.fence` in a real PostgreSQL (`make databases`): concurrent writers at
//! every isolation level, a client SIGKILLed mid-transaction, an immediate shutdown,
//! bad input, autocommit, and installing twice.
#![cfg(feature = "postgres")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/databases.rs"]
mod databases;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use palisade::fence::postgres::{self, Error};
use proptest::prelude::*;
use tokio_postgres::{Client, IsolationLevel, NoTls};

use databases::runtime;

/// The crash test restarts the server: it takes this for writing, every other test for reading.
static SERVER: RwLock<()> = RwLock::new(());

async fn connect() -> Client {
    let (client, connection) = tokio_postgres::connect(&databases::postgres_url(), NoTls)
        .await
        .expect("connecting to the test PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A client with the fence installed and this test's journal table.
async fn setup() -> Client {
    let client = connect().await;
    postgres::install(&client).await.expect("install");
    client
        .batch_execute(
            "BEGIN; SELECT pg_advisory_xact_lock(4242);
             CREATE TABLE IF NOT EXISTS public.fenced_writes (
               id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL, writer int NOT NULL);
             COMMIT",
        )
        .await
        .expect("journal table");
    client
}

/// How many rows of `key` the journal table holds.
async fn written(client: &Client, key: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM public.fenced_writes WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

async fn mark(client: &Client, key: &str) -> Option<i64> {
    client
        .query_opt("SELECT token FROM palisade.marks WHERE key = $1", &[&key])
        .await
        .unwrap()
        .map(|r| r.get(0))
}

#[test]
fn install_is_idempotent_concurrent_and_versioned() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let clients = futures::future::join_all((0..4).map(|_| connect())).await;
        let installs = futures::future::join_all(clients.iter().map(postgres::install)).await;
        for result in installs {
            result.expect("concurrent installs all succeed");
        }
        postgres::install(&clients[0]).await.expect("and again");
        let version: i32 = clients[0]
            .query_one("SELECT version FROM palisade.version", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, postgres::SQL_VERSION);
        // A newer version installed is never downgraded.
        let tx_client = &clients[1];
        tx_client
            .batch_execute("UPDATE palisade.version SET version = 99")
            .await
            .unwrap();
        let err = postgres::install(tx_client).await.unwrap_err();
        let text = format!("{:?}", err);
        tx_client
            .batch_execute("ROLLBACK; UPDATE palisade.version SET version = 1")
            .await
            .unwrap();
        assert!(text.contains("will not downgrade"), "{text}");
    });
}

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
            let mut client = connect().await;
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
                tx.query_one("SELECT count(*) FROM palisade.marks", &[])
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
                    Err(Error::Stale {
                        key: k,
                        token: t,
                        highest,
                    }) => {
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

#[test]
fn stale_refusal_names_key_and_both_tokens_and_nothing_commits() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("stale");
        let mut client = setup().await;
        postgres::admit_with(&client, &key, 34).await.unwrap();
        let tx = client.transaction().await.unwrap();
        tx.execute(
            "INSERT INTO public.fenced_writes (key, token, writer) VALUES ($1, 33, 0)",
            &[&key],
        )
        .await
        .unwrap();
        let err = postgres::admit(&tx, &key, 33).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "write rejected: stale fencing token 33 for key {key:?} is lower than the \
                 highest admitted token 34"
            )
        );
        assert!(!err.is_retryable());
        // The transaction is aborted: PostgreSQL answers its COMMIT with ROLLBACK.
        let _ = tx.commit().await;
        let n = written(&client, &key).await;
        assert_eq!(n, 0);
        // Any language sees the SQLSTATE and the message.
        let raw = client
            .query("SELECT palisade.fence($1, 2)", &[&key])
            .await
            .unwrap_err();
        let db = raw.as_db_error().unwrap();
        assert_eq!(db.code().code(), postgres::STALE_SQLSTATE);
        assert!(
            db.message().contains("stale fencing token 2"),
            "{}",
            db.message()
        );
        assert!(db.message().contains("34"), "{}", db.message());
    });
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let client = setup().await;
        let key = databases::unique("bad");
        let long = "k".repeat(postgres::MAX_KEY_BYTES + 1);
        // (SQL, SQLSTATE, words in the message)
        let sql_cases: [(String, &str, &str); 6] = [
            (
                format!("SELECT palisade.fence('{key}', -1)"),
                "22023",
                "negative",
            ),
            (
                format!("SELECT palisade.fence('{key}', NULL)"),
                "22004",
                "token is NULL",
            ),
            (
                "SELECT palisade.fence(NULL, 1)".into(),
                "22004",
                "key is NULL",
            ),
            ("SELECT palisade.fence('', 1)".into(), "22023", "empty"),
            (
                format!("SELECT palisade.fence('{long}', 1)"),
                "22023",
                "1025 bytes",
            ),
            (
                format!("SELECT palisade.fence('{key}', 9223372036854775808::numeric::bigint)"),
                "22003",
                "out of range",
            ),
        ];
        for (sql, code, words) in &sql_cases {
            let err = client.query(sql.as_str(), &[]).await.unwrap_err();
            let db = err.as_db_error().unwrap_or_else(|| panic!("{sql}: {err}"));
            assert_eq!(db.code().code(), *code, "{sql}: {}", db.message());
            assert!(db.message().contains(words), "{sql}: {}", db.message());
        }
        // The same through Rust: refused before the server is asked.
        for (k, token, words) in [
            ("", 1u64, "empty"),
            (long.as_str(), 1, "1025 bytes"),
            (key.as_str(), i64::MAX as u64 + 1, "bigint"),
        ] {
            match postgres::admit_with(&client, k, token).await {
                Err(Error::BadInput(m)) => assert!(m.contains(words), "{m}"),
                other => panic!("{k:.10}/{token}: expected BadInput, got {other:?}"),
            }
        }
        assert_eq!(mark(&client, &key).await, None, "nothing written");
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM palisade.marks WHERE key = '' OR length(key) > 1024",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0);
    });
}

/// Autocommit: the call is its own transaction; the mark is committed at once.
#[test]
fn autocommit_call_commits_the_mark_by_itself() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("autocommit");
        let a = setup().await;
        let b = connect().await;
        a.query_one("SELECT palisade.fence($1, 7)", &[&key])
            .await
            .unwrap();
        // Visible to another session without any COMMIT.
        assert_eq!(mark(&b, &key).await, Some(7));
        assert!(matches!(
            postgres::admit_with(&b, &key, 6).await,
            Err(Error::Stale { highest: 7, .. })
        ));
    });
}

/// A client SIGKILLed with its transaction open: no write, no raised mark, no lock left.
#[test]
fn sigkill_of_a_client_mid_transaction_leaves_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("sigkill");
        let client = setup().await;
        postgres::admit_with(&client, &key, 5).await.unwrap();
        let mut psql = Command::new("psql")
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                &databases::postgres_url(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("psql");
        let mut stdin = psql.stdin.take().unwrap();
        writeln!(
            stdin,
            "BEGIN;\nSELECT palisade.fence('{key}', 100);\n\
             INSERT INTO public.fenced_writes (key, token, writer) VALUES ('{key}', 100, 9);\n\
             \\echo in-transaction"
        )
        .unwrap();
        stdin.flush().unwrap();
        let mut lines = BufReader::new(psql.stdout.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("psql output").unwrap();
            if line.contains("in-transaction") {
                break;
            }
        }
        psql.kill().unwrap(); // SIGKILL
        psql.wait().unwrap();
        // The row lock goes with the backend; a lower token than the unfinished one passes.
        let admitted = tokio::time::timeout(
            Duration::from_secs(10),
            postgres::admit_with(&client, &key, 6),
        )
        .await
        .expect("the killed client's lock was released")
        .unwrap();
        assert_eq!(admitted.previous, Some(5));
        let n = written(&client, &key).await;
        assert_eq!(n, 0, "the killed transaction's write is gone");
        drop(stdin);
    });
}

/// `pg_ctl stop -m immediate` (no checkpoint: a crash) and start: every committed mark is there.
#[test]
fn immediate_shutdown_and_restart_keep_every_committed_mark() {
    let _server = SERVER.write().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let prefix = databases::unique("restart");
    let expected: HashMap<String, i64> = rt.block_on(async {
        let client = setup().await;
        let mut expected = HashMap::new();
        for i in 0..50u64 {
            let key = format!("{prefix}-{}", i % 5);
            postgres::admit_with(&client, &key, i).await.unwrap();
            expected.insert(key, i as i64);
        }
        expected
    });
    databases::restart("postgres");
    rt.block_on(async {
        let client = connect().await;
        for (key, token) in &expected {
            assert_eq!(mark(&client, key).await, Some(*token), "{key}");
            assert!(matches!(
                postgres::admit_with(&client, key, *token as u64 - 1).await,
                Err(Error::Stale { .. })
            ));
        }
    });
}

/// `palisade fence --store postgres://...`: the exit codes of the file store.
#[test]
fn cli_admits_refuses_with_exit_3_and_shows() {
    let _server = SERVER.read().unwrap();
    let url = databases::postgres_url();
    let key = databases::unique("cli");
    let run = |args: &[&str]| cli::fence(&url, args);
    let ok = run(&["--key", &key, "--token", "34"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("admitted: fencing token 34"));
    let stale = run(&["--key", &key, "--token", "33"]);
    assert_eq!(stale.status.code(), Some(3));
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(
        err.contains("33") && err.contains("34") && err.contains(&key),
        "{err}"
    );
    assert_eq!(run(&["--key", "", "--token", "1"]).status.code(), Some(2));
    assert_eq!(
        run(&["--key", &key, "--token", "40", "--payload", "x"])
            .status
            .code(),
        Some(2)
    );
    let show = run(&["--show"]);
    assert!(String::from_utf8_lossy(&show.stdout).contains(&format!("\"{key}\": 34")));
}
