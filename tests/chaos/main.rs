//! The fault-injection suite: `make chaos DURATION=10m SEED=7` (and a short run in
//! `make test`). Proves, the way Jepsen does, that no stale write is accepted:
//! worker processes contend for Leases and write to every fenced store (the file
//! fence, a ConfigMap, PostgreSQL with its outbox, Redis, MariaDB, S3), and fenced
//! operators contend for a Lease of their own and write to the API server, while a
//! seeded scheduler injects faults; then a checker judges the recorded history (see
//! history.rs for the rules).
//!
//! The controller runs as two replicas with leader election on (identities `c0`,
//! `c1`, ...; a replacement gets a new name), both behind the controller's proxy.
//! The faults, in shuffled rounds of every kind (the first round begins with the
//! pause, its database twin, the storm and the failover):
//!
//! - `pause_holder`: SIGSTOP one holder past its lease, then SIGCONT.
//! - `storm`: SIGSTOP every holder (most, with three or more: a seeded half of the
//!   storms spare one) at the same moment, for 1.5 to 3 lease durations, then SIGCONT
//!   them together: their grants expire together, the waiters are granted in a burst,
//!   and every paused holder wakes up with a stale token.
//! - `kill_holder`: SIGKILL a holder (a new worker takes its place).
//! - `kill_controller`: SIGKILL both replicas, start two new ones 0.2 to 3 s later.
//! - `failover`: SIGKILL the leader the election's coordination.k8s.io Lease names
//!   (so it cannot release), wait for the standby to take over (recorded), then start
//!   a replacement so two replicas run again.
//! - `pause_operator`: SIGSTOP the fenced operators' leader past its lease and until
//!   its successor's grant is published, then SIGCONT (the storm, and on the HA plane
//!   every kind of ha.rs, pause it too).
//! - `split_brain`: one more controller, election off, straight to the API server:
//!   grants must stay safe whatever the election says.
//! - `restart_apiserver`, `restart_etcd`; delays, cuts and black holes of the
//!   controllers' link or the workers' links (`support::proxy`); and the database
//!   faults of dbstores.rs, the outbox relays' among them (outbox_store.rs).
//!
//! It runs on a control plane of its own (other ports, `target/chaos-cluster`), so
//! it can crash kube-apiserver and etcd without disturbing anything else, and tears
//! it down at the end. The history stays in `target/chaos/seed-S-T/` for inspection.
//!
//! `--ha` (`make chaos HA=1`): on the replicated control plane instead (three etcd
//! members, two API servers each behind its load balancer; cluster.sh HA=1). Replicas
//! and workers are spread over the two servers, the harness watches through both
//! (watch_caches.rs judges what it saw), and the rounds add the faults of ha.rs.
//!
//! A test binary without libtest's harness: `cargo test` runs it with no arguments
//! (the short run; `chaos self-check` runs only the checker's self-check, which every
//! run begins with); the flags are `--duration 90s --seed 1 --workers 5 --leases 2
//! --semaphores 1 --permits 2`: the locks `lease-0`, `lease-1` and the semaphore
//! `sem-0`, whose slots each hold a grant with a token of their own; every store keys
//! a slot's writes apart (the grant's fence key, `chaos/sem-0#1`; a fenced ConfigMap
//! per slot, labelled `palisade.dev/fenced-slot`).
//! The same binary is each worker process, of three kinds:
//!
//! - `chaos worker ...` (`w<n>`, worker.rs): holds the Leases through the client
//!   library and writes with its token to every store;
//! - `chaos agent-worker ...` (every third `w<n>`, agent_worker.rs): the same, holding
//!   its grants through `palisade agent` and the Go client (the Go driver from
//!   PALISADE_CONFORMANCE_GO, which the Makefile sets);
//! - `chaos operator-worker ...` (`o0` and `o1`, besides `--workers`;
//!   operator_worker.rs): a fenced operator, running as the service account the
//!   chart's `policies.operators` names (operator_setup.rs; in namespace
//!   `chaos-operators`, the policy narrowed to it and failing closed), leading Lease `operator`
//!   through `palisade::operator::run_while_leading` (confirming against every API
//!   server, each through its load balancer on the HA plane) and writing a ConfigMap
//!   and a Deployment's status through the stamped client.
//!
//! Faults signal a worker's whole process group: an agent worker's agent and driver
//! freeze and die with it.

