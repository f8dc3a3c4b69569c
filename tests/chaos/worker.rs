//! A worker process: over and over, it acquires one of the Leases through the
//! client library and writes to both fenced stores with the token of its grant.
//!
//! It is deliberately a bad citizen: it does not look at `Grant::lost` before
//! writing. A real program should, but no check can close the gap between the
//! check and the write (the process may stall right there); the fence must hold
//! without it, and this makes every pause past the lease produce stale writes.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::fence::{Fence, FenceError, FileStore};
use serde_json::json;

use crate::history::{Event, JournalWrite, Outcome, Recorder};
use crate::rng::{Rng, now_ns};

/// Stale-writer rounds per worker process (each at most three requests).
const STALE_ROUNDS: u32 = 3;

/// How long one write may take before its outcome counts as unknown.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct WorkerArgs {
    pub kubeconfig: PathBuf,
    pub namespace: String,
    pub leases: Vec<String>,
    pub identity: String,
    pub store: PathBuf,
    pub history: PathBuf,
    pub seed: u64,
    pub writes_per_grant: u64,
}

impl WorkerArgs {
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "worker".into(),
            self.kubeconfig.display().to_string(),
            self.namespace.clone(),
            self.leases.join(","),
            self.identity.clone(),
            self.store.display().to_string(),
            self.history.display().to_string(),
            self.seed.to_string(),
            self.writes_per_grant.to_string(),
        ]
    }

    pub fn from_args(args: &[String]) -> Result<Self, String> {
        let [
            kubeconfig,
            namespace,
            leases,
            identity,
            store,
            history,
            seed,
            writes,
        ] = args
        else {
            return Err(format!("worker: expected 8 arguments, got {args:?}"));
        };
        Ok(WorkerArgs {
            kubeconfig: kubeconfig.into(),
            namespace: namespace.clone(),
            leases: leases.split(',').map(str::to_string).collect(),
            identity: identity.clone(),
            store: store.into(),
            history: history.into(),
            seed: seed
                .parse()
                .map_err(|e| format!("worker seed {seed:?}: {e}"))?,
            writes_per_grant: writes
                .parse()
                .map_err(|e| format!("worker writes {writes:?}: {e}"))?,
        })
    }
}

