//! Fencing inside MySQL and MariaDB (InnoDB): the function `palisade.fence(key,
//! token)` that a transaction calls in (or before) its protected write, and its Rust
//! caller. The contract of `palisade::fence::postgres`: a token at least the key's
//! mark is admitted and raises it, a lower one is refused with SQLSTATE `PF001`.
//!
//! The definition is `sql/palisade-fence-mysql.sql` (embedded here as [`SQL`]); its
//! header says how the check behaves at each isolation level, which errors it raises,
//! and what a server with a binary log needs to install it. [`admit`] is the one
//! statement `SELECT palisade.fence(?, ?)` with its errors typed; [`install`] is a
//! step of its own, by an account that may create the database `palisade`.
//!
//! # Why it is built this way
//!
//! - *An error ends the statement, not the transaction.* MySQL and MariaDB roll back
//!   only the statement in which a function SIGNALs; the transaction stays open and a
//!   program that ignores the error can still commit its other writes (PostgreSQL
//!   aborts the whole transaction). So [`admit`] itself rolls the transaction back on
//!   any error from the server and leaves the connection in a READ ONLY transaction:
//!   a write attempted after ignoring the error fails (error 1792), as it would in
//!   PostgreSQL's aborted transaction, instead of committing. And docs/fences.md
//!   recommends the call inside the write's own statement (`INSERT ... SELECT ...
//!   WHERE COALESCE(palisade.fence(?, ?), 0) >= 0`), where a stale token fails the
//!   write itself whatever the program does next; `tests/mysql/statements.rs` shows
//!   both forms.
//! - *A locking read.* The function reads the mark with `SELECT ... FOR UPDATE`, which
//!   in InnoDB reads the latest committed row and locks it until the transaction
//!   ends, so at REPEATABLE READ (the default) a fencer compares against the mark the
//!   previous holder committed, not its snapshot's, and concurrent fencers of a key
//!   queue. A plain read there would admit a stale token whose snapshot predates the
//!   newer mark. A new key's first mark is inserted; two first fencers of one key may
//!   deadlock on the gap lock (1213, [`Error::Conflict`], retry).
//! - *`SQL SECURITY DEFINER`*: writers get EXECUTE on the function only, and with no
//!   DML on `palisade.marks` cannot lower a mark. The function is declared honestly
//!   `NOT DETERMINISTIC MODIFIES SQL DATA`, so with a binary log the server must allow
//!   it (`log_bin_trust_function_creators`), which the install error then says.
//! - *Installing is explicit* and never part of a fence call (a call that created the
//!   database would start a deleted one over and admit a stale token as the first):
//!   a missing database, table or function (1049, 1146, 1305) is
//!   [`Error::NotInstalled`]. The file runs in the `mariadb` client as it is
//!   (`DELIMITER //`), so [`install`] splits it the same way; it is versioned in
//!   `palisade.version` and refuses to replace a newer version.
//! - *Keys* are stored as `VARBINARY(1024)`, the key's UTF-8 bytes compared byte for
//!   byte (no collation folds two keys into one); tokens as `BIGINT`, so tokens
//!   beyond i64 are refused before any round trip. The stale message is cut to the
//!   128 characters SIGNAL allows, the highest mark before the key, and is parsed back
//!   into [`Stale`].
//! - *Lock waits*: InnoDB's `innodb_lock_wait_timeout` is whole seconds, so the CLI
//!   rounds `--lock-timeout` up; 1205 is [`Error::LockTimeout`]. Installing again
//!   replaces the function, which needs its metadata lock: it waits for every open
//!   transaction that called the function, and new calls queue behind it. A
//!   transaction waiting on a fencer that waits on the install would hang for
//!   `lock_wait_timeout` (a day by default; `tests/mysql` met it), so the file bounds
//!   the install's wait to 10 s.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction};

use super::{Admitted, Stale};

