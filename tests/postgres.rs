//! `palisade.fence` in a real PostgreSQL (`make databases`): concurrent writers at
//! every isolation level, a client SIGKILLed mid-transaction, an immediate shutdown,
//! bad input, autocommit, installing twice and upgrading, a least-privilege role,
//! a missing install, a held row lock, and drivers that wrap statements in savepoints.
//!
//! The server is shared with other test runs: this binary works in a database of its
//! own ([`TEST_DB`]; the dropped-schema test in one it drops again), and its roles
//! have fixed names of their own, created idempotently.
#![cfg(feature = "postgres")]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use palisade::fence::Stale;
use palisade::fence::postgres::{self, Error};
use proptest::prelude::*;
use tokio_postgres::{Client, IsolationLevel, NoTls};

use support::cli;
use support::databases::{self, runtime};

/// The crash test restarts the server: it takes this for writing, every other test for reading.
static SERVER: RwLock<()> = RwLock::new(());

/// This binary's database: its schema version never meets another run's.
const TEST_DB: &str = "palisade_fence_tests";
/// The least-privilege application role of docs/fences.md: USAGE on the schema, EXECUTE on
/// the function, DML on its own table `public.app_writes` only.
const APP_ROLE: &str = "palisade_test_app";
/// The role `--show` needs: USAGE and SELECT on the marks.
const SHOW_ROLE: &str = "palisade_test_show";

/// The server's URL as `user`, in database `db`.
fn url_as(user: &str, db: &str) -> String {
    let base = databases::postgres_url();
    let (scheme, rest) = base.split_once("://").expect("a postgres:// URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split('/').next().unwrap_or(host);
    format!("{scheme}://{user}@{host}/{db}")
}

/// The superuser of the shared server (tests/support/databases.rs).
fn superuser() -> String {
    let base = databases::postgres_url();
    let rest = base.split_once("://").map_or(base.as_str(), |(_, r)| r);
    rest.split_once('@')
        .map_or("postgres", |(user, _)| user)
        .to_owned()
}

/// The superuser in [`TEST_DB`], created on first use.
fn admin_url() -> String {
    static CREATED: OnceLock<()> = OnceLock::new();
    // On a thread of its own: callers may be inside a runtime already.
    CREATED.get_or_init(|| {
        std::thread::spawn(|| runtime().block_on(create_database(TEST_DB)))
            .join()
            .expect("creating the test database");
    });
    url_as(&superuser(), TEST_DB)
}

/// Creates `db` unless it exists (another run may create it at the same moment).
async fn create_database(db: &str) {
    let admin = connect_to(&databases::postgres_url()).await;
    match admin.batch_execute(&format!("CREATE DATABASE {db}")).await {
        Ok(()) => {}
        Err(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE)
                || e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {}
        Err(e) => panic!("CREATE DATABASE {db}: {e}"),
    }
}

async fn connect_to(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test PostgreSQL at {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// The superuser in [`TEST_DB`].
async fn connect() -> Client {
    connect_to(&admin_url()).await
}

/// Connected as the least-privilege [`APP_ROLE`], in [`TEST_DB`].
async fn connect_app() -> Client {
    connect_to(&url_as(APP_ROLE, TEST_DB)).await
}

/// The roles and grants docs/fences.md documents, in the database `admin` is connected
/// to (the fence installed there). Idempotent; under the installers' lock, so that
/// GRANTs and a concurrent install never update one catalog row at once ("tuple
/// concurrently updated").
async fn grant_least_privilege(admin: &Client) {
    admin
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7273612897165101);
             DO $$ BEGIN CREATE ROLE {APP_ROLE} LOGIN;
               EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE {SHOW_ROLE} LOGIN;
               EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             GRANT USAGE ON SCHEMA palisade TO {APP_ROLE};
             GRANT EXECUTE ON FUNCTION palisade.fence(text, bigint) TO {APP_ROLE};
             GRANT USAGE ON SCHEMA palisade TO {SHOW_ROLE};
             GRANT SELECT ON palisade.marks TO {SHOW_ROLE};
             CREATE TABLE IF NOT EXISTS public.app_writes (
               id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL);
             GRANT SELECT, INSERT, UPDATE, DELETE ON public.app_writes TO {APP_ROLE};
             GRANT USAGE ON SEQUENCE public.app_writes_id_seq TO {APP_ROLE};
             COMMIT"
        ))
        .await
        .expect("least-privilege roles and grants");
}

