//! Phase 5 (at the size `--failover-at`): failover between two replicas with leader
//! election; and the election's own API cost.

use super::*;
use k8s_openapi::api::coordination::v1::Lease as ElectionLease;

/// One configuration of the election timings.
struct Timings {
    /// The Latency row's config; also names the election Lease and the identities.
    name: &'static str,
    kills: usize,
    /// Timing flags; none: the binary's defaults.
    flags: &'static [&'static str],
    /// How long after a SIGKILL the grant may take before the phase fails.
    bound: Duration,
    what: &'static str,
}

struct Replica {
    ctrl: Controller,
    identity: String,
}

/// Replaces the single controller `ctrl` by two replicas with leader election, kills the
/// leader again and again (first with the default timings, then with the old ones), and
/// returns a single controller (no election) for the next phase.
pub(crate) async fn failover(
    s: &Size<'_>,
    procs: &mut Procs,
    mut ctrl: Controller,
    renewer: &Renewer,
    pairs: &Arc<Vec<Pair>>,
    report: &mut Report,
) -> Result<Controller> {
    let n = s.n;
    let small = n < 1000;
    let configs = [
        Timings {
            name: "default",
            kills: s.args.failover_kills.unwrap_or(if small { 3 } else { 20 }),
            flags: &[],
            bound: Duration::from_secs(30),
            what: "the binary's default election timings (lease 1s, renew deadline 750ms, retry 250ms)",
        },
        Timings {
            name: "before",
            kills: s
                .args
                .failover_before_kills
                .unwrap_or(if small { 1 } else { 5 }),
            flags: &[
                "--leader-elect-lease-duration",
                "15s",
                "--leader-elect-renew-deadline",
                "10s",
                "--leader-elect-retry-period",
                "2s",
            ],
            bound: Duration::from_secs(60),
            what: "the old election timings (lease 15s, renew deadline 10s, retry 2s)",
        },
    ];
    let total: usize = configs.iter().map(|c| c.kills).sum();
    if total > n {
        bail!("failover: {total} kills need as many Leases, there are {n}");
    }
    let window = s
        .args
        .steady
        .unwrap_or(Duration::from_secs(if small { 3 } else { 10 }));
    let client = s.leases.clone().into_client();
    let election: Api<ElectionLease> = Api::namespaced(client.clone(), s.ns);
    let log = s.args.out.join(format!("scale-failover-{n}.log"));
    let _ = std::fs::remove_file(&log);
    let mut watch = LeaseWatch::start(s.leases.clone()).await?;

    // The single controller goes; the idle rate of election requests without ours
    // (kube-controller-manager's and kube-apiserver's own Leases).
    ctrl.kill().await;
    let (idle_rate, _) = election_rate(&client, window).await?;

    // Lease indices from the end: the handover phase deletes from the start (and skips these).
    let mut next_lease = n;
    for cfg in &configs {
        if cfg.kills == 0 {
            continue;
        }
        let mut next_id = 0;
        let mut replicas = Vec::new();
        for _ in 0..2 {
            replicas.push(spawn_replica(s, &log, cfg, next_id)?);
            next_id += 1;
        }
        for r in &mut replicas {
            r.ctrl.wait_ready(s.deadline).await?;
        }
        let election_name = election_name(cfg);
        find_leader(&mut replicas, &election, &election_name, cfg.bound).await?;
        let transitions_0 = transitions(&election, &election_name).await?;
        if cfg.name == "default" {
            // Both replicas idle (renewals do not reach them as API requests of theirs).
            let (rate, secs) = election_rate(&client, window).await?;
            report.fig(
                n,
                "election_requests_per_s",
                rate - idle_rate,
                "req/s",
                format!(
                    "the election's own API cost: requests of 2 idle replicas (leader + standby) to coordination.k8s.io leases, from kube-apiserver's apiserver_request_total (all verbs) over {secs:.0} s, less the idle cluster's rate without them ({idle_rate:.3} req/s: kube-controller-manager's and kube-apiserver's own Leases) over as long just before; {}",
                    cfg.what
                ),
            );
        }
        let mut gaps = Vec::new();
        let mut takeovers = Vec::new();
        for round in 0..cfg.kills {
            next_lease -= 1;
            let (gap, survivor) = kill_round(
                s,
                &mut replicas,
                cfg,
                next_lease,
                &mut watch,
                &election,
                renewer,
                pairs,
            )
            .await
            .with_context(|| format!("failover ({}), kill {}", cfg.name, round + 1))?;
            gaps.push(gap);
            takeovers.push(survivor);
            let mut fresh = spawn_replica(s, &log, cfg, next_id)?;
            next_id += 1;
            fresh.ctrl.wait_ready(s.deadline).await?;
            replicas.push(fresh);
        }
        let transitions_1 = transitions(&election, &election_name).await?;
        for mut r in replicas {
            r.ctrl.kill().await;
        }
        let unexpected = takeovers.iter().filter(|ok| !**ok).count();
        report.latency(schema::Latency::of(
            "palisade",
            cfg.name,
            "failover",
            gaps,
            &format!(
                "{n} Leases held, {n} waiters queued, renewals at {:.0}/s; 2 replicas, the standby synced (/readyz) before every kill. From SIGKILL of the leading replica (holderIdentity of the election Lease) to the new leader's grant of the Lease whose holder claim the bench deleted right after the kill, as the bench's Lease watch saw it (its delay included); {}; the election Lease's leaseTransitions went {transitions_0} -> {transitions_1}{}",
                s.renew_rate,
                cfg.what,
                if unexpected > 0 {
                    format!(
                        "; in {unexpected} rounds the election Lease did not name the surviving replica right after the grant"
                    )
                } else {
                    String::new()
                }
            ),
        ));
    }

    // The next phase's controller, alone again.
    let mut ctrl = Controller::spawn(
        s.root,
        s.ns,
        &s.args.out.join(format!("scale-controller-{n}.log")),
    )?;
    procs.controller = ctrl.pid;
    ctrl.wait_ready(s.deadline).await?;
    Ok(ctrl)
}

