//! PostgreSQL and Redis as fenced stores in the chaos run, next to the file fence
//! and the ConfigMap. The harness starts its own servers (databases.sh with
//! `target/chaos-databases` and the ports below), restarts them as faults, and
//! kills workers in the middle of an open PostgreSQL transaction.
//!
//! Workers reach PostgreSQL as [`APP_ROLE`], with only the grants the README
//! documents (USAGE on the schema, EXECUTE on `palisade.fence`, INSERT on their own
//! table); the superuser installs the fence once at set-up and reads the journal.
//!
//! Each store keeps its own commit order, which the checker reads after the run:
//! PostgreSQL the ids of `chaos.writes` (drawn after `palisade.fence`, under the
//! mark's row lock, which is held until commit), Redis the list the fencing script
//! appends to in the same atomic step as the check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use palisade::fence::postgres::{self as pg_fence, Error as PgError};
use palisade::fence::redis::{self as redis_fence, Error as RedisError, RedisFence, Write};

use crate::history::{Event, JournalWrite, Outcome, Recorder};
use crate::rng::now_ns;

pub const PG_PORT: u16 = 25433;
pub const REDIS_PORT: u16 = 26380;
/// How workers learn the URLs (environment, so the worker's arguments stay as they are).
pub const PG_ENV: &str = "PALISADE_CHAOS_POSTGRES";
pub const REDIS_ENV: &str = "PALISADE_CHAOS_REDIS";
pub const STORES: [&str; 2] = ["postgres", "redis"];
/// The faults this module adds to the schedule (injected by main.rs's `inject_db`).
pub const FAULTS: [&str; 4] = [
    "restart_postgres",
    "restart_redis",
    "kill_worker_in_transaction",
    "pause_in_transaction",
];

const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The least-privilege role the workers write as.
pub const APP_ROLE: &str = "palisade_chaos_app";

/// The workers' URL: the least-privilege role.
pub fn postgres_url() -> String {
    format!("postgres://{APP_ROLE}@127.0.0.1:{PG_PORT}/postgres")
}

/// The superuser: installs, reads the journal, looks at the workers' sessions.
pub fn admin_url() -> String {
    format!("postgres://postgres@127.0.0.1:{PG_PORT}/postgres")
}

pub fn redis_url() -> String {
    format!("redis://127.0.0.1:{REDIS_PORT}/")
}

/// The harness's servers, through tests/databases/databases.sh.
pub struct Servers {
    root: PathBuf,
}

impl Servers {
    pub fn new(root: &Path) -> Self {
        Servers {
            root: root.to_path_buf(),
        }
    }

