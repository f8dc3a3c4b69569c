//! The faults of the replicated control plane (`--ha`): an etcd leader killed, a
//! member or the leader partitioned from the others, one API server's etcd link
//! slowed until its watch cache falls seconds behind, an API server killed (its
//! clients fail over through their load balancer), and a compaction while one API
//! server's cache is behind (its watchers are ended and resume from versions it no
//! longer has: 410 Gone, relists). Each overlaps with a holder pause (so a stale
//! write follows every kind) and, by the seed, a controller kill or a split brain.

use std::time::{Duration, Instant};

use kube::api::Api;
use palisade::crd::Lease;

use crate::cluster::{ControlPlane, ETCD_MEMBERS, HA_APISERVERS, LEASE_SECONDS, NAMESPACE};
use crate::faults::{FaultContext, HeldGrant, kill_controller, pick_grant, split_brain};
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

/// Injects `fault` on the control plane while a holder, picked just before, is
/// paused past its lease from the same moment (and, for a seeded third each, the
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
    let (infra, overlap) = tokio::join!(
        async {
            match fault {
                HaFault::KillEtcdLeader => kill_etcd_leader(plane, span).await,
                HaFault::PartitionEtcdMinority => partition_etcd(plane, false, span, rng).await,
                HaFault::PartitionEtcdLeader => partition_etcd(plane, true, span, rng).await,
                HaFault::LagApiserver => lag_apiserver(plane, span, rng).await,
                HaFault::KillApiserver => kill_apiserver(plane, span, rng).await,
                HaFault::CompactWhileBehind => compact_while_behind(plane, span, rng).await,
            }
        },
        overlap(ctx, procs, held, &mut overlap_rng),
    );
    // Whatever failed, the links are healed before the next fault.
    heal_links(plane).await?;
    Ok(Some(format!("{}; {overlap}", infra?)))
}

/// A grant to pause beside an HA fault, waiting out the moment between a release
/// and the next grant: a long holder's with writes ahead of it, if one holds within
/// two seconds (a holder past its last write wakes only to release).
async fn pick_for_overlap(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    rng: &mut Rng,
) -> Option<HeldGrant> {
    let mut any = None;
    for _ in 0..10 {
        if let Some(held) = pick_grant(ctx, procs, rng).await {
            if holds_long(&held.identity) && procs.writes_left(&held.identity, held.token) >= 3 {
                return Some(held);
            }
            any.get_or_insert(held);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    any
}

/// The holder pause (and maybe a controller fault) that runs beside each HA fault.
async fn overlap(
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    held: Option<HeldGrant>,
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
    let paused = match held {
        Some(held) => {
            let pid = procs
                .worker_pid(&held.identity)
                .expect("picked among live workers");
            let stopped = Instant::now();
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(pause).await;
            let moved_on = lease_moved_on(ctx, &held).await;
            signal(pid, libc::SIGCONT);
            format!(
                "paused {} for {} ms{}",
                held.identity,
                stopped.elapsed().as_millis(),
                if moved_on {
                    ""
                } else {
                    " (no newer grant was published)"
                }
            )
        }
        None => "no holder to pause".into(),
    };
    let more = match also {
        0 => format!(", {}", kill_controller(procs, rng).await),
        1 => format!(", {}", split_brain(ctx, procs, rng).await),
        _ => String::new(),
    };
    format!("{paused}{more}")
}

/// Waits (at most 15 s) until `held`'s Lease has a newer grant, read from etcd (a
/// GET without resourceVersion). False: none was published.
async fn lease_moved_on(ctx: &FaultContext<'_>, held: &HeldGrant) -> bool {
    let api: Api<Lease> = Api::namespaced(ctx.admin.clone(), NAMESPACE);
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if let Ok(Ok(lease)) =
            tokio::time::timeout(Duration::from_secs(2), api.get(&held.lease)).await
            && let Some(token) = lease.status.and_then(|s| s.fencing_token)
            && token as u64 > held.token
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

/// `lag_apiserver`: one API server's links to every member get a latency of 1 to
/// 3 s, so its watch cache (and everything it serves) falls that far behind.
async fn lag_apiserver(
    plane: &ControlPlane,
    span: Duration,
    rng: &mut Rng,
) -> Result<String, String> {
    let j = rng.range(0, HA_APISERVERS as u64);
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
    rng: &mut Rng,
) -> Result<String, String> {
    let j = rng.range(0, HA_APISERVERS as u64);
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
    rng: &mut Rng,
) -> Result<String, String> {
    let j = rng.range(0, HA_APISERVERS as u64);
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
