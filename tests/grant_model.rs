//! The grant decision and the index, without a cluster: unit tests of single
//! decisions, and property tests that drive two controllers with independently
//! stale views against a model API server with compare-and-swap writes.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use palisade::api::{ClaimPhase, Lease, LeaseClaim, LeasePhase};
use palisade::grant::{Ending, decide};
use palisade::index::{Index, LeaseKey, POD_GRACE};
use proptest::prelude::*;
use serde_json::json;

const NS: &str = "ns";
const NAME: &str = "lock";

fn lease(uid: &str, rv: u64, duration: i64, status: Option<serde_json::Value>) -> Lease {
    let mut l: Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NS, "uid": uid, "resourceVersion": rv.to_string(), "generation": 1},
        "spec": {"leaseDurationSeconds": duration}
    }))
    .unwrap();
    if let Some(s) = status {
        l.status = Some(serde_json::from_value(s).unwrap());
    }
    l
}

fn claim(name: &str, uid: &str, created_secs: i64, pod: Option<&str>) -> LeaseClaim {
    let mut spec = json!({"leaseName": NAME, "holderIdentity": name});
    if let Some(p) = pod {
        spec["pod"] = json!({"name": p});
    }
    let mut c: LeaseClaim = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": "1"},
        "spec": spec
    }))
    .unwrap();
    c.metadata.creation_timestamp = Some(Time(
        Timestamp::from_second(1_700_000_000 + created_secs).unwrap(),
    ));
    c
}

fn pod(name: &str, uid: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn key() -> LeaseKey {
    LeaseKey::new(NS, NAME)
}

#[test]
fn first_waiter_in_fifo_order_is_granted_with_a_token_above_the_resource_version() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(lease("L", 100, 15, None), now);
    // Created later but named earlier: creation time decides.
    index.apply_claim(claim("a-late", "u1", 5, None), now);
    index.apply_claim(claim("z-early", "u2", 1, None), now);
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
    index.apply_lease(lease("L", 10, 2, None), now);
    let mut c = claim("a", "u1", 0, None);
    index.apply_claim(c.clone(), now);
    let k = key();
    // Settle: grant, and apply what the controller wrote.
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let mut written = lease("L", 11, 2, None);
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
    let held = json!({"phase": "Held", "holder": {"claim": "a", "claimUID": "u1", "identity": "a"}, "fencingToken": 50, "grants": 3});
    index.apply_lease(lease("L", 60, 2, Some(held)), now);
    index.apply_claim(claim("a", "u1", 0, None), now);
    index.apply_claim(claim("b", "u2", 1, None), now);
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
        let held = json!({"phase": "Held", "holder": {"claim": "a", "claimUID": "u1", "identity": "a"}, "fencingToken": 5});
        index.apply_lease(lease("L", 9, 600, Some(held)), now);
        index.apply_claim(claim("a", "u1", 0, Some("pod-a")), now);
        if let Some(phase) = pod_state {
            index.apply_pod(&pod("pod-a", "p1", phase));
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
    index.apply_lease(lease("L", 10, 15, None), now);
    index.apply_claim(claim("a", "u1", 0, Some("pod-a")), now);
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
    index.apply_pod(&pod("pod-a", "p1", "Running"));
    let later = now + Duration::from_millis(50);
    let d = decide(&index.view(&k, later).unwrap(), later, Timestamp::now());
    assert_eq!(d.granted.unwrap().claim, "a");

    // A pod that never shows up counts as gone after the grace period.
    let mut index = Index::default();
    index.apply_lease(lease("L", 10, 15, None), now);
    index.apply_claim(claim("b", "u2", 0, Some("pod-b")), now);
    let after = now + POD_GRACE;
    let d = decide(&index.view(&k, after).unwrap(), after, Timestamp::now());
    assert!(d.granted.is_none());
    assert_eq!(d.claim_updates[0].status.phase, Some(ClaimPhase::Revoked));
}

#[test]
fn claims_of_a_missing_lease_wait_with_lease_not_found() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_claim(claim("a", "u1", 0, None), now);
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
    let old = lease("old", 5, 15, None);
    index.apply_lease(lease("new", 9, 15, None), now);
    assert!(index.delete_lease(&old).is_none());
    assert!(index.lease(&key()).is_some());
}

// ---- model checking: two controllers, stale views, CAS writes ----------------------

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
    /// Controller 0 or 1 decides and writes (with whatever view it has).
    Decide(usize),
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
        6 => (0usize..2).prop_map(Op::Decide),
    ]
}

