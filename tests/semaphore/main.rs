//! Semaphores (`spec.permits` above 1) from the client side, against the real API
//! server and a real controller: grants in distinct slots, each with a token of its
//! own that the Lease publishes in that slot; a waiter granted the slot a release
//! freed, with a higher token than that slot had; a claim for one slot
//! (`AcquireOptions::slot`); `palisade lock --permits/--slot` (`lock`). `palisade
//! fence --slot` needs no cluster (`fence`: `cargo test --test semaphore fence::`).

use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};
use palisade::crd::{Lease, LeaseSpec};
use support::{ControllerProcess, TestNamespace, WAIT, wait_lease};
use tokio::time::timeout;

mod fence;
mod lock;

async fn setup(prefix: &str) -> (TestNamespace, ControllerProcess, LeaseClient) {
    support::install_crds().await;
    let ns = TestNamespace::new(prefix).await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let leases = LeaseClient::new(ns.client.clone(), &ns.name);
    (ns, controller, leases)
}

/// A semaphore of `permits`, with a duration long enough that no grant expires
/// while a test looks at it.
async fn semaphore(leases: &LeaseClient, name: &str, permits: i32) {
    let spec = LeaseSpec {
        lease_duration_seconds: 60,
        permits,
    };
    assert!(
        leases.ensure_lease_with(name, spec).await.unwrap(),
        "{name} is new"
    );
}

/// Not bound to a pod, whatever the environment of the test runner says.
fn options(identity: &str, slot: Option<i32>) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod: PodBinding::None,
        timeout: None,
        slot,
    }
}

async fn acquire(leases: &LeaseClient, lease: &str, options: AcquireOptions) -> Grant {
    let identity = options.identity.clone().unwrap_or_default();
    timeout(WAIT, leases.acquire(lease, options))
        .await
        .unwrap_or_else(|_| panic!("{identity}: lease {lease} not granted within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{identity}: acquiring lease {lease}: {e}"))
}

/// An acquire in a task of its own, for a claim that has to wait.
fn acquire_later(
    leases: &LeaseClient,
    lease: &str,
    options: AcquireOptions,
) -> tokio::task::JoinHandle<Grant> {
    let (leases, lease) = (leases.clone(), lease.to_string());
    tokio::spawn(async move { acquire(&leases, &lease, options).await })
}

async fn waiting(ns: &TestNamespace, lease: &str, count: i64) -> Lease {
    wait_lease(ns, lease, &format!("{count} waiting"), |l| {
        l.status.as_ref().and_then(|s| s.waiting_count) == Some(count)
    })
    .await
}

/// The grant is what the Lease publishes: its claim in its slot, with its token, and
/// its fence key is that slot's.
fn assert_published(lease: &Lease, namespace: &str, grant: &Grant) {
    let status = lease.status.as_ref().expect("a status");
    let published = status
        .grant_of(grant.claim_uid())
        .unwrap_or_else(|| panic!("{} in no slot: {status:?}", grant.claim_name()));
    assert_eq!(
        (published.slot, published.token),
        (grant.slot(), Some(grant.token())),
        "{status:?}"
    );
    let key = palisade::permits::fence_key(
        namespace,
        lease.metadata.name.as_ref().unwrap(),
        grant.slot(),
    );
    assert_eq!(grant.fence_key(), key);
}

#[tokio::test]
async fn three_permits_grant_three_slots_and_a_fourth_claim_gets_the_slot_freed() {
    let (ns, _controller, leases) = setup("sem-slots").await;
    semaphore(&leases, "pool", 3).await;
    let mut grants = Vec::new();
    for identity in ["a", "b", "c"] {
        grants.push(acquire(&leases, "pool", options(identity, None)).await);
    }
    let mut slots: Vec<i32> = grants.iter().map(Grant::slot).collect();
    slots.sort();
    assert_eq!(slots, [0, 1, 2], "one slot each");
    let lease = ns.api::<Lease>().get("pool").await.unwrap();
    for grant in &grants {
        assert_published(&lease, &ns.name, grant);
    }
    let held = lease.status.as_ref().and_then(|s| s.held.clone());
    assert_eq!(held.as_deref(), Some("3/3"));

    let fourth = acquire_later(&leases, "pool", options("d", None));
    waiting(&ns, "pool", 1).await;
    assert!(!fourth.is_finished(), "granted with every slot held");

    let freed = grants.remove(grants.iter().position(|g| g.slot() == 1).unwrap());
    let freed_token = freed.token();
    freed.release().await.unwrap();
    let fourth = timeout(WAIT, fourth)
        .await
        .expect("granted in time")
        .unwrap();
    assert_eq!(fourth.slot(), 1, "the slot freed");
    assert!(
        fourth.token() > freed_token,
        "slot 1's token {} after {freed_token}",
        fourth.token()
    );
    let lease = ns.api::<Lease>().get("pool").await.unwrap();
    assert_published(&lease, &ns.name, &fourth);
    for grant in &grants {
        assert!(grant.is_held(), "slot {} still held", grant.slot());
        assert_published(&lease, &ns.name, grant);
    }
    fourth.release().await.unwrap();
    for grant in grants {
        grant.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_claim_for_one_slot_gets_that_slot_and_waits_for_it_alone() {
    let (ns, _controller, leases) = setup("sem-one-slot").await;
    semaphore(&leases, "shards", 3).await;
    // Slot 0 is free, and the lowest: a claim for slot 1 gets slot 1 all the same.
    let first = acquire(&leases, "shards", options("shard-1", Some(1))).await;
    assert_eq!(first.slot(), 1);
    assert_eq!(first.fence_key(), format!("{}/shards#1", ns.name));
    let lease = ns.api::<Lease>().get("shards").await.unwrap();
    assert_published(&lease, &ns.name, &first);
    assert!(
        lease.status.as_ref().unwrap().holder.is_none(),
        "slot 0 stays free"
    );

    // Another claim for slot 1 waits, though slots 0 and 2 are free.
    let second = acquire_later(&leases, "shards", options("shard-1-again", Some(1)));
    waiting(&ns, "shards", 1).await;
    assert!(!second.is_finished(), "granted while slot 1 was held");
    let first_token = first.token();
    first.release().await.unwrap();
    let second = timeout(WAIT, second)
        .await
        .expect("granted in time")
        .unwrap();
    assert_eq!(second.slot(), 1);
    assert!(second.token() > first_token);
    second.release().await.unwrap();
}

/// A lock is slot 0, under the key fences have always used.
#[tokio::test]
async fn a_lock_is_slot_zero_under_its_usual_key() {
    let (ns, _controller, leases) = setup("sem-lock").await;
    leases.ensure_lease("plain", 60).await.unwrap();
    let grant = acquire(&leases, "plain", options("only", None)).await;
    assert_eq!(grant.slot(), 0);
    assert_eq!(grant.fence_key(), format!("{}/plain", ns.name));
    let lease = ns.api::<Lease>().get("plain").await.unwrap();
    assert_published(&lease, &ns.name, &grant);
    let status = lease.status.unwrap();
    assert!(
        status.slots.is_empty() && status.held.is_none(),
        "{status:?}"
    );
    grant.release().await.unwrap();
}
