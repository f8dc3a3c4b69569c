//! The fault kinds, their seeded schedule, and their injection: signals to holders
//! and replicas, restarts of the control plane and the databases, and the proxies'
//! delays, cuts and black holes.

use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease as CoordinationLease;
use kube::Client;
use kube::api::Api;
use palisade::crd::Lease;
use support::proxy::{Mode, Proxy};

use crate::cluster::{ChaosLease, ControlPlane, HA_APISERVERS, LEASE_SECONDS, NAMESPACE};
use crate::dbstores;
use crate::ha::{self, HaFault};
use crate::history::{Event, Recorder};
use crate::operator_faults::{operator_grant, pause_operator};
use crate::processes::{ELECTION_NAME, Election, Processes, signal};
use crate::rng::{Rng, now_ns};

/// How long `failover` waits for a standby to take over before it gives up waiting
/// (and says so in the fault's record): many times the election's promise.
const TAKEOVER_WAIT: Duration = Duration::from_secs(15);
/// A silenced holder is expired within its duration plus this: the confirmation read,
/// the marks and Lease writes, a take-over under way (the election's lease and a
/// retry), and the next holder's acquire or the harness's watch seeing it, with a
/// margin for a loaded machine (4.4 s past the silence was seen in a 10-minute run);
/// still less than the five durations of leadership changes `flap_leadership` makes,
/// which a new leader restarting the holder clocks would add.
const SILENCED_EXPIRY_SLACK: Duration = Duration::from_secs(5);

/// A kind of fault. [`Fault::name`] is how the run's output, the history and the
/// checker's summary name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    PauseHolder,
    FlapLeadership,
    Storm,
    KillHolder,
    KillController,
    Failover,
    SplitBrain,
    RestartApiserver,
    RestartEtcd,
    DelayControllerLink,
    DelayWorkerLinks,
    CutControllerLink,
    CutWorkerLinks,
    BlackholeControllerLink,
    BlackholeWorkerLinks,
    // The operator workers' leader, of operator_faults.rs.
    PauseOperator,
    // The replicated control plane's (`--ha`), of ha.rs.
    Ha(HaFault),
    // The database faults, of dbstores.rs.
    RestartPostgres,
    RestartRedis,
    RestartMysql,
    KillRelay,
    PauseRelay,
    KillWorkerInTransaction,
    PauseInTransaction,
    LoseRedisMarks,
    EvictRedisMarks,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::PauseHolder => "pause_holder",
            Fault::FlapLeadership => "flap_leadership",
            Fault::Storm => "storm",
            Fault::KillHolder => "kill_holder",
            Fault::KillController => "kill_controller",
            Fault::Failover => "failover",
            Fault::SplitBrain => "split_brain",
            Fault::RestartApiserver => "restart_apiserver",
            Fault::RestartEtcd => "restart_etcd",
            Fault::DelayControllerLink => "delay_controller_link",
            Fault::DelayWorkerLinks => "delay_worker_links",
            Fault::CutControllerLink => "cut_controller_link",
            Fault::CutWorkerLinks => "cut_worker_links",
            Fault::BlackholeControllerLink => "blackhole_controller_link",
            Fault::BlackholeWorkerLinks => "blackhole_worker_links",
            Fault::PauseOperator => "pause_operator",
            Fault::Ha(HaFault::KillEtcdLeader) => "kill_etcd_leader",
            Fault::Ha(HaFault::PartitionEtcdMinority) => "partition_etcd_minority",
            Fault::Ha(HaFault::PartitionEtcdLeader) => "partition_etcd_leader",
            Fault::Ha(HaFault::LagApiserver) => "lag_apiserver",
            Fault::Ha(HaFault::KillApiserver) => "kill_apiserver",
            Fault::Ha(HaFault::CompactWhileBehind) => "compact_while_behind",
            Fault::RestartPostgres => "restart_postgres",
            Fault::RestartRedis => "restart_redis",
            Fault::RestartMysql => "restart_mysql",
            Fault::KillRelay => "kill_relay",
            Fault::PauseRelay => "pause_relay",
            Fault::KillWorkerInTransaction => "kill_worker_in_transaction",
            Fault::PauseInTransaction => "pause_in_transaction",
            Fault::LoseRedisMarks => "lose_redis_marks",
            Fault::EvictRedisMarks => "evict_redis_marks",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// The harness's faults; dbstores.rs adds its own ([`dbstores::FAULTS`]). A round
