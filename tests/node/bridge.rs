//! The node's pod network: deleting pods never cuts the others off from the API
//! server.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::{example_image, pod_namespace, restricted_pod, wait_pod, wait_until};

/// Deleting pods never cuts the others off from the API server. A Linux bridge without
/// an address of its own takes the lowest one among its ports and changes it when a
/// port comes or goes; the pods keep the old gateway address cached and lose the API
/// server (and the kubelet's probes) for about 30 s. Four pods ask for /readyz every
/// 200 ms; three are deleted one by one; the survivor must keep being answered, and the
/// bridge's address must not change while pods come and go.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_pods_keeps_the_other_pods_reaching_the_api_server() {
    use k8s_openapi::jiff::Timestamp;
    const NS: &str = "palisade-bridge";
    let bridge_address = || {
        std::fs::read_to_string("/sys/class/net/palisade0/address")
            .expect("the node's bridge palisade0 exists")
    };
    let client = support::client().await;
    pod_namespace(&client, NS).await;
    let before = bridge_address();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // No --request-timeout: with any flag that overrides the config, kubectl stops
    // using the in-cluster one.
    let probe = "while true; do \
        if timeout 2 kubectl get --raw /readyz >/dev/null 2>&1; \
        then echo ok; else echo fail; fi; sleep 0.2; done";
    let names = ["p0", "p1", "p2", "survivor"];
    let image = example_image();
    for name in names {
        pods.create(
            &PostParams::default(),
            &restricted_pod(name, &image, "default", &["/bin/sh", "-c", probe]),
        )
        .await
        .unwrap();
    }
    for name in names {
        wait_pod(&client, NS, name, "running", Duration::from_secs(60), |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await;
    }
    let first_deletion = Timestamp::now();
    for name in &names[..3] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        wait_until(
            &format!("pod {name} gone"),
            Duration::from_secs(60),
            || async { pods.get_opt(name).await.unwrap().is_none() },
        )
        .await;
    }
    // Watch the survivor for 12 s after the last deletion.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let watched_until = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(1);
    let logs = pods
        .logs(
            "survivor",
            &kube::api::LogParams {
                timestamps: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let answered: Vec<Timestamp> = logs
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, verdict)| *verdict == "ok")
        .filter_map(|(at, _)| at.parse().ok())
        .filter(|at| *at >= first_deletion)
        .collect();
    let after = bridge_address();
    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::background())
        .await;
    assert_eq!(before, after, "the bridge's address changed");
    // No gap of more than 3 s between answers from the first deletion to the end.
    let mut last = first_deletion;
    for at in answered.iter().copied().chain([watched_until]) {
        let gap = at.duration_since(last);
        assert!(
            gap < k8s_openapi::jiff::SignedDuration::from_secs(3),
            "the survivor got no answer from the API server for {gap:?} after {last} \
             (pods deleted from {first_deletion}); its log:\n{logs}"
        );
        last = at.max(last);
    }
}
