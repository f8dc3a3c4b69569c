//! Token files for programs that cannot speak HTTP (a shell script, a cron job): while
//! a grant is held, `<dir>/<namespace>/<name>/token` holds its fencing token and a
//! newline, and `slot` beside it the grant's slot (0 on a lock; a semaphore's fences
//! key each slot apart, `crate::permits::fence_key`). Each is written whole (a
//! temporary file renamed over it) and both are removed when the grant ends, before
//! the claim is deleted on a release.
//!
//! One directory per Lease suffices: a session holds at most one grant of a Lease.
//! Two sessions of the pod may hold two slots of one semaphore at once; the files
//! then show the latest grant, and are gone once it ends (a program finds no token
//! and does not write; the other session's grant is on the HTTP API).
//!
//! The two files cannot change together, so they change in an order a reader can
//! check: `token` goes first (removed before `slot` changes, written after it), and
//! a token never comes back once removed (a new grant's is higher). A program that
//! needs the slot reads `token`, `slot`, then `token` again: when both reads of
//! `token` agree, `slot` is that grant's.
//!
//! A killed agent cannot remove its files, so the agent removes what a previous one
//! left when it starts (token and slot files and the directories that held only
//! them; nothing else in the directory is touched), and a file is only as good as
//! the agent being alive: a program reads it right before the write it protects, and
//! the fence refuses the write if the token went stale in between. A token directory
//! that holds the agent's socket is refused.
//!
//! The agent runs on one thread, which also renews its grants: each file operation
//! runs on tokio's blocking pool, so a slow or stuck disk delays the file, never a
//! renewal.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::session::GrantKey;

const TOKEN: &str = "token";
const SLOT: &str = "slot";
/// Each file's temporary, renamed over it.
const TOKEN_TEMPORARY: &str = ".token.tmp";
const SLOT_TEMPORARY: &str = ".slot.tmp";

pub struct TokenFiles {
    dir: Option<PathBuf>,
    /// One file operation at a time: a grant that ends and the next grant of the same
    /// Lease in this pod must not interleave their write and removal.
    lock: Arc<Mutex<()>>,
}

impl TokenFiles {
    /// Token files under `dir` (none if `None`), from which the files a previous
    /// agent left are removed.
    pub fn new(dir: Option<PathBuf>) -> io::Result<Self> {
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir)?;
            remove_left_behind(dir)?;
        }
        Ok(Self {
            dir,
            lock: Arc::default(),
        })
    }

    /// The Lease's directory, which holds its `token` and `slot` files.
    pub fn lease_dir(&self, key: &GrantKey) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(&key.namespace).join(&key.name))
    }

    pub async fn write(&self, key: &GrantKey, token: i64, slot: i32) {
        self.run(key, "write", move |dir| write_grant(dir, token, slot))
            .await;
    }

    /// Removes the files if they still show this grant (a later grant's stay).
    pub async fn remove(&self, key: &GrantKey, token: i64, slot: i32) {
        self.run(key, "remove", move |dir| remove_grant(dir, token, slot))
            .await;
    }

    /// Runs one file operation on the Lease's directory, on the blocking pool.
    async fn run(
        &self,
        key: &GrantKey,
        what: &'static str,
        operation: impl FnOnce(&Path) -> io::Result<()> + Send + 'static,
    ) {
        let Some(dir) = self.lease_dir(key) else {
            return;
        };
        let lock = self.lock.clone();
        let done = tokio::task::spawn_blocking(move || {
            let _one = lock.lock().unwrap();
            operation(&dir).map_err(|e| (dir, e))
        })
        .await
        .expect("a token file operation does not panic");
        if let Err((dir, e)) = done {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot {what} the token files");
        }
    }
}

/// Another grant's token goes first, so that no reader pairs it with this slot.
fn write_grant(dir: &Path, token: i64, slot: i32) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    remove_if_there(&dir.join(TOKEN))?;
    write_atomically(dir, SLOT, SLOT_TEMPORARY, slot)?;
    write_atomically(dir, TOKEN, TOKEN_TEMPORARY, token)
}

/// Removes `token` then `slot` when they show this grant, and a `slot` of this grant
/// whose `token` a failed write left out.
fn remove_grant(dir: &Path, token: i64, slot: i32) -> io::Result<()> {
    let shows = |file: &str, value: String| match std::fs::read_to_string(dir.join(file)) {
        Ok(held) => Some(held.trim() == value),
        Err(_) => None,
    };
    let token_ours = shows(TOKEN, token.to_string());
    if shows(SLOT, slot.to_string()) != Some(true) || token_ours == Some(false) {
        return Ok(());
    }
    remove_if_there(&dir.join(TOKEN))?;
    remove_if_there(&dir.join(SLOT))
}