/// is these, then those, shuffled: this order is part of what a seed names.
const FAULTS: [Fault; 16] = [
    Fault::PauseHolder,
    Fault::FlapLeadership,
    Fault::Storm,
    Fault::KillHolder,
    Fault::KillController,
    Fault::Failover,
    Fault::SplitBrain,
    Fault::RestartApiserver,
    Fault::RestartEtcd,
    Fault::DelayControllerLink,
    Fault::DelayWorkerLinks,
    Fault::CutControllerLink,
    Fault::CutWorkerLinks,
    Fault::BlackholeControllerLink,
    Fault::BlackholeWorkerLinks,
    Fault::PauseOperator,
];

/// The replicated control plane's kinds (`--ha`): in every round, and first in the
/// first, so even a short run has each.
pub const HA_FAULTS: [Fault; 6] = [
    Fault::Ha(HaFault::KillEtcdLeader),
    Fault::Ha(HaFault::PartitionEtcdMinority),
    Fault::Ha(HaFault::PartitionEtcdLeader),
    Fault::Ha(HaFault::LagApiserver),
    Fault::Ha(HaFault::KillApiserver),
    Fault::Ha(HaFault::CompactWhileBehind),
];

/// The first round begins with these, in this order (see [`Schedule`]). The losses
/// of the lossy Redis stores come early too: before the first RDB snapshot (300 s),
/// so `redis-rdb` comes back empty, and within a short run.
const FIRST_FAULTS: [Fault; 8] = [
    Fault::PauseHolder,
    Fault::PauseInTransaction,
    Fault::PauseOperator,
    Fault::Storm,
    Fault::Failover,
    Fault::FlapLeadership,
    Fault::LoseRedisMarks,
    Fault::EvictRedisMarks,
];

/// The order of fault kinds depends on the seed alone: this generator only
/// shuffles rounds and seeds each fault's own generator, the same number of draws
/// whatever the faults found. Each fault draws its parameters (and the pause after
/// it) from its own, so what one fault found cannot shift the next one's.
pub struct Schedule {
    scheduler: Rng,
    round: Vec<Fault>,
    first: bool,
    ha: bool,
}

impl Schedule {
    /// `ha`: the rounds include [`HA_FAULTS`].
    pub fn new(seed: u64, ha: bool) -> Self {
        Schedule {
            scheduler: Rng::new(seed),
            round: Vec::new(),
            first: true,
            ha,
        }
    }

    /// The next fault, and the generator of its own that it draws from.
    pub fn next_fault(&mut self) -> (Fault, Rng) {
        if self.round.is_empty() {
            self.round = FAULTS.iter().chain(&dbstores::FAULTS).copied().collect();
            if self.ha {
                self.round.extend(HA_FAULTS);
            }
            self.scheduler.shuffle(&mut self.round);
            if self.first {
                // The classic case comes first, so even a short run has stale writes;
                // its database twin second, so the database stores see stale writes
                // too, and its operator twin third; then the storm, the failover and
                // flapping leadership, so the short run has them.
                let last = self.round.len() - 1;
                let ha_first: &[Fault] = if self.ha { &HA_FAULTS } else { &[] };
                for (k, kind) in ha_first.iter().chain(&FIRST_FAULTS).enumerate() {
                    let i = self.round.iter().position(|f| f == kind).expect("listed");
                    self.round.swap(i, last - k);
                }
                self.first = false;
            }
        }
        let rng = Rng::new(self.scheduler.next_u64());
        let fault = self.round.pop().expect("refilled above");
        (fault, rng)
    }
}

