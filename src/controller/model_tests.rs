//! The grant decision and the index, without a cluster: unit tests of single
//! decisions, and property tests that drive two real controller loops with
//! independently stale views against a model API server with compare-and-swap writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::core::DeserializeGuard;
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;

use crate::admin::Readiness;
use crate::api::{ClaimPhase, Lease, LeaseClaim, LeasePhase};
use crate::controller::events::Publisher;
use crate::controller::grant::{ClaimUpdate, Ending, decide};
use crate::controller::index::{Index, LeaseKey, POD_GRACE};
use crate::controller::metrics::Metrics;
use crate::controller::{self, ApiServer, ControllerConfig, Input, Loop, Outcome};
use crate::fixtures::{ClaimBuilder, LeaseBuilder, NS, PodBuilder};

const NAME: &str = "lock";

fn key() -> LeaseKey {
    LeaseKey::new(NS, NAME)
}

#[test]
fn first_waiter_in_fifo_order_is_granted_with_a_token_above_the_resource_version() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(100)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    // Created later but named earlier: creation time decides.
    index.apply_claim(
        ClaimBuilder::new("a-late", NAME)
            .uid("u1")
            .resource_version(1)
            .created(5)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("z-early", NAME)
            .uid("u2")
            .resource_version(1)
            .created(1)
            .build(),
        now,
    );
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let status = d.lease_status.unwrap();
    assert_eq!(status.holder.unwrap().claim, "z-early");
    assert_eq!(status.fencing_token, Some(101));
    assert_eq!(status.grants, Some(1));
    assert_eq!(status.waiting, vec!["a-late"]);
    assert_eq!(status.phase, Some(LeasePhase::Held));
    let granted = d
        .claim_updates
        .iter()
        .find(|u| u.name == "z-early")
        .unwrap();
    assert_eq!(granted.status.phase, Some(ClaimPhase::Granted));
    assert_eq!(granted.status.fencing_token, Some(101));
    let waiting = d.claim_updates.iter().find(|u| u.name == "a-late").unwrap();
    assert_eq!(waiting.status.position, Some(1));
}

#[test]
fn a_renewal_changes_nothing_but_the_deadline() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(2)
            .build(),
        now,
    );
    let mut c = ClaimBuilder::new("a", NAME)
        .uid("u1")
        .resource_version(1)
        .created(0)
        .build();
    index.apply_claim(c.clone(), now);
    let k = key();
    // Settle: grant, and apply what the controller wrote.
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let mut written = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(11)
        .generation(1)
        .duration(2)
        .build();
    written.status = d.lease_status;
    index.apply_lease(written, now);
    c.status = Some(d.claim_updates[0].status.clone());
    index.apply_claim(c.clone(), now);
    let settled = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    assert!(
        settled.lease_status.is_none() && settled.claim_updates.is_empty(),
        "{settled:?}"
    );
    assert_eq!(
        index.view(&k, now).unwrap().holder_deadline,
        Some(now + Duration::from_secs(2))
    );

    let later = now + Duration::from_millis(1500);
    c.spec.renew_time = Some(MicroTime(Timestamp::now()));
    index.apply_claim(c, later);
    let view = index.view(&k, now).unwrap();
    assert_eq!(view.holder_deadline, Some(later + Duration::from_secs(2)));
    // Past the old deadline but within the new one: nothing to write at all.
    let d = decide(&view, now + Duration::from_millis(2500), Timestamp::now());
    assert!(
        d.lease_status.is_none() && d.claim_updates.is_empty() && d.ended.is_none(),
        "{d:?}"
    );
    // Past the new deadline: expired.
    let d = decide(&view, later + Duration::from_secs(2), Timestamp::now());
    assert_eq!(d.ended.unwrap().how, Ending::Expired);
}

