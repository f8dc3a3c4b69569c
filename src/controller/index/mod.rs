//! One in-memory index of Leases, LeaseClaims and Pods, fed by watch events.
//!
//! The index changes in two ways only: [`Index::handle`] takes every watch event of
//! the three kinds, (re)lists included, and [`Index::apply_outcome`] what a write pass
//! wrote or read (guarded by UID, so it never resurrects or overwrites an object the
//! watches replaced). Both return (or lead to) the Leases whose grant decision may
//! have changed, so the controller re-decides only those; the `apply_*`/`delete_*`
//! they share are public for tests, which feed objects directly. The index also keeps the
//! expiry bookkeeping of DESIGN rule 4: the instant (controller's monotonic
//! clock) at which it last *observed* each claim's renewal, and since when it
//! has seen each holder.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::crd::{Lease, LeaseClaim, RENEWED_TOKEN_ANNOTATION};
use crate::token::resource_version_newer;

mod entries;
mod holder;
mod pods;
#[cfg(test)]
mod tests;
mod watched;

pub(crate) use entries::PodEntry;
pub use entries::{ClaimEntry, Counts, ExpiryConfirmed, LeaseKey, POD_GRACE, PodProblem};
use entries::{LeaseEntry, Totals};
use holder::{expiry_confirmed, holder_clock, holder_renewed};
use watched::Relist;
pub use watched::Watched;

/// A claim together with what its pod says about it, as the grant decision sees it.
#[derive(Debug, Clone)]
pub struct ClaimView<'a> {
    pub claim: &'a ClaimEntry,
    pub pod_problem: Option<PodProblem>,
    /// The problem is final for the claim's pod (`pods`): no quorum read needed.
    pub pod_gone_for_certain: bool,
}

/// Everything the grant decision needs about one Lease name.
#[derive(Debug)]
pub struct LeaseView<'a> {
    pub key: &'a LeaseKey,
    pub lease: Option<&'a Lease>,
    pub claims: Vec<ClaimView<'a>>,
    /// The clock of each slot's holder, in slot order.
    pub holders: Vec<HolderView>,
    /// When a claim whose pod has not been seen yet stops waiting for it.
    pub pod_recheck: Option<Instant>,
    /// UIDs of claims that held a Lease object of this name that is gone.
    pub deleted_holders: &'a [String],
    /// UIDs of claims whose expiry this controller wrote without marking them first.
    pub expired_holders: &'a [String],
}

/// One slot's holder, as the index keeps its clock (DESIGN rule 4, `holder`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    pub slot: i32,
    /// The holder's claim UID.
    pub uid: String,
    /// When its grant expires on the controller's clock.
    pub deadline: Option<Instant>,
    /// Its claim shows a renewal of this very grant (its token in
    /// `palisade.dev/renewed-token`): its client's first renewal of it has landed.
    pub renewed: bool,
    /// When the quorum read that confirms its expiry ahead of it is due (`holder`,
    /// "Expiry is one write"): for a renewed holder not yet confirmed.
    pub expiry_check_at: Option<Instant>,
    /// A quorum read made since [`HolderView::expiry_check_at`] found its claim as
    /// the index shows it: its expiry needs no read of its own.
    pub expiry_confirmed: bool,
    /// A watch event said its claim was deleted (not a relist leaving it out).
    pub deleted: bool,
}

impl LeaseView<'_> {
    /// When to decide this Lease again if nothing changes: a holder's expiry, the
    /// read ahead of it, or a pod recheck, whichever comes first.
    pub fn wake_at(&self) -> Option<Instant> {
        self.holders
            .iter()
            .flat_map(|h| [h.deadline, h.expiry_check_at])
            .chain([self.pod_recheck])
            .flatten()
            .min()
    }

    /// The clock of the holder whose claim has this UID.
    pub fn holder(&self, uid: &str) -> Option<&HolderView> {
        self.holders.iter().find(|h| h.uid == uid)
    }
}

