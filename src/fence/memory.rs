//! [`MemoryStore`]: marks in memory, for a resource that lives in one process.

use std::collections::HashMap;

use super::{Admitted, FenceError, FenceStore, JournalEntry, Marks, check};

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
