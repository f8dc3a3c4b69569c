//! An S3 object per slot's fence key (`chaos/lease-0`, `chaos/sem-0#1`: the key is the
//! object's name) as a fenced store in the chaos run: SeaweedFS, started by
//! tests/objectstores/objectstores.sh on ports and in a state directory of the run's
//! own (`target/chaos-objectstores`), from the venv `make objectstores-venv` makes.
//!
//! An object store keeps no commit order the checker could read, so this store is
//! judged by the rules that need none: no write accepted after a higher token's was
//! acknowledged (real time, history.rs), every stale refusal justified by a higher
//! token on the object, and, after the run, the object holding the highest token any
//! write was acknowledged with ([`final_object_violations`]): a stale write that
//! overlapped the new holder's and landed after it would lower it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use palisade::fence::s3::{Error as S3Error, S3Config, S3Fence};

use crate::history::{Event, JournalWrite, Outcome, slot_key};

/// How workers learn the endpoint and the bucket: `<endpoint> <bucket>`.
pub const S3_ENV: &str = "PALISADE_CHAOS_S3";
pub const STORE: &str = "s3";

fn fence(endpoint: &str, bucket: &str) -> Result<S3Fence, String> {
    let mut config = S3Config::from_env(bucket).map_err(|e| e.to_string())?;
    config.endpoint = endpoint.trim_end_matches('/').to_string();
    config.path_style = true;
    config.timeout = Duration::from_secs(5);
    S3Fence::new(&config).map_err(|e| e.to_string())
}

const S3_PORT: u16 = 28333;

