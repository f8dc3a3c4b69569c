//! One in-memory index of Leases, LeaseClaims and Pods, fed by watch events.
//!
//! [`Index::handle`] takes every watch event of the three kinds, (re)lists included;
//! it and every `apply_*`/`delete_*` return the Leases whose grant decision may have
//! changed, so the controller re-decides only those. The index also keeps the
//! expiry bookkeeping of DESIGN rule 4: the instant (controller's monotonic
//! clock) at which it last *observed* each claim's renewal, and since when it
//! has seen each holder. Tests feed it objects directly.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};

use crate::api::{Lease, LeaseClaim, LeaseClaimStatus, MAX_LEASE_DURATION_SECONDS, PodRef};
use crate::token::resource_version_newer;

/// A Lease by namespace and name; also the unit of work of the controller.
///
/// Shared strings: the controller holds a key in its index, queue, timers and
/// claim map at once, and at 10,000 Leases each copy of two Strings adds up.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl LeaseKey {
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the controller needs of a LeaseClaim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimEntry {
    pub name: String,
    pub uid: String,
    pub created: Option<Timestamp>,
    pub generation: Option<i64>,
    pub holder_identity: String,
    pub pod: Option<PodRef>,
    pub renew_time: Option<Timestamp>,
    pub deleting: bool,
    pub status: LeaseClaimStatus,
    pub resource_version: String,
    /// When the index first saw this claim (this UID).
    pub first_seen: Instant,
    /// When the controller last observed a change of `spec.renewTime` (or first saw the claim).
    pub renew_observed_at: Instant,
}

/// How long a new claim may name a pod that the pod watch has not delivered yet
/// (the claim and pod watches are separate streams, so a claim can arrive first)
/// before the pod counts as gone.
pub const POD_GRACE: Duration = Duration::from_secs(10);

/// Why a claim's pod does not (or not yet) back it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodProblem {
    /// Not in the pod watch yet, and the claim is younger than [`POD_GRACE`]:
    /// the claim is neither granted nor revoked until it shows up.
    NotSeenYet,
    Gone,
    Replaced,
    Terminal(String),
}

impl PodProblem {
    pub fn describe(&self, pod: &str) -> String {
        use crate::conditions::messages;
        match self {
            PodProblem::NotSeenYet => messages::pod_not_seen(pod),
            PodProblem::Gone => messages::pod_deleted(pod),
            PodProblem::Replaced => messages::pod_replaced(pod),
            PodProblem::Terminal(phase) => messages::pod_terminal(pod, phase),
        }
    }
}

/// What the controller keeps of a Pod: exactly what decides whether it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodEntry {
    uid: String,
    /// `Succeeded`/`Failed`, or None while it may still run.
    terminal_phase: Option<String>,
    deleting: bool,
}

