//! Restarts, standbys and split brain: tokens stay monotonic and a standby takes
//! over in time.

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, PostParams};
use palisade::crd::Lease;
use serde_json::json;
use support::claims::{create_claim, create_lease, delete_claim, wait_holder};
use support::{ControllerProcess, TestNamespace, setup, token, wait_lease};

use crate::{History, churn, elected, wait_leading};

#[tokio::test]
async fn a_restarted_controller_keeps_tokens_monotonic() {
    let ns = setup("restart").await;
    let history = History::start(&ns);
    create_lease(&ns, "durable", 15).await;
    let mut controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    churn(&ns, "durable", 10, "before").await;
    let before = token(&ns.api::<Lease>().get("durable").await.unwrap());
    controller.kill();
    let _ = controller.child.wait().await;
    // Work arrives while no controller runs.
    create_claim(&ns, "during", "durable", None).await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    // The holder from before the restart keeps its grant (fresh duration), so release it.
    delete_claim(&ns, "before-10").await;
    let lease = wait_holder(&ns, "durable", "during").await;
    assert!(token(&lease) > before);
    delete_claim(&ns, "during").await;
    churn(&ns, "durable", 10, "after").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    history.assert_consistent();
}

#[tokio::test]
async fn two_controllers_at_once_never_issue_a_token_twice() {
    let ns = setup("split-brain").await;
    let history = History::start(&ns);
    let a = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let b = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    for lease in ["sb-1", "sb-2"] {
        create_lease(&ns, lease, 15).await;
    }
    let (r1, r2) = tokio::join!(churn(&ns, "sb-1", 25, "x"), churn(&ns, "sb-2", 25, "y"));
    let _ = (r1, r2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    history.assert_consistent();
    let grants = a.metric("palisade_grants_total").await + b.metric("palisade_grants_total").await;
    let conflicts = a.metric("palisade_write_conflicts_total").await
        + b.metric("palisade_write_conflicts_total").await;
    println!("split brain: {grants} grants, {conflicts} write conflicts");
    // 2 leases x 26 claims: every grant published exactly once although both controllers tried.
    assert_eq!(grants, 52.0, "grants counted across both controllers");
    assert_eq!(
        a.metric("palisade_write_errors_total").await
            + b.metric("palisade_write_errors_total").await,
        0.0
    );
}

#[tokio::test]
async fn a_standby_takes_over_when_the_leader_stops() {
    let ns = setup("election").await;
    let args = elected(&ns);
    let mut leader = ControllerProcess::start(&ns.name, &args).await;
    create_lease(&ns, "ha", 15).await;
    create_claim(&ns, "one", "ha", None).await;
    wait_holder(&ns, "ha", "one").await;
    let standby = ControllerProcess::start(&ns.name, &args).await;
    assert_eq!(standby.metric("palisade_is_leader").await, 0.0);

    // SIGTERM: the leader releases the election lease, the standby takes over.
    let pid = leader.child.id().unwrap() as i32;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = leader.child.wait().await.unwrap();
    assert!(status.success(), "graceful shutdown exits 0: {status:?}");
    create_claim(&ns, "two", "ha", None).await;
    delete_claim(&ns, "one").await;
    wait_holder(&ns, "ha", "two").await;
    assert_eq!(standby.metric("palisade_is_leader").await, 1.0);
}

/// A leader that dies without releasing (SIGKILL) is replaced after the
/// election lease (1 s by default, not the 15 s of client-go's defaults), and the new
/// leader makes the grant the old one never saw.
#[tokio::test]
async fn a_standby_takes_over_within_seconds_when_the_leader_is_killed() {
    let ns = setup("election-kill").await;
    let args = elected(&ns);
    let mut leader = ControllerProcess::start(&ns.name, &args).await;
    wait_leading(leader.admin_port, true).await;
    let standby = ControllerProcess::start(&ns.name, &args).await;
    create_lease(&ns, "ha", 60).await;
    create_claim(&ns, "one", "ha", None).await;
    wait_holder(&ns, "ha", "one").await;
    create_claim(&ns, "two", "ha", None).await;
    wait_lease(&ns, "ha", "two waiting", |l| {
        l.status.as_ref().is_some_and(|s| s.waiting == ["two"])
    })
    .await;
    assert_eq!(standby.metric("palisade_is_leader").await, 0.0);

    leader.child.start_kill().unwrap();
    leader.child.wait().await.unwrap();
    let killed = Instant::now();
    delete_claim(&ns, "one").await;
    wait_holder(&ns, "ha", "two").await;
    let gap = killed.elapsed();
    assert_eq!(standby.metric("palisade_is_leader").await, 1.0);
    assert!(
        gap < Duration::from_secs(8),
        "the grant waited {gap:?} after the leader was killed"
    );
}

/// Found by the chaos suite: once the record it saw had expired, a standby whose
/// attempts failed at once retried without pause (over 1,000 times a second). Here
/// its credentials may read the election record once; then the binding is deleted,
/// and every later read is refused at once (RBAC: 403).
#[tokio::test]
async fn a_standby_whose_attempts_fail_at_once_retries_once_per_retry_period() {
    use k8s_openapi::api::coordination::v1::Lease as ElectionRecord;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use palisade::controller::election::{ElectionConfig, ElectionTimings, Elector};

    let ns = TestNamespace::new("election-refused").await;
    let pp = PostParams::default();
    let objects = [
        json!({"metadata": {"name": "read-only"}, "rules": [{"apiGroups": ["coordination.k8s.io"],
               "resources": ["leases"], "verbs": ["get", "list", "watch"]}]}),
        json!({"metadata": {"name": "standby"}}),
        json!({"metadata": {"name": "standby-read-only"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-only"},
               "subjects": [{"kind": "ServiceAccount", "name": "standby", "namespace": ns.name}]}),
    ];
    ns.api::<Role>()
        .create(&pp, &serde_json::from_value(objects[0].clone()).unwrap())
        .await
        .unwrap();
    ns.api::<ServiceAccount>()
        .create(&pp, &serde_json::from_value(objects[1].clone()).unwrap())
        .await
        .unwrap();
    ns.api::<RoleBinding>()
        .create(&pp, &serde_json::from_value(objects[2].clone()).unwrap())
        .await
        .unwrap();
    // Held by another replica with a 1 s lease that nobody renews.
    let record: ElectionRecord = serde_json::from_value(json!({
        "metadata": {"name": "election"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 1},
    }))
    .unwrap();
    ns.api::<ElectionRecord>()
        .create(&pp, &record)
        .await
        .unwrap();

    let token = support::accounts::service_account_token(&ns, "standby", None).await;
    let mut config = support::admin_config().await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let requests = support::requests::Recorded::default();
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&requests)
        .build();
    let mut elector = Elector::new(
        client,
        ElectionConfig {
            namespace: ns.name.clone(),
            name: "election".into(),
            identity: "me".into(),
            timings: ElectionTimings::default(),
        },
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.cancel();
    });
    let cut_off = async {
        while requests.taken().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ns.api::<RoleBinding>()
            .delete("standby-read-only", &DeleteParams::default())
            .await
            .unwrap();
    };
    let (led, ()) = tokio::join!(elector.acquire(&shutdown), cut_off);
    assert!(!led, "never leads");
    let calls = requests.taken().len();
    // One read, then one refused attempt per 250 ms for 5 s.
    assert!((15..=25).contains(&calls), "{calls} calls in 5 s");
}
