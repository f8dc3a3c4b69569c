//! The harness's own watches (straight to the API server, no proxy; on the HA plane,
//! one through each API server): every version of the Leases and fenced ConfigMaps
//! they deliver, recorded for the checker.

use std::path::PathBuf;

use futures::StreamExt;
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
                let status = l.status.clone().unwrap_or_default();
                lease_log.record(&Event::LeaseSeen {
                    lease: l.name_any(),
                    rv: rv_of(&l),
                    holder_uid: status.holder.map(|h| h.claim_uid).unwrap_or_default(),
                    token: status.fencing_token.unwrap_or(0) as u64,
                    t_ns,
                    server,
                });
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
                cm_log.record(&Event::ConfigMapSeen {
                    lease,
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

fn rv_of<K: ResourceExt>(object: &K) -> u64 {
    object
        .resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}