#[test]
fn silent_holder_expires_and_the_next_claim_gets_a_higher_token_in_the_same_write() {
    let now = Instant::now();
    let mut index = Index::default();
    let held = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(60)
        .generation(1)
        .duration(2)
        .phase(LeasePhase::Held)
        .holder("a", "u1", "a")
        .token(50)
        .grants(3)
        .build();
    index.apply_lease(held, now);
    index.apply_claim(
        ClaimBuilder::new("a", NAME)
            .uid("u1")
            .resource_version(1)
            .created(0)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("b", NAME)
            .uid("u2")
            .resource_version(1)
            .created(1)
            .build(),
        now,
    );
    let k = key();
    let d = decide(
        &index.view(&k, now).unwrap(),
        now + Duration::from_secs(2),
        Timestamp::now(),
    );
    assert_eq!(d.ended.as_ref().unwrap().how, Ending::Expired);
    let status = d.lease_status.unwrap();
    assert_eq!(status.holder.unwrap().claim, "b");
    assert_eq!(status.fencing_token, Some(61));
    assert_eq!(status.grants, Some(4));
    let a = d.claim_updates.iter().find(|u| u.name == "a").unwrap();
    assert_eq!(a.status.phase, Some(ClaimPhase::Expired));
}

#[test]
fn a_terminal_or_deleted_pod_revokes_its_claim() {
    for (pod_state, reason) in [(Some("Succeeded"), "Succeeded"), (None, "deleted")] {
        let now = Instant::now();
        let mut index = Index::default();
        let held = LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(9)
            .generation(1)
            .duration(600)
            .phase(LeasePhase::Held)
            .holder("a", "u1", "a")
            .token(5)
            .build();
        index.apply_lease(held, now);
        index.apply_claim(
            ClaimBuilder::new("a", NAME)
                .uid("u1")
                .resource_version(1)
                .created(0)
                .pod("pod-a")
                .build(),
            now,
        );
        if let Some(phase) = pod_state {
            index.apply_pod(&PodBuilder::new("pod-a").uid("p1").phase(phase).build());
        }
        let k = key();
        let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
        match &d.ended.as_ref().unwrap().how {
            Ending::Revoked(why) => assert!(why.contains(reason), "{why}"),
            other => panic!("expected revocation, got {other:?}"),
        }
        assert_eq!(d.lease_status.unwrap().phase, Some(LeasePhase::Free));
    }
}

#[test]
fn a_claim_whose_pod_is_not_seen_yet_waits_instead_of_being_revoked() {
    // The claim and pod watches are separate streams: the claim may arrive first.
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("a", NAME)
            .uid("u1")
            .resource_version(1)
            .created(0)
            .pod("pod-a")
            .build(),
        now,
    );
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    assert!(d.granted.is_none(), "not granted before its pod is seen");
    assert!(
        d.claim_updates
            .iter()
            .all(|u| u.status.phase != Some(ClaimPhase::Revoked)),
        "not revoked either: {:?}",
        d.claim_updates
    );
    assert_eq!(
        index.view(&k, now).unwrap().pod_recheck,
        Some(now + POD_GRACE)
    );

    // The pod arrives: granted.
    index.apply_pod(&PodBuilder::new("pod-a").uid("p1").phase("Running").build());
    let later = now + Duration::from_millis(50);
    let d = decide(&index.view(&k, later).unwrap(), later, Timestamp::now());
    assert_eq!(d.granted.unwrap().claim, "a");

    // A pod that never shows up counts as gone after the grace period.
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    index.apply_claim(
        ClaimBuilder::new("b", NAME)
            .uid("u2")
            .resource_version(1)
            .created(0)
            .pod("pod-b")
            .build(),
        now,
    );
    let after = now + POD_GRACE;
    let d = decide(&index.view(&k, after).unwrap(), after, Timestamp::now());
    assert!(d.granted.is_none());
    assert_eq!(d.claim_updates[0].status.phase, Some(ClaimPhase::Revoked));
}

#[test]
fn claims_of_a_missing_lease_wait_with_lease_not_found() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_claim(
        ClaimBuilder::new("a", NAME)
            .uid("u1")
            .resource_version(1)
            .created(0)
            .build(),
        now,
    );
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    assert!(d.lease_status.is_none());
    let a = &d.claim_updates[0];
    assert_eq!(a.status.phase, Some(ClaimPhase::Pending));
    assert!(
        a.status
            .conditions
            .iter()
            .any(|c| c.type_ == "LeaseNotFound" && c.status == "True")
    );
}

#[test]
fn a_stale_delete_event_does_not_remove_a_recreated_lease() {
    let now = Instant::now();
    let mut index = Index::default();
    let old = LeaseBuilder::new(NAME)
        .uid("old")
        .resource_version(5)
        .generation(1)
        .duration(15)
        .build();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("new")
            .resource_version(9)
            .generation(1)
            .duration(15)
            .build(),
        now,
    );
    assert!(index.delete_lease(&old).is_none());
    assert!(index.lease(&key()).is_some());
}