/// What a write pass wrote, or read with a quorum read, of one Lease's objects:
/// besides watch events ([`Index::handle`]), the only way the index changes
/// ([`Index::apply_outcome`]).
#[derive(Debug, Default)]
pub struct Learned {
    /// The UID of the Lease object the decision was computed for: what the pass
    /// learned applies to that object only, never to one re-created under its name.
    pub lease_uid: Option<String>,
    /// The Lease as written, or as freshly read after a failed write or check.
    pub lease: Option<Lease>,
    /// A read found no Lease of this name.
    pub lease_gone: bool,
    /// Claims as the pass wrote them.
    pub written_claims: Vec<LeaseClaim>,
    /// Claims and pods as a quorum read showed them when it refuted an ending.
    pub read_claims: Vec<LeaseClaim>,
    pub read_pods: Vec<Pod>,
    /// The Lease write ended these claims' grants as expired, their marks deferred.
    pub expired_unmarked: Vec<String>,
    /// Quorum reads found these holders' claims not renewed.
    pub expiries_confirmed: Vec<ExpiryConfirmed>,
}

#[derive(Debug, Default)]
pub struct Index {
    leases: HashMap<LeaseKey, LeaseEntry>,
    /// (namespace, claim name) -> its Lease, to find a claim on deletion.
    claim_lease: HashMap<(String, String), LeaseKey>,
    pods: HashMap<(String, String), PodEntry>,
    /// (namespace, pod name) -> leases with a claim naming that pod.
    pod_leases: HashMap<(String, String), BTreeSet<LeaseKey>>,
    /// Kept up to date on every change, so the gauges cost nothing per event at 10,000 Leases.
    counts: Totals,
    relist: Relist,
}

impl Index {
    /// Applies one watch event of a Lease, claim or pod. A (re)list's objects are
    /// applied as they come; when it is complete, the objects of that kind it did
    /// not deliver (deleted while the watch was down) are forgotten.
    pub fn handle<K: Watched>(&mut self, event: Event<K>, now: Instant) -> Vec<LeaseKey> {
        match event {
            Event::Apply(object) => object.apply_to(self, now),
            Event::Delete(object) => object.delete_from(self),
            Event::Init => {
                K::clear_listed(self);
                Vec::new()
            }
            Event::InitApply(object) => {
                object.list(self);
                object.apply_to(self, now)
            }
            Event::InitDone => {
                self.relist.synced[K::SLOT] = true;
                K::retain_listed(self)
            }
        }
    }

    /// Every watch (Leases, claims, pods) has delivered its initial list.
    pub fn is_synced(&self) -> bool {
        self.relist.synced.iter().all(|s| *s)
    }

    pub fn lease_count(&self) -> usize {
        self.counts.sum.leases
    }

    pub fn held_count(&self) -> usize {
        self.counts.sum.held
    }

    /// Claims waiting, summed over the Leases' `status.waitingCount`.
    pub fn waiting_count(&self) -> usize {
        self.counts.sum.waiting
    }

    /// The most claims waiting for any one Lease (its `status.waitingCount`).
    pub fn longest_queue(&self) -> usize {
        self.counts.longest_queue()
    }

    /// The counts recomputed from every entry; tests check the running ones against it.
    #[cfg(test)]
    pub fn counts_by_walking(&self) -> Counts {
        self.leases.values().fold(Counts::default(), |mut sum, e| {
            sum.replace(Counts::default(), Counts::of(e));
            sum
        })
    }

    /// [`Index::longest_queue`] recomputed from every entry.
    #[cfg(test)]
    pub fn longest_queue_by_walking(&self) -> usize {
        self.leases
            .values()
            .map(|e| Counts::of(e).waiting)
            .max()
            .unwrap_or(0)
    }

    /// The index's own copy of `key` when it has one, so copies share their strings.
    fn shared(&self, key: LeaseKey) -> LeaseKey {
        self.leases
            .get_key_value(&key)
            .map_or(key, |(k, _)| k.clone())
    }

    pub fn keys(&self) -> Vec<LeaseKey> {
        self.leases.keys().cloned().collect()
    }

    pub fn lease(&self, key: &LeaseKey) -> Option<&Arc<Lease>> {
        self.leases.get(key)?.lease.as_ref()
    }

    /// The UID of the claim of that name the index holds.
    pub fn claim_uid(&self, namespace: &str, name: &str) -> Option<&str> {
        let key = self
            .claim_lease
            .get(&(namespace.to_string(), name.to_string()))?;
        Some(self.leases.get(key)?.claim(name)?.uid.as_str())
    }

