//! Part 2: the failover gap when the leading replica's API server dies. Two elected
//! replicas: the leader through lb-0 (which prefers kube-apiserver-0), the standby
//! through lb-1 (which prefers kube-apiserver-1); the holder and the waiter through
//! lb-1. Each round: SIGKILL kube-apiserver-0, the holder releases as soon as its
//! process is gone, and the gap runs from the start of the kill to the waiter's
//! acquire returning. Then kube-apiserver-0 is started again and a fresh pair set up
//! (the lb-0 replica first, leading, then the lb-1 one), so every round starts alike.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease as ElectionLease;
use kube::api::Api;
use palisade::client::LeaseClient;

use crate::handover::{acquire, granted, spawn_waiter, wait_queued};
use crate::plane::Plane;
use crate::replicas::{Pair, Record, record};

/// The Lease of this part.
const LEASE: &str = "failover";
/// The longest the waiter waits for its grant after the kill.
const WAITER_LIMIT: Duration = Duration::from_secs(60);
/// When, after the kill, the election record is read for who leads: past the time a
/// leader that cannot renew steps down (renew deadline 750 ms) and the standby takes
/// over (lease duration 1 s and a retry period of 250 ms after that).
pub const SETTLE: Duration = Duration::from_secs(3);
/// What the controller logs when it steps down (src/cli/controller.rs).
const STEPPED_DOWN: &str = "lost leadership";

/// One round's figures.
pub struct Round {
    /// From the start of `cluster.sh kill kube-apiserver-0` to the waiter's grant, ms.
    pub gap_ms: f64,
    /// From the start of the kill to the API server's process gone, ms.
    pub exit_ms: f64,
    /// Which replica the election record named when the waiter had its grant.
    pub leader_at_grant: String,
    /// Which replica it named [`SETTLE`] after the kill.
    pub leader_after: String,
    /// How often the record changed hands in between.
    pub transitions: i32,
    /// How often the lb-0 replica logged that it stepped down.
    pub stepped_down: usize,
}

pub async fn run(plane: &Plane, ns: &str, kills: usize) -> Result<Vec<Round>, String> {
    let mut rounds = Vec::new();
    if kills == 0 {
        return Ok(rounds);
    }
    let client = plane.client("kubeconfig-lb-1").await?;
    let lb1 = LeaseClient::new(client.clone(), ns);
    let elections: Api<ElectionLease> = Api::namespaced(client, ns);
    lb1.ensure_lease(LEASE, 15)
        .await
        .map_err(|e| format!("creating Lease {LEASE}: {e}"))?;
    for k in 0..kills {
        let pair = Pair::start(plane, ns, &elections, k).await?;
        let round = one_round(plane, &lb1, &elections, &pair, k).await;
        pair.stop().await;
        let round = round?;
        eprintln!(
            "ha: failover {}/{kills}: {:.0} ms (the API server gone after {:.0} ms); leader at the grant: {}, \
             {} s after the kill: {} (record changed hands {} times; the lb-0 replica stepped down {} times)",
            k + 1,
            round.gap_ms,
            round.exit_ms,
            round.leader_at_grant,
            SETTLE.as_secs(),
            round.leader_after,
            round.transitions,
            round.stepped_down,
        );
        rounds.push(round);
        plane.script(&["start", "kube-apiserver-0"], false).await?;
    }
    Ok(rounds)
}

async fn one_round(
    plane: &Plane,
    lb1: &LeaseClient,
    elections: &Api<ElectionLease>,
    pair: &Pair,
    k: usize,
) -> Result<Round, String> {
    let holder = acquire(lb1, LEASE, &format!("holder-{k}")).await?;
    let waiter = spawn_waiter(lb1, LEASE, &format!("waiter-{k}"), WAITER_LIMIT);
    wait_queued(lb1, LEASE, holder.identity()).await?;
    let before = record(elections).await?;
    if before.holder != pair.leader.identity {
        return Err(format!(
            "round {k}: the election record names {:?}, not the lb-0 replica {}",
            before.holder, pair.leader.identity
        ));
    }
    let killed = Instant::now();
    let after_kill = async {
        holder
            .release()
            .await
            .map_err(|e| format!("releasing {LEASE}: {e}"))?;
        let (grant, at) = granted(waiter).await?;
        Ok::<_, String>((grant, at, record(elections).await?))
    };
    let (exit, after_kill) = plane.kill_apiserver(0, after_kill).await?;
    let (grant, at, at_grant) = after_kill?;
    tokio::time::sleep_until((killed + SETTLE).into()).await;
    let settled: Record = record(elections).await?;
    grant
        .release()
        .await
        .map_err(|e| format!("releasing {LEASE} after the failover: {e}"))?;
    Ok(Round {
        gap_ms: at.duration_since(killed).as_secs_f64() * 1e3,
        exit_ms: exit.as_secs_f64() * 1e3,
        leader_at_grant: pair.side(&at_grant.holder),
        leader_after: pair.side(&settled.holder),
        transitions: settled.transitions - before.transitions,
        stepped_down: pair.leader.log_count(STEPPED_DOWN),
    })
}
