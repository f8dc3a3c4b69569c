//! Fencing at the protected resource (DESIGN rule 6).
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
//! use palisade::fence::{Fence, FenceError, FileStore};
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
//! assert!(matches!(refused, Err(FenceError::Stale { highest: 1841, .. })));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

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

#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(
        "write rejected: stale fencing token {token} for key {key:?} is lower than \
         the highest admitted token {highest}"
    )]
    Stale {
        key: String,
        token: u64,
        highest: u64,
    },
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

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FenceError {
    let path = path.to_path_buf();
    move |source| FenceError::Io {
        action,
        path,
        source,
    }
}

/// The fencing rule: `token` passes if it is at least `highest`, the mark for `key`.
pub fn check(key: &str, token: u64, highest: Option<u64>) -> Result<Admitted, FenceError> {
    match highest {
        Some(highest) if token < highest => Err(FenceError::Stale {
            key: key.to_owned(),
            token,
            highest,
        }),
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

/// Marks in memory, for a resource that lives in one process (or for tests).
#[derive(Debug, Default)]
pub struct MemoryStore {
    marks: HashMap<String, u64>,
    journal: Vec<JournalEntry>,
}

impl FenceStore for MemoryStore {
    fn admit(
        &mut self,
        key: &str,
        token: u64,
        payload: Option<&str>,
    ) -> Result<Admitted, FenceError> {
        let admitted = check(key, token, self.marks.get(key).copied())?;
        self.marks.insert(key.to_owned(), token);
        if let Some(payload) = payload {
            self.journal.push(JournalEntry {
                key: key.to_owned(),
                token,
                payload: payload.to_owned(),
            });
        }
        Ok(admitted)
    }

    fn marks(&mut self) -> Result<Marks, FenceError> {
        Ok(self.marks.iter().map(|(k, v)| (k.clone(), *v)).collect())
    }

    fn journal(&mut self) -> Result<Vec<JournalEntry>, FenceError> {
        Ok(self.journal.clone())
    }
}

const MARKS_FILE: &str = "marks.json";
const MARKS_TEMP: &str = "marks.json.tmp";
const LOCK_FILE: &str = "lock";
const JOURNAL_FILE: &str = "journal.jsonl";

/// The marks file: `{"highest": {"<key>": <token>, ...}}`. Unknown fields are
/// refused, so an older palisade never misreads a newer format as marks.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MarksFile {
    highest: Marks,
}

/// How long [`FileStore`] waits for another writer to let go of the store's lock.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Marks in a directory, durable across crashes and shared by any number of
/// processes on one host.
///
/// A directory rather than a single file, because the marks file, its temp file,
/// the lock file and the journal then live together: one path names the store,
/// the rename and its directory fsync stay inside it, and nothing is scattered
/// next to the user's other files. Contents:
///
/// - `marks.json`: `{"highest": {"<key>": <token>, ...}}`, replaced whole by rename, so a
///   reader sees the old or the new file, never a mix.
/// - `lock`: empty; an exclusive `flock` on it guards every read-check-write. The
///   kernel drops the lock when its holder dies, even by SIGKILL. Waiting for it is
///   bounded ([`FileStore::with_lock_timeout`]): a writer paused while holding it
///   makes the others fail with [`FenceError::Locked`], never hang.
/// - `journal.jsonl`: one JSON [`JournalEntry`] per line, appended in admit order.
///
/// A store is made only by [`FileStore::create`] (or [`FileStore::open_or_create`]),
/// whole: it is filled in a temporary directory next to it and renamed into place,
/// so a store directory either has every file or was never a store. [`FileStore::open`]
/// creates nothing: a missing directory or a missing file is an error, never a
/// store that starts over at zero.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    lock_timeout: Duration,
}

impl FileStore {
    /// Opens the existing store at `dir`. A missing or empty directory is
    /// [`FenceError::NoStore`]; a store with a file missing is [`FenceError::Corrupt`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, FenceError> {
        let store = FileStore {
            dir: dir.into(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        };
        store.check_complete()?;
        Ok(store)
    }

