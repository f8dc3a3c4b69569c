//! PostgreSQL, Redis and MariaDB (mysql_store.rs) as fenced stores in the chaos run,
//! next to the file fence and the ConfigMap. The harness starts its own servers (databases.sh with
//! `target/chaos-databases` and the ports below), restarts them as faults, and
//! kills workers in the middle of an open PostgreSQL transaction.
//!
//! Workers reach PostgreSQL as [`APP_ROLE`], with only the grants docs/fences.md
//! documents (USAGE on the schema, EXECUTE on `palisade.fence`, INSERT on their own
//! table); the superuser installs the fence once at set-up and reads the journal.
//!
//! Each store keeps its own commit order, which the checker reads after the run:
//! PostgreSQL the ids of `chaos.writes` (drawn after `palisade.fence`, under the
//! mark's row lock, which is held until commit), Redis the list the fencing script
//! appends to in the same atomic step as the check.
//!
//! Two more Redis servers are set up the way the fence must not be ([`LOSSY`]):
//! `redis-rdb` with Redis' default persistence (RDB snapshots only, the first after
//! 300 s at the earliest) and `redis-lru` with `allkeys-lru` in 4 MiB. Their faults
//! lose the marks: `lose_redis_marks` SIGKILLs `redis-rdb` and starts it again (it
//! comes back empty), `evict_redis_marks` squeezes `redis-lru`'s maxmemory until
//! every mark is evicted. From then on each write must be refused (the missing-mark
//! error, counted), never admitted: the fence fails closed, it does not start over.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use palisade::fence::postgres::{self as pg_fence, Error as PgError};
use palisade::fence::redis::{self as redis_fence, Error as RedisError, RedisFence, Write};

use crate::faults::Fault;
use crate::history::{Event, JournalWrite, Outcome, Recorder};
use crate::rng::now_ns;
use crate::worker::Held;
use crate::{mysql_store, outbox_store, s3_store};

pub const PG_PORT: u16 = 25433;
pub const REDIS_PORT: u16 = 26380;
/// The stores that lose their marks, their ports, settings, and the fault that does it.
pub const LOSSY: [Lossy; 2] = [
    Lossy {
        store: "redis-rdb",
        port: 26381,
        // Redis' defaults: no AOF, RDB snapshots after 3600 s/1, 300 s/100, 60 s/10000 changes.
        settings: &[],
        fault: Fault::LoseRedisMarks,
    },
    Lossy {
        store: "redis-lru",
        port: 26382,
        settings: &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxmemory",
            LRU_MAXMEMORY,
            "--maxmemory-policy",
            "allkeys-lru",
        ],
        fault: Fault::EvictRedisMarks,
    },
];
const LRU_MAXMEMORY: &str = "4mb";

/// A Redis store set up so that it loses marks (see the module's doc).
#[derive(Debug, Clone, Copy)]
pub struct Lossy {
    pub store: &'static str,
    pub port: u16,
    pub settings: &'static [&'static str],
    pub fault: Fault,
}

impl Lossy {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn dir(&self, root: &Path) -> PathBuf {
        root.join("target/chaos-databases").join(self.store)
    }

    /// Daemonized (the harness is not its parent, so a SIGKILL leaves no zombie
    /// behind), on 127.0.0.1, until it answers PING (at most 10 s).
    fn start(&self, root: &Path) -> Result<(), String> {
        let dir = self.dir(root);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let status = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--protected-mode", "yes", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .arg("--pidfile")
            .arg(dir.join("redis.pid"))
            .args(["--daemonize", "yes"])
            .args(self.settings)
            .stdin(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("starting redis-server for {}: {e}", self.store))?;
        if !status.success() {
            return Err(format!("redis-server for {} exited {status}", self.store));
        }
        for _ in 0..200 {
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "{} did not answer on 127.0.0.1:{} within 10 s (log: {})",
            self.store,
            self.port,
            dir.join("redis.log").display()
        ))
    }

    /// SIGKILL (no shutdown save), and wait until the port no longer answers.
    fn kill(&self, root: &Path) {
        let pidfile = self.dir(root).join("redis.pid");
        let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        else {
            return;
        };
        // SAFETY: kill(2) on the pid of the server this harness started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        for _ in 0..100 {
            if !ping(self.port) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(pidfile);
    }
}

fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let answer = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"PING\r\n")?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf)?;
        Ok(buf[..n].starts_with(b"+PONG"))
    });
    matches!(answer, Ok(true))
}
/// How workers learn the URLs (environment, so the worker's arguments stay as they are).
pub const PG_ENV: &str = "PALISADE_CHAOS_POSTGRES";
pub const REDIS_ENV: &str = "PALISADE_CHAOS_REDIS";
pub const STORES: [&str; 4] = ["postgres", "redis", "mysql", s3_store::STORE];
/// The faults this module adds to the schedule (injected by faults.rs's `inject_db`).
pub const FAULTS: [Fault; 9] = [
    Fault::KillRelay,
    Fault::PauseRelay,
    Fault::RestartPostgres,
    Fault::RestartRedis,
    Fault::RestartMysql,
    Fault::KillWorkerInTransaction,
    Fault::PauseInTransaction,
    Fault::LoseRedisMarks,
    Fault::EvictRedisMarks,
];

const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The least-privilege role the workers write as.
pub const APP_ROLE: &str = "palisade_chaos_app";

/// The S3 store's `<endpoint> <bucket>` of this run ([`s3_store::S3_ENV`]), once set up.
static S3_LOCATION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn s3_location() -> Option<&'static str> {
    S3_LOCATION.get().map(String::as_str)
}

