//! The fenced outbox as a store in the chaos run. Each PostgreSQL write of a worker
//! also inserts an intent (`palisade.enqueue`, in the same transaction), and two
//! `palisade outbox relay` processes, holding a Lease of their own, deliver the
//! intents to a deduplicating provider (tests/support/provider.rs) while the faults
//! run, two of them aimed at the relays: `kill_relay` (SIGKILL, a new relay starts)
//! and `pause_relay` (SIGSTOP past the relay's Lease, then SIGCONT: it wakes with a
//! stale token, its records are refused, its late requests deduplicated).
//!
//! Judged after the run, once every relay has had time to deliver
//! ([`Relays::judge`]): the intents are exactly the committed writes (no stale
//! holder's intent inserted: it would need its transaction to commit, which the fence
//! refuses), each under its write's fence key (a semaphore's slots keyed apart), every
//! intent was delivered, and the provider executed each one exactly once and nothing
//! else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use support::provider::{KeyRecord, Provider};
use tokio_postgres::{Client, Transaction};

use crate::cluster::NAMESPACE;
use crate::history::JournalWrite;
use crate::processes::signal;
use crate::rng::Rng;

/// The relays' own Lease, and its duration (short, so a pause outlives it quickly).
const RELAY_LEASE: &str = "outbox-relay";
const RELAY_LEASE_SECONDS: u64 = 3;
const RELAYS: usize = 2;
/// How long the relays get, after the run, to deliver what is left.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// The outbox installed next to the fence, and the workers' role allowed to enqueue.
pub async fn install(admin: &Client, app_role: &str) -> Result<(), String> {
    palisade::outbox::install(admin)
        .await
        .map_err(|e| format!("installing the outbox: {e:?}"))?;
    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION palisade.enqueue(text, bigint, jsonb) TO {app_role}"
        ))
        .await
        .map_err(|e| format!("granting {app_role} the outbox: {e}"))
}

/// The intent of a worker's write, in the write's transaction, under its slot's fence
/// key `key`.
pub async fn enqueue(
    tx: &Transaction<'_>,
    key: &str,
    write: &JournalWrite,
) -> Result<String, palisade::outbox::Error> {
    let payload = serde_json::to_value(write).expect("serializes");
    palisade::outbox::enqueue(tx, key, write.token, &payload).await
}

/// The relays, the provider they deliver to, and what they need to start again.
pub struct Relays {
    provider: Provider,
    palisade: PathBuf,
    kubeconfig: PathBuf,
    store: String,
    out: PathBuf,
    pub running: Vec<(String, Child)>,
    spawned: usize,
}

impl Relays {
    /// The provider, and [`RELAYS`] relays on `store` (the superuser's URL: the relay's
    /// role is not what this run tests).
    pub async fn start(palisade: &Path, kubeconfig: &Path, store: String, out: &Path) -> Self {
        let mut relays = Relays {
            provider: Provider::start().await,
            palisade: palisade.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
            store,
            out: out.to_path_buf(),
            running: Vec::new(),
            spawned: 0,
        };
        for _ in 0..RELAYS {
            relays.spawn();
        }
        relays
    }

    fn spawn(&mut self) {
        let identity = format!("r{}", self.spawned);
        self.spawned += 1;
        let log = std::fs::File::create(self.out.join(format!("relay-{identity}.log")))
            .expect("relay log");
        let child = Command::new(&self.palisade)
            .args([
                "outbox",
                "relay",
                "--store",
                &self.store,
                "--lease",
                RELAY_LEASE,
            ])
            .args(["--namespace", NAMESPACE, "--identity", &identity])
            .args(["--duration", &format!("{RELAY_LEASE_SECONDS}s")])
            .args(["--endpoint", &self.provider.url(), "--timeout", "2s"])
            .args(["--backoff", "100ms", "--max-backoff", "2s"])
            .env("KUBECONFIG", &self.kubeconfig)
            .process_group(0)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning a relay");
        self.running.push((identity, child));
    }

