//! The CRD types: `Lease` (the lock) and `LeaseClaim` (a pod asking for it), group
//! `palisade.dev/v1alpha1`. The CRDs in `crds/` are generated from these types
//! (`palisade crds`); see DESIGN.md for the meaning of every field. A Lease name must
//! be a DNS label (at most 63 characters) because it is also the value of the
//! `palisade.dev/fenced-by` label (`LEASE_NAME_RULE`).

// kube-derive's repeated `printcolumn(type_ = ...)` arguments trip this lint.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "palisade.dev";
pub const VERSION: &str = "v1alpha1";
/// Annotation that carries a fencing token on a fenced Kubernetes object.
pub const FENCING_TOKEN_ANNOTATION: &str = "palisade.dev/fencing-token";
/// Set on a LeaseClaim by each of its holder's renewals: the fencing token of the
/// grant renewed. Its holder has seen that grant, and its first renewal of it has
/// landed ("Expiry is one write", in the controller's `index::holder`). An
/// annotation, not a spec field, so that controllers and clients of earlier
/// versions, which refuse unknown spec fields, read the claims of later clients.
pub const RENEWED_TOKEN_ANNOTATION: &str = "palisade.dev/renewed-token";
/// Label that puts a Kubernetes object under fencing by the named Lease.
pub const FENCED_BY_LABEL: &str = "palisade.dev/fenced-by";
/// Label of an object fenced by a semaphore's slot other than 0: the slot, whose
/// published token the object-fencing policy judges its writes against.
pub const FENCED_SLOT_LABEL: &str = "palisade.dev/fenced-slot";
/// Field manager of every write the controller makes.
pub const CONTROLLER_MANAGER: &str = "palisade-controller";

pub const DEFAULT_LEASE_DURATION_SECONDS: i64 = 15;
/// The most permits a Lease may have (`spec.permits`); why this bound: `crate::permits`.
pub const MAX_PERMITS: i32 = 64;
pub const MAX_LEASE_DURATION_SECONDS: i64 = 86_400;

/// A Lease name doubles as a label value (`palisade.dev/fenced-by`), so it must be a DNS label.
const LEASE_NAME_RULE: &str = "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";