/// A model API server: one Lease, claims, pods; every write bumps a global resourceVersion.
struct World {
    rv: u64,
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
    /// once granted again on a re-created Lease (the model writes no claim statuses,
    /// so its claim never became final; a real client stopped at the deletion).
    grants: HashMap<String, Option<(Instant, u64)>>,
    /// A renewal (by the `renewTime` it wrote) -> when its holder sent it.
    renewals: HashMap<Timestamp, Instant>,
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
}

fn deliver(index: &mut Index, changes: Vec<Change>, now: Instant) {
    for c in changes {
        match c {
            Change::Lease(old, new) => {
                if let Some(old) = old {
                    index.delete_lease(&old);
                }
                if let Some(new) = new {
                    index.apply_lease(new, now);
                }
            }
            Change::Claim(c, deleted) if deleted => {
                index.delete_claim(&c);
            }
            Change::Claim(c, _) => {
                index.apply_claim(c, now);
            }
            Change::Pod(p, deleted) if deleted => {
                index.delete_pod(&p);
            }
            Change::Pod(p, _) => {
                index.apply_pod(&p);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn tokens_strictly_increase_and_each_belongs_to_one_claim(ops in proptest::collection::vec(op(), 1..120)) {
        let start = Instant::now();
        let mut now = start;
        let mut world = World {
            rv: 100, lease: None, lease_generation: 0, claims: BTreeMap::new(), pods: BTreeMap::new(),
            next_claim: 0, pending: [Vec::new(), Vec::new()], owners: HashMap::new(), published: Vec::new(),
            grants: HashMap::new(), renewals: HashMap::new(),
        };
        let rv = world.bump();
        let l = lease("L0", rv, 2, None);
        world.lease = Some(l.clone());
        world.broadcast(Change::Lease(None, Some(l)));
        let mut controllers = [Index::default(), Index::default()];

        for op in ops {
            match op {
                Op::AddClaim { with_pod } => {
                    let i = world.next_claim;
                    world.next_claim += 1;
                    let name = format!("c{i:03}");
                    let pod_name = with_pod.then(|| format!("p{i:03}"));
                    if let Some(p) = &pod_name {
                        let pd = pod(p, &format!("pu{i}"), "Running");
                        world.pods.insert(p.clone(), pd.clone());
                        world.broadcast(Change::Pod(pd, false));
                    }
                    let mut c = claim(&name, &format!("u{i}"), (now - start).as_secs() as i64, pod_name.as_deref());
                    c.metadata.resource_version = Some(world.bump().to_string());
                    world.claims.insert(name, c.clone());
                    world.broadcast(Change::Claim(c, false));
                }
                Op::DeleteClaim(i) => {
                    if let Some(name) = world.claims.keys().nth(i).cloned() {
                        let c = world.claims.remove(&name).unwrap();
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
                Op::AdvanceMs(ms) => now += Duration::from_millis(ms),
                Op::RecreateLease => {
                    world.lease_generation += 1;
                    let old = world.lease.take();
                    let rv = world.bump();
                    let new = lease(&format!("L{}", world.lease_generation), rv, 2, None);
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
                Op::Sync(n) => {
                    let changes = std::mem::take(&mut world.pending[n]);
                    deliver(&mut controllers[n], changes, now);
                    let running = (controllers[n].lease_count(), controllers[n].held_count());
                    let walked = controllers[n].counts_by_walking();
                    prop_assert_eq!(running, (walked.leases, walked.held), "running counts drifted");
                }
                Op::Decide(n) => {
                    let k = key();
                    let Some(view) = controllers[n].view(&k, now) else { continue };
                    let decision = decide(&view, now, Timestamp::now());
                    // When the holder sent the last renewal this controller has seen. (A
                    // later one makes the real controller's conditional claim write fail.)
                    let holder_uid = view.lease.and_then(|l| l.status.as_ref()?.holder.as_ref()).map(|h| h.claim_uid.clone());
                    let renewal_seen = view.claims.iter()
                        .find(|c| Some(&c.claim.uid) == holder_uid.as_ref())
                        .and_then(|c| c.claim.renew_time)
                        .map(|t| world.renewals[&t]);
                    let (Some(status), Some(base)) = (decision.lease_status, view.lease.cloned()) else { continue };
                    // Compare-and-swap against the model server.
                    let current = world.lease.clone();
                    let fresh = match &current {
                        Some(cur) if cur.metadata.resource_version == base.metadata.resource_version => {
                            let mut written = base.clone();
                            written.status = Some(status);
                            written.metadata.resource_version = Some(world.bump().to_string());
                            world.lease = Some(written.clone());
                            world.broadcast(Change::Lease(None, Some(written.clone())));
                            // The timing contract: a holder's client believes in at most the
                            // duration its grant was made with, counted from its last successful
                            // renewal's sending; the controller must not expire it before that.
                            if let Some(ended) = &decision.ended
                                && ended.how == Ending::Expired
                                && let Some((granted_at, secs)) = world.grants[holder_uid.as_ref().unwrap()]
                            {
                                let alive = renewal_seen.map_or(granted_at, |r| r.max(granted_at));
                                prop_assert!(
                                    now >= alive + Duration::from_secs(secs),
                                    "{} expired {:?} after its last renewal, granted for {}s",
                                    ended.claim, now - alive, secs
                                );
                            }
                            if let Some(g) = &decision.granted {
                                let holder = written.status.as_ref().unwrap().holder.as_ref().unwrap();
                                prop_assert_eq!(&holder.claim, &g.claim);
                                prop_assert!(g.token as u64 <= world.rv, "token above the rv that published it");
                                if let Some(last) = world.published.last() {
                                    prop_assert!(g.token > *last, "token {} after {}", g.token, last);
                                }
                                let previous = world.owners.insert(g.token, holder.claim_uid.clone());
                                prop_assert!(previous.is_none(), "token {} issued twice", g.token);
                                world.published.push(g.token);
                                let secs = written.spec.lease_duration_seconds as u64;
                                world.grants.entry(holder.claim_uid.clone()).and_modify(|g| *g = None).or_insert(Some((now, secs)));
                            }
                            Some(written)
                        }
                        // 409: the controller re-reads (what the real writer does).
                        _ => current,
                    };
                    if let Some(fresh) = fresh {
                        controllers[n].apply_lease(fresh, now);
                    }
                }
            }
        }
    }
}

/// Issue 13, item 11: a `fencingToken` at the top of the range (anyone with
/// `leases/status` can set one) must not make the next grant repeat or saturate it.
#[test]
fn a_token_at_the_maximum_is_refused_with_a_condition_instead_of_repeated() {
    for last in [999_999_999_999_999_999_i64, i64::MAX - 1, i64::MAX] {
        let now = Instant::now();
        let mut index = Index::default();
        let free = json!({"phase": "Free", "fencingToken": last, "grants": 3});
        index.apply_lease(lease("L", 60, 15, Some(free)), now);
        index.apply_claim(claim("a", "u1", 0, None), now);
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

/// Issue 13, item 12 (DESIGN "Client deadlines"): a holder's client keeps the
/// duration its grant was observed with (or a shorter one it sees later), so the
/// controller must never apply a shorter one to a grant in progress. Lowering
/// `leaseDurationSeconds` from 600 to 3 during a grant must not let the
/// controller expire the holder 3 s after its last renewal.
#[test]
fn a_lowered_lease_duration_does_not_cut_short_a_grant_in_progress() {
    let now = Instant::now();
    let mut index = Index::default();
    index.apply_lease(lease("L", 10, 600, None), now);
    let mut a = claim("a", "u1", 0, None);
    index.apply_claim(a.clone(), now);
    index.apply_claim(claim("b", "u2", 1, None), now);
    let k = key();
    let d = decide(&index.view(&k, now).unwrap(), now, Timestamp::now());
    let status = d.lease_status.clone().unwrap();
    let mut written = lease("L", 11, 600, None);
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
    let mut edited = lease("L", 12, 3, None);
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
    let now = Instant::now();
    let mut index = Index::default();
    let held = json!({"phase": "Held", "fencingToken": 50, "grants": 3,
        "holder": {"claim": "a", "claimUID": "u1", "identity": "a", "leaseDurationSeconds": 600}});
    // Spec lowered to 3 s after the grant; a new controller starts.
    index.apply_lease(lease("L", 60, 3, Some(held)), now);
    index.apply_claim(claim("a", "u1", 0, None), now);
    index.apply_claim(claim("b", "u2", 1, None), now);
    let restarted = now + Duration::from_secs(1);
    index.restart_holder_clocks(restarted);
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
        let mut holder = json!({"claim": "a", "claimUID": "u1", "identity": "a"});
        if let Some(r) = recorded {
            holder["leaseDurationSeconds"] = json!(r);
        }
        let held = json!({"phase": "Held", "fencingToken": 50, "holder": holder});
        let mut index = Index::default();
        index.apply_lease(lease("L", 60, spec, Some(held)), now);
        index.apply_claim(claim("a", "u1", 0, None), now);
        assert_eq!(
            index.view(&k, now).unwrap().holder_deadline,
            Some(now + Duration::from_secs(expected)),
            "recorded {recorded:?}, spec {spec}"
        );
    }
}
