//! Fencing at the protected resource (DESIGN.md rule 6).
//!
//! A [`Fence`] admits a write for a key only if its fencing token is at least the
//! highest token admitted for that key so far. Equal tokens pass, because one
//! holder writes many times with the token of its grant. A holder that was paused
//! past its lease carries a lower token than its successor and is refused here,
//! whatever it believes about its lease.
//!
//! The rule itself is [`check`], a pure function; a [`FenceStore`] only makes it
//! atomic and durable. [`MemoryStore`] lives in one process; [`FileStore`] is a
//! directory on disk that survives crashes and may be shared by several processes.
//! The same rule runs inside PostgreSQL ([`postgres`], feature `postgres`) and Redis
//! ([`redis`], feature `redis`), in the transaction or script that does the write.
//!
//! ```
//! use palisade::fence::{Fence, FenceError, FileStore, Stale};
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("ledger-fence");
//! // Once, when the resource is set up; every writer then opens it.
//! FileStore::create(&path)?;
//! let fence = Fence::new(FileStore::open(&path)?);
//!
//! // The token comes with the write (palisade lock puts it in PALISADE_FENCING_TOKEN).
//! fence.admit_write("ledger", 1841, "credit 10")?;
//! // A holder paused past its lease still has the older token: refused.
//! let refused = fence.admit("ledger", 1839);
//! assert!(matches!(refused, Err(FenceError::Stale(Stale { highest: 1841, .. }))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod file;
mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "s3")]
pub mod s3;

pub use file::{DEFAULT_LOCK_TIMEOUT, FileStore};
pub use memory::MemoryStore;

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The highest admitted token per key (sorted, so the store file is stable and diffable).
pub type Marks = BTreeMap<String, u64>;

/// A token that passed the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub token: u64,
    /// The high-water mark before this admit; `None` for the first token of a key.
    pub previous: Option<u64>,
}

impl Admitted {
    /// Whether this admit raised the mark (false when the holder reused the highest token).
    pub fn raised(&self) -> bool {
        self.previous.is_none_or(|previous| self.token > previous)
    }
}

/// One accepted write, as recorded by [`Fence::admit_write`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalEntry {
    pub key: String,
    pub token: u64,
    pub payload: String,
}

/// A token lower than the highest admitted for its key: the writer lost its Lease to
/// a holder that has written since. Do not retry. Every fence refuses with this one
/// type (`FenceError::Stale`, `postgres::Error::Stale`, `redis::Error::Stale`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "write rejected: stale fencing token {token} for key {key:?} is lower than \
     the highest admitted token {highest}"
)]
pub struct Stale {
    pub key: String,
    pub token: u64,
    pub highest: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(transparent)]
    Stale(#[from] Stale),
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("fence store file {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// Nothing to open: [`FileStore::open`] never creates a store, so a mistyped or
    /// deleted store is never mistaken for a new one that starts over at zero.
    #[error(
        "no fence store at {}: {reason}; create one explicitly (FileStore::create, \
         or palisade fence --create)",
        path.display()
    )]
    NoStore { path: PathBuf, reason: String },
    #[error("cannot create a fence store at {}: it exists and is not empty", path.display())]
    AlreadyExists { path: PathBuf },
    /// Another writer held the store's lock for longer than the lock timeout (for
    /// example a writer paused inside an admit).
    #[error(
        "fence store {} is locked by another writer; gave up after {waited:?}",
        path.display()
    )]
    Locked { path: PathBuf, waited: Duration },
}

/// The fencing rule: `token` passes if it is at least `highest`, the mark for `key`.
pub fn check(key: &str, token: u64, highest: Option<u64>) -> Result<Admitted, FenceError> {
    match highest {
        Some(highest) if token < highest => Err(FenceError::Stale(Stale {
            key: key.to_owned(),
            token,
            highest,
        })),
        previous => Ok(Admitted { token, previous }),
    }
}

/// Where a [`Fence`] keeps its marks.
pub trait FenceStore {
    /// Checks `token` against the mark for `key` with [`check`], raises the mark if
    /// the token is higher and, given a payload, appends it to the journal: all in
    /// one critical section that excludes every other user of the same store.
    fn admit(
        &mut self,
        key: &str,
        token: u64,
        payload: Option<&str>,
    ) -> Result<Admitted, FenceError>;