/// The lock. At most one holder at a time; `status` is the authority (DESIGN rule 1).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "Lease",
    plural = "leases",
    shortname = "pl",
    category = "palisade",
    namespaced,
    status = "LeaseStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "A lock granted to one LeaseClaim at a time, with a strictly increasing fencing token per grant.",
    validation = Rule::new(LEASE_NAME_RULE).message("metadata.name of a Lease must be a DNS label (lowercase letters, digits and '-', at most 63 characters): it is used as the value of the palisade.dev/fenced-by label"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder.identity", description = "holderIdentity of the claim that holds the lease (slot 0 of a semaphore)"),
    printcolumn(name = "Held", type_ = "string", json_path = ".status.held", description = "permits held / spec.permits (semaphores only)"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken", description = "fencing token of the current (or last) grant"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Waiting", type_ = "integer", json_path = ".status.waitingCount"),
    printcolumn(name = "Duration", type_ = "integer", json_path = ".spec.leaseDurationSeconds", description = "seconds a grant lasts without a renewal"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseSpec {
    /// How long a grant lasts without a renewal observed by the controller, in seconds (1..86400).
    #[serde(default = "default_lease_duration")]
    #[schemars(range(min = 1, max = 86400))]
    pub lease_duration_seconds: i64,
    /// How many claims may hold the Lease at once (1..64, default 1: a lock). Each
    /// grant takes a slot `0..permits-1` with a fencing token of its own.
    #[serde(default = "default_permits", skip_serializing_if = "is_one")]
    #[schemars(range(min = 1, max = 64))]
    pub permits: i32,
}

fn default_permits() -> i32 {
    1
}

fn is_one(permits: &i32) -> bool {
    *permits == 1
}

fn default_lease_duration() -> i64 {
    DEFAULT_LEASE_DURATION_SECONDS
}

impl Default for LeaseSpec {
    fn default() -> Self {
        Self {
            lease_duration_seconds: DEFAULT_LEASE_DURATION_SECONDS,
            permits: 1,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum LeasePhase {
    #[default]
    Free,
    Held,
}

/// Who holds a Lease.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Name of the LeaseClaim that holds the lease.
    pub claim: String,
    /// UID of that claim: a claim deleted and re-created under the same name is another claim.
    #[serde(rename = "claimUID")]
    pub claim_uid: String,
    /// The claim's spec.holderIdentity.
    pub identity: String,
    /// `spec.leaseDurationSeconds` when this grant was made. Until the grant ends the
    /// controller applies this duration, or the current spec if that is longer: shortening
    /// the spec never cuts short a grant in progress. Absent on grants made by an older
    /// controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub lease_duration_seconds: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<LeasePhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// Token of the current (or last) grant; kept when the lease is free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// Number of grants ever made on this Lease object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<MicroTime>,
    /// A semaphore's slots (`spec.permits` above 1): slot 0 is the fields above, as
    /// for a lock; this lists slots 1 and up, each with its holder and its last token
    /// (kept when free; also for slots above a lowered `spec.permits`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<SlotStatus>,
    /// Semaphores only: permits held and `spec.permits`, as `2/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The first waiting claims, in grant order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One slot of a semaphore other than slot 0 (`status.slots`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotStatus {
    /// The slot's number, 1..63.
    #[schemars(range(min = 1, max = 63))]
    pub slot: i32,
    /// Absent while the slot is free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// Token of the slot's current (or last) grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<MicroTime>,
}

/// A pod asking for a Lease. Releasing the lease is deleting the claim.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "LeaseClaim",
    plural = "leaseclaims",
    shortname = "plc",
    category = "palisade",
    namespaced,
    status = "LeaseClaimStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "A request for a Lease on behalf of a holder; granted in FIFO order.",
    selectable = ".spec.leaseName",
    printcolumn(name = "Lease", type_ = "string", json_path = ".spec.leaseName"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".spec.holderIdentity"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken"),
    printcolumn(name = "Renewed", type_ = "date", json_path = ".spec.renewTime")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("has(self.pod) == has(oldSelf.pod)").message("spec.pod is immutable: it cannot be added or removed after creation").field_path(".pod"))]
#[x_kube(validation = Rule::new("has(self.slot) == has(oldSelf.slot)").message("spec.slot is immutable: it cannot be added or removed after creation").field_path(".slot"))]
pub struct LeaseClaimSpec {
    /// Name of the Lease in the same namespace (immutable).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.leaseName is immutable"))]
    pub lease_name: String,
    /// Who holds the lease when this claim is granted, e.g. the pod name (immutable).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.holderIdentity is immutable"))]
    pub holder_identity: String,
    /// The pod this claim belongs to: the grant ends as soon as that pod is gone or terminal (immutable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.pod is immutable"))]
    pub pod: Option<PodRef>,
    /// Only this slot of a semaphore (0..63), for work sharded by slot; absent: any
    /// slot, the lowest free one (immutable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 63))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.slot is immutable"))]
    pub slot: Option<i32>,
    /// Set by the holder to renew (its own clock; informational only, the controller
    /// only notices that it changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
}

/// A reference to the pod a claim belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(deny_unknown_fields)]
pub struct PodRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum ClaimPhase {
    #[default]
    Pending,
    Granted,
    Expired,
    Revoked,
    Released,
}

impl ClaimPhase {
    /// A claim that lost its grant never gets it back (DESIGN.md, "LeaseClaim": create a new claim instead).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Expired | Self::Revoked | Self::Released)
    }
}

/// The API server refuses a status write that would move a claim back: out of a
/// final phase, from `Granted` to `Pending`, or to another token. So a second writer
/// (an ex-leader's pass in flight, two controllers without an election) cannot make
/// an ended grant's renewals count again or grant a claim twice.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.phase) || !(oldSelf.phase in ['Expired', 'Revoked', 'Released']) || (has(self.phase) && self.phase == oldSelf.phase)").message("status.phase cannot leave a final phase (Expired, Revoked, Released): a claim that lost its grant never gets it back").field_path(".phase"))]
#[x_kube(validation = Rule::new("!has(oldSelf.phase) || oldSelf.phase != 'Granted' || (has(self.phase) && self.phase != 'Pending')").message("status.phase cannot go from Granted back to Pending: a claim is granted once").field_path(".phase"))]
#[x_kube(validation = Rule::new("!has(oldSelf.fencingToken) || (has(self.fencingToken) && self.fencingToken == oldSelf.fencingToken)").message("status.fencingToken is set once, when the claim is granted, and never changes").field_path(".fencingToken"))]
#[x_kube(validation = Rule::new("!has(oldSelf.slot) || (has(self.slot) && self.slot == oldSelf.slot)").message("status.slot is set once, when the claim is granted, and never changes").field_path(".slot"))]
pub struct LeaseClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClaimPhase>,
    /// Set when granted, kept afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// The semaphore slot granted (Leases with `spec.permits` above 1), kept afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_time: Option<MicroTime>,
    /// 1-based place in the queue while Pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Both CRDs, Lease first, as one multi-document YAML stream (what `palisade crds` prints).
pub fn crds_yaml() -> String {
    [Lease::crd(), LeaseClaim::crd()]
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("a CRD always serializes to YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}
