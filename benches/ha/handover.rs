//! Part 1: release handovers across the two API servers. One controller without
//! election on kube-apiserver-0; clients straight to one server each. The handovers
//! alternate: a holder on kube-apiserver-0 hands over to a waiter on
//! kube-apiserver-1 (the measurement asked for), who then hands back to a waiter on
//! kube-apiserver-0 (a second figure, at no extra cost).

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};

use crate::plane::Plane;
use crate::replicas::Controller;

/// The Lease of this part (15 s duration: no renewal races a handover).
const LEASE: &str = "cross";
/// The longest one acquire may take (the first waits for the controller's caches).
pub const ACQUIRE_LIMIT: Duration = Duration::from_secs(60);

/// Release-to-grant times, in ms: holder on kube-apiserver-0 (the controller's) to
/// waiter on kube-apiserver-1, and back.
pub struct Handovers {
    pub to_other: Vec<f64>,
    pub back: Vec<f64>,
}

pub async fn run(plane: &Plane, ns: &str, rounds: usize) -> Result<Handovers, String> {
    let mut out = Handovers {
        to_other: Vec::new(),
        back: Vec::new(),
    };
    if rounds == 0 {
        return Ok(out);
    }
    let on = [
        LeaseClient::new(plane.client("kubeconfig-apiserver-0").await?, ns),
        LeaseClient::new(plane.client("kubeconfig-apiserver-1").await?, ns),
    ];
    let controller =
        Controller::start(plane, &plane.kubeconfig("kubeconfig-apiserver-0"), ns, None)?;
    let result = async {
        on[0]
            .ensure_lease(LEASE, 15)
            .await
            .map_err(|e| format!("creating Lease {LEASE}: {e}"))?;
        let mut holder = acquire(&on[0], LEASE, "h0").await?;
        for i in 0..2 * rounds {
            // Even: 0 -> 1; odd: 1 -> 0.
            let waiter = &on[(i + 1) % 2];
            let (grant, ms) = handover(holder, waiter, LEASE, &format!("h{}", i + 1)).await?;
            holder = grant;
            if i % 2 == 0 {
                out.to_other.push(ms);
            } else {
                out.back.push(ms);
            }
        }
        holder
            .release()
            .await
            .map_err(|e| format!("releasing the last grant: {e}"))
    }
    .await;
    controller.stop().await;
    result.map(|()| out)
}

pub fn options(identity: &str, limit: Duration) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod: PodBinding::None,
        timeout: Some(limit),
        slot: None,
    }
}

pub async fn acquire(client: &LeaseClient, lease: &str, identity: &str) -> Result<Grant, String> {
    client
        .acquire(lease, options(identity, ACQUIRE_LIMIT))
        .await
        .map_err(|e| format!("{identity} acquiring {lease}: {e}"))
}

/// A waiter's acquire on its own task: the grant and the instant `acquire` returned.
pub type Waiter = tokio::task::JoinHandle<(Result<Grant, String>, Instant)>;

pub fn spawn_waiter(client: &LeaseClient, lease: &str, identity: &str, limit: Duration) -> Waiter {
    let (client, lease, identity) = (client.clone(), lease.to_string(), identity.to_string());
    tokio::spawn(async move {
        let grant = client
            .acquire(&lease, options(&identity, limit))
            .await
            .map_err(|e| format!("{identity} acquiring {lease}: {e}"));
        (grant, Instant::now())
    })
}

/// The waiter's grant and when it came (bounded by the acquire's own timeout).
pub async fn granted(waiter: Waiter) -> Result<(Grant, Instant), String> {
    let (grant, at) = waiter
        .await
        .map_err(|e| format!("the waiter's task: {e}"))?;
    Ok((grant?, at))
}

/// `holder` releases once a waiter through `waiter` is queued: the waiter's grant
/// and the time from the release call to its acquire returning, in ms.
async fn handover(
    holder: Grant,
    waiter: &LeaseClient,
    lease: &str,
    identity: &str,
) -> Result<(Grant, f64), String> {
    let task = spawn_waiter(waiter, lease, identity, ACQUIRE_LIMIT);
    wait_queued(waiter, lease, holder.identity()).await?;
    let let_go = Instant::now();
    holder
        .release()
        .await
        .map_err(|e| format!("releasing {lease}: {e}"))?;
    let (grant, at) = granted(task).await?;
    Ok((grant, at.duration_since(let_go).as_secs_f64() * 1e3))
}

/// Waits (at most [`ACQUIRE_LIMIT`]) until the Lease, as `client`'s API server shows
/// it, is held by `holder` with one claim waiting: the controller has queued the
/// waiter. (The holder is checked too, so that a stale state from before the last
/// handover, still in that server's watch cache, does not pass.)
pub async fn wait_queued(client: &LeaseClient, lease: &str, holder: &str) -> Result<(), String> {
    let mut stream = watcher::watch_object(client.leases().clone(), lease)
        .default_backoff()
        .boxed();
    let queued = tokio::time::timeout(ACQUIRE_LIMIT, async {
        while let Some(event) = stream.next().await {
            let Ok(Some(l)) = event else { continue };
            let status = l.status.unwrap_or_default();
            let held_by = status.holder.map(|h| h.identity).unwrap_or_default();
            if held_by == holder && status.waiting_count == Some(1) {
                return true;
            }
        }
        false
    })
    .await;
    match queued {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("the watch on Lease {lease} ended")),
        Err(_) => Err(format!(
            "Lease {lease} did not show {holder} holding with one claim waiting within {ACQUIRE_LIMIT:?}"
        )),
    }
}