// ---- model checking: two real controller loops, stale views, CAS writes --------------
//
// Each controller is a real `controller::Loop`: its index is fed watch events
// (relists included) through the same entry point as in production, and its write
// passes (confirmation reads, the holder's conditional claim write, the Lease write,
// the claim mirrors, the re-read after a conflict) run against a model API server with
// the API server's compare-and-swap rules. Only the delivery of events, the running of
// passes and the clock are the test's: events arrive late, outcomes are handed back
// late, and both controllers decide on whatever they have.

#[derive(Debug, Clone)]
enum Op {
    AddClaim {
        with_pod: bool,
    },
    DeleteClaim(usize),
    DeletePod(usize),
    Renew(usize),
    AdvanceMs(u64),
    RecreateLease,
    /// Someone edits `spec.leaseDurationSeconds` (to 1..=4 s).
    SetDuration(i64),
    /// Controller 0 or 1 receives its pending watch events.
    Sync(usize),
    /// Controller 0 or 1's watches restart: a relist of everything, pending events lost.
    Relist(usize),
    /// Controller 0 or 1 decides the Lease (with whatever view it has) and starts a pass.
    Decide(usize),
    /// The passes controller 0 or 1 started report back.
    Finish(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<bool>().prop_map(|with_pod| Op::AddClaim { with_pod }),
        2 => (0usize..8).prop_map(Op::DeleteClaim),
        1 => (0usize..8).prop_map(Op::DeletePod),
        2 => (0usize..8).prop_map(Op::Renew),
        2 => (0u64..3000).prop_map(Op::AdvanceMs),
        1 => Just(Op::RecreateLease),
        1 => (1i64..=4).prop_map(Op::SetDuration),
        4 => (0usize..2).prop_map(Op::Sync),
        1 => (0usize..2).prop_map(Op::Relist),
        6 => (0usize..2).prop_map(Op::Decide),
        4 => (0usize..2).prop_map(Op::Finish),
    ]
}

/// A model API server: one Lease, claims, pods; every write bumps a global resourceVersion.
struct World {
    rv: u64,
    /// The test's clock, which both controllers read.
    now: Instant,
    lease: Option<Lease>,
    lease_generation: u32,
    claims: BTreeMap<String, LeaseClaim>,
    pods: BTreeMap<String, Pod>,
    next_claim: usize,
    /// Watch events not yet delivered to each controller.
    pending: [Vec<Change>; 2],
    /// Every published (token -> claim uid), and tokens in publication order.
    owners: HashMap<i64, String>,
    published: Vec<i64>,
    /// Claim uid -> when its grant landed and the duration the Lease had then; None
    /// once granted again on a re-created Lease (its first grant was taken away by the
    /// Lease's deletion, which a real client stops at).
    grants: HashMap<String, Option<(Instant, u64)>>,
    /// A renewal (by the `renewTime` it wrote) -> when its holder sent it.
    renewals: HashMap<Timestamp, Instant>,
    /// What the server saw go wrong (checked after every step).
    violations: Vec<String>,
    /// Per controller and claim uid: how far along its lifecycle the last status that
    /// controller wrote was (see [`mirror_rank`]); forgotten when the Lease is re-created.
    mirror_ranks: HashMap<(usize, String), (u8, i64)>,
    /// Claim uids deleted, and those each controller has been told are deleted.
    deleted_claims: HashSet<String>,
    seen_deleted: [HashSet<String>; 2],
}

/// Where a claim status stands in the lifecycle the controller moves it along:
/// waiting (further ahead as its position falls), granted, then final. One
/// controller's writes to a claim never move it back: a deferred mirror written late
/// would (a `Pending` over the `Granted`, or a place in the queue it has left).
fn mirror_rank(status: &crate::api::LeaseClaimStatus) -> (u8, i64) {
    match status.phase {
        Some(ClaimPhase::Granted) => (1, 0),
        Some(phase) if phase.is_final() => (2, 0),
        _ => (0, -status.position.unwrap_or(0)),
    }
}

#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Change {
    Lease(Option<Lease>, Option<Lease>),
    Claim(LeaseClaim, bool),
    Pod(Pod, bool),
}

impl World {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
    fn broadcast(&mut self, c: Change) {
        self.pending[0].push(c.clone());
        self.pending[1].push(c);
    }

