//! Fencing inside PostgreSQL: the function `palisade.fence(key, token)` that a
//! transaction calls before (or after) its protected write, and its Rust caller.
//!
//! The definition is `sql/palisade-fence.sql` (embedded here as [`SQL`]); its header
//! says how the check behaves at each isolation level, which SQLSTATEs it raises, and
//! what a call in autocommit does. Any language uses it with one statement in its
//! transaction, `SELECT palisade.fence($1, $2)`; [`admit`] is that statement with
//! its errors typed. Installing is a step of its own ([`install`], by a role that
//! may create the schema); the writers' role needs only USAGE on the schema and
//! EXECUTE on the function, and a call never creates anything: a missing install is
//! [`Error::NotInstalled`].
//!
//! # Why it is built this way
//!
//! - *A function in the caller's transaction*, not a trigger or a separate service:
//!   the protected write and the mark commit or roll back together, and every
//!   language calls it with one statement. It takes the mark's row lock (`INSERT ...
//!   ON CONFLICT DO NOTHING` for a new key, else `SELECT ... FOR UPDATE`) so READ
//!   COMMITTED writers queue and the snapshot levels fail with 40001 instead of
//!   comparing against an old mark; the stale SQLSTATE `PF001` is in a class
//!   PostgreSQL leaves to applications. Keys are non-empty and at most 1024 bytes
//!   (well under the btree entry limit); tokens are bigint, so the Rust caller
//!   refuses tokens beyond i64 (palisade's own never are). Autocommit is allowed,
//!   not detected: it is a correct check of its own, it just protects nothing after
//!   it (docs/fences.md says so). The schema is versioned in `palisade.version`; an
//!   older file refuses to overwrite a newer version.
//! - *Installing is explicit* (`palisade fence --store URL --create`, [`install`], or
//!   psql): a fence call runs no DDL. One that did would need a role that may create
//!   the schema on every call, and would recreate a dropped schema empty, admitting
//!   the next stale token as the first. A missing schema or function (3F000, 42883,
//!   42P01) is [`Error::NotInstalled`], which says how to install.
//! - *Schema version 2: `SECURITY DEFINER`.* The function runs with its owner's
//!   rights (`search_path` pinned to `pg_catalog, pg_temp`), PUBLIC has no privilege
//!   on the table, the version or the function, and writers get USAGE and EXECUTE
//!   only: with no DML on `palisade.marks` they cannot lower a mark, which a
//!   `SECURITY INVOKER` function (version 1) could not prevent. The upgrade from 1
//!   moves each role that could write the marks to EXECUTE (so writers keep working)
//!   and revokes its write access; privileges are set only when the schema reaches
//!   version 2, so installing again never undoes an administrator's grants.
//! - *`lock_timeout`.* The row lock makes a fencer wait for any transaction that
//!   fenced the key and has not ended, a paused holder included, so the CLI sets
//!   `lock_timeout` from `--lock-timeout` (at least 1 ms: 0 would mean no bound) and
//!   55P03 is `Error::LockTimeout`, no decision, exit 1.
//! - *What the database decides, stated rather than fixed:* a mark is as durable as
//!   its commit (`synchronous_commit = off`, failover to an asynchronous standby can
//!   lose it); a driver that wraps statements in savepoints (pgjdbc
//!   `autosave=always`, psql `ON_ERROR_ROLLBACK`) turns PF001 into the failure of one
//!   statement, so docs/fences.md recommends the call inside the write's own
//!   statement (`INSERT ... SELECT ... FROM palisade.fence(...)`, `UPDATE ... FROM
//!   palisade.fence(...)`), which `tests/postgres/savepoints.rs` shows commits
//!   nothing stale under both wrappings, while the separate statement's write commits.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, Transaction};

use super::{Admitted, Stale};

