//! Model checking: two real controller loops, stale views, compare-and-swap writes.
//!
//! Each controller is a real `controller::Loop`: its index is fed watch events
//! (relists included) through the same entry point as in production, and its write
//! passes (confirmation reads, the holder's conditional claim write, the Lease write,
//! the claim mirrors, the re-read after a conflict) run against a model API server with
//! the API server's compare-and-swap rules. Only the delivery of events, the running of
//! passes and the clock are the test's: events arrive late, outcomes are handed back
//! late, and both controllers decide on whatever they have.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::core::DeserializeGuard;
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::admin::Readiness;
use crate::controller::events::Publisher;
use crate::controller::metrics::Metrics;
use crate::controller::write_pass::Outcome;
use crate::controller::{ControllerConfig, Input, Loop};
use crate::crd::{ClaimPhase, Lease};
use crate::fixtures::{ClaimBuilder, LeaseBuilder, PodBuilder};

use super::server::{Change, Model, World};
use super::{NAME, key};

#[derive(Debug, Clone)]
pub(super) enum Op {
    AddClaim {
        with_pod: bool,
        /// The one slot it asks for (`spec.slot`).
        slot: Option<i32>,
    },
    DeleteClaim(usize),
    DeletePod(usize),
    Renew(usize),
    /// A waiting claim's client writes it before its grant (`client::head`).
    EarlyWrite(usize),
    /// A renewal that lands between a pass's next claim read and its writes.
    RenewAfterNextRead(usize),
    AdvanceMs(u64),
    RecreateLease,
    /// Someone edits `spec.leaseDurationSeconds` (to 1..=4 s).
    SetDuration(i64),
    /// Someone edits `spec.permits` (to 1..=3).
    SetPermits(i32),
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
        3 => (any::<bool>(), prop_oneof![3 => Just(None), 1 => (0i32..3).prop_map(Some)])
            .prop_map(|(with_pod, slot)| Op::AddClaim { with_pod, slot }),
        2 => (0usize..8).prop_map(Op::DeleteClaim),
        1 => (0usize..8).prop_map(Op::DeletePod),
        3 => (0usize..8).prop_map(Op::Renew),
        2 => (0usize..8).prop_map(Op::EarlyWrite),
        1 => (0usize..8).prop_map(Op::RenewAfterNextRead),
        2 => (0u64..3000).prop_map(Op::AdvanceMs),
        1 => Just(Op::RecreateLease),
        1 => (1i64..=4).prop_map(Op::SetDuration),
        1 => (1i32..=3).prop_map(Op::SetPermits),
        4 => (0usize..2).prop_map(Op::Sync),
        1 => (0usize..2).prop_map(Op::Relist),
        6 => (0usize..2).prop_map(Op::Decide),
        4 => (0usize..2).prop_map(Op::Finish),
    ]
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

    /// A lock (N = 1) and semaphores of 2 and 3 permits, whose `spec.permits` the
    /// steps may also change: per slot, tokens strictly increase and each belongs to
    /// one claim; never more holders than permits, nor a claim in two slots; no
    /// client believes a slot the Lease gave another.
    #[test]
    fn tokens_strictly_increase_and_each_belongs_to_one_claim(
        permits in 1i32..=3,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(run_model(permits, ops))?;
    }
}

/// Runs one sequence of steps through the model on a lock, as the property test
/// does, and returns the model server's world as they left it.
pub(super) fn run_ops(ops: Vec<Op>) -> Result<World, TestCaseError> {
    run_ops_on(1, ops)
}

/// [`run_ops`] on a Lease of `permits`.
pub(super) fn run_ops_on(permits: i32, ops: Vec<Op>) -> Result<World, TestCaseError> {
    let model = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(run_model(permits, ops))?;
    let world = std::mem::replace(&mut *model.0.lock().unwrap(), World::new(clock()));
    Ok(world)
}

/// The Lease's holder (its claim's name), and the phase of claim `name`.
pub(super) fn holder_and_phase(world: &World, name: &str) -> (Option<String>, Option<ClaimPhase>) {
    let holder = world
        .lease
        .as_ref()
        .and_then(|l| l.status.as_ref()?.holder.as_ref())
        .map(|h| h.claim.clone());
    let phase = world.claims[name].status.as_ref().and_then(|s| s.phase);
    (holder, phase)
}

