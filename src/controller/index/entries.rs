//! The index's entries: what it keeps of each Lease name, claim and pod.
//!
//! # Pod gone
//!
//! A claim's pod is gone when the Pod object is missing, has a `deletionTimestamp`,
//! has a UID other than `spec.pod.uid` (when given), or is `Succeeded`/`Failed`. A
//! pending claim whose pod is gone is marked `Revoked` (reason `PodGone`) and never
//! granted. Claims and pods arrive on separate watch streams, so a new claim may be
//! seen before its pod: a *pending* claim whose pod the controller has not seen yet
//! is neither granted nor revoked for [`POD_GRACE`] (10 s on the controller's clock,
//! from when it first saw the claim); after that the pod counts as gone. A holder's
//! missing pod is gone at once (it was seen when the grant was made, or in the
//! complete list after a restart).
//!
//! # Lease deleted
//!
//! The claims a deleted Lease had granted become `Revoked` (reason `LeaseDeleted`),
//! the holder too when its `Granted` mirror never landed (an entry remembers the
//! holder of every Lease object that went away, deleted or replaced by a re-created
//! one), and a Lease re-created under the name never grants such a claim: an
//! unmirrored claim's renewals count (DESIGN.md, "Client deadlines"), so it must end.
//! A client believes a grant only while the Lease publishes its claim *with its
//! token*. Pending claims wait with condition `LeaseNotFound` and are granted when a
//! Lease of that name appears. The new Lease's tokens start above its creation
//! resourceVersion, hence above every earlier token (rule 3).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::crd::{Lease, LeaseClaimStatus, PodRef};

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
    /// The slot it asks for (`spec.slot`), if any.
    pub slot: Option<i32>,
    pub renew_time: Option<Timestamp>,
    /// The token of the grant its holder last renewed (`palisade.dev/renewed-token`).
    pub renewed_token: Option<i64>,
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
    pub(super) uid: String,
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

    /// A deleted pod's tombstone (`pods`): gone as a deletion mark says.
    pub(crate) fn deleted(pod: &Pod) -> Self {
        PodEntry {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            terminal_phase: None,
            deleting: true,
        }
    }

    pub(crate) fn is_deleting(&self) -> bool {
        self.deleting
    }

    /// Deleted, being deleted or terminal, and the pod with `uid`: nothing undoes that.
    pub(crate) fn is_final_for(&self, uid: Option<&str>) -> bool {
        (self.deleting || self.terminal_phase.is_some()) && uid == Some(self.uid.as_str())
    }

    /// "Pod gone" (module docs) for a pod that exists: why it no longer backs
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
pub(super) struct LeaseEntry {
    pub(super) lease: Option<Arc<Lease>>,
    /// Most Leases have a few claims: a list of boxes costs 8 bytes a claim where a
    /// map's node holds room for eleven; the decision sorts them itself. Boxed
    /// because a Vec's spare capacity (four slots after the first push) would
    /// otherwise hold 352-byte entries.
    #[allow(clippy::vec_box)]
    pub(super) claims: Vec<Box<ClaimEntry>>,
    /// Each holder's claim UID (one per held slot) and when the index first saw it
    /// hold the lease.
    pub(super) holders_since: Vec<(String, Instant)>,
    /// Holders whose claim a watch event said was deleted: a fact (a UID never comes
    /// back), where its absence after a relist is only what one cache showed.
    pub(super) holders_deleted: Vec<String>,
    /// Claims that held a Lease object of this name that is gone (deleted, or
    /// replaced by a re-created one): revoked even if their `Granted` mirror never
    /// landed, and never granted by a later Lease of the name.
    pub(super) deleted_holders: Vec<String>,
    /// Claims whose grant this controller ended as expired without marking them
    /// first (`holder`, "Expiry is one write"): their deferred mirror says `Expired`.
    pub(super) expired_holders: Vec<String>,
    /// Quorum reads made in a holder's last sixth that found its claim not renewed
    /// (`holder`, "Expiry is one write"), at most one per holder.
    pub(super) expiries_confirmed: Vec<ExpiryConfirmed>,
}

/// What a quorum read found: the holder's claim (this UID) still showing this
/// `renewTime`, while the Lease granted it this token. It holds as long as the
/// index sees the same three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryConfirmed {
    pub uid: String,
    pub renew_time: Option<Timestamp>,
    pub token: i64,
}

