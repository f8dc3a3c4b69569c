//! Peer benchmark: `kube-leader-election` (LeaseLock) against a real
//! kube-apiserver. Writes the schema of
//! benches/common/schema.rs (source `rust-peers`; see ../README.md).
//!
//! The crate offers no loop of its own: an application calls
//! `try_acquire_or_renew()` periodically (holder and waiters alike) and
//! `step_down()` to release. This bench does exactly that, one kube client
//! (own connection pool) per candidate.

#[path = "../../common/common.rs"]
mod common;
/// The result schema of every benchmark (one definition, shared with palisade's benches).
#[path = "../../../../common/schema.rs"]
#[allow(dead_code)]
mod schema;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

const SYSTEM: &str = "kube-leader-election";
// Pinned exactly in Cargo.toml.
const KLE_VERSION: &str = "0.44.0";
const KUBE_VERSION: &str = "4.2.0";
const K8S_OPENAPI_VERSION: &str = "0.28.0 (feature v1_36)";

#[derive(Clone, Copy)]
struct Timing {
    ttl: Duration,
    /// Period of `try_acquire_or_renew()` calls, for the holder and the waiters.
    interval: Duration,
}

/// 2 s lease; the call period is the "tuned" client-go retry period (0.25 s).
/// kube-leader-election has no renew deadline.
const TUNED: Timing = Timing {
    ttl: Duration::from_secs(2),
    interval: Duration::from_millis(250),
};
const TUNED_DESC: &str =
    "tuned: lease_ttl 2s, try_acquire_or_renew() every 250ms (holder and waiters)";

/// 15 s lease, calls every ttl/3 = 5 s: the crate's documented recommendation
/// ("if lease_ttl is set to 15 seconds, one should renew it every 5 seconds").
const DEFAULT: Timing = Timing {
    ttl: Duration::from_secs(15),
    interval: Duration::from_secs(5),
};

#[derive(Default)]
struct CandState {
    /// When this candidate's own call first returned `Acquired`.
    leader_at: Option<(Instant, SystemTime)>,
    seen_holder: Option<String>,
    lost: bool,
    errors: u64,
    last_error: Option<String>,
}

struct Cand {
    id: String,
    /// When its last Lease write went out (its client's clock).
    last_write: LastWrite,
    lock: Arc<LeaseLock>,
    state: Arc<Mutex<CandState>>,
    stop: watch::Sender<bool>,
    task: AbortOnDrop<()>,
}

impl Cand {
    fn start(env: &Env, lease: &str, id: String, t: Timing) -> Res<Cand> {
        let (client, last_write) = candidate_client(&env.cfg, &env.counter)?;
        let lock = Arc::new(LeaseLock::new(
            client,
            &env.ns,
            LeaseLockParams {
                lease_name: lease.into(),
                holder_id: id.clone(),
                lease_ttl: t.ttl,
            },
        ));
        let state = Arc::new(Mutex::new(CandState::default()));
        let (stop, mut stop_rx) = watch::channel(false);
        let (l, s, me) = (lock.clone(), state.clone(), id.clone());
        let task = tokio::spawn(async move {
            loop {
                let r =
                    tokio::time::timeout(Duration::from_secs(10), l.try_acquire_or_renew()).await;
                let now = (Instant::now(), SystemTime::now());
                {
                    let mut st = s.lock().unwrap();
                    match r {
                        Ok(Ok(LeaseLockResult::Acquired(_))) => {
                            if st.leader_at.is_none() {
                                st.leader_at = Some(now);
                            }
                            st.seen_holder = Some(me.clone());
                        }
                        Ok(Ok(LeaseLockResult::NotAcquired(lease))) => {
                            st.seen_holder = lease.spec.and_then(|s| s.holder_identity);
                            if st.leader_at.is_some() {
                                st.lost = true;
                            }
                        }
                        Ok(Err(e)) => {
                            st.errors += 1;
                            st.last_error = Some(e.to_string());
                        }
                        Err(_) => {
                            st.errors += 1;
                            st.last_error = Some("try_acquire_or_renew timed out".into());
                        }
                    }
                }
                tokio::select! {
                    _ = stop_rx.changed() => break,
                    _ = tokio::time::sleep(t.interval) => {}
                }
            }
        });
        Ok(Cand {
            id,
            last_write,
            lock,
            state,
            stop,
            task: AbortOnDrop(task),
        })
    }

    fn leader_at(&self) -> Option<(Instant, SystemTime)> {
        self.state.lock().unwrap().leader_at
    }

    fn sees(&self, holder: &str) -> bool {
        self.state.lock().unwrap().seen_holder.as_deref() == Some(holder)
    }

    fn describe(&self) -> String {
        let s = self.state.lock().unwrap();
        format!(
            "{}: errors={} last_error={:?} seen_holder={:?}",
            self.id, s.errors, s.last_error, s.seen_holder
        )
    }

