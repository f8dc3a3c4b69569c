//! The faults of the replicated control plane (`--ha`): an etcd leader killed, a
//! member or the leader partitioned from the others, one API server's etcd link
//! slowed until its watch cache falls seconds behind, an API server killed (its
//! clients fail over through their load balancer), and a compaction while one API
//! server's cache is behind (its watchers are ended and resume from versions it no
//! longer has: 410 Gone, relists). Each overlaps with a holder pause (so a stale
//! write follows every kind), a pause of the operator workers' leader (the faults on
//! one API server hit the one it writes through) and, by the seed, a controller kill
//! or a split brain.

use std::time::{Duration, Instant};

use kube::api::Api;
use palisade::crd::Lease;

use crate::cluster::{ControlPlane, ETCD_MEMBERS, HA_APISERVERS, LEASE_SECONDS};
use crate::faults::{FaultContext, HeldGrant, kill_controller, pick_grant, split_brain};
use crate::operator_faults::operator_grant;
use crate::processes::{Processes, holds_long, signal};
use crate::rng::Rng;

/// The kinds of this module, as [`crate::faults::Fault`] names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaFault {
    KillEtcdLeader,
    PartitionEtcdMinority,
    PartitionEtcdLeader,
    LagApiserver,
    KillApiserver,
    CompactWhileBehind,
}

/// Injects `fault` on the control plane while a holder and the operators' leader,
/// picked just before, are paused past their leases from the same moment (and, for a seeded third each, the
/// controller replicas are killed or a second controller runs without election).
/// What it did, for the log.
pub async fn inject(
    fault: HaFault,
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let span = rng.millis(3000, 6000);
    let mut overlap_rng = Rng::new(rng.next_u64());
    let plane = ctx.plane;
    // Picked while the plane is whole (during the fault, reads may hang).
    let held = pick_for_overlap(ctx, procs, &mut overlap_rng).await;
    let operator = operator_grant(ctx, procs, 5).await;
    // The faults on one API server hit the operators' leader's: it wakes deposed
    // behind a server that lags, was cut from etcd or is gone.
    let near = operator.as_ref().and_then(|o| procs.server_of(&o.identity));
    let (infra, overlap) = tokio::join!(
        async {
            match fault {
                HaFault::KillEtcdLeader => kill_etcd_leader(plane, span).await,
                HaFault::PartitionEtcdMinority => partition_etcd(plane, false, span, rng).await,
                HaFault::PartitionEtcdLeader => partition_etcd(plane, true, span, rng).await,
                HaFault::LagApiserver => lag_apiserver(plane, span, near, rng).await,
                HaFault::KillApiserver => kill_apiserver(plane, span, near, rng).await,
                HaFault::CompactWhileBehind => compact_while_behind(plane, span, near, rng).await,
            }
        },
        overlap(ctx, procs, [held, operator], &mut overlap_rng),
    );
    // Whatever failed, the links are healed before the next fault.
    heal_links(plane).await?;
    Ok(Some(format!("{}; {overlap}", infra?)))
}