pub struct FaultContext<'a> {
    pub admin: &'a Client,
    pub plane: &'a ControlPlane,
    pub leases: &'a [ChaosLease],
    /// One per API server the replicas (and the workers) are pinned to.
    pub controller_proxies: &'a [Proxy],
    pub worker_proxies: &'a [Proxy],
}

/// A current holder that is one of our live workers, picked at random.
pub async fn pick_holder(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    rng: &mut Rng,
) -> Option<String> {
    pick_grant(ctx, procs, rng).await.map(|g| g.identity)
}

/// A grant held by one of our live workers: a slot of a Lease (a lock's is slot 0).
pub struct HeldGrant {
    pub identity: String,
    pub namespace: &'static str,
    pub lease: String,
    pub slot: i32,
    /// The slot's fence key: the stores' key for its marks.
    pub fence_key: String,
    pub claim_uid: String,
    pub token: u64,
    /// Whether the Lease had a waiter when read: only then does the grant, once
    /// expired, pass to another holder (a free permit of a semaphore just stays free).
    pub contended: bool,
}

/// The grants our live workers hold, in Lease and slot order: every slot of every
/// Lease, read straight from the API server.
async fn held_grants(ctx: &FaultContext<'_>, procs: &Processes) -> Vec<HeldGrant> {
    let api: Api<Lease> = Api::namespaced(ctx.admin.clone(), NAMESPACE);
    let mut held = Vec::new();
    for lease in ctx.leases {
        // Bounded: behind a partitioned etcd member a read can hang for long.
        let Ok(Ok(l)) = tokio::time::timeout(Duration::from_secs(2), api.get(&lease.name)).await
        else {
            continue;
        };
        let status = l.status.unwrap_or_default();
        let contended = has_waiter(&status);
        for row in status.slot_rows() {
            if let Some(h) = row.holder
                && procs.worker_pid(&h.identity).is_some()
            {
                held.push(HeldGrant {
                    identity: h.identity,
                    namespace: NAMESPACE,
                    lease: lease.name.clone(),
                    slot: row.slot,
                    fence_key: palisade::permits::fence_key(NAMESPACE, &lease.name, row.slot),
                    claim_uid: h.claim_uid,
                    token: row.fencing_token.unwrap_or(0) as u64,
                    contended,
                });
            }
        }
    }
    held
}

/// Whether a Lease's status shows a claim waiting.
pub fn has_waiter(status: &palisade::crd::LeaseStatus) -> bool {
    !status.waiting.is_empty() || status.waiting_count.unwrap_or(0) > 0
}

/// [`pick_holder`], with the Lease, the slot and the claim: any slot's holder.
pub async fn pick_grant(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    rng: &mut Rng,
) -> Option<HeldGrant> {
    let mut holders = held_grants(ctx, procs).await;
    if holders.is_empty() {
        return None;
    }
    let i = rng.range(0, holders.len() as u64) as usize;
    Some(holders.swap_remove(i))
}

/// The current holders that are live workers (of every slot), in Lease order, polled
/// until every Lease has one (or until one and a half seconds have passed): a storm
/// should catch every grant, not the moment between a release and the next grant.
async fn all_holders(ctx: &FaultContext<'_>, procs: &Processes) -> Vec<String> {
    let mut holders = Vec::new();
    for _ in 0..15 {
        let held = held_grants(ctx, procs).await;
        holders.clear();
        for grant in &held {
            if !holders.contains(&grant.identity) {
                holders.push(grant.identity.clone());
            }
        }
        let every_lease_held = ctx
            .leases
            .iter()
            .all(|l| held.iter().any(|g| g.lease == l.name));
        if every_lease_held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holders
}

/// Who the election record names (read straight from the API server), if anyone.
async fn election_holder(admin: &Client) -> Option<String> {
    let api: Api<CoordinationLease> = Api::namespaced(admin.clone(), NAMESPACE);
    match tokio::time::timeout(Duration::from_secs(2), api.get_opt(ELECTION_NAME)).await {
        Ok(Ok(Some(lease))) => lease
            .spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()),
        _ => None,
    }
}

