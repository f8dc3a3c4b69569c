//! Semaphores on the local control plane (`make bench`): a slot's handover against a
//! lock's, in the same run, and a semaphore of 10 permits under 100 contenders.
//!
//! Slot handover: as `handover.rs`'s release, one handover at a time, from the
//! holder's `Grant::release` being called to the waiter's `acquire` returning; on a
//! lock, and on a semaphore of 3 whose two other slots stay held, rounds interleaved
//! (lock, semaphore, lock...) so that both meet the same machine. The semaphore's
//! waiter takes the plain path (no early confirmation, `client::head`), so the
//! difference is what that costs.
//!
//! Contention: `--contenders` tasks in one process, on one `LeaseClient`, each in a
//! loop for `--seconds`: acquire any slot, hold `--hold-ms`, release. Grants/s is the
//! grants over the window; every acquire's wait (call to return) is a sample, and the
//! fairness figure is the longest wait over the mean one (1 would be perfectly even;
//! FIFO bounds it by the queue's length, not by luck).
//!
//! A program that prints figures, not a test: `cargo bench --bench semaphore --
//! [--rounds N] [--contenders N] [--permits N] [--seconds S] [--hold-ms MS] [--out
//! DIR]`; writes `DIR/palisade-semaphore.json` (`benches/common/schema.rs`). Needs the
//! cluster of `make cluster`; `make test` runs a smoke version.

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};
use palisade::crd::LeaseSpec;
use serde_json::json;
use tokio::sync::Mutex;

use cluster::wait_waiting;
use schema::{Figure, Latency, SEMAPHORE_ROWS, Source};

/// Semaphores: a slot's handover and a semaphore under contention (`make bench`).
#[derive(clap::Parser)]
struct Args {
    /// Handovers on the lock and on the semaphore, each.
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// Contention: the tasks contending.
    #[arg(long, default_value_t = 100)]
    contenders: usize,
    /// Contention: the semaphore's permits.
    #[arg(long, default_value_t = 10)]
    permits: i32,
    /// Contention: the window, seconds.
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Contention: how long each grant is held, milliseconds.
    #[arg(long, default_value_t = 100)]
    hold_ms: u64,
    /// Where palisade-semaphore.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Args {
    let a = <Args as clap::Parser>::parse();
    assert!(
        (1..=10_000).contains(&a.rounds) && (1..=1_000).contains(&a.contenders),
        "--rounds 1..=10000, --contenders 1..=1000"
    );
    assert!((2..=64).contains(&a.permits), "--permits 2..=64");
    assert!(
        (1.0..=600.0).contains(&a.seconds) && a.hold_ms <= 60_000,
        "--seconds 1..=600, --hold-ms at most 60000"
    );
    a
}

#[tokio::main]
async fn main() {
    let args = args();
    let (kubeconfig, config, client) = cluster::connect().await;
    let ns = format!("bench-semaphore-{}", std::process::id());
    cluster::create_namespace(&client, &ns).await;
    let (mut controller, _) = cluster::start_controller(&kubeconfig, &ns).await;
    let leases = LeaseClient::from_config(config, Some(&ns)).expect("a LeaseClient");
    let started = Instant::now();

    eprintln!(
        "palisade: {} release handovers on a lock and on a semaphore of 3, interleaved",
        args.rounds
    );
    let (lock, slot) = slot_and_lock_handovers(&leases, args.rounds).await;
    eprintln!(
        "palisade: {} contenders on a semaphore of {} for {} s, holding {} ms",
        args.contenders, args.permits, args.seconds, args.hold_ms
    );
    let contention = contend(&leases, &args).await;

    let _ = controller.start_kill();
    let _ = controller.wait().await;
    cluster::delete_namespace(&client, &ns).await;

    let source = report(&args, lock, slot, contention, started, &client).await;
    let path = source.write_to(&args.out);
    let md = source.summary("palisade semaphore", |l| &l.config);
    println!("\n{md}\n\nwrote {}", path.display());
}

fn options(identity: &str) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod: PodBinding::None,
        timeout: Some(Duration::from_secs(60)),
        slot: None,
    }
}

async fn create(leases: &LeaseClient, name: &str, permits: i32) {
    let spec = LeaseSpec {
        lease_duration_seconds: 15,
        permits,
    };
    leases.ensure_lease_with(name, spec).await.unwrap();
}

/// Release handovers on a lock and on a semaphore of 3 (two slots held throughout),
/// round by round in turn: (lock samples, slot samples), ms.
async fn slot_and_lock_handovers(leases: &LeaseClient, rounds: usize) -> (Vec<f64>, Vec<f64>) {
    create(leases, "lock", 1).await;
    create(leases, "sem", 3).await;
    let mut lock = leases.acquire("lock", options("lock-0")).await.unwrap();
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(
            leases
                .acquire("sem", options(&format!("sem-{i}")))
                .await
                .unwrap(),
        );
    }
    // The handovers go round slot 0's holder; the others keep theirs.
    let mut sem = held.remove(0);
    let (mut lock_samples, mut slot_samples) = (Vec::new(), Vec::new());
    for i in 1..=rounds {
        let (next, ms) = hand_over(leases, "lock", lock, &format!("lock-{i}")).await;
        lock = next;
        lock_samples.push(ms);
        let (next, ms) = hand_over(leases, "sem", sem, &format!("sem-x{i}")).await;
        sem = next;
        slot_samples.push(ms);
    }
    for grant in [lock, sem].into_iter().chain(held) {
        grant.release().await.unwrap();
    }
    (lock_samples, slot_samples)
}

