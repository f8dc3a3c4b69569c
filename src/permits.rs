//! Permits: a Lease with `spec.permits` N grants up to N claims at once (a
//! semaphore), each in a *slot* `0..N-1` with a fencing token of its own.
//!
//! # Slots in the status
//!
//! Slot 0 is the Lease's top-level `status.holder`, `fencingToken` and
//! `acquireTime`, exactly as for a lock, so a lock (`permits: 1`, the default) keeps
//! today's objects and every reader of those fields (the object-fencing policies,
//! earlier clients) reads slot 0 of a semaphore as it reads a lock. Slots 1 and up
//! are rows of `status.slots`, each with its holder and its last token. A row is
//! never removed: lowering `permits` ends the grants of the slots above it (the way a
//! revocation does) and keeps their rows free, with their last tokens.
//!
//! # Tokens per slot
//!
//! Every grant of a write takes `max(highest token on the Lease + 1, rv + 1)`
//! (DESIGN rule 3 with the Lease's highest token in place of `fencingToken`), so a
//! slot's tokens increase strictly across grants, failovers and re-creation by the
//! same argument as a lock's; grants made by one write share that token, in
//! different slots. Fences key a slot's marks apart ([`fence_key`]): the holders of
//! different slots, which hold at once, never refuse each other, and a stale holder
//! of a slot meets its successor's mark. Fences compare tokens only, so the key is
//! what keeps slots apart: a write under another slot's key is refused only when its
//! token is lower. Every client hands a grant its own key.
//!
//! # The bound, 64
//!
//! Every grant and hand-over rewrites the whole status: 64 rows keep it under about
//! 16 KiB, and a semaphore wider than that is better sharded over several Leases.

use crate::crd::{Holder, LeaseStatus, SlotStatus};

pub use crate::crd::MAX_PERMITS;

/// The key every fence uses for a slot's marks: `<namespace>/<lease>` for slot 0 (a
/// lock's key, so a Lease whose `permits` is raised keeps its holder's marks) and
/// `<namespace>/<lease>#<slot>` for the others.
pub fn fence_key(namespace: &str, lease: &str, slot: i32) -> String {
    if slot == 0 {
        format!("{namespace}/{lease}")
    } else {
        format!("{namespace}/{lease}#{slot}")
    }
}

/// A grant as a claim's holder sees it in the Lease status.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotGrant<'s> {
    pub slot: i32,
    pub holder: &'s Holder,
    pub token: Option<i64>,
}

impl LeaseStatus {
    /// Every slot recorded, slot 0 first (from the top-level fields), in slot order.
    pub fn slot_rows(&self) -> Vec<SlotStatus> {
        let first = SlotStatus {
            slot: 0,
            holder: self.holder.clone(),
            fencing_token: self.fencing_token,
            acquire_time: self.acquire_time.clone(),
        };
        let mut rows: Vec<SlotStatus> = std::iter::once(first)
            .chain(self.slots.iter().filter(|s| s.slot > 0).cloned())
            .collect();
        rows.sort_by_key(|s| s.slot);
        rows.dedup_by_key(|s| s.slot);
        rows
    }

    /// Writes `rows` back (slot 0 to the top-level fields), with the `held` column
    /// for a semaphore. A lock with no other slot ever used keeps neither field.
    pub fn set_slot_rows(&mut self, rows: Vec<SlotStatus>, permits: i32) {
        let mut others = Vec::new();
        for row in rows {
            if row.slot == 0 {
                self.holder = row.holder;
                self.fencing_token = row.fencing_token;
                self.acquire_time = row.acquire_time;
            } else {
                others.push(row);
            }
        }
        others.sort_by_key(|s| s.slot);
        self.slots = others;
        let semaphore = permits > 1 || !self.slots.is_empty();
        self.held = semaphore.then(|| format!("{}/{permits}", self.held_count()));
    }

    /// How many slots have a holder.
    pub fn held_count(&self) -> usize {
        usize::from(self.holder.is_some())
            + self.slots.iter().filter(|s| s.holder.is_some()).count()
    }

    /// The slot whose holder is the claim with this UID, if any.
    pub fn grant_of(&self, claim_uid: &str) -> Option<SlotGrant<'_>> {
        let first = self.holder.as_ref().map(|h| SlotGrant {
            slot: 0,
            holder: h,
            token: self.fencing_token,
        });
        let others = self.slots.iter().filter_map(|s| {
            s.holder.as_ref().map(|h| SlotGrant {
                slot: s.slot,
                holder: h,
                token: s.fencing_token,
            })
        });
        first
            .into_iter()
            .chain(others)
            .find(|g| g.holder.claim_uid == claim_uid)
    }

    /// The highest token any slot of this Lease object recorded.
    pub fn highest_token(&self) -> Option<i64> {
        self.slots
            .iter()
            .filter_map(|s| s.fencing_token)
            .chain(self.fencing_token)
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(claim: &str) -> Holder {
        Holder {
            claim: claim.into(),
            claim_uid: format!("uid-{claim}"),
            identity: claim.into(),
            lease_duration_seconds: Some(15),
        }
    }

    fn row(slot: i32, claim: Option<&str>, token: Option<i64>) -> SlotStatus {
        SlotStatus {
            slot,
            holder: claim.map(holder),
            fencing_token: token,
            acquire_time: None,
        }
    }

    #[test]
    fn a_lock_keeps_todays_fields_only() {
        let mut status = LeaseStatus::default();
        status.set_slot_rows(vec![row(0, Some("a"), Some(7))], 1);
        assert_eq!(status.holder, Some(holder("a")));
        assert_eq!(status.fencing_token, Some(7));
        assert!(status.slots.is_empty());
        assert_eq!(status.held, None);
        assert_eq!(status.slot_rows(), vec![row(0, Some("a"), Some(7))]);
    }

    #[test]
    fn a_semaphore_keeps_slot_zero_on_top_and_the_others_in_rows() {
        let mut status = LeaseStatus::default();
        let rows = vec![
            row(2, None, Some(5)),
            row(0, None, Some(9)),
            row(1, Some("b"), Some(11)),
        ];
        status.set_slot_rows(rows, 3);
        assert_eq!(status.holder, None);
        assert_eq!(status.fencing_token, Some(9));
        assert_eq!(
            status.slots,
            vec![row(1, Some("b"), Some(11)), row(2, None, Some(5))]
        );
        assert_eq!(status.held.as_deref(), Some("1/3"));
        assert_eq!(status.highest_token(), Some(11));
        let grant = status.grant_of("uid-b").expect("b holds slot 1");
        assert_eq!((grant.slot, grant.token), (1, Some(11)));
        assert_eq!(status.grant_of("uid-a"), None);
        assert_eq!(status.slot_rows().len(), 3);
    }

    #[test]
    fn slot_zero_keys_like_a_lock_and_the_others_apart() {
        assert_eq!(fence_key("ns", "l", 0), "ns/l");
        assert_eq!(fence_key("ns", "l", 2), "ns/l#2");
    }
}
