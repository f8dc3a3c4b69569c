//! `palisade status`, and both commands on a silently dead connection.

use std::time::{Duration, Instant};

use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::crd::Lease;
use support::{TestNamespace, palisade_on_cluster, wait_lease};
use tokio::time::timeout;

use crate::{describe, hold, output, setup};

#[tokio::test]
async fn status_shows_holder_token_and_the_queue_in_grant_order() {
    let (ns, _controller) = setup("lock-status").await;
    let holder = hold(&ns, "board", "holder-a").await;
    let leases = LeaseClient::new(ns.client.clone(), &ns.name);
    let waiters: Vec<_> = ["w-1", "w-2"]
        .into_iter()
        .map(|identity| {
            let leases = leases.clone();
            tokio::spawn(async move {
                let options = AcquireOptions {
                    identity: Some(identity.into()),
                    pod: PodBinding::None,
                    timeout: None,
                    slot: None,
                };
                leases.acquire("board", options).await
            })
        })
        .collect();
    wait_lease(&ns, "board", "two waiters", |l| {
        l.status.as_ref().and_then(|s| s.waiting_count) == Some(2)
    })
    .await;
    let lease = ns.api::<Lease>().get("board").await.unwrap();
    let status = lease.status.unwrap();

    let out = output(palisade_on_cluster().args(["status", "-n", &ns.name])).await;
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "HOLDER", "TOKEN", "PHASE", "WAITING"],
        "{text}"
    );
    let token = holder.token().to_string();
    assert_eq!(
        lines[1],
        ["board", "holder-a", &token, "Held", "2"],
        "{text}"
    );

    let out = output(palisade_on_cluster().args(["status", "-n", &ns.name, "board"])).await;
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let queue: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("POSITION"))
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(queue, status.waiting, "the controller's order:\n{text}");

    let out = output(palisade_on_cluster().args(["status", "-n", &ns.name, "missing"])).await;
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    for waiter in waiters {
        waiter.abort();
    }
    holder.release().await.unwrap();
}

#[tokio::test]
async fn status_and_lock_give_up_within_seconds_on_a_silently_dead_connection() {
    support::install_crds().await;
    let ns = TestNamespace::new("lock-dead").await;
    let (_, proxy) = support::proxied_config(&ns.name).await;
    proxy.set(support::proxy::Mode::Blackhole);
    let mut kubeconfig = support::kubeconfig();
    for cluster in &mut kubeconfig.clusters {
        if let Some(c) = cluster.cluster.as_mut() {
            c.server = Some(proxy.url());
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();

    let started = Instant::now();
    let out = timeout(
        Duration::from_secs(60),
        palisade_on_cluster()
            .env("KUBECONFIG", &path)
            .args(["status", "-n", &ns.name])
            .output(),
    )
    .await
    .expect("palisade status finished")
    .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(took < Duration::from_secs(10), "status took {took:?}");

    let started = Instant::now();
    let out = timeout(
        Duration::from_secs(60),
        palisade_on_cluster()
            .env("KUBECONFIG", &path)
            .args(["lock", "-n", &ns.name, "dead", "--", "true"])
            .output(),
    )
    .await
    .expect("palisade lock finished")
    .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(took < Duration::from_secs(10), "lock took {took:?}");
}
