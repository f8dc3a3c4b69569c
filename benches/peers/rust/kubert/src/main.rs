//! Peer benchmark: `kubert::lease` (LeaseManager) against a real
//! kube-apiserver. Writes the schema of
//! benches/common/schema.rs (source `rust-peers`; see ../README.md).
//!
//! Each candidate uses the crate's own loop: `LeaseManager::init` +
//! `LeaseManager::spawn`, which returns a watch receiver of the current claim;
//! dropping every receiver is kubert's release path (the task then calls
//! `vacate`). One kube client (own connection pool) per candidate.

#[path = "../../common/common.rs"]
mod common;
/// The result schema of every benchmark (one definition, shared with palisade's benches).
#[path = "../../../../common/schema.rs"]
#[allow(dead_code)]
mod schema;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kubert::lease::{ClaimParams, LeaseManager};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

const SYSTEM: &str = "kubert";
// Pinned exactly in Cargo.toml.
const KUBERT_VERSION: &str = "0.25.0";
const KUBE_VERSION: &str = "1.1.0";
const K8S_OPENAPI_VERSION: &str = "0.25.0 (feature v1_33)";

/// 2 s lease. kubert has no retry period and no renew deadline: the holder
/// renews `renew_grace_period` before its claim expires, waiters sleep until
/// the expiry of the claim they last read. A 0.5 s grace makes the holder
/// renew 1.5 s after each renewal, i.e. at the tuned client-go renew deadline.
fn tuned() -> ClaimParams {
    ClaimParams {
        lease_duration: Duration::from_secs(2),
        renew_grace_period: Duration::from_millis(500),
    }
}
const TUNED_DESC: &str = "tuned: lease_duration 2s, renew_grace_period 0.5s (holder renews 1.5s after each renewal; waiters wake at the known expiry, no retry period)";

/// ClaimParams::default() is 30 s / 1 s grace; the 15 s lease keeps its ratio (1/30).
fn default_15s() -> ClaimParams {
    ClaimParams {
        lease_duration: Duration::from_secs(15),
        renew_grace_period: Duration::from_millis(500),
    }
}

#[derive(Default)]
struct CandState {
    /// When this candidate's claim receiver first showed itself as holder.
    leader_at: Option<(Instant, SystemTime)>,
    seen_holder: Option<String>,
    /// Claim updates received while holding (initial claim + renewals).
    renewals: u64,
    /// All claim updates received (initial claim + one per wake of the lease task).
    updates: u64,
    /// The last few update instants (for RPEER_DEBUG).
    recent: std::collections::VecDeque<Instant>,
    lost: bool,
}

type LeaseTask = tokio::task::JoinHandle<Result<(), kubert::lease::Error>>;

struct Cand {
    id: String,
    /// When its last Lease write went out (its client's clock).
    last_write: LastWrite,
    state: Arc<Mutex<CandState>>,
    /// Stops the monitor, which then drops the only claim receiver.
    stop: watch::Sender<bool>,
    monitor: AbortOnDrop<()>,
    lease_task: AbortOnDrop<Result<(), kubert::lease::Error>>,
}

impl Cand {
    async fn start(env: &Env, lease: &str, id: String, params: ClaimParams) -> Res<Cand> {
        let (client, last_write) = candidate_client(&env.cfg, &env.counter)?;
        let api: Api<Lease> = Api::namespaced(client, &env.ns);
        let (mut rx, task): (_, LeaseTask) = retry("LeaseManager::init + spawn", || async {
            let mgr = LeaseManager::init(api.clone(), lease).await?;
            mgr.spawn(id.clone(), params.clone()).await
        })
        .await?;
        let lease_task = AbortOnDrop(task);
        let state = Arc::new(Mutex::new(CandState::default()));
        let (stop, mut stop_rx) = watch::channel(false);
        let (s, me) = (state.clone(), id.clone());
        let monitor = tokio::spawn(async move {
            loop {
                {
                    let claim = rx.borrow_and_update().clone();
                    let now = (Instant::now(), SystemTime::now());
                    let mut st = s.lock().unwrap();
                    st.updates += 1;
                    if st.recent.len() == 8 {
                        st.recent.pop_front();
                    }
                    st.recent.push_back(now.0);
                    if claim.holder == me {
                        if st.leader_at.is_none() {
                            st.leader_at = Some(now);
                        }
                        st.renewals += 1;
                    } else if st.leader_at.is_some() {
                        st.lost = true;
                    }
                    st.seen_holder = Some(claim.holder.clone());
                }
                tokio::select! {
                    _ = stop_rx.changed() => break,
                    r = rx.changed() => if r.is_err() { break },
                }
            }
            drop(rx);
        });
        Ok(Cand {
            id,
            last_write,
            state,
            stop,
            monitor: AbortOnDrop(monitor),
            lease_task,
        })
    }