/// A client with the fence installed, the least-privilege roles, and the journal
/// table that the concurrent writers (as [`APP_ROLE`]) append to.
async fn setup() -> Client {
    let client = connect().await;
    postgres::install(&client).await.expect("install");
    grant_least_privilege(&client).await;
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(4242);
             CREATE TABLE IF NOT EXISTS public.fenced_writes (
               id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL, writer int NOT NULL);
             GRANT SELECT, INSERT ON public.fenced_writes TO {APP_ROLE};
             GRANT USAGE ON SEQUENCE public.fenced_writes_id_seq TO {APP_ROLE};
             COMMIT"
        ))
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
    // Its own database: the other tests install meanwhile, and would meet version 99.
    let db = ScratchDb::new("palisade_install");
    let url = url_as(&superuser(), &db.0);
    runtime().block_on(async {
        let clients = futures::future::join_all((0..4).map(|_| connect_to(&url))).await;
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
            .batch_execute(&format!(
                "ROLLBACK; UPDATE palisade.version SET version = {}",
                postgres::SQL_VERSION
            ))
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
            Err(Error::Stale(Stale { highest: 7, .. }))
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
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &admin_url()])
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
                Err(Error::Stale(Stale { .. }))
            ));
        }
    });
}

/// `palisade fence --store postgres://...` as the least-privilege role: the exit
/// codes of the file store; `--show` needs SELECT on the marks.
#[test]
fn cli_admits_refuses_with_exit_3_and_shows() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(setup());
    let url = url_as(APP_ROLE, TEST_DB);
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
    // The application role may not read the marks; the role granted SELECT may.
    let denied = run(&["--show"]);
    assert_eq!(denied.status.code(), Some(1));
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(err.contains("permission denied"), "{err}");
    let show = cli::fence(url_as(SHOW_ROLE, TEST_DB), &["--show"]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(String::from_utf8_lossy(&show.stdout).contains(&format!("\"{key}\": 34")));
}

fn assert_denied(result: Result<u64, tokio_postgres::Error>, what: &str) {
    match result {
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {}
        other => panic!("{what}: expected permission denied (42501), got {other:?}"),
    }
}

/// docs/fences.md's grants (USAGE on the schema, EXECUTE on the function, DML on the
/// application's own table) are enough to fence, and give no way to lower, delete,
/// forge or read a mark.
#[test]
fn least_privilege_role_fences_and_cannot_change_the_marks() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let admin = setup().await;
        let key = databases::unique("least-privilege");
        let mut app = connect_app().await;
        let tx = app.transaction().await.unwrap();
        let admitted = postgres::admit(&tx, &key, 5)
            .await
            .expect("the application role admits a token");
        assert_eq!(admitted.previous, None);
        tx.execute(
            "INSERT INTO public.app_writes (key, token) VALUES ($1, 5)",
            &[&key],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();

        let tx = app.transaction().await.unwrap();
        match postgres::admit(&tx, &key, 4).await {
            Err(Error::Stale(Stale { highest: 5, .. })) => {}
            other => panic!("a stale token as the application role: {other:?}"),
        }
        tx.rollback().await.unwrap();

        let lowered = app
            .execute(
                "UPDATE palisade.marks SET token = 0 WHERE key = $1",
                &[&key],
            )
            .await;
        assert_denied(lowered, "UPDATE palisade.marks");
        let deleted = app
            .execute("DELETE FROM palisade.marks WHERE key = $1", &[&key])
            .await;
        assert_denied(deleted, "DELETE FROM palisade.marks");
        let forged = app
            .execute(
                "INSERT INTO palisade.marks (key, token) VALUES ($1 || '-forged', 0)",
                &[&key],
            )
            .await;
        assert_denied(forged, "INSERT INTO palisade.marks");
        let truncated = app.execute("TRUNCATE palisade.marks", &[]).await;
        assert_denied(truncated, "TRUNCATE palisade.marks");
        let version = app
            .execute("UPDATE palisade.version SET version = 1", &[])
            .await;
        assert_denied(version, "UPDATE palisade.version");
        let read = app
            .execute("SELECT token FROM palisade.marks WHERE key = $1", &[&key])
            .await;
        assert_denied(read, "SELECT FROM palisade.marks");
        assert_eq!(mark(&admin, &key).await, Some(5), "the mark is untouched");

        // The role granted SELECT reads the marks, and cannot fence: PUBLIC has no EXECUTE.
        let show = connect_to(&url_as(SHOW_ROLE, TEST_DB)).await;
        let marks = postgres::marks(&show).await.expect("SELECT on the marks");
        assert_eq!(marks.get(&key), Some(&5));
        match postgres::admit_with(&show, &key, 6).await {
            Err(Error::Database(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {}
            other => panic!("fencing without EXECUTE: {other:?}"),
        }
        assert_eq!(mark(&admin, &key).await, Some(5));
    });
}

