//! The index's pods: what each says about the claims that name it (`PodProblem`), and
//! which of those answers are final.
//!
//! A pod's deletion mark, its terminal phase and its deletion (a watch event, kept as
//! a tombstone while a claim names the pod) are final for that UID, whichever cache
//! served them: a UID never comes back, and none of them is undone. A grant ended on
//! one of them needs no quorum read of the pod first. A pod missing after a relist,
//! or another UID under the name, may be a lagging cache's view: the write pass reads
//! the pod before it acts on that ("Endings are confirmed").

use std::collections::HashSet;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::Index;
use super::entries::{ClaimEntry, LeaseKey, POD_GRACE, PodEntry, PodProblem};

impl Index {
    pub fn apply_pod(&mut self, pod: &Pod) -> Vec<LeaseKey> {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let new = PodEntry::of(pod);
        if self.pods.get(&key) == Some(&new) {
            return Vec::new();
        }
        self.pods.insert(key.clone(), new);
        self.leases_of_pod(&key)
    }

    /// A pod's deletion: kept as a tombstone (a deletion mark) while a claim names it.
    pub fn delete_pod(&mut self, pod: &Pod) -> Vec<LeaseKey> {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if self.pods.get(&key).map(|p| &p.uid) != pod.metadata.uid.as_ref() {
            return Vec::new();
        }
        if self.pod_leases.contains_key(&key) {
            self.pods.insert(key.clone(), PodEntry::deleted(pod));
        } else {
            self.pods.remove(&key);
        }
        self.leases_of_pod(&key)
    }

    /// No claim of Lease `lease` names the pod any more: forgets the link, and the
    /// pod's tombstone once no claim names it.
    pub(super) fn unname_pod(&mut self, pod: &(String, String), lease: &LeaseKey) {
        let Some(set) = self.pod_leases.get_mut(pod) else {
            return;
        };
        set.remove(lease);
        if set.is_empty() {
            self.pod_leases.remove(pod);
            if self.pods.get(pod).is_some_and(PodEntry::is_deleting) {
                self.pods.remove(pod);
            }
        }
    }

    pub(super) fn leases_of_pod(&self, pod: &(String, String)) -> Vec<LeaseKey> {
        self.pod_leases
            .get(pod)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
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

    /// The UID of the pod of that name the index holds.
    pub fn pod_uid(&self, namespace: &str, name: &str) -> Option<&str> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| p.uid.as_str())
    }

    pub(super) fn pod_problem(
        &self,
        namespace: &str,
        claim: &ClaimEntry,
        now: Instant,
    ) -> Option<PodProblem> {
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

    /// Whether the claim's pod (by UID) is gone for certain (module docs).
    pub(super) fn pod_gone_for_certain(&self, namespace: &str, claim: &ClaimEntry) -> bool {
        let Some(pod_ref) = claim.pod.as_ref() else {
            return false;
        };
        self.pods
            .get(&(namespace.to_string(), pod_ref.name.clone()))
            .is_some_and(|p| p.is_final_for(pod_ref.uid.as_deref()))
    }
}
