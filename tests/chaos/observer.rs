//! The harness's own watches (straight to the API server, no proxy; on the HA plane,
//! one through each API server): every version of the Leases, the fenced ConfigMaps
//! and the operator workers' objects they deliver, recorded for the checker.

use std::path::PathBuf;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use palisade::crd::Lease;

use crate::cluster::NAMESPACE;
use crate::history::{Event, Recorder};
use crate::rng::now_ns;

/// Records every version of the Leases and fenced ConfigMaps that the harness's
/// own watches through `admin` deliver, tagged with `server` (the API server it
/// reaches on the HA plane).
pub async fn observe(admin: Client, out: PathBuf, server: Option<u8>) {
    let lease_api: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let cm_api: Api<ConfigMap> = Api::namespaced(admin, NAMESPACE);
    let mut lease_log = Recorder::create(&out.join("observed-leases.jsonl")).expect("log");
    let mut cm_log = Recorder::create(&out.join("observed-configmaps.jsonl")).expect("log");
    let leases = watcher::watcher(lease_api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let cms = watcher::watcher(
        cm_api,
        watcher::Config::default().labels("palisade.dev/fenced-by"),
    )
    .default_backoff()
    .boxed();
    let mut both = futures::stream::select(
        leases.map(|e| e.map(|e| (Some(e), None))),
        cms.map(|e| e.map(|e| (None, Some(e)))),
    );
    while let Some(event) = both.next().await {
        let t_ns = now_ns();
        match event {
            Ok((Some(watcher::Event::Apply(l) | watcher::Event::InitApply(l)), _)) => {
                for seen in lease_seen(&l, t_ns, server) {
                    lease_log.record(&seen);
                }
            }
            Ok((_, Some(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)))) => {
                let Some(lease) = cm.labels().get("palisade.dev/fenced-by").cloned() else {
                    continue;
                };
                let token = cm
                    .annotations()
                    .get("palisade.dev/fencing-token")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                // A label that is no slot would have been refused: -1 shows it.
                let slot = cm
                    .labels()
                    .get("palisade.dev/fenced-slot")
                    .map_or(0, |s| s.parse().unwrap_or(-1));
                cm_log.record(&Event::ConfigMapSeen {
                    lease,
                    slot,
                    name: cm.name_any(),
                    rv: rv_of(&cm),
                    token,
                    t_ns,
                });
            }
            _ => {} // list boundaries, deletions, and errors the backoff retries
        }
    }
}

/// Records every version of the operator workers' Lease and objects (operator_worker.rs)
/// that the harness's own watches through `admin` deliver (an object's with the token
/// its content names; versions no operator wrote yet name none and are left out),
/// tagged with `server` as [`observe`] does.
pub async fn observe_operator_objects(admin: Client, out: PathBuf, server: Option<u8>) {
    use crate::operator_worker::{
        self as op, OPERATOR_LEASE, OPERATOR_NAMESPACE, STATE_CONFIGMAP, TARGET_DEPLOYMENT,
    };
    enum Seen {
        Lease(Box<Lease>),
        Object(String, u64, Option<u64>),
    }
    let mut lease_log = Recorder::create(&out.join("observed-leases.jsonl")).expect("log");
    let mut log = Recorder::create(&out.join("observed-operator-objects.jsonl")).expect("log");
    let one = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let leases = watcher::watcher(
        Api::<Lease>::namespaced(admin.clone(), OPERATOR_NAMESPACE),
        one(OPERATOR_LEASE),
    )
    .default_backoff()
    .applied_objects()
    .map(|l| l.map(|l| Seen::Lease(Box::new(l))));
    let configmaps = watcher::watcher(
        Api::<ConfigMap>::namespaced(admin.clone(), OPERATOR_NAMESPACE),
        one(STATE_CONFIGMAP),
    )
    .default_backoff()
    .applied_objects()
    .map(|cm| cm.map(|cm| Seen::Object(op::state_object(), rv_of(&cm), op::token_of_state(&cm))));
    let deployments = watcher::watcher(
        Api::<Deployment>::namespaced(admin, OPERATOR_NAMESPACE),
        one(TARGET_DEPLOYMENT),
    )
    .default_backoff()
    .applied_objects()
    .map(|d| d.map(|d| Seen::Object(op::status_object(), rv_of(&d), op::token_of_status(&d))));
    let mut all =
        futures::stream::select_all([leases.boxed(), configmaps.boxed(), deployments.boxed()]);
    while let Some(seen) = all.next().await {
        let t_ns = now_ns();
        match seen {
            Ok(Seen::Lease(lease)) => {
                for seen in lease_seen(&lease, t_ns, server) {
                    lease_log.record(&seen);
                }
            }
            Ok(Seen::Object(object, rv, Some(token))) => log.record(&Event::OperatorObjectSeen {
                object,
                rv,
                token,
                t_ns,
            }),
            // Versions no operator wrote yet, and errors the backoff retries.
            _ => {}
        }
    }
}

/// What the checker needs of a version of a Lease: each slot it records (a lock's
/// one), with its holder and token.
fn lease_seen(lease: &Lease, t_ns: u64, server: Option<u8>) -> Vec<Event> {
    let status = lease.status.clone().unwrap_or_default();
    status
        .slot_rows()
        .into_iter()
        .map(|row| Event::LeaseSeen {
            lease: lease.name_any(),
            slot: row.slot,
            rv: rv_of(lease),
            holder_uid: row.holder.map(|h| h.claim_uid).unwrap_or_default(),
            token: row.fencing_token.unwrap_or(0) as u64,
            t_ns,
            server,
        })
        .collect()
}

fn rv_of<K: ResourceExt>(object: &K) -> u64 {
    object
        .resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}