    fn leader_at(&self) -> Option<(Instant, SystemTime)> {
        self.state.lock().unwrap().leader_at
    }

    fn renewals(&self) -> u64 {
        self.state.lock().unwrap().renewals
    }

    fn updates(&self) -> u64 {
        self.state.lock().unwrap().updates
    }

    fn sees(&self, holder: &str) -> bool {
        self.state.lock().unwrap().seen_holder.as_deref() == Some(holder)
    }

    fn describe(&self) -> String {
        let s = self.state.lock().unwrap();
        let task = if self.lease_task.0.is_finished() {
            "finished"
        } else {
            "running"
        };
        format!(
            "{}: seen_holder={:?} lease task {task}",
            self.id, s.seen_holder
        )
    }

    /// kubert's release: drop the claim receiver; the lease task vacates and ends.
    async fn release(&mut self, limit: Duration) -> Res<()> {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(limit, &mut self.monitor.0).await;
        match tokio::time::timeout(limit, &mut self.lease_task.0).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(err(format!("{} lease task (vacate): {e}", self.id))),
            Ok(Err(e)) => Err(err(format!("{} lease task: {e}", self.id))),
            Err(_) => Err(err(format!("{} lease task did not end", self.id))),
        }
    }

    /// Silent death: abort the lease task (no vacate), then drop the receiver.
    async fn kill(&mut self, limit: Duration) -> Res<()> {
        self.lease_task.0.abort();
        match tokio::time::timeout(limit, &mut self.lease_task.0).await {
            Ok(Err(e)) if e.is_cancelled() => {}
            Ok(_) => {
                return Err(err(format!(
                    "{} lease task ended before the abort",
                    self.id
                )))
            }
            Err(_) => return Err(err(format!("{} lease task did not stop", self.id))),
        }
        let _ = self.stop.send(true);
        Ok(())
    }
}

fn limit(p: &ClaimParams) -> Duration {
    p.lease_duration * 3 + Duration::from_secs(10)
}

async fn wait_leader(c: &Cand, lim: Duration) -> Res<()> {
    wait_until("leadership", lim, || c.leader_at().is_some())
        .await
        .map_err(|e| err(format!("{e} ({})", c.describe())))
}

async fn wait_sees(c: &Cand, holder: &str, lim: Duration) -> Res<()> {
    wait_until("waiter to observe the holder", lim, || c.sees(holder))
        .await
        .map_err(|e| err(format!("{e} ({})", c.describe())))
}

async fn create_lease(env: &Env, name: &str) -> Res<()> {
    // LeaseManager::init needs an existing Lease (404 otherwise).
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let l: Lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name}, "spec": {}
    }))?;
    let pp = PostParams::default();
    retry("create lease", || leases.create(&pp, &l)).await?;
    Ok(())
}

/// One lane: a chain of handovers A -> B -> C ... on its own Lease.
async fn lane(
    env: Arc<Env>,
    lane: usize,
    rounds: usize,
    expiry: bool,
    p: Arc<Progress>,
) -> LaneOut {
    let mut out = LaneOut::default();
    if let Err(e) = lane_inner(&env, lane, rounds, expiry, &p, &mut out).await {
        out.error = Some(format!("lane {lane}: {e}"));
    }
    out
}

