//! Leadership handed over through the controller: the deposed leader's client is
//! refused, its successor's writes land.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use palisade::client::{AcquireOptions, LeaseClient, LostReason, PodBinding};
use palisade::crd::LeaseClaim;
use palisade::operator::{Outcome, run_while_leading};
use serde_json::json;
use support::{ControllerProcess, TestNamespace};
use tokio::sync::mpsc;

use super::{LEASE, configmaps, fence, fenced_operator, refusal};

/// Writes `by` into ConfigMap `state` with the leader's client.
async fn write_state(client: &Client, namespace: &str, by: &str) -> Result<(), kube::Error> {
    let patch = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "state"}, "data": {"by": by}});
    configmaps(client, namespace)
        .patch(
            "state",
            &PatchParams::apply(by).force(),
            &Patch::Apply(patch),
        )
        .await
        .map(drop)
}

/// One candidate: leads through `run_while_leading`, writes once, hands its client and
/// token to the test, then keeps leading until the grant ends.
fn candidate(
    ns: &TestNamespace,
    config: &kube::Config,
    name: &'static str,
    led: mpsc::Sender<(&'static str, Client, i64)>,
) -> tokio::task::JoinHandle<LostReason> {
    let namespace = ns.name.clone();
    let config = config.clone();
    tokio::spawn(async move {
        let leases = LeaseClient::from_config(config.clone(), Some(&namespace)).unwrap();
        let fence = fence(&namespace, &config).await;
        let options = AcquireOptions {
            identity: Some(name.to_string()),
            pod: PodBinding::None,
            timeout: None,
            slot: None,
        };
        let fence_token = fence.clone();
        let outcome = run_while_leading(&leases, &fence, options, |client| async move {
            write_state(&client, &namespace, name)
                .await
                .unwrap_or_else(|e| panic!("{name}'s first write as leader: {e}"));
            led.send((name, client, fence_token.token())).await.unwrap();
            std::future::pending::<()>().await
        })
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        match outcome {
            Outcome::Lost(reason) => reason,
            Outcome::Finished(()) => unreachable!("the leader's code never returns"),
        }
    })
}

#[tokio::test]
async fn a_deposed_leaders_writes_are_refused_once_its_successor_leads() {
    let ns = support::setup("op-handover").await;
    let (_release, config) = fenced_operator(&ns).await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    LeaseClient::from_config(config.clone(), Some(&ns.name))
        .unwrap()
        .ensure_lease(LEASE, 30)
        .await
        .unwrap();

    let (led, mut leaders) = mpsc::channel(2);
    let first = candidate(&ns, &config, "first", led.clone());
    let (name, deposed, old_token) = tokio::time::timeout(Duration::from_secs(60), leaders.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name, "first");
    let second = candidate(&ns, &config, "second", led);

    // Revoke the first leader: its claim is deleted, the controller grants the second.
    let claims = ns.api::<LeaseClaim>();
    let held = claims.list(&ListParams::default()).await.unwrap();
    let first_claim = held
        .items
        .iter()
        .find(|c| c.spec.holder_identity == "first")
        .expect("the first leader's claim");
    claims
        .delete(
            &first_claim.metadata.name.clone().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        reason,
        LostReason::ClaimDeleted,
        "the first leader learns its grant ended"
    );

    let Some((name, _, new_token)) = tokio::time::timeout(Duration::from_secs(60), leaders.recv())
        .await
        .unwrap()
    else {
        let lease = ns.api::<palisade::crd::Lease>().get_opt(LEASE).await;
        panic!(
            "the second candidate stopped before leading: {:?}; lease {lease:?}",
            second.await
        );
    };
    assert_eq!(name, "second");
    assert!(
        new_token > old_token,
        "tokens increase: {old_token} then {new_token}"
    );
    let state = ns.api::<ConfigMap>().get("state").await.unwrap();
    assert_eq!(state.data.unwrap()["by"], "second");

    // The deposed leader's client still stamps its old token: refused, naming both.
    let status = refusal(
        "the deposed leader's write",
        write_state(&deposed, &ns.name, "first").await,
    );
    assert!(
        status
            .message
            .contains(&format!("stale fencing token {old_token}"))
            && status
                .message
                .contains(&format!("current token {new_token}")),
        "{}",
        status.message
    );
    let state = ns.api::<ConfigMap>().get("state").await.unwrap();
    assert_eq!(
        state.data.unwrap()["by"],
        "second",
        "the second leader's write stands"
    );
    second.abort();
}