mod agent_worker;
mod args;
mod cluster;
mod dbstores;
mod faults;
mod ha;
mod history;
mod mysql_store;
mod observer;
mod operator_faults;
mod operator_setup;
mod operator_worker;
mod outbox_store;
mod processes;
mod renewals;
mod rng;
mod s3_store;
mod verdict;
mod watch_caches;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use args::{Args, parse_args};
use cluster::{ChaosLease, ControlPlane, HA_APISERVERS, LEASE_SECONDS, kubeconfig_via};
use faults::{FaultContext, Schedule, inject};
use history::{Event, Recorder};
use processes::{Processes, WorkerTemplate};
use rng::now_ns;
use support::proxy::{Mode, Proxy};
use verdict::LIVENESS_BOUND;

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if raw.first().map(String::as_str) == Some("worker") {
        let args = worker::WorkerArgs::from_args(&raw[1..]).expect("worker arguments");
        runtime.block_on(worker::run(args));
        return ExitCode::SUCCESS;
    }
    if raw.first().map(String::as_str) == Some("agent-worker") {
        let args = worker::WorkerArgs::from_args(&raw[1..]).expect("worker arguments");
        let palisade = PathBuf::from(env!("CARGO_BIN_EXE_palisade"));
        runtime.block_on(agent_worker::run(args, palisade));
        return ExitCode::SUCCESS;
    }
    if raw.first().map(String::as_str) == Some("operator-worker") {
        let args =
            operator_worker::OperatorArgs::from_args(&raw[1..]).expect("operator worker arguments");
        runtime.block_on(operator_worker::run(args));
        return ExitCode::SUCCESS;
    }
    // The checker's self-check alone: no cluster, no stores, nothing started.
    if raw.first().map(String::as_str) == Some("self-check") {
        return match self_check() {
            Ok(()) => ExitCode::SUCCESS,
            Err(()) => ExitCode::FAILURE,
        };
    }
    if raw.iter().any(|a| a == "--list") {
        println!("chaos: test");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args(&raw) {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if std::env::var_os(agent_worker::GO_DRIVER_ENV).is_none() {
        eprintln!(
            "chaos: {} (the Go driver the agent workers hold through) is not set: run it with make chaos or make test",
            agent_worker::GO_DRIVER_ENV
        );
        return ExitCode::from(2);
    }
    if self_check().is_err() {
        return ExitCode::FAILURE;
    }
    let plane = ControlPlane::new(args.ha);
    let started = Instant::now();
    let passed = runtime.block_on(run(&args, &plane));
    if !args.keep_cluster {
        plane.down();
        dbstores::Servers::new(&plane.root).down();
    }
    // The closing line of a libtest binary, so the suite is counted with the others.
    let (word, passed_n, failed_n) = if passed {
        ("ok", 1, 0)
    } else {
        ("FAILED", 0, 1)
    };
    println!(
        "test result: {word}. {passed_n} passed; {failed_n} failed; 0 ignored; 0 measured; \
         0 filtered out; finished in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The checker's rules must be able to fail: each planted violation is reported (and
/// clean histories are not flagged). Says how it went.
fn self_check() -> Result<(), ()> {
    match history::self_check().and_then(|n| {
        Ok(n + watch_caches::self_check()? + s3_store::self_check()? + outbox_store::self_check()?)
    }) {
        Ok(n) => {
            println!("chaos: checker self-check: {n} planted violations all reported");
            Ok(())
        }
        Err(e) => {
            eprintln!("chaos: checker self-check failed: {e}");
            Err(())
        }
    }
}

/// One run on `plane`: set-up, the workers and replicas, faults for `args.duration`,
/// healing, then the verdict. True: it passed.
async fn run(args: &Args, plane: &ControlPlane) -> bool {
    let started = Instant::now();
    let out = history_dir(args, plane);
    let leases = ChaosLease::all(args.leases, args.semaphores, args.permits);
    let Some((admin, servers)) = cluster::bring_up(plane, &leases).await else {
        return false;
    };

    // Separate proxies, so the controller's and the workers' links fail separately;
    // one of each per API server (or load balancer) they are pinned to.
    let admin_text = std::fs::read_to_string(plane.kubeconfig()).expect("kubeconfig");
    let mut controller_proxies = Vec::new();
    let mut worker_proxies = Vec::new();
    let mut controller_kubeconfigs = Vec::new();
    let mut worker_kubeconfigs = Vec::new();
    for (j, port) in plane.entry_ports().into_iter().enumerate() {
        for (who, proxies, kubeconfigs) in [
            (
                "controller",
                &mut controller_proxies,
                &mut controller_kubeconfigs,
            ),
            ("worker", &mut worker_proxies, &mut worker_kubeconfigs),
        ] {
            let proxy = Proxy::start(port).await.expect("proxy");
            kubeconfigs.push(kubeconfig_via(
                &admin_text,
                plane.apiserver_port(),
                proxy.port,
                out.join(format!("{who}-{j}.kubeconfig")),
            ));
            proxies.push(proxy);
        }
    }
    let operator_token = match operator_setup::set_up(&admin, plane, &out).await {
        Ok(path) => path,
        Err(e) => {
            eprintln!("chaos: setting up the operator workers: {e}");
            return false;
        }
    };
    let store = out.join("file-store");
    let mut procs = Processes::new(
        out.clone(),
        controller_kubeconfigs,
        worker_kubeconfigs,
        WorkerTemplate {
            leases: cluster::names(&leases),
            store: store.clone(),
            seed: args.seed,
            operator_token,
            // The operators confirm against every API server the way they reach it.
            servers: worker_proxies
                .iter()
                .map(|p| format!("https://127.0.0.1:{}", p.port))
                .collect(),
        },
    );
    // The store exists before any worker opens it.
    palisade::fence::FileStore::create(&store).expect("creating the file store");

    let observers = start_observers(plane, &admin, &out).await;
    procs.start_relays(dbstores::admin_url()).await;
    procs.start_missing_replicas();
    for _ in 0..args.workers {
        procs.spawn_worker();
    }
    for _ in 0..operator_worker::OPERATOR_WORKERS {
        procs.spawn_operator_worker();
    }
    // Let the first grants and writes happen before any fault.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut faults = Recorder::create(&out.join("faults.jsonl")).expect("fault log");
    let ctx = FaultContext {
        admin: &admin,
        plane,
        leases: &leases,
        controller_proxies: &controller_proxies,
        worker_proxies: &worker_proxies,
    };
    if !inject_faults(args, &ctx, &mut procs, &mut faults, started).await {
        return false;
    }

    // Heal: everything resumed, restored and running, and nothing more injected.
    for proxy in controller_proxies.iter().chain(&worker_proxies) {
        proxy.set(Mode::Pass);
    }
    if plane.ha
        && let Err(e) = ha::heal_links(plane).await
    {
        eprintln!("chaos: healing the control plane's links: {e}");
        return false;
    }
    procs.resume_workers();
    procs.start_missing_replicas();
    let healed = now_ns();
    faults.record(&Event::Healed { t_ns: healed });
    // Workers keep cycling through the Leases; give each time to be granted again.
    tokio::time::sleep(Duration::from_secs(LEASE_SECONDS) + LIVENESS_BOUND).await;
    let relays = procs.relays.take().expect("started above");
    drop(procs);
    for observer in observers {
        observer.abort();
        let _ = observer.await;
    }

    let stores = verdict::Stores {
        file: &store,
        servers: &servers,
        relays: &relays,
    };
    let held = verdict::judge(&out, &stores, &leases, started, args.seed, plane.ha).await;
    let relay_pids = relays.pids();
    drop(relays);
    held & none_left("outbox relay", &relay_pids)
}

/// Whether every one of `pids` is gone (killed and reaped); says which are not.
fn none_left(what: &str, pids: &[u32]) -> bool {
    let left: Vec<&u32> = pids
        .iter()
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    if !left.is_empty() {
        eprintln!("chaos: FAILED: {what} processes still running after the run: {left:?}");
    }
    left.is_empty()
}

/// The harness's watches: straight to the API server, or (HA) one through each.
async fn start_observers(
    plane: &ControlPlane,
    admin: &kube::Client,
    out: &std::path::Path,
) -> Vec<tokio::task::JoinHandle<()>> {
    if !plane.ha {
        return vec![
            tokio::spawn(observer::observe(admin.clone(), out.to_path_buf(), None)),
            tokio::spawn(observer::observe_operator_objects(
                admin.clone(),
                out.to_path_buf(),
                None,
            )),
        ];
    }
    let mut observers = Vec::new();
    for j in 0..HA_APISERVERS {
        let client = worker::client_from(&plane.apiserver_kubeconfig(j)).await;
        observers.push(tokio::spawn(observer::observe_operator_objects(
            client.clone(),
            out.to_path_buf(),
            Some(j as u8),
        )));
        observers.push(tokio::spawn(observer::observe(
            client,
            out.to_path_buf(),
            Some(j as u8),
        )));
    }
    observers
}

/// `target/chaos/seed-S-T/`, created, and the run's parameters printed.
fn history_dir(args: &Args, plane: &ControlPlane) -> PathBuf {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let out = plane
        .root
        .join(format!("target/chaos/seed-{}-{unix}", args.seed));
    std::fs::create_dir_all(&out).expect("creating the history directory");
    println!(
        "chaos: seed {}, {} s of faults, {} workers, {} locks and {} semaphore(s) of {} \
         permits{}; history in {}",
        args.seed,
        args.duration.as_secs(),
        args.workers,
        args.leases,
        args.semaphores,
        args.permits,
        if args.ha {
            ", on the HA control plane"
        } else {
            ""
        },
        out.display()
    );
    out
}

/// Injects faults, one after another, until `args.duration` has passed, each
/// recorded in `faults`. False: a fault could not be injected (the cause printed).
async fn inject_faults(
    args: &Args,
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    faults: &mut Recorder,
    started: Instant,
) -> bool {
    let mut schedule = Schedule::new(args.seed, args.ha);
    let end = Instant::now() + args.duration;
    // On the HA plane, every kind of its own runs at least once (they come first),
    // however long they took.
    let mut ha_kinds_left: Vec<&str> = if args.ha {
        faults::HA_FAULTS.iter().map(|f| f.name()).collect()
    } else {
        Vec::new()
    };
    while Instant::now() < end || !ha_kinds_left.is_empty() {
        let (fault, mut rng) = schedule.next_fault();
        let pause_after = rng.millis(500, 2500);
        let start_ns = now_ns();
        ha_kinds_left.retain(|k| *k != fault.name());
        match inject(fault, ctx, procs, &mut rng).await {
            Ok(Some(target)) => {
                let end_ns = now_ns();
                println!(
                    "chaos: {:>6.1}s {fault} {target} ({} ms)",
                    started.elapsed().as_secs_f64(),
                    (end_ns - start_ns) / 1_000_000
                );
                faults.record(&Event::Fault {
                    fault: fault.name().into(),
                    target,
                    start_ns,
                    end_ns,
                });
            }
            Ok(None) => println!("chaos: {fault} skipped (no holder right now)"),
            Err(e) => {
                eprintln!("chaos: injecting {fault}: {e}");
                return false;
            }
        }
        tokio::time::sleep(pause_after).await;
    }
    true
}
