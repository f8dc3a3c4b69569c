//! After the run: reads the recorded history and the stores' commit orders, has the
//! checker (history.rs) judge them, prints the verdict, and fails a run that found a
//! violation or proved nothing (about a store, or about fencing operators).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::{ChaosLease, LEASE_SECONDS, fence_keys};
use crate::history::{self, Expectations, JournalWrite, Verdict};
use crate::operator_worker::{state_object, status_object};
use crate::processes::{ELECTION_LEASE, ELECTION_RETRY};
use crate::{dbstores, outbox_store, s3_store};

/// After the faults stop, each Lease must be granted again within its duration plus
/// this: the controller's and workers' watches that were cut reconnect with the backoff
/// of `palisade::watch_backoff` (0.2 s doubling to 2 s, plus jitter), and a holder killed just
/// before the end is only expired after its duration (10 s for all that, as before
/// leader election); and the replicas may have to elect a leader first, when the last
/// fault killed the leader or both replicas: a standby takes over once the dead
/// leader's record has stood unrenewed for the election's lease duration, at its next
/// try at the latest (the election's own promise, "Leader election" in src/controller/mod.rs).
pub const LIVENESS_BOUND: Duration = Duration::from_secs(10)
    .saturating_add(ELECTION_LEASE)
    .saturating_add(ELECTION_RETRY);

/// Where a run's stores keep what the checker reads.
#[derive(Clone, Copy)]
pub struct Stores<'a> {
    /// The file fence's store.
    pub file: &'a Path,
    /// The database servers and the S3 object store (dbstores.rs).
    pub servers: &'a dbstores::Servers,
    /// The outbox's relays and their provider.
    pub relays: &'a outbox_store::Relays,
}

/// Judges the run whose history is in `out`, with what its `stores` hold. True: it
/// passed.
pub async fn judge(
    out: &Path,
    stores: &Stores<'_>,
    leases: &[ChaosLease],
    started: Instant,
    seed: u64,
    ha: bool,
) -> bool {
    let Stores {
        file: store,
        servers,
        relays,
    } = *stores;
    let events = match history::read_dir(out) {
        Ok(events) => events,
        Err(e) => {
            eprintln!("chaos: reading the history: {e}");
            return false;
        }
    };
    let journal = match read_journal(store) {
        Ok(journal) => journal,
        Err(e) => {
            eprintln!("chaos: reading the file fence's journal: {e}");
            return false;
        }
    };
    let db_journals = match servers.journals(&fence_keys(leases)).await {
        Ok(journals) => journals,
        Err(e) => {
            eprintln!("chaos: reading the database stores' commit order: {e}");
            return false;
        }
    };
    let mut verdict = history::check_with_stores(
        &events,
        &journal,
        &db_journals,
        &Expectations {
            leases: leases.to_vec(),
            liveness_ns: (Duration::from_secs(LEASE_SECONDS) + LIVENESS_BOUND).as_nanos() as u64,
            holder_deadline_ns: (Duration::from_secs(LEASE_SECONDS) * 2 / 3).as_nanos() as u64,
        },
    );
    let s3_objects = db_journals
        .get(s3_store::STORE)
        .map_or(&[][..], Vec::as_slice);
    verdict
        .violations
        .extend(s3_store::final_object_violations(&events, s3_objects));
    let committed = db_journals.get("postgres").map_or(&[][..], Vec::as_slice);
    match dbstores::admin_client().await {
        Ok(admin) => verdict
            .violations
            .extend(relays.judge(&admin, committed).await),
        Err(e) => verdict.violations.push(format!("outbox: {e}")),
    }
    for v in &verdict.violations {
        println!("chaos: VIOLATION: {v}");
    }
    println!(
        "chaos: accepted writes {:?}, stale rejected {:?}, unknown outcomes {}, \
         recovery after healing (ms) {:?}, most holders at once {:?}, {} history events, \
         {:.0} s in all",
        verdict.accepted,
        verdict.stale_rejected,
        verdict.unknown_outcomes,
        verdict.recovery_ms,
        verdict.most_held,
        events.len(),
        started.elapsed().as_secs_f64()
    );
    println!("{}", verdict.summary());
    if !verdict.violations.is_empty() {
        println!("chaos: FAILED; history kept in {}", out.display());
        return false;
    }
    if !proves_something(&verdict, out, ha)
        || !semaphores_prove_something(&verdict, leases, out)
        || !operators_prove_something(&verdict, out)
        || (ha && !every_ha_kind_met_a_stale_write(&verdict, out))
    {
        return false;
    }
    println!("chaos: ok (seed {seed}, history in {})", out.display());
    true
}