/// The shipped definition (`sql/palisade-fence.sql`): schema `palisade`, table
/// `palisade.marks`, function `palisade.fence`. Idempotent and versioned.
pub const SQL: &str = include_str!("../../sql/palisade-fence.sql");
/// The version [`SQL`] installs (recorded in `palisade.version`).
pub const SQL_VERSION: i32 = 2;
/// SQLSTATE of a stale fencing token.
pub const STALE_SQLSTATE: &str = "PF001";
/// Longest key, in bytes of UTF-8: the same for every fence.
pub const MAX_KEY_BYTES: usize = super::MAX_KEY_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token is lower than the key's highest admitted token: the caller lost its
    /// Lease to a holder that has written since. Do not retry.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// A serialization failure or deadlock (SQLSTATE 40001, 40P01): the transaction
    /// was rolled back without a decision. Retry it from the start.
    #[error("fencing check conflicted with a concurrent transaction; retry the transaction")]
    Conflict(#[source] tokio_postgres::Error),
    /// The key or token cannot be fenced (empty key, key over [`MAX_KEY_BYTES`],
    /// token beyond PostgreSQL's bigint).
    #[error("cannot fence: {0}")]
    BadInput(String),
    /// The schema, table or function is missing (SQLSTATE 3F000, 42883, 42P01):
    /// nothing was admitted, and nothing was created. Install it ([`install`]).
    #[error(
        "palisade.fence(text, bigint) is not installed in this database ({reason}); \
         install it once with `palisade fence --store URL --create` or \
         `psql -v ON_ERROR_STOP=1 -f sql/palisade-fence.sql`, as a role that may create \
         the schema"
    )]
    NotInstalled {
        /// The server's words, e.g. `schema "palisade" does not exist`.
        reason: String,
    },
    /// The caller's `lock_timeout` ran out (SQLSTATE 55P03) waiting for the key's mark,
    /// whose row lock another transaction holds until it ends. The transaction was
    /// rolled back without a decision.
    #[error(
        "timed out{} waiting for the mark of key {key:?}: another transaction holds it \
         (a holder paused inside its transaction?)",
        match timeout { Some(t) => format!(" after {t:?}"), None => String::new() }
    )]
    LockTimeout {
        key: String,
        /// The `lock_timeout` in force, when the caller knows it.
        timeout: Option<std::time::Duration>,
    },
    /// Anything else: connection lost, permission denied, ...
    #[error("fencing check in PostgreSQL failed")]
    Database(#[source] tokio_postgres::Error),
}

impl Error {
    /// Whether running the whole transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict(_))
    }
}

/// Installs or upgrades the schema, table and function (runs [`SQL`], which is its
/// own transaction: call it on a client with no transaction open), as a role that
/// may create the schema; it owns what it creates. Once, when setting up, never
/// from the writers: a fence call that installed would recreate a dropped schema
/// empty and admit the next stale token as the first.
pub async fn install(client: &Client) -> Result<(), Error> {
    client.batch_execute(SQL).await.map_err(Error::Database)
}

/// Admits `token` for `key` inside the caller's transaction `tx`, raising the mark;
/// the row lock it takes lasts until `tx` ends, so commit the protected write in
/// the same `tx`. On any error the transaction is aborted: roll it back.
///
/// ```no_run
/// use palisade::fence::postgres::{self, Error};
/// # async fn demo(mut client: tokio_postgres::Client, token: u64) -> Result<(), Error> {
/// // Installed once beforehand (install, or `palisade fence --store URL --create`).
/// let tx = client.transaction().await.map_err(Error::Database)?;
/// postgres::admit(&tx, "ledger", token).await?; // Error::Stale: the lease was lost
/// tx.execute("UPDATE ledger SET balance = balance + 10", &[])
///     .await
///     .map_err(Error::Database)?;
/// tx.commit().await.map_err(Error::Database)?;
/// # Ok(()) }
/// ```
pub async fn admit(tx: &Transaction<'_>, key: &str, token: u64) -> Result<Admitted, Error> {
    admit_with(tx, key, token).await
}

/// [`admit`] on any client, e.g. a [`Client`] in autocommit, where the check is a
/// transaction of its own and protects nothing after it (see `sql/palisade-fence.sql`).
pub async fn admit_with<C: GenericClient + Sync>(
    client: &C,
    key: &str,
    token: u64,
) -> Result<Admitted, Error> {
    let token_sql = validate(key, token)?;
    let row = client
        .query_one("SELECT palisade.fence($1, $2)", &[&key, &token_sql])
        .await
        .map_err(|e| classify(e, key, token))?;
    let previous: Option<i64> = row.try_get(0).map_err(Error::Database)?;
    Ok(Admitted {
        token,
        previous: previous.map(|p| p as u64),
    })
}

