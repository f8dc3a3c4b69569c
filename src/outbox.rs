//! The fenced outbox: for an external API that cannot check a fencing token (a
//! payment provider's, a card network's) but deduplicates requests by an idempotency
//! key. The holder of a Lease inserts its intent with [`enqueue`] in the transaction
//! of its fenced write; a relay holding a Lease of its own ([`relay::run`], `palisade
//! outbox relay`) delivers each intent over HTTP with `Idempotency-Key: <intent id>`
//! and records the provider's answer. The definition is `sql/palisade-outbox.sql`
//! ([`SQL`]), installed after `sql/palisade-fence.sql`; its header lists the
//! functions, the states and the privileges.
//!
//! # What it promises
//!
//! - *No intent of a stale holder is ever inserted.* `palisade.enqueue` calls
//!   `palisade.fence(key, token)` before its insert, in the caller's transaction: a
//!   stale token raises PF001 ([`Error::Stale`]), which aborts that transaction with
//!   the holder's other writes.
//! - *The provider executes each intent once; delivery is at least once.* A relay
//!   may die after the provider executed an intent and before the answer was
//!   recorded, so the next relay sends it again: exactly once is the provider's
//!   deduplication by key, and the outbox's part is that every request for one intent
//!   carries the same key. That is why the key is the intent's id and never the
//!   relay's token: a relay paused past its Lease and its successor must send the
//!   same key, or the provider would see two different operations.
//! - *A stale relay records nothing.* `palisade.outbox_claim` and
//!   `palisade.outbox_record` fence the relay's own key and token, so once a successor
//!   has claimed, an answer the old relay got late (its own request, executed or
//!   replayed) is refused, and cannot overwrite the successor's or mark an intent
//!   delivered or rejected on its say. Without it a paused relay could, for example,
//!   record a 4xx it received before a provider fix as the final answer after its
//!   successor's retry succeeded.
//! - *Never given up silently.* A 2xx is `delivered`; a 5xx, 408, 409, 425, 429, a
//!   timeout or a failed connection leaves the intent `pending` and retried with
//!   capped exponential backoff ([`relay::Backoff`]) for as long as it takes; any other
//!   answer (a 4xx: the provider refuses the request itself) is `rejected`, recorded
//!   with the provider's body, and never retried, since the same key and payload get
//!   the same answer. The state, attempts and last answer are in `palisade.outbox`.
//!
//! The relay's Lease is what keeps two relays from hammering the provider at once;
//! the fence on its records is what makes a mistaken belief of holding it harmless.

mod delivery;
pub mod relay;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Transaction};

use crate::fence::Stale;
use crate::fence::postgres::{self, STALE_SQLSTATE};

pub use delivery::Answer;

/// The shipped definition (`sql/palisade-outbox.sql`): table `palisade.outbox`,
/// functions `palisade.enqueue`, `palisade.outbox_claim`, `palisade.outbox_record`.
/// Idempotent and versioned; needs `sql/palisade-fence.sql` (version 2) first.
pub const SQL: &str = include_str!("../sql/palisade-outbox.sql");
/// The version [`SQL`] installs (recorded in `palisade.outbox_version`).
pub const SQL_VERSION: i32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token is lower than the key's highest admitted token: the caller lost its
    /// Lease. Nothing was inserted or recorded, and the transaction is aborted.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// A serialization failure or deadlock (SQLSTATE 40001, 40P01): retry the
    /// transaction from the start.
    #[error("the outbox call conflicted with a concurrent transaction; retry the transaction")]
    Conflict(#[source] tokio_postgres::Error),
    /// The key, token or payload cannot be used (empty key, key over 1024 bytes,
    /// token beyond bigint).
    #[error("cannot use the outbox: {0}")]
    BadInput(String),
    /// The outbox (or the fence it needs) is not installed in this database.
    #[error(
        "the palisade outbox is not installed in this database ({reason}); install \
         sql/palisade-fence.sql and then sql/palisade-outbox.sql (`palisade fence --store \
         URL --create`, then `palisade outbox install --store URL`), as a role that may \
         create the schema"
    )]
    NotInstalled { reason: String },
    /// Anything else: connection lost, permission denied, ...
    #[error("outbox call in PostgreSQL failed")]
    Database(#[source] tokio_postgres::Error),
}