    /// The marks as they are now in the store.
    fn marks(&mut self) -> Result<Marks, FenceError>;

    /// The accepted writes, oldest first.
    fn journal(&mut self) -> Result<Vec<JournalEntry>, FenceError>;
}

/// Admits fencing tokens for keys; safe to share between threads.
#[derive(Debug, Default)]
pub struct Fence<S> {
    store: Mutex<S>,
}

impl<S: FenceStore> Fence<S> {
    pub fn new(store: S) -> Self {
        Fence {
            store: Mutex::new(store),
        }
    }

    /// Admits `token` for `key` if it is at least the highest admitted so far, and
    /// returns the previous mark; otherwise [`FenceError::Stale`].
    ///
    /// ```
    /// use palisade::fence::{Fence, MemoryStore};
    /// let fence = Fence::new(MemoryStore::default());
    /// assert_eq!(fence.admit("orders", 7)?.previous, None);
    /// assert_eq!(fence.admit("orders", 7)?.previous, Some(7)); // the same holder again
    /// assert!(fence.admit("orders", 6).is_err()); // an older holder
    /// # Ok::<(), palisade::fence::FenceError>(())
    /// ```
    pub fn admit(&self, key: &str, token: u64) -> Result<Admitted, FenceError> {
        self.store().admit(key, token, None)
    }

    /// Like [`Fence::admit`], and records `payload` as the accepted write in the
    /// store's journal, in the same critical section.
    pub fn admit_write(
        &self,
        key: &str,
        token: u64,
        payload: &str,
    ) -> Result<Admitted, FenceError> {
        self.store().admit(key, token, Some(payload))
    }

    /// The highest token admitted for `key`. A `Result`, not an `Option`: a file
    /// store is re-read every time, and an unreadable store must not look like a
    /// key that was never fenced.
    pub fn highest(&self, key: &str) -> Result<Option<u64>, FenceError> {
        Ok(self.store().marks()?.get(key).copied())
    }

    pub fn marks(&self) -> Result<Marks, FenceError> {
        self.store().marks()
    }

    pub fn journal(&self) -> Result<Vec<JournalEntry>, FenceError> {
        self.store().journal()
    }

    fn store(&self) -> MutexGuard<'_, S> {
        // A panic inside a store call cannot leave a half-applied admit behind: the
        // check comes before any change, and a file store's state is its files.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseTokenError {
    #[error("fencing token is empty")]
    Empty,
    #[error("fencing token {0:?} is negative; tokens are unsigned integers")]
    Negative(String),
    #[error(
        "fencing token {0:?} is not an unsigned decimal integer \
         (digits 0-9 only: no sign, spaces or other characters)"
    )]
    NotDecimal(String),
    #[error("fencing token {0:?} is larger than the largest token, {max}", max = u64::MAX)]
    Overflow(String),
}

/// Longest key the database and object-store fences accept, in bytes of UTF-8: well
/// under the databases' index entry limits, and S3's own limit on an object key.
pub const MAX_KEY_BYTES: usize = 1024;

/// The key check of every store but the file and memory ones, made before any round
/// trip: a non-empty key of at most [`MAX_KEY_BYTES`]. The refusal, for `BadInput`.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes long; the limit is {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    Ok(())
}

/// [`check_key`], and a token that fits the store's signed 64-bit integer (`integer`
/// names it in the refusal, e.g. "PostgreSQL's bigint"): the token as that integer.
pub fn check_key_and_token(key: &str, token: u64, integer: &str) -> Result<i64, String> {
    check_key(key)?;
    i64::try_from(token).map_err(|_| {
        format!(
            "fencing token {token} is beyond {integer} (at most {})",
            i64::MAX
        )
    })
}

