//! The relay (`palisade outbox relay`): holds a Lease of its own and, while the grant
//! is held, claims due intents, POSTs each to the provider with its idempotency key
//! and records the answer, every claim and record fenced by the grant's token.
//!
//! - *One relay delivers at a time* because it holds the Lease; standbys wait in the
//!   Lease's queue. The Lease only keeps relays from working at once, it does not
//!   make a late one harmless: the fence on `outbox_claim`/`outbox_record` does. The
//!   first claim of a new holder raises the relay key's mark, after which a paused
//!   predecessor's records are refused (PF001), and it takes over the intents the
//!   predecessor had in flight at once (their claims carry a lower token).
//! - *Delivery stops the moment the grant is lost*: the work is raced against
//!   [`Grant::lost`] and dropped with its requests in flight, and each POST is sent only
//!   while [`Grant::is_held`] (read on the clock, so right even just after a pause).
//!   A request already sent may still reach the provider: its key makes that harmless.
//! - *Retries*: an intent without a final answer is retried after
//!   [`Backoff::after`] its attempts, capped, forever (the state machine is the SQL's).
//!   The database being unreachable is retried with the same backoff while the grant
//!   is held; a missing install or bad input ends the relay.
//! - *Every claim and record is one statement* (the answers that arrived together
//!   are recorded by one, in one commit): the relay never holds its key's mark locked
//!   across round trips, so a relay stopped mid-batch cannot block its successor.
//! - *Polling*, every [`RelayConfig::poll`] when nothing is due: one cheap
//!   transaction, and a relay that needs no trigger or notification channel.

use std::convert::Infallible;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::Uri;
use tokio_postgres::{Client, NoTls};
use tracing::{debug, info, warn};

use super::delivery::{Answer, Deliverer};
use super::{Error, classify, error_chain};
use crate::client::{AcquireOptions, Grant, LeaseClient, PodBinding};

/// Capped exponential backoff: `initial`, doubled per attempt, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait before the next attempt, after `attempts` attempts (1 for the first).
    pub fn after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(32);
        self.initial
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
    }
}

/// What a relay does and where.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The outbox's PostgreSQL, `postgres://...`.
    pub store: String,
    /// The relay's own Lease (created if missing, with `lease_duration`).
    pub lease: String,
    pub lease_duration: Duration,
    /// The fence key of the relay's claims and records (the CLI's default:
    /// `<namespace>/<lease>`).
    pub key: String,
    /// Holder identity of the relay's claim (default: the pod name, else the host name).
    pub identity: Option<String>,
    /// Where each intent is POSTed.
    pub endpoint: Uri,
    /// Intents claimed, and delivered concurrently, at a time.
    pub batch: u32,
    /// The deadline of one delivery (connect, send, answer).
    pub timeout: Duration,
    pub backoff: Backoff,
    /// How often to look for due intents when there were none.
    pub poll: Duration,
}