fn write_atomically(
    dir: &Path,
    file: &str,
    temporary: &str,
    value: impl std::fmt::Display,
) -> io::Result<()> {
    let temporary = dir.join(temporary);
    std::fs::write(&temporary, format!("{value}\n"))?;
    std::fs::rename(&temporary, dir.join(file))
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes `<dir>/<namespace>/<name>/{token,slot}` (and their temporaries) of every
/// Lease, then each directory that this left empty.
fn remove_left_behind(dir: &Path) -> io::Result<()> {
    for namespace in subdirectories(dir)? {
        for lease in subdirectories(&namespace)? {
            for file in [TOKEN, TOKEN_TEMPORARY, SLOT, SLOT_TEMPORARY] {
                remove_if_there(&lease.join(file))?;
            }
            remove_if_empty(&lease)?;
        }
        remove_if_empty(&namespace)?;
    }
    Ok(())
}

fn subdirectories(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            found.push(entry.path());
        }
    }
    Ok(found)
}

fn remove_if_empty(dir: &Path) -> io::Result<()> {
    if std::fs::read_dir(dir)?.next().is_none() {
        std::fs::remove_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> GrantKey {
        GrantKey {
            namespace: "pay".into(),
            name: "billing".into(),
        }
    }

    fn read(dir: &Path, file: &str) -> Option<String> {
        std::fs::read_to_string(dir.join(file)).ok()
    }

    #[tokio::test]
    async fn the_files_live_while_their_grant_does() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("leases/pay/old");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join(TOKEN), "3\n").unwrap();
        std::fs::write(stale.join(SLOT), "1\n").unwrap();

        let files = TokenFiles::new(Some(dir.path().join("leases"))).unwrap();
        assert!(
            !stale.exists(),
            "a previous agent's files are removed at start"
        );
        let lease = files.lease_dir(&key()).unwrap();
        files.write(&key(), 41, 0).await;
        assert_eq!(read(&lease, TOKEN).as_deref(), Some("41\n"));
        assert_eq!(read(&lease, SLOT).as_deref(), Some("0\n"), "a lock's slot");
        // The next grant of the same Lease in this pod, before the old one's removal.
        files.write(&key(), 42, 0).await;
        files.remove(&key(), 41, 0).await;
        assert_eq!(read(&lease, TOKEN).as_deref(), Some("42\n"));
        assert_eq!(read(&lease, SLOT).as_deref(), Some("0\n"));
        files.remove(&key(), 42, 0).await;
        assert_eq!((read(&lease, TOKEN), read(&lease, SLOT)), (None, None));
    }

    /// Two sessions of the pod in two slots of one semaphore, granted by one write:
    /// the same token, so the slot tells whose the files are.
    #[tokio::test]
    async fn grants_of_two_slots_with_one_token_keep_their_files_apart() {
        let dir = tempfile::tempdir().unwrap();
        let files = TokenFiles::new(Some(dir.path().to_path_buf())).unwrap();
        let lease = files.lease_dir(&key()).unwrap();
        files.write(&key(), 50, 1).await;
        files.write(&key(), 50, 2).await;
        assert_eq!(
            read(&lease, SLOT).as_deref(),
            Some("2\n"),
            "the latest grant"
        );
        files.remove(&key(), 50, 1).await;
        assert_eq!(read(&lease, TOKEN).as_deref(), Some("50\n"));
        assert_eq!(
            read(&lease, SLOT).as_deref(),
            Some("2\n"),
            "not slot 1's to remove"
        );
        files.remove(&key(), 50, 2).await;
        assert_eq!((read(&lease, TOKEN), read(&lease, SLOT)), (None, None));
    }

    #[tokio::test]
    async fn a_slot_whose_token_was_never_written_goes_with_its_grant() {
        let dir = tempfile::tempdir().unwrap();
        let files = TokenFiles::new(Some(dir.path().to_path_buf())).unwrap();
        let lease = files.lease_dir(&key()).unwrap();
        std::fs::create_dir_all(&lease).unwrap();
        std::fs::write(lease.join(SLOT), "3\n").unwrap();
        files.remove(&key(), 60, 4).await;
        assert_eq!(read(&lease, SLOT).as_deref(), Some("3\n"), "another slot's");
        files.remove(&key(), 60, 3).await;
        assert_eq!(read(&lease, SLOT), None);
    }

    #[test]
    fn only_token_files_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let leases = dir.path().join("leases");
        let token = leases.join("pay/old/token");
        std::fs::create_dir_all(token.parent().unwrap()).unwrap();
        std::fs::write(&token, "3\n").unwrap();
        std::fs::write(leases.join("pay/old/slot"), "0\n").unwrap();
        let data = leases.join("pay/keep/report.csv");
        std::fs::create_dir_all(data.parent().unwrap()).unwrap();
        std::fs::write(&data, "a,b\n").unwrap();
        let beside = leases.join("notes.txt");
        std::fs::write(&beside, "mine\n").unwrap();

        TokenFiles::new(Some(leases.clone())).unwrap();
        assert!(!token.exists(), "a previous agent's token file is removed");
        assert!(!leases.join("pay/old/slot").exists(), "and its slot file");
        assert!(!leases.join("pay/old").exists(), "and its empty directory");
        assert_eq!(std::fs::read_to_string(&data).unwrap(), "a,b\n");
        assert_eq!(std::fs::read_to_string(&beside).unwrap(), "mine\n");
    }
}