/// The shipped definition (`sql/palisade-fence-mysql.sql`): database `palisade`,
/// tables `palisade.marks` and `palisade.version`, function `palisade.fence`.
pub const SQL: &str = include_str!("../../sql/palisade-fence-mysql.sql");
/// The version [`SQL`] installs (recorded in `palisade.version`).
pub const SQL_VERSION: i32 = 1;
/// SQLSTATE of a stale fencing token.
pub const STALE_SQLSTATE: &str = "PF001";
/// Longest key, in bytes of UTF-8: the same for every fence.
pub const MAX_KEY_BYTES: usize = super::MAX_KEY_BYTES;

/// Server errors that mean the database, a table or the function is missing.
const NOT_INSTALLED_CODES: [u16; 3] = [1049, 1146, 1305];
/// `ER_LOCK_WAIT_TIMEOUT`.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK`.
const DEADLOCK: u16 = 1213;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token is lower than the key's highest admitted token: the caller lost its
    /// Lease to a holder that has written since. Do not retry.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// A deadlock or serialization failure (1213, SQLSTATE 40001): the transaction
    /// was rolled back without a decision. Retry it from the start.
    #[error("fencing check conflicted with a concurrent transaction; retry the transaction")]
    Conflict(#[source] mysql_async::Error),
    /// The key or token cannot be fenced (empty key, key over [`MAX_KEY_BYTES`],
    /// token beyond BIGINT).
    #[error("cannot fence: {0}")]
    BadInput(String),
    /// The database, table or function is missing: nothing was admitted, and nothing
    /// was created. Install it ([`install`]).
    #[error(
        "palisade.fence is not installed in this server ({reason}); install it once with \
         `palisade fence --store URL --create` or `mariadb < sql/palisade-fence-mysql.sql`, \
         as an account that may create the database palisade"
    )]
    NotInstalled {
        /// The server's words, e.g. `FUNCTION palisade.fence does not exist`.
        reason: String,
    },
    /// `innodb_lock_wait_timeout` ran out (1205) waiting for the key's mark, whose row
    /// lock another transaction holds until it ends.
    #[error(
        "timed out{} waiting for the mark of key {key:?}: another transaction holds it \
         (a holder paused inside its transaction?)",
        match timeout { Some(t) => format!(" after {t:?}"), None => String::new() }
    )]
    LockTimeout {
        key: String,
        /// The wait in force, when the caller knows it.
        timeout: Option<std::time::Duration>,
    },
    /// Anything else: connection lost, access denied, ...
    #[error("fencing check in MySQL failed")]
    Mysql(#[source] mysql_async::Error),
}

impl Error {
    /// Whether running the whole transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict(_))
    }

    /// The server error code, when the server answered with one.
    pub fn server_code(&self) -> Option<u16> {
        match self {
            Error::Conflict(mysql_async::Error::Server(e))
            | Error::Mysql(mysql_async::Error::Server(e)) => Some(e.code),
            _ => None,
        }
    }
}

/// Installs or upgrades the database, tables and function: runs [`SQL`] statement by
/// statement on `conn` (DDL commits implicitly: no transaction may be open), as an
/// account that may create the database `palisade` and routines in it; it becomes the
/// function's definer. Once, when setting up, never from the writers.
pub async fn install(conn: &mut Conn) -> Result<(), Error> {
    for statement in statements(SQL) {
        if let Err(e) = conn.query_drop(statement).await {
            // The installers' lock is the session's: free it for the next installer,
            // and give the session its settings back (best effort: a broken
            // connection has neither).
            let _ = conn.query_drop("DO RELEASE_LOCK('palisade.install')").await;
            let _ = conn
                .query_drop(
                    "SET SESSION sql_mode = COALESCE(@palisade_caller_sql_mode, @@sql_mode), \
                     lock_wait_timeout = COALESCE(@palisade_caller_lock_wait_timeout, \
                     @@lock_wait_timeout)",
                )
                .await;
            return Err(Error::Mysql(e));
        }
    }
    Ok(())
}

