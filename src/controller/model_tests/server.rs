//! The model API server: one Lease, its claims and pods, with the API server's
//! compare-and-swap rules, and the violations a controller's writes commit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use kube::ResourceExt;

use crate::controller::api_server::ApiServer;
use crate::controller::grant::ClaimUpdate;
use crate::controller::index::LeaseKey;
use crate::controller::{self};
use crate::crd::{ClaimPhase, Holder, Lease, LeaseClaim, RENEWED_TOKEN_ANNOTATION};

/// A model API server: one Lease, claims, pods; every write bumps a global resourceVersion.
pub(super) struct World {
    pub(super) rv: u64,
    /// The test's clock, which both controllers read.
    pub(super) now: Instant,
    pub(super) lease: Option<Lease>,
    pub(super) lease_generation: u32,
    pub(super) claims: BTreeMap<String, LeaseClaim>,
    pub(super) pods: BTreeMap<String, Pod>,
    pub(super) next_claim: usize,
    /// Watch events not yet delivered to each controller.
    pub(super) pending: [Vec<Change>; 2],
    /// `spec.permits` of the Lease, kept across re-creation.
    pub(super) permits: i32,
    /// Every published ((slot, token) -> claim uid), and each slot's tokens in
    /// publication order.
    pub(super) owners: HashMap<(i32, i64), String>,
    pub(super) published: HashMap<i32, Vec<i64>>,
    /// Claim uid -> when its grant landed and the duration the Lease had then; None
    /// once granted again on a re-created Lease (its first grant was taken away by the
    /// Lease's deletion, which a real client stops at).
    pub(super) grants: HashMap<String, Option<(Instant, u64)>>,
    /// A renewal (by the `renewTime` it wrote) -> when its holder sent it.
    pub(super) renewals: HashMap<Timestamp, Instant>,
    /// Claim uid -> the Lease object (uid), slot and token of its grant, and what its
    /// client believes (see [`Belief`]).
    pub(super) granted: HashMap<String, Grant>,
    pub(super) beliefs: HashMap<String, Belief>,
    /// Claim uid -> the send time of its client's latest write before its grant whose
    /// response showed the claim not ended (its create, or an early confirmation): a
    /// grant published within a third of the duration of it is believed from it
    /// (`client::head`), the first Lease version naming the claim being the earliest
    /// its client can see.
    pub(super) written: HashMap<String, Instant>,
    /// A claim (by its index among the claims) to renew right after the next claim
    /// read a controller makes: a renewal racing a pass between its quorum read and
    /// its Lease write.
    pub(super) renew_after_read: Option<usize>,
    /// How many claim and pod reads (quorum reads) the controllers made.
    pub(super) claim_reads: usize,
    pub(super) pod_reads: usize,
    /// What the server saw go wrong (checked after every step).
    pub(super) violations: Vec<String>,
    /// Per controller and claim uid: how far along its lifecycle the last status that
    /// controller wrote was (see [`mirror_rank`]); forgotten when the Lease is re-created.
    pub(super) mirror_ranks: HashMap<(usize, String), (u8, i64)>,
    /// Claim uids deleted, and those each controller has been told are deleted.
    pub(super) deleted_claims: HashSet<String>,
    pub(super) seen_deleted: [HashSet<String>; 2],
}

/// What a holder's client believes, by the client library's rule (DESIGN.md, "Client
/// deadlines"): a renewal counts when its response shows the grant not ended, the
/// first one after seeing the grant whenever it comes (the model lets every client
/// see its grant as late as a replayed watch could), each later one only before the
/// local deadline, two thirds of the duration after the last one that counted. One
/// that does not count ends the belief for good.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct Belief {
    pub(super) last_counted: Option<Instant>,
    pub(super) gave_up: bool,
}

/// Where a claim status stands in the lifecycle the controller moves it along:
/// waiting (further ahead as its position falls), granted, then final. One
/// controller's writes to a claim never move it back: a deferred mirror written late
/// would (a `Pending` over the `Granted`, or a place in the queue it has left).
fn mirror_rank(status: &crate::crd::LeaseClaimStatus) -> (u8, i64) {
    match status.phase {
        Some(ClaimPhase::Granted) => (1, 0),
        Some(phase) if phase.is_final() => (2, 0),
        _ => (0, -status.position.unwrap_or(0)),
    }
}