/// Why the relay stopped (other than being asked to).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("cannot set up the HTTP client: {0}")]
    Http(#[source] std::io::Error),
    #[error("cannot create the relay's lease {lease}: {source}")]
    Lease {
        lease: String,
        #[source]
        source: crate::client::Error,
    },
    #[error(transparent)]
    Outbox(#[from] Error),
}

/// Runs the relay until `shutdown` completes (then releases its grant) or a fatal
/// error. Lost grants and stale refusals are not errors: it acquires again.
pub async fn run(
    leases: &LeaseClient,
    config: &RelayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RelayError> {
    let deliverer =
        Deliverer::new(config.endpoint.clone(), config.timeout).map_err(RelayError::Http)?;
    let lease = config.lease.as_str();
    leases
        .ensure_lease(lease, config.lease_duration.as_secs().max(1) as i64)
        .await
        .map_err(|source| RelayError::Lease {
            lease: lease.to_owned(),
            source,
        })?;
    tokio::pin!(shutdown);
    loop {
        let grant = tokio::select! {
            () = &mut shutdown => return Ok(()),
            grant = acquire(leases, config) => grant,
        };
        info!(
            lease,
            token = grant.token(),
            "relay holds its lease: delivering"
        );
        let ended = tokio::select! {
            () = &mut shutdown => None,
            reason = grant.lost() => {
                warn!(lease, %reason, "relay lost its lease: delivery stopped");
                Some(Ok(()))
            }
            result = hold(&grant, &deliverer, config) => Some(result),
        };
        if let Err(e) = grant.release().await {
            warn!(lease, error = %e, "releasing the relay's lease");
        }
        match ended {
            None => return Ok(()),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(())) => {}
        }
    }
}

/// Acquires the relay's Lease, retrying failures with backoff.
async fn acquire(leases: &LeaseClient, config: &RelayConfig) -> Grant {
    let options = AcquireOptions {
        identity: config.identity.clone(),
        pod: PodBinding::FromEnv,
        timeout: None,
        slot: None,
    };
    let mut failures = 0;
    loop {
        match leases.acquire(&config.lease, options.clone()).await {
            Ok(grant) => return grant,
            Err(e) => {
                failures += 1;
                let wait = config.backoff.after(failures);
                warn!(lease = config.lease, error = %e, ?wait, "acquiring the relay's lease");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Delivers while `grant` is held. `Ok` when a claim or record was refused as stale
/// (a successor holds the Lease); `Err` only for what retrying cannot fix.
async fn hold(grant: &Grant, deliverer: &Deliverer, config: &RelayConfig) -> Result<(), Error> {
    let token = grant.token().max(0) as u64;
    let mut failures = 0;
    loop {
        let connected = Instant::now();
        let error = match connect(&config.store).await {
            Ok(db) => deliver_until_error(grant, &db, deliverer, config, token).await,
            Err(e) => Error::Database(e),
        };
        match error {
            Error::Stale(stale) => {
                warn!(lease = config.lease, %stale, "relay refused as stale: a successor holds its lease");
                return Ok(());
            }
            e @ (Error::NotInstalled { .. } | Error::BadInput(_)) => return Err(e),
            e => {
                // A connection that served for a while starts the backoff over.
                if connected.elapsed() > config.backoff.max {
                    failures = 0;
                }
                failures += 1;
                let wait = config.backoff.after(failures);
                warn!(error = %error_chain(&e), ?wait, "relay's database call failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(error = %e, "relay's database connection ended");
        }
    });
    Ok(client)
}

/// Claims, delivers and records batch after batch, until the first error.
async fn deliver_until_error(
    grant: &Grant,
    db: &Client,
    deliverer: &Deliverer,
    config: &RelayConfig,
    token: u64,
) -> Error {
    let Err(error) = deliver_batches(grant, db, deliverer, config, token).await;
    error
}

async fn deliver_batches(
    grant: &Grant,
    db: &Client,
    deliverer: &Deliverer,
    config: &RelayConfig,
    token: u64,
) -> Result<Infallible, Error> {
    let key = config.key.as_str();
    // Longer than one delivery, so an intent in flight is not claimed again by this
    // relay; a successor (higher token) claims it at once.
    let claim_for = config.timeout * 2 + Duration::from_secs(1);
    loop {
        let intents = claim(db, key, token, config.batch, claim_for).await?;
        if intents.is_empty() {
            tokio::time::sleep(config.poll).await;
            continue;
        }
        let mut answers = futures::stream::iter(intents)
            .map(|intent| async move {
                // Lost on the clock: the select in `run` ends this at once.
                if !grant.is_held() {
                    return None;
                }
                let answer = deliverer.deliver(&intent.id, intent.payload).await;
                Some((intent.id, intent.attempts, answer))
            })
            .buffer_unordered(config.batch.max(1) as usize)
            .filter_map(std::future::ready)
            .ready_chunks(config.batch.max(1) as usize);
        while let Some(answers) = answers.next().await {
            record(db, key, token, &answers, config.backoff).await?;
        }
    }
}

/// A claimed intent.
struct Intent {
    id: String,
    payload: String,
    attempts: u32,
}

async fn claim(
    db: &Client,
    key: &str,
    token: u64,
    batch: u32,
    claim_for: Duration,
) -> Result<Vec<Intent>, Error> {
    let (token_sql, batch_sql) = (token as i64, batch.min(i32::MAX as u32) as i32);
    let claim_ms = claim_for.as_millis().min(i64::MAX as u128) as i64;
    let rows = db
        .query(
            "SELECT intent_id::text, payload::text, attempts \
             FROM palisade.outbox_claim($1, $2, $3, $4::bigint * interval '1 millisecond')",
            &[&key, &token_sql, &batch_sql, &claim_ms],
        )
        .await
        .map_err(|e| classify(e, key, token))?;
    rows.iter()
        .map(|row| {
            let attempts: i32 = row.try_get(2).map_err(Error::Database)?;
            Ok(Intent {
                id: row.try_get(0).map_err(Error::Database)?,
                payload: row.try_get(1).map_err(Error::Database)?,
                attempts: attempts.max(1) as u32,
            })
        })
        .collect()
}

/// Records the answers that arrived together with one statement: one commit (one
/// fsync) for all, and no transaction held open across round trips, where a relay
/// stopped between two of them would keep its key's mark locked and its successor
/// waiting on it. PF001 on any fails them all: a stale relay records none.
async fn record(
    db: &Client,
    key: &str,
    token: u64,
    answers: &[(String, u32, Answer)],
    backoff: Backoff,
) -> Result<(), Error> {
    let ids: Vec<&str> = answers.iter().map(|(id, ..)| id.as_str()).collect();
    let statuses: Vec<Option<i32>> = answers
        .iter()
        .map(|(_, _, answer)| answer.status.map(i32::from))
        .collect();
    let texts: Vec<&str> = answers.iter().map(|(.., a)| a.text.as_str()).collect();
    let retry_ms: Vec<i64> = answers
        .iter()
        .map(|(_, attempts, _)| backoff.after(*attempts).as_millis().min(i64::MAX as u128) as i64)
        .collect();
    let rows = db
        .query(
            "SELECT r.id, palisade.outbox_record($1, $2, r.id::uuid, r.status, r.answer, \
                                                 r.retry_ms * interval '1 millisecond') \
             FROM unnest($3::text[], $4::int4[], $5::text[], $6::int8[]) \
                  AS r(id, status, answer, retry_ms)",
            &[&key, &(token as i64), &ids, &statuses, &texts, &retry_ms],
        )
        .await
        .map_err(|e| classify(e, key, token))?;
    for row in rows {
        let (id, state): (String, String) = (
            row.try_get(0).map_err(Error::Database)?,
            row.try_get(1).map_err(Error::Database)?,
        );
        debug!(intent = id, state, "recorded the provider's answer");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_attempt_up_to_its_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let waits: Vec<u128> = (1..=6).map(|a| backoff.after(a).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.after(0), Duration::from_millis(100));
        assert_eq!(backoff.after(u32::MAX), Duration::from_secs(1));
    }
}
