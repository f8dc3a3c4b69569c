//! A holder's grant: renewal, expiry, revocation, an unreadable claim, a stalled
//! claim watch, and lease durations changed under it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim};
use serde_json::json;
use support::claims::{create_claim, create_lease, wait_claim_phase, wait_holder};
use support::{
    ControllerProcess, TestNamespace, WAIT, create_pod, holder_claim, setup, token, wait_lease,
};

use crate::renew;

#[tokio::test]
async fn a_renewing_holder_keeps_the_lease_and_a_silent_one_expires() {
    let ns = setup("expiry").await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "short", 2).await;
    create_claim(&ns, "renewer", "short", None).await;
    let t = token(&wait_holder(&ns, "short", "renewer").await);
    create_claim(&ns, "next", "short", None).await;

    // Renew every 500 ms for 5 s (2.5 durations): still the holder, same token.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        renew(&ns, "renewer").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lease = ns.api::<Lease>().get("short").await.unwrap();
    assert_eq!(holder_claim(&lease).as_deref(), Some("renewer"));
    assert_eq!(token(&lease), t);

    // Stop renewing: expired after about the duration, and the waiter is granted.
    let stopped = Instant::now();
    let lease = wait_holder(&ns, "short", "next").await;
    let waited = stopped.elapsed();
    assert!(
        waited >= Duration::from_millis(1400),
        "expired too early: {waited:?}"
    );
    assert!(token(&lease) > t);
    let old = wait_claim_phase(&ns, "renewer", ClaimPhase::Expired).await;
    assert_eq!(old.status.unwrap().fencing_token, Some(t));
    assert_eq!(
        controller
            .settled_metric("palisade_expirations_total", 1.0)
            .await,
        1.0
    );
}

#[tokio::test]
async fn deleting_the_holders_pod_revokes_without_waiting_for_expiry() {
    let ns = setup("revoke").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let pod = create_pod(&ns, "worker-0").await;
    create_lease(&ns, "guarded", 600).await;
    create_claim(
        &ns,
        "worker-0",
        "guarded",
        Some(("worker-0", &pod.uid().unwrap())),
    )
    .await;
    let t = token(&wait_holder(&ns, "guarded", "worker-0").await);
    create_claim(&ns, "standby", "guarded", None).await;
    wait_lease(&ns, "guarded", "a waiter", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(1))
    })
    .await;

    let deleted = Instant::now();
    ns.api::<Pod>()
        .delete("worker-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let lease = wait_holder(&ns, "guarded", "standby").await;
    assert!(
        deleted.elapsed() < Duration::from_secs(10),
        "revocation waited for {:?}",
        deleted.elapsed()
    );
    assert!(token(&lease) > t);
    let old = wait_claim_phase(&ns, "worker-0", ClaimPhase::Revoked).await;
    let status = old.status.unwrap();
    let granted = status.conditions.iter().find(|c| c.type_ == "Granted");
    let message = &granted
        .unwrap_or_else(|| panic!("no Granted condition: {status:?}"))
        .message;
    assert!(
        message.contains("worker-0"),
        "the reason names the pod: {message}"
    );
}

