//! Token files for programs that cannot speak HTTP (a shell script, a cron job): while
//! a grant is held, `<dir>/<namespace>/<name>/token` holds its fencing token and a
//! newline. It is written whole (a temporary file renamed over it) and removed when
//! the grant ends, before the claim is deleted on a release.
//!
//! A killed agent cannot remove its files, so the agent empties the directory when it
//! starts, and a file is only as good as the agent being alive: a program reads it
//! right before the write it protects, and the fence refuses the write if the token
//! went stale in between (DESIGN.md, "The agent").

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::session::GrantKey;

pub struct TokenFiles {
    dir: Option<PathBuf>,
    /// One file operation at a time: a grant that ends and the next grant of the same
    /// Lease in this pod must not interleave their write and removal.
    lock: Mutex<()>,
}

impl TokenFiles {
    /// Token files under `dir` (none if `None`), which is emptied of what a previous
    /// agent left.
    pub fn new(dir: Option<PathBuf>) -> io::Result<Self> {
        if let Some(dir) = &dir {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            std::fs::create_dir_all(dir)?;
        }
        Ok(Self {
            dir,
            lock: Mutex::new(()),
        })
    }

    pub fn path(&self, key: &GrantKey) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(&key.namespace).join(&key.name).join("token"))
    }

    pub fn write(&self, key: &GrantKey, token: i64) {
        let Some(path) = self.path(key) else { return };
        let _one = self.lock.lock().unwrap();
        if let Err(e) = write_atomically(&path, format!("{token}\n").as_bytes()) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the token file");
        }
    }

    /// Removes the file if it still holds `token` (a later grant's file stays).
    pub fn remove(&self, key: &GrantKey, token: i64) {
        let Some(path) = self.path(key) else { return };
        let _one = self.lock.lock().unwrap();
        let ours = std::fs::read_to_string(&path)
            .map(|held| held.trim() == token.to_string())
            .unwrap_or(false);
        if ours && let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the token file");
        }
    }
}

fn write_atomically(path: &Path, content: &[u8]) -> io::Result<()> {
    let dir = path.parent().expect("a token file has a directory");
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(".token.tmp");
    std::fs::write(&temporary, content)?;
    std::fs::rename(&temporary, path)
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

    #[test]
    fn a_file_lives_while_its_grant_does() {
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
        files.write(&key(), 41);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "41\n");
        // The next grant of the same Lease in this pod, before the old one's removal.
        files.write(&key(), 42);
        files.remove(&key(), 41);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "42\n");
        files.remove(&key(), 42);
        assert!(!path.exists());
    }
}