async fn lane_inner(
    env: &Env,
    lane: usize,
    rounds: usize,
    expiry: bool,
    p: &Progress,
    out: &mut LaneOut,
) -> Res<()> {
    let params = tuned();
    let lim = limit(&params);
    let kind = if expiry { "exp" } else { "rel" };
    let lease = format!("{kind}-{lane}");
    create_lease(env, &lease).await?;
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut holder =
        Cand::start(env, &lease, format!("{kind}-{lane}-c000"), params.clone()).await?;
    wait_leader(&holder, lim).await?;
    let mut r = 0;
    while out.samples.len() < rounds {
        r += 1;
        if r > 2 * rounds {
            return Err(err("too many discarded rounds"));
        }
        let waiter = Cand::start(
            env,
            &lease,
            format!("{kind}-{lane}-c{r:03}"),
            params.clone(),
        )
        .await?;
        wait_until("the waiter to observe the holder", lim, || {
            waiter.sees(&holder.id) || waiter.leader_at().is_some()
        })
        .await
        .map_err(|e| err(format!("{e} ({})", waiter.describe())))?;
        if waiter.leader_at().is_some() {
            // The holder's renewal was late and the new waiter took the lease.
            out.spurious.push(format!(
                "{} took the lease from {} before the round started",
                waiter.id, holder.id
            ));
            holder = waiter;
            continue;
        }
        let t0;
        let mut expiry_wall = None;
        if expiry {
            // Die right after a renewal, so no renew request is in flight.
            let n = holder.renewals();
            wait_until("a renewal", lim, || {
                holder.renewals() > n || holder.state.lock().unwrap().lost
            })
            .await?;
            if holder.state.lock().unwrap().lost {
                out.spurious
                    .push(format!("{} lost the lease before the kill", holder.id));
                wait_leader(&waiter, lim).await?;
                holder = waiter;
                continue;
            }
            t0 = Instant::now();
            holder.kill(lim).await?;
            let l = retry("GET lease", || leases.get(&lease)).await?;
            let spec = l.spec.ok_or_else(|| err("lease without spec"))?;
            if spec.holder_identity.as_deref() != Some(holder.id.as_str()) {
                out.spurious.push(format!(
                    "{} no longer held the lease when killed",
                    holder.id
                ));
                wait_leader(&waiter, lim).await?;
                holder = waiter;
                continue;
            }
            // From the send of the holder's last renewal, as its client saw it (not
            // the renewTime it stamped before sending): every bench's expiry clock
            // starts there.
            let sent = holder
                .last_write
                .lock()
                .unwrap()
                .ok_or_else(|| err("the holder never wrote its Lease"))?;
            let dur = spec
                .lease_duration_seconds
                .ok_or_else(|| err("no leaseDurationSeconds"))?;
            expiry_wall = Some(sent + Duration::from_secs(dur as u64));
        } else {
            // A steadily campaigning waiter: let B's lease task complete one
            // wake (its first wake is at the expiry of the claim it read at
            // start, later ones follow the holder's renewals).
            wait_until("the waiter's first wake", lim, || waiter.updates() >= 2).await?;
            // Release at a uniformly random phase of B's wake cycle, which
            // follows the holder's renewals: period duration - grace = 1.5 s.
            jitter(params.lease_duration - params.renew_grace_period).await;
            if holder.state.lock().unwrap().lost {
                out.spurious
                    .push(format!("{} lost the lease before the release", holder.id));
                wait_leader(&waiter, lim).await?;
                holder = waiter;
                continue;
            }
            t0 = Instant::now();
            holder.release(lim).await?;
            // Sanity: vacate cleared the holder (B cannot have taken over yet
            // unless its wake was due).
            let l = retry("GET lease", || leases.get(&lease)).await?;
            let h = l.spec.and_then(|s| s.holder_identity);
            if h.as_deref() == Some(holder.id.as_str()) {
                return Err(err(format!(
                    "{} still holds the lease after vacate",
                    holder.id
                )));
            }
        }
        wait_leader(&waiter, lim).await?;
        let (t1, t1_wall) = waiter.leader_at().expect("checked");
        if t1 < t0 {
            out.spurious.push(format!(
                "{} took over before the handover started",
                waiter.id
            ));
            holder = waiter;
            continue;
        }
        let sample = match expiry_wall {
            Some(e) => {
                out.extra.push(ms(t1 - t0));
                wall_diff_ms(t1_wall, e)
            }
            None => ms(t1 - t0),
        };
        out.samples.push(sample);
        p.tick(lane, sample);
        if std::env::var_os("RPEER_DEBUG").is_some() {
            let rel = |v: &std::collections::VecDeque<Instant>| {
                v.iter()
                    .map(|t| {
                        let d = if *t >= t0 { ms(*t - t0) } else { -ms(t0 - *t) };
                        format!("{d:+.0}")
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let (a, b) = (
                holder.state.lock().unwrap().recent.clone(),
                waiter.state.lock().unwrap().recent.clone(),
            );
            println!("    lane {lane} round {r}: {sample:.1} ms; holder updates [{}] waiter updates [{}] (ms vs t0)", rel(&a), rel(&b));
        }
        holder = waiter;
    }
    let _ = holder.release(lim).await;
    Ok(())
}

/// One idle baseline, then on a fresh Lease the holder alone, then 1 holder + 3
/// waiters: warm-up and window each. Returns (idle, holder alone, all four).
async fn steady_attempt(env: &Env, args: &Args, attempt: u64) -> Res<(Rate, Rate, Rate)> {
    let params = default_15s();
    let lim = limit(&params);
    let lease = format!("steady-{attempt}");
    println!(
        "steady state (attempt {attempt}): idle baseline for {}s",
        args.baseline
    );
    let base = measure_rate(&env.admin, &env.counter, Duration::from_secs(args.baseline)).await?;
    println!(
        "  baseline {:.3} req/s (cluster-wide lease requests)",
        base.server_rps
    );
    create_lease(env, &lease).await?;
    let holder = Cand::start(
        env,
        &lease,
        format!("steady{attempt}-holder"),
        params.clone(),
    )
    .await?;
    wait_leader(&holder, lim).await?;
    println!(
        "  the holder alone; warm-up {}s, window {}s",
        args.warmup, args.steady
    );
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    let alone = measure_rate(&env.admin, &env.counter, Duration::from_secs(args.steady)).await?;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let w = Cand::start(
            env,
            &lease,
            format!("steady{attempt}-waiter-{i}"),
            params.clone(),
        )
        .await?;
        wait_sees(&w, &holder.id, lim).await?;
        waiters.push(w);
    }
    println!(
        "  1 holder + 3 waiters running; warm-up {}s, window {}s",
        args.warmup, args.steady
    );
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    let r = measure_rate(&env.admin, &env.counter, Duration::from_secs(args.steady)).await?;
    drop(waiters);
    drop(holder);
    Ok((base, alone, r))
}

async fn steady(env: &Env, args: &Args, o: &mut Source) -> Res<()> {
    let mut attempt = 1;
    let (base, alone, r, warn) = loop {
        let (base, alone, r) = steady_attempt(env, args, attempt).await?;
        let warn = contamination(r.server_rps - base.server_rps, r.client_rps).unwrap_or_default();
        if !warn.is_empty() {
            println!(" {warn}");
        }
        if warn.is_empty() || attempt >= args.steady_attempts {
            break (base, alone, r, warn);
        }
        attempt += 1;
    };
    let warn = format!(
        "{warn} Attempt {attempt} of at most {}.",
        args.steady_attempts
    );
    let cfg = "15s lease, renew_grace_period 0.5s (ClaimParams::default() is 30s/1s; ratio kept)";
    o.figures.extend(holder_and_waiter_figures(
        SYSTEM,
        cfg,
        args.warmup,
        (&base, &alone, &r),
    ));
    o.figures.push(Figure {
        system: SYSTEM.into(),
        config: String::new(),
        name: "lease_requests_per_s_1_holder_3_waiters".into(),
        value: round3(r.server_rps - base.server_rps),
        unit: "req/s".into(),
        note: format!(
            "{cfg}; apiserver_request_total{{group=coordination.k8s.io,resource=leases}} delta over {:.1}s after {}s warm-up, \
             minus idle baseline {:.3} req/s (measured over {:.1}s just before); raw {:.3} req/s. Expected: per 14.5s the \
             holder sends 1 PATCH and each waiter wakes at the expiry it knows, sends a stale acquire PATCH (409) and a GET \
             = 7/14.5 = 0.48 req/s. The requests come in one burst per period (waiters all wake at the holder's old expiry), \
             so the window should span whole periods: 58 s by default (--steady), 4 x 14.5 s.",
            r.seconds, args.warmup, base.server_rps, base.seconds, r.server_rps
        ) + &warn,
    });
    o.figures.push(Figure {
        system: SYSTEM.into(),
        config: String::new(),
        name: "lease_requests_per_s_1_holder_3_waiters_client_side".into(),
        value: round3(r.client_rps),
        unit: "req/s".into(),
        note: format!(
            "same window, lease requests sent by the 4 candidates counted in their HTTP client stacks: {}",
            methods_note(&r.client_by_method)
        ),
    });
    o.figures.push(Figure {
        system: SYSTEM.into(),
        config: String::new(),
        name: "idle_cluster_lease_requests_per_s".into(),
        value: round3(base.server_rps),
        unit: "req/s".into(),
        note: "baseline subtracted above: other cluster components (kube-controller-manager, apiserver identity leases, other users)".into(),
    });
    Ok(())
}

async fn run(env: Arc<Env>, args: &Args, o: &mut Source) -> Res<()> {
    let mut failures = Vec::new();
    if args.release_rounds > 0 {
        println!(
            "release: {} handovers over {} lanes ({TUNED_DESC})",
            args.release_rounds,
            args.lanes.min(args.release_rounds)
        );
        let p = Progress::new("release", args.release_rounds);
        let lo = run_lanes(args.release_rounds, args.lanes, Duration::ZERO, |l, n| {
            lane(env.clone(), l, n, false, p.clone())
        })
        .await;
        let mut note = "t0 = just before A drops its claim receiver (kubert's release path: the spawned lease task then \
             calls LeaseManager::vacate, which clears holderIdentity/renewTime/leaseDurationSeconds with a \
             resourceVersion-guarded strategic merge patch); t1 = B's claim receiver first shows B as holder (same \
             process, separate kube clients). kubert waiters do not poll: B sleeps until the expiry of the claim it last \
             read (refreshed with a 409 + GET at each wake), so vacate does not wake it; the handover happens at B's next \
             scheduled wake, uniform over the 1.5 s renew period, not at the release. B had completed at least one \
             wake before the release (a just-started waiter first wakes at the expiry it read, up to 2 s later)."
            .to_string();
        note.push_str(&lo.note_suffix());
        failures.extend(lo.errors.iter().cloned());
        o.latency
            .push(summarize(SYSTEM, TUNED_DESC, "release", &lo.samples, note));
    }
    if args.expiry_rounds > 0 {
        println!(
            "expiry: {} handovers over {} lanes ({TUNED_DESC})",
            args.expiry_rounds,
            args.lanes.min(args.expiry_rounds)
        );
        let p = Progress::new("expiry", args.expiry_rounds);
        let lo = run_lanes(
            args.expiry_rounds,
            args.lanes,
            tuned().lease_duration,
            |l, n| lane(env.clone(), l, n, true, p.clone()),
        )
        .await;
        let raw_sum = summarize(SYSTEM, "", "", &lo.extra, String::new());
        let mut note = format!(
            "A's lease task aborted right after a renewal (no vacate); value = B's claim receiver shows B (wall clock) \
             minus (the send of A's last renewal, taken in A's HTTP client as the request went out, + \
             leaseDurationSeconds 2s), signed. B sleeps exactly until the expiry it reads (A's renewTime, stamped before \
             that send, + 2s), so this is ~one acquire round trip. Raw time from A's abort to B leader: p50 {:.1} ms, p99 {:.1} ms, \
             max {:.1} ms.",
            raw_sum.p50,
            raw_sum.p99,
            raw_sum.max
        );
        note.push_str(&lo.note_suffix());
        failures.extend(lo.errors.iter().cloned());
        o.latency.push(summarize(
            SYSTEM,
            TUNED_DESC,
            "expiry-past-duration",
            &lo.samples,
            note,
        ));
    }
    o.latency.push(not_applicable(
        SYSTEM,
        "pod-deletion",
        "not applicable: kubert::lease manages a Lease only; it has no notion of pods (no owner references, no pod \
         watch). A deleted pod frees the lease by expiry (see expiry-past-duration), or by vacate if the process drops \
         its claim receiver on SIGTERM (see release).",
    ));
    if args.steady > 0 {
        if let Err(e) = steady(&env, args, o).await {
            failures.push(format!("steady state: {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(err(failures.join("; ")))
    }
}

const PEER: Peer = Peer {
    system: SYSTEM,
    slug: "kubert",
    version: KUBERT_VERSION,
    kube: KUBE_VERSION,
    k8s_openapi: K8S_OPENAPI_VERSION,
    other: "the kube-leader-election figures come from the separate rustpeer-kle binary",
    default_steady: 58,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut session = start(&PEER).await;
    let failure = Run::bounded(
        session.args.timeout,
        run(session.env.clone(), &session.args, &mut session.output),
    )
    .await;
    session.finish(failure).await;
}
