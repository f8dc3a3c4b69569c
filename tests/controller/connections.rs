//! The controller behind a fault proxy: a silently dead connection, a leader cut
//! off, a slow API server.

use std::time::{Duration, Instant};

use support::claims::{create_claim, create_lease, delete_claim, wait_holder};
use support::proxy;
use support::{ControllerProcess, TestNamespace, setup, wait_lease};

use crate::{elected, wait_leading};

/// A `palisade controller` for `ns` whose API connections all go through `proxy`.
async fn controller_via(
    proxy: &proxy::Proxy,
    ns: &TestNamespace,
    extra: &[&str],
) -> ControllerProcess {
    let path = support::kubeconfig_through(proxy, &ns.name);
    ControllerProcess::start_with_kubeconfig(&ns.name, &path, extra).await
}

/// Every connection the controller has open goes silent (no FIN,
/// no RST); new ones work. The controller must notice within seconds, not after the
/// kernel's TCP timeout: a release is handed over long before the 60 s lease could
/// expire.
#[tokio::test]
async fn a_silently_dead_connection_costs_the_controller_seconds() {
    let ns = setup("blackhole").await;
    let proxy = proxy::Proxy::start(support::apiserver_port())
        .await
        .unwrap();
    let _controller = controller_via(&proxy, &ns, &["--leader-elect=false"]).await;
    create_lease(&ns, "db", 60).await;
    create_claim(&ns, "a", "db", None).await;
    wait_holder(&ns, "db", "a").await;
    create_claim(&ns, "b", "db", None).await;
    wait_lease(&ns, "db", "b waiting", |l| {
        l.status.as_ref().is_some_and(|s| s.waiting == ["b"])
    })
    .await;

    proxy.set(proxy::Mode::Blackhole);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set(proxy::Mode::Pass);
    let silenced = Instant::now();
    delete_claim(&ns, "a").await;
    wait_holder(&ns, "db", "b").await;
    assert!(
        silenced.elapsed() < Duration::from_secs(15),
        "handed over {:?} after the connections went silent",
        silenced.elapsed()
    );
}

/// A leader whose API connections all go silent must give up leadership once its
/// renewal has failed, not hang on a call for minutes; it steps down and stands by
/// (the process keeps running, caches warm) instead of exiting.
#[tokio::test]
async fn a_leader_cut_off_silently_steps_down_on_time() {
    let ns = setup("blackhole-leader").await;
    let proxy = proxy::Proxy::start(support::apiserver_port())
        .await
        .unwrap();
    let args = elected(&ns);
    let mut leader = controller_via(&proxy, &ns, &args).await;
    let admin_port = leader.admin_port;
    wait_leading(admin_port, true).await;
    proxy.set(proxy::Mode::Blackhole);
    let silenced = Instant::now();
    // The admin server is local: only the API connections are cut.
    wait_leading(admin_port, false).await;
    let stepped_down = silenced.elapsed();
    proxy.set(proxy::Mode::Pass);
    assert!(
        leader.child.try_wait().unwrap().is_none(),
        "stepping down keeps the process running"
    );
    // Its renewal fails after the 5 s attempt deadline (a slow answer would have kept
    // it leading), past the 750 ms renew deadline: nowhere near the minutes of a TCP
    // timeout; slack for a loaded machine.
    assert!(
        stepped_down < palisade::controller::election::ATTEMPT_DEADLINE + Duration::from_secs(3),
        "{stepped_down:?}"
    );
    // Connections back: the record is still ours (or free), so it leads again.
    wait_leading(admin_port, true).await;
}

/// A slow API server costs the election latency, not leadership: with every chunk of
/// every connection held 400 ms each way, each call takes about a second, longer
/// than the 750 ms renew deadline and close to the 1 s election lease. One of two
/// replicas leads and grants, and leadership does not move back and forth.
#[tokio::test]
async fn a_slow_api_server_costs_latency_not_leadership() {
    use k8s_openapi::api::coordination::v1::Lease as ElectionRecord;

    let ns = setup("election-slow").await;
    let proxy = proxy::Proxy::start(support::apiserver_port())
        .await
        .unwrap();
    let args = elected(&ns);
    let a = controller_via(&proxy, &ns, &args).await;
    let b = controller_via(&proxy, &ns, &args).await;
    create_lease(&ns, "slow", 60).await;
    proxy.set(proxy::Mode::Delay(Duration::from_millis(400)));
    let slowed = Instant::now();
    create_claim(&ns, "first", "slow", None).await;
    wait_holder(&ns, "slow", "first").await;
    let granted = slowed.elapsed();

    // From the first grant on, for 10 s: someone leads, and the record changes hands
    // at most once (a leader that stepped down just as the delay began).
    let records = ns.api::<ElectionRecord>();
    let transitions = |r: &ElectionRecord| r.spec.as_ref().and_then(|s| s.lease_transitions);
    let before = transitions(&records.get("palisade-controller").await.unwrap());
    let mut leaderless = Duration::ZERO;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(10) {
        let sample = Instant::now();
        let leading = a.metric("palisade_is_leader").await + b.metric("palisade_is_leader").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if leading == 0.0 {
            leaderless += sample.elapsed();
        }
    }
    let after = transitions(&records.get("palisade-controller").await.unwrap());
    proxy.set(proxy::Mode::Pass);
    assert!(
        granted < Duration::from_secs(15),
        "the first grant took {granted:?} behind the slow API server"
    );
    assert!(
        after.unwrap_or(0) - before.unwrap_or(0) <= 1,
        "leadership changed hands {:?} -> {:?} times in 10 s",
        before,
        after
    );
    assert!(
        leaderless < Duration::from_secs(2),
        "no replica led for {leaderless:?} of 10 s"
    );
}
