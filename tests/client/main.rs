//! The client library (`palisade::client`) against the real API server and a real
//! controller: acquire, token, renewal, release, loss, cancellation.

use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};
use palisade::crd::Lease;
use support::proxy::Proxy;
use support::{ControllerProcess, TestNamespace, WAIT};
use tokio::time::timeout;

mod connections;
mod deadlines;
mod early;
mod lifecycle;
mod shared;

async fn setup(prefix: &str) -> (TestNamespace, ControllerProcess, LeaseClient) {
    support::install_crds().await;
    let ns = TestNamespace::new(prefix).await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let leases = LeaseClient::new(ns.client.clone(), &ns.name);
    (ns, controller, leases)
}

/// Explicitly not bound to a pod, whatever the environment of the test runner says.
fn options(identity: &str) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod: PodBinding::None,
        timeout: None,
        slot: None,
    }
}

async fn acquire(leases: &LeaseClient, lease: &str, identity: &str) -> Grant {
    timeout(WAIT, leases.acquire(lease, options(identity)))
        .await
        .unwrap_or_else(|_| panic!("{identity}: lease {lease} not granted within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{identity}: acquiring lease {lease}: {e}"))
}

/// A client whose connections go through a proxy that can make them die silently:
/// its own (HTTP/2, PINGed), as `LeaseClient::try_default` and the agent make them.
async fn proxied(ns: &TestNamespace) -> (LeaseClient, Proxy) {
    let (config, proxy) = support::proxied_config(&ns.name).await;
    let leases = LeaseClient::from_config(config, Some(&ns.name)).unwrap();
    (leases, proxy)
}

/// [`proxied`] on kube's own client, whose connections nobody health-checks.
async fn proxied_unchecked(ns: &TestNamespace) -> (LeaseClient, Proxy) {
    let (config, proxy) = support::proxied_config(&ns.name).await;
    let leases = LeaseClient::new(kube::Client::try_from(config).unwrap(), &ns.name);
    (leases, proxy)
}

fn holder_uid(lease: &Lease) -> Option<String> {
    lease
        .status
        .as_ref()?
        .holder
        .as_ref()
        .map(|h| h.claim_uid.clone())
}

fn lease_token(lease: &Lease) -> Option<i64> {
    lease.status.as_ref()?.fencing_token
}