/// The highest admitted token of every key (needs SELECT on `palisade.marks`).
pub async fn marks<C: GenericClient + Sync>(client: &C) -> Result<super::Marks, Error> {
    let rows = client
        .query("SELECT key, token FROM palisade.marks ORDER BY key", &[])
        .await
        .map_err(|e| not_installed(e).unwrap_or_else(Error::Database))?;
    rows.iter()
        .map(|row| {
            let token: i64 = row.try_get(1).map_err(Error::Database)?;
            Ok((row.try_get(0).map_err(Error::Database)?, token as u64))
        })
        .collect()
}

/// The checks the function makes too, done first so that a bad key or token never
/// costs a round trip or aborts the caller's transaction.
fn validate(key: &str, token: u64) -> Result<i64, Error> {
    super::check_key_and_token(key, token, "PostgreSQL's bigint").map_err(Error::BadInput)
}

/// The SQLSTATEs of a missing schema, function or table: not installed.
pub(crate) const NOT_INSTALLED: [SqlState; 3] = [
    SqlState::INVALID_SCHEMA_NAME,
    SqlState::UNDEFINED_FUNCTION,
    SqlState::UNDEFINED_TABLE,
];

/// A missing schema, function or table, as [`Error::NotInstalled`].
fn not_installed(err: tokio_postgres::Error) -> Result<Error, tokio_postgres::Error> {
    match err.as_db_error() {
        Some(db) if NOT_INSTALLED.contains(db.code()) => Ok(Error::NotInstalled {
            reason: db.message().to_owned(),
        }),
        _ => Err(err),
    }
}

/// A PF001's refusal, read from its DETAIL (JSON; the message says the same for
/// people). `None` for another error, or a DETAIL that does not parse.
pub(crate) fn stale_of(
    db: &tokio_postgres::error::DbError,
    key: &str,
    token: u64,
) -> Option<Stale> {
    #[derive(serde::Deserialize)]
    struct Detail {
        highest: u64,
    }
    if db.code().code() != STALE_SQLSTATE {
        return None;
    }
    let detail = serde_json::from_str::<Detail>(db.detail()?).ok()?;
    Some(Stale {
        key: key.to_owned(),
        token,
        highest: detail.highest,
    })
}

fn classify(err: tokio_postgres::Error, key: &str, token: u64) -> Error {
    let err = match not_installed(err) {
        Ok(not_installed) => return not_installed,
        Err(err) => err,
    };
    let Some(db) = err.as_db_error() else {
        return Error::Database(err);
    };
    let code = db.code();
    if *code == SqlState::LOCK_NOT_AVAILABLE {
        return Error::LockTimeout {
            key: key.to_owned(),
            timeout: None,
        };
    }
    if code.code() == STALE_SQLSTATE {
        return match stale_of(db, key, token) {
            Some(stale) => Error::Stale(stale),
            None => Error::Database(err),
        };
    }
    if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED {
        return Error::Conflict(err);
    }
    if *code == SqlState::INVALID_PARAMETER_VALUE || *code == SqlState::NULL_VALUE_NOT_ALLOWED {
        return Error::BadInput(db.message().to_owned());
    }
    Error::Database(err)
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
            matches!(validate("k", i64::MAX as u64 + 1), Err(Error::BadInput(m)) if m.contains("bigint"))
        );
        assert_eq!(validate("k", i64::MAX as u64).unwrap(), i64::MAX);
    }

    #[test]
    fn the_embedded_sql_is_the_versioned_definition() {
        assert!(SQL.contains("CREATE OR REPLACE FUNCTION palisade.fence(key text, token bigint)"));
        assert!(SQL.contains(&format!("ERRCODE = '{STALE_SQLSTATE}'")));
        assert!(SQL.contains(&format!("> {MAX_KEY_BYTES}")));
        assert!(SQL.contains(&format!("VALUES ({SQL_VERSION})")));
        assert!(SQL.contains("SECURITY DEFINER"));
        assert!(SQL.contains("REVOKE ALL ON FUNCTION palisade.fence(text, bigint) FROM PUBLIC"));
    }

    #[test]
    fn a_lock_timeout_names_the_key_and_the_wait_when_known() {
        let error = |timeout| Error::LockTimeout {
            key: "payments/billing".into(),
            timeout,
        };
        assert_eq!(
            error(Some(std::time::Duration::from_secs(5))).to_string(),
            "timed out after 5s waiting for the mark of key \"payments/billing\": another \
             transaction holds it (a holder paused inside its transaction?)"
        );
        assert!(
            error(None)
                .to_string()
                .starts_with("timed out waiting for the mark of key \"payments/billing\"")
        );
    }
}