#[tokio::test]
async fn an_unreadable_claim_is_reported_and_does_not_wedge_the_controller() {
    let ns = setup("unreadable").await;
    // Valid for the API server (RFC 3339 allows any number of fraction digits), but
    // more than the nanoseconds a Kubernetes client can read.
    let unreadable: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": "garbled"},
        "spec": {"leaseName": "sturdy", "holderIdentity": "garbled", "renewTime": "2026-11-29T10:00:00.1234567891Z"}
    }))
    .unwrap();
    let resource = kube::discovery::ApiResource::erase::<LeaseClaim>(&());
    Api::<kube::api::DynamicObject>::namespaced_with(ns.client.clone(), &ns.name, &resource)
        .create(&PostParams::default(), &unreadable)
        .await
        .expect("the API server accepts the claim");
    create_lease(&ns, "sturdy", 15).await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_claim(&ns, "fine", "sturdy", None).await;
    wait_holder(&ns, "sturdy", "fine").await;
    assert_eq!(
        controller.metric("palisade_invalid_objects_total").await,
        1.0
    );
    let events = ns.api::<k8s_openapi::api::core::v1::Event>();
    let deadline = Instant::now() + WAIT;
    loop {
        let list = events.list(&Default::default()).await.unwrap();
        if list.items.iter().any(|e| {
            e.reason.as_deref() == Some("InvalidObject")
                && e.involved_object.name.as_deref() == Some("garbled")
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no InvalidObject event on the unreadable claim"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client whose LeaseClaim watches never answer: the controller lists the claims
/// once and then hears nothing more of them (a claim watch cut while the Lease watch
/// and writes work, as after a failover or a link that healed for some streams only).
fn stalled_claim_watch(inner: kube::Client) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        async move {
            let uri = request.uri();
            let claim_watch = uri.path().ends_with("/leaseclaims")
                && uri
                    .query()
                    .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
            if claim_watch {
                futures::future::pending::<()>().await;
            }
            inner.send(request).await
        }
    });
    kube::Client::new(service, "default")
}

/// A holder whose renewals land must keep its grant, whatever the
/// controller's caches say; once it stops renewing, it still expires.
#[tokio::test]
async fn a_renewing_holder_keeps_the_lease_while_the_controllers_claim_watch_is_stalled() {
    let ns = setup("stale-claims").await;
    create_lease(&ns, "db", 2).await;
    create_claim(&ns, "holder", "db", None).await;
    create_claim(&ns, "next", "db", None).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (_leading_tx, leading) = tokio::sync::watch::channel(true);
    let controller = tokio::spawn(palisade::controller::run(
        palisade::kube_client::ControllerClients::unpinged(stalled_claim_watch(
            support::client().await,
        )),
        palisade::controller::ControllerConfig {
            namespace: Some(ns.name.clone()),
            concurrency: 4,
            instance: "stalled-claim-watch".into(),
        },
        Arc::new(palisade::controller::metrics::Metrics::default()),
        palisade::admin::Readiness::default(),
        leading,
        shutdown.clone(),
    ));
    let granted = wait_holder(&ns, "db", "holder").await;
    // Renew every third of the duration, straight to the API server, for three durations.
    let leases = ns.api::<Lease>();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        renew(&ns, "holder").await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let lease = leases.get("db").await.expect("get lease");
        assert_eq!(
            holder_claim(&lease).as_deref(),
            Some("holder"),
            "a renewing holder lost its grant after {:?}: {:?}",
            start.elapsed(),
            lease.status
        );
        assert_eq!(token(&lease), token(&granted));
    }
    let claim = ns.api::<LeaseClaim>().get("holder").await.unwrap();
    assert_eq!(
        claim.status.and_then(|s| s.phase),
        Some(ClaimPhase::Granted)
    );
    // Silent from now on: expired within its duration and a little, handed to the waiter.
    let silent = Instant::now();
    wait_holder(&ns, "db", "next").await;
    assert!(
        silent.elapsed() < Duration::from_secs(6),
        "{:?}",
        silent.elapsed()
    );
    wait_claim_phase(&ns, "holder", ClaimPhase::Expired).await;
    shutdown.cancel();
    controller.await.unwrap();
}

/// The duration a Lease's current grant was made with, as the controller recorded it
/// (`status.holder.leaseDurationSeconds`), read from the JSON.
fn recorded_duration(lease: &Lease) -> Option<i64> {
    serde_json::to_value(lease).unwrap()["status"]["holder"]["leaseDurationSeconds"].as_i64()
}

/// Edits `spec.leaseDurationSeconds` and waits until the controller has seen the edit.
async fn set_duration(ns: &TestNamespace, lease: &str, seconds: i64) {
    let edited = ns
        .api::<Lease>()
        .patch(
            lease,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseDurationSeconds": seconds}})),
        )
        .await
        .expect("edit leaseDurationSeconds");
    let generation = edited.metadata.generation;
    wait_lease(ns, lease, "the edit observed", |l| {
        l.status.as_ref().and_then(|s| s.observed_generation) == generation
    })
    .await;
}