/// The superuser's connection (the outbox's verdict reads the intents).
pub async fn admin_client() -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

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
            .env("MYSQL_PORT", mysql_store::MYSQL_PORT.to_string())
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
    /// workers' role granted what docs/fences.md documents, nothing more.
    pub async fn set_up(&self) -> Result<(), String> {
        self.down_lossy();
        self.script(&["down"])?;
        self.script(&["up"])?;
        for lossy in LOSSY {
            lossy.start(&self.root)?;
        }
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
                   id bigserial PRIMARY KEY, lease text NOT NULL,
                   slot integer NOT NULL DEFAULT 0, token bigint NOT NULL,
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
            .map_err(|e| format!("granting {APP_ROLE}: {e}"))?;
        outbox_store::install(&client, APP_ROLE).await?;
        mysql_store::set_up().await?;
        let run = format!("{}-{}", std::process::id(), now_ns() / 1_000_000_000);
        let location = s3_store::set_up(&self.root, &run).await?;
        S3_LOCATION
            .set(location)
            .map_err(|_| "the S3 store is set up once per run".to_string())
    }

    fn down_lossy(&self) {
        for lossy in LOSSY {
            lossy.kill(&self.root);
        }
    }

    /// Each slot's mark (under its fence key, `keys`) in every Redis store, created
    /// once before any worker starts. In the lossy ones the harness plays an operator
    /// who ignored the settings check (`RedisFence::create` refuses there): a plain SET NX.
    pub async fn create_marks(&self, keys: &[String]) -> Result<(), String> {
        let mut conn = connect(&redis_url()).await?;
        for key in keys {
            RedisFence::create(&mut conn, key)
                .await
                .map_err(|e| format!("creating the mark of {key}: {e}"))?;
        }
        for lossy in LOSSY {
            let mut conn = connect(&lossy.url()).await?;
            for key in keys {
                let _: Option<String> = redis::cmd("SET")
                    .arg(redis_fence::mark_key(key))
                    .arg("")
                    .arg("NX")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("creating the mark of {key} in {}: {e}", lossy.store))?;
            }
        }
        Ok(())
    }

    /// `lose_redis_marks`: SIGKILL `redis-rdb` and start it again on its directory.
    pub fn lose_marks(&self) -> Result<String, String> {
        let lossy = LOSSY[0];
        let started = std::time::Instant::now();
        lossy.kill(&self.root);
        lossy.start(&self.root)?;
        Ok(format!(
            "{} killed and back in {} ms",
            lossy.store,
            started.elapsed().as_millis()
        ))
    }

    /// `evict_redis_marks`: lower `redis-lru`'s maxmemory below what it uses, so
    /// `allkeys-lru` evicts, until no fence key (`keys`) has a mark (at most 5 s), then
    /// restore it.
    pub async fn evict_marks(&self, keys: &[String]) -> Result<String, String> {
        let lossy = LOSSY[1];
        let mut conn = connect(&lossy.url()).await?;
        let config = |value: &str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("SET").arg("maxmemory").arg(value);
            cmd
        };
        let _: () = config("1")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("squeezing {}: {e}", lossy.store))?;
        let mut left = keys.len();
        for _ in 0..100 {
            // Each command makes Redis evict first.
            left = 0;
            for key in keys {
                let exists: bool = redis::cmd("EXISTS")
                    .arg(redis_fence::mark_key(key))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("reading {}: {e}", lossy.store))?;
                left += usize::from(exists);
            }
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _: () = config(LRU_MAXMEMORY)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("restoring {}'s maxmemory: {e}", lossy.store))?;
        if left > 0 {
            return Err(format!(
                "{}: {left} marks survived the squeeze",
                lossy.store
            ));
        }
        Ok(format!("{}: every mark evicted", lossy.store))
    }

    pub fn down(&self) {
        self.down_lossy();
        if let Err(e) = s3_store::script(&self.root, "down") {
            eprintln!("chaos: {e}");
        }
        if let Err(e) = self.script(&["down"]) {
            eprintln!("chaos: {e}");
        }
    }

    /// The commit order of each database store, as journal entries per store, for
    /// the slots' fence keys `keys`.
    pub async fn journals(
        &self,
        keys: &[String],
    ) -> Result<BTreeMap<String, Vec<JournalWrite>>, String> {
        let mut journals = BTreeMap::new();
        let (client, connection) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
        tokio::spawn(connection);
        let rows = client
            .query(
                "SELECT lease, slot, token, worker, seq FROM chaos.writes ORDER BY id",
                &[],
            )
            .await
            .map_err(|e| format!("reading chaos.writes: {e}"))?;
        let pg: Vec<JournalWrite> = rows
            .iter()
            .map(|r| JournalWrite {
                lease: r.get(0),
                slot: r.get(1),
                token: r.get::<_, i64>(2) as u64,
                worker: r.get(3),
                seq: r.get::<_, i64>(4) as u64,
            })
            .collect();
        journals.insert("postgres".to_string(), pg);
        journals.insert(
            "redis".to_string(),
            redis_journal(&redis_url(), keys).await?,
        );
        journals.insert("mysql".to_string(), mysql_store::journal().await?);
        let location = s3_location().ok_or("the S3 store was not set up")?;
        journals.insert(
            s3_store::STORE.to_string(),
            s3_store::final_objects(location, keys).await?,
        );
        // What the lossy ones hold now: after a loss, only writes admitted since.
        for lossy in LOSSY {
            journals.insert(
                lossy.store.to_string(),
                redis_journal(&lossy.url(), keys).await?,
            );
        }
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

async fn connect(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to Redis at {url}: {e}"))
}

/// The list the fencing script appended to, for each fence key in turn.
async fn redis_journal(url: &str, keys: &[String]) -> Result<Vec<JournalWrite>, String> {
    let mut conn = connect(url).await?;
    let mut all = Vec::new();
    for key in keys {
        let items: Vec<String> = redis::cmd("LRANGE")
            .arg(redis_fence::data_key(key, "journal"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("reading the Redis journal of {key} at {url}: {e}"))?;
        for item in items {
            all.push(
                serde_json::from_str::<JournalWrite>(&item)
                    .map_err(|e| format!("Redis journal entry {item:?}: {e}"))?,
            );
        }
    }
    Ok(all)
}

/// A worker's connections to the databases; reconnects after a failure.
pub struct Stores {
    identity: String,
    pg_url: String,
    redis_url: String,
    pg: Option<tokio_postgres::Client>,
    redis: Option<redis::aio::MultiplexedConnection>,
    /// The lossy Redis stores, as in [`LOSSY`].
    lossy: Vec<Option<redis::aio::MultiplexedConnection>>,
    fence: RedisFence,
    mysql: mysql_store::Writer,
    s3: s3_store::Writer,
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
            lossy: vec![None; LOSSY.len()],
            fence: RedisFence::new(),
            mysql: mysql_store::Writer::from_env()?,
            s3: s3_store::Writer::from_env()?,
        })
    }

    /// Writes to every store with `held`'s token under its fence key and records the
    /// outcomes. `hold` is how long the PostgreSQL transaction stays open after its
    /// check (so a kill can land inside it).
    pub async fn write(&mut self, history: &mut Recorder, held: &Held, seq: u64, hold: Duration) {
        let start_ns = now_ns();
        let result =
            tokio::time::timeout(WRITE_TIMEOUT, self.write_postgres(held, seq, hold)).await;
        let (outcome, detail) = match result {
            Ok(Ok(())) => (Outcome::Accepted, String::new()),
            Ok(Err(e @ PgError::Stale(_))) => (Outcome::Stale, e.to_string()),
            Ok(Err(e)) => {
                self.pg = None;
                (Outcome::Error, format!("{e:?}"))
            }
            Err(_) => {
                self.pg = None;
                (Outcome::Error, "timed out".into())
            }
        };
        history.record(&self.event("postgres", held, seq, start_ns, outcome, detail));

        let url = self.redis_url.clone();
        let mut conn = self.redis.take();
        let event = self
            .write_redis_store("redis", &url, &mut conn, held, seq)
            .await;
        self.redis = conn;
        history.record(&event);
        for (i, lossy) in LOSSY.iter().enumerate() {
            let mut conn = self.lossy[i].take();
            let event = self
                .write_redis_store(lossy.store, &lossy.url(), &mut conn, held, seq)
                .await;
            self.lossy[i] = conn;
            history.record(&event);
        }
        let start_ns = now_ns();
        let write = held.journal(&self.identity, seq);
        let (outcome, detail) = self.mysql.write(&held.key, &write, WRITE_TIMEOUT).await;
        history.record(&self.event("mysql", held, seq, start_ns, outcome, detail));
        let start_ns = now_ns();
        let (outcome, detail) = self.s3.write(&held.key, &write, WRITE_TIMEOUT).await;
        history.record(&self.event(s3_store::STORE, held, seq, start_ns, outcome, detail));
    }

    /// One write to one Redis store, its outcome as an event; drops the
    /// connection after an error so that the next write reconnects.
    async fn write_redis_store(
        &self,
        store: &str,
        url: &str,
        conn: &mut Option<redis::aio::MultiplexedConnection>,
        held: &Held,
        seq: u64,
    ) -> Event {
        let start_ns = now_ns();
        let result =
            tokio::time::timeout(WRITE_TIMEOUT, self.write_redis(url, conn, held, seq)).await;
        let (outcome, detail) = match result {
            Ok(Ok(())) => (Outcome::Accepted, String::new()),
            Ok(Err(e @ RedisError::Stale(_))) => (Outcome::Stale, e.to_string()),
            Ok(Err(e @ RedisError::NoMark { .. })) => (Outcome::NoMark, e.to_string()),
            Ok(Err(e)) => {
                *conn = None;
                (Outcome::Error, format!("{e:?}"))
            }
            Err(_) => {
                *conn = None;
                (Outcome::Error, "timed out".into())
            }
        };
        self.event(store, held, seq, start_ns, outcome, detail)
    }

    fn event(
        &self,
        store: &str,
        held: &Held,
        seq: u64,
        start_ns: u64,
        outcome: Outcome,
        detail: String,
    ) -> Event {
        Event::Write {
            worker: self.identity.clone(),
            lease: held.lease.clone(),
            slot: held.slot,
            store: store.into(),
            token: held.token,
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
        held: &Held,
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
        pg_fence::admit(&tx, &held.key, held.token).await?;
        tx.execute(
            "INSERT INTO chaos.writes (lease, slot, token, worker, seq) \
             VALUES ($1, $2, $3, $4, $5)",
            &[
                &held.lease,
                &held.slot,
                &(held.token as i64),
                &self.identity,
                &(seq as i64),
            ],
        )
        .await
        .map_err(PgError::Database)?;
        let write = held.journal(&self.identity, seq);
        outbox_store::enqueue(&tx, &held.key, &write)
            .await
            .map_err(|e| match e {
                palisade::outbox::Error::Stale(stale) => PgError::Stale(stale),
                palisade::outbox::Error::Conflict(e) | palisade::outbox::Error::Database(e) => {
                    PgError::Database(e)
                }
                other => PgError::BadInput(format!("the outbox refused the intent: {other}")),
            })?;
        tokio::time::sleep(hold).await;
        tx.commit().await.map_err(PgError::Database)
    }

    async fn write_redis(
        &self,
        url: &str,
        conn: &mut Option<redis::aio::MultiplexedConnection>,
        held: &Held,
        seq: u64,
    ) -> Result<(), RedisError> {
        if conn.is_none() {
            let connected = redis::Client::open(url)
                .map_err(RedisError::Redis)?
                .get_multiplexed_async_connection()
                .await
                .map_err(RedisError::Redis)?;
            *conn = Some(connected);
        }
        let conn = conn.as_mut().expect("connected above");
        let payload =
            serde_json::to_string(&held.journal(&self.identity, seq)).expect("serializes");
        let journal = redis_fence::data_key(&held.key, "journal");
        self.fence
            .admit(
                conn,
                &held.key,
                held.token,
                Write::Push {
                    key: &journal,
                    value: &payload,
                },
            )
            .await
            .map(|_| ())
    }
}
