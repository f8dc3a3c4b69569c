//! One `LeaseClient` shared by many waiters, as the agent shares its own among its
//! sessions: every waiter's watches and writes go over the same connections.

use std::time::Duration;

use futures::future::join_all;
use kube::api::PostParams;
use palisade::client::LeaseClient;
use palisade::crd::{Lease, LeaseClaim};
use support::WAIT;
use tokio::time::timeout;

use crate::{holder_uid, options, setup};

/// Waiters on one client of its own connections (PINGed HTTP/2: all of them on one
/// connection), each first in the queue of its own Lease behind a holder that falls
/// silent: all their holders expire at about the same time and every waiter must get
/// and confirm its grant, however many watches the others hold open.
#[tokio::test]
async fn many_waiters_on_one_client_all_get_their_grants() {
    const LEASES: usize = 100;
    let (ns, _controller, admin) = setup("client-shared").await;
    let shared = LeaseClient::from_config(support::admin_config().await, Some(&ns.name)).unwrap();
    let claims = ns.api::<LeaseClaim>();
    for i in 0..LEASES {
        admin.ensure_lease(&format!("s{i}"), 6).await.unwrap();
        let silent: LeaseClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("silent-{i}")},
            "spec": {"leaseName": format!("s{i}"), "holderIdentity": "silent"}
        }))
        .unwrap();
        claims
            .create(&PostParams::default(), &silent)
            .await
            .unwrap();
    }
    let leases = ns.api::<Lease>();
    timeout(WAIT, async {
        for i in 0..LEASES {
            while leases
                .get(&format!("s{i}"))
                .await
                .ok()
                .as_ref()
                .and_then(holder_uid)
                .is_none()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
    .await
    .expect("the silent claims were granted");
    let acquires = (0..LEASES).map(|i| {
        let shared = shared.clone();
        async move {
            timeout(
                Duration::from_secs(30),
                shared.acquire(&format!("s{i}"), options(&format!("w{i}"))),
            )
            .await
        }
    });
    let results = join_all(acquires).await;
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("s{i}: {e}")),
            Err(_) => Some(format!("s{i}: not granted within 30 s")),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {LEASES} failed: {failed:?}",
        failed.len()
    );
}
