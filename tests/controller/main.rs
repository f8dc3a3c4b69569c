//! The lease controller against the real API server: grants, FIFO, tokens,
//! expiry, release, revocation, restarts and split brain.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use palisade::crd::{Lease, LeaseClaim};
use serde_json::json;
use support::claims::{create_claim, delete_claim, wait_holder};
use support::{TestNamespace, WAIT};

mod admin;
mod connections;
mod election;
mod holders;
mod semaphores;
mod tokens;

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

async fn renew(ns: &TestNamespace, claim: &str) {
    let patch = json!({"spec": {"renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    ns.api::<LeaseClaim>()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("renew");
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
