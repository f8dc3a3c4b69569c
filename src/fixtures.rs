//! Test objects: chainable builders for the Leases, LeaseClaims and Pods that unit and
//! model tests feed the controller, the client and the CLI. A builder starts from what
//! kube's `new` makes (a name, no status) in namespace [`NS`], and sets only what it is
//! told, so a test shows every field its case depends on.

// Each feature set's tests use a part of it; only the full build's use it all.
#![cfg_attr(not(all(feature = "controller", feature = "cli")), allow(dead_code))]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::crd::{
    ClaimPhase, Holder, Lease, LeaseClaim, LeaseClaimSpec, LeasePhase, LeaseSpec, LeaseStatus,
    PodRef, SlotStatus,
};

/// The namespace of every object unless told otherwise.
pub const NS: &str = "ns";

/// What [`ClaimBuilder::created`] counts from (2023-11-14T22:13:20Z).
pub const EPOCH_SECS: i64 = 1_700_000_000;

/// A Lease: `LeaseBuilder::new("db").uid("L").resource_version(5).build()`.
pub struct LeaseBuilder(Lease);

impl LeaseBuilder {
    /// Named `name` in [`NS`], with the default duration and no status.
    pub fn new(name: &str) -> Self {
        let mut lease = Lease::new(name, LeaseSpec::default());
        lease.metadata.namespace = Some(NS.into());
        Self(lease)
    }

    pub fn no_namespace(mut self) -> Self {
        self.0.metadata.namespace = None;
        self
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    pub fn resource_version(mut self, rv: u64) -> Self {
        self.0.metadata.resource_version = Some(rv.to_string());
        self
    }

    pub fn generation(mut self, generation: i64) -> Self {
        self.0.metadata.generation = Some(generation);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.labels, key, value);
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.annotations, key, value);
        self
    }

    pub fn managed_fields(mut self, entries: Vec<ManagedFieldsEntry>) -> Self {
        self.0.metadata.managed_fields = Some(entries);
        self
    }

    /// `spec.leaseDurationSeconds`.
    pub fn duration(mut self, seconds: i64) -> Self {
        self.0.spec.lease_duration_seconds = seconds;
        self
    }

    /// `spec.permits`: above 1, a semaphore (`crate::permits`).
    pub fn permits(mut self, permits: i32) -> Self {
        self.0.spec.permits = permits;
        self
    }

    pub fn phase(mut self, phase: LeasePhase) -> Self {
        self.status().phase = Some(phase);
        self
    }

    /// `status.fencingToken`.
    pub fn token(mut self, token: i64) -> Self {
        self.status().fencing_token = Some(token);
        self
    }

    pub fn grants(mut self, grants: i64) -> Self {
        self.status().grants = Some(grants);
        self
    }

    pub fn waiting_count(mut self, count: i64) -> Self {
        self.status().waiting_count = Some(count);
        self
    }

    /// `status.holder`, with no recorded duration (see [`Self::granted_with`]).
    pub fn holder(mut self, claim: &str, claim_uid: &str, identity: &str) -> Self {
        self.status().holder = Some(Holder {
            claim: claim.into(),
            claim_uid: claim_uid.into(),
            identity: identity.into(),
            lease_duration_seconds: None,
        });
        self
    }

    /// `status.holder.leaseDurationSeconds`: the duration the grant was made with
    /// (None: a grant by a controller that did not record it). After [`Self::holder`].
    pub fn granted_with(mut self, seconds: impl Into<Option<i64>>) -> Self {
        let holder = self
            .status()
            .holder
            .as_mut()
            .expect("granted_with needs a holder");
        holder.lease_duration_seconds = seconds.into();
        self
    }

    /// A row of `status.slots` (slot 1 and up; slot 0 is [`Self::holder`] and
    /// [`Self::token`]) held by the claim `claim_uid` with `token`, no recorded duration
    /// (see [`Self::slot_granted_with`]). Replaces the slot's row if there is one.
    pub fn slot_holder(
        self,
        slot: i32,
        claim: &str,
        claim_uid: &str,
        identity: &str,
        token: i64,
    ) -> Self {
        let holder = Holder {
            claim: claim.into(),
            claim_uid: claim_uid.into(),
            identity: identity.into(),
            lease_duration_seconds: None,
        };
        self.slot_row(slot, Some(holder), token)
    }

    /// A free row of `status.slots`, with the slot's last token.
    pub fn free_slot(self, slot: i32, token: i64) -> Self {
        self.slot_row(slot, None, token)
    }

    /// The `leaseDurationSeconds` of the holder of slot `slot` (1 and up), like
    /// [`Self::granted_with`] for slot 0. After [`Self::slot_holder`].
    pub fn slot_granted_with(mut self, slot: i32, seconds: impl Into<Option<i64>>) -> Self {
        let row = self.status().slots.iter_mut().find(|s| s.slot == slot);
        let holder = row
            .and_then(|s| s.holder.as_mut())
            .expect("slot_granted_with needs the slot's holder");
        holder.lease_duration_seconds = seconds.into();
        self
    }

    pub fn build(self) -> Lease {
        self.0
    }

    fn status(&mut self) -> &mut LeaseStatus {
        self.0.status.get_or_insert_default()
    }

    fn slot_row(mut self, slot: i32, holder: Option<Holder>, token: i64) -> Self {
        assert!(slot > 0, "slot 0 is the top-level holder and token");
        let slots = &mut self.status().slots;
        slots.retain(|s| s.slot != slot);
        slots.push(SlotStatus {
            slot,
            holder,
            fencing_token: Some(token),
            acquire_time: None,
        });
        slots.sort_by_key(|s| s.slot);
        self
    }
}