/// A grant to pause beside an HA fault, waiting out the moment between a release
/// and the next grant: a long holder's with writes ahead of it on a Lease with a
/// waiter, if one holds within two seconds (a holder past its last write wakes only
/// to release, and one whose Lease nobody waits for is never succeeded).
async fn pick_for_overlap(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    rng: &mut Rng,
) -> Option<HeldGrant> {
    let mut any = None;
    for _ in 0..10 {
        if let Some(held) = pick_grant(ctx, procs, rng).await {
            if held.contended
                && holds_long(&held.identity)
                && procs.writes_left(&held.identity, held.token) >= 3
            {
                return Some(held);
            }
            any.get_or_insert(held);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    any
}

/// The pauses of a holder and of the operators' leader (and maybe a controller
/// fault) that run beside each HA fault.
async fn overlap(
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    held: [Option<HeldGrant>; 2],
    rng: &mut Rng,
) -> String {
    let also = rng.range(0, 3);
    // 2.5 to 4 durations, and then until a newer grant is published (at most 15 s
    // more): a fault that stalls the plane also stalls the next grant, and a holder
    // that woke first would write with a token that is still the newest. It wakes
    // as soon as etcd has the newer grant, whether or not its API server (lagging,
    // maybe) or the new holder has seen it: the object's own token and each
    // server's sight of the Lease are what the fence promises (docs/fences.md, "Why
    // the policy is built this way").
    let lease = Duration::from_secs(LEASE_SECONDS).as_millis() as u64;
    let pause = rng.millis(lease * 5 / 2, lease * 4);
    let pausing: &Processes = procs;
    let one = |held: Option<HeldGrant>, within: Duration, none: &'static str| async move {
        match held {
            Some(held) => pause_past_grant(ctx, pausing, &held, pause, within).await,
            None => none.to_string(),
        }
    };
    let [held, operator] = held;
    // The operators' successor is waited for less: where the plane keeps it from
    // being granted, the holder's pause, not this one, should set the fault's length.
    let (paused, operator) = tokio::join!(
        one(held, MOVED_ON_WAIT, "no holder to pause"),
        one(
            operator,
            OPERATOR_MOVED_ON_WAIT,
            "no operator leader to pause"
        )
    );
    let more = match also {
        0 => format!(", {}", kill_controller(procs, rng).await),
        1 => format!(", {}", split_brain(ctx, procs, rng).await),
        _ => String::new(),
    };
    format!("{paused}, {operator}{more}")
}

/// How long a paused holder is kept paused, past its pause, for a newer grant.
pub const MOVED_ON_WAIT: Duration = Duration::from_secs(15);
/// The same for the operators' leader paused beside an HA fault.
const OPERATOR_MOVED_ON_WAIT: Duration = Duration::from_secs(5);

/// SIGSTOPs `held`'s worker for `pause` and then until a newer grant of its slot of
/// its Lease is published (at most `within` more), then SIGCONTs it: it wakes deposed.
/// What it did, for the log.
pub async fn pause_past_grant(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    held: &HeldGrant,
    pause: Duration,
    within: Duration,
) -> String {
    let pid = procs
        .worker_pid(&held.identity)
        .expect("picked among live workers");
    let stopped = Instant::now();
    signal(pid, libc::SIGSTOP);
    tokio::time::sleep(pause).await;
    let until = Instant::now() + within;
    let moved_on = lease_moved_on(ctx, held, within).await;
    let written = moved_on && newer_token_written(procs, held, until).await;
    signal(pid, libc::SIGCONT);
    format!(
        "paused {} ({}, token {}) for {} ms{}",
        held.identity,
        crate::history::slot_key(&held.lease, held.slot),
        held.token,
        stopped.elapsed().as_millis(),
        match (moved_on, written) {
            (true, true) => "",
            (true, false) => " (the new holder wrote nothing yet)",
            (false, _) => " (no newer grant was published)",
        }
    )
}

/// Waits (until `until`) for the file fence to have admitted a token above `held`'s
/// under its slot's fence key, so that the woken holder's next write meets a newer one:
/// where the plane slows the new holder's start (its API server cut off), a holder
/// woken at the grant alone would write first, be admitted, and show nothing. True at
/// once for a key the file fence never saw (the operators').
async fn newer_token_written(procs: &Processes, held: &HeldGrant, until: Instant) -> bool {
    let Ok(store) = palisade::fence::FileStore::open(procs.out.join("file-store")) else {
        return false;
    };
    let fence = palisade::fence::Fence::new(store);
    loop {
        match fence.highest(&held.fence_key) {
            Ok(None) => return true,
            Ok(Some(mark)) if mark > held.token => return true,
            _ if Instant::now() >= until => return false,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits (at most `within`) until `held`'s slot of its Lease has a newer grant, read
/// from etcd (a GET without resourceVersion): other slots' grants leave it holding.
/// False: none was published.
async fn lease_moved_on(ctx: &FaultContext<'_>, held: &HeldGrant, within: Duration) -> bool {
    let api: Api<Lease> = Api::namespaced(ctx.admin.clone(), held.namespace);
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(Ok(lease)) =
            tokio::time::timeout(Duration::from_secs(2), api.get(&held.lease)).await
            && let Some(status) = lease.status
            && let Some(row) = status.slot_rows().into_iter().find(|r| r.slot == held.slot)
            && row
                .fencing_token
                .is_some_and(|token| token as u64 > held.token)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Every link passes again and no etcd member refuses another.
pub async fn heal_links(plane: &ControlPlane) -> Result<(), String> {
    plane.links("mode * pass").await?;
    plane.links("refuse etcd-peer-* -").await?;
    Ok(())
}

/// The members' IDs (by index) and the leader's index, as the members see it.
async fn etcd_members(plane: &ControlPlane) -> Result<(Vec<u64>, Option<usize>), String> {
    let mut ids = Vec::new();
    let mut leader = 0;
    for i in 0..ETCD_MEMBERS {
        let status = plane.etcd_status(i).await?;
        ids.push(status.member_id);
        if status.leader != 0 {
            leader = status.leader;
        }
    }
    let leader_index = ids.iter().position(|id| *id == leader);
    Ok((ids, leader_index))
}

/// The leader's index, polled for a few seconds (after a fault, an election may
/// be under way).
async fn etcd_leader(plane: &ControlPlane) -> Result<(Vec<u64>, usize), String> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((ids, Some(leader))) = etcd_members(plane).await {
            return Ok((ids, leader));
        }
        if Instant::now() > until {
            return Err("etcd has no leader that every member reports".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// cluster.sh `kill` or `start` of one component (start waits until it is healthy).
async fn script(plane: &ControlPlane, verb: &'static str, component: String) -> Result<(), String> {
    let plane = plane.clone();
    tokio::task::spawn_blocking(move || plane.script(&[verb, &component]))
        .await
        .map_err(|e| e.to_string())?
}

/// `kill_etcd_leader`: SIGKILL the etcd leader; start it again after `span`.
async fn kill_etcd_leader(plane: &ControlPlane, span: Duration) -> Result<String, String> {
    let (_, leader) = etcd_leader(plane).await?;
    script(plane, "kill", format!("etcd-{leader}")).await?;
    tokio::time::sleep(span).await;
    let back = Instant::now();
    script(plane, "start", format!("etcd-{leader}")).await?;
    let (_, new_leader) = etcd_leader(plane).await?;
    Ok(format!(
        "etcd-{leader} killed for {} ms (back in {} ms), etcd-{new_leader} leads",
        span.as_millis(),
        back.elapsed().as_millis()
    ))
}

/// `partition_etcd_minority` (a follower) and `partition_etcd_leader`: one member
/// cut off from the two others, both ways, for `span`.
async fn partition_etcd(
    plane: &ControlPlane,
    the_leader: bool,
    span: Duration,
    rng: &mut Rng,
) -> Result<String, String> {
    let pick = rng.range(0, 2) as usize;
    let (ids, leader) = etcd_leader(plane).await?;
    let isolated = if the_leader {
        leader
    } else {
        (0..ETCD_MEMBERS)
            .filter(|i| *i != leader)
            .nth(pick)
            .expect("two followers")
    };
    let hex = |i: usize| format!("{:x}", ids[i]);
    let others: Vec<String> = (0..ETCD_MEMBERS)
        .filter(|i| *i != isolated)
        .map(hex)
        .collect();
    plane
        .links(&format!("refuse etcd-peer-{isolated} {}", others.join(",")))
        .await?;
    for i in (0..ETCD_MEMBERS).filter(|i| *i != isolated) {
        plane
            .links(&format!("refuse etcd-peer-{i} {}", hex(isolated)))
            .await?;
    }
    tokio::time::sleep(span).await;
    let during = etcd_leader(plane)
        .await
        .map(|(_, l)| format!("etcd-{l}"))
        .unwrap_or_else(|_| "no agreed leader".into());
    Ok(format!(
        "etcd-{isolated} ({}) cut off from the others for {} ms, {during} leading at the end",
        if isolated == leader {
            "the leader"
        } else {
            "a follower"
        },
        span.as_millis()
    ))
}

/// The API server a fault on one hits: `near` (the operators' leader's), else one
/// drawn at random (drawn either way, so the seed's later draws stay the same).
fn on_server(near: Option<usize>, rng: &mut Rng) -> u64 {
    let drawn = rng.range(0, HA_APISERVERS as u64);
    near.map_or(drawn, |j| j as u64)
}

/// `lag_apiserver`: one API server's links to every member get a latency of 1 to
/// 3 s, so its watch cache (and everything it serves) falls that far behind.
async fn lag_apiserver(
    plane: &ControlPlane,
    span: Duration,
    near: Option<usize>,
    rng: &mut Rng,
) -> Result<String, String> {
    let j = on_server(near, rng);
    let latency = rng.millis(1000, 3000);
    plane
        .links(&format!(
            "mode apiserver-{j}-etcd-* latency {}",
            latency.as_millis()
        ))
        .await?;
    tokio::time::sleep(span).await;
    plane
        .links(&format!("mode apiserver-{j}-etcd-* pass"))
        .await?;
    Ok(format!(
        "kube-apiserver-{j} {} ms behind etcd for {} ms",
        latency.as_millis(),
        span.as_millis()
    ))
}

/// `kill_apiserver`: SIGKILL one API server; its load balancer sends new
/// connections to the other until it is started again after `span`.
async fn kill_apiserver(
    plane: &ControlPlane,
    span: Duration,
    near: Option<usize>,
    rng: &mut Rng,
) -> Result<String, String> {
    let j = on_server(near, rng);
    script(plane, "kill", format!("kube-apiserver-{j}")).await?;
    tokio::time::sleep(span).await;
    let back = Instant::now();
    script(plane, "start", format!("kube-apiserver-{j}")).await?;
    Ok(format!(
        "kube-apiserver-{j} down for {} ms (ready {} ms after its start)",
        span.as_millis(),
        back.elapsed().as_millis()
    ))
}

/// `compact_while_behind`: one API server loses its etcd links (its watch cache
/// stops where it was), etcd is compacted up to its newest revision, and the links
/// come back: the server's cache cannot resume its etcd watch, relists, and ends its
/// watchers, who resume from versions it no longer has (410 Gone) and relist.
async fn compact_while_behind(
    plane: &ControlPlane,
    span: Duration,
    near: Option<usize>,
    rng: &mut Rng,
) -> Result<String, String> {
    let j = on_server(near, rng);
    plane
        .links(&format!("mode apiserver-{j}-etcd-* cut"))
        .await?;
    // Writes go on through the other server meanwhile.
    tokio::time::sleep(span / 2).await;
    let mut compacted = None;
    for i in 0..ETCD_MEMBERS {
        if let Ok(status) = plane.etcd_status(i).await {
            plane.compact(i, status.revision).await?;
            compacted = Some(status.revision);
            break;
        }
    }
    let revision = compacted.ok_or("no etcd member answered to be compacted")?;
    tokio::time::sleep(span / 2).await;
    plane
        .links(&format!("mode apiserver-{j}-etcd-* pass"))
        .await?;
    Ok(format!(
        "kube-apiserver-{j} cut from etcd for {} ms, etcd compacted at revision {revision} meanwhile",
        span.as_millis()
    ))
}