/// Two claims; controller 0 grants the first, writes its mirrors, and sees its
/// holder's first renewal (the Lease's duration is 2 s).
pub(super) fn granted_and_renewed_once() -> Vec<Op> {
    vec![
        Op::AddClaim {
            with_pod: false,
            slot: None,
        },
        Op::AddClaim {
            with_pod: false,
            slot: None,
        },
        Op::Sync(0),
        Op::Finish(0),
        Op::Sync(0),
        Op::Finish(0),
        Op::Renew(0),
        Op::Sync(0),
        Op::Finish(0),
    ]
}

/// The holder renews again within its local deadline, and the controller's claim
/// watch has not delivered it when the expiry it last knew of comes due: the quorum
/// read sees the renewal and the grant is kept.
#[test]
fn a_renewal_the_watch_has_not_delivered_keeps_an_expiring_grant() {
    let mut ops = granted_and_renewed_once();
    ops.extend([
        Op::AdvanceMs(1000),
        Op::Renew(0),
        Op::AdvanceMs(1100),
        Op::Finish(0),
    ]);
    let world = run_ops(ops).unwrap();
    assert_eq!(
        holder_and_phase(&world, "c000"),
        (Some("c000".into()), Some(ClaimPhase::Granted))
    );
}

/// The expiry of a holder that renewed is one write: a quorum read of its claim,
/// then the Lease, its claim's `Expired` left to the mirrors. A renewal that lands
/// between the read and the Lease write comes after the holder's local deadline,
/// and counts for nothing.
#[test]
fn an_expiry_after_renewals_is_one_write_and_a_racing_renewal_counts_for_nothing() {
    let mut ops = granted_and_renewed_once();
    ops.extend([Op::RenewAfterNextRead(0), Op::AdvanceMs(2100)]);
    let world = run_ops(ops).unwrap();
    assert_eq!(
        holder_and_phase(&world, "c000"),
        (Some("c001".into()), Some(ClaimPhase::Granted))
    );
    assert_eq!(world.renew_after_read, None, "the expiry read no claim");
    let uid = world.claims["c000"].metadata.uid.clone().unwrap();
    assert!(world.beliefs[&uid].gave_up);

    let mut ops = granted_and_renewed_once();
    ops.extend([Op::AdvanceMs(2100), Op::Finish(0), Op::Finish(0)]);
    let world = run_ops(ops).unwrap();
    assert_eq!(
        holder_and_phase(&world, "c000"),
        (Some("c001".into()), Some(ClaimPhase::Expired))
    );
}

/// In the holder's last sixth a quorum read confirms its expiry ahead of it, so
/// the expiry itself reads nothing: the renewal queued for the next claim read is
/// still waiting after it. A renewal landing after the early read comes after the
/// holder's local deadline and counts for nothing.
#[test]
fn an_expiry_confirmed_ahead_reads_nothing_when_it_comes() {
    let mut ops = granted_and_renewed_once();
    ops.extend([
        Op::AdvanceMs(1700),
        Op::Finish(0),
        Op::Renew(0),
        Op::RenewAfterNextRead(0),
        Op::AdvanceMs(400),
    ]);
    let world = run_ops(ops).unwrap();
    assert_eq!(holder_and_phase(&world, "c000").0, Some("c001".into()));
    assert_eq!(world.renew_after_read, Some(0), "the expiry read a claim");
    let uid = world.claims["c000"].metadata.uid.clone().unwrap();
    assert!(world.beliefs[&uid].gave_up);
}

/// A renewal within the holder's local deadline, that the controller's watch has
/// not delivered, lands before the early read is due: the read sees it, and the
/// grant is kept (an early read made before the holder's deadline would have let
/// the Lease go while the holder still believed).
#[test]
fn a_renewal_before_the_early_read_keeps_the_grant() {
    let mut ops = granted_and_renewed_once();
    ops.extend([
        Op::AdvanceMs(1100),
        Op::Finish(0),
        Op::Renew(0),
        Op::AdvanceMs(1000),
        Op::Finish(0),
    ]);
    let world = run_ops(ops).unwrap();
    assert_eq!(
        holder_and_phase(&world, "c000"),
        (Some("c000".into()), Some(ClaimPhase::Granted))
    );
}

/// A holder that never renewed may be a client whose first renewal, after a watch
/// replayed its grant late, counts whenever it comes: its claim is marked before
/// the Lease is handed on, so a first renewal after the expiry finds it ended.
#[test]
fn a_first_renewal_after_an_expiry_finds_the_claim_marked() {
    let world = run_ops(vec![
        Op::AddClaim {
            with_pod: false,
            slot: None,
        },
        Op::AddClaim {
            with_pod: false,
            slot: None,
        },
        Op::Sync(0),
        Op::Finish(0),
        Op::Sync(0),
        Op::Finish(0),
        Op::Finish(0),
        Op::AdvanceMs(2100),
        Op::Renew(0),
    ])
    .unwrap();
    assert_eq!(
        holder_and_phase(&world, "c000"),
        (Some("c001".into()), Some(ClaimPhase::Expired))
    );
}

