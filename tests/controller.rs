//! The lease controller against the real API server: grants, FIFO, tokens,
//! expiry, release, revocation, restarts and split brain.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use palisade::crd::{ClaimPhase, Lease, LeaseClaim, LeasePhase};
use serde_json::json;
use support::claims::{create_claim, create_lease, delete_claim, wait_claim_phase, wait_holder};
use support::proxy;
use support::{
    ControllerProcess, TestNamespace, WAIT, create_pod, holder_claim, setup, token, wait_lease,
};

/// Records every version of every Lease and claim status in the namespace, to check
/// afterwards that no token was published for two claims.
struct History {
    /// token -> claim UIDs it was published for (Lease holder or claim mirror)
    owners: Arc<Mutex<BTreeMap<i64, std::collections::BTreeSet<String>>>>,
    lease_tokens: Arc<Mutex<Vec<(String, i64, i64)>>>,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl History {
    fn start(ns: &TestNamespace) -> Self {
        let owners: Arc<Mutex<BTreeMap<i64, std::collections::BTreeSet<String>>>> =
            Default::default();
        let lease_tokens: Arc<Mutex<Vec<(String, i64, i64)>>> = Default::default();
        let (o1, t1) = (owners.clone(), lease_tokens.clone());
        let leases = ns.api::<Lease>();
        let a = tokio::spawn(async move {
            let mut s = watcher::watcher(leases, watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = s.next().await {
                if let watcher::Event::Apply(l) | watcher::Event::InitApply(l) = ev
                    && let Some(st) = &l.status
                    && let (Some(h), Some(t)) = (&st.holder, st.fencing_token)
                {
                    o1.lock()
                        .unwrap()
                        .entry(t)
                        .or_default()
                        .insert(h.claim_uid.clone());
                    let rv: i64 = l.resource_version().unwrap().parse().unwrap();
                    t1.lock().unwrap().push((l.name_any(), rv, t));
                }
            }
        });
        let o2 = owners.clone();
        let claims = ns.api::<LeaseClaim>();
        let b = tokio::spawn(async move {
            let mut s = watcher::watcher(claims, watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = s.next().await {
                if let watcher::Event::Apply(c) | watcher::Event::InitApply(c) = ev
                    && let Some(t) = c.status.as_ref().and_then(|s| s.fencing_token)
                {
                    o2.lock()
                        .unwrap()
                        .entry(t)
                        .or_default()
                        .insert(c.uid().unwrap());
                }
            }
        });
        Self {
            owners,
            lease_tokens,
            _tasks: vec![a, b],
        }
    }

    /// Every token belongs to exactly one claim, and a Lease's token never goes down as its versions go up.
    fn assert_consistent(&self) {
        for (token, uids) in self.owners.lock().unwrap().iter() {
            assert_eq!(
                uids.len(),
                1,
                "token {token} was published for several claims: {uids:?}"
            );
        }
        let mut seen = self.lease_tokens.lock().unwrap().clone();
        seen.sort();
        for pair in seen.windows(2) {
            let same_lease = pair[0].0 == pair[1].0;
            assert!(
                !same_lease || pair[0].2 <= pair[1].2,
                "token went down between lease versions: {pair:?}"
            );
        }
    }
}

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

async fn renew(ns: &TestNamespace, claim: &str) {
    let patch = json!({"spec": {"renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    ns.api::<LeaseClaim>()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("renew");
}

#[tokio::test]
async fn a_renewing_holder_keeps_the_lease_and_a_silent_one_expires() {
    let ns = setup("expiry").await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "short", 2).await;
    create_claim(&ns, "renewer", "short", None).await;
    let t = token(&wait_holder(&ns, "short", "renewer").await);
    create_claim(&ns, "next", "short", None).await;

    // Renew every 500 ms for 5 s (2.5 durations): still the holder, same token.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        renew(&ns, "renewer").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lease = ns.api::<Lease>().get("short").await.unwrap();
    assert_eq!(holder_claim(&lease).as_deref(), Some("renewer"));
    assert_eq!(token(&lease), t);

    // Stop renewing: expired after about the duration, and the waiter is granted.
    let stopped = Instant::now();
    let lease = wait_holder(&ns, "short", "next").await;
    let waited = stopped.elapsed();
    assert!(
        waited >= Duration::from_millis(1400),
        "expired too early: {waited:?}"
    );
    assert!(token(&lease) > t);
    let old = wait_claim_phase(&ns, "renewer", ClaimPhase::Expired).await;
    assert_eq!(old.status.unwrap().fencing_token, Some(t));
    assert_eq!(
        controller
            .settled_metric("palisade_expirations_total", 1.0)
            .await,
        1.0
    );
}

#[tokio::test]
async fn deleting_the_holders_pod_revokes_without_waiting_for_expiry() {
    let ns = setup("revoke").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let pod = create_pod(&ns, "worker-0").await;
    create_lease(&ns, "guarded", 600).await;
    create_claim(
        &ns,
        "worker-0",
        "guarded",
        Some(("worker-0", &pod.uid().unwrap())),
    )
    .await;
    let t = token(&wait_holder(&ns, "guarded", "worker-0").await);
    create_claim(&ns, "standby", "guarded", None).await;
    wait_lease(&ns, "guarded", "a waiter", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(1))
    })
    .await;

    let deleted = Instant::now();
    ns.api::<Pod>()
        .delete("worker-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let lease = wait_holder(&ns, "guarded", "standby").await;
    assert!(
        deleted.elapsed() < Duration::from_secs(10),
        "revocation waited for {:?}",
        deleted.elapsed()
    );
    assert!(token(&lease) > t);
    let old = wait_claim_phase(&ns, "worker-0", ClaimPhase::Revoked).await;
    let status = old.status.unwrap();
    let granted = status.conditions.iter().find(|c| c.type_ == "Granted");
    let message = &granted
        .unwrap_or_else(|| panic!("no Granted condition: {status:?}"))
        .message;
    assert!(
        message.contains("worker-0"),
        "the reason names the pod: {message}"
    );
}

/// Churns claims on one Lease: each round adds a waiter and releases the holder.
async fn churn(ns: &TestNamespace, lease: &str, rounds: usize, prefix: &str) {
    create_claim(ns, &format!("{prefix}-0"), lease, None).await;
    wait_holder(ns, lease, &format!("{prefix}-0")).await;
    for i in 1..=rounds {
        create_claim(ns, &format!("{prefix}-{i}"), lease, None).await;
        delete_claim(ns, &format!("{prefix}-{}", i - 1)).await;
        wait_holder(ns, lease, &format!("{prefix}-{i}")).await;
    }
}

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

#[tokio::test]
async fn an_unreadable_claim_is_reported_and_does_not_wedge_the_controller() {
    let ns = setup("unreadable").await;
    // Valid for the API server (RFC 3339 allows any number of fraction digits), but
    // more than the nanoseconds a Kubernetes client can read.
    let unreadable: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": "garbled"},
        "spec": {"leaseName": "sturdy", "holderIdentity": "garbled", "renewTime": "2026-11-29T10:00:00.1234567891Z"}
    }))
    .unwrap();
    let resource = kube::discovery::ApiResource::erase::<LeaseClaim>(&());
    Api::<kube::api::DynamicObject>::namespaced_with(ns.client.clone(), &ns.name, &resource)
        .create(&PostParams::default(), &unreadable)
        .await
        .expect("the API server accepts the claim");
    create_lease(&ns, "sturdy", 15).await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_claim(&ns, "fine", "sturdy", None).await;
    wait_holder(&ns, "sturdy", "fine").await;
    assert_eq!(
        controller.metric("palisade_invalid_objects_total").await,
        1.0
    );
    let events = ns.api::<k8s_openapi::api::core::v1::Event>();
    let deadline = Instant::now() + WAIT;
    loop {
        let list = events.list(&Default::default()).await.unwrap();
        if list.items.iter().any(|e| {
            e.reason.as_deref() == Some("InvalidObject")
                && e.involved_object.name.as_deref() == Some("garbled")
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no InvalidObject event on the unreadable claim"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client whose LeaseClaim watches never answer: the controller lists the claims
/// once and then hears nothing more of them (a claim watch cut while the Lease watch
/// and writes work, as after a failover or a link that healed for some streams only).
fn stalled_claim_watch(inner: kube::Client) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        async move {
            let uri = request.uri();
            let claim_watch = uri.path().ends_with("/leaseclaims")
                && uri
                    .query()
                    .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
            if claim_watch {
                futures::future::pending::<()>().await;
            }
            inner.send(request).await
        }
    });
    kube::Client::new(service, "default")
}

/// A holder whose renewals land must keep its grant, whatever the
/// controller's caches say; once it stops renewing, it still expires.
#[tokio::test]
async fn a_renewing_holder_keeps_the_lease_while_the_controllers_claim_watch_is_stalled() {
    let ns = setup("stale-claims").await;
    create_lease(&ns, "db", 2).await;
    create_claim(&ns, "holder", "db", None).await;
    create_claim(&ns, "next", "db", None).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (_leading_tx, leading) = tokio::sync::watch::channel(true);
    let controller = tokio::spawn(palisade::controller::run(
        palisade::kube_client::ControllerClients::unpinged(stalled_claim_watch(
            support::client().await,
        )),
        palisade::controller::ControllerConfig {
            namespace: Some(ns.name.clone()),
            concurrency: 4,
            instance: "stalled-claim-watch".into(),
        },
        Arc::new(palisade::controller::metrics::Metrics::default()),
        palisade::admin::Readiness::default(),
        leading,
        shutdown.clone(),
    ));
    let granted = wait_holder(&ns, "db", "holder").await;
    // Renew every third of the duration, straight to the API server, for three durations.
    let leases = ns.api::<Lease>();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        renew(&ns, "holder").await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let lease = leases.get("db").await.expect("get lease");
        assert_eq!(
            holder_claim(&lease).as_deref(),
            Some("holder"),
            "a renewing holder lost its grant after {:?}: {:?}",
            start.elapsed(),
            lease.status
        );
        assert_eq!(token(&lease), token(&granted));
    }
    let claim = ns.api::<LeaseClaim>().get("holder").await.unwrap();
    assert_eq!(
        claim.status.and_then(|s| s.phase),
        Some(ClaimPhase::Granted)
    );
    // Silent from now on: expired within its duration and a little, handed to the waiter.
    let silent = Instant::now();
    wait_holder(&ns, "db", "next").await;
    assert!(
        silent.elapsed() < Duration::from_secs(6),
        "{:?}",
        silent.elapsed()
    );
    wait_claim_phase(&ns, "holder", ClaimPhase::Expired).await;
    shutdown.cancel();
    controller.await.unwrap();
}

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

/// Flags of a controller replica that takes part in the election in `ns`.
fn elected(ns: &TestNamespace) -> [&str; 3] {
    [
        "--leader-elect=true",
        "--election-namespace",
        ns.name.as_str(),
    ]
}

/// Waits (bounded) until the controller at `admin_port` reports `palisade_is_leader`
/// as `leading`.
async fn wait_leading(admin_port: u16, leading: bool) {
    let want = format!("palisade_is_leader {}", u8::from(leading));
    let deadline = Instant::now() + WAIT;
    while !support::admin_get(admin_port, "/metrics")
        .await
        .is_ok_and(|m| m.lines().any(|l| l == want))
    {
        assert!(Instant::now() < deadline, "never saw {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// The duration a Lease's current grant was made with, as the controller recorded it
/// (`status.holder.leaseDurationSeconds`), read from the JSON.
fn recorded_duration(lease: &Lease) -> Option<i64> {
    serde_json::to_value(lease).unwrap()["status"]["holder"]["leaseDurationSeconds"].as_i64()
}

/// Edits `spec.leaseDurationSeconds` and waits until the controller has seen the edit.
async fn set_duration(ns: &TestNamespace, lease: &str, seconds: i64) {
    let edited = ns
        .api::<Lease>()
        .patch(
            lease,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseDurationSeconds": seconds}})),
        )
        .await
        .expect("edit leaseDurationSeconds");
    let generation = edited.metadata.generation;
    wait_lease(ns, lease, "the edit observed", |l| {
        l.status.as_ref().and_then(|s| s.observed_generation) == generation
    })
    .await;
}

/// A holder's client keeps the duration
/// its grant was observed with, so lowering `leaseDurationSeconds` (10 s to 2 s here)
/// while the holder is silent (its watch stalled: it neither renews nor sees the edit)
/// must not let the controller expire it before the granted duration has passed since
/// its last renewal. It does expire after that, and the next grant uses the new spec.
#[tokio::test]
async fn a_lowered_lease_duration_does_not_expire_a_holder_before_its_granted_duration() {
    let ns = setup("lowered").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "db", 10).await;
    create_claim(&ns, "holder", "db", None).await;
    let granted = wait_holder(&ns, "db", "holder").await;
    create_claim(&ns, "next", "db", None).await;
    wait_lease(&ns, "db", "a waiter", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.waiting_count == Some(1))
    })
    .await;

    // The holder's last renewal: its own deadline is two thirds of 10 s after it.
    let renewed = Instant::now();
    renew(&ns, "holder").await;
    set_duration(&ns, "db", 2).await;
    let leases = ns.api::<Lease>();
    while renewed.elapsed() < Duration::from_millis(6500) {
        let lease = leases.get("db").await.expect("get lease");
        assert_eq!(
            holder_claim(&lease).as_deref(),
            Some("holder"),
            "expired {:?} after its last renewal on the lowered duration, granted for 10s: {:?}",
            renewed.elapsed(),
            lease.status
        );
        assert_eq!(token(&lease), token(&granted));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let next = wait_holder(&ns, "db", "next").await;
    let waited = renewed.elapsed();
    assert!(
        waited >= Duration::from_millis(9900) && waited < Duration::from_secs(14),
        "expired {waited:?} after the last renewal; granted for 10s"
    );
    eprintln!("expired {waited:?} after the last renewal (granted for 10 s, spec lowered to 2 s)");
    wait_claim_phase(&ns, "holder", ClaimPhase::Expired).await;
    assert!(token(&next) > token(&granted));
    // Each grant recorded the duration it was made with.
    assert_eq!(
        recorded_duration(&granted),
        Some(10),
        "{:?}",
        granted.status
    );
    assert_eq!(recorded_duration(&next), Some(2), "{:?}", next.status);
}

/// The same across a controller restart: rule 4's fresh full duration is at least
/// the duration the grant was made with, which only the Lease status remembers.
#[tokio::test]
async fn a_restarted_controller_gives_a_holder_at_least_its_granted_duration() {
    let ns = setup("lowered-restart").await;
    let mut controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    create_lease(&ns, "db", 10).await;
    create_claim(&ns, "holder", "db", None).await;
    let granted = wait_holder(&ns, "db", "holder").await;
    create_claim(&ns, "next", "db", None).await;
    renew(&ns, "holder").await;
    set_duration(&ns, "db", 2).await;
    // Renewing within the lowered duration until the controller stops, then silent.
    renew(&ns, "holder").await;
    controller.kill();
    let _ = controller.child.wait().await;
    let restarted = Instant::now();
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;

    let leases = ns.api::<Lease>();
    while restarted.elapsed() < Duration::from_millis(6500) {
        let lease = leases.get("db").await.expect("get lease");
        assert_eq!(
            holder_claim(&lease).as_deref(),
            Some("holder"),
            "expired {:?} after the restart on the lowered duration, granted for 10s: {:?}",
            restarted.elapsed(),
            lease.status
        );
        assert_eq!(token(&lease), token(&granted));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_holder(&ns, "db", "next").await;
    let waited = restarted.elapsed();
    assert!(
        waited >= Duration::from_millis(9900) && waited < Duration::from_secs(15),
        "expired {waited:?} after the restart; granted for 10s"
    );
    eprintln!("expired {waited:?} after the restart (granted for 10 s, spec lowered to 2 s)");
}

/// `--admin-addr 127.0.0.1:0` asks the kernel for a port: the log must name the one
/// bound, or nobody can reach /metrics.
#[tokio::test]
async fn the_admin_server_logs_the_port_it_bound() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    support::install_crds().await;
    let ns = TestNamespace::new("admin-port").await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "controller",
            "--leader-elect=false",
            "--namespace",
            &ns.name,
        ])
        .args(["--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", support::kubeconfig_path())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut lines = futures::stream::select(tokio_stream_lines(stdout), tokio_stream_lines(stderr));
    let line = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next().await {
            if line.contains("admin server listening") {
                return line;
            }
        }
        panic!("the controller exited without logging its admin address");
    })
    .await
    .expect("the admin server logged its address");
    let addr: std::net::SocketAddr = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in {line:?}"))
        .trim_matches('"')
        .parse()
        .unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_ne!(addr.port(), 0, "{line}");
    let body = support::admin_get(addr.port(), "/healthz").await.unwrap();
    assert!(body.contains("ok"), "{body}");
}

fn tokio_stream_lines<R: tokio::io::AsyncBufRead + Unpin + Send + 'static>(
    lines: tokio::io::Lines<R>,
) -> futures::stream::BoxStream<'static, String> {
    futures::stream::unfold(lines, |mut lines| async move {
        let line = lines.next_line().await.ok()??;
        Some((line, lines))
    })
    .boxed()
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
