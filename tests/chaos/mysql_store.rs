//! MariaDB as a fenced store in the chaos run, beside PostgreSQL and Redis
//! (dbstores.rs starts it with them, through databases.sh, and restarts it as a
//! fault: SIGKILL, then crash recovery on the same data).
//!
//! Workers write as [`APP_ROLE`], with only the grants docs/fences.md documents
//! (EXECUTE on `palisade.fence`, INSERT on their own table); the admin installs the
//! fence once at set-up and reads the journal. The commit order is the ids of
//! `chaos.writes`: drawn by the insert after `palisade.fence`, under the mark's row
//! lock, which InnoDB holds until commit, so per key the ids follow the commits.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, TxOpts};
use palisade::fence::mysql::{self as my_fence, Error as MyError};

use crate::history::{JournalWrite, Outcome};

pub const MYSQL_PORT: u16 = 25306;
/// How workers learn the URL (environment, so the worker's arguments stay as they are).
pub const MYSQL_ENV: &str = "PALISADE_CHAOS_MYSQL";
/// The least-privilege account the workers write as.
pub const APP_ROLE: &str = "palisade_chaos_app";

/// The workers' URL: the least-privilege account.
pub fn url() -> String {
    format!("mysql://{APP_ROLE}@127.0.0.1:{MYSQL_PORT}/")
}

/// The administrator: installs, reads the journal.
fn admin_url() -> String {
    format!("mysql://root@127.0.0.1:{MYSQL_PORT}/")
}

async fn connect(url: &str) -> Result<Conn, String> {
    let opts = Opts::from_url(url).map_err(|e| format!("MySQL URL {url}: {e}"))?;
    Conn::new(opts)
        .await
        .map_err(|e| format!("connecting to MariaDB at {url}: {e}"))
}

/// The fence installed, the journal table created, and the workers' account granted
/// what docs/fences.md documents, nothing more (the server is fresh: databases.sh up).
pub async fn set_up() -> Result<(), String> {
    let mut conn = connect(&admin_url()).await?;
    my_fence::install(&mut conn)
        .await
        .map_err(|e| format!("installing palisade.fence in MariaDB: {e:?}"))?;
    let statements = [
        "CREATE DATABASE IF NOT EXISTS chaos".to_string(),
        "CREATE TABLE IF NOT EXISTS chaos.writes (
           id BIGINT AUTO_INCREMENT PRIMARY KEY, lease VARCHAR(255) NOT NULL,
           slot INT NOT NULL DEFAULT 0, token BIGINT NOT NULL, worker VARCHAR(255) NOT NULL, seq BIGINT NOT NULL)
         ENGINE=InnoDB"
            .to_string(),
        format!("CREATE USER IF NOT EXISTS '{APP_ROLE}'@'127.0.0.1'"),
        format!("GRANT EXECUTE ON FUNCTION palisade.fence TO '{APP_ROLE}'@'127.0.0.1'"),
        format!("GRANT INSERT ON chaos.writes TO '{APP_ROLE}'@'127.0.0.1'"),
    ];
    for statement in statements {
        conn.query_drop(&statement)
            .await
            .map_err(|e| format!("MariaDB set-up {statement:?}: {e}"))?;
    }
    conn.disconnect().await.map_err(|e| e.to_string())
}

/// The commit order of `chaos.writes`.
pub async fn journal() -> Result<Vec<JournalWrite>, String> {
    let mut conn = connect(&admin_url()).await?;
    let rows: Vec<(String, i32, i64, String, i64)> = conn
        .query("SELECT lease, slot, token, worker, seq FROM chaos.writes ORDER BY id")
        .await
        .map_err(|e| format!("reading chaos.writes in MariaDB: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|(lease, slot, token, worker, seq)| JournalWrite {
            lease,
            slot,
            token: token as u64,
            worker,
            seq: seq as u64,
        })
        .collect())
}

/// A worker's connection; reconnects after a failure.
pub struct Writer {
    url: String,
    conn: Option<Conn>,
}

impl Writer {
    /// From the environment the harness sets; `None` when it set none.
    pub fn from_env() -> Option<Self> {
        Some(Writer {
            url: std::env::var(MYSQL_ENV).ok()?,
            conn: None,
        })
    }

    /// One fenced write of `write` under fence key `key`: its outcome and, when not
    /// accepted, why.
    pub async fn write(
        &mut self,
        key: &str,
        write: &JournalWrite,
        timeout: Duration,
    ) -> (Outcome, String) {
        match tokio::time::timeout(timeout, self.try_write(key, write)).await {
            Ok(Ok(())) => (Outcome::Accepted, String::new()),
            Ok(Err(WriteError::Fence(e @ MyError::Stale(_)))) => (Outcome::Stale, e.to_string()),
            Ok(Err(e)) => {
                self.conn = None;
                (Outcome::Error, e.to_string())
            }
            Err(_) => {
                self.conn = None;
                (Outcome::Error, "timed out".into())
            }
        }
    }

    async fn try_write(&mut self, key: &str, write: &JournalWrite) -> Result<(), WriteError> {
        if self.conn.is_none() {
            self.conn = Some(connect(&self.url).await.map_err(WriteError::Other)?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|e| WriteError::Other(e.to_string()))?;
        my_fence::admit(&mut tx, key, write.token)
            .await
            .map_err(WriteError::Fence)?;
        tx.exec_drop(
            "INSERT INTO chaos.writes (lease, slot, token, worker, seq) VALUES (?, ?, ?, ?, ?)",
            (
                &write.lease,
                write.slot,
                write.token as i64,
                &write.worker,
                write.seq as i64,
            ),
        )
        .await
        .map_err(|e| WriteError::Other(e.to_string()))?;
        tx.commit()
            .await
            .map_err(|e| WriteError::Other(e.to_string()))
    }
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Fence(MyError),
    #[error("{0}")]
    Other(String),
}
