//! Fencing inside Redis: a Lua script (`src/fence/redis.lua`, embedded as
//! [`SCRIPT`]) that compares the caller's token with the key's highest admitted
//! token and only then does the protected write, in one atomic step.
//!
//! Keys: the mark of key `k` is `palisade:{k}:token`; the protected key should carry
//! the same hash tag `{k}` (see [`data_key`]) so both live in one slot and the
//! script runs on Redis Cluster too (Redis refuses a script whose keys span slots).
//! The script is sent with EVALSHA, and with EVAL when the server answers NOSCRIPT
//! (after a restart or `SCRIPT FLUSH`): what [`redis::Script`] does.
//!
//! What Redis cannot promise is in the README ("Fencing in Redis"): a failover to an
//! asynchronous replica can lose the highest mark, and only `appendfsync always`
//! makes an acknowledged mark survive a crash.

use redis::aio::ConnectionLike;

use super::Admitted;

/// The fencing script.
pub const SCRIPT: &str = include_str!("redis.lua");
/// Longest key accepted, in bytes (the same limit as PostgreSQL's).
pub const MAX_KEY_BYTES: usize = 1024;

/// The protected write the script does after admitting the token.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// Admit the token only.
    None,
    /// `SET key value`.
    Set { key: &'a str, value: &'a str },
    /// `RPUSH key value`: append to a list (a journal of accepted writes).
    Push { key: &'a str, value: &'a str },
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "write rejected: stale fencing token {token} for key {key:?} is lower than \
         the highest admitted token {highest}"
    )]
    Stale {
        key: String,
        token: u64,
        highest: u64,
    },
    #[error("cannot fence: {0}")]
    BadInput(String),
    #[error("fencing check in Redis failed")]
    Redis(#[source] redis::RedisError),
}

/// The mark of `key`: `palisade:{key}:token`.
pub fn mark_key(key: &str) -> String {
    format!("palisade:{{{key}}}:token")
}

/// A key in the same hash slot as the mark of `key`: `palisade:{key}:<name>`.
pub fn data_key(key: &str, name: &str) -> String {
    format!("palisade:{{{key}}}:{name}")
}

/// Runs the fencing script; shares the loaded script (its SHA1) between calls.
#[derive(Debug, Clone)]
pub struct RedisFence {
    script: redis::Script,
}

impl Default for RedisFence {
    fn default() -> Self {
        RedisFence {
            script: redis::Script::new(SCRIPT),
        }
    }
}

impl RedisFence {
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits `token` for `key` and, only then, does `write`: all in one script.
    ///
    /// ```no_run
    /// use palisade::fence::redis::{RedisFence, Write, data_key};
    /// # async fn demo(token: u64) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let mut conn = client.get_multiplexed_async_connection().await?;
    /// let fence = RedisFence::new();
    /// // The protected key shares the mark's hash slot (Redis Cluster).
    /// let balance = data_key("ledger", "balance");
    /// let write = Write::Set { key: &balance, value: "110" };
    /// fence.admit(&mut conn, "ledger", token, write).await?; // Error::Stale: the lease was lost
    /// # Ok(()) }
    /// ```
    pub async fn admit<C: ConnectionLike>(
        &self,
        conn: &mut C,
        key: &str,
        token: u64,
        write: Write<'_>,
    ) -> Result<Admitted, Error> {
        validate(key)?;
        let mut invocation = self.script.prepare_invoke();
        invocation.key(mark_key(key));
        match write {
            Write::None => {}
            Write::Set { key: k, .. } | Write::Push { key: k, .. } => {
                invocation.key(k);
            }
        }
        invocation.arg(token.to_string()).arg(key);
        match write {
            Write::None => {}
            Write::Set { value, .. } => {
                invocation.arg("set").arg(value);
            }
            Write::Push { value, .. } => {
                invocation.arg("rpush").arg(value);
            }
        }
        match invocation.invoke_async::<Option<String>>(conn).await {
            Ok(previous) => Ok(Admitted {
                token,
                previous: previous
                    .map(|p| {
                        p.parse().map_err(|_| {
                            Error::BadInput(format!("the mark of {key:?} is not a token: {p:?}"))
                        })
                    })
                    .transpose()?,
            }),
            Err(e) if e.code() == Some("STALE") => {
                let highest = e
                    .detail()
                    .and_then(|d| d.rsplit(' ').next())
                    .and_then(|t| t.trim().parse().ok());
                match highest {
                    Some(highest) => Err(Error::Stale {
                        key: key.to_owned(),
                        token,
                        highest,
                    }),
                    None => Err(Error::Redis(e)),
                }
            }
            Err(e) => Err(Error::Redis(e)),
        }
    }
}

/// The highest admitted token of every key (SCAN over `palisade:{*}:token`; for
/// inspection, not for a hot path).
pub async fn marks<C: ConnectionLike + Send>(conn: &mut C) -> Result<super::Marks, Error> {
    let mut marks = super::Marks::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("palisade:{*}:token")
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(Error::Redis)?;
        for k in keys {
            let token: Option<u64> = redis::cmd("GET")
                .arg(&k)
                .query_async(conn)
                .await
                .map_err(Error::Redis)?;
            if let (Some(token), Some(key)) = (
                token,
                k.strip_prefix("palisade:{")
                    .and_then(|r| r.strip_suffix("}:token")),
            ) {
                marks.insert(key.to_owned(), token);
            }
        }
        if next == 0 {
            return Ok(marks);
        }
        cursor = next;
    }
}

fn validate(key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::BadInput("the key is empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::BadInput(format!(
            "the key is {} bytes long; the limit is {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_and_data_keys_share_the_hash_tag() {
        assert_eq!(mark_key("billing"), "palisade:{billing}:token");
        assert_eq!(data_key("billing", "journal"), "palisade:{billing}:journal");
    }

    #[test]
    fn bad_keys_are_refused() {
        assert!(matches!(validate(""), Err(Error::BadInput(m)) if m.contains("empty")));
        assert!(validate(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(validate("k").is_ok());
    }
}