    /// Applies a Lease; an object older than the one held (by resourceVersion) is ignored,
    /// so a late watch event never undoes the controller's own newer write.
    pub fn apply_lease(&mut self, mut lease: Lease, now: Instant) -> Option<LeaseKey> {
        let key = self.shared(LeaseKey::new(
            lease.namespace().unwrap_or_default(),
            lease.name_any(),
        ));
        let entry = self.leases.entry(key.clone()).or_default();
        if entry
            .lease
            .as_ref()
            .is_some_and(|current| current.metadata.uid != lease.metadata.uid)
        {
            // Re-created before the old one's delete event arrived.
            let before = Counts::of(entry);
            entry.lease_gone(None);
            self.counts.replace(before, Counts::of(entry));
        }
        if let Some(current) = &entry.lease {
            let same_object = current.metadata.uid == lease.metadata.uid;
            let older = resource_version_newer(
                current.resource_version().as_deref().unwrap_or(""),
                lease.resource_version().as_deref().unwrap_or(""),
            ) == Some(true);
            if same_object && older {
                return None;
            }
            if same_object && current.resource_version() == lease.resource_version() {
                return None;
            }
        }
        let before = Counts::of(entry);
        let rows = lease
            .status
            .as_ref()
            .map(|s| s.slot_rows())
            .unwrap_or_default();
        let holders: Vec<String> = rows
            .into_iter()
            .filter_map(|r| Some(r.holder?.claim_uid))
            .collect();
        entry.holders_deleted.retain(|uid| holders.contains(uid));
        let mut since = std::mem::take(&mut entry.holders_since);
        entry.holders_since = holders
            .into_iter()
            .map(
                |uid| match since.iter().position(|(seen, _)| *seen == uid) {
                    Some(i) => since.swap_remove(i),
                    None => (uid, now),
                },
            )
            .collect();
        // Write responses arrive here unslimmed, and the watch event of the same
        // version is then skipped above: slim whatever is kept.
        super::slim::slim(&mut lease);
        entry.lease = Some(Arc::new(lease));
        self.counts.replace(before, Counts::of(entry));
        Some(key)
    }

    pub fn delete_lease(&mut self, lease: &Lease) -> Option<LeaseKey> {
        let key = LeaseKey::new(lease.namespace().unwrap_or_default(), lease.name_any());
        let entry = self.leases.get_mut(&key)?;
        // A delete event of an older object must not remove a re-created one.
        if entry.lease.as_ref().map(|l| &l.metadata.uid) != Some(&lease.metadata.uid) {
            return None;
        }
        self.counts.replace(Counts::of(entry), Counts::default());
        entry.lease_gone(Some(lease));
        self.forget_if_empty(&key);
        Some(key)
    }

    pub fn apply_claim(&mut self, claim: LeaseClaim, now: Instant) -> Vec<LeaseKey> {
        let namespace = claim.namespace().unwrap_or_default();
        let name = claim.name_any();
        let mut touched = Vec::new();
        // leaseName is immutable, but a claim re-created under the same name may name another lease.
        if let Some(old_lease) = self
            .claim_lease
            .get(&(namespace.clone(), name.clone()))
            .cloned()
            && *old_lease.name != *claim.spec.lease_name
        {
            touched.extend(self.remove_claim(&namespace, &name));
        }
        let key = self.shared(LeaseKey::new(
            namespace.as_str(),
            claim.spec.lease_name.as_str(),
        ));
        let entry = self.leases.entry(key.clone()).or_default();
        let previous = entry.claim(&name);
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        // The controller applies its own writes before their watch events arrive:
        // an event older than what we hold must not roll the claim back.
        let incoming_rv = claim.metadata.resource_version.as_deref().unwrap_or("");
        if let Some(p) = previous
            && p.uid == uid
            && resource_version_newer(&p.resource_version, incoming_rv) == Some(true)
        {
            return touched;
        }
        let renew_time = claim.spec.renew_time.as_ref().map(|t| t.0);
        let first_seen = match previous {
            Some(p) if p.uid == uid => p.first_seen,
            _ => now,
        };
        let renew_observed_at = match previous {
            Some(p) if p.uid == uid && p.renew_time == renew_time => p.renew_observed_at,
            _ => now,
        };
        let new = ClaimEntry {
            name: name.clone(),
            uid,
            created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
            generation: claim.metadata.generation,
            holder_identity: claim.spec.holder_identity.clone(),
            pod: claim.spec.pod.clone(),
            slot: claim.spec.slot,
            renew_time,
            renewed_token: claim
                .annotations()
                .get(RENEWED_TOKEN_ANNOTATION)
                .and_then(|t| t.parse().ok()),
            deleting: claim.metadata.deletion_timestamp.is_some(),
            status: claim.status.clone().unwrap_or_default(),
            resource_version: claim.metadata.resource_version.clone().unwrap_or_default(),
            first_seen,
            renew_observed_at,
        };
        if previous == Some(&new) {
            return touched;
        }
        if let Some(pod) = &new.pod {
            self.pod_leases
                .entry((namespace.clone(), pod.name.clone()))
                .or_default()
                .insert(key.clone());
        }
        entry.put_claim(new);
        self.claim_lease.insert((namespace, name), key.clone());
        touched.push(key);
        touched
    }

