//! Fencing inside Redis: a Lua script (`src/fence/redis.lua`, embedded as
//! [`SCRIPT`]) that compares the caller's token with the key's highest admitted
//! token and only then does the protected write, in one atomic step.
//!
//! Keys: the mark of key `k` is `palisade:{k}:token`; the protected key should carry
//! the same hash tag `{k}` (see [`data_key`], `palisade:{k}:data:<name>`) so both
//! live in one slot and the script runs on Redis Cluster too (Redis refuses a script
//! whose keys span slots). The script refuses a protected key that is a mark.
//! The script is sent with EVALSHA, and with EVAL when the server answers NOSCRIPT
//! (after a restart or `SCRIPT FLUSH`): what [`redis::Script`] does.
//!
//! A key's mark is created once, explicitly ([`RedisFence::create`]); an admit whose
//! mark is missing is [`Error::NoMark`], never a fresh start: a Redis that lost its
//! marks (FLUSHDB, eviction, a restart without AOF, a failover to an empty replica)
//! fails closed. [`check_settings`] tells whether the server is set up so that marks
//! are neither lost nor rolled back; docs/fences.md ("Redis")
//! has what Redis cannot promise even so.
//!
//! # Why it is built this way
//!
//! A script because only a script makes compare-then-write atomic in Redis; it
//! compares tokens as digit strings because Lua numbers are doubles. A Redis that
//! lost its marks must be an error, never a fresh start, as with the file store; a
//! store-wide sentinel cannot tell an evicted mark from a new key, so the mark itself
//! is the sentinel: each key's mark is created once, explicitly (`SET NX`, keeping an
//! existing one), and the script answers `NOMARK` when it is missing. A created,
//! never-admitted mark is the empty string rather than "0": no token value is
//! reserved (0 stays a token like any other, reported as the previous mark the second
//! time, as in the file store), and no reader can take it for an admitted token. Data
//! keys live under `palisade:{k}:data:`, which never names the mark of `k`, and the
//! script refuses any protected key shaped like a mark, so no payload replaces one.
//!
//! What missing marks cannot catch, a mark rolled back by an RDB snapshot or an
//! unsynced AOF, is left to the settings: [`check_settings`] reads them with CONFIG
//! GET; `create` and the CLI refuse where they see them unsafe, and report "cannot
//! see" where CONFIG is refused (managed services), since refusing there would make
//! the fence unusable where the operator can still set them right; `admit` does not
//! check, to keep one round trip per write. The CLI speaks TLS with rustls (no
//! OpenSSL in the build) and talks to one server, not Redis Cluster, which the
//! library serves through any cluster connection: the smaller change.

use redis::aio::ConnectionLike;

use super::{Admitted, Stale};

/// The fencing script.
pub const SCRIPT: &str = include_str!("redis.lua");
/// Longest key, in bytes of UTF-8: the same for every fence.
pub const MAX_KEY_BYTES: usize = super::MAX_KEY_BYTES;

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

/// A server setting that lets Redis lose or roll back marks, as [`check_settings`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsafeSetting {
    pub name: &'static str,
    pub value: String,
    /// What the fence needs instead.
    pub required: &'static str,
}

impl std::fmt::Display for UnsafeSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {:?} (needs {})",
            self.name, self.value, self.required
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The key's mark is not there: never created, or lost by Redis. Admitting now
    /// would start over and let any stale token through, so nothing was written.
    #[error(
        "fencing refused for key {key:?}: its mark {mark} is missing. Either it was never \
         created (create it once, when the key is set up: RedisFence::create, or palisade \
         fence --store URL --create --key KEY), or Redis lost it (FLUSHDB, eviction, a \
         restart without AOF, a failover to an empty replica); the fence refuses to start \
         over, as that would admit any stale token",
        mark = mark_key(key)
    )]
    NoMark { key: String },
    /// The server is set up so that it can lose or roll back marks.
    #[error(
        "Redis is not set up for fencing: {}; it can lose or roll back marks, and a \
         rolled-back mark admits stale tokens",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    UnsafeSettings(Vec<UnsafeSetting>),
    #[error("cannot fence: {0}")]
    BadInput(String),
    #[error("fencing check in Redis failed")]
    Redis(#[source] redis::RedisError),
}

