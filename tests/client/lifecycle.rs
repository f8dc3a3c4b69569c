//! A grant's life: acquire, token, renewal, release, loss, cancellation.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use palisade::client::{AcquireOptions, Error, LostReason, PodBinding};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim, LeasePhase, RENEWED_TOKEN_ANNOTATION};
use support::{WAIT, claim_names, wait_for};
use tokio::time::timeout;

use crate::{acquire, holder_uid, lease_token, options, setup};

#[tokio::test]
async fn acquire_returns_the_leases_token_and_release_frees_it() {
    let (ns, _controller, leases) = setup("client-acquire").await;
    assert!(leases.ensure_lease("db", 15).await.unwrap(), "created");
    assert!(
        !leases.ensure_lease("db", 30).await.unwrap(),
        "already exists"
    );
    let lease = ns.api::<Lease>().get("db").await.unwrap();
    assert_eq!(
        lease.spec.lease_duration_seconds, 15,
        "an existing Lease is left alone"
    );

    let grant = acquire(&leases, "db", "app-1").await;
    let lease = ns.api::<Lease>().get("db").await.unwrap();
    assert_eq!(holder_uid(&lease).as_deref(), Some(grant.claim_uid()));
    assert_eq!(lease_token(&lease), Some(grant.token()));
    assert!(grant.token() > 0);
    let holder = lease.status.unwrap().holder.unwrap();
    assert_eq!(holder.identity, "app-1");
    assert_eq!(grant.identity(), "app-1");
    assert_eq!(grant.lease(), "db");
    assert_eq!(holder.claim, grant.claim_name());
    let suffix = grant
        .claim_name()
        .strip_prefix("db-app-1-")
        .unwrap_or_else(|| panic!("claim name {}", grant.claim_name()));
    assert_eq!(suffix.len(), 5, "a short random suffix: {suffix}");

    let claim = ns
        .api::<LeaseClaim>()
        .get(grant.claim_name())
        .await
        .unwrap();
    assert_eq!(claim.spec.lease_name, "db");
    assert_eq!(claim.spec.holder_identity, "app-1");
    assert!(claim.spec.pod.is_none() && claim.metadata.owner_references.is_none());
    assert_eq!(grant.lost_reason(), None);

    let name = grant.claim_name().to_string();
    grant.release().await.unwrap();
    assert!(
        ns.api::<LeaseClaim>()
            .get_opt(&name)
            .await
            .unwrap()
            .is_none(),
        "release returns after the claim is deleted"
    );
    wait_for(ns.api::<Lease>(), "db", "Free", |l| {
        l.and_then(|l| l.status.as_ref()?.phase) == Some(LeasePhase::Free)
    })
    .await;
}