/// The CRD's transition rules on a claim's status (`grant::claim_status`, "Claim mirrors"), which
/// the API server enforces whoever writes: a status never leaves a final phase, never
/// goes from `Granted` back to `Pending`, and never changes a fencing token once set.
fn moves_back(
    old: Option<&crate::crd::LeaseClaimStatus>,
    new: &crate::crd::LeaseClaimStatus,
) -> bool {
    let Some(old) = old else {
        return false;
    };
    let left_final = old.phase.is_some_and(|p| p.is_final()) && new.phase != old.phase;
    let ungranted =
        old.phase == Some(ClaimPhase::Granted) && new.phase == Some(ClaimPhase::Pending);
    let token_changed = old.fencing_token.is_some() && new.fencing_token != old.fencing_token;
    left_final || ungranted || token_changed
}

/// A grant as the server published it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Grant {
    pub(super) lease_uid: String,
    pub(super) slot: i32,
    pub(super) token: i64,
}

#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub(super) enum Change {
    Lease(Option<Lease>, Option<Lease>),
    Claim(LeaseClaim, bool),
    Pod(Pod, bool),
}

impl World {
    pub(super) fn new(start: Instant) -> Self {
        World {
            rv: 100,
            now: start,
            lease: None,
            lease_generation: 0,
            claims: BTreeMap::new(),
            pods: BTreeMap::new(),
            next_claim: 0,
            pending: [Vec::new(), Vec::new()],
            permits: 1,
            owners: HashMap::new(),
            published: HashMap::new(),
            grants: HashMap::new(),
            renewals: HashMap::new(),
            granted: HashMap::new(),
            beliefs: HashMap::new(),
            written: HashMap::new(),
            renew_after_read: None,
            claim_reads: 0,
            pod_reads: 0,
            violations: Vec::new(),
            mirror_ranks: HashMap::new(),
            deleted_claims: HashSet::new(),
            seen_deleted: [HashSet::new(), HashSet::new()],
        }
    }

    pub(super) fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
    pub(super) fn broadcast(&mut self, c: Change) {
        self.pending[0].push(c.clone());
        self.pending[1].push(c);
    }

    /// A Lease write that made grants: each slot's token is new, above every earlier
    /// one of that slot, and no higher than the resourceVersion that publishes it; no
    /// claim holds two slots, and no more slots are held than `spec.permits`.
    pub(super) fn check_grant(&mut self, before: &Lease, written: &Lease) {
        let rows = |l: &Lease| l.status.as_ref().map(|s| s.slot_rows()).unwrap_or_default();
        let (before_rows, written_rows) = (rows(before), rows(written));
        let holders: Vec<&str> = written_rows
            .iter()
            .filter_map(|r| Some(r.holder.as_ref()?.claim_uid.as_str()))
            .collect();
        if holders.len() > written.spec.permits as usize {
            self.violations.push(format!(
                "{} holders with spec.permits {}",
                holders.len(),
                written.spec.permits
            ));
        }
        if (1..holders.len()).any(|i| holders[..i].contains(&holders[i])) {
            self.violations
                .push(format!("a claim holds two slots: {holders:?}"));
        }
        for row in &written_rows {
            let Some(holder) = &row.holder else {
                continue;
            };
            let was = before_rows.iter().find(|b| b.slot == row.slot);
            if was.is_some_and(|b| b.fencing_token == row.fencing_token) {
                continue;
            }
            let Some(token) = row.fencing_token else {
                self.violations
                    .push(format!("a grant to {} without a token", holder.claim));
                continue;
            };
            self.published_grant(written, row.slot, holder, token);
        }
    }

