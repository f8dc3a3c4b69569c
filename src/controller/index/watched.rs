//! How each watched kind feeds the index, and what a (re)list has delivered.

use std::collections::HashSet;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::Resource;

use super::{Index, LeaseKey};
use crate::crd::{Lease, LeaseClaim};

/// What each watch's (re)list has delivered so far. Its objects go into the index as
/// they come (holding 30,000 of them until the list ends would double the
/// controller's memory at 10,000 Leases); at its end, whatever it did not list is
/// forgotten.
#[derive(Debug, Default)]
pub(super) struct Relist {
    pub(super) leases: HashSet<LeaseKey>,
    pub(super) claims: HashSet<(String, String)>,
    pub(super) pods: HashSet<(String, String)>,
    /// Leases, claims, pods: initial list delivered.
    pub(super) synced: [bool; 3],
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
