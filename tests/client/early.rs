//! The head waiter's early confirmation: a grant that follows a release or an expiry
//! is believed from a write the waiter sent before it, so `acquire` returns as soon
//! as the grant is seen. The sign: when `acquire` returns, the claim shows a
//! `renewTime` but no renewal naming the grant's token (the keeper's first one comes
//! a third of the duration after the early write; a confirmation made after the grant
//! names it).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use palisade::client::Grant;
use palisade::crd::{Lease, LeaseClaim, RENEWED_TOKEN_ANNOTATION};
use support::{TestNamespace, WAIT};
use tokio::time::timeout;

use crate::{acquire, holder_uid, lease_token, setup};

/// The lease duration: long enough that the keeper's first renewal (a third of it
/// after the early write) cannot land before the test reads the claim.
const DURATION_SECS: i64 = 6;

/// Waits until the Lease `name` lists `claim` first among its waiters.
async fn wait_until_first(ns: &TestNamespace, name: &str, claim_prefix: &str) {
    let leases = ns.api::<Lease>();
    timeout(WAIT, async {
        loop {
            let lease = leases.get(name).await.unwrap();
            let first = lease
                .status
                .as_ref()
                .and_then(|s| s.waiting.first().cloned());
            if first.is_some_and(|c| c.starts_with(claim_prefix)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{claim_prefix} never first in the queue of {name}"));
}

/// Asserts that `grant` was believed from a write made before it: its claim has a
/// `renewTime` and no renewal of the grant's token yet.
async fn assert_confirmed_before_the_grant(ns: &TestNamespace, grant: &Grant) {
    let claim = ns
        .api::<LeaseClaim>()
        .get(grant.claim_name())
        .await
        .unwrap();
    assert!(
        claim.spec.renew_time.is_some(),
        "the waiter never wrote its claim before the grant"
    );
    assert_eq!(
        claim.annotations().get(RENEWED_TOKEN_ANNOTATION),
        None,
        "acquire waited for a renewal of token {} after the grant",
        grant.token()
    );
    let lease = ns.api::<Lease>().get(grant.lease()).await.unwrap();
    assert_eq!(holder_uid(&lease).as_deref(), Some(grant.claim_uid()));
    assert_eq!(lease_token(&lease), Some(grant.token()));
}

#[tokio::test]
async fn after_a_release_the_head_waiter_is_granted_on_a_write_sent_before_the_grant() {
    let (ns, _controller, leases) = setup("client-early-release").await;
    leases.ensure_lease("early", DURATION_SECS).await.unwrap();
    let holder = acquire(&leases, "early", "holder").await;
    let waiting = tokio::spawn({
        let leases = leases.clone();
        async move { acquire(&leases, "early", "waiter").await }
    });
    wait_until_first(&ns, "early", "early-waiter-").await;
    // Older than a third of the duration: the create no longer vouches for a grant.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    holder.release().await.unwrap();
    let waiter = timeout(WAIT, waiting).await.unwrap().unwrap();
    assert_confirmed_before_the_grant(&ns, &waiter).await;
    // And it is held like any grant: renewed a third of the duration later.
    tokio::time::sleep(Duration::from_secs(DURATION_SECS as u64)).await;
    assert_eq!(waiter.lost_reason(), None);
    assert!(waiter.is_held());
    waiter.release().await.unwrap();
}

#[tokio::test]
async fn after_a_silent_holder_expires_the_head_waiter_is_granted_on_a_write_sent_before_the_grant()
{
    let (ns, _controller, leases) = setup("client-early-expiry").await;
    leases.ensure_lease("early", DURATION_SECS).await.unwrap();
    let claims = ns.api::<LeaseClaim>();
    // A holder that renews its grant once and falls silent (as a stalled process would).
    let silent: LeaseClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "silent"},
        "spec": {"leaseName": "early", "holderIdentity": "silent"}
    }))
    .unwrap();
    claims
        .create(&PostParams::default(), &silent)
        .await
        .unwrap();
    let token = timeout(WAIT, async {
        loop {
            let lease = ns.api::<Lease>().get("early").await.unwrap();
            if let Some(t) = lease_token(&lease).filter(|_| holder_uid(&lease).is_some()) {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the silent claim was granted");
    let waiting = tokio::spawn({
        let leases = leases.clone();
        async move { acquire(&leases, "early", "waiter").await }
    });
    wait_until_first(&ns, "early", "early-waiter-").await;
    let renewal = serde_json::json!({
        "metadata": {"annotations": {RENEWED_TOKEN_ANNOTATION: token.to_string()}},
        "spec": {"renewTime": MicroTime(Timestamp::now())},
    });
    claims
        .patch("silent", &PatchParams::default(), &Patch::Merge(&renewal))
        .await
        .unwrap();
    let waiter = timeout(WAIT, waiting).await.unwrap().unwrap();
    assert!(waiter.token() > token);
    assert_confirmed_before_the_grant(&ns, &waiter).await;
    waiter.release().await.unwrap();
}