    /// Creates a new, empty store at `dir`, which must not exist or be an empty
    /// directory (its parent must exist); otherwise [`FenceError::AlreadyExists`].
    pub fn create(dir: impl Into<PathBuf>) -> Result<Self, FenceError> {
        let dir = dir.into();
        let parent = parent_dir(&dir).to_path_buf();
        let name = dir.file_name().ok_or_else(|| FenceError::NoStore {
            path: dir.clone(),
            reason: "the path names no directory".into(),
        })?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut temp_name = OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".creating-{}-{nanos}", std::process::id()));
        let temp = parent.join(temp_name);
        fs::create_dir(&temp).map_err(io_error("create fence store directory", &temp))?;
        let filled = FileStore {
            dir: temp.clone(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        };
        let made = filled.fill().and_then(|()| {
            // Renaming onto an empty directory replaces it; onto anything else fails.
            match fs::rename(&temp, &dir) {
                Ok(()) => Ok(()),
                Err(e)
                    if e.kind() == io::ErrorKind::DirectoryNotEmpty
                        || e.kind() == io::ErrorKind::AlreadyExists
                        || e.kind() == io::ErrorKind::NotADirectory =>
                {
                    Err(FenceError::AlreadyExists { path: dir.clone() })
                }
                Err(e) => Err(io_error("move into place the new fence store", &dir)(e)),
            }
        });
        if let Err(e) = made {
            let _ = fs::remove_dir_all(&temp);
            return Err(e);
        }
        // The new directory's own entry must survive a crash too, or a reboot
        // could bring back no store after tokens were admitted.
        sync_dir(&parent)?;
        Ok(FileStore {
            dir,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }

    /// Opens the store at `dir`, creating it first when the directory does not
    /// exist or is empty. A damaged store is an error here too.
    pub fn open_or_create(dir: impl Into<PathBuf>) -> Result<Self, FenceError> {
        let dir = dir.into();
        match FileStore::open(&dir) {
            Err(FenceError::NoStore { .. }) => match FileStore::create(&dir) {
                // Another process created it meanwhile.
                Err(FenceError::AlreadyExists { .. }) => FileStore::open(&dir),
                created => created,
            },
            opened => opened,
        }
    }

    /// How long an admit waits for another writer to let go of the store's lock
    /// before it fails with [`FenceError::Locked`]; default [`DEFAULT_LOCK_TIMEOUT`].
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The files of a new store, in a directory nobody else sees yet.
    fn fill(&self) -> Result<(), FenceError> {
        let lock = self.dir.join(LOCK_FILE);
        File::create(&lock).map_err(io_error("create", &lock))?;
        let journal = self.journal_path();
        File::create(&journal)
            .and_then(|f| f.sync_all())
            .map_err(io_error("create", &journal))?;
        self.write_marks(Marks::new())
    }

    /// The directory holds a whole store: both data files are there.
    fn check_complete(&self) -> Result<(), FenceError> {
        let no_store = |reason: String| FenceError::NoStore {
            path: self.dir.clone(),
            reason,
        };
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(no_store("the directory does not exist".into()));
            }
            Err(e) => return Err(io_error("open fence store directory", &self.dir)(e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error("list fence store directory", &self.dir))?;
            names.push(entry.file_name());
        }
        if names.is_empty() {
            return Err(no_store("the directory is empty".into()));
        }
        for file in [MARKS_FILE, JOURNAL_FILE] {
            if !names.iter().any(|n| n == file) {
                return Err(FenceError::Corrupt {
                    path: self.dir.join(file),
                    reason: "the file is missing (deleted, or this is not a fence store); \
                             a store is never started over: restore it, or remove the \
                             directory and create a new store on purpose"
                        .into(),
                });
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn marks_path(&self) -> PathBuf {
        self.dir.join(MARKS_FILE)
    }

    pub fn journal_path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// Waits (at most the lock timeout) until this process holds the store's
    /// exclusive lock; dropping the returned file releases it.
    ///
    /// `flock(2)` has no timeout of its own, so this polls `try_lock` with short
    /// sleeps (1 ms, doubling to 4 ms): a blocking `flock` could only be bounded
    /// from another thread or with a signal, and would then still take the lock
    /// after its caller gave up.
    fn lock(&self) -> Result<File, FenceError> {
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_error("open lock file", &path))?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(io_error("lock", &path)(e)),
            }
            let waited = started.elapsed();
            if waited >= self.lock_timeout {
                return Err(FenceError::Locked {
                    path: self.dir.clone(),
                    waited,
                });
            }
            std::thread::sleep(pause.min(self.lock_timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(4));
        }
    }

    fn read_marks(&self) -> Result<Marks, FenceError> {
        let path = self.marks_path();
        // A missing file is an error too: a store is created whole.
        let bytes = fs::read(&path).map_err(io_error("read", &path))?;
        match serde_json::from_slice::<MarksFile>(&bytes) {
            Ok(file) => Ok(file.highest),
            Err(e) => Err(FenceError::Corrupt {
                path,
                reason: e.to_string(),
            }),
        }
    }

    /// Replaces the marks file: temp file, fsync, rename, fsync the directory.
    /// Called only under the lock, so one fixed temp name is enough; a temp file
    /// left by a crashed writer is simply overwritten.
    fn write_marks(&self, highest: Marks) -> Result<(), FenceError> {
        let temp = self.dir.join(MARKS_TEMP);
        let path = self.marks_path();
        let mut bytes = serde_json::to_vec_pretty(&MarksFile { highest })
            .expect("a map from strings to integers always serializes");
        bytes.push(b'\n');
        let mut file = File::create(&temp).map_err(io_error("create", &temp))?;
        file.write_all(&bytes).map_err(io_error("write", &temp))?;
        file.sync_all().map_err(io_error("sync", &temp))?;
        fs::rename(&temp, &path).map_err(io_error("rename into place", &path))?;
        sync_dir(&self.dir)
    }

    fn append_journal(&self, entry: &JournalEntry) -> Result<(), FenceError> {
        let path = self.journal_path();
        // No `create`: a store is created whole, so a missing journal is damage.
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io_error("open", &path))?;
        cut_torn_tail(&mut file).map_err(io_error("repair torn tail of", &path))?;
        let mut line = serde_json::to_string(entry).expect("a journal entry always serializes");
        line.push('\n');
        file.write_all(line.as_bytes())
            .map_err(io_error("append to", &path))?;
        // Synced before the admit returns, so an acknowledged write is on disk.
        file.sync_data().map_err(io_error("sync", &path))
    }
}