impl PodEntry {
    pub(crate) fn of(pod: &Pod) -> Self {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        PodEntry {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            terminal_phase: phase.filter(|p| p == "Succeeded" || p == "Failed"),
            deleting: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// "Pod gone" for a pod that exists (DESIGN "Pod gone"): why it no longer backs
    /// a claim that names it (with `uid`, when the claim gave one), or None. The
    /// index's view and the write pass's quorum check both ask this.
    pub(crate) fn problem(&self, uid: Option<&str>) -> Option<PodProblem> {
        if self.deleting {
            Some(PodProblem::Gone)
        } else if uid.is_some_and(|uid| uid != self.uid) {
            Some(PodProblem::Replaced)
        } else {
            self.terminal_phase.clone().map(PodProblem::Terminal)
        }
    }
}

#[derive(Debug, Default)]
struct LeaseEntry {
    lease: Option<Arc<Lease>>,
    /// Most Leases have a few claims: a list of boxes costs 8 bytes a claim where a
    /// map's node holds room for eleven; the decision sorts them itself. Boxed
    /// because a Vec's spare capacity (four slots after the first push) would
    /// otherwise hold 352-byte entries.
    #[allow(clippy::vec_box)]
    claims: Vec<Box<ClaimEntry>>,
    /// The holder's claim UID and when the index first saw it hold the lease.
    holder_since: Option<(String, Instant)>,
    /// Claims that held a Lease object of this name that is gone (deleted, or
    /// replaced by a re-created one): revoked even if their `Granted` mirror never
    /// landed, and never granted by a later Lease of the name.
    deleted_holders: Vec<String>,
}

impl LeaseEntry {
    fn claim(&self, name: &str) -> Option<&ClaimEntry> {
        self.claims.iter().find(|c| c.name == name).map(|c| &**c)
    }

    /// Inserts or replaces the claim of that name.
    fn put_claim(&mut self, claim: ClaimEntry) {
        match self.claims.iter_mut().find(|c| c.name == claim.name) {
            Some(slot) => **slot = claim,
            None => self.claims.push(Box::new(claim)),
        }
    }

    /// The Lease object held goes away; `last` is its final state when the watch
    /// delivered one (newer than ours, possibly).
    fn lease_gone(&mut self, last: Option<&Lease>) {
        let holder = |l: &Lease| Some(l.status.as_ref()?.holder.as_ref()?.claim_uid.clone());
        let uid = last
            .and_then(holder)
            .or_else(|| self.lease.as_deref().and_then(holder));
        let claims = &self.claims;
        self.deleted_holders.retain(|u| {
            claims
                .iter()
                .any(|c| c.uid == *u && !c.status.phase.is_some_and(|p| p.is_final()))
        });
        if let Some(uid) = uid
            && !self.deleted_holders.contains(&uid)
        {
            self.deleted_holders.push(uid);
        }
        self.lease = None;
        self.holder_since = None;
    }

    fn take_claim(&mut self, name: &str) -> Option<Box<ClaimEntry>> {
        let position = self.claims.iter().position(|c| c.name == name)?;
        Some(self.claims.swap_remove(position))
    }
}

/// A claim together with what its pod says about it, as the grant decision sees it.
#[derive(Debug, Clone)]
pub struct ClaimView<'a> {
    pub claim: &'a ClaimEntry,
    pub pod_problem: Option<PodProblem>,
}

/// Everything the grant decision needs about one Lease name.
#[derive(Debug)]
pub struct LeaseView<'a> {
    pub key: &'a LeaseKey,
    pub lease: Option<&'a Lease>,
    pub claims: Vec<ClaimView<'a>>,
    /// When the current holder's grant expires on the controller's clock.
    pub holder_deadline: Option<Instant>,
    /// When a claim whose pod has not been seen yet stops waiting for it.
    pub pod_recheck: Option<Instant>,
    /// UIDs of claims that held a Lease object of this name that is gone.
    pub deleted_holders: &'a [String],
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
    counts: Counts,
    relist: Relist,
}

/// What each watch's (re)list has delivered so far. Its objects go into the index as
/// they come (holding 30,000 of them until the list ends would double the
/// controller's memory at 10,000 Leases); at its end, whatever it did not list is
/// forgotten.
#[derive(Debug, Default)]
struct Relist {
    leases: HashSet<LeaseKey>,
    claims: HashSet<(String, String)>,
    pods: HashSet<(String, String)>,
    /// Leases, claims, pods: initial list delivered.
    synced: [bool; 3],
}

