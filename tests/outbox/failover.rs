//! Relay failover: a relay SIGKILLed with requests in flight, and a relay SIGSTOPped
//! past its Lease and continued after its successor delivered. The successor sends
//! the same keys again; the provider executes each intent once, and the stopped
//! relay records nothing once continued. A relay stopped by SIGTERM hands over at once.

use std::time::Duration;

use support::provider::Provider;

use super::{
    Relay, TestDb, assert_executed_once, cluster, enqueue_payments, holder_token, rows, wait_state,
};

const LIMIT: Duration = Duration::from_secs(30);

/// Waits until the provider has received a request for each of `ids`.
async fn wait_requested(provider: &Provider, ids: &[String]) {
    super::eventually("the provider received every intent", LIMIT, || async {
        let keys = provider.keys();
        ids.iter()
            .all(|id| keys.get(id).is_some_and(|k| k.requests >= 1))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_relays_successor_delivers_each_intent_once() {
    let (ns, _controller) = cluster("outbox-kill").await;
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let provider = Provider::start().await;
    // The provider executes at once and answers after 800ms: the kill comes between.
    provider.delay_executions(Some(Duration::from_millis(800)));
    let ids = enqueue_payments(&mut client, "shop/payments", 1, 10).await;

    let first = Relay::start(
        &ns.name,
        "relay-a",
        &db,
        "relay",
        &provider.url(),
        &["--timeout", "5s"],
    );
    let first_token = holder_token(&ns, "relay", "relay-a holds the lease", |who, _| {
        who == "relay-a"
    })
    .await;
    let second = Relay::start(
        &ns.name,
        "relay-b",
        &db,
        "relay",
        &provider.url(),
        &["--timeout", "5s"],
    );
    wait_requested(&provider, &ids).await;
    first.signal(libc::SIGKILL);
    provider.delay_executions(None);

    let second_token = holder_token(&ns, "relay", "relay-b took over", |who, t| {
        who == "relay-b" && t > first_token
    })
    .await;
    wait_state(&client, &ids, "delivered", LIMIT).await;
    assert_executed_once(&provider, &ids);
    let rows = rows(&client).await;
    let keys = provider.keys();
    for id in &ids {
        assert_eq!(
            rows[id].recorded_token,
            Some(second_token),
            "{id}: {:?}",
            rows[id]
        );
        assert!(
            keys[id].requests >= 2,
            "the successor sent {id} again: {:?}",
            keys[id]
        );
    }
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_paused_past_its_lease_records_nothing_once_continued() {
    let (ns, _controller) = cluster("outbox-stop").await;
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let provider = Provider::start().await;
    provider.delay_executions(Some(Duration::from_millis(800)));
    let ids = enqueue_payments(&mut client, "shop/payments", 1, 10).await;

    let paused = Relay::start(
        &ns.name,
        "relay-a",
        &db,
        "relay",
        &provider.url(),
        &["--timeout", "30s"],
    );
    let paused_token = holder_token(&ns, "relay", "relay-a holds the lease", |who, _| {
        who == "relay-a"
    })
    .await;
    let successor = Relay::start(&ns.name, "relay-b", &db, "relay", &provider.url(), &[]);
    wait_requested(&provider, &ids).await;
    // Stopped with ten requests in flight; their answers reach it only once continued.
    paused.signal(libc::SIGSTOP);
    provider.delay_executions(None);

    let successor_token = holder_token(&ns, "relay", "relay-b took over", |who, t| {
        who == "relay-b" && t > paused_token
    })
    .await;
    wait_state(&client, &ids, "delivered", LIMIT).await;
    paused.signal(libc::SIGCONT);
    super::eventually("the continued relay to notice", LIMIT, || async {
        let log = paused.log();
        log.contains("relay refused as stale") || log.contains("relay lost its lease")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_executed_once(&provider, &ids);
    let rows = rows(&client).await;
    for id in &ids {
        assert_eq!(
            rows[id].recorded_token,
            Some(successor_token),
            "{id}: {:?}",
            rows[id]
        );
    }
    let log = paused.log();
    assert!(
        !log.contains("recorded the provider's answer"),
        "the paused relay recorded an answer:\n{log}"
    );
    drop(successor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_by_sigterm_releases_its_lease_and_exits_0() {
    let (ns, _controller) = cluster("outbox-term").await;
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let provider = Provider::start().await;
    let mut first = Relay::start(&ns.name, "relay-a", &db, "relay", &provider.url(), &[]);
    let first_token = holder_token(&ns, "relay", "relay-a holds the lease", |who, _| {
        who == "relay-a"
    })
    .await;
    let _second = Relay::start(&ns.name, "relay-b", &db, "relay", &provider.url(), &[]);
    first.signal(libc::SIGTERM);
    let status = tokio::time::timeout(LIMIT, first.child.wait())
        .await
        .expect("the relay exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", first.log());
    holder_token(&ns, "relay", "relay-b took over", |who, t| {
        who == "relay-b" && t > first_token
    })
    .await;
    let ids = enqueue_payments(&mut client, "shop/payments", 1, 3).await;
    wait_state(&client, &ids, "delivered", LIMIT).await;
    assert_executed_once(&provider, &ids);
}