    /// `kill_relay`: SIGKILL one relay (it cannot release), and start another.
    pub fn kill_one(&mut self, rng: &mut Rng) -> String {
        let (identity, mut child) = self
            .running
            .remove(rng.range(0, self.running.len() as u64) as usize);
        let _ = child.kill();
        let _ = child.wait();
        self.spawn();
        identity
    }

    /// `pause_relay`: SIGSTOP one relay for 1.25 to 2.5 of its Lease's durations.
    pub async fn pause_one(&self, rng: &mut Rng) -> String {
        let (identity, child) = &self.running[rng.range(0, self.running.len() as u64) as usize];
        let lease = RELAY_LEASE_SECONDS * 1000;
        let pause = rng.millis(lease * 5 / 4, lease * 5 / 2);
        signal(child.id() as i32, libc::SIGSTOP);
        tokio::time::sleep(pause).await;
        signal(child.id() as i32, libc::SIGCONT);
        format!("{identity} for {} ms", pause.as_millis())
    }

    /// The relays' process ids, to check after the drop that none outlived it.
    pub fn pids(&self) -> Vec<u32> {
        self.running.iter().map(|(_, child)| child.id()).collect()
    }

    /// The outbox's verdict (see the module's docs): its violations, none when it held.
    pub async fn judge(&self, admin: &Client, writes: &[JournalWrite]) -> Vec<String> {
        let started = Instant::now();
        let intents = loop {
            match pending_and_intents(admin).await {
                Ok((0, intents)) => break intents,
                Ok((pending, intents)) if started.elapsed() > DRAIN_LIMIT => {
                    let mut violations = judge_intents(&intents, writes, &self.provider.keys());
                    violations.push(format!(
                        "outbox: {pending} intents still undelivered {} s after the run",
                        DRAIN_LIMIT.as_secs()
                    ));
                    return violations;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                Err(e) => return vec![format!("outbox: reading palisade.outbox: {e}")],
            }
        };
        let violations = judge_intents(&intents, writes, &self.provider.keys());
        println!(
            "chaos: outbox: {} intents, each delivered; the provider saw {} requests for them",
            intents.len(),
            self.provider.requests()
        );
        violations
    }
}

/// A relay outlives the run otherwise: a `Child` dropped is neither killed nor reaped,
/// and the chaos binary's exit does not end its children.
impl Drop for Relays {
    fn drop(&mut self) {
        for (_, child) in &mut self.running {
            // A paused relay dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// (intent id, the write it carries, its state, the fence key it was enqueued under).
type Intent = (String, JournalWrite, String, String);

async fn pending_and_intents(admin: &Client) -> Result<(usize, Vec<Intent>), String> {
    let rows = admin
        .query(
            "SELECT id::text, payload::text, state, key FROM palisade.outbox",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut intents = Vec::with_capacity(rows.len());
    for row in rows {
        let payload: String = row.get(1);
        let write = serde_json::from_str(&payload).map_err(|e| format!("{payload}: {e}"))?;
        intents.push((row.get(0), write, row.get(2), row.get(3)));
    }
    let pending = intents.iter().filter(|(_, _, s, _)| s == "pending").count();
    Ok((pending, intents))
}

fn judge_intents(
    intents: &[Intent],
    writes: &[JournalWrite],
    keys: &HashMap<String, KeyRecord>,
) -> Vec<String> {
    let mut violations = Vec::new();
    let identify = |w: &JournalWrite| (w.worker.clone(), w.seq, w.lease.clone(), w.slot, w.token);
    let committed: BTreeSet<_> = writes.iter().map(identify).collect();
    let mut seen = BTreeMap::new();
    for (id, write, state, key) in intents {
        if *key != write.fence_key() {
            violations.push(format!(
                "outbox: intent {id} was enqueued under key {key}, not its write's slot's {}",
                write.fence_key()
            ));
        }
        if !committed.contains(&identify(write)) {
            violations.push(format!(
                "outbox: intent {id} (write {} of {} with token {} on {}) has no committed \
                 write: an intent inserted without its fenced write",
                write.seq,
                write.worker,
                write.token,
                crate::history::slot_key(&write.lease, write.slot)
            ));
        }
        if let Some(other) = seen.insert(identify(write), id) {
            violations.push(format!(
                "outbox: intents {other} and {id} carry the same write"
            ));
        }
        if state != "delivered" {
            violations.push(format!("outbox: intent {id} ended {state}, not delivered"));
        }
    }
    for missing in committed.iter().filter(|w| !seen.contains_key(*w)) {
        violations.push(format!(
            "outbox: committed write {} of {} has no intent",
            missing.1, missing.0
        ));
    }
    for (id, _, _, _) in intents {
        match keys.get(id).map(|k| k.executions) {
            Some(1) => {}
            executions => violations.push(format!(
                "outbox: the provider executed intent {id} {} times, not once",
                executions.unwrap_or(0)
            )),
        }
    }
    let known: BTreeSet<&str> = intents.iter().map(|(id, _, _, _)| id.as_str()).collect();
    for key in keys.keys().filter(|k| !known.contains(k.as_str())) {
        violations.push(format!(
            "outbox: the provider executed {key}, which is no intent"
        ));
    }
    violations
}

/// The outbox's rules must be able to fail: each violation, planted in an otherwise
/// clean outcome, is reported. Returns how many were planted.
pub fn self_check() -> Result<usize, String> {
    let write = |seq| JournalWrite {
        lease: "l".into(),
        slot: 0,
        token: 10,
        worker: "a".into(),
        seq,
    };
    let intent = |id: &str, seq, state: &str| {
        let write = write(seq);
        let key = write.fence_key();
        (id.to_string(), write, state.to_string(), key)
    };
    let executed = |ids: &[(&str, u32)]| -> HashMap<String, KeyRecord> {
        ids.iter()
            .map(|(id, executions)| {
                let record = KeyRecord {
                    executions: *executions,
                    ..KeyRecord::default()
                };
                (id.to_string(), record)
            })
            .collect()
    };
    let writes = [write(1), write(2)];
    let clean = [intent("i1", 1, "delivered"), intent("i2", 2, "delivered")];
    let found = judge_intents(&clean, &writes, &executed(&[("i1", 1), ("i2", 1)]));
    if !found.is_empty() {
        return Err(format!("a clean outbox was flagged: {found:?}"));
    }
    // (name, intents, committed writes, executions per intent id, what must be said)
    type Case<'a> = (
        &'a str,
        Vec<Intent>,
        &'a [JournalWrite],
        &'a [(&'a str, u32)],
        &'a str,
    );
    let mut misfiled = intent("i2", 2, "delivered");
    misfiled.3 = palisade::permits::fence_key(crate::cluster::NAMESPACE, "l", 1);
    let cases: [Case; 6] = [
        (
            "an intent without its write",
            vec![
                clean[0].clone(),
                clean[1].clone(),
                intent("i3", 3, "delivered"),
            ],
            &writes,
            &[("i1", 1), ("i2", 1), ("i3", 1)],
            "has no committed write",
        ),
        (
            "a write without its intent",
            vec![clean[0].clone()],
            &writes,
            &[("i1", 1)],
            "has no intent",
        ),
        (
            "an intent executed twice",
            clean.to_vec(),
            &writes,
            &[("i1", 2), ("i2", 1)],
            "2 times",
        ),
        (
            "an intent never delivered",
            vec![clean[0].clone(), intent("i2", 2, "pending")],
            &writes,
            &[("i1", 1)],
            "ended pending",
        ),
        (
            "an intent under another slot's key",
            vec![clean[0].clone(), misfiled],
            &writes,
            &[("i1", 1), ("i2", 1)],
            "not its write's slot's",
        ),
        (
            "an execution of no intent",
            clean.to_vec(),
            &writes,
            &[("i1", 1), ("i2", 1), ("x", 1)],
            "which is no intent",
        ),
    ];
    for (name, intents, writes, ids, needle) in &cases {
        let found = judge_intents(intents, writes, &executed(ids));
        if !found.iter().any(|v| v.contains(needle)) {
            return Err(format!(
                "planted outbox violation \"{name}\" was not reported (got {found:?})"
            ));
        }
    }
    Ok(cases.len())
}