fn name_of(object: &impl Resource) -> (String, String) {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A kind of object the index is fed by a watch: how one is applied and deleted, and
/// how a (re)list's objects are remembered and the rest forgotten.
pub trait Watched: Resource + Sized {
    /// Its place in the index's record of which watches have synced.
    #[doc(hidden)]
    const SLOT: usize;
    #[doc(hidden)]
    fn apply_to(self, index: &mut Index, now: Instant) -> Vec<LeaseKey>;
    #[doc(hidden)]
    fn delete_from(&self, index: &mut Index) -> Vec<LeaseKey>;
    /// The relist has delivered this object.
    #[doc(hidden)]
    fn list(&self, index: &mut Index);
    /// The relist is complete: forgets what it did not deliver.
    #[doc(hidden)]
    fn retain_listed(index: &mut Index) -> Vec<LeaseKey>;
    /// A relist starts.
    #[doc(hidden)]
    fn clear_listed(index: &mut Index);
}

impl Watched for Lease {
    const SLOT: usize = 0;
    fn apply_to(self, index: &mut Index, now: Instant) -> Vec<LeaseKey> {
        index.apply_lease(self, now).into_iter().collect()
    }
    fn delete_from(&self, index: &mut Index) -> Vec<LeaseKey> {
        index.delete_lease(self).into_iter().collect()
    }
    fn list(&self, index: &mut Index) {
        let (namespace, name) = name_of(self);
        index.relist.leases.insert(LeaseKey::new(namespace, name));
    }
    fn retain_listed(index: &mut Index) -> Vec<LeaseKey> {
        let listed = std::mem::take(&mut index.relist.leases);
        index.retain_leases(&listed)
    }
    fn clear_listed(index: &mut Index) {
        index.relist.leases.clear();
    }
}

impl Watched for LeaseClaim {
    const SLOT: usize = 1;
    fn apply_to(self, index: &mut Index, now: Instant) -> Vec<LeaseKey> {
        index.apply_claim(self, now)
    }
    fn delete_from(&self, index: &mut Index) -> Vec<LeaseKey> {
        index.delete_claim(self)
    }
    fn list(&self, index: &mut Index) {
        index.relist.claims.insert(name_of(self));
    }
    fn retain_listed(index: &mut Index) -> Vec<LeaseKey> {
        let listed = std::mem::take(&mut index.relist.claims);
        index.retain_claims(&listed)
    }
    fn clear_listed(index: &mut Index) {
        index.relist.claims.clear();
    }
}

impl Watched for Pod {
    const SLOT: usize = 2;
    fn apply_to(self, index: &mut Index, _now: Instant) -> Vec<LeaseKey> {
        index.apply_pod(&self)
    }
    fn delete_from(&self, index: &mut Index) -> Vec<LeaseKey> {
        index.delete_pod(self)
    }
    fn list(&self, index: &mut Index) {
        index.relist.pods.insert(name_of(self));
    }
    fn retain_listed(index: &mut Index) -> Vec<LeaseKey> {
        let listed = std::mem::take(&mut index.relist.pods);
        index.retain_pods(&listed)
    }
    fn clear_listed(index: &mut Index) {
        index.relist.pods.clear();
    }
}

/// How many entries have a Lease object, and how many of those a holder.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub leases: usize,
    pub held: usize,
}

impl Counts {
    fn of(entry: &LeaseEntry) -> Counts {
        Counts {
            leases: usize::from(entry.lease.is_some()),
            held: usize::from(entry.holder_since.is_some()),
        }
    }

