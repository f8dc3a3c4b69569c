//! `palisade.fence` in a real PostgreSQL (`make databases`): concurrent writers at
//! every isolation level, a client SIGKILLed mid-transaction, an immediate shutdown,
//! bad input, autocommit, installing twice and upgrading, a least-privilege role,
//! a missing install, a held row lock, and drivers that wrap statements in savepoints.
//!
//! The server is shared with other test runs: this binary works in a database of its
//! own ([`TEST_DB`]; the dropped-schema test in one it drops again), and its roles
//! have fixed names of their own, created idempotently.
#![cfg(feature = "postgres")]

use std::sync::{OnceLock, RwLock};

use palisade::fence::postgres;
use tokio_postgres::{Client, NoTls};

use support::databases::{self, runtime};

mod cli;
mod concurrency;
mod crash;
mod install;
mod refusals;
mod roles;
mod savepoints;

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

fn assert_denied(result: Result<u64, tokio_postgres::Error>, what: &str) {
    match result {
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {}
        other => panic!("{what}: expected permission denied (42501), got {other:?}"),
    }
}