    pub fn delete_claim(&mut self, claim: &LeaseClaim) -> Vec<LeaseKey> {
        let namespace = claim.namespace().unwrap_or_default();
        let name = claim.name_any();
        // Only the object we hold: a delete of an older incarnation is stale.
        let held_uid = self
            .claim_lease
            .get(&(namespace.clone(), name.clone()))
            .and_then(|key| self.leases.get(key))
            .and_then(|e| e.claim(&name))
            .map(|c| c.uid.clone());
        if held_uid.is_some() && held_uid != claim.metadata.uid {
            return Vec::new();
        }
        if let Some(entry) = self
            .claim_lease
            .get(&(namespace.clone(), name.clone()))
            .and_then(|key| self.leases.get_mut(key))
            && let Some(uid) = &claim.metadata.uid
            && entry.holders_since.iter().any(|(held, _)| held == uid)
            && !entry.holders_deleted.contains(uid)
        {
            entry.holders_deleted.push(uid.clone());
        }
        self.remove_claim(&namespace, &name)
    }

    fn remove_claim(&mut self, namespace: &str, name: &str) -> Vec<LeaseKey> {
        let Some(key) = self
            .claim_lease
            .remove(&(namespace.to_string(), name.to_string()))
        else {
            return Vec::new();
        };
        if let Some(entry) = self.leases.get_mut(&key)
            && let Some(removed) = entry.take_claim(name)
            && let Some(pod) = removed.pod
        {
            let pod_key = (namespace.to_string(), pod.name);
            let still_named = entry
                .claims
                .iter()
                .any(|c| c.pod.as_ref().map(|p| &p.name) == Some(&pod_key.1));
            if !still_named {
                self.unname_pod(&pod_key, &key);
            }
        }
        self.forget_if_empty(&key);
        vec![key]
    }

    /// After a watch (re)list, whose objects were applied as they came: forgets the
    /// Leases it did not list (deleted while the watch was down). Returns the keys touched.
    pub fn retain_leases(&mut self, listed: &HashSet<LeaseKey>) -> Vec<LeaseKey> {
        let mut touched: Vec<LeaseKey> = Vec::new();
        for (key, entry) in self.leases.iter_mut() {
            if entry.lease.is_some() && !listed.contains(key) {
                self.counts.replace(Counts::of(entry), Counts::default());
                entry.lease_gone(None);
                touched.push(key.clone());
            }
        }
        for key in &touched {
            self.forget_if_empty(key);
        }
        touched
    }

    /// [`Index::retain_leases`] for claims, by (namespace, name).
    pub fn retain_claims(&mut self, listed: &HashSet<(String, String)>) -> Vec<LeaseKey> {
        let gone: Vec<(String, String)> = self
            .claim_lease
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        let mut touched = Vec::new();
        for (ns, name) in gone {
            touched.extend(self.remove_claim(&ns, &name));
        }
        touched
    }

    fn forget_if_empty(&mut self, key: &LeaseKey) {
        if let Some(e) = self.leases.get(key)
            && e.lease.is_none()
            && e.claims.is_empty()
        {
            self.leases.remove(key);
        }
    }