/// A LeaseClaim: `ClaimBuilder::new("a", "db").uid("u1").resource_version(6).build()`.
pub struct ClaimBuilder(LeaseClaim);

impl ClaimBuilder {
    /// Named `name` in [`NS`], on `lease`, with `name` as its holder identity and no status.
    pub fn new(name: &str, lease: &str) -> Self {
        let mut claim = LeaseClaim::new(
            name,
            LeaseClaimSpec {
                lease_name: lease.into(),
                holder_identity: name.into(),
                ..Default::default()
            },
        );
        claim.metadata.namespace = Some(NS.into());
        Self(claim)
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    pub fn no_namespace(mut self) -> Self {
        self.0.metadata.namespace = None;
        self
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    pub fn resource_version(mut self, rv: u64) -> Self {
        self.0.metadata.resource_version = Some(rv.to_string());
        self
    }

    /// `metadata.creationTimestamp` (which orders the queue), in RFC 3339.
    pub fn created_at(mut self, at: &str) -> Self {
        let at = at.parse().expect("an RFC 3339 time");
        self.0.metadata.creation_timestamp = Some(Time(at));
        self
    }

    /// Created `seconds` after [`EPOCH_SECS`].
    pub fn created(mut self, seconds: i64) -> Self {
        let at = Timestamp::from_second(EPOCH_SECS + seconds).expect("a time in range");
        self.0.metadata.creation_timestamp = Some(Time(at));
        self
    }

    pub fn holder_identity(mut self, identity: &str) -> Self {
        self.0.spec.holder_identity = identity.into();
        self
    }

    /// `spec.pod`, by name only (None: a claim bound to no pod).
    pub fn pod<'a>(mut self, name: impl Into<Option<&'a str>>) -> Self {
        self.0.spec.pod = name.into().map(|name| PodRef {
            name: name.into(),
            uid: None,
        });
        self
    }

    /// `spec.slot`: the one slot of a semaphore this claim asks for.
    pub fn slot(mut self, slot: impl Into<Option<i32>>) -> Self {
        self.0.spec.slot = slot.into();
        self
    }

    /// `spec.pod` with the pod's UID too, as the client library binds a claim.
    pub fn pod_with_uid(mut self, name: &str, uid: &str) -> Self {
        self.0.spec.pod = Some(PodRef {
            name: name.into(),
            uid: Some(uid.into()),
        });
        self
    }

    /// `status.phase`; None leaves the claim without a phase (and, if it has no status
    /// yet, without a status).
    pub fn phase(mut self, phase: impl Into<Option<ClaimPhase>>) -> Self {
        let phase = phase.into();
        if phase.is_some() || self.0.status.is_some() {
            self.0.status.get_or_insert_default().phase = phase;
        }
        self
    }

    pub fn build(self) -> LeaseClaim {
        self.0
    }
}

/// A Pod: `PodBuilder::new("pod-a").uid("p1").phase("Running").build()`.
pub struct PodBuilder(Pod);

impl PodBuilder {
    /// Named `name` in [`NS`], with no spec and no status.
    pub fn new(name: &str) -> Self {
        Self(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    /// `status.phase`: `Running`, `Succeeded`, `Failed`...
    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status.get_or_insert_default().phase = Some(phase.into());
        self
    }

    pub fn build(self) -> Pod {
        self.0
    }
}

fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_default().insert(key.into(), value.into());
}
