//! `palisade.fence` in a real MariaDB (`make databases`, from Debian's packages):
//! installing (only with `--create`, idempotent, never downgrading), a missing
//! install, stale and equal tokens, bad input, the least-privilege writer, the fence
//! in the write's own statement against a separate statement whose error is ignored,
//! racing writers at each isolation level (and the same race without the fence), a
//! held row lock, a server crash, and the CLI.
//!
//! The server is shared with other test runs; the database `palisade` is the fence's
//! own name, and InnoDB's gap locks on the marks' index let one test's racing writers
//! pick another test's transaction as a deadlock victim, so every test takes
//! [`SERVER`]: one at a time. The application's tables live in
//! [`TEST_DB`]; keys are unique per test and run.
#![cfg(feature = "mysql")]

use std::sync::Mutex;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel, Opts, Transaction, TxOpts};
use palisade::fence::mysql;

use support::databases;

mod cli;
mod concurrency;
mod crash;
mod install;
mod refusals;
mod statements;

/// Every test holds it: one at a time (see the module's docs).
static SERVER: Mutex<()> = Mutex::new(());

/// The application's database: the journal the writers append to.
const TEST_DB: &str = "palisade_tests";
/// The least-privilege writer of docs/fences.md: EXECUTE on palisade.fence, DML on
/// its own database only.
const APP_USER: &str = "palisade_test_app";
/// The account `--show` needs: SELECT on palisade.marks.
const SHOW_USER: &str = "palisade_test_show";

/// The server's URL as `user` (no password), in `db`.
fn url_as(user: &str, db: &str) -> String {
    let base = databases::mysql_url();
    let (scheme, rest) = base.split_once("://").expect("a mysql:// URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split('/').next().unwrap_or(host);
    format!("{scheme}://{user}@{host}/{db}")
}

/// The administrator of the shared server (root in the rig).
fn admin_url() -> String {
    databases::mysql_url()
}

async fn connect_to(url: &str) -> Conn {
    let opts = Opts::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    Conn::new(opts)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test MariaDB at {url}: {e}"))
}

async fn connect() -> Conn {
    connect_to(&admin_url()).await
}

/// Connected as the least-privilege [`APP_USER`].
async fn connect_app() -> Conn {
    connect_to(&url_as(APP_USER, TEST_DB)).await
}

/// The fence installed (once per run: installing replaces the function, which waits
/// for the open transactions of other tests that called it), the accounts and grants
/// docs/fences.md documents, and the journal table; idempotent. One test at a time:
/// concurrent GRANTs on one account may deadlock on the privilege tables.
async fn setup() -> Conn {
    static INSTALLED: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let mut conn = connect().await;
    let mut installed = INSTALLED.lock().await;
    if !*installed {
        mysql::install(&mut conn).await.expect("install");
        *installed = true;
    }
    conn.query_drop(format!(
        "CREATE DATABASE IF NOT EXISTS {TEST_DB};
         CREATE TABLE IF NOT EXISTS {TEST_DB}.fenced_writes (
           id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(200) NOT NULL,
           token BIGINT NOT NULL, writer INT NOT NULL) ENGINE = InnoDB;
         CREATE USER IF NOT EXISTS '{APP_USER}'@'%';
         GRANT EXECUTE ON FUNCTION palisade.fence TO '{APP_USER}'@'%';
         GRANT SELECT, INSERT, UPDATE, DELETE ON {TEST_DB}.* TO '{APP_USER}'@'%';
         CREATE USER IF NOT EXISTS '{SHOW_USER}'@'%';
         GRANT SELECT ON palisade.marks TO '{SHOW_USER}'@'%'"
    ))
    .await
    .expect("accounts, grants and the journal table");
    conn
}

/// A transaction at `level`.
async fn begin(conn: &mut Conn, level: IsolationLevel) -> Transaction<'_> {
    let mut opts = TxOpts::new();
    opts.with_isolation_level(level);
    conn.start_transaction(opts)
        .await
        .expect("START TRANSACTION")
}

/// How many journal rows `key` has.
async fn written(conn: &mut Conn, key: &str) -> i64 {
    conn.exec_first(
        format!("SELECT COUNT(*) FROM {TEST_DB}.fenced_writes WHERE k = ?"),
        (key,),
    )
    .await
    .unwrap()
    .unwrap()
}

/// The key's mark, read as the administrator.
async fn mark(conn: &mut Conn, key: &str) -> Option<i64> {
    conn.exec_first(
        "SELECT token FROM palisade.marks WHERE `key` = CAST(? AS BINARY)",
        (key,),
    )
    .await
    .unwrap()
}

/// The server's error code, or a panic naming what was expected.
fn server_code<T: std::fmt::Debug>(result: Result<T, mysql_async::Error>, what: &str) -> u16 {
    match result {
        Err(mysql_async::Error::Server(e)) => e.code,
        other => panic!("{what}: expected a server error, got {other:?}"),
    }
}
