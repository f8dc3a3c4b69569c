//! Token files for programs that cannot speak HTTP (a shell script, a cron job): while
//! a grant is held, `<dir>/<namespace>/<name>/token` holds its fencing token and a
//! newline. It is written whole (a temporary file renamed over it) and removed when
//! the grant ends, before the claim is deleted on a release.
//!
//! A killed agent cannot remove its files, so the agent removes what a previous one
//! left when it starts (token files and the directories that held only them; nothing
//! else in the directory is touched), and a file is only as good as the agent being
//! alive: a program reads it right before the write it protects, and the fence
//! refuses the write if the token went stale in between. A token directory that holds
//! the agent's socket is refused.
//!
//! The agent runs on one thread, which also renews its grants: each file operation
//! runs on tokio's blocking pool, so a slow or stuck disk delays the file, never a
//! renewal.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::session::GrantKey;

const TOKEN: &str = "token";
const TEMPORARY: &str = ".token.tmp";

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

    pub fn path(&self, key: &GrantKey) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(&key.namespace).join(&key.name).join(TOKEN))
    }

    pub async fn write(&self, key: &GrantKey, token: i64) {
        let Some(path) = self.path(key) else { return };
        let lock = self.lock.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _one = lock.lock().unwrap();
            write_atomically(&path, format!("{token}\n").as_bytes()).map_err(|e| (path, e))
        })
        .await
        .expect("a token file write does not panic");
        if let Err((path, e)) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the token file");
        }
    }

    /// Removes the file if it still holds `token` (a later grant's file stays).
    pub async fn remove(&self, key: &GrantKey, token: i64) {
        let Some(path) = self.path(key) else { return };
        let lock = self.lock.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let _one = lock.lock().unwrap();
            let ours = std::fs::read_to_string(&path)
                .map(|held| held.trim() == token.to_string())
                .unwrap_or(false);
            match ours {
                true => std::fs::remove_file(&path).map_err(|e| (path, e)),
                false => Ok(()),
            }
        })
        .await
        .expect("a token file removal does not panic");
        if let Err((path, e)) = removed {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the token file");
        }
    }
}

fn write_atomically(path: &Path, content: &[u8]) -> io::Result<()> {
    let dir = path.parent().expect("a token file has a directory");
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(TEMPORARY);
    std::fs::write(&temporary, content)?;
    std::fs::rename(&temporary, path)
}

/// Removes `<dir>/<namespace>/<name>/token` (and its temporary) of every Lease, then
/// each directory that this left empty.
fn remove_left_behind(dir: &Path) -> io::Result<()> {
    for namespace in subdirectories(dir)? {
        for lease in subdirectories(&namespace)? {
            for file in [TOKEN, TEMPORARY] {
                match std::fs::remove_file(lease.join(file)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
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

    #[tokio::test]
    async fn a_file_lives_while_its_grant_does() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("leases/pay/old/token");
        std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
        std::fs::write(&stale, "3\n").unwrap();

        let files = TokenFiles::new(Some(dir.path().join("leases"))).unwrap();
        assert!(
            !stale.exists(),
            "a previous agent's files are removed at start"
        );
        let path = files.path(&key()).unwrap();
        files.write(&key(), 41).await;
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "41\n");
        // The next grant of the same Lease in this pod, before the old one's removal.
        files.write(&key(), 42).await;
        files.remove(&key(), 41).await;
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "42\n");
        files.remove(&key(), 42).await;
        assert!(!path.exists());
    }

    #[test]
    fn only_token_files_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let leases = dir.path().join("leases");
        let token = leases.join("pay/old/token");
        std::fs::create_dir_all(token.parent().unwrap()).unwrap();
        std::fs::write(&token, "3\n").unwrap();
        let data = leases.join("pay/keep/report.csv");
        std::fs::create_dir_all(data.parent().unwrap()).unwrap();
        std::fs::write(&data, "a,b\n").unwrap();
        let beside = leases.join("notes.txt");
        std::fs::write(&beside, "mine\n").unwrap();

        TokenFiles::new(Some(leases.clone())).unwrap();
        assert!(!token.exists(), "a previous agent's token file is removed");
        assert!(!leases.join("pay/old").exists(), "and its empty directory");
        assert_eq!(std::fs::read_to_string(&data).unwrap(), "a,b\n");
        assert_eq!(std::fs::read_to_string(&beside).unwrap(), "mine\n");
    }
}
