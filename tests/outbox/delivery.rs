//! One relay against a provider that fails: 5xx answers and answers past the relay's
//! timeout are retried until delivered, each intent executed once; a 4xx is the
//! provider's answer, recorded and never retried.

use std::time::Duration;

use support::provider::Provider;

use super::{
    Relay, TestDb, assert_executed_once, cluster, enqueue, enqueue_payments, holder_token, rows,
    wait_state,
};

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_is_executed_once_across_provider_5xx_and_timeouts() {
    let (ns, _controller) = cluster("outbox-faults").await;
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let provider = Provider::start().await;

    // Timeouts: the provider executes, then answers only after the relay gave up (1s).
    provider.delay_executions(Some(Duration::from_millis(1500)));
    let slow = enqueue_payments(&mut client, "shop/payments", 1, 6).await;
    let relay = Relay::start(&ns.name, "relay-a", &db, "relay", &provider.url(), &[]);
    holder_token(&ns, "relay", "the relay holds its lease", |who, _| {
        who == "relay-a"
    })
    .await;
    super::eventually("the slow intents executed", LIMIT, || async {
        let keys = provider.keys();
        slow.iter()
            .all(|id| keys.get(id).is_some_and(|k| k.executions == 1))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // past the relay's timeout
    provider.delay_executions(None);
    wait_state(&client, &slow, "delivered", LIMIT).await;

    // 5xx: the next eight requests are refused before anything executes.
    provider.fail_next(8, 503);
    let refused = enqueue_payments(&mut client, "shop/payments", 1, 6).await;
    wait_state(&client, &refused, "delivered", LIMIT).await;

    let all: Vec<String> = slow.iter().chain(&refused).cloned().collect();
    assert_executed_once(&provider, &all);
    let rows = rows(&client).await;
    let keys = provider.keys();
    for id in &slow {
        assert!(
            rows[id].attempts >= 2,
            "{id} was retried after its timeout: {:?}",
            rows[id]
        );
        assert!(
            keys[id].requests >= 2,
            "the provider saw {id} again: {:?}",
            keys[id]
        );
    }
    let retried_5xx = refused.iter().filter(|id| keys[*id].requests >= 2).count();
    assert!(retried_5xx >= 1, "some 5xx answers were retried: {keys:?}");
    for id in &all {
        assert_eq!(rows[id].last_status, Some(200), "{id}: {:?}", rows[id]);
    }
    assert!(
        provider.requests() >= all.len() as u32 + 6 + 8,
        "every timeout and 5xx was retried"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_is_recorded_as_the_providers_answer_and_never_retried() {
    let (ns, _controller) = cluster("outbox-4xx").await;
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let provider = Provider::start().await;
    let invalid = enqueue(
        &mut client,
        "shop/payments",
        1,
        serde_json::json!({"reject": true}),
    )
    .await;
    let valid = enqueue_payments(&mut client, "shop/payments", 1, 1).await;
    let _relay = Relay::start(&ns.name, "relay-a", &db, "relay", &provider.url(), &[]);

    wait_state(&client, std::slice::from_ref(&invalid), "rejected", LIMIT).await;
    wait_state(&client, &valid, "delivered", LIMIT).await;
    // Many backoffs (100ms, capped at 1s) long: a retry would have come.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let row = &rows(&client).await[&invalid];
    assert_eq!((row.last_status, row.attempts), (Some(422), 1), "{row:?}");
    let answer: String = client
        .query_one(
            "SELECT last_answer FROM palisade.outbox WHERE id = $1::text::uuid",
            &[&invalid],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        answer.contains("payment refused"),
        "the provider's body is recorded: {answer}"
    );
    assert_eq!(
        provider.keys()[&invalid].requests,
        1,
        "a 4xx is never retried"
    );
}
