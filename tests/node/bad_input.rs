//! Bad input on the node fails with an error a user can act on: an image the
//! registry lacks, a wrong-typed chart value, a ServiceAccount without the client
//! RoleBinding.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use support::helm::{oci_chart, test_registry};
use support::tools::text;

use crate::{
    event_naming, example_image, exited, pod_namespace, restricted_pod, run, wait_pod,
    waiting_reason,
};

/// An image the registry does not have, by tag or by digest: the pod waits in
/// ErrImagePull or ImagePullBackOff, and both its status and the kubelet's event name the
/// image, which is what a user fixes (image.repository, image.tag or image.digest, as the
/// chart's notes and README.md say).
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_tag_or_digest_fails_with_an_event_naming_the_image() {
    const NS: &str = "palisade-pull-errors";
    let client = support::client().await;
    pod_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let registry = test_registry();
    let missing = [
        (
            "missing-tag",
            format!("{registry}/palisade-example:does-not-exist"),
        ),
        (
            "missing-digest",
            format!("{registry}/palisade-example@sha256:{}", "0".repeat(64)),
        ),
    ];
    for (name, image) in &missing {
        pods.create(
            &PostParams::default(),
            &restricted_pod(name, image, "default", &["true"]),
        )
        .await
        .unwrap();
    }
    for (name, image) in &missing {
        let p = wait_pod(
            &client,
            NS,
            name,
            "ErrImagePull or ImagePullBackOff",
            Duration::from_secs(60),
            |p| {
                waiting_reason(p)
                    .is_some_and(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
            },
        )
        .await;
        let (reason, message) = waiting_reason(&p).unwrap();
        assert!(
            message.contains(image.as_str()),
            "{name}: the pod's {reason} message does not name {image}: {message}"
        );
        let event = event_naming(&client, NS, name, "Failed", image).await;
        println!("{name}: pod waits in {reason}; event: {event}");
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::background())
        .await;
}

/// Bad input fails with an error a user can act on, never a hang: a chart value of the
/// wrong type, a workload whose ServiceAccount lacks the client RoleBinding (an image the
/// registry lacks: a_missing_tag_or_digest_fails_with_an_event_naming_the_image).
#[tokio::test(flavor = "multi_thread")]
async fn bad_input_in_the_cluster_fails_with_an_actionable_error() {
    const NS: &str = "palisade-bad-input";
    let client = support::client().await;
    support::install_crds().await;
    pod_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();

    // A chart value of the wrong type: refused before anything is created.
    let (chart, version) = oci_chart();
    let t = Instant::now();
    let out = run(
        "helm",
        &[
            "install",
            "palisade-bad",
            &chart,
            "--version",
            &version,
            "--plain-http",
            "-n",
            NS,
            "--set",
            "replicaCount=two",
        ],
    );
    assert!(
        !out.status.success(),
        "helm accepted replicaCount=two: {}",
        text(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    println!(
        "wrong-typed value ({:.1}s): {}",
        t.elapsed().as_secs_f64(),
        err.trim()
    );
    assert!(
        err.contains("replicaCount"),
        "the error does not name the value: {err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "helm took {:?}",
        t.elapsed()
    );

    // `palisade lock` from a ServiceAccount without the palisade-client RoleBinding.
    let image = example_image();
    pods.create(
        &pp,
        &restricted_pod(
            "no-rolebinding",
            &image,
            "default",
            &[
                "palisade",
                "lock",
                "ledger",
                "--timeout",
                "20s",
                "--",
                "true",
            ],
        ),
    )
    .await
    .unwrap();
    let p = wait_pod(
        &client,
        NS,
        "no-rolebinding",
        "the container to exit",
        Duration::from_secs(60),
        exited,
    )
    .await;
    let term = p.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    let logs = pods
        .logs("no-rolebinding", &Default::default())
        .await
        .unwrap();
    println!("no RoleBinding: exit {}: {}", term.exit_code, logs.trim());
    assert_eq!(term.exit_code, 1, "expected exit 1 (API error): {logs}");
    assert!(
        logs.to_lowercase().contains("forbidden"),
        "the error does not say forbidden: {logs}"
    );

    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::background())
        .await;
}