    /// One slot's new grant (see [`World::check_grant`]).
    fn published_grant(&mut self, written: &Lease, slot: i32, holder: &Holder, token: i64) {
        if token as u64 > self.rv {
            self.violations.push(format!(
                "token {token} above the rv {} that published it",
                self.rv
            ));
        }
        let published = self.published.entry(slot).or_default();
        if let Some(last) = published.last()
            && token <= *last
        {
            self.violations
                .push(format!("slot {slot}: token {token} after {last}"));
        }
        published.push(token);
        if self
            .owners
            .insert((slot, token), holder.claim_uid.clone())
            .is_some()
        {
            self.violations
                .push(format!("slot {slot}: token {token} issued twice"));
        }
        let lease_uid = written.metadata.uid.clone().unwrap_or_default();
        self.granted.insert(
            holder.claim_uid.clone(),
            Grant {
                lease_uid,
                slot,
                token,
            },
        );
        let secs = written.spec.lease_duration_seconds as u64;
        let now = self.now;
        let first_grant = !self.grants.contains_key(&holder.claim_uid);
        if let Some(sent) = self.written.get(&holder.claim_uid).copied()
            && first_grant
            && now < sent + Duration::from_secs(secs) / 3
        {
            self.beliefs
                .entry(holder.claim_uid.clone())
                .or_default()
                .last_counted = Some(sent);
        }
        self.grants
            .entry(holder.claim_uid.clone())
            .and_modify(|g| *g = None)
            .or_insert(Some((now, secs)));
    }

    /// The timing contract, checked when the holder's claim is marked expired before
    /// the Lease is handed on: its
    /// client believes in at most the duration its grant was made with, counted from
    /// its last successful renewal's sending; the controller must not expire it before
    /// that. (The write is conditioned on the claim's resourceVersion, so the claim
    /// here carries the holder's last renewal.)
    pub(super) fn check_expiry(&mut self, claim: &LeaseClaim, update: &ClaimUpdate) {
        if update.status.phase != Some(ClaimPhase::Expired) {
            return;
        }
        if update.condition_on.is_none() {
            // A deferred mark: the Lease was handed on first ([`World::check_unmarked_expiry`]).
            let status = self.lease.as_ref().and_then(|l| l.status.as_ref());
            if status.is_some_and(|s| s.grant_of(&update.uid).is_some()) {
                self.violations.push(format!(
                    "{} marked Expired while the Lease names it",
                    update.name
                ));
            }
            return;
        }
        let Some(Some((granted_at, secs))) = self.grants.get(&update.uid).cloned() else {
            return;
        };
        let renewed = claim
            .spec
            .renew_time
            .as_ref()
            .and_then(|t| self.renewals.get(&t.0).copied());
        let alive = renewed.map_or(granted_at, |r| r.max(granted_at));
        if self.now < alive + Duration::from_secs(secs) {
            self.violations.push(format!(
                "{} expired {:?} after its last renewal, granted for {secs}s",
                update.name,
                self.now - alive
            ));
        }
    }
}

impl World {
    /// A renewal of the `i`th claim (in name order) lands now, sent now; its
    /// response is the claim as it is, and its client counts it or gives up.
    pub(super) fn renew(&mut self, i: usize) {
        let Some(name) = self.claims.keys().nth(i).cloned() else {
            return;
        };
        let uid = self.claims[&name].metadata.uid.clone().unwrap_or_default();
        // Only a client that has seen its grant renews (its claim's first renewal
        // comes after the grant: `index::holder`, "Expiry is one write").
        let Some(Some((_, secs))) = self.grants.get(&uid).cloned() else {
            return;
        };
        let token = self.granted.get(&uid).map(|g| g.token);
        let c = self.write_renew_time(&name, token);
        self.count_renewal(&c, secs);
        self.broadcast(Change::Claim(c, false));
    }

