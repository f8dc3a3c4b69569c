//! [`FileStore`]: marks in a directory, durable across crashes and shared by the
//! processes of one host.
//!
//! Why it is built so (the layout is on [`FileStore`]): a store is made only on
//! request ([`FileStore::create`], `palisade fence --create`), whole, and opening
//! creates nothing: a missing or empty directory is `NoStore`, a store without
//! `marks.json` or `journal.jsonl` is `Corrupt`, so a deleted or mistyped store never
//! restarts at token zero. Creating opens an existing store as it is and refuses a
//! non-empty directory that is not one. Waiting for the store's `flock` is bounded
//! (5 s by default, `--lock-timeout`; polled, since `flock` has no timeout): a writer
//! paused while holding it makes the others fail with `Locked` naming the store,
//! instead of blocking them, the new holder included.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Admitted, FenceError, FenceStore, JournalEntry, Marks, check};

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FenceError {
    let path = path.to_path_buf();
    move |source| FenceError::Io {
        action,
        path,
        source,
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