    /// Stops the renew loop (at its sleep point, never mid-request) and waits for it.
    async fn stop_loop(&mut self, limit: Duration) -> Res<()> {
        let _ = self.stop.send(true);
        tokio::time::timeout(limit, &mut self.task.0)
            .await
            .map_err(|_| err(format!("{} loop did not stop", self.id)))?
            .map_err(|e| err(format!("{} loop: {e}", self.id)))
    }
}

fn limit(t: Timing) -> Duration {
    t.ttl * 3 + Duration::from_secs(10)
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
    let t = TUNED;
    let lim = limit(t);
    let kind = if expiry { "exp" } else { "rel" };
    let lease = format!("{kind}-{lane}");
    let mut holder = Cand::start(env, &lease, format!("{kind}-{lane}-c000"), t)?;
    wait_leader(&holder, lim).await?;
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut r = 0;
    while out.samples.len() < rounds {
        r += 1;
        if r > 2 * rounds {
            return Err(err("too many discarded rounds"));
        }
        // Start the waiter at a random phase against the holder's renewals.
        jitter(t.interval).await;
        let waiter = Cand::start(env, &lease, format!("{kind}-{lane}-c{r:03}"), t)?;
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
        // Randomise the release instant against the waiter's poll phase.
        jitter(t.interval).await;
        holder.stop_loop(lim).await?;
        if holder.state.lock().unwrap().lost {
            out.spurious
                .push(format!("{} lost the lease before the release", holder.id));
            wait_leader(&waiter, lim).await?;
            holder = waiter;
            continue;
        }
        let t0 = Instant::now();
        let mut expiry_wall = None;
        if expiry {
            // Silent stop: no step_down. The Lease still names the holder.
            let l = retry("GET lease", || leases.get(&lease)).await?;
            let spec = l.spec.ok_or_else(|| err("lease without spec"))?;
            if spec.holder_identity.as_deref() != Some(holder.id.as_str()) {
                out.spurious.push(format!(
                    "{} no longer held the lease when stopped",
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
            if let Err(e) = retry("step_down", || holder.lock.step_down()).await {
                if waiter.leader_at().is_none() {
                    return Err(e);
                }
                out.spurious.push(format!(
                    "{} lost the lease before step_down: {e}",
                    holder.id
                ));
                holder = waiter;
                continue;
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
        holder = waiter;
    }
    let _ = holder.stop_loop(lim).await;
    Ok(())
}

/// One idle baseline, then on a fresh Lease the holder alone, then 1 holder + 3
/// waiters: warm-up and window each. Returns (idle, holder alone, all four).
async fn steady_attempt(env: &Env, args: &Args, attempt: u64) -> Res<(Rate, Rate, Rate)> {
    let t = DEFAULT;
    let lim = limit(t);
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
    let holder = Cand::start(env, &lease, format!("steady{attempt}-holder"), t)?;
    wait_leader(&holder, lim).await?;
    println!(
        "  the holder alone; warm-up {}s, window {}s",
        args.warmup, args.steady
    );
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    let alone = measure_rate(&env.admin, &env.counter, Duration::from_secs(args.steady)).await?;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let w = Cand::start(env, &lease, format!("steady{attempt}-waiter-{i}"), t)?;
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
    let cfg = "15s lease, try_acquire_or_renew() every 5s (ttl/3, the crate's documented ratio) by holder and waiters";
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
             minus idle baseline {:.3} req/s (measured over {:.1}s just before); raw {:.3} req/s. Expected: holder GET+PATCH, \
             each waiter GET, every 5s = 1.0 req/s (default window 30 s = 6 call periods).",
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
        let mut note = "t0 = just before A's LeaseLock::step_down() (A's renew loop already stopped); t1 = B's own \
             try_acquire_or_renew() returns Acquired (same process, separate kube clients). step_down() writes \
             holderIdentity=\"\", leaseDurationSeconds=1, renewTime=now, so waiters may only take the lease once \
             renewTime+1s has passed: the handover is bounded below by ~1 s plus B's poll phase (<=250 ms)."
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
        let lo = run_lanes(args.expiry_rounds, args.lanes, TUNED.ttl, |l, n| {
            lane(env.clone(), l, n, true, p.clone())
        })
        .await;
        let raw_sum = summarize(SYSTEM, "", "", &lo.extra, String::new());
        let mut note = format!(
            "A's renew loop stopped silently right after a renewal (no step_down); value = B's Acquired (wall clock) minus \
             (the send of A's last renewal, taken in A's HTTP client as the request went out, + leaseDurationSeconds \
             2s), signed. kle considers a lease expired when \
             now > renewTime+duration and B polls every 250 ms, so expect ~0-250 ms. Raw time from A's stop to B leader: \
             p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms.",
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
        "not applicable: kube-leader-election locks a Lease only; it has no notion of pods (no owner references, no pod \
         watch). A deleted pod frees the lease by expiry (see expiry-past-duration), or through step_down() + the 1 s \
         window if the application calls it on SIGTERM (see release).",
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
    slug: "kle",
    version: KLE_VERSION,
    kube: KUBE_VERSION,
    k8s_openapi: K8S_OPENAPI_VERSION,
    other: "the kubert figures come from the separate rustpeer-kubert binary",
    default_steady: 30,
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