async fn run_model(permits: i32, ops: Vec<Op>) -> Result<Model, TestCaseError> {
    let start = clock();
    let model = Model(Arc::new(Mutex::new(World::new(start))), 0);
    {
        let mut world = model.0.lock().unwrap();
        let rv = world.bump();
        world.permits = permits;
        world.lease = Some(
            LeaseBuilder::new(NAME)
                .uid("L0")
                .resource_version(rv)
                .generation(1)
                .duration(2)
                .permits(permits)
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
                if controllers[n].passes.is_empty() {
                    converged(&controllers[n], &model)?;
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
            running_counts_agree(c)?;
        }
        let violations = std::mem::take(&mut model.0.lock().unwrap().violations);
        prop_assert!(violations.is_empty(), "{:?}", violations);
    }
    Ok(model)
}

/// The index's running counts (the gauges' source) are what a walk of it finds.
fn running_counts_agree(controller: &Controller) -> Result<(), TestCaseError> {
    let index = controller.core.index();
    let walked = index.counts_by_walking();
    prop_assert_eq!(
        (
            index.lease_count(),
            index.held_count(),
            index.waiting_count()
        ),
        (walked.leases, walked.held, walked.waiting),
        "running counts drifted"
    );
    prop_assert_eq!(
        index.longest_queue(),
        index.longest_queue_by_walking(),
        "the longest queue drifted"
    );
    Ok(())
}

/// With every event delivered and no outcome outstanding, the index holds the
/// server's Lease: no outcome left a stale or re-created one behind.
fn converged(controller: &Controller, model: &Model) -> Result<(), TestCaseError> {
    let version = |l: &Lease| (l.metadata.uid.clone(), l.metadata.resource_version.clone());
    let seen = controller.core.index().lease(&key()).map(|l| version(l));
    let truth = model.0.lock().unwrap().lease.as_ref().map(version);
    prop_assert_eq!(
        seen,
        truth,
        "the index did not converge on the server's Lease"
    );
    Ok(())
}

/// What the users and the kubelet do: create, renew and delete claims, delete pods,
/// re-create and edit the Lease.
fn change_world(world: &mut World, op: Op, start: Instant, now: Instant) {
    match op {
        Op::AddClaim { with_pod, slot } => {
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
            // Even claims name their pod's UID too (as the client library binds
            // them), odd ones only its name.
            let claim = ClaimBuilder::new(&name, NAME)
                .uid(&format!("u{i}"))
                .resource_version(world.bump())
                .created((now - start).as_secs() as i64)
                .slot(slot);
            let c = match &pod_name {
                Some(p) if i.is_multiple_of(2) => claim.pod_with_uid(p, &format!("pu{i}")),
                _ => claim.pod(pod_name.as_deref()),
            }
            .build();
            world.claims.insert(name, c.clone());
            // The create's response vouches for a grant that follows at once.
            world.written.insert(format!("u{i}"), now);
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
        Op::Renew(i) => world.renew(i),
        Op::EarlyWrite(i) => world.early_write(i),
        Op::RenewAfterNextRead(i) => world.renew_after_read = Some(i),
        Op::RecreateLease => recreate_lease(world),
        Op::SetDuration(secs) => edit_lease(world, |l| l.spec.lease_duration_seconds = secs),
        Op::SetPermits(permits) => {
            world.permits = permits;
            edit_lease(world, |l| l.spec.permits = permits);
        }
        Op::AdvanceMs(_) | Op::Sync(_) | Op::Relist(_) | Op::Decide(_) | Op::Finish(_) => {
            unreachable!("the controllers' steps are not changes of the world")
        }
    }
}

/// The Lease deleted and created again under its name, with the same spec.
fn recreate_lease(world: &mut World) {
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
        .permits(world.permits)
        .build();
    world.lease = Some(new.clone());
    world.broadcast(Change::Lease(old, Some(new)));
}

/// Someone edits the Lease's spec.
fn edit_lease(world: &mut World, edit: impl FnOnce(&mut Lease)) {
    let rv = world.bump();
    if let Some(l) = world.lease.as_mut() {
        edit(l);
        l.metadata.resource_version = Some(rv.to_string());
        let l = l.clone();
        world.broadcast(Change::Lease(None, Some(l)));
    }
}