impl FenceStore for FileStore {
    fn admit(
        &mut self,
        key: &str,
        token: u64,
        payload: Option<&str>,
    ) -> Result<Admitted, FenceError> {
        let _lock = self.lock()?;
        // Re-read under the lock every time: another process may have raised the
        // mark since this one last looked.
        let mut marks = self.read_marks()?;
        let admitted = check(key, token, marks.get(key).copied())?;
        if admitted.raised() {
            marks.insert(key.to_owned(), token);
            self.write_marks(marks)?;
        }
        // The mark is durable before the journal line is written: a crash between
        // the two loses an unacknowledged write, but the journal never shows a
        // token that a lower one could follow.
        if let Some(payload) = payload {
            self.append_journal(&JournalEntry {
                key: key.to_owned(),
                token,
                payload: payload.to_owned(),
            })?;
        }
        Ok(admitted)
    }

    /// Needs no lock: the marks file is only ever replaced whole by rename.
    fn marks(&mut self) -> Result<Marks, FenceError> {
        self.read_marks()
    }

    /// Needs no lock: lines are appended whole, and a trailing fragment without
    /// its newline (an append in flight, or torn by a crash) was never acknowledged
    /// and is skipped. Any complete line that does not parse is corruption.
    fn journal(&mut self) -> Result<Vec<JournalEntry>, FenceError> {
        let path = self.journal_path();
        let bytes = fs::read(&path).map_err(io_error("read", &path))?;
        let complete = match bytes.iter().rposition(|&b| b == b'\n') {
            Some(last) => &bytes[..=last],
            None => &[][..],
        };
        complete
            .split_inclusive(|&b| b == b'\n')
            .enumerate()
            .map(|(n, line)| {
                serde_json::from_slice(&line[..line.len() - 1]).map_err(|e| FenceError::Corrupt {
                    path: path.clone(),
                    reason: format!("line {}: {e}", n + 1),
                })
            })
            .collect()
    }
}

/// A crash in the middle of an append can leave a line without its newline. That
/// write was never acknowledged, so cut it off rather than glue the next line to it.
fn cut_torn_tail(file: &mut File) -> io::Result<()> {
    if file.metadata()?.len() == 0 {
        return Ok(());
    }
    let mut last = [0u8];
    file.seek(SeekFrom::End(-1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    // Only after a crash, so reading the whole journal here is fine.
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    file.set_len(keep as u64)?;
    file.sync_data()
}

fn sync_dir(dir: &Path) -> Result<(), FenceError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync directory", dir))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
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
            Err(FenceError::Stale {
                key,
                token,
                highest,
            }) => assert_eq!((key.as_str(), token, highest), ("k", 33, 34)),
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
                Err(FenceError::Stale {
                    token: t, highest, ..
                }) => {
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
