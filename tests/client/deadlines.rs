//! The holder's own deadline: a grant the controller ended, an unmirrored one, a
//! first renewal that never counts, a longer lease duration.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use palisade::client::{Error, Grant, LeaseClient, LostReason};
use palisade::crd::{Lease, LeaseClaim};
use support::proxy::Mode;
use support::{TestNamespace, WAIT};
use tokio::time::timeout;

use crate::{acquire, options, proxied, setup};

/// Waits for the one claim a client creates in `ns`.
async fn the_claim(ns: &TestNamespace) -> LeaseClaim {
    let claims = ns.api::<LeaseClaim>();
    timeout(WAIT, async {
        loop {
            if let Some(c) = claims.list(&Default::default()).await.unwrap().items.pop() {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the client created its claim")
}

/// Plays the controller for a test that runs none: waits for the one claim `acquiring`
/// creates, names it holder of `lease` with `token` (Lease status only, no claim mirror)
/// and returns what the acquire then returns.
async fn grant_as_the_controller(
    ns: &TestNamespace,
    lease: &str,
    token: i64,
    duration_secs: i64,
    acquiring: tokio::task::JoinHandle<Result<Grant, Error>>,
) -> Result<Grant, Error> {
    let claim = the_claim(ns).await;
    let status = serde_json::json!({"status": {
        "phase": "Held",
        "fencingToken": token,
        "holder": {"claim": claim.name_any(), "claimUID": claim.uid().unwrap(),
                   "identity": claim.spec.holder_identity, "leaseDurationSeconds": duration_secs},
    }});
    ns.api::<Lease>()
        .patch_status(
            lease,
            &Default::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    timeout(WAIT, acquiring)
        .await
        .expect("the client saw its grant")
        .unwrap()
}

/// A client in `ns` whose service account may do only what `rules` allow.
async fn restricted_client(ns: &TestNamespace, rules: serde_json::Value) -> LeaseClient {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let pp = kube::api::PostParams::default();
    let role: Role =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "holder"}, "rules": rules}))
            .unwrap();
    ns.api::<Role>().create(&pp, &role).await.unwrap();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "holder"}})).unwrap();
    ns.api::<ServiceAccount>()
        .create(&pp, &account)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "holder"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "holder"},
        "subjects": [{"kind": "ServiceAccount", "name": "holder", "namespace": ns.name}]
    }))
    .unwrap();
    ns.api::<RoleBinding>().create(&pp, &binding).await.unwrap();
    let token = support::accounts::service_account_token(ns, "holder", None).await;
    LeaseClient::new(support::client_with_token(&token).await, &ns.name)
}

/// A waiter may see its grant after the controller has expired it (a watch resumed late
/// replays "granted to X", then "granted to Y"). acquire must not return it. An expiry
/// comes at least a duration after the grant, so after the claim's create and any
/// early confirmation too; seen that late, the grant is confirmed after it is seen, and
/// that renewal finds the claim's end. Here the waiter may not watch its claim (RBAC),
/// so only a response can tell it; the test writes the ending mark and then the Lease
/// that names the claim, as a late watch would deliver them, a third of the duration
/// after the create (sooner would be no expiry: the create would vouch for the grant).
#[tokio::test]
async fn acquire_never_returns_a_grant_the_controller_already_ended() {
    support::install_crds().await;
    let ns = TestNamespace::new("client-ended-grant").await;
    let leases = restricted_client(
        &ns,
        serde_json::json!([
            {"apiGroups": ["palisade.dev"], "resources": ["leases"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["palisade.dev"], "resources": ["leaseclaims"],
             "verbs": ["get", "create", "delete", "patch"]},
        ]),
    )
    .await;
    LeaseClient::new(ns.client.clone(), &ns.name)
        .ensure_lease("replayed", 6)
        .await
        .unwrap();
    let acquiring = tokio::spawn(async move { leases.acquire("replayed", options("late")).await });
    let claim = the_claim(&ns).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let ended = serde_json::json!({"status": {"phase": "Expired", "fencingToken": 7}});
    ns.api::<LeaseClaim>()
        .patch_status(
            &claim.name_any(),
            &Default::default(),
            &kube::api::Patch::Merge(&ended),
        )
        .await
        .unwrap();
    match grant_as_the_controller(&ns, "replayed", 7, 6, acquiring).await {
        Ok(grant) => panic!(
            "acquire returned the ended grant with token {}",
            grant.token()
        ),
        Err(Error::NotGranted { reason, .. }) => assert_eq!(reason, LostReason::Expired),
        Err(e) => panic!("expected NotGranted, got {e}"),
    }
}

/// In a storm the controller writes the new holder's `Granted` mirror after
/// every pending grant, possibly later than the holder's deadline. Its renewals must
/// count meanwhile (an ending marks the claim first unless the claim shows a renewal
/// of the grant, so an unmirrored claim whose first renewal is still to come is not
/// an ended one), and an ending marked later must still be the loss. No controller
/// runs here: the test writes the Lease as the controller would and leaves the mirror.
#[tokio::test]
async fn a_holder_whose_grant_is_not_mirrored_yet_keeps_it_until_the_claim_shows_an_end() {
    support::install_crds().await;
    let ns = TestNamespace::new("client-unmirrored").await;
    let leases = LeaseClient::new(ns.client.clone(), &ns.name);
    leases.ensure_lease("late-mirror", 3).await.unwrap();
    let acquiring =
        tokio::spawn(async move { leases.acquire("late-mirror", options("holder")).await });
    let grant = grant_as_the_controller(&ns, "late-mirror", 42, 3, acquiring)
        .await
        .expect("granted");
    assert_eq!(grant.token(), 42);
    let claims = ns.api::<LeaseClaim>();
    // Past the 2 s deadline of a grant whose renewals would not count.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        grant.lost_reason(),
        None,
        "renewals of an unmirrored grant counted"
    );

    let ended = serde_json::json!({"status": {"phase": "Expired"}});
    claims
        .patch_status(
            grant.claim_name(),
            &Default::default(),
            &kube::api::Patch::Merge(&ended),
        )
        .await
        .unwrap();
    let reason = timeout(Duration::from_secs(3), grant.lost())
        .await
        .expect("the next renewal found the claim ended");
    assert_eq!(reason, LostReason::Expired);
}

