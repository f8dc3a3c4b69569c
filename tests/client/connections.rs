//! The client behind a fault proxy: a partition, stalled watches, a silently dead
//! connection, a quiet waiter.

use std::time::{Duration, Instant};

use palisade::client::{LeaseClient, LostReason};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim};
use support::proxy::Mode;
use support::{WAIT, wait_for};
use tokio::time::timeout;

use crate::{acquire, holder_uid, options, proxied, proxied_unchecked, setup};

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
