//! Phase 8: the storm on semaphores. As the storm on locks (`storm`), on N Leases of
//! `--storm-permits` permits in a namespace of their own: every slot's holder silent
//! at once and a bare claim waiting for each slot.

use super::*;

/// The semaphores' namespace, beside the size's own.
pub(crate) fn semaphore_namespace(ns: &str) -> String {
    format!("{ns}-sem")
}

/// A claim for any slot of Lease `i`, the `k`th of its kind there.
fn slot_claim_json(prefix: &str, i: usize, k: usize) -> Value {
    named_claim_json(&format!("{prefix}-{i:05}-{k}"), i)
}

/// Sets up the semaphores (no controller running), grants every slot, then runs the
/// storm between floor passes (floor, storm, floor, floor).
pub(crate) async fn semaphore_storm(
    client: &Client,
    s: &Size<'_>,
    procs: &mut Procs,
    api_capacity: f64,
    report: &mut Report,
) -> Result<()> {
    let (n, permits) = (s.n, s.args.storm_permits);
    let ns = semaphore_namespace(s.ns);
    create_namespace(client, &ns).await?;
    let sem = Size {
        ns: &ns,
        leases: Api::namespaced(client.clone(), &ns),
        claims: Api::namespaced(client.clone(), &ns),
        events: Api::namespaced(client.clone(), &ns),
        ..*s
    };
    let d = storm_duration(s.args, n);

    // 1. N semaphores, then every slot's holder h-i-k, then a waiter w-i-k per slot
    // (holders first, so FIFO order grants them).
    let t = Instant::now();
    let inflight = s.args.inflight;
    create_all(&sem.leases, n, inflight, |i| {
        json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
               "metadata": {"name": lease_name(i)},
               "spec": {"leaseDurationSeconds": s.args.lease_duration, "permits": permits}})
    })
    .await
    .context("creating the semaphores")?;
    let slots = n * permits as usize;
    let per = permits as usize;
    create_all(&sem.claims, slots, inflight, |j| {
        slot_claim_json("h", j / per, j % per)
    })
    .await
    .context("creating the slots' holder claims")?;
    create_all(&sem.claims, slots, inflight, |j| {
        slot_claim_json("w", j / per, j % per)
    })
    .await
    .context("creating the slots' waiter claims")?;
    let created_s = t.elapsed().as_secs_f64();

    // 2. Every slot granted to its holder, then the controller goes.
    let log = s.args.out.join(format!("scale-semaphore-grant-{n}.log"));
    let _ = std::fs::remove_file(&log);
    let t = Instant::now();
    let mut ctrl = Controller::spawn(s.root, &ns, &log)?;
    ctrl.wait_ready(s.deadline).await?;
    ctrl.wait_grants(&|| slots as f64, t, s.deadline, &mut Vec::new())
        .await?;
    ctrl.settle(s.deadline).await?;
    ctrl.kill().await;
    let granted_s = t.elapsed().as_secs_f64();
    let held = held_grants(&sem.leases).await?;
    let by_holders = held.iter().filter(|(c, _, _)| c.starts_with("h-")).count();
    if held.len() != slots || by_holders != slots {
        bail!(
            "semaphore storm: {} of {slots} slots held after the initial grant, {by_holders} by their h- claims (log: {})",
            held.len(),
            log.display()
        );
    }
    let expected: HashMap<String, Vec<String>> = (0..n)
        .map(|i| {
            let waiters = (0..per).map(|k| format!("w-{i:05}-{k}")).collect();
            (lease_name(i), waiters)
        })
        .collect();
    last_renewals(&sem, held)
        .await
        .context("the slots' holders' last renewals")?;
    let spec_s = set_spec_duration(&sem, d).await?;
    println!(
        "scale: semaphore storm at {n}: {n} semaphores of {permits} and {} claims created in {created_s:.1} s, {slots} slots granted in {granted_s:.1} s, spec durations set in {spec_s:.1} s",
        2 * slots
    );

    // 3. Floor, storm, floor, floor (the first pass sets every grant's recorded
    // duration to D, as in the storm on locks).
    let mut watch = LeaseWatch::start(sem.leases.clone()).await?;
    let mut floors = vec![floor_pass(&sem.leases, n, d, procs).await?];
    let outcome = run_storm(
        &sem,
        procs,
        &mut watch,
        d,
        "semaphore",
        Waiters::Bare(&expected),
    )
    .await?;
    floors.push(floor_pass(&sem.leases, n, d, procs).await?);
    floors.push(floor_pass(&sem.leases, n, d, procs).await?);
    drop(watch);
    let floor = floor_figures(&sem, d, "storm_semaphore_floor", &floors, report);
    storm_figures(&sem, d, "semaphore", &outcome, floor, api_capacity, report);
    Ok(())
}