/// Installs or upgrades the outbox (runs [`SQL`], its own transaction), as the role
/// that installed `palisade.fence`. Refused (SQLSTATE 55000, [`Error::NotInstalled`])
/// when the fence's schema version 2 is not installed; a failed install changes nothing.
pub async fn install(client: &Client) -> Result<(), Error> {
    let installed = client.batch_execute(SQL).await;
    if installed.is_err() {
        // The file's own transaction is left open and aborted: end it, so that the
        // connection stays usable.
        let _ = client.batch_execute("ROLLBACK").await;
    }
    installed.map_err(|e| match e.as_db_error() {
        Some(db) if *db.code() == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => {
            Error::NotInstalled {
                reason: db.message().to_owned(),
            }
        }
        _ => Error::Database(e),
    })
}

/// Inserts an intent in the caller's transaction `tx`, after fencing `key` with
/// `token` there, and returns its id: the idempotency key the relay will send. Commit
/// `tx` with the write it goes with. On any error the transaction is aborted.
///
/// ```no_run
/// use palisade::outbox::{self, Error};
/// # async fn demo(mut client: tokio_postgres::Client, token: u64) -> Result<(), Error> {
/// let tx = client.transaction().await.map_err(Error::Database)?;
/// tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[])
///     .await
///     .map_err(Error::Database)?;
/// let payment = serde_json::json!({"order": 42, "amount": 1000, "currency": "EUR"});
/// let id = outbox::enqueue(&tx, "shop/payments", token, &payment).await?; // Stale: lost the lease
/// tx.commit().await.map_err(Error::Database)?;
/// # let _ = id; Ok(()) }
/// ```
pub async fn enqueue(
    tx: &Transaction<'_>,
    key: &str,
    token: u64,
    payload: &serde_json::Value,
) -> Result<String, Error> {
    let token_sql = validate(key, token)?;
    let payload = payload.to_string();
    let row = tx
        .query_one(
            "SELECT palisade.enqueue($1, $2, $3::text::jsonb)::text",
            &[&key, &token_sql, &payload],
        )
        .await
        .map_err(|e| classify(e, key, token))?;
    row.try_get(0).map_err(Error::Database)
}

/// The checks `palisade.fence` makes, done first so that bad input never costs a
/// round trip or aborts the caller's transaction.
fn validate(key: &str, token: u64) -> Result<i64, Error> {
    crate::fence::check_key_and_token(key, token, "PostgreSQL's bigint").map_err(Error::BadInput)
}

/// What an error of an outbox function means: stale (PF001, its DETAIL JSON),
/// not installed, a conflict, bad input, or anything else.
fn classify(err: tokio_postgres::Error, key: &str, token: u64) -> Error {
    let Some(db) = err.as_db_error() else {
        return Error::Database(err);
    };
    let code = db.code();
    if postgres::NOT_INSTALLED.contains(code) {
        return Error::NotInstalled {
            reason: db.message().to_owned(),
        };
    }
    if code.code() == STALE_SQLSTATE {
        return match postgres::stale_of(db, key, token) {
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

/// An error and its sources, `outer: inner: ...`.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::MAX_KEY_BYTES;

    #[test]
    fn bad_input_is_refused_before_any_round_trip() {
        assert!(matches!(validate("", 1), Err(Error::BadInput(m)) if m.contains("empty")));
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(validate(&long, 1), Err(Error::BadInput(m)) if m.contains("1025 bytes")));
        assert!(
            matches!(validate("k", i64::MAX as u64 + 1), Err(Error::BadInput(m)) if m.contains("bigint"))
        );
        assert_eq!(validate("k", 7).unwrap(), 7);
    }

    #[test]
    fn the_embedded_sql_fences_before_it_inserts_or_records() {
        let enqueue = SQL
            .split("CREATE OR REPLACE FUNCTION palisade.enqueue(")
            .nth(1)
            .unwrap();
        let fence_at = enqueue.find("PERFORM palisade.fence(").unwrap();
        assert!(fence_at < enqueue.find("INSERT INTO palisade.outbox").unwrap());
        for function in ["outbox_claim", "outbox_record"] {
            let body = SQL
                .split(&format!("CREATE OR REPLACE FUNCTION palisade.{function}("))
                .nth(1)
                .unwrap();
            let fence_at = body.find("PERFORM palisade.fence(").unwrap();
            assert!(
                fence_at < body.find("UPDATE palisade.outbox").unwrap(),
                "{function}"
            );
        }
        assert!(SQL.contains(&format!("VALUES ({SQL_VERSION})")));
    }
}