#[tokio::test]
async fn a_waiter_is_granted_after_the_holder_releases_with_a_higher_token() {
    let (ns, _controller, leases) = setup("client-turns").await;
    leases.ensure_lease("turns", 15).await.unwrap();
    let first = acquire(&leases, "turns", "first").await;

    let second = tokio::spawn({
        let leases = leases.clone();
        async move { acquire(&leases, "turns", "second").await }
    });
    wait_for(ns.api::<Lease>(), "turns", "a waiter", |l| {
        l.and_then(|l| l.status.as_ref()?.waiting_count) == Some(1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "granted while the first one holds");

    let first_token = first.token();
    first.release().await.unwrap();
    let second = timeout(WAIT, second).await.unwrap().unwrap();
    assert!(
        second.token() > first_token,
        "token {} after {first_token}",
        second.token()
    );
    let lease = ns.api::<Lease>().get("turns").await.unwrap();
    assert_eq!(holder_uid(&lease).as_deref(), Some(second.claim_uid()));
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_renewing_holder_keeps_a_short_lease_for_several_durations() {
    let (ns, controller, leases) = setup("client-renew").await;
    leases.ensure_lease("short", 2).await.unwrap();
    let grant = acquire(&leases, "short", "renewer").await;

    // 3 durations: without renewals the controller would have expired it twice over.
    let held = timeout(Duration::from_secs(6), grant.lost()).await;
    assert!(held.is_err(), "lost while renewing: {:?}", held.unwrap());
    let lease = ns.api::<Lease>().get("short").await.unwrap();
    assert_eq!(holder_uid(&lease).as_deref(), Some(grant.claim_uid()));
    assert_eq!(lease_token(&lease), Some(grant.token()));
    let claim = ns
        .api::<LeaseClaim>()
        .get(grant.claim_name())
        .await
        .unwrap();
    assert!(claim.spec.renew_time.is_some(), "renewTime is written");
    // The renewal names the grant it renews ("Expiry is one write", src/controller/index/holder.rs).
    let renewed = grant.token().to_string();
    assert_eq!(
        claim.annotations().get(RENEWED_TOKEN_ANNOTATION),
        Some(&renewed)
    );
    assert_eq!(controller.metric("palisade_expirations_total").await, 0.0);
    grant.release().await.unwrap();
}

#[tokio::test]
async fn lost_fires_when_the_claim_is_deleted() {
    let (ns, _controller, leases) = setup("client-claim-deleted").await;
    leases.ensure_lease("victim", 600).await.unwrap();
    let grant = acquire(&leases, "victim", "holder").await;
    ns.api::<LeaseClaim>()
        .delete(grant.claim_name(), &DeleteParams::default())
        .await
        .unwrap();
    let reason = timeout(WAIT, grant.lost()).await.expect("lost() fired");
    assert!(
        matches!(reason, LostReason::ClaimDeleted | LostReason::Superseded),
        "{reason:?}"
    );
    assert_eq!(grant.lost_reason(), Some(reason));
}

#[tokio::test]
async fn lost_fires_when_the_lease_is_deleted() {
    let (ns, _controller, leases) = setup("client-lease-deleted").await;
    leases.ensure_lease("doomed", 600).await.unwrap();
    let grant = acquire(&leases, "doomed", "holder").await;
    let claim = grant.claim_name().to_string();
    ns.api::<Lease>()
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let reason = timeout(WAIT, grant.lost()).await.expect("lost() fired");
    assert!(
        matches!(reason, LostReason::LeaseDeleted | LostReason::Revoked),
        "{reason:?}"
    );
    // A lost grant keeps its claim (its status says why) until the owner lets go.
    wait_for(ns.api::<LeaseClaim>(), &claim, "Revoked", |c| {
        c.and_then(|c| c.status.as_ref()?.phase) == Some(ClaimPhase::Revoked)
    })
    .await;
    drop(grant);
    wait_for(ns.api::<LeaseClaim>(), &claim, "deletion", |c| c.is_none()).await;
}

#[tokio::test]
async fn lost_fires_when_the_controller_revokes_because_the_pod_is_gone() {
    let (ns, _controller, leases) = setup("client-pod-gone").await;
    let pod = support::create_pod(&ns, "worker-0").await;
    leases.ensure_lease("guarded", 600).await.unwrap();
    let binding = PodBinding::Pod {
        name: "worker-0".into(),
        uid: pod.uid().unwrap(),
    };
    let grant = timeout(
        WAIT,
        leases.acquire(
            "guarded",
            AcquireOptions {
                identity: None,
                pod: binding,
                timeout: None,
                slot: None,
            },
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let claim = ns
        .api::<LeaseClaim>()
        .get(grant.claim_name())
        .await
        .unwrap();
    assert_eq!(claim.spec.pod.as_ref().unwrap().name, "worker-0");
    assert_eq!(claim.spec.pod.unwrap().uid, pod.uid());
    let owner = &claim.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Pod", "worker-0")
    );

    ns.api::<Pod>()
        .delete("worker-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    // 600 s lease: only the controller (or the garbage collector, through the owner
    // reference) can end this grant within the wait.
    let reason = timeout(WAIT, grant.lost()).await.expect("lost() fired");
    assert!(
        matches!(
            reason,
            LostReason::Revoked | LostReason::Superseded | LostReason::ClaimDeleted
        ),
        "{reason:?}"
    );
}

#[tokio::test]
async fn dropping_a_grant_deletes_its_claim() {
    let (ns, _controller, leases) = setup("client-drop").await;
    leases.ensure_lease("dropped", 600).await.unwrap();
    let grant = acquire(&leases, "dropped", "holder").await;
    let claim = grant.claim_name().to_string();
    drop(grant);
    assert!(
        leases.flush(WAIT).await,
        "the delete spawned by drop finished"
    );
    assert!(
        ns.api::<LeaseClaim>()
            .get_opt(&claim)
            .await
            .unwrap()
            .is_none(),
        "claim {claim} is gone"
    );
    wait_for(ns.api::<Lease>(), "dropped", "Free", |l| {
        l.and_then(|l| l.status.as_ref()?.phase) == Some(LeasePhase::Free)
    })
    .await;
}

#[tokio::test]
async fn an_acquire_that_times_out_deletes_its_claim_before_returning() {
    let (ns, _controller, leases) = setup("client-timeout").await;
    leases.ensure_lease("busy", 600).await.unwrap();
    let holder = acquire(&leases, "busy", "holder").await;

    let started = Instant::now();
    let result = leases
        .acquire(
            "busy",
            AcquireOptions {
                timeout: Some(Duration::from_secs(1)),
                ..options("late")
            },
        )
        .await;
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        claim_names(&ns).await,
        vec![holder.claim_name().to_string()],
        "the timed-out claim is already gone"
    );
    holder.release().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_acquire_deletes_its_claim() {
    let (ns, _controller, leases) = setup("client-cancel").await;
    leases.ensure_lease("busy", 600).await.unwrap();
    let holder = acquire(&leases, "busy", "holder").await;

    let waiter = tokio::spawn({
        let leases = leases.clone();
        async move { leases.acquire("busy", options("impatient")).await }
    });
    // The waiting claim exists...
    wait_for(ns.api::<Lease>(), "busy", "a waiter", |l| {
        l.and_then(|l| l.status.as_ref()?.waiting_count) == Some(1)
    })
    .await;
    assert_eq!(claim_names(&ns).await.len(), 2);
    // ...and goes away when the acquire future is dropped.
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert!(leases.flush(WAIT).await, "the spawned delete finished");
    assert_eq!(
        claim_names(&ns).await,
        vec![holder.claim_name().to_string()]
    );

    // Cancelled at whatever point it reached, the create request in flight included.
    for after_ms in [0, 1, 2, 5, 10, 20, 50] {
        let cancelled = timeout(
            Duration::from_millis(after_ms),
            leases.acquire("busy", options("hasty")),
        )
        .await;
        assert!(cancelled.is_err(), "granted while held");
        assert!(leases.flush(WAIT).await, "the spawned delete finished");
        assert_eq!(
            claim_names(&ns).await,
            vec![holder.claim_name().to_string()],
            "cancelled after {after_ms} ms"
        );
    }
    holder.release().await.unwrap();
}