/// objectstores.sh with the run's ports and state directory.
pub fn script(root: &Path, action: &str) -> Result<(), String> {
    let venv = std::env::var("PALISADE_OBJECTSTORES_VENV").map_err(|_| {
        "PALISADE_OBJECTSTORES_VENV is not set: the venv with SeaweedFS, which `make \
         objectstores-venv` makes (make chaos and make test set it)"
            .to_string()
    })?;
    let out = Command::new(root.join("tests/objectstores/objectstores.sh"))
        .arg(action)
        .env("STATE_DIR", root.join("target/chaos-objectstores"))
        .env("VENV", venv)
        .env("S3_PORT", S3_PORT.to_string())
        .env("BROKEN_S3_PORT", (S3_PORT + 1).to_string())
        .env("WEED_BASE_PORT", (S3_PORT + 10).to_string())
        .output()
        .map_err(|e| format!("objectstores.sh: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "objectstores.sh {action} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A fresh server, and the bucket of this run: `<endpoint> <bucket>`, for [`S3_ENV`].
pub async fn set_up(root: &Path, run: &str) -> Result<String, String> {
    script(root, "down")?;
    script(root, "up")?;
    let endpoint = format!("http://127.0.0.1:{S3_PORT}");
    let bucket = format!("chaos-{run}");
    let created = fence(&endpoint, &bucket)?
        .client()
        .create_bucket()
        .await
        .map_err(|e| format!("creating bucket {bucket}: {e}"))?;
    if !created.status.is_success() {
        return Err(format!("creating bucket {bucket}: {}", created.describe()));
    }
    Ok(format!("{endpoint} {bucket}"))
}

/// What the object of each fence key (`keys`) holds after the run, as a one-entry
/// journal.
pub async fn final_objects(location: &str, keys: &[String]) -> Result<Vec<JournalWrite>, String> {
    let (endpoint, bucket) = location
        .split_once(' ')
        .ok_or_else(|| format!("{S3_ENV} {location:?} is not `<endpoint> <bucket>`"))?;
    let fence = fence(endpoint, bucket)?;
    let mut objects = Vec::new();
    for key in keys {
        if let Some(object) = fence
            .get(key)
            .await
            .map_err(|e| format!("reading the object of {key}: {e}"))?
        {
            let write: JournalWrite = serde_json::from_slice(&object.payload)
                .map_err(|e| format!("the object of {key}: {e}"))?;
            if write.token != object.token || write.fence_key() != *key {
                return Err(format!(
                    "the object of {key} holds write {} of {} with token {} under the \
                     fence's token {}",
                    write.seq, write.worker, write.token, object.token
                ));
            }
            objects.push(write);
        }
    }
    Ok(objects)
}

/// Each slot's object holds the highest token any S3 write under its key was
/// acknowledged with.
pub fn final_object_violations(events: &[Event], objects: &[JournalWrite]) -> Vec<String> {
    let mut highest: BTreeMap<(&str, i32), (u64, &str, u64)> = BTreeMap::new();
    for e in events {
        if let Event::Write {
            worker,
            lease,
            slot,
            store,
            token,
            seq,
            outcome: Outcome::Accepted,
            ..
        } = e
            && store == STORE
        {
            let entry = highest
                .entry((lease, *slot))
                .or_insert((*token, worker, *seq));
            if *token > entry.0 {
                *entry = (*token, worker, *seq);
            }
        }
    }
    let mut violations = Vec::new();
    for ((lease, slot), (token, worker, seq)) in highest {
        let held = objects.iter().find(|w| w.lease == lease && w.slot == slot);
        if held.is_none_or(|w| w.token < token) {
            violations.push(format!(
                "s3 store, key {}: the object holds {}, below write {seq} of {worker} \
                 with token {token}, which was acknowledged: a stale write overwrote it",
                held.map_or("nothing".to_string(), |w| format!(
                    "write {} of {} with token {}",
                    w.seq, w.worker, w.token
                )),
                slot_key(lease, slot)
            ));
        }
    }
    violations
}

/// A worker's fence on the run's bucket.
pub struct Writer {
    fence: S3Fence,
}

impl Writer {
    /// From the environment the harness sets; `None` when it set none.
    pub fn from_env() -> Option<Self> {
        let location = std::env::var(S3_ENV).ok()?;
        let (endpoint, bucket) = location.split_once(' ')?;
        Some(Writer {
            fence: fence(endpoint, bucket).expect("the S3 fence of the chaos run"),
        })
    }

    /// One fenced write of `write` to the object of fence key `key`: its outcome and,
    /// when not accepted, why.
    pub async fn write(
        &self,
        key: &str,
        write: &JournalWrite,
        timeout: Duration,
    ) -> (Outcome, String) {
        let body = serde_json::to_vec(write).expect("serializes");
        let put = self.fence.put(key, write.token, body);
        match tokio::time::timeout(timeout, put).await {
            Ok(Ok(_)) => (Outcome::Accepted, String::new()),
            Ok(Err(e @ S3Error::Stale(_))) => (Outcome::Stale, e.to_string()),
            Ok(Err(e)) => (Outcome::Error, e.to_string()),
            Err(_) => (Outcome::Error, "timed out".into()),
        }
    }
}

/// The final-object rule must be able to fail: an object below an acknowledged token
/// of its slot is reported, and one at it is not (another slot's object below it is
/// no matter). Returns how many violations were planted.
pub fn self_check() -> Result<usize, String> {
    let acknowledged = |slot, token| Event::Write {
        worker: "b".into(),
        lease: "l".into(),
        slot,
        store: STORE.into(),
        token,
        seq: 1,
        start_ns: 1,
        end_ns: 2,
        outcome: Outcome::Accepted,
        rv: None,
        detail: String::new(),
    };
    let held = |slot, token| JournalWrite {
        lease: "l".into(),
        slot,
        token,
        worker: "a".into(),
        seq: 7,
    };
    let events = [
        acknowledged(0, 10),
        acknowledged(0, 20),
        acknowledged(1, 15),
    ];
    let clean = final_object_violations(&events, &[held(0, 20), held(1, 15)]);
    if !clean.is_empty() {
        return Err(format!("clean S3 objects were flagged: {clean:?}"));
    }
    for (name, objects) in [
        (
            "an object below its highest write",
            vec![held(0, 10), held(1, 15)],
        ),
        ("no object", vec![held(1, 15)]),
        (
            "a slot's object below its highest write",
            vec![held(0, 20), held(1, 10)],
        ),
    ] {
        if final_object_violations(&events, &objects).is_empty() {
            return Err(format!("planted S3 violation \"{name}\" was not reported"));
        }
    }
    Ok(3)
}