    /// A Lease write that made a grant: its token is new, above every earlier one, and
    /// no higher than the resourceVersion that publishes it.
    fn check_grant(&mut self, before: &Lease, written: &Lease) {
        let token = |l: &Lease| l.status.as_ref().and_then(|s| s.fencing_token);
        let Some(holder) = written.status.as_ref().and_then(|s| s.holder.as_ref()) else {
            return;
        };
        if token(before) == token(written) {
            return;
        }
        let Some(token) = token(written) else {
            self.violations
                .push(format!("a grant to {} without a token", holder.claim));
            return;
        };
        if token as u64 > self.rv {
            self.violations.push(format!(
                "token {token} above the rv {} that published it",
                self.rv
            ));
        }
        if let Some(last) = self.published.last()
            && token <= *last
        {
            self.violations.push(format!("token {token} after {last}"));
        }
        if self
            .owners
            .insert(token, holder.claim_uid.clone())
            .is_some()
        {
            self.violations.push(format!("token {token} issued twice"));
        }
        self.published.push(token);
        let secs = written.spec.lease_duration_seconds as u64;
        let now = self.now;
        self.grants
            .entry(holder.claim_uid.clone())
            .and_modify(|g| *g = None)
            .or_insert(Some((now, secs)));
    }

    /// The timing contract, checked when the holder's claim is marked expired: its
    /// client believes in at most the duration its grant was made with, counted from
    /// its last successful renewal's sending; the controller must not expire it before
    /// that. (The write is conditioned on the claim's resourceVersion, so the claim
    /// here carries the holder's last renewal.)
    fn check_expiry(&mut self, claim: &LeaseClaim, update: &ClaimUpdate) {
        if update.status.phase != Some(ClaimPhase::Expired) {
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

/// The model server, as one controller's writers see it (the `usize`: which controller).
#[derive(Clone)]
struct Model(Arc<Mutex<World>>, usize);

fn refusal(call: &'static str, code: u16) -> controller::Error {
    controller::Error::api(
        call,
        crate::api_error::refusal(code, "refused by the model"),
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
        Ok(self.0.lock().unwrap().claims.get(name).cloned())
    }

    async fn get_pod(&self, _namespace: &str, name: &str) -> controller::Result<Option<Pod>> {
        Ok(self.0.lock().unwrap().pods.get(name).cloned())
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
        if uid_differs || rv_differs {
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

fn guarded<K>(object: K) -> DeserializeGuard<K> {
    DeserializeGuard(Ok(object))
}

/// One controller: the real loop, and the passes it started that have not reported back.
struct Controller {
    model: Model,
    core: Loop<Model>,
    ready: Readiness,
    passes: Vec<Outcome>,
}

impl Controller {
    fn new(model: &Model) -> Self {
        let metrics = Arc::new(Metrics::default());
        let (events, _) = Publisher::detached("model", metrics.clone());
        let config = ControllerConfig {
            namespace: None,
            concurrency: 1,
            instance: "model".into(),
        };
        Controller {
            model: model.clone(),
            core: Loop::new(model.clone(), config, metrics, events),
            ready: Readiness::default(),
            passes: Vec::new(),
        }
    }

    fn input(&mut self, input: Input, now: Instant) {
        self.core.handle_input(input, &self.ready, now);
    }

    fn deliver(&mut self, changes: Vec<Change>, now: Instant) {
        for c in changes {
            match c {
                Change::Lease(old, new) => {
                    if let Some(old) = old {
                        self.input(Input::Lease(Ok(Event::Delete(guarded(old)))), now);
                    }
                    if let Some(new) = new {
                        self.input(Input::Lease(Ok(Event::Apply(guarded(new)))), now);
                    }
                }
                Change::Claim(c, true) => {
                    let uid = c.metadata.uid.clone().unwrap_or_default();
                    self.model.0.lock().unwrap().seen_deleted[self.model.1].insert(uid);
                    self.input(Input::Claim(Ok(Event::Delete(guarded(c)))), now)
                }
                Change::Claim(c, false) => {
                    self.input(Input::Claim(Ok(Event::Apply(guarded(c)))), now)
                }
                Change::Pod(p, true) => self.input(Input::Pod(Ok(Event::Delete(p))), now),
                Change::Pod(p, false) => self.input(Input::Pod(Ok(Event::Apply(p))), now),
            }
        }
    }

    /// The watches (re)list: everything as the server has it now.
    fn relist(&mut self, world: &mut World, now: Instant) {
        world.seen_deleted[self.model.1] = world.deleted_claims.clone();
        self.input(Input::Lease(Ok(Event::Init)), now);
        if let Some(l) = &world.lease {
            self.input(Input::Lease(Ok(Event::InitApply(guarded(l.clone())))), now);
        }
        self.input(Input::Lease(Ok(Event::InitDone)), now);
        self.input(Input::Claim(Ok(Event::Init)), now);
        for c in world.claims.values() {
            self.input(Input::Claim(Ok(Event::InitApply(guarded(c.clone())))), now);
        }
        self.input(Input::Claim(Ok(Event::InitDone)), now);
        self.input(Input::Pod(Ok(Event::Init)), now);
        for p in world.pods.values() {
            self.input(Input::Pod(Ok(Event::InitApply(p.clone()))), now);
        }
        self.input(Input::Pod(Ok(Event::InitDone)), now);
    }

    /// What the real loop does between inputs: start a pass for every Lease that is
    /// ready. The model server answers at once, so a pass runs to its end here; its
    /// outcome waits until `Finish`.
    async fn pump(&mut self, now: Instant) {
        while let Some(pass) = self.core.next_write(now) {
            self.passes.push(pass.await);
        }
    }

    async fn finish(&mut self, now: Instant) {
        for outcome in std::mem::take(&mut self.passes) {
            self.core.finish(outcome, now);
        }
        self.pump(now).await;
    }

    /// Timers due by now mark their Leases dirty, as in the real loop.
    async fn fire_timers(&mut self, now: Instant) {
        while let Some(Some(_)) = self.core.expired().now_or_never() {}
        self.pump(now).await;
    }
}

fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn tokens_strictly_increase_and_each_belongs_to_one_claim(ops in proptest::collection::vec(op(), 1..120)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(run_model(ops))?;
    }
}

async fn run_model(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let start = clock();
    let model = Model(
        Arc::new(Mutex::new(World {
            rv: 100,
            now: start,
            lease: None,
            lease_generation: 0,
            claims: BTreeMap::new(),
            pods: BTreeMap::new(),
            next_claim: 0,
            pending: [Vec::new(), Vec::new()],
            owners: HashMap::new(),
            published: Vec::new(),
            grants: HashMap::new(),
            renewals: HashMap::new(),
            violations: Vec::new(),
            mirror_ranks: HashMap::new(),
            deleted_claims: HashSet::new(),
            seen_deleted: [HashSet::new(), HashSet::new()],
        })),
        0,
    );
    {
        let mut world = model.0.lock().unwrap();
        let rv = world.bump();
        world.lease = Some(
            LeaseBuilder::new(NAME)
                .uid("L0")
                .resource_version(rv)
                .generation(1)
                .duration(2)
                .build(),
        );
    }
    let mut controllers = [
        Controller::new(&model),
        Controller::new(&Model(model.0.clone(), 1)),
    ];
    for c in &mut controllers {
        c.relist(&mut model.0.lock().unwrap(), start);
        prop_assert!(c.core.is_synced());
        c.core.take_leadership(start);
        c.pump(start).await;
    }

    for op in ops {
        let now = clock();
        match op {
            Op::AdvanceMs(ms) => {
                tokio::time::advance(Duration::from_millis(ms)).await;
                let now = clock();
                model.0.lock().unwrap().now = now;
                for c in &mut controllers {
                    c.fire_timers(now).await;
                }
            }
            Op::Sync(n) => {
                let changes = std::mem::take(&mut model.0.lock().unwrap().pending[n]);
                controllers[n].deliver(changes, now);
                // With every event delivered and no outcome outstanding, the index holds
                // the server's Lease: no outcome left a stale or re-created one behind.
                if controllers[n].passes.is_empty() {
                    let version =
                        |l: &Lease| (l.metadata.uid.clone(), l.metadata.resource_version.clone());
                    let seen = controllers[n]
                        .core
                        .index()
                        .lease(&key())
                        .map(|l| version(l));
                    let truth = model.0.lock().unwrap().lease.as_ref().map(version);
                    prop_assert_eq!(
                        seen,
                        truth,
                        "the index did not converge on the server's Lease"
                    );
                }
                controllers[n].pump(now).await;
            }
            Op::Relist(n) => {
                {
                    let mut world = model.0.lock().unwrap();
                    world.pending[n].clear();
                    controllers[n].relist(&mut world, now);
                }
                controllers[n].pump(now).await;
            }
            Op::Decide(n) => {
                controllers[n].core.mark_dirty(key(), now);
                controllers[n].pump(now).await;
            }
            Op::Finish(n) => controllers[n].finish(now).await,
            op => change_world(&mut model.0.lock().unwrap(), op, start, now),
        }
        for c in &controllers {
            let index = c.core.index();
            let walked = index.counts_by_walking();
            prop_assert_eq!(
                (index.lease_count(), index.held_count()),
                (walked.leases, walked.held),
                "running counts drifted"
            );
        }
        let violations = std::mem::take(&mut model.0.lock().unwrap().violations);
        prop_assert!(violations.is_empty(), "{:?}", violations);
    }
    Ok(())
}

/// What the users and the kubelet do: create, renew and delete claims, delete pods,
/// re-create and edit the Lease.
fn change_world(world: &mut World, op: Op, start: Instant, now: Instant) {
    match op {
        Op::AddClaim { with_pod } => {
            let i = world.next_claim;
            world.next_claim += 1;
            let name = format!("c{i:03}");
            let pod_name = with_pod.then(|| format!("p{i:03}"));
            if let Some(p) = &pod_name {
                let pd = PodBuilder::new(p)
                    .uid(&format!("pu{i}"))
                    .phase("Running")
                    .build();
                world.pods.insert(p.clone(), pd.clone());
                world.broadcast(Change::Pod(pd, false));
            }
            let c = ClaimBuilder::new(&name, NAME)
                .uid(&format!("u{i}"))
                .resource_version(world.bump())
                .created((now - start).as_secs() as i64)
                .pod(pod_name.as_deref())
                .build();
            world.claims.insert(name, c.clone());
            world.broadcast(Change::Claim(c, false));
        }
        Op::DeleteClaim(i) => {
            if let Some(name) = world.claims.keys().nth(i).cloned() {
                let c = world.claims.remove(&name).unwrap();
                world
                    .deleted_claims
                    .insert(c.metadata.uid.clone().unwrap_or_default());
                world.bump();
                world.broadcast(Change::Claim(c, true));
            }
        }
        Op::DeletePod(i) => {
            if let Some(name) = world.pods.keys().nth(i).cloned() {
                let p = world.pods.remove(&name).unwrap();
                world.bump();
                world.broadcast(Change::Pod(p, true));
            }
        }
        Op::Renew(i) => {
            if let Some(name) = world.claims.keys().nth(i).cloned() {
                let rv = world.bump();
                let c = world.claims.get_mut(&name).unwrap();
                let renew_time = Timestamp::from_second(1_800_000_000 + rv as i64).unwrap();
                c.spec.renew_time = Some(MicroTime(renew_time));
                c.metadata.resource_version = Some(rv.to_string());
                let c = c.clone();
                world.renewals.insert(renew_time, now);
                world.broadcast(Change::Claim(c, false));
            }
        }
        Op::RecreateLease => {
            // A claim granted on the old Lease may wait again on the new one.
            world.mirror_ranks.clear();
            world.lease_generation += 1;
            let old = world.lease.take();
            let rv = world.bump();
            let new = LeaseBuilder::new(NAME)
                .uid(&format!("L{}", world.lease_generation))
                .resource_version(rv)
                .generation(1)
                .duration(2)
                .build();
            world.lease = Some(new.clone());
            world.broadcast(Change::Lease(old, Some(new)));
        }
        Op::SetDuration(secs) => {
            let rv = world.bump();
            if let Some(l) = world.lease.as_mut() {
                l.spec.lease_duration_seconds = secs;
                l.metadata.resource_version = Some(rv.to_string());
                let l = l.clone();
                world.broadcast(Change::Lease(None, Some(l)));
            }
        }
        Op::AdvanceMs(_) | Op::Sync(_) | Op::Relist(_) | Op::Decide(_) | Op::Finish(_) => {
            unreachable!("the controllers' steps are not changes of the world")
        }
    }
}

/// A `fencingToken` at the top of the range (anyone with
/// `leases/status` can set one) must not make the next grant repeat or saturate it.
#[test]
fn a_token_at_the_maximum_is_refused_with_a_condition_instead_of_repeated() {
    for last in [999_999_999_999_999_999_i64, i64::MAX - 1, i64::MAX] {
        let now = Instant::now();
        let mut index = Index::default();
        let free = LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(60)
            .generation(1)
            .duration(15)
            .phase(LeasePhase::Free)
            .token(last)
            .grants(3)
            .build();
        index.apply_lease(free, now);
        index.apply_claim(
            ClaimBuilder::new("a", NAME)
                .uid("u1")
                .resource_version(1)
                .created(0)
                .build(),
            now,
        );
        let k = key();
        let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
        assert_eq!(d.granted, None, "last token {last}: {d:?}");
        let status = d.lease_status.expect("a condition says why");
        assert!(status.holder.is_none(), "last token {last}: {status:?}");
        assert_eq!(status.fencing_token, Some(last), "the token is kept");
        let held = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Held")
            .expect("Held condition");
        assert_eq!(held.status, "False");
        assert_eq!(held.reason, "TokensExhausted", "{held:?}");
        assert!(held.message.contains(&last.to_string()), "{held:?}");
        // The claim keeps waiting: nothing is taken from it.
        let a = d.claim_updates.iter().find(|u| u.name == "a").unwrap();
        assert_eq!(a.status.phase, Some(ClaimPhase::Pending));
    }
}

/// A holder's client keeps the
/// duration its grant was observed with (or a shorter one it sees later), so the
/// controller must never apply a shorter one to a grant in progress. Lowering
/// `leaseDurationSeconds` from 600 to 3 during a grant must not let the
/// controller expire the holder 3 s after its last renewal.
#[test]
fn a_lowered_lease_duration_does_not_cut_short_a_grant_in_progress() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(
        LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(10)
            .generation(1)
            .duration(600)
            .build(),
        now,
    );
    let mut a = ClaimBuilder::new("a", NAME)
        .uid("u1")
        .resource_version(1)
        .created(0)
        .build();
    index.apply_claim(a.clone(), now);
    index.apply_claim(
        ClaimBuilder::new("b", NAME)
            .uid("u2")
            .resource_version(1)
            .created(1)
            .build(),
        now,
    );
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let status = d.lease_status.clone().unwrap();
    let mut written = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(11)
        .generation(1)
        .duration(600)
        .build();
    written.status = Some(status.clone());
    index.apply_lease(written.clone(), now);
    a.status = Some(
        d.claim_updates
            .iter()
            .find(|u| u.name == "a")
            .unwrap()
            .status
            .clone(),
    );
    index.apply_claim(a, now);

    // The duration is lowered while "a" holds the lease.
    let mut edited = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(12)
        .generation(1)
        .duration(3)
        .build();
    edited.status = Some(status.clone());
    index.apply_lease(edited.clone(), now);
    let view = index.view(&k, now).unwrap();
    assert_eq!(
        view.holder_deadline,
        Some(now + Duration::from_secs(600)),
        "the holder keeps the duration it was granted with"
    );
    let later = now + Duration::from_secs(3);
    let d = decide(&view, later, Timestamp::now());
    assert_eq!(d.ended, None, "expired on the lowered duration: {d:?}");
    assert!(d.granted.is_none());

    // After the granted duration it expires, and the next grant uses the current spec.
    let expiry = now + Duration::from_secs(600);
    let d = decide(&index.view(&k, expiry).unwrap(), expiry, Timestamp::now());
    assert_eq!(
        d.ended.as_ref().map(|e| e.how.clone()),
        Some(Ending::Expired)
    );
    assert_eq!(d.granted.as_ref().map(|g| g.claim.as_str()), Some("b"));
    let next = serde_json::to_value(d.lease_status.unwrap()).unwrap();
    assert_eq!(next["holder"]["leaseDurationSeconds"], json!(3), "{next}");
    // The grant of "a" recorded the duration it was made with.
    let recorded = serde_json::to_value(&status).unwrap();
    assert_eq!(
        recorded["holder"]["leaseDurationSeconds"],
        json!(600),
        "{recorded}"
    );
}

/// The same across a controller restart or failover: rule 4's fresh full duration
/// is at least the duration the grant was made with, as recorded in the Lease.
#[test]
fn after_a_restart_a_holder_gets_at_least_the_duration_it_was_granted_with() {
    // Spec lowered to 3 s after the grant; a new controller starts and lists it.
    let restarted = Instant::now();
    let mut index = Index::default();
    let held = LeaseBuilder::new(NAME)
        .uid("L")
        .resource_version(60)
        .generation(1)
        .duration(3)
        .phase(LeasePhase::Held)
        .token(50)
        .grants(3)
        .holder("a", "u1", "a")
        .granted_with(600)
        .build();
    index.apply_lease(held, restarted);
    index.apply_claim(
        ClaimBuilder::new("a", NAME)
            .uid("u1")
            .resource_version(1)
            .created(0)
            .build(),
        restarted,
    );
    index.apply_claim(
        ClaimBuilder::new("b", NAME)
            .uid("u2")
            .resource_version(1)
            .created(1)
            .build(),
        restarted,
    );
    let k = key();
    let view = index.view(&k, restarted).unwrap();
    assert_eq!(
        view.holder_deadline,
        Some(restarted + Duration::from_secs(600))
    );
    let d = decide(&view, restarted + Duration::from_secs(3), Timestamp::now());
    assert_eq!(d.ended, None, "expired on the lowered duration: {d:?}");
}

/// Raising the duration takes effect for the holder at once (the controller applies
/// the longer of the recorded and the current duration; the client never believes
/// the longer one, so that is safe), and a Lease written before the field existed
/// is expired on its current spec, as before.
#[test]
fn a_raised_duration_applies_to_the_holder_and_an_unrecorded_grant_uses_the_spec() {
    let now = Instant::now();
    let k = key();
    for (recorded, spec, expected) in [(Some(3), 600, 600), (None, 7, 7), (Some(20), 20, 20)] {
        let held = LeaseBuilder::new(NAME)
            .uid("L")
            .resource_version(60)
            .generation(1)
            .duration(spec)
            .phase(LeasePhase::Held)
            .token(50)
            .holder("a", "u1", "a")
            .granted_with(recorded)
            .build();
        let mut index = Index::default();
        index.apply_lease(held, now);
        index.apply_claim(
            ClaimBuilder::new("a", NAME)
                .uid("u1")
                .resource_version(1)
                .created(0)
                .build(),
            now,
        );
        assert_eq!(
            index.view(&k, now).unwrap().holder_deadline,
            Some(now + Duration::from_secs(expected)),
            "recorded {recorded:?}, spec {spec}"
        );
    }
}

/// A Lease deleted before its holder's `Granted` mirror landed: the holder is revoked
/// all the same (its renewals, which count while the claim shows Pending, must stop
/// counting), and a Lease re-created under the name never grants that claim again,
/// whether the watch delivered the delete first or the new object first.
#[test]
fn a_deleted_leases_holder_is_revoked_even_before_its_granted_mirror() {
    let k = key();
    for delete_event_first in [true, false] {
        let now = Instant::now();
        let mut index = Index::default();
        let old = LeaseBuilder::new(NAME)
            .uid("L-old")
            .resource_version(60)
            .generation(1)
            .duration(15)
            .phase(LeasePhase::Held)
            .token(50)
            .grants(1)
            .holder("a", "u1", "a")
            .granted_with(15)
            .build();
        index.apply_lease(old.clone(), now);
        // The holder's claim still shows no phase: its mirror was never written.
        index.apply_claim(
            ClaimBuilder::new("a", NAME)
                .uid("u1")
                .resource_version(1)
                .created(0)
                .build(),
            now,
        );
        index.apply_claim(
            ClaimBuilder::new("b", NAME)
                .uid("u2")
                .resource_version(1)
                .created(1)
                .build(),
            now,
        );
        let case = if delete_event_first {
            "deleted, then re-created"
        } else {
            "re-created, delete event not seen"
        };
        if delete_event_first {
            index.delete_lease(&old);
            let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
            let a = d.claim_updates.iter().find(|u| u.name == "a");
            assert_eq!(
                a.and_then(|u| u.status.phase),
                Some(ClaimPhase::Revoked),
                "{case}: the deleted Lease's holder: {d:?}"
            );
        }
        index.apply_lease(
            LeaseBuilder::new(NAME)
                .uid("L-new")
                .resource_version(70)
                .generation(1)
                .duration(15)
                .build(),
            now,
        );
        let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
        assert_eq!(
            d.granted.as_ref().map(|g| g.claim.as_str()),
            Some("b"),
            "{case}: {d:?}"
        );
        let a = d.claim_updates.iter().find(|u| u.name == "a");
        assert_eq!(
            a.and_then(|u| u.status.phase),
            Some(ClaimPhase::Revoked),
            "{case}: {d:?}"
        );
    }
}