/// A holder may see its grant late (its Lease watch died silently and was resumed), and
/// the controller's clock started at the grant. Seen more than a third of the duration
/// after its claim's latest write, acquire returns only once a renewal has counted,
/// within a third of the duration after it saw the grant. Here the holder may not
/// patch its claim (RBAC: renewals are refused, 403, and retried), and the test writes
/// the Lease as the controller would, 2.1 s after the create: the acquire fails then.
#[tokio::test]
async fn a_grant_whose_first_renewal_never_counts_is_not_returned_after_a_third_of_the_duration() {
    support::install_crds().await;
    let ns = TestNamespace::new("client-first-renewal").await;
    let leases = restricted_client(
        &ns,
        serde_json::json!([
            {"apiGroups": ["palisade.dev"], "resources": ["leases"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["palisade.dev"], "resources": ["leaseclaims"],
             "verbs": ["get", "list", "watch", "create", "delete"]},
        ]),
    )
    .await;
    LeaseClient::new(ns.client.clone(), &ns.name)
        .ensure_lease("first-renewal", 6)
        .await
        .unwrap();

    let acquiring =
        tokio::spawn(async move { leases.acquire("first-renewal", options("holder")).await });
    the_claim(&ns).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let granted = Instant::now();
    let result = grant_as_the_controller(&ns, "first-renewal", 7, 6, acquiring).await;
    let after = granted.elapsed();
    match result {
        Ok(grant) => panic!("acquire returned token {} unconfirmed", grant.token()),
        Err(Error::NotGranted { reason, .. }) => assert_eq!(reason, LostReason::LocalDeadline),
        Err(e) => panic!("expected NotGranted, got {e}"),
    }
    // A third of 6 s is 2 s after the grant was seen.
    assert!(
        after < Duration::from_millis(3500),
        "gave up {after:?} after the grant"
    );
}

#[tokio::test]
async fn a_longer_lease_duration_never_extends_a_holders_own_deadline() {
    let (ns, _controller, _) = setup("client-duration-edit").await;
    let (leases, partition) = proxied(&ns).await;
    leases.ensure_lease("edited", 3).await.unwrap();
    let grant = acquire(&leases, "edited", "holder").await;
    // Someone raises the duration while the grant is held; the holder sees the edit.
    ns.api::<Lease>()
        .patch(
            "edited",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"leaseDurationSeconds": 600}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(grant.lost_reason(), None);

    partition.set(Mode::Blackhole);
    let cut = Instant::now();
    // The deadline stays two thirds of the duration it was granted with (3 s), not 600 s.
    let reason = timeout(Duration::from_secs(10), grant.lost())
        .await
        .expect("gave up on the duration of the grant, not the edited one");
    assert_eq!(reason, LostReason::LocalDeadline);
    assert!(
        cut.elapsed() < Duration::from_millis(2500),
        "{:?}",
        cut.elapsed()
    );
}