/// Parses a fencing token as it appears in an annotation or the environment:
/// ASCII digits only. Nothing is trimmed: `" 5"`, `"+5"` and `"5\n"` are refused,
/// so every accepted spelling is one the admission policy accepts too.
pub fn parse_token(s: &str) -> Result<u64, ParseTokenError> {
    if s.is_empty() {
        return Err(ParseTokenError::Empty);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // Only digits, so the one way left to fail is a value beyond u64.
        return s
            .parse()
            .map_err(|_| ParseTokenError::Overflow(s.to_owned()));
    }
    match s.strip_prefix('-') {
        Some(rest) if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) => {
            Err(ParseTokenError::Negative(s.to_owned()))
        }
        _ => Err(ParseTokenError::NotDecimal(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use proptest::prelude::*;

    fn memory_fence() -> Fence<MemoryStore> {
        Fence::new(MemoryStore::default())
    }

    #[test]
    fn first_token_is_admitted_with_no_previous_mark() {
        let fence = memory_fence();
        let admitted = fence.admit("k", 7).unwrap();
        assert_eq!(
            admitted,
            Admitted {
                token: 7,
                previous: None
            }
        );
        assert!(admitted.raised());
        assert_eq!(fence.highest("k").unwrap(), Some(7));
    }

    #[test]
    fn higher_token_is_admitted_and_raises_the_mark() {
        let fence = memory_fence();
        fence.admit("k", 7).unwrap();
        let admitted = fence.admit("k", 9).unwrap();
        assert_eq!(admitted.previous, Some(7));
        assert!(admitted.raised());
        assert_eq!(fence.highest("k").unwrap(), Some(9));
    }

    #[test]
    fn equal_token_is_admitted_without_raising() {
        let fence = memory_fence();
        fence.admit("k", 7).unwrap();
        let admitted = fence.admit("k", 7).unwrap();
        assert_eq!(admitted.previous, Some(7));
        assert!(!admitted.raised());
        assert_eq!(fence.highest("k").unwrap(), Some(7));
    }

    #[test]
    fn lower_token_is_rejected_and_leaves_the_mark() {
        let fence = memory_fence();
        fence.admit("k", 34).unwrap();
        match fence.admit("k", 33) {
            Err(FenceError::Stale(Stale {
                key,
                token,
                highest,
            })) => assert_eq!((key.as_str(), token, highest), ("k", 33, 34)),
            other => panic!("expected Stale, got {other:?}"),
        }
        assert_eq!(fence.highest("k").unwrap(), Some(34));
    }

    #[test]
    fn keys_are_fenced_independently() {
        let fence = memory_fence();
        fence.admit("a", 100).unwrap();
        assert_eq!(fence.admit("b", 1).unwrap().previous, None);
        assert!(fence.admit("a", 99).is_err());
        assert_eq!(fence.highest("a").unwrap(), Some(100));
        assert_eq!(fence.highest("b").unwrap(), Some(1));
        assert_eq!(fence.highest("c").unwrap(), None);
    }

    #[test]
    fn token_zero_is_a_valid_first_token() {
        let fence = memory_fence();
        assert!(fence.admit("k", 0).is_ok());
        assert!(fence.admit("k", 0).is_ok());
    }

    #[test]
    fn stale_message_names_key_and_both_tokens() {
        let fence = memory_fence();
        fence.admit("billing", 34).unwrap();
        let message = fence.admit("billing", 33).unwrap_err().to_string();
        assert_eq!(
            message,
            "write rejected: stale fencing token 33 for key \"billing\" is lower than \
             the highest admitted token 34"
        );
    }

    #[test]
    fn admit_write_journals_only_admitted_writes() {
        let fence = memory_fence();
        fence.admit_write("k", 2, "first").unwrap();
        fence.admit_write("k", 1, "stale").unwrap_err();
        fence.admit_write("k", 2, "again").unwrap();
        let payloads: Vec<_> = fence
            .journal()
            .unwrap()
            .into_iter()
            .map(|e| (e.token, e.payload))
            .collect();
        assert_eq!(payloads, [(2, "first".to_owned()), (2, "again".to_owned())]);
    }

    #[test]
    fn threads_sharing_a_fence_never_admit_lower() {
        let fence = memory_fence();
        let next = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (fence, next) = (&fence, &next);
                scope.spawn(move || {
                    for i in 0..500u64 {
                        let ticket = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        // Jitter so that tokens arrive out of order and some are stale.
                        let token = ticket.saturating_sub((ticket * 7 + i) % 5);
                        let _ = fence.admit_write("k", token, &format!("t{thread}"));
                    }
                });
            }
        });
        let journal = fence.journal().unwrap();
        assert!(journal.windows(2).all(|w| w[0].token <= w[1].token));
        assert!(journal.len() < 2000, "jitter should make some tokens stale");
        assert_eq!(fence.highest("k").unwrap(), journal.last().map(|e| e.token));
    }

    #[test]
    fn parse_token_accepts_plain_decimal() {
        assert_eq!(parse_token("0"), Ok(0));
        assert_eq!(parse_token("1839202"), Ok(1_839_202));
        assert_eq!(parse_token("007"), Ok(7));
        assert_eq!(parse_token("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn parse_token_rejects_everything_else() {
        use ParseTokenError::*;
        assert_eq!(parse_token(""), Err(Empty));
        assert_eq!(parse_token("-1"), Err(Negative("-1".into())));
        assert_eq!(parse_token("+5"), Err(NotDecimal("+5".into())));
        assert_eq!(parse_token(" 5"), Err(NotDecimal(" 5".into())));
        assert_eq!(parse_token("5\n"), Err(NotDecimal("5\n".into())));
        assert_eq!(parse_token("-"), Err(NotDecimal("-".into())));
        assert_eq!(parse_token("1e3"), Err(NotDecimal("1e3".into())));
        assert_eq!(parse_token("٣"), Err(NotDecimal("٣".into())));
        assert_eq!(
            parse_token("18446744073709551616"),
            Err(Overflow("18446744073709551616".into()))
        );
    }

    #[test]
    fn parse_token_errors_say_what_is_wrong() {
        assert_eq!(
            parse_token("").unwrap_err().to_string(),
            "fencing token is empty"
        );
        assert!(
            parse_token("-4")
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(parse_token("x").unwrap_err().to_string().contains("\"x\""));
        assert!(
            parse_token("99999999999999999999")
                .unwrap_err()
                .to_string()
                .contains("18446744073709551615")
        );
    }

    /// Runs `ops` against `fence`, checking each result against the marks the
    /// sequence implies, and returns the admitted tokens per key in order.
    fn check_against_model<S: FenceStore>(
        fence: &Fence<S>,
        ops: &[(u8, u64)],
    ) -> Result<BTreeMap<String, Vec<u64>>, TestCaseError> {
        let mut model: HashMap<String, u64> = HashMap::new();
        let mut admitted: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for &(key, token) in ops {
            let key = format!("key-{key}");
            let mark = model.get(&key).copied();
            match fence.admit(&key, token) {
                Ok(ok) => {
                    prop_assert_eq!(ok.previous, mark);
                    model.insert(key.clone(), token);
                    admitted.entry(key).or_default().push(token);
                }
                Err(FenceError::Stale(Stale {
                    token: t, highest, ..
                })) => {
                    prop_assert_eq!(t, token);
                    prop_assert_eq!(Some(highest), mark);
                    prop_assert!(token < highest, "rejected {} with mark {}", token, highest);
                }
                Err(other) => return Err(TestCaseError::fail(other.to_string())),
            }
        }
        for (key, tokens) in &admitted {
            prop_assert!(tokens.windows(2).all(|w| w[0] <= w[1]), "{key}: {tokens:?}");
            prop_assert_eq!(fence.highest(key).unwrap(), tokens.last().copied());
        }
        Ok(admitted)
    }

    proptest! {
        #[test]
        fn admitted_tokens_never_decrease_per_key(
            ops in prop::collection::vec((0u8..4, 0u64..40), 0..200)
        ) {
            check_against_model(&memory_fence(), &ops)?;
        }
    }

    proptest! {
        // Few cases: every raised mark costs two fsyncs.
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn file_store_agrees_with_memory_store(
            ops in prop::collection::vec((0u8..3, 0u64..20), 0..40)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let file = Fence::new(FileStore::create(dir.path().join("store")).unwrap());
            let from_file = check_against_model(&file, &ops)?;
            let from_memory = check_against_model(&memory_fence(), &ops)?;
            prop_assert_eq!(from_file, from_memory);
        }
    }
}
