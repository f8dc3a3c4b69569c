//! The storm's library waiters: one `LeaseClient::acquire` per Lease, all in this
//! process on one `LeaseClient::from_config`, as the agent serves all its callers on
//! one, so a re-grant counts when `acquire` returns (the head waiter's early write or
//! its confirming write included).

use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;

/// The waiters' identity: their claims are named `<lease>-lib-<random>`.
const IDENTITY: &str = "lib";

/// The running acquires; dropping this releases every grant (their claims deleted).
pub(crate) struct LibraryWaiters {
    client: LeaseClient,
    pub(crate) acquired: UnboundedReceiver<Result<(usize, Instant), String>>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl LibraryWaiters {
    /// Starts one acquire per Lease (no controller running) and returns once all their
    /// claims exist (at most 60 s + 20 ms per Lease).
    pub(crate) async fn start(s: &Size<'_>) -> Result<Self> {
        let kubeconfig = s.root.join("target/cluster/kubeconfig");
        let kc = Kubeconfig::read_from(&kubeconfig)?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        let client = LeaseClient::from_config(config, Some(s.ns))?;
        let before = count_objects(&s.claims).await?;
        let (tx, acquired) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..s.n {
            let (client, tx, stop) = (client.clone(), tx.clone(), stop.clone());
            tasks.spawn(async move {
                let options = AcquireOptions {
                    identity: Some(IDENTITY.into()),
                    pod: PodBinding::None,
                    timeout: None,
                    slot: None,
                };
                let lease = lease_name(i);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = client.acquire(&lease, options) => match r {
                        Ok(grant) => {
                            let _ = tx.send(Ok((i, Instant::now())));
                            stop.cancelled().await;
                            drop(grant);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(format!("{lease}: {e}")));
                        }
                    },
                }
            });
        }
        let waiters = Self {
            client,
            acquired,
            stop,
            tasks,
        };
        let until =
            Instant::now() + Duration::from_secs(60) + Duration::from_millis(20 * s.n as u64);
        loop {
            let now = count_objects(&s.claims).await?;
            if now >= before + s.n {
                return Ok(waiters);
            }
            if Instant::now() > until.min(s.deadline) {
                bail!(
                    "{} of {} library waiters' claims created in time",
                    now - before.min(now),
                    s.n
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Releases every grant and waits (at most 30 s) for the claims' deletions.
    pub(crate) async fn release(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        if !self.client.flush(Duration::from_secs(30)).await {
            eprintln!("scale: storm: the library waiters' claims were not all deleted in 30 s");
        }
    }
}

/// Whether `claim` is a library waiter's claim on `lease`.
pub(crate) fn is_library_claim(lease: &str, claim: &str) -> bool {
    claim.starts_with(&format!("{lease}-{IDENTITY}-"))
}