    /// Replaces one entry's share `before` with `after`.
    fn replace(&mut self, before: Counts, after: Counts) {
        self.leases = self.leases + after.leases - before.leases;
        self.held = self.held + after.held - before.held;
    }
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
        self.counts.leases
    }

    pub fn held_count(&self) -> usize {
        self.counts.held
    }

    /// The counts recomputed from every entry; tests check the running ones against it.
    #[cfg(test)]
    pub fn counts_by_walking(&self) -> Counts {
        self.leases.values().fold(Counts::default(), |mut sum, e| {
            sum.replace(Counts::default(), Counts::of(e));
            sum
        })
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

    /// The UID of the pod of that name the index holds.
    pub fn pod_uid(&self, namespace: &str, name: &str) -> Option<&str> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| p.uid.as_str())
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
        let holder_uid = lease
            .status
            .as_ref()
            .and_then(|s| s.holder.as_ref())
            .map(|h| h.claim_uid.clone());
        entry.holder_since = match (holder_uid, entry.holder_since.take()) {
            (Some(uid), Some((seen, since))) if seen == uid => Some((seen, since)),
            (Some(uid), _) => Some((uid, now)),
            (None, _) => None,
        };
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
            renew_time,
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
            if !still_named && let Some(set) = self.pod_leases.get_mut(&pod_key) {
                set.remove(&key);
                if set.is_empty() {
                    self.pod_leases.remove(&pod_key);
                }
            }
        }
        self.forget_if_empty(&key);
        vec![key]
    }

    pub fn apply_pod(&mut self, pod: &Pod) -> Vec<LeaseKey> {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let new = PodEntry::of(pod);
        if self.pods.get(&key) == Some(&new) {
            return Vec::new();
        }
        self.pods.insert(key.clone(), new);
        self.leases_of_pod(&key)
    }

    pub fn delete_pod(&mut self, pod: &Pod) -> Vec<LeaseKey> {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if self.pods.get(&key).map(|p| &p.uid) != pod.metadata.uid.as_ref() {
            return Vec::new();
        }
        self.pods.remove(&key);
        self.leases_of_pod(&key)
    }

    fn leases_of_pod(&self, pod: &(String, String)) -> Vec<LeaseKey> {
        self.pod_leases
            .get(pod)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
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

    /// [`Index::retain_leases`] for pods, by (namespace, name).
    pub fn retain_pods(&mut self, listed: &HashSet<(String, String)>) -> Vec<LeaseKey> {
        let gone: Vec<(String, String)> = self
            .pods
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        let mut touched = Vec::new();
        for key in gone {
            self.pods.remove(&key);
            touched.extend(self.leases_of_pod(&key));
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

    /// What the grant decision sees for one Lease name.
    pub fn view<'a>(&'a self, key: &'a LeaseKey, now: Instant) -> Option<LeaseView<'a>> {
        let entry = self.leases.get(key)?;
        let holder_uid = entry.holder_since.as_ref().map(|(uid, _)| uid.as_str());
        let claims: Vec<ClaimView<'a>> = entry
            .claims
            .iter()
            .map(|claim| {
                let claim: &ClaimEntry = claim;
                let mut pod_problem = self.pod_problem(&key.namespace, claim, now);
                // The holder's pod was seen when it was granted (or in the complete
                // list after a restart): if it is missing now, it is gone.
                if pod_problem == Some(PodProblem::NotSeenYet)
                    && Some(claim.uid.as_str()) == holder_uid
                {
                    pod_problem = Some(PodProblem::Gone);
                }
                ClaimView { claim, pod_problem }
            })
            .collect();
        let pod_recheck = claims
            .iter()
            .filter(|c| c.pod_problem == Some(PodProblem::NotSeenYet))
            .map(|c| c.claim.first_seen + POD_GRACE)
            .min();
        let holder_deadline = self.holder_deadline(entry);
        Some(LeaseView {
            key,
            lease: entry.lease.as_deref(),
            claims,
            holder_deadline,
            pod_recheck,
            deleted_holders: &entry.deleted_holders,
        })
    }

    fn pod_problem(&self, namespace: &str, claim: &ClaimEntry, now: Instant) -> Option<PodProblem> {
        let pod_ref = claim.pod.as_ref()?;
        match self
            .pods
            .get(&(namespace.to_string(), pod_ref.name.clone()))
        {
            None if now < claim.first_seen + POD_GRACE => Some(PodProblem::NotSeenYet),
            None => Some(PodProblem::Gone),
            Some(p) => p.problem(pod_ref.uid.as_deref()),
        }
    }

    /// The holder expires a lease duration after the later of: when the index
    /// first saw it hold the lease (so a restarted controller gives it a fresh full
    /// duration), and its last observed renewal. The duration is the longer of `leaseDurationSeconds` now and
    /// the one the grant was made with (`status.holder.leaseDurationSeconds`): the
    /// holder's client keeps the latter, so a shortened spec must not cut its grant
    /// short, while a lengthened one may extend it on this side only.
    fn holder_deadline(&self, entry: &LeaseEntry) -> Option<Instant> {
        let lease = entry.lease.as_ref()?;
        let (uid, since) = entry.holder_since.as_ref()?;
        let claim = entry.claims.iter().find(|c| &c.uid == uid);
        let last_seen_alive = claim.map_or(*since, |c| c.renew_observed_at.max(*since));
        let granted_with = lease
            .status
            .as_ref()
            .and_then(|s| s.holder.as_ref())
            .and_then(|h| h.lease_duration_seconds);
        let seconds = lease
            .spec
            .lease_duration_seconds
            .max(granted_with.unwrap_or(0))
            .clamp(1, MAX_LEASE_DURATION_SECONDS);
        Some(last_seen_alive + Duration::from_secs(seconds as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{ClaimBuilder, LeaseBuilder, PodBuilder};

    fn sorted(mut keys: Vec<LeaseKey>) -> Vec<LeaseKey> {
        keys.sort();
        keys.dedup();
        keys
    }

    #[test]
    fn a_pod_is_gone_when_deleting_replaced_or_terminal_and_only_then() {
        let running = PodBuilder::new("p").uid("u1").phase("Running").build();
        assert_eq!(PodEntry::of(&running).problem(Some("u1")), None);
        assert_eq!(PodEntry::of(&running).problem(None), None);
        assert_eq!(
            PodEntry::of(&running).problem(Some("u0")),
            Some(PodProblem::Replaced)
        );
        for phase in ["Succeeded", "Failed"] {
            let done = PodBuilder::new("p").uid("u1").phase(phase).build();
            assert_eq!(
                PodEntry::of(&done).problem(Some("u1")),
                Some(PodProblem::Terminal(phase.into()))
            );
        }
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        assert_eq!(
            PodEntry::of(&deleting).problem(Some("u1")),
            Some(PodProblem::Gone)
        );
    }

    #[test]
    fn a_lease_is_held_slim_whichever_path_delivered_it() {
        // A write's response carries managedFields; the watch event of the same
        // resourceVersion (slimmed) is then skipped as unchanged, so the index must
        // slim what it is given or hold the fat copy for the Lease's lifetime.
        let now = Instant::now();
        let key = LeaseKey::new("ns", "a");
        let mut index = Index::default();
        let written = LeaseBuilder::new("a")
            .uid("La")
            .resource_version(1)
            .managed_fields(vec![Default::default()])
            .build();
        index.apply_lease(written, now);
        assert_eq!(index.lease(&key).unwrap().metadata.managed_fields, None);
    }

    #[test]
    fn the_index_is_synced_once_every_kind_has_listed() {
        let now = Instant::now();
        let mut index = Index::default();
        let lease = LeaseBuilder::new("a").uid("La").resource_version(1).build();
        index.handle(Event::<Lease>::Init, now);
        index.handle(Event::InitApply(lease), now);
        index.handle(Event::<Lease>::InitDone, now);
        index.handle(Event::<LeaseClaim>::Init, now);
        index.handle(Event::<LeaseClaim>::InitDone, now);
        assert!(!index.is_synced(), "pods not listed yet");
        index.handle(Event::<Pod>::Init, now);
        index.handle(Event::<Pod>::InitDone, now);
        assert!(index.is_synced());
    }

    #[test]
    fn a_relist_forgets_what_it_did_not_deliver_of_its_own_kind_only() {
        let now = Instant::now();
        let a = LeaseKey::new("ns", "a");
        let b = LeaseKey::new("ns", "b");
        let lease_a = LeaseBuilder::new("a").uid("La").resource_version(1).build();
        let lease_b = LeaseBuilder::new("b").uid("Lb").resource_version(2).build();
        let c1 = ClaimBuilder::new("c1", "a")
            .uid("u-c1")
            .resource_version(1)
            .pod("p1")
            .build();
        let c2 = ClaimBuilder::new("c2", "b")
            .uid("u-c2")
            .resource_version(1)
            .pod("p2")
            .build();
        let p1 = PodBuilder::new("p1").uid("p-p1").phase("Running").build();
        let p2 = PodBuilder::new("p2").uid("p-p2").phase("Running").build();
        let mut index = Index::default();
        index.handle(Event::Apply(lease_a.clone()), now);
        index.handle(Event::Apply(lease_b), now);
        assert_eq!(index.handle(Event::Apply(c1), now), vec![a.clone()]);
        index.handle(Event::Apply(c2.clone()), now);
        assert_eq!(index.handle(Event::Apply(p1), now), vec![a.clone()]);
        index.handle(Event::Apply(p2), now);

        // Leases relisted without "b" (deleted while the watch was down): "b" keeps its claim.
        index.handle(Event::<Lease>::Init, now);
        assert_eq!(
            index.handle(Event::InitApply(lease_a.clone()), now),
            Vec::<LeaseKey>::new(),
            "an unchanged object changes no decision"
        );
        assert_eq!(index.handle(Event::<Lease>::InitDone, now), vec![b.clone()]);
        assert!(index.lease(&b).is_none());
        assert_eq!(index.claim_uid("ns", "c2"), Some("u-c2"));
        assert_eq!(index.lease_count(), 1);

        // Claims relisted without "c1".
        index.handle(Event::<LeaseClaim>::Init, now);
        index.handle(Event::InitApply(c2), now);
        assert_eq!(
            index.handle(Event::<LeaseClaim>::InitDone, now),
            vec![a.clone()]
        );
        assert_eq!(index.claim_uid("ns", "c1"), None);

        // Pods relisted without either: only the Lease with a claim naming one is touched.
        index.handle(Event::<Pod>::Init, now);
        assert_eq!(sorted(index.handle(Event::<Pod>::InitDone, now)), vec![b]);
        assert_eq!(index.pod_uid("ns", "p1"), None);
        assert_eq!(index.pod_uid("ns", "p2"), None);

        // A delete goes through the same entry point.
        let gone = lease_a;
        assert_eq!(index.handle(Event::Delete(gone), now), vec![a]);
        assert_eq!(index.lease_count(), 0);
        assert_eq!(index.counts_by_walking(), Counts::default());
    }
}
