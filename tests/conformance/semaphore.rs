//! The semaphore scenario: a Lease of 3 permits and 6 contenders. Three hold a slot
//! each while three wait in a queue of known order; then the holder of slot 0 is
//! asked to release (SIGTERM), slot 1's is SIGKILLed and slot 2's is frozen past its
//! lease (SIGSTOP, then SIGCONT), and each time the head of the queue must be granted
//! the slot that was freed. The verdict of every run (verdict.rs) checks the rest:
//! never more than 3 believers, tokens increasing per slot, each slot fenced apart.

use std::time::Duration;

use kube::api::Api;
use palisade::client::LeaseClient;
use palisade::crd::{Lease, LeaseSpec};
use tokio::time::{Instant, sleep};

use crate::holder::{Client, Grant, Said};
use crate::scenarios::{Run, ms};
use crate::verdict;

pub const PERMITS: u32 = 3;

/// A holder of the suite (index into the run's holders) and its grant.
type Held = (usize, Grant);

pub async fn three_permits_six_contenders(run: &mut Run<'_>) -> Result<String, String> {
    if run.client.through_agent() {
        create_semaphore(run).await?;
    }
    let held = first_holders(run).await?;
    permits_of_the_lease(run).await?;
    let queue = queue_waiters(run).await?;
    let [slot_0, slot_1, slot_2] = held;
    let release = release_slot(run, slot_0, queue[0]).await?;
    let kill = kill_slot(run, slot_1, queue[1]).await?;
    let freeze = freeze_slot(run, slot_2, queue[2], [queue[0], queue[1]]).await?;
    // The check of every run must have seen the semaphore full, or it proved nothing.
    let (most, _) = verdict::most_believed(&run.resource.entries());
    if most != PERMITS as usize {
        return Err(format!("at most {most} believers at once, never {PERMITS}"));
    }
    Ok(format!(
        "{PERMITS} slots held, never more believers; the freed slot to the head of the queue {release} after SIGTERM, {kill} after SIGKILL, {freeze}"
    ))
}

/// The agent creates locks only: for its clients the suite creates the semaphore.
/// (The library's driver and `palisade lock` create it themselves, with `--permits`.)
async fn create_semaphore(run: &Run<'_>) -> Result<(), String> {
    let leases = LeaseClient::new(run.suite.kube.clone(), &run.suite.setup.namespace);
    let spec = LeaseSpec {
        lease_duration_seconds: run.suite.setup.duration_secs,
        permits: PERMITS as i32,
    };
    match leases.ensure_lease_with(&run.lease, spec).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("lease {} existed already", run.lease)),
        Err(e) => Err(format!("creating the semaphore {}: {e}", run.lease)),
    }
}

async fn lease_object(run: &Run<'_>) -> Result<Lease, String> {
    let leases: Api<Lease> = Api::namespaced(run.suite.kube.clone(), &run.suite.setup.namespace);
    leases
        .get(&run.lease)
        .await
        .map_err(|e| format!("reading lease {}: {e}", run.lease))
}

/// The Lease is the semaphore the scenario is about (for the library and `palisade
/// lock`: they created it as asked).
async fn permits_of_the_lease(run: &Run<'_>) -> Result<(), String> {
    let permits = lease_object(run).await?.spec.permits;
    if permits != PERMITS as i32 {
        return Err(format!("lease {} has {permits} permit(s)", run.lease));
    }
    Ok(())
}

/// Three contenders, each granted a slot of its own and writing: slots 0, 1 and 2.
async fn first_holders(run: &mut Run<'_>) -> Result<[Held; 3], String> {
    // Before the spawns: the first may be granted while the others start.
    let start = Instant::now();
    let mut holders = Vec::new();
    for _ in 0..PERMITS {
        holders.push(run.spawn().await);
    }
    let mut held = Vec::new();
    for h in holders {
        let (at, grant) = run.granted_slot(h, start, run.duration() * 2).await?;
        run.admitted_writes(h, 2, at).await?;
        held.push((h, grant));
    }
    held.sort_by_key(|(_, grant)| grant.slot);
    let slots: Vec<u32> = held.iter().map(|(_, grant)| grant.slot).collect();
    if slots != [0, 1, 2] {
        return Err(format!(
            "the first three holders were granted slots {slots:?}"
        ));
    }
    Ok(held.try_into().expect("three holders"))
}

/// Three more contenders, each queued (the Lease counts it waiting) before the next
/// starts: the queue's order is theirs.
async fn queue_waiters(run: &mut Run<'_>) -> Result<Vec<usize>, String> {
    let mut queue = Vec::new();
    for waiting in 1..=PERMITS as i64 {
        queue.push(run.spawn().await);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = lease_object(run).await?.status.unwrap_or_default();
            if status.waiting_count == Some(waiting) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not queued within 10 s: {:?} waiting",
                    run.id(*queue.last().unwrap()),
                    status.waiting_count
                ));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(queue)
}