/// The statements of a script written for the `mariadb` client: `DELIMITER` lines
/// switch the terminator, whole-line `--` comments are dropped.
fn statements(script: &str) -> Vec<String> {
    let mut delimiter = ";".to_owned();
    let mut statements = Vec::new();
    let mut current = String::new();
    for line in script.lines() {
        let trimmed = line.trim();
        if let Some(new) = trimmed
            .get(..10)
            .filter(|head| head.eq_ignore_ascii_case("DELIMITER "))
            .map(|_| trimmed[10..].trim())
        {
            delimiter = new.to_owned();
            continue;
        }
        if trimmed.starts_with("--") || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix(delimiter.as_str()) {
            Some(last) => {
                current.push_str(last);
                statements.push(std::mem::take(&mut current).trim().to_owned());
            }
            None => {
                current.push_str(line);
                current.push('\n');
            }
        }
    }
    statements.retain(|s| !s.is_empty());
    statements
}

/// Admits `token` for `key` inside the caller's transaction `tx`, raising the mark;
/// the row lock it takes lasts until `tx` ends, so commit the protected write in the
/// same `tx`. On an error from the server the transaction has been rolled back and a
/// READ ONLY one begun in its place (MySQL would otherwise end only the statement):
/// whatever `tx` then writes fails, and committing it commits nothing.
///
/// ```no_run
/// use mysql_async::prelude::Queryable;
/// use palisade::fence::mysql::{self, Error};
/// # async fn demo(mut conn: mysql_async::Conn, token: u64) -> Result<(), Error> {
/// // Installed once beforehand (install, or `palisade fence --store URL --create`).
/// let mut tx = conn.start_transaction(Default::default()).await.map_err(Error::Mysql)?;
/// mysql::admit(&mut tx, "ledger", token).await?; // Error::Stale: the lease was lost
/// tx.query_drop("UPDATE ledger SET balance = balance + 10").await.map_err(Error::Mysql)?;
/// tx.commit().await.map_err(Error::Mysql)?;
/// # Ok(()) }
/// ```
pub async fn admit(tx: &mut Transaction<'_>, key: &str, token: u64) -> Result<Admitted, Error> {
    let token_sql = validate(key, token)?;
    match call(tx, key, token, token_sql).await {
        Err((error, true)) => {
            // Best effort: a broken connection has ended the transaction anyway.
            let _ = tx.query_drop("ROLLBACK; START TRANSACTION READ ONLY").await;
            Err(error)
        }
        result => result.map_err(|(error, _)| error),
    }
}

/// [`admit`] on any connection and without the rollback, e.g. a [`Conn`] in
/// autocommit, where the check is a transaction of its own and protects nothing
/// after it (see `sql/palisade-fence-mysql.sql`).
pub async fn admit_with<Q: Queryable>(
    conn: &mut Q,
    key: &str,
    token: u64,
) -> Result<Admitted, Error> {
    let token_sql = validate(key, token)?;
    call(conn, key, token, token_sql)
        .await
        .map_err(|(error, _)| error)
}

/// The call; the error says whether the server answered it (and so the statement,
/// not the transaction, was rolled back).
async fn call<Q: Queryable>(
    conn: &mut Q,
    key: &str,
    token: u64,
    token_sql: i64,
) -> Result<Admitted, (Error, bool)> {
    let row: Option<Option<i64>> = conn
        .exec_first("SELECT palisade.fence(?, ?)", (key, token_sql))
        .await
        .map_err(|e| {
            let answered = matches!(e, mysql_async::Error::Server(_));
            (classify(e, key, token), answered)
        })?;
    Ok(Admitted {
        token,
        previous: row.flatten().map(|p| p as u64),
    })
}

/// The highest admitted token of every key (needs SELECT on `palisade.marks`).
pub async fn marks<Q: Queryable>(conn: &mut Q) -> Result<super::Marks, Error> {
    let rows: Vec<(Vec<u8>, i64)> = conn
        .query("SELECT `key`, token FROM palisade.marks ORDER BY `key`")
        .await
        .map_err(|e| not_installed(e).unwrap_or_else(Error::Mysql))?;
    Ok(rows
        .into_iter()
        .map(|(key, token)| (String::from_utf8_lossy(&key).into_owned(), token as u64))
        .collect())
}

/// The checks the function makes too, done first so that a bad key or token never
/// costs a round trip or ends the caller's transaction.
fn validate(key: &str, token: u64) -> Result<i64, Error> {
    super::check_key_and_token(key, token, "MySQL's BIGINT").map_err(Error::BadInput)
}

