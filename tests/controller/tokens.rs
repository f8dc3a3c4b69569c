//! Grants and their tokens: FIFO, strictly increasing over handovers and across a
//! Lease recreated, never issued twice at the int64 maximum.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use palisade::crd::{ClaimPhase, Lease, LeasePhase};
use serde_json::json;
use support::claims::{create_claim, create_lease, delete_claim, wait_claim_phase, wait_holder};
use support::{ControllerProcess, setup, token, wait_lease};

use crate::History;

#[tokio::test]
async fn first_claim_is_granted_with_a_token_above_the_resource_version() {
    let ns = setup("first-grant").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let created = create_lease(&ns, "billing", 15).await;
    let created_rv: i64 = created.resource_version().unwrap().parse().unwrap();
    let claim = create_claim(&ns, "worker-0", "billing", None).await;

    let lease = wait_holder(&ns, "billing", "worker-0").await;
    let status = lease.status.clone().unwrap();
    assert_eq!(status.phase, Some(LeasePhase::Held));
    let holder = status.holder.unwrap();
    assert_eq!(holder.identity, "worker-0");
    assert_eq!(Some(holder.claim_uid), claim.metadata.uid);
    assert_eq!(status.grants, Some(1));
    let written_rv: i64 = lease.resource_version().unwrap().parse().unwrap();
    let t = status.fencing_token.unwrap();
    assert!(
        t > created_rv && t <= written_rv,
        "token {t} not in ({created_rv}, {written_rv}]"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Held" && c.status == "True")
    );

    let claim = wait_claim_phase(&ns, "worker-0", ClaimPhase::Granted).await;
    assert_eq!(claim.status.unwrap().fencing_token, Some(t));
}

#[tokio::test]
async fn waiters_are_granted_in_fifo_order_with_increasing_tokens() {
    let ns = setup("fifo").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "queue", 15).await;
    create_claim(&ns, "holder", "queue", None).await;
    let mut last = token(&wait_holder(&ns, "queue", "holder").await);
    // Names in reverse order, creation timestamps a second apart: creation time decides, not name.
    for name in ["zz-first", "mm-second", "aa-third"] {
        create_claim(&ns, name, "queue", None).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let lease = wait_lease(&ns, "queue", "three waiters", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(3))
    })
    .await;
    assert_eq!(
        lease.status.unwrap().waiting,
        vec!["zz-first", "mm-second", "aa-third"]
    );
    let c = wait_claim_phase(&ns, "aa-third", ClaimPhase::Pending).await;
    assert_eq!(c.status.unwrap().position, Some(3));

    let mut previous = "holder";
    for next in ["zz-first", "mm-second", "aa-third"] {
        delete_claim(&ns, previous).await;
        let lease = wait_holder(&ns, "queue", next).await;
        let t = token(&lease);
        assert!(t > last, "token {t} after {last}");
        last = t;
        previous = next;
    }
    delete_claim(&ns, previous).await;
    let lease = wait_lease(&ns, "queue", "Free", |l| {
        l.status.as_ref().and_then(|s| s.phase) == Some(LeasePhase::Free)
    })
    .await;
    assert_eq!(
        lease.status.unwrap().fencing_token,
        Some(last),
        "a free lease keeps its last token"
    );
}

#[tokio::test]
async fn tokens_strictly_increase_over_100_handovers() {
    let ns = setup("handovers").await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let history = History::start(&ns);
    create_lease(&ns, "hot", 15).await;
    create_claim(&ns, "c-0", "hot", None).await;
    let mut last = token(&wait_holder(&ns, "hot", "c-0").await);
    let mut latencies = Vec::new();
    for i in 1..=100 {
        let (prev, next) = (format!("c-{}", i - 1), format!("c-{i}"));
        create_claim(&ns, &next, "hot", None).await;
        wait_lease(&ns, "hot", "a waiter", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.waiting_count == Some(1))
        })
        .await;
        let released = Instant::now();
        delete_claim(&ns, &prev).await;
        let lease = wait_holder(&ns, "hot", &next).await;
        latencies.push(released.elapsed());
        let t = token(&lease);
        assert!(t > last, "handover {i}: token {t} not above {last}");
        last = t;
    }
    latencies.sort();
    println!(
        "handover after release, seen by a watching client: p50 {:?}, p90 {:?}, max {:?} over {}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 9 / 10],
        latencies.last().unwrap(),
        latencies.len()
    );
    assert_eq!(
        controller
            .settled_metric("palisade_grants_total", 101.0)
            .await,
        101.0
    );
    assert_eq!(controller.metric("palisade_write_errors_total").await, 0.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    history.assert_consistent();
}

#[tokio::test]
async fn tokens_keep_increasing_when_the_lease_is_deleted_and_recreated() {
    let ns = setup("recreate").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "phoenix", 15).await;
    create_claim(&ns, "a", "phoenix", None).await;
    let first = token(&wait_holder(&ns, "phoenix", "a").await);

    ns.api::<Lease>()
        .delete("phoenix", &DeleteParams::default())
        .await
        .unwrap();
    let a = wait_claim_phase(&ns, "a", ClaimPhase::Revoked).await;
    assert_eq!(
        a.status.unwrap().fencing_token,
        Some(first),
        "a lost claim keeps its token"
    );
    create_claim(&ns, "b", "phoenix", None).await;
    let b = wait_claim_phase(&ns, "b", ClaimPhase::Pending).await;
    assert!(
        b.status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "LeaseNotFound" && c.status == "True"),
        "a claim for a missing Lease says LeaseNotFound"
    );

    create_lease(&ns, "phoenix", 15).await;
    let lease = wait_holder(&ns, "phoenix", "b").await;
    let second = token(&lease);
    assert!(
        second > first,
        "token after re-creation {second} must exceed {first}"
    );
    assert_eq!(
        lease.status.unwrap().grants,
        Some(1),
        "grants counts this Lease object's grants"
    );
    let b = wait_claim_phase(&ns, "b", ClaimPhase::Granted).await;
    assert!(
        b.status
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.type_ != "LeaseNotFound")
    );
}

/// A `fencingToken` at the int64 maximum, set through the status
/// subresource by anyone allowed to, makes the controller refuse to grant (with a
/// condition saying why) instead of issuing that token again.
#[tokio::test]
async fn a_token_at_the_int64_maximum_is_not_issued_again() {
    let ns = setup("token-max").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "db", 15).await;
    let status = json!({"status": {"phase": "Free", "fencingToken": i64::MAX, "grants": 1}});
    ns.api::<Lease>()
        .patch_status("db", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("setting fencingToken through leases/status");
    create_claim(&ns, "a", "db", None).await;
    let lease = wait_lease(&ns, "db", "condition TokensExhausted", |l| {
        l.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Held" && c.reason == "TokensExhausted")
        })
    })
    .await;
    let status = lease.status.unwrap();
    assert_eq!(status.holder, None);
    assert_eq!(status.fencing_token, Some(i64::MAX));
    assert_eq!(status.waiting, vec!["a"]);
    let held = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Held")
        .unwrap();
    assert_eq!(held.status, "False");
    assert!(held.message.contains(&i64::MAX.to_string()), "{held:?}");
    let claim = wait_claim_phase(&ns, "a", ClaimPhase::Pending).await;
    assert_eq!(claim.status.unwrap().fencing_token, None);
}