/// A database of one test, dropped when the test ends (passed or not).
struct ScratchDb(String);

impl ScratchDb {
    fn new(prefix: &str) -> Self {
        let name = databases::unique(prefix).replace('-', "_");
        let db = ScratchDb(name);
        let created = db.0.clone();
        std::thread::spawn(move || runtime().block_on(create_database(&created)))
            .join()
            .expect("creating a scratch database");
        db
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            runtime().block_on(async {
                let admin = connect_to(&databases::postgres_url()).await;
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            })
        })
        .join();
    }
}

/// A fence call never installs: with the schema dropped, the CLI fails naming the
/// function and how to install it, as the superuser (who could create it) too, and
/// nothing is recreated. `--create` is the explicit install.
#[test]
fn a_dropped_schema_makes_the_fence_fail_naming_the_function_and_nothing_is_recreated() {
    let _server = SERVER.read().unwrap();
    let db = ScratchDb::new("palisade_dropped");
    let admin_url = url_as(&superuser(), &db.0);
    runtime().block_on(async {
        let admin = connect_to(&admin_url).await;
        postgres::install(&admin).await.expect("install");
        grant_least_privilege(&admin).await;
        postgres::admit_with(&admin, "k", 7).await.unwrap();
        admin
            .batch_execute("DROP SCHEMA palisade CASCADE")
            .await
            .unwrap();
    });
    for url in [admin_url.clone(), url_as(APP_ROLE, &db.0)] {
        for args in [&["--key", "k", "--token", "1"][..], &["--show"][..]] {
            let out = cli::fence(&url, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{url} {args:?}: {err}");
            assert!(
                err.contains("palisade.fence(text, bigint) is not installed in this database"),
                "{url} {args:?}: {err}"
            );
            assert!(
                err.contains("--create") && err.contains("sql/palisade-fence.sql"),
                "{url} {args:?}: {err}"
            );
        }
    }
    runtime().block_on(async {
        let admin = connect_to(&admin_url).await;
        let schema = admin
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = 'palisade'", &[])
            .await
            .unwrap();
        assert!(schema.is_none(), "a fence call recreated the schema");
        match postgres::admit_with(&admin, "k", 1).await {
            Err(e @ Error::NotInstalled { .. }) => assert!(
                e.to_string()
                    .contains("palisade.fence(text, bigint) is not installed"),
                "{e}"
            ),
            other => panic!("fencing with no schema: {other:?}"),
        }
    });
    // Installing is a step of its own, and takes no token.
    let with_token = cli::fence(&admin_url, &["--create", "--token", "1"]);
    assert_eq!(with_token.status.code(), Some(2));
    let install = cli::fence(&admin_url, &["--create"]);
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    assert!(
        String::from_utf8_lossy(&install.stdout).contains(&format!(
            "schema version {} is installed",
            postgres::SQL_VERSION
        )),
        "{}",
        String::from_utf8_lossy(&install.stdout)
    );
    let out = cli::fence(&admin_url, &["--key", "k", "--token", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A holder paused inside its transaction keeps the mark's row lock: `--lock-timeout`
/// bounds the CLI's wait (PostgreSQL's `lock_timeout`) with an error that says so.
#[test]
fn lock_timeout_bounds_the_wait_for_a_mark_another_transaction_holds() {
    let _server = SERVER.read().unwrap();
    let rt = runtime();
    let key = databases::unique("held");
    let holder = rt.block_on(async {
        let admin = setup().await;
        postgres::admit_with(&admin, &key, 10).await.unwrap();
        let holder = connect().await;
        holder
            .batch_execute(&format!("BEGIN; SELECT palisade.fence('{key}', 10)"))
            .await
            .unwrap();
        holder
    });
    let started = Instant::now();
    let mut child = cli::palisade()
        .arg("fence")
        .arg("--store")
        .arg(url_as(APP_ROLE, TEST_DB))
        .args(["--key", &key, "--token", "11", "--lock-timeout", "300ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("palisade fence");
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("palisade fence --lock-timeout 300ms still waits after 20 s for a held mark");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "timed out after 300ms waiting for the mark of key {key:?}: another transaction holds it"
        )),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    rt.block_on(async {
        // The library types the same error (the caller sets lock_timeout).
        let app = connect_app().await;
        app.batch_execute("SET lock_timeout = '200ms'")
            .await
            .unwrap();
        match postgres::admit_with(&app, &key, 11).await {
            Err(e @ Error::LockTimeout { .. }) => {
                assert!(e.to_string().contains(&format!("{key:?}")), "{e}")
            }
            other => panic!("a held mark under lock_timeout: {other:?}"),
        }
        holder.batch_execute("ROLLBACK").await.unwrap();
        let admin = connect().await;
        assert_eq!(mark(&admin, &key).await, Some(10));
    });
}

/// Under `palisade lock` the CLI's default key is `<namespace>/<lease>`; a mark left
/// under the bare lease name by an older palisade is never started over.
#[test]
fn cli_default_key_is_namespace_slash_lease_and_never_starts_a_mark_over() {
    let _server = SERVER.read().unwrap();
    let rt = runtime();
    let admin = rt.block_on(setup());
    let ns = "payments";
    let lease = databases::unique("migrate");
    let namespaced = format!("{ns}/{lease}");
    // An older palisade fenced under the bare lease name.
    rt.block_on(postgres::admit_with(&admin, &lease, 40))
        .unwrap();
    let run = |lease: &str, token: &str, extra: &[&str]| {
        cli::palisade()
            .arg("fence")
            .arg("--store")
            .arg(url_as(APP_ROLE, TEST_DB))
            .args(extra)
            .env("PALISADE_NAMESPACE", ns)
            .env("PALISADE_LEASE", lease)
            .env("PALISADE_FENCING_TOKEN", token)
            .output()
            .unwrap()
    };
    let out = run(&lease, "41", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{namespaced:?}")) && err.contains(&format!("{lease:?}")),
        "{err}"
    );
    assert!(err.contains("--key"), "{err}");
    assert_eq!(rt.block_on(mark(&admin, &namespaced)), None);
    assert_eq!(rt.block_on(mark(&admin, &lease)), Some(40));

    // Naming the key goes on with the old mark.
    let out = run(&lease, "41", &["--key", &lease]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rt.block_on(mark(&admin, &lease)), Some(41));

    // Once the mark is migrated to the namespaced key, the default works.
    rt.block_on(postgres::admit_with(&admin, &namespaced, 41))
        .unwrap();
    let out = run(&lease, "42", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("for key {namespaced:?}")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(rt.block_on(mark(&admin, &namespaced)), Some(42));

    // A lease new to the database starts under the namespaced key.
    let fresh = databases::unique("fresh");
    let out = run(&fresh, "3", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rt.block_on(mark(&admin, &format!("{ns}/{fresh}"))), Some(3));
    assert_eq!(rt.block_on(mark(&admin, &fresh)), None);
}

/// Runs `statements` in one transaction the way a driver that wraps each statement
/// in a savepoint does (pgjdbc `autosave=always`): an error rolls back to the
/// savepoint and the transaction goes on, to COMMIT. The errors, in order.
async fn autosave(client: &Client, statements: &[String]) -> Vec<tokio_postgres::Error> {
    let mut errors = Vec::new();
    client.batch_execute("BEGIN").await.unwrap();
    for statement in statements {
        client
            .batch_execute("SAVEPOINT pgjdbc_autosave")
            .await
            .unwrap();
        match client.batch_execute(statement).await {
            Ok(()) => client
                .batch_execute("RELEASE SAVEPOINT pgjdbc_autosave")
                .await
                .unwrap(),
            Err(e) => {
                errors.push(e);
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT pgjdbc_autosave")
                    .await
                    .unwrap();
            }
        }
    }
    client.batch_execute("COMMIT").await.unwrap();
    errors
}

/// The same statements through `psql -v ON_ERROR_ROLLBACK=on` in one transaction
/// block, as the application role; psql's stderr.
fn psql_on_error_rollback(statements: &[String]) -> String {
    let mut psql = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_ROLLBACK=on",
            &url_as(APP_ROLE, TEST_DB),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    let mut stdin = psql.stdin.take().unwrap();
    writeln!(stdin, "BEGIN;").unwrap();
    for statement in statements {
        writeln!(stdin, "{statement};").unwrap();
    }
    writeln!(stdin, "COMMIT;").unwrap();
    drop(stdin);
    let out = psql.wait_with_output().unwrap();
    assert!(out.status.success(), "psql: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn app_rows(client: &Client, key: &str) -> Vec<i64> {
    client
        .query(
            "SELECT token FROM public.app_writes WHERE key = $1 ORDER BY id",
            &[&key],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The hazard, shown: with a driver that wraps each statement in a savepoint, the
/// separate `SELECT palisade.fence(...)` fails alone and the write after it commits.
#[test]
fn savepoint_wrapping_drivers_commit_a_separate_write_after_pf001() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let admin = setup().await;
        let app = connect_app().await;
        for driver in ["pgjdbc autosave", "psql ON_ERROR_ROLLBACK"] {
            let key = databases::unique("autosave-separate");
            postgres::admit_with(&admin, &key, 5).await.unwrap();
            let statements = [
                format!("SELECT palisade.fence('{key}', 4)"),
                format!("INSERT INTO public.app_writes (key, token) VALUES ('{key}', 4)"),
            ];
            if driver == "psql ON_ERROR_ROLLBACK" {
                let err = psql_on_error_rollback(&statements);
                assert!(err.contains("stale fencing token 4"), "{driver}: {err}");
            } else {
                let errors = autosave(&app, &statements).await;
                assert_eq!(errors.len(), 1, "{driver}: {errors:?}");
                assert_eq!(
                    errors[0].code().map(|c| c.code()),
                    Some(postgres::STALE_SQLSTATE)
                );
            }
            assert_eq!(
                app_rows(&app, &key).await,
                vec![4],
                "{driver}: the write after PF001 committed (the hazard docs/fences.md warns of)"
            );
            assert_eq!(mark(&admin, &key).await, Some(5));
        }
    });
}

/// What docs/fences.md recommends for such drivers: the fence in the write's own
/// statement, so the statement that fails is the write. A stale token commits
/// nothing under either wrapping; a current one writes.
#[test]
fn fence_in_the_write_statement_commits_nothing_stale_under_savepoint_wrapping() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let admin = setup().await;
        let app = connect_app().await;
        for driver in ["pgjdbc autosave", "psql ON_ERROR_ROLLBACK"] {
            let key = databases::unique("autosave-one-statement");
            let forms = |token: u64| {
                [
                    format!(
                        "INSERT INTO public.app_writes (key, token) \
                         SELECT '{key}', {token} FROM palisade.fence('{key}', {token})"
                    ),
                    format!(
                        "UPDATE public.app_writes SET token = {token} \
                         FROM palisade.fence('{key}', {token}) WHERE key = '{key}'"
                    ),
                    format!(
                        "DELETE FROM public.app_writes \
                         USING palisade.fence('{key}', {token}) WHERE key = '{key}'"
                    ),
                ]
            };
            let run = |statements: Vec<String>| {
                let app = &app;
                async move {
                    if driver == "psql ON_ERROR_ROLLBACK" {
                        let err = psql_on_error_rollback(&statements);
                        err.matches("stale fencing token").count()
                    } else {
                        autosave(app, &statements).await.len()
                    }
                }
            };
            // Token 5 writes one row (the INSERT form alone).
            assert_eq!(run(vec![forms(5)[0].clone()]).await, 0, "{driver}");
            assert_eq!(app_rows(&app, &key).await, vec![5], "{driver}");
            // Token 4 is stale: each of the three forms fails, and nothing changes.
            assert_eq!(run(forms(4).to_vec()).await, 3, "{driver}");
            assert_eq!(
                app_rows(&app, &key).await,
                vec![5],
                "{driver}: a stale write committed"
            );
            assert_eq!(mark(&admin, &key).await, Some(5));
            // Token 6 passes: the UPDATE form writes.
            assert_eq!(run(vec![forms(6)[1].clone()]).await, 0, "{driver}");
            assert_eq!(app_rows(&app, &key).await, vec![6], "{driver}");
            assert_eq!(mark(&admin, &key).await, Some(6));
        }
    });
}

/// A v1 install (SECURITY INVOKER: writers had DML on the marks) upgrades in place:
/// the marks are kept, every v1 writer may EXECUTE the function and no longer
/// write the marks table, and PUBLIC loses EXECUTE.
#[test]
fn upgrading_a_v1_install_keeps_the_marks_and_takes_dml_from_writers() {
    let _server = SERVER.read().unwrap();
    let db = ScratchDb::new("palisade_upgrade");
    let writer = "palisade_test_v1_writer";
    runtime().block_on(async {
        let admin = connect_to(&url_as(&superuser(), &db.0)).await;
        admin
            .batch_execute(include_str!("databases/palisade-fence-v1.sql"))
            .await
            .expect("installing version 1");
        admin
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {writer} LOGIN;
                   EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                 GRANT USAGE ON SCHEMA palisade TO {writer};
                 GRANT SELECT, INSERT, UPDATE ON palisade.marks TO {writer}"
            ))
            .await
            .unwrap();
        let v1_writer = connect_to(&url_as(writer, &db.0)).await;
        postgres::admit_with(&v1_writer, "k", 9)
            .await
            .expect("a version 1 writer fences");

        postgres::install(&admin).await.expect("upgrading to the current version");
        let version: i32 = admin
            .query_one("SELECT version FROM palisade.version", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, postgres::SQL_VERSION);
        let admitted = postgres::admit_with(&v1_writer, "k", 10)
            .await
            .expect("the v1 writer still fences after the upgrade");
        assert_eq!(admitted.previous, Some(9), "the mark was kept");
        assert!(matches!(
            postgres::admit_with(&v1_writer, "k", 8).await,
            Err(Error::Stale(Stale { highest: 10, .. }))
        ));
        let lowered = v1_writer
            .execute("UPDATE palisade.marks SET token = 0 WHERE key = 'k'", &[])
            .await;
        assert_denied(lowered, "UPDATE palisade.marks after the upgrade");
        let public: bool = admin
            .query_one(
                "SELECT has_function_privilege('public', 'palisade.fence(text, bigint)', 'EXECUTE')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!public, "PUBLIC may still EXECUTE palisade.fence");
        // Installing again changes no grant.
        postgres::install(&admin).await.unwrap();
        postgres::admit_with(&v1_writer, "k", 11).await.unwrap();
    });
}