    /// Applies what a write pass learned about `key`'s objects; returns whether a
    /// quorum read changed the index (so deciding again at once can come out
    /// differently). Only to the objects the index still holds, by UID: a delete
    /// event that arrived while the pass ran wins (re-adding the object would leave a
    /// ghost that nothing corrects, and a ghost claim could be granted), and an object
    /// re-created under the same name is never overwritten or removed.
    pub fn apply_outcome(&mut self, key: &LeaseKey, learned: Learned, now: Instant) -> bool {
        let held = self.lease(key).map(|l| l.metadata.uid.clone());
        if held.is_some() && held == Some(learned.lease_uid) {
            if let Some(entry) = self.leases.get_mut(key) {
                for confirmed in learned.expiries_confirmed {
                    entry.expiries_confirmed.retain(|c| c.uid != confirmed.uid);
                    entry.expiries_confirmed.push(confirmed);
                }
            }
            if let Some(lease) = learned.lease {
                // Its new version, or (read after a failed write) its successor.
                self.apply_lease(lease, now);
                if let Some(entry) = self.leases.get_mut(key) {
                    for uid in learned.expired_unmarked {
                        entry.expired_unmarked(uid);
                    }
                }
            } else if learned.lease_gone
                && let Some(lease) = self.lease(key).map(|l| (**l).clone())
            {
                self.delete_lease(&lease);
            }
        }
        for claim in learned.written_claims {
            if self.holds_claim(&claim) {
                self.apply_claim(claim, now);
            }
        }
        let mut refreshed = false;
        for claim in learned.read_claims {
            if self.holds_claim(&claim) {
                refreshed |= !self.apply_claim(claim, now).is_empty();
            }
        }
        for pod in learned.read_pods {
            let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
            if self.pod_uid(&namespace, &name) == pod.uid().as_deref() {
                refreshed |= !self.apply_pod(&pod).is_empty();
            }
        }
        refreshed
    }

    /// The index holds this claim object (its name, with its UID).
    fn holds_claim(&self, claim: &LeaseClaim) -> bool {
        let namespace = claim.namespace().unwrap_or_default();
        self.claim_uid(&namespace, &claim.name_any()) == claim.uid().as_deref()
    }

    /// What the grant decision sees for one Lease name.
    pub fn view<'a>(&'a self, key: &'a LeaseKey, now: Instant) -> Option<LeaseView<'a>> {
        let entry = self.leases.get(key)?;
        let rows = entry
            .lease
            .as_ref()
            .and_then(|l| l.status.as_ref())
            .map(|s| s.slot_rows())
            .unwrap_or_default();
        let claims: Vec<ClaimView<'a>> = entry
            .claims
            .iter()
            .map(|claim| {
                let claim: &ClaimEntry = claim;
                let mut pod_problem = self.pod_problem(&key.namespace, claim, now);
                // A holder's pod was seen when it was granted (or in the complete
                // list after a restart): if it is missing now, it is gone.
                if pod_problem == Some(PodProblem::NotSeenYet)
                    && entry.holders_since.iter().any(|(uid, _)| *uid == claim.uid)
                {
                    pod_problem = Some(PodProblem::Gone);
                }
                ClaimView {
                    claim,
                    pod_problem,
                    pod_gone_for_certain: self.pod_gone_for_certain(&key.namespace, claim),
                }
            })
            .collect();
        let pod_recheck = claims
            .iter()
            .filter(|c| c.pod_problem == Some(PodProblem::NotSeenYet))
            .map(|c| c.claim.first_seen + POD_GRACE)
            .min();
        let holders = rows
            .iter()
            .filter_map(|row| {
                let uid = row.holder.as_ref()?.claim_uid.clone();
                let clock = holder_clock(entry, row);
                let renewed = holder_renewed(entry, row);
                let confirmed = expiry_confirmed(entry, row);
                Some(HolderView {
                    slot: row.slot,
                    deadline: clock.map(|(alive, duration)| alive + duration),
                    renewed,
                    expiry_check_at: clock
                        .filter(|_| renewed && !confirmed)
                        .map(|(alive, duration)| alive + duration * 5 / 6),
                    expiry_confirmed: confirmed,
                    deleted: entry.holders_deleted.contains(&uid),
                    uid,
                })
            })
            .collect();
        Some(LeaseView {
            key,
            lease: entry.lease.as_deref(),
            claims,
            holders,
            pod_recheck,
            deleted_holders: &entry.deleted_holders,
            expired_holders: &entry.expired_holders,
        })
    }
}