/// The mark of `key`: `palisade:{key}:token`.
pub fn mark_key(key: &str) -> String {
    format!("palisade:{{{key}}}:token")
}

/// A key in the same hash slot as the mark of `key`, for the protected data:
/// `palisade:{key}:data:<name>`. Never the mark of `key`, whatever the name (the
/// `data:` namespace); a name that makes it look like another key's mark (one
/// ending in `}:token`) is refused by [`RedisFence::admit`] and by the script.
pub fn data_key(key: &str, name: &str) -> String {
    format!("palisade:{{{key}}}:data:{name}")
}

/// Whether `key` has the shape of a mark, `palisade:{...}:token` (of any key).
pub fn is_mark_key(key: &str) -> bool {
    key.starts_with("palisade:{") && key.ends_with("}:token")
}

/// What [`check_settings`] could see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settings {
    /// `appendonly yes`, `appendfsync always`, and `maxmemory-policy` `noeviction` or
    /// a `volatile-*` policy (marks have no TTL, so those never evict them).
    Safe,
    /// The server would not show them (CONFIG refused, as by many managed services
    /// and ACLs, or a setting missing from the answer): why. Not an error: the
    /// operator has to make sure of them another way.
    CannotSee(String),
}

/// The settings the fence needs, read with `CONFIG GET` (one round trip):
/// [`Error::UnsafeSettings`] naming each unsafe one and the value required; without
/// AOF a restart loses or rolls back marks, with `appendfsync` other than `always` a
/// crash forgets the last raised marks, and an `allkeys-*` policy evicts idle marks.
///
/// [`RedisFence::admit`] does not call it (that would cost a round trip per write):
/// a program calls it once at start, as [`RedisFence::create`] and `palisade fence`
/// do. On Redis Cluster it sees the one node the connection sends it to.
pub async fn check_settings<C: ConnectionLike>(conn: &mut C) -> Result<Settings, Error> {
    const NAMES: [&str; 3] = ["appendonly", "appendfsync", "maxmemory-policy"];
    let mut pipe = redis::pipe();
    // One name per CONFIG GET: Redis before 7 takes one pattern only.
    for name in NAMES {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let answers: Vec<Vec<String>> = match pipe.query_async(conn).await {
        Ok(answers) => answers,
        Err(e)
            if matches!(
                e.kind(),
                redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
            ) =>
        {
            return Ok(Settings::CannotSee(format!("CONFIG GET was refused: {e}")));
        }
        Err(e) => return Err(Error::Redis(e)),
    };
    let mut unsafe_settings = Vec::new();
    let mut unseen = Vec::new();
    for (name, answer) in NAMES.into_iter().zip(&answers) {
        let value = answer
            .chunks(2)
            .find(|pair| pair.len() == 2 && pair[0].eq_ignore_ascii_case(name))
            .map(|pair| pair[1].to_ascii_lowercase());
        let Some(value) = value else {
            unseen.push(name);
            continue;
        };
        let (ok, required) = match name {
            "appendonly" => (value == "yes", "yes"),
            "appendfsync" => (value == "always", "always"),
            _ => (
                value == "noeviction" || value.starts_with("volatile-"),
                "noeviction or a volatile-* policy",
            ),
        };
        if !ok {
            unsafe_settings.push(UnsafeSetting {
                name,
                value,
                required,
            });
        }
    }
    if !unsafe_settings.is_empty() {
        return Err(Error::UnsafeSettings(unsafe_settings));
    }
    if !unseen.is_empty() {
        return Ok(Settings::CannotSee(format!(
            "CONFIG GET did not show {}",
            unseen.join(", ")
        )));
    }
    Ok(Settings::Safe)
}

/// What [`RedisFence::create`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// False when the mark was there already (and was kept as it is).
    pub new: bool,
    /// What [`check_settings`] saw first.
    pub settings: Settings,
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

    /// Creates the mark of `key`, empty, once, when the key is set up: no admit
    /// passes before it. An existing mark is kept as it is, so creating twice is
    /// harmless; but a writer must not create before every write, or a mark that
    /// Redis lost would be created again and the fence would start over.
    ///
    /// Refuses with [`Error::UnsafeSettings`] in a Redis that [`check_settings`]
    /// sees is unsafe; one that will not show its settings is noted in the result.
    pub async fn create<C: ConnectionLike>(conn: &mut C, key: &str) -> Result<Created, Error> {
        validate(key)?;
        let settings = check_settings(conn).await?;
        // The empty mark: created, no token admitted yet (any token passes it).
        let set: Option<String> = redis::cmd("SET")
            .arg(mark_key(key))
            .arg("")
            .arg("NX")
            .query_async(conn)
            .await
            .map_err(Error::Redis)?;
        Ok(Created {
            new: set.is_some(),
            settings,
        })
    }

    /// Admits `token` for `key` and, only then, does `write`: all in one script.
    /// The key's mark must have been created ([`RedisFence::create`]); a missing one
    /// is [`Error::NoMark`] and nothing is written. It does not check the server's
    /// settings: call [`check_settings`] once when the program starts.
    ///
    /// ```no_run
    /// use palisade::fence::redis::{RedisFence, Write, check_settings, data_key};
    /// # async fn demo(token: u64) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let mut conn = client.get_multiplexed_async_connection().await?;
    /// check_settings(&mut conn).await?; // once, at start: AOF, fsync always, no eviction
    /// RedisFence::create(&mut conn, "ledger").await?; // once, when the key is set up
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
                if is_mark_key(k) {
                    return Err(Error::BadInput(format!(
                        "the protected key {k:?} is a fence mark (palisade:{{...}}:token); \
                         write to a data key (data_key)"
                    )));
                }
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
            Err(e) if e.code() == Some("NOMARK") => Err(Error::NoMark {
                key: key.to_owned(),
            }),
            Err(e) if e.code() == Some("STALE") => {
                let highest = e
                    .detail()
                    .and_then(|d| d.rsplit(' ').next())
                    .and_then(|t| t.trim().parse().ok());
                match highest {
                    Some(highest) => Err(Error::Stale(Stale {
                        key: key.to_owned(),
                        token,
                        highest,
                    })),
                    None => Err(Error::Redis(e)),
                }
            }
            Err(e) => Err(Error::Redis(e)),
        }
    }
}