    /// The `i`th claim's client, still waiting, writes its claim early (a `renewTime`
    /// naming no token: it has seen no grant); sent now, landing now. Its response
    /// vouches for a grant that follows within a third of the duration, unless it
    /// shows the claim ended.
    pub(super) fn early_write(&mut self, i: usize) {
        let Some(name) = self.claims.keys().nth(i).cloned() else {
            return;
        };
        let uid = self.claims[&name].metadata.uid.clone().unwrap_or_default();
        if self.grants.contains_key(&uid) {
            return;
        }
        let now = self.now;
        let c = self.write_renew_time(&name, None);
        let ended = c
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_final());
        if !ended {
            self.written.insert(uid, now);
        }
        self.broadcast(Change::Claim(c, false));
    }

    /// Claim `name`'s `renewTime` written now, sent now (naming `token` as a renewal of
    /// that grant): the claim as the write left it.
    fn write_renew_time(&mut self, name: &str, token: Option<i64>) -> LeaseClaim {
        let (now, rv) = (self.now, self.bump());
        let c = self.claims.get_mut(name).unwrap();
        let renew_time = Timestamp::from_second(1_800_000_000 + rv as i64).unwrap();
        c.spec.renew_time = Some(MicroTime(renew_time));
        c.metadata.resource_version = Some(rv.to_string());
        if let Some(token) = token {
            c.annotations_mut()
                .insert(RENEWED_TOKEN_ANNOTATION.into(), token.to_string());
        }
        let c = c.clone();
        self.renewals.insert(renew_time, now);
        c
    }

    /// The client's side of a renewal whose response shows `claim`.
    fn count_renewal(&mut self, claim: &LeaseClaim, secs: u64) {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let Some(Grant {
            lease_uid,
            slot,
            token,
        }) = self.granted.get(&uid).cloned()
        else {
            return;
        };
        let status = claim.status.clone().unwrap_or_default();
        let not_ended = match status.phase {
            None | Some(ClaimPhase::Pending) => true,
            Some(ClaimPhase::Granted) => status.fencing_token == Some(token),
            Some(_) => false,
        };
        let now = self.now;
        let belief = self.beliefs.entry(uid.clone()).or_default();
        let before_deadline = !belief.gave_up
            && belief
                .last_counted
                .is_none_or(|last| now < last + Duration::from_secs(secs) * 2 / 3);
        if !(not_ended && before_deadline) {
            belief.gave_up = true;
            return;
        }
        belief.last_counted = Some(now);
        let rows = self
            .lease
            .as_ref()
            .filter(|l| l.metadata.uid.as_deref() == Some(lease_uid.as_str()))
            .and_then(|l| l.status.as_ref())
            .map(|s| s.slot_rows())
            .unwrap_or_default();
        let holder = rows
            .iter()
            .find(|r| r.slot == slot)
            .and_then(|r| r.holder.as_ref());
        if let Some(h) = holder
            && h.claim_uid != uid
        {
            self.violations.push(format!(
                "{} counted a renewal while the Lease names {} in slot {slot} (token {token} ended)",
                claim.metadata.name.as_deref().unwrap_or_default(),
                h.claim
            ));
        }
    }

    /// A Lease write that takes the grant from a claim that still exists unmarked
    /// (its pod, if any, alive): an expiry whose mark is deferred. Its client
    /// believes until two thirds of the duration after its last renewal that
    /// counted; the controller's contract is to wait a full duration after it.
    pub(super) fn check_unmarked_expiry(&mut self, before: &Lease, written: &Lease) {
        let holders = |l: &Lease| -> Vec<String> {
            let rows = l.status.as_ref().map(|s| s.slot_rows()).unwrap_or_default();
            rows.into_iter()
                .filter_map(|r| Some(r.holder?.claim_uid))
                .collect()
        };
        let still_held = holders(written);
        for uid in holders(before) {
            if !still_held.contains(&uid) {
                self.check_unmarked_end(&uid);
            }
        }
    }

    /// [`World::check_unmarked_expiry`] for one holder whose grant the write ended.
    fn check_unmarked_end(&mut self, uid: &str) {
        let Some(claim) = self
            .claims
            .values()
            .find(|c| c.metadata.uid.as_deref() == Some(uid))
        else {
            return;
        };
        let final_phase = claim
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_final());
        let pod_alive = claim
            .spec
            .pod
            .as_ref()
            .is_none_or(|p| self.pods.contains_key(&p.name));
        let Some(Some((granted_at, secs))) = self.grants.get(uid).cloned() else {
            return;
        };
        if final_phase || !pod_alive {
            return;
        }
        let last_counted = self.beliefs.get(uid).and_then(|b| b.last_counted);
        let alive = last_counted.map_or(granted_at, |last| last.max(granted_at));
        if self.now < alive + Duration::from_secs(secs) {
            self.violations.push(format!(
                "{} handed on unmarked {:?} after its last renewal that counted, granted for {secs}s",
                claim.metadata.name.as_deref().unwrap_or_default(),
                self.now - alive
            ));
        }
    }
}