/// The first grant after `since`, of any holder, within `limit`, must be `head`'s, in
/// the slot `freed` held, with a higher token; the time it took.
async fn handed_to_head(
    run: &Run<'_>,
    freed: &Grant,
    head: usize,
    since: Instant,
    limit: Duration,
) -> Result<Duration, String> {
    let e = run
        .resource
        .wait_for(
            &format!("grant of slot {}", freed.slot),
            since,
            limit,
            |e| matches!(e.said, Said::Granted(_)),
        )
        .await?;
    let Said::Granted(grant) = &e.said else {
        unreachable!()
    };
    let head_id = run.id(head);
    if e.holder != head_id || grant.slot != freed.slot || grant.token <= freed.token {
        return Err(format!(
            "slot {} (token {}) freed; the next grant was {}'s, slot {} with token {}, not the head of the queue's ({head_id})",
            freed.slot, freed.token, e.holder, grant.slot, grant.token
        ));
    }
    run.admitted_writes(head, 2, e.at).await?;
    Ok(e.at - since)
}

/// SIGTERM: the holder releases, exits 0, and its slot goes to the head of the queue
/// within a third of a lease (as in the release scenario).
async fn release_slot(run: &mut Run<'_>, (h, grant): Held, head: usize) -> Result<String, String> {
    let asked = Instant::now();
    run.holders[h].signal(libc::SIGTERM);
    let handover = handed_to_head(run, &grant, head, asked, run.duration()).await?;
    let code = run.holders[h].exited(Duration::from_secs(12)).await?;
    if code != Some(0) {
        return Err(format!("{} exited {code:?} on SIGTERM, not 0", run.id(h)));
    }
    if handover > run.duration() / 3 {
        return Err(format!(
            "slot {} granted {} after SIGTERM: the release did not free it",
            grant.slot,
            ms(handover)
        ));
    }
    Ok(ms(handover))
}

/// SIGKILL: the slot goes to the head of the queue well before the lease would expire
/// (as in the kill scenario: the socket's close, or the pod's deletion, ends the grant).
async fn kill_slot(run: &mut Run<'_>, (h, grant): Held, head: usize) -> Result<String, String> {
    let killed = Instant::now();
    run.holders[h].signal(libc::SIGKILL);
    if !run.client.through_agent() {
        run.delete_pod(h).await;
    }
    let handover = handed_to_head(run, &grant, head, killed, run.duration() * 2).await?;
    if handover > run.duration() / 2 {
        return Err(format!(
            "slot {} granted {} after SIGKILL: not well before the lease would expire",
            grant.slot,
            ms(handover)
        ));
    }
    Ok(ms(handover))
}

/// SIGSTOP past the lease: the slot goes to the head of the queue; once continued the
/// holder is told it lost the grant, and its stale writes are refused by its slot's
/// fence alone: every refused write of the run is its own, under its slot's key, and
/// the other slots' holders go on writing, admitted.
async fn freeze_slot(
    run: &mut Run<'_>,
    (h, grant): Held,
    head: usize,
    others: [usize; 2],
) -> Result<String, String> {
    let stopped = Instant::now();
    run.holders[h].signal(libc::SIGSTOP);
    let handover = handed_to_head(run, &grant, head, stopped, run.duration() * 3).await?;
    let continued = Instant::now();
    run.holders[h].signal(libc::SIGCONT);
    let (_, reason) = run
        .told_lost(h, continued, run.duration() + Duration::from_secs(5))
        .await?;
    sleep(Duration::from_millis(300)).await; // its last (stale) write
    let after_stale = Instant::now();
    for other in others {
        run.admitted_writes(other, 2, after_stale).await?;
    }
    let id = run.id(h);
    let mut stale = 0;
    for e in run.resource.entries() {
        if let Said::Wrote {
            admitted: false,
            fence_key,
            ..
        } = &e.said
        {
            if e.holder != id || *fence_key != grant.fence_key {
                return Err(format!("{}'s write under {fence_key} refused", e.holder));
            }
            stale += 1;
        }
    }
    let (admitted, _) = run.resource.writes(&id, stopped + handover);
    if admitted > 0 {
        return Err(format!(
            "{admitted} stale writes of slot {} admitted",
            grant.slot
        ));
    }
    let slot = grant.slot;
    let stale = if run.client == Client::Lock {
        // The watchdog SIGKILLed the command at the local deadline: it never wrote stale.
        format!("{stale} stale writes (command killed by the watchdog)")
    } else if stale == 0 {
        return Err("the frozen holder's stale write never reached the fence".into());
    } else {
        format!("{stale} stale writes refused by slot {slot}'s fence, none by the others'")
    };
    Ok(format!(
        "{} after SIGSTOP; {stale}; told lost ({reason})",
        ms(handover)
    ))
}
