//! The client library (`palisade::client`) against the real API server and a real
//! controller: acquire, token, renewal, release, loss, cancellation.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use palisade::client::{AcquireOptions, Error, Grant, LeaseClient, LostReason, PodBinding};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim, LeasePhase, RENEWED_TOKEN_ANNOTATION};
use support::proxy::{Mode, Proxy};
use support::{ControllerProcess, TestNamespace, WAIT, claim_names, wait_for};
use tokio::time::timeout;

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
    // The renewal names the grant it renews (DESIGN "Expiry is one write").
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

#[tokio::test]
async fn a_partitioned_holder_gives_up_before_the_controller_expires_it() {
    let (ns, _controller, _) = setup("client-partition").await;
    let (leases, partition) = proxied(&ns).await;
    leases.ensure_lease("remote", 3).await.unwrap();
    let grant = acquire(&leases, "remote", "partitioned").await;
    let lost = grant.lost();
    // Renewals go through for a while...
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(grant.lost_reason(), None);

    // ...then nothing gets through.
    partition.set(Mode::Blackhole);
    let cut_at = Instant::now();
    let reason = timeout(WAIT, lost).await.expect("lost() fired");
    let gave_up_after = cut_at.elapsed();
    assert_eq!(reason, LostReason::LocalDeadline);
    // The last renewal was sent at most a third of the duration before the cut.
    assert!(
        gave_up_after <= Duration::from_millis(2000 + 500),
        "gave up {gave_up_after:?} after the cut (deadline: 2/3 of 3s after the last renewal)"
    );
    // At that moment the controller still counts the grant as held: the client gave up first.
    let lease = ns.api::<Lease>().get("remote").await.unwrap();
    assert_eq!(
        holder_uid(&lease).as_deref(),
        Some(grant.claim_uid()),
        "the controller expired the grant before the client gave up"
    );
    // And then the controller expires it on its own clock.
    wait_for(ns.api::<LeaseClaim>(), grant.claim_name(), "Expired", |c| {
        c.and_then(|c| c.status.as_ref()?.phase) == Some(ClaimPhase::Expired)
    })
    .await;
}

#[tokio::test]
async fn a_renewal_that_finds_the_claim_ended_is_a_loss_while_the_watches_are_stalled() {
    let (ns, mut controller, _) = setup("client-ended").await;
    let (leases, proxy) = proxied(&ns).await;
    leases.ensure_lease("stalled", 15).await.unwrap();
    let grant = acquire(&leases, "stalled", "holder").await;
    wait_for(ns.api::<LeaseClaim>(), grant.claim_name(), "Granted", |c| {
        c.and_then(|c| c.status.as_ref()?.phase) == Some(ClaimPhase::Granted)
    })
    .await;
    // Nobody will put the mirror right again; the holder's watches stop delivering
    // (their connections stay open), while its renewals go out on new connections.
    controller.kill();
    controller.child.wait().await.unwrap();
    proxy.freeze_open_connections();
    ns.api::<LeaseClaim>()
        .patch_status(
            grant.claim_name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {"phase": "Expired"}})),
        )
        .await
        .unwrap();
    let ended = Instant::now();
    // The next renewal (a third of 15 s, plus one attempt that may hang on a frozen
    // pooled connection for a sixth) sees the claim Expired: well before the local
    // deadline of two thirds.
    let reason = timeout(Duration::from_secs(9), grant.lost())
        .await
        .expect("a renewal on an Expired claim is reported as a loss");
    println!(
        "ended claim: loss reported {:?} after the claim was marked Expired",
        ended.elapsed()
    );
    assert_eq!(reason, LostReason::Expired, "after {:?}", ended.elapsed());
}

#[tokio::test]
async fn calls_on_a_silently_dead_connection_give_up_within_seconds() {
    let (ns, _controller, _) = setup("client-dead").await;
    let (leases, proxy) = proxied(&ns).await;
    leases.ensure_lease("dead", 600).await.unwrap();
    let grant = acquire(&leases, "dead", "holder").await;
    // Every connection, open or new, stays open and delivers nothing.
    proxy.set(Mode::Blackhole);

    let started = Instant::now();
    let result = timeout(Duration::from_secs(30), leases.ensure_lease("other", 600)).await;
    let took = started.elapsed();
    println!("dead connection: ensure_lease gave up after {took:?}");
    assert!(
        matches!(result, Ok(Err(_))) && took < Duration::from_secs(8),
        "ensure_lease: {result:?} after {took:?}"
    );

    let started = Instant::now();
    let result = timeout(
        Duration::from_secs(30),
        leases.acquire("other", options("w")),
    )
    .await;
    let took = started.elapsed();
    println!("dead connection: acquire gave up after {took:?}");
    assert!(
        matches!(result, Ok(Err(_))) && took < Duration::from_secs(8),
        "acquire: {result:?} after {took:?}"
    );

    let started = Instant::now();
    let result = timeout(Duration::from_secs(60), grant.release()).await;
    let took = started.elapsed();
    println!("dead connection: release gave up after {took:?}");
    assert!(
        matches!(result, Ok(Err(_))) && took < Duration::from_secs(15),
        "release: {result:?} after {took:?}"
    );
    assert!(
        leases.flush(Duration::from_secs(15)).await,
        "cleanup finished"
    );
}

