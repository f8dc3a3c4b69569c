//! What the controller keeps of the objects its watches deliver.
//!
//! **Slimming.** Every object a watch delivers is trimmed before the controller
//! keeps it in its index: `managedFields` are three quarters of a Lease or claim
//! as served, and of a Pod the controller needs only its UID, phase and deletion
//! mark. The controller writes a Lease back with a
//! PUT of `/status`, which takes nothing but `status` from the request and keeps
//! the stored `managedFields` when the request has none, so nothing stripped here
//! is lost.
//!
//! **Memory.** Besides slimming (no `managedFields`, no
//! `last-applied-configuration`), the controller applies a watch's (re)list object
//! by object instead of holding the whole list until it ends, and keeps running
//! counts for its gauges, so an event costs the same at 10 Leases and at 10,000.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::DeserializeGuard;

/// `kubectl apply` stores the whole applied object here: a copy we never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what the controller never reads of a Lease or claim: managedFields and
/// kubectl's copy of the applied object.
pub fn slim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
    }
}

/// [`slim`] for a watch through `DeserializeGuard` (an unreadable object is left as it is).
pub fn slim_guarded<K: Resource>(guard: &mut DeserializeGuard<K>) {
    if let Ok(object) = &mut guard.0 {
        slim(object);
    }
}

/// Keeps of a Pod only what decides a claim: identity, deletion mark and phase.
pub fn slim_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        ..Default::default()
    };
    pod.spec = None;
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use k8s_openapi::jiff::Timestamp;

    use crate::fixtures::LeaseBuilder;

    #[test]
    fn slimming_keeps_what_decisions_read() {
        let mut lease = LeaseBuilder::new("db")
            .uid("u")
            .resource_version(7)
            .label("team", "a")
            .annotation("keep", "me")
            .annotation("kubectl.kubernetes.io/last-applied-configuration", "{}")
            .managed_fields(vec![ManagedFieldsEntry {
                manager: Some("kubectl".into()),
                operation: Some("Apply".into()),
                ..Default::default()
            }])
            .token(3)
            .build();
        let before = lease.clone();
        slim(&mut lease);
        assert_eq!(lease.metadata.managed_fields, None);
        let annotations = lease.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["keep"], "me");
        assert_eq!(lease.metadata.labels, before.metadata.labels);
        assert_eq!(
            lease.metadata.resource_version,
            before.metadata.resource_version
        );
        assert_eq!(lease.spec, before.spec);
        assert_eq!(lease.status, before.status);

        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("pu".into()),
                resource_version: Some("9".into()),
                deletion_timestamp: Some(Time(Timestamp::UNIX_EPOCH)),
                labels: Some([("a".to_string(), "b".to_string())].into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                message: Some("oom".into()),
                ..Default::default()
            }),
        };
        slim_pod(&mut pod);
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(pod.metadata.uid.as_deref(), Some("pu"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("9"));
        assert!(pod.metadata.deletion_timestamp.is_some());
        assert_eq!(pod.metadata.labels, None);
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.spec, None);
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Failed"));
    }
}