/// The highest admitted token of every key (SCAN over `palisade:{*}:token`; for
/// inspection, not for a hot path). A mark created but never admitted is left out.
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
            let mark: Option<String> = redis::cmd("GET")
                .arg(&k)
                .query_async(conn)
                .await
                .map_err(Error::Redis)?;
            if let (Some(token), Some(key)) = (
                mark.and_then(|m| m.parse().ok()),
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
    super::check_key(key).map_err(Error::BadInput)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_and_data_keys_share_the_hash_tag() {
        assert_eq!(mark_key("billing"), "palisade:{billing}:token");
        assert_eq!(
            data_key("billing", "journal"),
            "palisade:{billing}:data:journal"
        );
    }

    proptest::proptest! {
        /// The `data:` namespace never yields the key's own mark; a name that makes
        /// a data key look like some other key's mark is recognised as one.
        #[test]
        fn a_data_key_is_never_the_mark(key in ".{1,12}", name in ".{0,12}") {
            proptest::prop_assert_ne!(data_key(&key, &name), mark_key(&key));
            proptest::prop_assert!(is_mark_key(&mark_key(&key)));
            let crafted = data_key(&key, &format!("{name}}}:token"));
            proptest::prop_assert!(is_mark_key(&crafted));
        }
    }

    #[test]
    fn bad_keys_are_refused() {
        assert!(matches!(validate(""), Err(Error::BadInput(m)) if m.contains("empty")));
        assert!(validate(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(validate("k").is_ok());
    }
}
