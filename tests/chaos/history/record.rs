//! What a chaos run records: the events, the file each process appends them to, and
//! the file fence's journal.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A worker's `acquire` returned this grant.
    Grant {
        worker: String,
        lease: String,
        /// The semaphore slot it holds (a lock's, and histories before slots: 0).
        #[serde(default, skip_serializing_if = "is_slot_zero")]
        slot: i32,
        token: u64,
        claim_uid: String,
        t_ns: u64,
    },
    /// A worker tried to write to a fenced store with the token of its grant.
    Write {
        worker: String,
        lease: String,
        /// The slot of the grant it writes for: the store's key is the slot's fence key.
        #[serde(default, skip_serializing_if = "is_slot_zero")]
        slot: i32,
        store: String,
        token: u64,
        seq: u64,
        start_ns: u64,
        end_ns: u64,
        outcome: Outcome,
        /// The object's resourceVersion after an accepted ConfigMap write.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rv: Option<u64>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// The harness's watch saw this version of a Lease: one event for each slot the
    /// version records (a lock has slot 0 only), its holder and its token.
    LeaseSeen {
        lease: String,
        #[serde(default, skip_serializing_if = "is_slot_zero")]
        slot: i32,
        rv: u64,
        holder_uid: String,
        token: u64,
        t_ns: u64,
        /// Through which API server of the HA plane (none: the one of a plain run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<u8>,
    },
    /// The harness's watch saw this version of a fenced ConfigMap.
    ConfigMapSeen {
        /// The value of its label `palisade.dev/fenced-by`.
        lease: String,
        /// The value of its label `palisade.dev/fenced-slot` (none: 0).
        #[serde(default, skip_serializing_if = "is_slot_zero")]
        slot: i32,
        /// The ConfigMap's name (histories written before it was recorded have none).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        name: String,
        rv: u64,
        token: u64,
        t_ns: u64,
    },
    /// A fault the harness injected, from start to end.
    Fault {
        fault: String,
        target: String,
        start_ns: u64,
        end_ns: u64,
    },
    /// All faults are over and everything is resumed, restored and running.
    Healed { t_ns: u64 },
    /// The harness silenced this holder (stopped its process) at `t_ns`; the Lease
    /// must name another holder, or none, within `within_ns`.
    Silenced {
        lease: String,
        /// The slot it held: only that slot must move on.
        #[serde(default, skip_serializing_if = "is_slot_zero")]
        slot: i32,
        claim_uid: String,
        t_ns: u64,
        within_ns: u64,
    },
    /// One renewal request of a worker (a PATCH of its claim, before its grant too: an
    /// early confirmation; or the claim's create, which vouches for a grant the same
    /// way), with its send time and what came back: the HTTP status (0: no response)
    /// and the claim's phase in it.
    Renewal {
        worker: String,
        claim: String,
        claim_uid: String,
        send_ns: u64,
        end_ns: u64,
        status: u16,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        phase: String,
    },
    /// A worker deleting its claim (releasing), when the request was sent.
    Release {
        worker: String,
        claim: String,
        claim_uid: String,
        t_ns: u64,
    },
    /// The harness pinned a worker's connections to this API server of the HA plane.
    Pinned { worker: String, server: u8 },
    /// A fenced operator's write to the API server (operator_worker.rs), through its
    /// stamped client, with the token of the term it led in.
    OperatorWrite {
        worker: String,
        token: u64,
        /// `configmap/NAME` or `deployment/NAME/status`.
        object: String,
        seq: u64,
        start_ns: u64,
        end_ns: u64,
        /// `Stale`: refused by the operators policy (its message in `detail`).
        outcome: Outcome,
        /// The object's resourceVersion the API server returned, when accepted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rv: Option<u64>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// The harness's watch saw this version of an operator's object, whose content
    /// names the token of the operator write that made it.
    OperatorObjectSeen {
        object: String,
        rv: u64,
        token: u64,
        t_ns: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    /// Rejected by the store because a higher token was accepted before.
    Stale,
    /// Failed otherwise (timeout, connection cut, server error): it may or may not
    /// have been applied, so the checker uses only what the store itself shows.
    Error,
    /// Refused because the store lost the key's mark (a lossy Redis, dbstores.rs):
    /// the fence failing closed.
    NoMark,
}

/// Appends events to a history file, one line each.
pub struct Recorder {
    file: std::fs::File,
}

impl Recorder {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Recorder { file })
    }

    pub fn record(&mut self, event: &Event) {
        let mut line = serde_json::to_string(event).expect("events serialize");
        line.push('\n');
        // One write of the whole line: O_APPEND keeps lines of one file whole.
        self.file
            .write_all(line.as_bytes())
            .expect("writing the history file");
    }
}

/// Reads every `*.jsonl` history file in `dir`. A torn last line (a process killed
/// mid-write) is skipped; any other unreadable line is an error.
pub fn read_dir(dir: &Path) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            match serde_json::from_str(line) {
                Ok(event) => events.push(event),
                Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
                Err(e) => return Err(format!("{}:{}: {e}", path.display(), i + 1)),
            }
        }
    }
    Ok(events)
}

/// One write a store accepted, in the order of its journal: its Lease and slot (the
/// store's key is the slot's fence key, [`JournalWrite::fence_key`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalWrite {
    pub lease: String,
    #[serde(default, skip_serializing_if = "is_slot_zero")]
    pub slot: i32,
    pub token: u64,
    pub worker: String,
    pub seq: u64,
}

impl JournalWrite {
    /// The key every store keeps this write's marks under: its slot's fence key.
    pub fn fence_key(&self) -> String {
        palisade::permits::fence_key(crate::cluster::NAMESPACE, &self.lease, self.slot)
    }
}

/// How the checker names a slot's key: the Lease for slot 0, `lease#slot` otherwise
/// (the fence key without the namespace, every Lease of the run being in one).
pub fn slot_key(lease: &str, slot: i32) -> String {
    if slot == 0 {
        lease.to_string()
    } else {
        format!("{lease}#{slot}")
    }
}

fn is_slot_zero(slot: &i32) -> bool {
    *slot == 0
}