fn not_installed(err: mysql_async::Error) -> Result<Error, mysql_async::Error> {
    match &err {
        mysql_async::Error::Server(e) if NOT_INSTALLED_CODES.contains(&e.code) => {
            Ok(Error::NotInstalled {
                reason: e.message.clone(),
            })
        }
        _ => Err(err),
    }
}

fn classify(err: mysql_async::Error, key: &str, token: u64) -> Error {
    let err = match not_installed(err) {
        Ok(not_installed) => return not_installed,
        Err(err) => err,
    };
    let mysql_async::Error::Server(server) = &err else {
        return Error::Mysql(err);
    };
    if server.state == STALE_SQLSTATE {
        return match stale_highest(&server.message, token) {
            Some(highest) => Error::Stale(Stale {
                key: key.to_owned(),
                token,
                highest,
            }),
            None => Error::Mysql(err),
        };
    }
    match (server.code, server.state.as_str()) {
        (LOCK_WAIT_TIMEOUT, _) => Error::LockTimeout {
            key: key.to_owned(),
            timeout: None,
        },
        (DEADLOCK, _) | (_, "40001") => Error::Conflict(err),
        (_, "22023" | "22004") => Error::BadInput(server.message.clone()),
        _ => Error::Mysql(err),
    }
}

/// The highest mark in the PF001 message, which names it before the (possibly cut) key.
fn stale_highest(message: &str, token: u64) -> Option<u64> {
    let rest = message.strip_prefix(&format!(
        "stale fencing token {token} is below the highest admitted "
    ))?;
    let digits = rest.split(',').next()?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_refused_before_any_round_trip() {
        assert!(matches!(validate("", 1), Err(Error::BadInput(m)) if m.contains("empty")));
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(validate(&long, 1), Err(Error::BadInput(m)) if m.contains("1025 bytes")));
        assert!(validate(&"k".repeat(MAX_KEY_BYTES), 1).is_ok());
        assert!(
            matches!(validate("k", i64::MAX as u64 + 1), Err(Error::BadInput(m)) if m.contains("BIGINT"))
        );
        assert_eq!(validate("k", i64::MAX as u64).unwrap(), i64::MAX);
    }

    #[test]
    fn the_embedded_sql_is_the_versioned_definition() {
        assert!(SQL.contains("CREATE OR REPLACE FUNCTION palisade.fence("));
        assert!(SQL.contains(&format!("SIGNAL SQLSTATE '{STALE_SQLSTATE}'")));
        assert!(SQL.contains(&format!("> {MAX_KEY_BYTES} THEN")));
        assert!(SQL.contains(&format!("VALUES (1, {SQL_VERSION})")));
        assert!(SQL.contains("SQL SECURITY DEFINER"));
        assert!(SQL.contains("FOR UPDATE"));
    }

    #[test]
    fn the_script_splits_as_the_mariadb_client_would() {
        let statements = statements(SQL);
        assert!(
            statements
                .iter()
                .all(|s| !s.ends_with("//") && !s.is_empty())
        );
        // The caller's lock wait is saved and bounded before anything waits on a lock.
        assert!(statements[0].starts_with("SET @palisade_caller_lock_wait_timeout"));
        assert_eq!(statements[1], "SET SESSION lock_wait_timeout = 10");
        assert!(statements[2].starts_with("CREATE DATABASE IF NOT EXISTS palisade"));
        let function = statements
            .iter()
            .find(|s| s.starts_with("CREATE OR REPLACE FUNCTION"))
            .expect("the function");
        assert!(function.ends_with("END"), "one statement, body included");
        assert!(function.contains("RETURN current;"));
        assert_eq!(
            statements.last().map(String::as_str),
            Some("DO RELEASE_LOCK('palisade.install')")
        );
    }

    #[test]
    fn the_highest_mark_is_read_back_from_the_message_even_with_a_cut_key() {
        let message = "stale fencing token 33 is below the highest admitted 34, key \"bil...";
        assert_eq!(stale_highest(message, 33), Some(34));
        assert_eq!(stale_highest(message, 32), None);
        assert_eq!(stale_highest("something else", 33), None);
    }
}
