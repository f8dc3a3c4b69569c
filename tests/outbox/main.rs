//! The fenced outbox against a real PostgreSQL (`make databases`), a real control
//! plane and controller, the real `palisade outbox relay` binary, and a provider of
//! our own that deduplicates by idempotency key (`support::provider`): no stale
//! holder's intent is inserted; every intent is executed once by the provider across
//! a SIGKILLed relay, a relay paused past its Lease, 5xx answers and timeouts; a 4xx
//! is recorded and not retried.
//!
//! Each test works in a database of its own (a relay claims every pending intent of
//! its outbox, so two tests sharing one would deliver each other's), dropped at the end.
#![cfg(feature = "outbox")]

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use palisade::outbox;
use support::databases;
use support::{ControllerProcess, TestNamespace};
use tokio_postgres::{Client, NoTls};

mod delivery;
mod failover;
mod stale;

/// A database of one test, with the fence and the outbox installed; dropped on drop.
struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    async fn new() -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "palisade_outbox_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let admin = connect(&databases::postgres_url()).await;
        // One statement each: CREATE DATABASE cannot run inside a transaction block.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }
        let url = in_database(&name);
        let db = Self { name, url };
        let client = db.connect().await;
        palisade::fence::postgres::install(&client)
            .await
            .expect("install the fence");
        outbox::install(&client).await.expect("install the outbox");
        db
    }

    /// A database with nothing installed (for the install's refusals).
    async fn empty() -> Self {
        let db = Self::new().await;
        db.connect()
            .await
            .batch_execute("DROP SCHEMA palisade CASCADE")
            .await
            .unwrap();
        db
    }

    async fn connect(&self) -> Client {
        connect(&self.url).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        support::clean_up(|| async move {
            let admin = connect(&databases::postgres_url()).await;
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    }
}

/// The shared server's URL, in database `db`.
fn in_database(db: &str) -> String {
    let base = databases::postgres_url();
    let (root, _) = base.rsplit_once('/').expect("a postgres://.../DB URL");
    format!("{root}/{db}")
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test PostgreSQL at {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// Enqueues `payload` under (`key`, `token`) in a transaction of its own; the id.
async fn enqueue(db: &mut Client, key: &str, token: u64, payload: serde_json::Value) -> String {
    let tx = db.transaction().await.unwrap();
    let id = outbox::enqueue(&tx, key, token, &payload)
        .await
        .unwrap_or_else(|e| panic!("enqueue under token {token}: {e}"));
    tx.commit().await.unwrap();
    id
}

/// `count` payments under (`key`, `token`); their ids.
async fn enqueue_payments(db: &mut Client, key: &str, token: u64, count: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let payment = serde_json::json!({"amount": 100 + n, "currency": "EUR"});
        ids.push(enqueue(db, key, token, payment).await);
    }
    ids
}

/// One intent as the outbox has it.
#[derive(Debug, Clone)]
#[allow(dead_code)]
struct Row {
    state: String,
    attempts: i32,
    last_status: Option<i32>,
    recorded_token: Option<i64>,
}

async fn rows(db: &Client) -> HashMap<String, Row> {
    db.query(
        "SELECT id::text, state, attempts, last_status, recorded_token FROM palisade.outbox",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| {
        let row = Row {
            state: r.get(1),
            attempts: r.get(2),
            last_status: r.get(3),
            recorded_token: r.get(4),
        };
        (r.get(0), row)
    })
    .collect()
}

/// Polls `done` every 50 ms until it is true; panics naming `what` after `limit`.
async fn eventually<F: Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> F,
) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every intent in `ids` has state `state`.
async fn wait_state(db: &Client, ids: &[String], state: &str, limit: Duration) {
    eventually(&format!("{} intents {state}", ids.len()), limit, || async {
        let rows = rows(db).await;
        ids.iter()
            .all(|id| rows.get(id).is_some_and(|r| r.state == state))
    })
    .await;
}

/// Every intent in `ids` was executed exactly once by the provider, and the
/// provider saw no request without a key.
fn assert_executed_once(provider: &support::provider::Provider, ids: &[String]) {
    let keys = provider.keys();
    for id in ids {
        let executions = keys.get(id).map_or(0, |k| k.executions);
        assert_eq!(
            executions,
            1,
            "intent {id} executed {executions} times: {:?}",
            keys.get(id)
        );
    }
    assert_eq!(
        provider.keyless_requests(),
        0,
        "requests without an Idempotency-Key"
    );
}

/// The controller for a namespace of the test's own.
async fn cluster(prefix: &str) -> (TestNamespace, ControllerProcess) {
    support::install_crds().await;
    let ns = TestNamespace::new(prefix).await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    (ns, controller)
}

/// A `palisade outbox relay` process; SIGKILLed when dropped.
struct Relay {
    child: tokio::process::Child,
    log: PathBuf,
}

/// The relay's lease duration in these tests: a failover takes about this long.
const RELAY_LEASE: &str = "2s";

/// Short timeouts and backoffs, flag and value, unless a test passes the flag itself.
const DEFAULTS: [&str; 8] = [
    "--timeout",
    "1s",
    "--backoff",
    "100ms",
    "--max-backoff",
    "1s",
    "--poll",
    "50ms",
];

impl Relay {
    /// Starts a relay on lease `lease` of `ns`, delivering to `endpoint`, with short
    /// timeouts and backoffs ([`DEFAULTS`]); `extra` flags replace those.
    fn start(
        ns: &str,
        name: &str,
        db: &TestDb,
        lease: &str,
        endpoint: &str,
        extra: &[&str],
    ) -> Self {
        let log = support::repo_root().join(format!("target/outbox-relay-{ns}-{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut command = support::palisade_on_cluster();
        command
            .args([
                "outbox",
                "relay",
                "-n",
                ns,
                "--lease",
                lease,
                "--identity",
                name,
            ])
            .args([
                "--store",
                &db.url,
                "--endpoint",
                endpoint,
                "--duration",
                RELAY_LEASE,
            ])
            .args(
                DEFAULTS
                    .chunks(2)
                    .filter(|flag| !extra.contains(&flag[0]))
                    .flatten(),
            )
            .args(extra)
            .env("RUST_LOG", "info,palisade=debug")
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = command.spawn().expect("spawning palisade outbox relay");
        Self { child, log }
    }

    fn pid(&self) -> i32 {
        self.child.id().expect("the relay runs") as i32
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(self.pid(), signal) },
            0,
            "kill {}",
            self.pid()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The token of the Lease's holder once `pred` holds for it.
async fn holder_token(
    ns: &TestNamespace,
    lease: &str,
    what: &str,
    pred: impl Fn(&str, i64) -> bool,
) -> i64 {
    let lease = support::wait_lease(ns, lease, what, |l| {
        let holder = l.status.as_ref().and_then(|s| s.holder.as_ref());
        let token = l.status.as_ref().and_then(|s| s.fencing_token);
        matches!((holder, token), (Some(h), Some(t)) if pred(&h.identity, t))
    })
    .await;
    support::token(&lease)
}