/// One release handover on `lease` from `holder` to a new waiter named `next`: the
/// new holder, and the ms from the release call to its acquire returning.
async fn hand_over(leases: &LeaseClient, lease: &str, holder: Grant, next: &str) -> (Grant, f64) {
    let l = leases.clone();
    let (name, identity) = (lease.to_string(), next.to_string());
    let waiter = tokio::spawn(async move { l.acquire(&name, options(&identity)).await });
    wait_waiting(leases, lease, 1).await;
    let let_go = Instant::now();
    holder.release().await.unwrap();
    let grant = waiter.await.unwrap().unwrap();
    (grant, let_go.elapsed().as_secs_f64() * 1e3)
}

/// What the contention run measured.
struct Contention {
    grants: usize,
    window: Duration,
    waits_ms: Vec<f64>,
    /// Grants per slot, by slot.
    per_slot: Vec<usize>,
}

/// `--contenders` tasks acquire, hold and release the semaphore for `--seconds`.
async fn contend(leases: &LeaseClient, args: &Args) -> Contention {
    create(leases, "contended", args.permits).await;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let slots = Arc::new(Mutex::new(vec![0usize; args.permits as usize]));
    let until = Instant::now() + Duration::from_secs_f64(args.seconds);
    let hold = Duration::from_millis(args.hold_ms);
    let began = Instant::now();
    let tasks: Vec<_> = (0..args.contenders)
        .map(|i| {
            let (leases, waits, slots) = (leases.clone(), waits.clone(), slots.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let asked = Instant::now();
                    let Ok(grant) = leases.acquire("contended", options(&format!("c{i}"))).await
                    else {
                        continue;
                    };
                    waits.lock().await.push(asked.elapsed().as_secs_f64() * 1e3);
                    slots.lock().await[grant.slot() as usize] += 1;
                    tokio::time::sleep(hold).await;
                    let _ = grant.release().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let window = began.elapsed();
    let waits_ms = std::mem::take(&mut *waits.lock().await);
    let per_slot = std::mem::take(&mut *slots.lock().await);
    Contention {
        grants: waits_ms.len(),
        window,
        waits_ms,
        per_slot,
    }
}

async fn report(
    args: &Args,
    lock: Vec<f64>,
    slot: Vec<f64>,
    c: Contention,
    started: Instant,
    client: &kube::Client,
) -> Source {
    let [
        (release, lock_config),
        (_, slot_config),
        (wait, contended_config),
    ] = SEMAPHORE_ROWS;
    let release_note =
        "Grant::release called -> the waiter's acquire returns; one handover at a time";
    let mean = c.waits_ms.iter().sum::<f64>() / c.waits_ms.len().max(1) as f64;
    let longest = c.waits_ms.iter().copied().fold(0.0, f64::max);
    let latency = vec![
        Latency::of("palisade", lock_config, release, lock, release_note),
        Latency::of(
            "palisade",
            slot_config,
            release,
            slot,
            &format!("{release_note}; slot 0 of a semaphore of 3, slots 1 and 2 held throughout"),
        ),
        Latency::of(
            "palisade",
            contended_config,
            wait,
            c.waits_ms,
            &format!(
                "{} contenders, {} permits, each grant held {} ms: acquire called -> returns",
                args.contenders, args.permits, args.hold_ms
            ),
        ),
    ];
    let figure = |name: &str, value: f64, unit: &str, note: String| Figure {
        system: "palisade".into(),
        config: contended_config.into(),
        name: name.into(),
        value,
        unit: unit.into(),
        note,
    };
    let figures = vec![
        figure(
            "semaphore_grants_per_s",
            c.grants as f64 / c.window.as_secs_f64(),
            "grants/s",
            format!(
                "{} grants in {:.1} s; at most, with no overhead: {} permits / {} ms held = {:.0} grants/s",
                c.grants,
                c.window.as_secs_f64(),
                args.permits,
                args.hold_ms,
                f64::from(args.permits) * 1e3 / args.hold_ms.max(1) as f64
            ),
        ),
        figure(
            "semaphore_wait_max_over_mean",
            longest / mean,
            "ratio",
            format!(
                "longest wait {longest:.0} ms over the mean {mean:.0} ms; grants per slot {:?}",
                c.per_slot
            ),
        ),
    ];
    let version = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    Source {
        source: "palisade-semaphore".into(),
        versions: schema::palisade_versions(Some(version)),
        latency,
        figures,
        parameters: schema::parameters(
            vec![
                ("rounds", json!(args.rounds)),
                ("contenders", json!(args.contenders)),
                ("permits", json!(args.permits)),
                ("seconds", json!(args.seconds)),
                ("hold_ms", json!(args.hold_ms)),
            ],
            started,
        ),
    }
}