/// On PINGed connections a frozen one is closed within 6 s (3 s between PINGs, 3 s
/// for the answer); the watch resumes on a new one at once.
#[tokio::test]
async fn a_waiter_whose_watch_went_silent_still_sees_its_grant() {
    let took = stalled_waiter_sees_its_grant("client-stalled-wait", false).await;
    assert!(
        took < Duration::from_secs(10),
        "saw the grant {took:?} after it was made"
    );
}

/// On unchecked connections the silent Lease watch is dropped 7 s after it started
/// (its 5 s period plus the 2 s margin); restarting it can meet pooled connections
/// frozen with it, each abandoned after CALL_TIMEOUT (5 s) and a backoff (< 0.4 s):
/// up to two here.
#[tokio::test]
async fn a_waiter_on_unchecked_connections_whose_watch_went_silent_still_sees_its_grant() {
    let took = stalled_waiter_sees_its_grant("client-stalled-wait-unchecked", true).await;
    assert!(
        took < Duration::from_secs(18),
        "saw the grant {took:?} after it was made"
    );
}

/// How long after the release a waiter whose connections froze sees its grant.
async fn stalled_waiter_sees_its_grant(test: &str, unchecked: bool) -> Duration {
    let (ns, _controller, direct) = setup(test).await;
    direct.ensure_lease("turns", 600).await.unwrap();
    let holder = acquire(&direct, "turns", "holder").await;
    let (leases, proxy) = if unchecked {
        proxied_unchecked(&ns).await
    } else {
        proxied(&ns).await
    };
    let waiter = tokio::spawn(async move { leases.acquire("turns", options("waiter")).await });
    wait_for(ns.api::<Lease>(), "turns", "a waiter", |l| {
        l.and_then(|l| l.status.as_ref()?.waiting_count) == Some(1)
    })
    .await;
    // The waiter's watches stop delivering; its connections stay open.
    proxy.freeze_open_connections();
    holder.release().await.unwrap();
    let released = Instant::now();
    let granted = timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter saw its grant")
        .unwrap()
        .expect("granted");
    let took = released.elapsed();
    println!(
        "stalled watch (unchecked: {unchecked}): the waiter saw its grant {took:?} after the release"
    );
    granted.release().await.unwrap();
    took
}

/// A waiter on a quiet Lease keeps its watches alive by resuming
/// them, not by listing again, and a resumed watch still delivers the grant.
#[tokio::test]
async fn a_quiet_waiter_resumes_its_watches_without_listing_again() {
    let (ns, _controller, direct) = setup("client-quiet-wait").await;
    direct.ensure_lease("quiet", 15).await.unwrap();
    let holder = acquire(&direct, "quiet", "holder").await;
    let requests = support::requests::Recorded::default();
    let recorded = kube::client::ClientBuilder::try_from(support::admin_config().await)
        .unwrap()
        .with_layer(&requests)
        .build();
    let leases = LeaseClient::new(recorded, &ns.name);
    let waiter = tokio::spawn(async move { leases.acquire("quiet", options("waiter")).await });
    wait_for(ns.api::<Lease>(), "quiet", "a waiter", |l| {
        l.and_then(|l| l.status.as_ref()?.waiting_count) == Some(1)
    })
    .await;
    // Past the first watches' ends: two periods of the Lease watch (5 s each).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = requests.taken();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let during: Vec<String> = requests.taken()[before.len()..].to_vec();
    let lists: Vec<&String> = during
        .iter()
        .filter(|r| r.starts_with("GET ") && !r.contains("watch=true"))
        .collect();
    assert!(lists.is_empty(), "listed again while waiting: {lists:?}");
    let watches = during.iter().filter(|r| r.contains("watch=true")).count();
    assert!(
        (2..=4).contains(&watches),
        "the Lease watch resumes every 5 s: {during:?}"
    );
    holder.release().await.unwrap();
    let granted = timeout(WAIT, waiter)
        .await
        .expect("the waiter saw its grant on a resumed watch")
        .unwrap()
        .expect("granted");
    granted.release().await.unwrap();
}

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

/// A waiter may see its grant after the controller has ended it (a watch resumed late
/// replays "granted to X", then "granted to Y"). acquire must not return it: its first
/// renewal finds the claim's end. Here the waiter may not watch its claim (RBAC), so
/// only a response can tell it; the test writes the ending mark and then the Lease
/// that names the claim, as a late watch would deliver them.
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
/// the controller's clock started at the grant. acquire returns only once a renewal
/// has counted, within a third of the duration after it saw the grant. Here the
/// holder may not patch its claim (RBAC: renewals are refused, 403, and retried), and
/// the test writes the Lease as the controller would: the acquire fails then.
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