    pub fn script(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new(self.root.join("tests/databases/databases.sh"))
            .args(args)
            .env("STATE_DIR", self.root.join("target/chaos-databases"))
            .env("PG_PORT", PG_PORT.to_string())
            .env("REDIS_PORT", REDIS_PORT.to_string())
            .output()
            .map_err(|e| format!("databases.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "databases.sh {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Fresh servers with the fence installed, the journal table created and the
    /// workers' role granted what the README documents, nothing more.
    pub async fn set_up(&self) -> Result<(), String> {
        self.script(&["down"])?;
        self.script(&["up"])?;
        let (client, connection) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
        tokio::spawn(connection);
        pg_fence::install(&client)
            .await
            .map_err(|e| format!("installing palisade.fence: {e:?}"))?;
        client
            .batch_execute(
                "CREATE SCHEMA IF NOT EXISTS chaos;
                 CREATE TABLE IF NOT EXISTS chaos.writes (
                   id bigserial PRIMARY KEY, lease text NOT NULL, token bigint NOT NULL,
                   worker text NOT NULL, seq bigint NOT NULL)",
            )
            .await
            .map_err(|e| format!("creating chaos.writes: {e}"))?;
        client
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {APP_ROLE} LOGIN;
                   EXCEPTION WHEN duplicate_object THEN NULL; END $$;
                 GRANT USAGE ON SCHEMA palisade TO {APP_ROLE};
                 GRANT EXECUTE ON FUNCTION palisade.fence(text, bigint) TO {APP_ROLE};
                 GRANT USAGE ON SCHEMA chaos TO {APP_ROLE};
                 GRANT INSERT ON chaos.writes TO {APP_ROLE};
                 GRANT USAGE ON SEQUENCE chaos.writes_id_seq TO {APP_ROLE}"
            ))
            .await
            .map_err(|e| format!("granting {APP_ROLE}: {e}"))
    }

    pub fn down(&self) {
        if let Err(e) = self.script(&["down"]) {
            eprintln!("chaos: {e}");
        }
    }

    /// The commit order of each database store, as journal entries per store.
    pub async fn journals(
        &self,
        leases: &[String],
    ) -> Result<BTreeMap<String, Vec<JournalWrite>>, String> {
        let mut journals = BTreeMap::new();
        let (client, connection) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
        tokio::spawn(connection);
        let rows = client
            .query(
                "SELECT lease, token, worker, seq FROM chaos.writes ORDER BY id",
                &[],
            )
            .await
            .map_err(|e| format!("reading chaos.writes: {e}"))?;
        let pg: Vec<JournalWrite> = rows
            .iter()
            .map(|r| JournalWrite {
                lease: r.get(0),
                token: r.get::<_, i64>(1) as u64,
                worker: r.get(2),
                seq: r.get::<_, i64>(3) as u64,
            })
            .collect();
        journals.insert("postgres".to_string(), pg);
        let mut conn = redis::Client::open(redis_url())
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connecting to Redis: {e}"))?;
        let mut all = Vec::new();
        for lease in leases {
            let items: Vec<String> = redis::cmd("LRANGE")
                .arg(redis_fence::data_key(lease, "journal"))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("reading the Redis journal of {lease}: {e}"))?;
            for item in items {
                all.push(
                    serde_json::from_str::<JournalWrite>(&item)
                        .map_err(|e| format!("Redis journal entry {item:?}: {e}"))?,
                );
            }
        }
        journals.insert("redis".to_string(), all);
        Ok(journals)
    }

    /// A worker that holds a PostgreSQL transaction open right now (after its fenced
    /// check, before its commit), to be killed or paused there.
    pub async fn worker_in_transaction(&self, candidates: &[String]) -> Option<String> {
        // The superuser: another role's sessions show no state.
        let (client, connection) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(connection);
        // Bounded: 10 s of looking every 20 ms.
        for _ in 0..500 {
            let rows = client
                .query(
                    "SELECT application_name FROM pg_stat_activity \
                     WHERE state = 'idle in transaction' AND application_name LIKE 'chaos-%'",
                    &[],
                )
                .await
                .ok()?;
            for row in rows {
                let name: String = row.get(0);
                let identity = name.trim_start_matches("chaos-").to_string();
                if candidates.contains(&identity) {
                    return Some(identity);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

/// A worker's connections to both databases; reconnects after a failure.
pub struct Stores {
    identity: String,
    pg_url: String,
    redis_url: String,
    pg: Option<tokio_postgres::Client>,
    redis: Option<redis::aio::MultiplexedConnection>,
    fence: RedisFence,
}

impl Stores {
    /// From the environment the harness sets; `None` when it set none.
    pub fn from_env(identity: &str) -> Option<Self> {
        Some(Stores {
            identity: identity.to_string(),
            pg_url: std::env::var(PG_ENV).ok()?,
            redis_url: std::env::var(REDIS_ENV).ok()?,
            pg: None,
            redis: None,
            fence: RedisFence::new(),
        })
    }

    /// Writes to both stores with `token` and records both outcomes. `hold` is how
    /// long the PostgreSQL transaction stays open after its check (so a kill can
    /// land inside it).
    pub async fn write(
        &mut self,
        history: &mut Recorder,
        lease: &str,
        token: u64,
        seq: u64,
        hold: Duration,
    ) {
        let start_ns = now_ns();
        let result =
            tokio::time::timeout(WRITE_TIMEOUT, self.write_postgres(lease, token, seq, hold)).await;
        let (outcome, detail) = match result {
            Ok(Ok(())) => (Outcome::Accepted, String::new()),
            Ok(Err(e @ PgError::Stale { .. })) => (Outcome::Stale, e.to_string()),
            Ok(Err(e)) => {
                self.pg = None;
                (Outcome::Error, format!("{e:?}"))
            }
            Err(_) => {
                self.pg = None;
                (Outcome::Error, "timed out".into())
            }
        };
        history.record(&self.event("postgres", lease, token, seq, start_ns, outcome, detail));

        let start_ns = now_ns();
        let result = tokio::time::timeout(WRITE_TIMEOUT, self.write_redis(lease, token, seq)).await;
        let (outcome, detail) = match result {
            Ok(Ok(())) => (Outcome::Accepted, String::new()),
            Ok(Err(e @ RedisError::Stale { .. })) => (Outcome::Stale, e.to_string()),
            Ok(Err(e)) => {
                self.redis = None;
                (Outcome::Error, format!("{e:?}"))
            }
            Err(_) => {
                self.redis = None;
                (Outcome::Error, "timed out".into())
            }
        };
        history.record(&self.event("redis", lease, token, seq, start_ns, outcome, detail));
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        store: &str,
        lease: &str,
        token: u64,
        seq: u64,
        start_ns: u64,
        outcome: Outcome,
        detail: String,
    ) -> Event {
        Event::Write {
            worker: self.identity.clone(),
            lease: lease.to_string(),
            store: store.into(),
            token,
            seq,
            start_ns,
            end_ns: now_ns(),
            outcome,
            rv: None,
            detail,
        }
    }

    async fn write_postgres(
        &mut self,
        lease: &str,
        token: u64,
        seq: u64,
        hold: Duration,
    ) -> Result<(), PgError> {
        if self.pg.as_ref().is_none_or(|c| c.is_closed()) {
            let url = format!("{}?application_name=chaos-{}", self.pg_url, self.identity);
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(PgError::Database)?;
            tokio::spawn(connection);
            self.pg = Some(client);
        }
        let client = self.pg.as_mut().expect("connected above");
        let tx = client.transaction().await.map_err(PgError::Database)?;
        pg_fence::admit(&tx, lease, token).await?;
        tx.execute(
            "INSERT INTO chaos.writes (lease, token, worker, seq) VALUES ($1, $2, $3, $4)",
            &[&lease, &(token as i64), &self.identity, &(seq as i64)],
        )
        .await
        .map_err(PgError::Database)?;
        tokio::time::sleep(hold).await;
        tx.commit().await.map_err(PgError::Database)
    }

    async fn write_redis(&mut self, lease: &str, token: u64, seq: u64) -> Result<(), RedisError> {
        if self.redis.is_none() {
            let conn = redis::Client::open(self.redis_url.as_str())
                .map_err(RedisError::Redis)?
                .get_multiplexed_async_connection()
                .await
                .map_err(RedisError::Redis)?;
            self.redis = Some(conn);
        }
        let conn = self.redis.as_mut().expect("connected above");
        let payload = serde_json::to_string(&JournalWrite {
            lease: lease.to_string(),
            token,
            worker: self.identity.clone(),
            seq,
        })
        .expect("serializes");
        let journal = redis_fence::data_key(lease, "journal");
        self.fence
            .admit(
                conn,
                lease,
                token,
                Write::Push {
                    key: &journal,
                    value: &payload,
                },
            )
            .await
            .map(|_| ())
    }
}