/// Injects one fault and waits until it is over. Returns what it hit, or `None`
/// when there was nothing to hit.
pub async fn inject(
    fault: Fault,
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let target = match fault {
        Fault::PauseHolder => pause_holder(ctx, procs, rng).await,
        Fault::FlapLeadership => flap_leadership(ctx, procs, rng).await?,
        Fault::Storm => storm(ctx, procs, rng).await,
        Fault::KillHolder => kill_holder(ctx, procs, rng).await,
        Fault::KillController => Some(kill_controller(procs, rng).await),
        Fault::Failover => failover(ctx, procs, rng).await,
        Fault::SplitBrain => Some(split_brain(ctx, procs, rng).await),
        Fault::RestartApiserver => Some(restart_component(ctx.plane, "kube-apiserver", rng).await?),
        Fault::RestartEtcd => Some(restart_component(ctx.plane, "etcd", rng).await?),
        Fault::DelayControllerLink => Some(delay_link(ctx.controller_proxies, rng).await),
        Fault::DelayWorkerLinks => Some(delay_link(ctx.worker_proxies, rng).await),
        Fault::CutControllerLink => Some(cut_link(ctx.controller_proxies, rng).await),
        Fault::CutWorkerLinks => Some(cut_link(ctx.worker_proxies, rng).await),
        Fault::BlackholeControllerLink => Some(blackhole_link(ctx.controller_proxies, rng).await),
        Fault::BlackholeWorkerLinks => Some(blackhole_link(ctx.worker_proxies, rng).await),
        Fault::PauseOperator => pause_operator(ctx, procs, rng).await,
        Fault::Ha(kind) => return ha::inject(kind, ctx, procs, rng).await,
        Fault::RestartPostgres
        | Fault::RestartRedis
        | Fault::RestartMysql
        | Fault::KillRelay
        | Fault::PauseRelay
        | Fault::KillWorkerInTransaction
        | Fault::PauseInTransaction
        | Fault::LoseRedisMarks
        | Fault::EvictRedisMarks => return inject_db(fault, ctx, procs, rng).await,
    };
    Ok(target)
}

