//! The faults that hit the operator workers' leader (operator_worker.rs): its own
//! pause (`pause_operator`), and finding it for the storm and for the HA faults'
//! pauses (ha.rs).

use std::time::Duration;

use kube::api::Api;
use palisade::crd::Lease;

use crate::cluster::LEASE_SECONDS;
use crate::faults::{FaultContext, HeldGrant};
use crate::ha::{MOVED_ON_WAIT, pause_past_grant};
use crate::operator_worker::{OPERATOR_LEASE, OPERATOR_NAMESPACE};
use crate::processes::Processes;
use crate::rng::Rng;

/// The grant of the operators' Lease, if one of our live operator workers holds it,
/// asked up to `tries` times 100 ms apart: between two terms no one leads for a moment.
pub async fn operator_grant(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    tries: usize,
) -> Option<HeldGrant> {
    let api: Api<Lease> = Api::namespaced(ctx.admin.clone(), OPERATOR_NAMESPACE);
    for _ in 0..tries {
        // Bounded: behind a partitioned etcd member a read can hang for long.
        if let Ok(Ok(lease)) =
            tokio::time::timeout(Duration::from_secs(2), api.get(OPERATOR_LEASE)).await
            && let Some(status) = lease.status
            && let Some(holder) = status.holder.clone()
            && procs.worker_pid(&holder.identity).is_some()
        {
            return Some(HeldGrant {
                identity: holder.identity,
                namespace: OPERATOR_NAMESPACE,
                lease: OPERATOR_LEASE.into(),
                slot: 0,
                fence_key: palisade::permits::fence_key(OPERATOR_NAMESPACE, OPERATOR_LEASE, 0),
                claim_uid: holder.claim_uid,
                token: status.fencing_token.unwrap_or(0) as u64,
                contended: crate::faults::has_waiter(&status),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// `pause_operator`: SIGSTOP the operators' leader past its lease (1.25 to 2.5
/// durations) and on until its successor's grant is published, then SIGCONT. It wakes
/// deposed, with a round of writes maybe under way and one more to make with its old
/// token: none of them may land after its successor's first write.
pub async fn pause_operator(
    ctx: &FaultContext<'_>,
    procs: &Processes,
    rng: &mut Rng,
) -> Option<String> {
    let lease = Duration::from_secs(LEASE_SECONDS).as_millis() as u64;
    let pause = rng.millis(lease * 5 / 4, lease * 5 / 2);
    let held = operator_grant(ctx, procs, 15).await?;
    Some(pause_past_grant(ctx, procs, &held, pause, MOVED_ON_WAIT).await)
}