impl LeaseEntry {
    pub(super) fn claim(&self, name: &str) -> Option<&ClaimEntry> {
        self.claims.iter().find(|c| c.name == name).map(|c| &**c)
    }

    /// Inserts or replaces the claim of that name.
    pub(super) fn put_claim(&mut self, claim: ClaimEntry) {
        match self.claims.iter_mut().find(|c| c.name == claim.name) {
            Some(slot) => **slot = claim,
            None => self.claims.push(Box::new(claim)),
        }
    }

    /// The Lease object held goes away; `last` is its final state when the watch
    /// delivered one (newer than ours, possibly).
    pub(super) fn lease_gone(&mut self, last: Option<&Lease>) {
        let holders = |l: &Lease| -> Vec<String> {
            let rows = l.status.as_ref().map(|s| s.slot_rows()).unwrap_or_default();
            rows.into_iter()
                .filter_map(|r| Some(r.holder?.claim_uid))
                .collect()
        };
        let uids = last
            .map(holders)
            .filter(|uids| !uids.is_empty())
            .or_else(|| self.lease.as_deref().map(holders))
            .unwrap_or_default();
        for uid in uids {
            remember(&mut self.deleted_holders, &self.claims, uid);
        }
        self.lease = None;
        self.holders_since.clear();
        self.holders_deleted.clear();
        self.expiries_confirmed.clear();
    }

    /// This controller handed the Lease on from `uid`'s expired grant without
    /// marking its claim first.
    pub(super) fn expired_unmarked(&mut self, uid: String) {
        remember(&mut self.expired_holders, &self.claims, uid);
    }

    pub(super) fn take_claim(&mut self, name: &str) -> Option<Box<ClaimEntry>> {
        let position = self.claims.iter().position(|c| c.name == name)?;
        Some(self.claims.swap_remove(position))
    }
}

/// Adds `uid` to a list of claims whose deferred mirror must say how their grant
/// ended, first forgetting those that are gone or already final.
fn remember(list: &mut Vec<String>, claims: &[Box<ClaimEntry>], uid: String) {
    list.retain(|u| {
        claims
            .iter()
            .any(|c| c.uid == *u && !c.status.phase.is_some_and(|p| p.is_final()))
    });
    if !list.contains(&uid) {
        list.push(uid);
    }
}

/// How many entries have a Lease object, how many of those a holder, and how many
/// claims wait for them (each Lease's `status.waitingCount`: the queue as last decided).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub leases: usize,
    pub held: usize,
    pub waiting: usize,
}

impl Counts {
    pub(super) fn of(entry: &LeaseEntry) -> Counts {
        let waiting = entry
            .lease
            .as_ref()
            .and_then(|l| l.status.as_ref()?.waiting_count)
            .map_or(0, |n| usize::try_from(n).unwrap_or(0));
        Counts {
            leases: usize::from(entry.lease.is_some()),
            held: usize::from(!entry.holders_since.is_empty()),
            waiting,
        }
    }

    /// Replaces one entry's share `before` with `after`.
    pub(super) fn replace(&mut self, before: Counts, after: Counts) {
        self.leases = self.leases + after.leases - before.leases;
        self.held = self.held + after.held - before.held;
        self.waiting = self.waiting + after.waiting - before.waiting;
    }
}

/// The running [`Counts`] of all entries, and how many Leases have each queue length,
/// so that the longest queue is known without walking the index.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) sum: Counts,
    /// Queue length (never 0) -> how many Leases have a queue that long.
    queues: BTreeMap<usize, usize>,
}

impl Totals {
    /// Replaces one entry's share `before` with `after`.
    pub(super) fn replace(&mut self, before: Counts, after: Counts) {
        self.sum.replace(before, after);
        if before.waiting == after.waiting {
            return;
        }
        if let Some(n) = self.queues.get_mut(&before.waiting) {
            *n -= 1;
            if *n == 0 {
                self.queues.remove(&before.waiting);
            }
        }
        if after.waiting > 0 {
            *self.queues.entry(after.waiting).or_default() += 1;
        }
    }

    /// The most claims waiting for any one Lease.
    pub(super) fn longest_queue(&self) -> usize {
        self.queues.last_key_value().map_or(0, |(len, _)| *len)
    }
}
