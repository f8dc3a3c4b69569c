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

/// The ConfigMap a slot of a Lease fences: `fenced-<lease>` for slot 0 (a lock's),
/// `fenced-<lease>-slot-<n>` for the others.
pub fn configmap_name(lease: &str, slot: i32) -> String {
    if slot == 0 {
        format!("fenced-{lease}")
    } else {
        format!("fenced-{lease}-slot-{slot}")
    }
}

/// The labels that fence an object by a slot of a Lease: `palisade.dev/fenced-by`, and
/// `palisade.dev/fenced-slot` above slot 0.
pub fn fenced_labels(lease: &str, slot: i32) -> serde_json::Value {
    if slot == 0 {
        json!({"palisade.dev/fenced-by": lease})
    } else {
        json!({"palisade.dev/fenced-by": lease, "palisade.dev/fenced-slot": slot.to_string()})
    }
}

/// A grant as a worker writes with it: its Lease, its slot, the slot's fence key (the
/// key of every store) and its token.
#[derive(Debug, Clone)]
pub struct Held {
    pub lease: String,
    pub slot: i32,
    pub key: String,
    pub token: u64,
}

impl Held {
    /// The journal entry of write `seq` of `worker` with this grant.
    pub fn journal(&self, worker: &str, seq: u64) -> JournalWrite {
        JournalWrite {
            lease: self.lease.clone(),
            slot: self.slot,
            token: self.token,
            worker: worker.to_string(),
            seq,
        }
    }
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
        let held = Held {
            lease: lease.clone(),
            slot: grant.slot(),
            key: grant.fence_key(),
            token: grant.token() as u64,
        };
        history.record(&Event::Grant {
            worker: args.identity.clone(),
            lease: lease.clone(),
            slot: held.slot,
            token: held.token,
            claim_uid: grant.claim_uid().to_string(),
            t_ns: now_ns(),
        });
        for _ in 0..args.writes_per_grant {
            seq += 1;
            let event = write_file(&fence, &args.identity, &held, seq);
            history.record(&event);
            let event = write_configmap(&configmaps, &args.identity, &held, seq).await;
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
                databases.write(&mut history, &held, seq, hold).await;
            }
            if lost && stale_rounds > 0 && rng.range(0, 2) == 0 {
                stale_rounds -= 1;
                let moved_to = move_target(&args.leases, &held, &mut rng);
                for event in
                    stale_writes(&configmaps, &args.identity, &held, &moved_to, &mut seq).await
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

/// Where a stale holder tries to move its object, as (Lease, slot): another Lease's
/// first slot (its token may well be lower than ours), another slot of its own Lease
/// (slot 0 from a semaphore's other slots, else slot 1: its token may be lower, or it
/// may not exist), or a Lease that does not exist.
fn move_target(leases: &[String], held: &Held, rng: &mut Rng) -> (String, i32) {
    let others: Vec<&String> = leases.iter().filter(|l| **l != held.lease).collect();
    match rng.range(0, others.len() as u64 + 2) as usize {
        i if i < others.len() => (others[i].clone(), 0),
        i if i == others.len() => (held.lease.clone(), if held.slot == 0 { 1 } else { 0 }),
        _ => (format!("{}-gone", held.lease), 0),
    }
}

/// One write to the file fence, under the grant's fence key.
pub fn write_file(fence: &Fence<FileStore>, worker: &str, held: &Held, seq: u64) -> Event {
    let payload = serde_json::to_string(&held.journal(worker, seq)).expect("serializes");
    let start_ns = now_ns();
    let result = fence.admit_write(&held.key, held.token, &payload);
    let end_ns = now_ns();
    let (outcome, detail) = match result {
        Ok(_) => (Outcome::Accepted, String::new()),
        Err(e @ FenceError::Stale(_)) => (Outcome::Stale, e.to_string()),
        Err(e) => (Outcome::Error, e.to_string()),
    };
    Event::Write {
        worker: worker.to_string(),
        lease: held.lease.clone(),
        slot: held.slot,
        store: "file".into(),
        token: held.token,
        seq,
        start_ns,
        end_ns,
        outcome,
        rv: None,
        detail,
    }
}

/// A merge patch without a resourceVersion: the only thing between a stale
/// writer and the object (its slot's) is the admission policy.
pub async fn write_configmap(
    configmaps: &Api<ConfigMap>,
    worker: &str,
    held: &Held,
    seq: u64,
) -> Event {
    let token = held.token;
    let patch = json!({
        "metadata": {"annotations": {"palisade.dev/fencing-token": token.to_string(),
                                     "palisade.dev/write-id": format!("{worker}-{seq}")}},
        "data": {"writer": worker, "seq": seq.to_string(), "token": token.to_string()},
    });
    let start_ns = now_ns();
    let result = tokio::time::timeout(
        WRITE_TIMEOUT,
        configmaps.patch(
            &configmap_name(&held.lease, held.slot),
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
        lease: held.lease.clone(),
        slot: held.slot,
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
/// a write with our token and data that moves the object to `moved_to`, another Lease or
/// slot (it would be judged against that one alone; the harness's watch then sees the
/// labels changed).
/// Every refusal by the fencing policies names the fencing token (a slot's move, the slot
/// label), and counts as stale.
async fn stale_writes(
    configmaps: &Api<ConfigMap>,
    worker: &str,
    held: &Held,
    moved_to: &(String, i32),
    seq: &mut u64,
) -> Vec<Event> {
    let token = held.token;
    let name = configmap_name(&held.lease, held.slot);
    let mut events = Vec::new();
    let mut record = |seq: u64, start_ns: u64, result: Result<Option<ConfigMap>, kube::Error>| {
        let end_ns = now_ns();
        let (outcome, rv, detail) = match result {
            Ok(cm) => (
                Outcome::Accepted,
                cm.and_then(|cm| cm.resource_version()?.parse().ok()),
                String::new(),
            ),
            // The slot's move is refused naming the slot label, not the token.
            Err(kube::Error::Api(e))
                if e.code == 403
                    && (e.message.contains("fencing token")
                        || e.message.contains("palisade.dev/fenced-slot")) =>
            {
                (Outcome::Stale, None, e.message)
            }
            Err(e) => (Outcome::Error, None, e.to_string()),
        };
        events.push(Event::Write {
            worker: worker.to_string(),
            lease: held.lease.clone(),
            slot: held.slot,
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
            "labels": fenced_labels(&held.lease, held.slot),
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
    let (to_lease, to_slot) = moved_to;
    // A merge patch: null removes the slot label (slot 0).
    let to_slot = (*to_slot != 0).then(|| to_slot.to_string());
    let moved = json!({
        "metadata": {"labels": {"palisade.dev/fenced-by": to_lease,
                                "palisade.dev/fenced-slot": to_slot},
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