/// A run without violations that never exercised a store's fencing (or a lossy
/// store's failing closed) proves nothing about it: false, and says which. On the HA
/// plane (whose short run is its own kinds), a lossy store's failing closed is
/// judged only when its loss was injected.
fn proves_something(verdict: &Verdict, out: &Path, ha: bool) -> bool {
    for store in dbstores::STORES {
        if verdict.stale_rejected.get(store).copied().unwrap_or(0) == 0 {
            println!(
                "chaos: FAILED: the {store} store rejected no stale write, so this run proves \
                 nothing about it (history in {})",
                out.display()
            );
            return false;
        }
    }
    for lossy in dbstores::LOSSY {
        let lost = verdict.faults.get(lossy.fault.name()).copied().unwrap_or(0);
        let refused = verdict
            .no_mark_refused
            .get(lossy.store)
            .copied()
            .unwrap_or(0);
        if (lost == 0 && !ha) || (lost > 0 && refused == 0) {
            println!(
                "chaos: FAILED: the {} store lost its marks {lost} times and refused {refused} \
                 writes for it, so this run proves nothing about failing closed (history in {})",
                lossy.store,
                out.display()
            );
            return false;
        }
    }
    if verdict.stale_rejected_total() == 0 {
        println!(
            "chaos: FAILED: no stale write was attempted, so this run proves nothing \
             (history in {})",
            out.display()
        );
        return false;
    }
    true
}

/// A run in which no semaphore ever had two holders at once proves nothing about
/// semaphores: false, and says which.
fn semaphores_prove_something(verdict: &Verdict, leases: &[ChaosLease], out: &Path) -> bool {
    for lease in leases.iter().filter(|l| l.permits > 1) {
        let most = verdict.most_held.get(&lease.name).copied().unwrap_or(0);
        if most < 2 {
            println!(
                "chaos: FAILED: semaphore {} ({} permits) never had two holders at once (at \
                 most {most}), so this run proves nothing about semaphores (history in {})",
                lease.name,
                lease.permits,
                out.display()
            );
            return false;
        }
    }
    true
}

/// A run whose operators never handed over on each object, or whose deposed leaders
/// had no write refused, proves nothing about fencing operators: false, and says which.
fn operators_prove_something(verdict: &Verdict, out: &Path) -> bool {
    let counts = &verdict.operators;
    for object in [state_object(), status_object()] {
        if counts.handovers.get(&object).copied().unwrap_or(0) == 0 {
            println!(
                "chaos: FAILED: no operator leader's write followed another's on {object}, so \
                 this run proves nothing about fencing operators (history in {})",
                out.display()
            );
            return false;
        }
    }
    if counts.refused == 0 {
        println!(
            "chaos: FAILED: no write of a deposed operator was refused, so this run proves \
             nothing about fencing operators (history in {})",
            out.display()
        );
        return false;
    }
    true
}

/// On the HA plane, every kind of its faults that was injected was followed by at
/// least one stale write the stores rejected (its overlapping holder pause makes
/// one): otherwise the run proves nothing about fencing under that kind.
fn every_ha_kind_met_a_stale_write(verdict: &Verdict, out: &Path) -> bool {
    for kind in crate::faults::HA_FAULTS {
        let name = kind.name();
        let injected = verdict.faults.get(name).copied().unwrap_or(0);
        let stale = verdict.stale_after.get(name).copied().unwrap_or(0);
        if injected == 0 || stale == 0 {
            println!(
                "chaos: FAILED: {name} was injected {injected} times and {stale} stale writes \
                 were rejected after it, so this run proves nothing about it (history in {})",
                out.display()
            );
            return false;
        }
    }
    true
}

fn read_journal(store: &Path) -> Result<Vec<JournalWrite>, String> {
    let fence = palisade::fence::Fence::new(
        palisade::fence::FileStore::open(store).map_err(|e| e.to_string())?,
    );
    fence
        .journal()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|entry| {
            serde_json::from_str::<JournalWrite>(&entry.payload)
                .map_err(|e| format!("journal payload {:?}: {e}", entry.payload))
        })
        .collect()
}