/// A holder's client keeps the duration
/// its grant was observed with, so lowering `leaseDurationSeconds` (10 s to 2 s here)
/// while the holder is silent (its watch stalled: it neither renews nor sees the edit)
/// must not let the controller expire it before the granted duration has passed since
/// its last renewal. It does expire after that, and the next grant uses the new spec.
#[tokio::test]
async fn a_lowered_lease_duration_does_not_expire_a_holder_before_its_granted_duration() {
    let ns = setup("lowered").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "db", 10).await;
    create_claim(&ns, "holder", "db", None).await;
    let granted = wait_holder(&ns, "db", "holder").await;
    create_claim(&ns, "next", "db", None).await;
    wait_lease(&ns, "db", "a waiter", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(1))
    })
    .await;

    // The holder's last renewal: its own deadline is two thirds of 10 s after it.
    let renewed = Instant::now();
    renew(&ns, "holder").await;
    set_duration(&ns, "db", 2).await;
    let leases = ns.api::<Lease>();
    while renewed.elapsed() < Duration::from_millis(6500) {
        let lease = leases.get("db").await.expect("get lease");
        assert_eq!(
            holder_claim(&lease).as_deref(),
            Some("holder"),
            "expired {:?} after its last renewal on the lowered duration, granted for 10s: {:?}",
            renewed.elapsed(),
            lease.status
        );
        assert_eq!(token(&lease), token(&granted));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let next = wait_holder(&ns, "db", "next").await;
    let waited = renewed.elapsed();
    assert!(
        waited >= Duration::from_millis(9900) && waited < Duration::from_secs(14),
        "expired {waited:?} after the last renewal; granted for 10s"
    );
    eprintln!("expired {waited:?} after the last renewal (granted for 10 s, spec lowered to 2 s)");
    wait_claim_phase(&ns, "holder", ClaimPhase::Expired).await;
    assert!(token(&next) > token(&granted));
    // Each grant recorded the duration it was made with.
    assert_eq!(
        recorded_duration(&granted),
        Some(10),
        "{:?}",
        granted.status
    );
    assert_eq!(recorded_duration(&next), Some(2), "{:?}", next.status);
}

/// The same across a controller restart: rule 4's fresh full duration is at least
/// the duration the grant was made with, which only the Lease status remembers.
#[tokio::test]
async fn a_restarted_controller_gives_a_holder_at_least_its_granted_duration() {
    let ns = setup("lowered-restart").await;
    let mut controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "db", 10).await;
    create_claim(&ns, "holder", "db", None).await;
    let granted = wait_holder(&ns, "db", "holder").await;
    create_claim(&ns, "next", "db", None).await;
    renew(&ns, "holder").await;
    set_duration(&ns, "db", 2).await;
    // Renewing within the lowered duration until the controller stops, then silent.
    renew(&ns, "holder").await;
    controller.kill();
    let _ = controller.child.wait().await;
    let restarted = Instant::now();
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;

    let leases = ns.api::<Lease>();
    while restarted.elapsed() < Duration::from_millis(6500) {
        let lease = leases.get("db").await.expect("get lease");
        assert_eq!(
            holder_claim(&lease).as_deref(),
            Some("holder"),
            "expired {:?} after the restart on the lowered duration, granted for 10s: {:?}",
            restarted.elapsed(),
            lease.status
        );
        assert_eq!(token(&lease), token(&granted));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_holder(&ns, "db", "next").await;
    let waited = restarted.elapsed();
    assert!(
        waited >= Duration::from_millis(9900) && waited < Duration::from_secs(15),
        "expired {waited:?} after the restart; granted for 10s"
    );
    eprintln!("expired {waited:?} after the restart (granted for 10 s, spec lowered to 2 s)");
}