pub async fn client_from(kubeconfig: &std::path::Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("reading {}: {e}", kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// The ConfigMap a Lease fences.
pub fn configmap_name(lease: &str) -> String {
    format!("fenced-{lease}")
}

pub async fn run(args: WorkerArgs) {
    let client = client_from(&args.kubeconfig).await;
    // Renewals and releases go into the history too (the timing contract's check).
    let client = crate::renewals::recording(client, &args.history, &args.identity);
    let leases = LeaseClient::new(client.clone(), &args.namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    let fence = Fence::new(FileStore::open(&args.store).expect("opening the file fence"));
    let mut history = Recorder::create(&args.history).expect("creating the history file");
    // PostgreSQL and Redis, when the harness passed their URLs (dbstores.rs).
    let mut databases = crate::dbstores::Stores::from_env(&args.identity);
    let mut rng = Rng::new(args.seed);
    let mut seq = 0u64;
    // Stale-writer rounds left (see `stale_writes`): bounded per worker process.
    let mut stale_rounds = STALE_ROUNDS;
    loop {
        let lease = &args.leases[rng.range(0, args.leases.len() as u64) as usize];
        let options = AcquireOptions {
            identity: Some(args.identity.clone()),
            pod: PodBinding::None,
            timeout: Some(Duration::from_secs(30)),
            slot: None,
        };
        let grant = match leases.acquire(lease, options).await {
            Ok(grant) => grant,
            Err(e) => {
                eprintln!("{}: acquire {lease}: {e}", args.identity);
                tokio::time::sleep(rng.millis(100, 500)).await;
                continue;
            }
        };
        let token = grant.token() as u64;
        history.record(&Event::Grant {
            worker: args.identity.clone(),
            lease: lease.clone(),
            token,
            claim_uid: grant.claim_uid().to_string(),
            t_ns: now_ns(),
        });
        for _ in 0..args.writes_per_grant {
            seq += 1;
            let event = write_file(&fence, &args.identity, lease, token, seq);
            history.record(&event);
            let event = write_configmap(&configmaps, &args.identity, lease, token, seq).await;
            let lost = matches!(
                event,
                Event::Write {
                    outcome: Outcome::Stale,
                    ..
                }
            );
            history.record(&event);
            if let Some(databases) = databases.as_mut() {
                let hold = rng.millis(0, 100);
                databases.write(&mut history, lease, token, seq, hold).await;
            }
            if lost && stale_rounds > 0 && rng.range(0, 2) == 0 {
                stale_rounds -= 1;
                // Where the stale holder tries to move the object: another Lease (its
                // token may well be lower than ours) or one that does not exist.
                let others: Vec<&String> = args.leases.iter().filter(|l| *l != lease).collect();
                let moved_to = match rng.range(0, others.len() as u64 + 1) as usize {
                    i if i < others.len() => others[i].clone(),
                    _ => format!("{lease}-gone"),
                };
                for event in stale_writes(
                    &configmaps,
                    &args.identity,
                    lease,
                    token,
                    &moved_to,
                    &mut seq,
                )
                .await
                {
                    history.record(&event);
                }
            }
            tokio::time::sleep(rng.millis(50, 250)).await;
        }
        if let Err(e) = tokio::time::timeout(WRITE_TIMEOUT, grant.release()).await {
            eprintln!("{}: release of {lease} timed out: {e}", args.identity);
        }
        tokio::time::sleep(rng.millis(0, 300)).await;
    }
}

pub fn write_file(
    fence: &Fence<FileStore>,
    worker: &str,
    lease: &str,
    token: u64,
    seq: u64,
) -> Event {
    let payload = serde_json::to_string(&JournalWrite {
        lease: lease.to_string(),
        token,
        worker: worker.to_string(),
        seq,
    })
    .expect("serializes");
    let start_ns = now_ns();
    let result = fence.admit_write(lease, token, &payload);
    let end_ns = now_ns();
    let (outcome, detail) = match result {
        Ok(_) => (Outcome::Accepted, String::new()),
        Err(e @ FenceError::Stale(_)) => (Outcome::Stale, e.to_string()),
        Err(e) => (Outcome::Error, e.to_string()),
    };
    Event::Write {
        worker: worker.to_string(),
        lease: lease.to_string(),
        store: "file".into(),
        token,
        seq,
        start_ns,
        end_ns,
        outcome,
        rv: None,
        detail,
    }
}

/// A merge patch without a resourceVersion: the only thing between a stale
/// writer and the object is the admission policy.
pub async fn write_configmap(
    configmaps: &Api<ConfigMap>,
    worker: &str,
    lease: &str,
    token: u64,
    seq: u64,
) -> Event {
    let patch = json!({
        "metadata": {"annotations": {"palisade.dev/fencing-token": token.to_string(),
                                     "palisade.dev/write-id": format!("{worker}-{seq}")}},
        "data": {"writer": worker, "seq": seq.to_string(), "token": token.to_string()},
    });
    let start_ns = now_ns();
    let result = tokio::time::timeout(
        WRITE_TIMEOUT,
        configmaps.patch(
            &configmap_name(lease),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ),
    )
    .await;
    let end_ns = now_ns();
    let (outcome, rv, detail) = match result {
        Ok(Ok(cm)) => (
            Outcome::Accepted,
            cm.resource_version().and_then(|rv| rv.parse().ok()),
            String::new(),
        ),
        Ok(Err(kube::Error::Api(e)))
            if e.code == 403 && e.message.contains("stale fencing token") =>
        {
            (Outcome::Stale, None, e.message)
        }
        Ok(Err(e)) => (Outcome::Error, None, e.to_string()),
        Err(_) => (Outcome::Error, None, "timed out".into()),
    };
    Event::Write {
        worker: worker.to_string(),
        lease: lease.to_string(),
        store: "configmap".into(),
        token,
        seq,
        start_ns,
        end_ns,
        outcome,
        rv,
        detail,
    }
}

/// Once a write of ours was refused as stale (our grant is lost), we try what a careless
/// stale holder does, each recorded as a write with our old token, so an accepted one is a
/// stale write the checker reports: a merge patch that leaves the token annotation
/// untouched (it would inherit the object's token); deleting the object (a delete is a
/// write too: it destroys the newer holder's data); creating it again with our token; and
/// a write with our token and data that moves the object to Lease `moved_to` (it would be
/// judged against that Lease alone; the harness's watch then sees the label changed).
/// Every refusal by the fencing policies names the fencing token, and counts as stale.
async fn stale_writes(
    configmaps: &Api<ConfigMap>,
    worker: &str,
    lease: &str,
    token: u64,
    moved_to: &str,
    seq: &mut u64,
) -> Vec<Event> {
    let name = configmap_name(lease);
    let mut events = Vec::new();
    let mut record = |seq: u64, start_ns: u64, result: Result<Option<ConfigMap>, kube::Error>| {
        let end_ns = now_ns();
        let (outcome, rv, detail) = match result {
            Ok(cm) => (
                Outcome::Accepted,
                cm.and_then(|cm| cm.resource_version()?.parse().ok()),
                String::new(),
            ),
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("fencing token") => {
                (Outcome::Stale, None, e.message)
            }
            Err(e) => (Outcome::Error, None, e.to_string()),
        };
        events.push(Event::Write {
            worker: worker.to_string(),
            lease: lease.to_string(),
            store: "configmap".into(),
            token,
            seq,
            start_ns,
            end_ns,
            outcome,
            rv,
            detail,
        });
    };

    *seq += 1;
    let untouched = json!({"data": {"writer": worker, "seq": seq.to_string(), "token": "none"}});
    let start_ns = now_ns();
    let result = timed(configmaps.patch(&name, &PatchParams::default(), &Patch::Merge(&untouched)))
        .await
        .map(Some);
    record(*seq, start_ns, result);

    *seq += 1;
    let start_ns = now_ns();
    let result = timed(configmaps.delete(&name, &DeleteParams::default()))
        .await
        .map(|_| None);
    record(*seq, start_ns, result);

    *seq += 1;
    let recreated: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"palisade.dev/fenced-by": lease},
            "annotations": {"palisade.dev/fencing-token": token.to_string(),
                            "palisade.dev/write-id": format!("{worker}-{seq}")},
        },
        "data": {"writer": worker, "seq": seq.to_string(), "token": token.to_string()},
    }))
    .expect("a ConfigMap");
    let start_ns = now_ns();
    match timed(configmaps.create(&PostParams::default(), &recreated)).await {
        // Still there (the delete was refused): the create was not applied, nothing to record.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        result => record(*seq, start_ns, result.map(Some)),
    }

    *seq += 1;
    let moved = json!({
        "metadata": {"labels": {"palisade.dev/fenced-by": moved_to},
                     "annotations": {"palisade.dev/fencing-token": token.to_string(),
                                     "palisade.dev/write-id": format!("{worker}-{seq}")}},
        "data": {"writer": worker, "seq": seq.to_string(), "token": token.to_string()},
    });
    let start_ns = now_ns();
    let result = timed(configmaps.patch(&name, &PatchParams::default(), &Patch::Merge(&moved)))
        .await
        .map(Some);
    record(*seq, start_ns, result);
    events
}

/// `f`, or an error once WRITE_TIMEOUT has passed (its outcome then unknown).
pub async fn timed<T>(
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(WRITE_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(kube::Error::Service("timed out".into())))
}