/// The model server, as one controller's writers see it (the `usize`: which controller).
#[derive(Clone)]
pub(super) struct Model(pub(super) Arc<Mutex<World>>, pub(super) usize);

fn refusal(call: &'static str, code: u16) -> controller::Error {
    controller::Error::api(
        call,
        crate::kube_error::refusal(code, "refused by the model"),
    )
}

impl ApiServer for Model {
    async fn get_lease(&self, _key: &LeaseKey) -> controller::Result<Option<Lease>> {
        Ok(self.0.lock().unwrap().lease.clone())
    }

    async fn get_claim(
        &self,
        _namespace: &str,
        name: &str,
    ) -> controller::Result<Option<LeaseClaim>> {
        let mut world = self.0.lock().unwrap();
        world.claim_reads += 1;
        let read = world.claims.get(name).cloned();
        if let Some(i) = world.renew_after_read.take() {
            world.renew(i);
        }
        Ok(read)
    }

    async fn get_pod(&self, _namespace: &str, name: &str) -> controller::Result<Option<Pod>> {
        let mut world = self.0.lock().unwrap();
        world.pod_reads += 1;
        Ok(world.pods.get(name).cloned())
    }

    async fn replace_lease_status(
        &self,
        _key: &LeaseKey,
        desired: &Lease,
    ) -> controller::Result<Lease> {
        let mut world = self.0.lock().unwrap();
        let Some(current) = world.lease.clone() else {
            return Err(refusal("replace Lease status", 404));
        };
        if current.metadata.resource_version != desired.metadata.resource_version {
            return Err(refusal("replace Lease status", 409));
        }
        // PUT /status takes nothing but the status from the request.
        let mut written = current.clone();
        written.status = desired.status.clone();
        written.metadata.resource_version = Some(world.bump().to_string());
        world.lease = Some(written.clone());
        world.broadcast(Change::Lease(None, Some(written.clone())));
        world.check_grant(&current, &written);
        world.check_unmarked_expiry(&current, &written);
        Ok(written)
    }

    async fn patch_claim_status(
        &self,
        _namespace: &str,
        update: &ClaimUpdate,
    ) -> controller::Result<LeaseClaim> {
        let mut world = self.0.lock().unwrap();
        if world.seen_deleted[self.1].contains(&update.uid) {
            world.violations.push(format!(
                "controller {} wrote to claim {} after it saw the claim deleted",
                self.1, update.name
            ));
        }
        let Some(mut claim) = world.claims.get(&update.name).cloned() else {
            return Err(refusal("patch LeaseClaim status", 404));
        };
        // The JSON patch's tests: a failed one is 422.
        let uid_differs = claim.metadata.uid.as_deref() != Some(update.uid.as_str());
        let rv_differs = update
            .condition_on
            .as_ref()
            .is_some_and(|rv| claim.metadata.resource_version.as_ref() != Some(rv));
        if uid_differs || rv_differs || moves_back(claim.status.as_ref(), &update.status) {
            return Err(refusal("patch LeaseClaim status", 422));
        }
        world.check_expiry(&claim, update);
        let rank = mirror_rank(&update.status);
        if let Some(last) = world
            .mirror_ranks
            .insert((self.1, update.uid.clone()), rank)
            && rank < last
        {
            world.violations.push(format!(
                "controller {} moved claim {} back from {last:?} to {rank:?} ({:?})",
                self.1, update.name, update.status.phase
            ));
        }
        claim.status = Some(update.status.clone());
        claim.metadata.resource_version = Some(world.bump().to_string());
        world.claims.insert(update.name.clone(), claim.clone());
        world.broadcast(Change::Claim(claim.clone(), false));
        Ok(claim)
    }
}