/// `pause_holder`: SIGSTOP one holder past its lease (1.25 to 2.5 durations, a long
/// GC pause), then SIGCONT.
async fn pause_holder(
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Option<String> {
    let holder = pick_holder(ctx, procs, rng).await?;
    let lease = Duration::from_secs(LEASE_SECONDS).as_millis() as u64;
    let pause = rng.millis(lease * 5 / 4, lease * 5 / 2);
    Some(pause_worker(procs, &holder, pause).await)
}

/// SIGSTOPs live worker `holder` for `pause`, then SIGCONTs it.
async fn pause_worker(procs: &Processes, holder: &str, pause: Duration) -> String {
    let pid = procs.worker_pid(holder).expect("picked among live workers");
    signal(pid, libc::SIGSTOP);
    tokio::time::sleep(pause).await;
    signal(pid, libc::SIGCONT);
    format!("{holder} for {} ms", pause.as_millis())
}

/// `flap_leadership`: a silent holder while leadership changes hands, over and over.
async fn flap_leadership(
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let lease = Duration::from_secs(LEASE_SECONDS);
    // A silent holder is expired on time however often leadership changes:
    // its worker is stopped, then whichever replica leads is stopped until the
    // other takes over (after the 1 s election lease) and resumed, over and over
    // for five lease durations. A new leader that restarted every holder's
    // clock would never expire it.
    let Some(held) = pick_grant(ctx, procs, rng).await else {
        return Ok(None);
    };
    let pid = procs
        .worker_pid(&held.identity)
        .expect("picked among live workers");
    signal(pid, libc::SIGSTOP);
    let silenced = now_ns();
    let began = Instant::now();
    let mut takeovers = 0;
    while began.elapsed() < lease * 5 {
        let Some((leader, leader_pid)) = election_holder(ctx.admin)
            .await
            .and_then(|h| procs.controller_pid(&h).map(|pid| (h, pid)))
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        signal(leader_pid, libc::SIGSTOP);
        if stopped_leader_replaced(ctx.admin, &leader).await {
            takeovers += 1;
        }
        signal(leader_pid, libc::SIGCONT);
    }
    signal(pid, libc::SIGCONT);
    Recorder::create(&procs.out.join("expectations.jsonl"))
        .map_err(|e| format!("opening the expectations file: {e}"))?
        .record(&Event::Silenced {
            lease: held.lease,
            slot: held.slot,
            claim_uid: held.claim_uid,
            t_ns: silenced,
            within_ns: (lease + SILENCED_EXPIRY_SLACK).as_nanos() as u64,
        });
    Ok(Some(format!(
        "{} silent while leadership changed hands {takeovers} times in {} ms",
        held.identity,
        began.elapsed().as_millis()
    )))
}

/// Whether, within [`TAKEOVER_WAIT`] of `leader`'s being stopped, the election record
/// names another replica.
async fn stopped_leader_replaced(admin: &Client, leader: &str) -> bool {
    let stopped = Instant::now();
    while stopped.elapsed() < TAKEOVER_WAIT {
        if election_holder(admin).await.is_some_and(|h| h != leader) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// `storm`: SIGSTOP every holder (most, with three or more) and the operators' leader
/// at once, then SIGCONT them together.
async fn storm(ctx: &FaultContext<'_>, procs: &mut Processes, rng: &mut Rng) -> Option<String> {
    let lease = Duration::from_secs(LEASE_SECONDS);
    // Drawn first, whatever is found: the same draws for every run of a seed.
    let pause = rng.millis(
        lease.as_millis() as u64 * 3 / 2,
        lease.as_millis() as u64 * 3,
    );
    let spare_one = rng.range(0, 2) == 1;
    let spared_pick = rng.next_u64();
    let mut holders = all_holders(ctx, procs).await;
    if holders.is_empty() {
        return None;
    }
    let of = holders.len();
    // Most or all: with three holders or more, a seeded half of the storms spare one.
    if of >= 3 && spare_one {
        holders.remove((spared_pick % of as u64) as usize);
    }
    // And the operators' leader, which wakes deposed like the others.
    let operator = operator_grant(ctx, procs, 1).await.map(|o| o.identity);
    let pids: Vec<i32> = holders
        .iter()
        .chain(&operator)
        .map(|h| procs.worker_pid(h).expect("picked among live workers"))
        .collect();
    // Together: their grants expire in the same controller pass or nearly, the
    // waiters are granted in a burst, and every paused holder wakes up stale.
    for &pid in &pids {
        signal(pid, libc::SIGSTOP);
    }
    tokio::time::sleep(pause).await;
    for &pid in &pids {
        signal(pid, libc::SIGCONT);
    }
    let operator = operator.map_or(String::new(), |o| format!(" and the operators' leader {o}"));
    Some(format!(
        "{} ({} of {of} live holders, {} leases){operator} for {} ms",
        holders.join(","),
        holders.len(),
        ctx.leases.len(),
        pause.as_millis()
    ))
}

/// `kill_holder`: SIGKILL a holder (a new worker takes its place).
async fn kill_holder(
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Option<String> {
    let holder = pick_holder(ctx, procs, rng).await?;
    procs.kill_worker(&holder);
    procs.spawn_worker();
    Some(holder)
}

/// `kill_controller`: SIGKILL both replicas, start two new ones 0.2 to 3 s later.
pub async fn kill_controller(procs: &mut Processes, rng: &mut Rng) -> String {
    // Every replica at once: no controller at all, then two new replicas
    // that find the dead leader's record and must wait it out.
    let down = rng.millis(200, 3000);
    let killed = procs.kill_controllers();
    tokio::time::sleep(down).await;
    let started = procs.start_missing_replicas();
    format!(
        "{} down for {} ms, {} started",
        killed.join(","),
        down.as_millis(),
        started.join(",")
    )
}

/// `failover`: SIGKILL the leader, wait for the standby to take over, then start a
/// replacement.
async fn failover(ctx: &FaultContext<'_>, procs: &mut Processes, rng: &mut Rng) -> Option<String> {
    let replace_after = rng.millis(0, 2000);
    let leader = election_holder(ctx.admin)
        .await
        .filter(|h| procs.controllers.iter().any(|(id, _)| id == h))?;
    // SIGKILL: it cannot release, so the standby waits for the record to expire.
    procs.kill_replica(&leader);
    let killed = Instant::now();
    let mut took_over = None;
    while killed.elapsed() < TAKEOVER_WAIT {
        if let Some(h) = election_holder(ctx.admin).await
            && h != leader
        {
            took_over = Some((h, killed.elapsed()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let takeover = match took_over {
        Some((h, after)) => format!("{h} leading {} ms later", after.as_millis()),
        None => {
            println!(
                "chaos: failover: no replica took over from {leader} within {} s",
                TAKEOVER_WAIT.as_secs()
            );
            format!("no takeover within {} ms", TAKEOVER_WAIT.as_millis())
        }
    };
    tokio::time::sleep(replace_after).await;
    let started = procs.start_missing_replicas();
    Some(format!(
        "leader {leader} killed, {takeover}, {} started {} ms after",
        started.join(","),
        replace_after.as_millis()
    ))
}

/// `split_brain`: one more controller, election off, beside the replicas.
pub async fn split_brain(ctx: &FaultContext<'_>, procs: &mut Processes, rng: &mut Rng) -> String {
    // One more controller, election off, straight to the API server (so it
    // and the elected leader see the world with different delays), for 5 to
    // 15 s: grants must stay safe whatever the election says.
    let second = procs.start_controller(
        &ctx.plane.kubeconfig(),
        Election::Off,
        "controller-extra.log",
    );
    let span = rng.millis(5000, 15000);
    tokio::time::sleep(span).await;
    let mut second = second;
    let _ = second.kill();
    let _ = second.wait();
    format!(
        "a controller with election off beside the replicas for {} ms",
        span.as_millis()
    )
}

/// `restart_apiserver`, `restart_etcd`: cluster.sh restarts the component (on the
/// HA plane, one API server or etcd member, picked at random).
async fn restart_component(
    plane: &ControlPlane,
    component: &'static str,
    rng: &mut Rng,
) -> Result<String, String> {
    let pick = rng.range(0, 6);
    let component = match (plane.ha, component) {
        (false, c) => c.to_string(),
        (true, "etcd") => format!("etcd-{}", pick % crate::cluster::ETCD_MEMBERS as u64),
        (true, c) => format!("{c}-{}", pick % HA_APISERVERS as u64),
    };
    let plane = plane.clone();
    let started = Instant::now();
    let name = component.clone();
    tokio::task::spawn_blocking(move || plane.script(&["restart", &name]))
        .await
        .map_err(|e| e.to_string())??;
    Ok(format!(
        "{component} back in {} ms",
        started.elapsed().as_millis()
    ))
}

/// Every proxy of `proxies` set to `mode`.
fn set_all(proxies: &[Proxy], mode: Mode) {
    for proxy in proxies {
        proxy.set(mode);
    }
}

/// `delay_controller_link`, `delay_worker_links`: every chunk held a while.
async fn delay_link(proxies: &[Proxy], rng: &mut Rng) -> String {
    let delay = rng.millis(100, 800);
    let span = rng.millis(3000, 8000);
    set_all(proxies, Mode::Delay(delay));
    tokio::time::sleep(span).await;
    set_all(proxies, Mode::Pass);
    format!(
        "{} ms per chunk for {} ms",
        delay.as_millis(),
        span.as_millis()
    )
}

/// `cut_controller_link`, `cut_worker_links`.
async fn cut_link(proxies: &[Proxy], rng: &mut Rng) -> String {
    let span = rng.millis(1000, 5000);
    set_all(proxies, Mode::Cut);
    tokio::time::sleep(span).await;
    set_all(proxies, Mode::Pass);
    format!("for {} ms", span.as_millis())
}

/// `blackhole_controller_link`, `blackhole_worker_links`.
async fn blackhole_link(proxies: &[Proxy], rng: &mut Rng) -> String {
    // Open connections go silent for good; new ones too while it lasts.
    let span = rng.millis(1000, 5000);
    set_all(proxies, Mode::Blackhole);
    tokio::time::sleep(span).await;
    set_all(proxies, Mode::Pass);
    format!("for {} ms", span.as_millis())
}

/// The database faults (dbstores.rs): restart PostgreSQL (immediate shutdown),
/// Redis or MariaDB (SIGKILL), SIGKILL a worker inside an open PostgreSQL transaction, or make
/// a lossy Redis lose its marks.
async fn inject_db(
    fault: Fault,
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let target = match fault {
        Fault::RestartPostgres => restart_db_server(ctx, "postgres").await?,
        Fault::RestartRedis => restart_db_server(ctx, "redis").await?,
        Fault::RestartMysql => restart_db_server(ctx, "mysql").await?,
        Fault::KillRelay => procs.relays.as_mut().expect("started").kill_one(rng),
        Fault::PauseRelay => procs.relays.as_ref().expect("started").pause_one(rng).await,
        Fault::LoseRedisMarks => {
            let servers = dbstores::Servers::new(&ctx.plane.root);
            tokio::task::spawn_blocking(move || servers.lose_marks())
                .await
                .map_err(|e| e.to_string())??
        }
        Fault::EvictRedisMarks => {
            dbstores::Servers::new(&ctx.plane.root)
                .evict_marks(&crate::cluster::fence_keys(ctx.leases))
                .await?
        }
        Fault::KillWorkerInTransaction => {
            let Some(worker) = worker_in_transaction(ctx, procs).await else {
                return Ok(None);
            };
            procs.kill_worker(&worker);
            procs.spawn_worker();
            worker
        }
        Fault::PauseInTransaction => {
            // The classic pause, inside an open transaction: its row lock holds up
            // the next holder's check until it resumes and commits.
            let Some(worker) = worker_in_transaction(ctx, procs).await else {
                return Ok(None);
            };
            let pid = procs
                .worker_pid(&worker)
                .expect("picked among live workers");
            let lease = Duration::from_secs(LEASE_SECONDS).as_millis() as u64;
            let pause = rng.millis(lease * 5 / 4, lease * 5 / 2);
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(pause).await;
            signal(pid, libc::SIGCONT);
            format!("{worker} for {} ms", pause.as_millis())
        }
        other => return Err(format!("{other} is not a database fault")),
    };
    Ok(Some(target))
}

/// `restart_postgres`, `restart_redis`: databases.sh restarts the server (`which`).
async fn restart_db_server(ctx: &FaultContext<'_>, which: &str) -> Result<String, String> {
    let servers = dbstores::Servers::new(&ctx.plane.root);
    let started = Instant::now();
    let arg = which.to_string();
    tokio::task::spawn_blocking(move || servers.script(&["restart", &arg]))
        .await
        .map_err(|e| e.to_string())??;
    Ok(format!(
        "{which} back in {} ms",
        started.elapsed().as_millis()
    ))
}

/// One of our live workers inside an open PostgreSQL transaction, if any.
async fn worker_in_transaction(ctx: &FaultContext<'_>, procs: &Processes) -> Option<String> {
    let live: Vec<String> = procs.workers.iter().map(|(id, _)| id.clone()).collect();
    let servers = dbstores::Servers::new(&ctx.plane.root);
    servers.worker_in_transaction(&live).await
}
