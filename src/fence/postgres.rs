//! Fencing inside PostgreSQL: the function `palisade.fence(key, token)` that a
//! transaction calls before (or after) its protected write, and its Rust caller.
//!
//! The definition is `sql/palisade-fence.sql` (embedded here as [`SQL`]); its header
//! says how the check behaves at each isolation level, which SQLSTATEs it raises, and
//! what a call in autocommit does. Any language uses it with one statement in its
//! transaction, `SELECT palisade.fence($1, $2)`; [`admit`] is that statement with
//! its errors typed.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, Transaction};

use super::Admitted;

/// The shipped definition (`sql/palisade-fence.sql`): schema `palisade`, table
/// `palisade.marks`, function `palisade.fence`. Idempotent and versioned.
pub const SQL: &str = include_str!("../../sql/palisade-fence.sql");
/// The version [`SQL`] installs (recorded in `palisade.version`).
pub const SQL_VERSION: i32 = 1;
/// SQLSTATE of a stale fencing token.
pub const STALE_SQLSTATE: &str = "PF001";
/// Longest key `palisade.fence` accepts, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token is lower than the key's highest admitted token: the caller lost its
    /// Lease to a holder that has written since. Do not retry.
    #[error(
        "write rejected: stale fencing token {token} for key {key:?} is lower than \
         the highest admitted token {highest}"
    )]
    Stale {
        key: String,
        token: u64,
        highest: u64,
    },
    /// A serialization failure or deadlock (SQLSTATE 40001, 40P01): the transaction
    /// was rolled back without a decision. Retry it from the start.
    #[error("fencing check conflicted with a concurrent transaction; retry the transaction")]
    Conflict(#[source] tokio_postgres::Error),
    /// The key or token cannot be fenced (empty key, key over [`MAX_KEY_BYTES`],
    /// token beyond PostgreSQL's bigint).
    #[error("cannot fence: {0}")]
    BadInput(String),
    /// Anything else: connection lost, function not installed, ...
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
/// own transaction: call it on a client with no transaction open).
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
/// postgres::install(&client).await?; // once; idempotent
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

/// The highest admitted token of every key.
pub async fn marks<C: GenericClient + Sync>(client: &C) -> Result<super::Marks, Error> {
    let rows = client
        .query("SELECT key, token FROM palisade.marks ORDER BY key", &[])
        .await
        .map_err(Error::Database)?;
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
    if key.is_empty() {
        return Err(Error::BadInput("the key is empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::BadInput(format!(
            "the key is {} bytes long; the limit is {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    i64::try_from(token).map_err(|_| {
        Error::BadInput(format!(
            "fencing token {token} is beyond PostgreSQL's bigint (at most {})",
            i64::MAX
        ))
    })
}

fn classify(err: tokio_postgres::Error, key: &str, token: u64) -> Error {
    let Some(db) = err.as_db_error() else {
        return Error::Database(err);
    };
    let code = db.code();
    if code.code() == STALE_SQLSTATE {
        #[derive(serde::Deserialize)]
        struct Detail {
            highest: u64,
        }
        // The DETAIL is JSON; the message says the same for people.
        if let Some(detail) = db
            .detail()
            .and_then(|d| serde_json::from_str::<Detail>(d).ok())
        {
            return Error::Stale {
                key: key.to_owned(),
                token,
                highest: detail.highest,
            };
        }
        return Error::Database(err);
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
    }
}