fn election_name(cfg: &Timings) -> String {
    format!("palisade-bench-{}", cfg.name)
}

fn spawn_replica(s: &Size<'_>, log: &Path, cfg: &Timings, id: usize) -> Result<Replica> {
    let identity = format!("{}-{id}", cfg.name);
    let mut flags: Vec<String> = [
        "--leader-elect=true",
        "--election-namespace",
        s.ns,
        "--election-name",
        &election_name(cfg),
        "--identity",
        &identity,
    ]
    .iter()
    .map(|f| f.to_string())
    .collect();
    flags.extend(cfg.flags.iter().map(|f| f.to_string()));
    let ctrl = Controller::spawn_with(s.root, s.ns, log, &flags)?;
    Ok(Replica { ctrl, identity })
}

/// The election Lease's holder, when it is one of `replicas` and that replica says it
/// leads (`palisade_is_leader`); waits at most `bound`.
async fn find_leader(
    replicas: &mut [Replica],
    election: &Api<ElectionLease>,
    name: &str,
    bound: Duration,
) -> Result<usize> {
    let until = Instant::now() + bound;
    let mut holder = None;
    while Instant::now() < until {
        holder = election
            .get_opt(name)
            .await?
            .and_then(|l| l.spec?.holder_identity);
        if let Some(i) = replicas
            .iter()
            .position(|r| Some(&r.identity) == holder.as_ref())
        {
            replicas[i].ctrl.check_alive()?;
            if replicas[i].ctrl.metric("palisade_is_leader").await.ok() == Some(1.0) {
                return Ok(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "no leader among the replicas {:?} after {bound:?} (the election Lease {name} names {holder:?})",
        replicas.iter().map(|r| &r.identity).collect::<Vec<_>>()
    )
}

async fn transitions(election: &Api<ElectionLease>, name: &str) -> Result<i32> {
    Ok(election
        .get_opt(name)
        .await?
        .and_then(|l| l.spec?.lease_transitions)
        .unwrap_or(0))
}

/// Requests per second to coordination.k8s.io Leases over `window`.
async fn election_rate(client: &Client, window: Duration) -> Result<(f64, f64)> {
    let before = apiserver_requests(client, is_election_request).await?;
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let after = apiserver_requests(client, is_election_request).await?;
    let secs = t.elapsed().as_secs_f64();
    Ok(((after - before) / secs, secs))
}

/// One kill: SIGKILL the leader, delete the holder claim of Lease `i` at once, and
/// time until the Lease shows its waiter as holder. Returns the gap (ms) and whether
/// the election Lease then names the surviving replica.
#[allow(clippy::too_many_arguments)]
async fn kill_round(
    s: &Size<'_>,
    replicas: &mut Vec<Replica>,
    cfg: &Timings,
    i: usize,
    watch: &mut LeaseWatch,
    election: &Api<ElectionLease>,
    renewer: &Renewer,
    pairs: &Arc<Vec<Pair>>,
) -> Result<(f64, bool)> {
    let name = election_name(cfg);
    let leader = find_leader(replicas, election, &name, cfg.bound).await?;
    let mut dead = replicas.remove(leader);
    watch.drain();
    let t_kill = Instant::now();
    dead.ctrl
        .child
        .start_kill()
        .context("SIGKILL of the leader")?;
    renewer.released[i].store(true, Ordering::Relaxed);
    let (holder, waiter) = (&pairs[i].holder.0, &pairs[i].waiter.0);
    let dp = DeleteParams::default();
    match with_retry(|| s.claims.delete(holder, &dp)).await {
        Err(e) if !is_status(&e, 404) => return Err(e.context(format!("deleting {holder}"))),
        _ => {}
    }
    let lease = lease_name(i);
    let until = t_kill + cfg.bound;
    let granted = loop {
        match tokio::time::timeout_at(until.into(), watch.rx.recv()).await {
            Ok(Some(seen)) if seen.lease == lease && seen.held_by(waiter) => break seen.at,
            Ok(Some(_)) => {}
            Ok(None) => bail!("the Lease watch ended"),
            Err(_) => bail!(
                "no grant of {lease} to {waiter} within {:?} of the SIGKILL of the leader {} (logs: scale-failover-{}.log)",
                cfg.bound,
                dead.identity,
                s.n
            ),
        }
    };
    let gap = (granted - t_kill).as_secs_f64() * 1e3;
    let _ = tokio::time::timeout(Duration::from_secs(10), dead.ctrl.child.wait()).await;
    let named = election
        .get_opt(&name)
        .await?
        .and_then(|l| l.spec?.holder_identity);
    let survivor_named = replicas.iter().any(|r| Some(&r.identity) == named.as_ref());
    Ok((gap, survivor_named))
}
