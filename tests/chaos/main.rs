//! The fault-injection suite: `make chaos DURATION=10m SEED=7` (and a short run in
//! `make test`). Proves, the way Jepsen does, that no stale write is accepted:
//! worker processes contend for Leases and write to four fenced stores while a
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
//! - `split_brain`: one more controller, election off, straight to the API server:
//!   grants must stay safe whatever the election says.
//! - `restart_apiserver`, `restart_etcd`; delays, cuts and black holes of the
//!   controllers' link or the workers' links (proxy.rs); and the database faults of
//!   dbstores.rs.
//!
//! It runs on a control plane of its own (other ports, `target/chaos-cluster`), so
//! it can crash kube-apiserver and etcd without disturbing anything else, and tears
//! it down at the end. The history stays in `target/chaos/seed-S-T/` for inspection.
//!
//! A test binary without libtest's harness: `cargo test` runs it with no arguments
//! (the short run); the flags are `--duration 90s --seed 1 --workers 5 --leases 2`.
//! The same binary, started as `chaos worker ...`, is a worker process; every third
//! worker is started as `chaos agent-worker ...` and holds its grants through
//! `palisade agent` and the Go client (agent_worker.rs; the Go driver from
//! PALISADE_CONFORMANCE_GO, which the Makefile sets). Faults signal a worker's whole
//! process group: an agent worker's agent and driver freeze and die with it.

mod agent_worker;
mod dbstores;
mod history;
mod proxy;
mod renewals;
mod rng;
mod worker;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as CoordinationLease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt, ResourceExt};
use palisade::api::{Lease, LeaseClaim};
use palisade::client::LeaseClient;
use serde_json::json;

use history::{Event, Expectations, JournalWrite, Recorder};
use proxy::{Mode, Proxy};
use rng::{Rng, now_ns};

const NAMESPACE: &str = "chaos";
/// Lease duration of every Lease in the run.
const LEASE_SECONDS: u64 = 2;
/// Writes per grant of the long-holding workers: 50 to 250 ms apart, one and a half
/// to three lease durations (short enough to leave the liveness bound its margin).
const LONG_HOLD_WRITES: u64 = 20;
/// After the faults stop, each Lease must be granted again within its duration plus
/// this: the controller's and workers' watches that were cut reconnect with the backoff
/// of `palisade::watch` (0.2 s doubling to 2 s, plus jitter), and a holder killed just
/// before the end is only expired after its duration (10 s for all that, as before
/// leader election); and the replicas may have to elect a leader first, when the last
/// fault killed the leader or both replicas: a standby takes over once the dead
/// leader's record has stood unrenewed for the election's lease duration, at its next
/// try at the latest (the election's own promise, DESIGN.md "Leader election").
const LIVENESS_BOUND: Duration = Duration::from_secs(10)
    .saturating_add(ELECTION_LEASE)
    .saturating_add(ELECTION_RETRY);

/// The controller runs as this many replicas with leader election on.
const REPLICAS: usize = 2;
/// The election's coordination.k8s.io Lease, in [`NAMESPACE`].
const ELECTION_NAME: &str = "chaos-controller";
/// The election timings, passed as flags (the controller's defaults, stated here so
/// the liveness bound above is computed from what the replicas really run with).
const ELECTION_LEASE: Duration = Duration::from_secs(1);
const ELECTION_RENEW_DEADLINE: Duration = Duration::from_millis(750);
const ELECTION_RETRY: Duration = Duration::from_millis(250);
/// How long `failover` waits for a standby to take over before it gives up waiting
/// (and says so in the fault's record): many times the election's promise.
const TAKEOVER_WAIT: Duration = Duration::from_secs(15);
/// A silenced holder is expired within its duration plus this: the confirmation read,
/// the marks and Lease writes, a take-over under way (the election's lease and a
/// retry), and the next holder's acquire or the harness's watch seeing it, with a
/// margin for a loaded machine (4.4 s past the silence was seen in a 10-minute run);
/// still less than the five durations of leadership changes `flap_leadership` makes,
/// which a new leader restarting the holder clocks would add.
const SILENCED_EXPIRY_SLACK: Duration = Duration::from_secs(5);

// The suite's own control plane: ports apart from `make cluster`'s.
const ETCD_PORT: u16 = 23791;
const ETCD_PEER_PORT: u16 = 23801;
const APISERVER_PORT: u16 = 16444;
const KCM_PORT: u16 = 16258;

struct Args {
    duration: Duration,
    seed: u64,
    workers: usize,
    leases: usize,
    keep_cluster: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("duration {s:?}: expected a number with a unit, like 90s or 10m"))?;
    match unit {
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("duration {s:?}: the unit must be s, m or h")),
    }
}

/// Our flags, and libtest's (which `cargo test -- --test-threads 4` passes to every
/// test binary) ignored. `Ok(None)`: a name filter that excludes this suite.
fn parse_args(raw: &[String]) -> Result<Option<Args>, String> {
    let mut args = Args {
        duration: Duration::from_secs(90),
        seed: 1,
        workers: 5,
        leases: 2,
        keep_cluster: false,
    };
    let mut it = raw.iter();
    let mut filters = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--duration" => args.duration = parse_duration(&value()?)?,
            "--seed" => {
                let v = value()?;
                args.seed = v
                    .parse()
                    .map_err(|_| format!("--seed {v:?}: not a number"))?
            }
            "--workers" => {
                let v = value()?;
                args.workers = v
                    .parse()
                    .map_err(|_| format!("--workers {v:?}: not a number"))?
            }
            "--leases" => {
                let v = value()?;
                args.leases = v
                    .parse()
                    .map_err(|_| format!("--leases {v:?}: not a number"))?
            }
            "--keep-cluster" => args.keep_cluster = true,
            "--test-threads" | "--skip" | "--format" | "--color" | "--logfile" | "-Z" => {
                value()?;
            }
            a if a.starts_with('-') => {} // a libtest switch: nothing for us
            filter => filters.push(filter.to_string()),
        }
    }
    if !filters.is_empty() && !filters.iter().any(|f| "chaos".contains(f.as_str())) {
        return Ok(None);
    }
    if args.workers < 2 || args.leases < 1 || args.workers < args.leases {
        return Err("need at least 2 workers, 1 lease, and no more leases than workers".into());
    }
    if args.duration < Duration::from_secs(30) {
        return Err("--duration: at least 30s (one round of every fault kind)".into());
    }
    Ok(Some(args))
}

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
    match history::self_check() {
        Ok(n) => println!("chaos: checker self-check: {n} planted violations all reported"),
        Err(e) => {
            eprintln!("chaos: checker self-check failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    let plane = ControlPlane::new();
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

/// The suite's own etcd + kube-apiserver (+ controller-manager), via cluster.sh.
struct ControlPlane {
    root: PathBuf,
    state: PathBuf,
}

impl ControlPlane {
    fn new() -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let state = root.join("target/chaos-cluster");
        ControlPlane { root, state }
    }

    fn script(&self, args: &[&str]) -> Result<(), String> {
        let bin_dir = std::env::var("PALISADE_BIN_DIR")
            .map_err(|_| "PALISADE_BIN_DIR is not set: run through `make chaos` or `make test`")?;
        let status = Command::new(self.root.join("tests/controlplane/cluster.sh"))
            .args(args)
            .env("BIN_DIR", bin_dir)
            .env("STATE_DIR", &self.state)
            .env("ETCD_PORT", ETCD_PORT.to_string())
            .env("ETCD_PEER_PORT", ETCD_PEER_PORT.to_string())
            .env("APISERVER_PORT", APISERVER_PORT.to_string())
            .env("KCM_PORT", KCM_PORT.to_string())
            // The machine's one node belongs to `make cluster`; the suite needs none.
            .env("NODE", "0")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cluster.sh: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("cluster.sh {} failed: {status}", args.join(" ")))
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.state.join("kubeconfig")
    }

    fn down(&self) {
        if let Err(e) = self.script(&["down"]) {
            eprintln!("chaos: {e}");
        }
    }
}

/// Every process the run started; all SIGKILLed when it ends.
struct Processes {
    palisade: PathBuf,
    out: PathBuf,
    controller_kubeconfig: PathBuf,
    worker_kubeconfig: PathBuf,
    /// The elected replicas, by identity (`c0`, `c1`, ...; a replacement gets a new
    /// name, as a Deployment's pod does).
    controllers: Vec<(String, std::process::Child)>,
    spawned_controllers: usize,
    workers: Vec<(String, std::process::Child)>,
    spawned_workers: usize,
    worker_template: WorkerTemplate,
}

struct WorkerTemplate {
    leases: Vec<String>,
    store: PathBuf,
    seed: u64,
}

/// How a controller process takes part in leader election.
enum Election<'a> {
    /// A replica of the elected pair, with this identity.
    Replica(&'a str),
    /// `--leader-elect=false`: grants from the start, whoever else is leading.
    Off,
}

impl Processes {
    fn start_controller(
        &self,
        kubeconfig: &Path,
        election: Election<'_>,
        log_name: &str,
    ) -> std::process::Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.out.join(log_name))
            .expect("controller log");
        let mut command = Command::new(&self.palisade);
        command.args(["controller", "--namespace", NAMESPACE]);
        match election {
            Election::Replica(identity) => {
                command
                    .args(["--leader-elect=true", "--election-namespace", NAMESPACE])
                    .args(["--election-name", ELECTION_NAME, "--identity", identity])
                    .arg(format!(
                        "--leader-elect-lease-duration={}s",
                        ELECTION_LEASE.as_secs()
                    ))
                    .arg(format!(
                        "--leader-elect-renew-deadline={}ms",
                        ELECTION_RENEW_DEADLINE.as_millis()
                    ))
                    .arg(format!(
                        "--leader-elect-retry-period={}ms",
                        ELECTION_RETRY.as_millis()
                    ));
            }
            Election::Off => {
                command.arg("--leader-elect=false");
            }
        }
        // Port 0: every replica gets an admin port of its own.
        command
            .args(["--admin-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning palisade controller")
    }

    /// One more elected replica, behind the controller proxy. Returns its identity.
    fn start_replica(&mut self) -> String {
        let identity = format!("c{}", self.spawned_controllers);
        self.spawned_controllers += 1;
        let child = self.start_controller(
            &self.controller_kubeconfig,
            Election::Replica(&identity),
            &format!("controller-{identity}.log"),
        );
        self.controllers.push((identity.clone(), child));
        identity
    }

    /// Starts replicas until [`REPLICAS`] run.
    fn start_missing_replicas(&mut self) -> Vec<String> {
        let mut started = Vec::new();
        for _ in 0..REPLICAS {
            if self.controllers.len() >= REPLICAS {
                break;
            }
            started.push(self.start_replica());
        }
        started
    }

    /// The process of the replica with this identity, if it runs.
    fn controller_pid(&self, identity: &str) -> Option<i32> {
        self.controllers
            .iter()
            .find(|(id, _)| id == identity)
            .map(|(_, child)| child.id() as i32)
    }

    /// SIGKILLs one replica (it cannot release the election lease). False: no such replica.
    fn kill_replica(&mut self, identity: &str) -> bool {
        let Some(i) = self.controllers.iter().position(|(id, _)| id == identity) else {
            return false;
        };
        let (_, mut child) = self.controllers.remove(i);
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    fn spawn_worker(&mut self) {
        let n = self.spawned_workers;
        self.spawned_workers += 1;
        let identity = format!("w{n}");
        let args = worker::WorkerArgs {
            kubeconfig: self.worker_kubeconfig.clone(),
            namespace: NAMESPACE.into(),
            leases: self.worker_template.leases.clone(),
            identity: identity.clone(),
            store: self.worker_template.store.clone(),
            history: self.out.join(format!("worker-{identity}.jsonl")),
            seed: self.worker_template.seed ^ ((n as u64 + 1) * 0x9E37_79B9),
            // Every other worker holds its grants for several lease durations, so
            // renewals (and the timing contract) matter, not only short holds.
            writes_per_grant: if n % 2 == 1 { LONG_HOLD_WRITES } else { 3 },
        };
        let log = std::fs::File::create(self.out.join(format!("worker-{identity}.log")))
            .expect("worker log");
        let mut argv = args.to_args();
        // Every third worker holds its grants through the agent and the Go client.
        if n % 3 == 2 {
            argv[0] = "agent-worker".into();
        }
        let child = Command::new(std::env::current_exe().expect("current exe"))
            .args(argv)
            // A group of its own: a fault signals the whole "pod" (an agent worker's
            // agent and driver too).
            .process_group(0)
            .env(dbstores::PG_ENV, dbstores::postgres_url())
            .env(dbstores::REDIS_ENV, dbstores::redis_url())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning a worker");
        self.workers.push((identity, child));
    }

    /// The worker's process group, as kill(2) takes it (negative): the worker and,
    /// for an agent worker, its agent and driver.
    fn worker_pid(&self, identity: &str) -> Option<i32> {
        self.workers
            .iter()
            .find(|(id, _)| id == identity)
            .map(|(_, c)| -(c.id() as i32))
    }

    fn kill_worker(&mut self, identity: &str) {
        if let Some(i) = self.workers.iter().position(|(id, _)| id == identity) {
            let (_, mut child) = self.workers.remove(i);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs every elected replica: no controller at all.
    fn kill_controllers(&mut self) -> Vec<String> {
        let mut killed = Vec::new();
        for (identity, mut c) in self.controllers.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
            killed.push(identity);
        }
        killed
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.kill_controllers();
        for (_, child) in &mut self.workers {
            // A paused worker dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid (or, negative, a process group) we spawned and have not reaped.
    unsafe { libc::kill(pid, sig) };
}

async fn run(args: &Args, plane: &ControlPlane) -> bool {
    let started = Instant::now();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let out = plane
        .root
        .join(format!("target/chaos/seed-{}-{unix}", args.seed));
    std::fs::create_dir_all(&out).expect("creating the history directory");
    println!(
        "chaos: seed {}, {} s of faults, {} workers, {} leases; history in {}",
        args.seed,
        args.duration.as_secs(),
        args.workers,
        args.leases,
        out.display()
    );
    // A fresh control plane: nothing left over from an earlier run.
    plane.down();
    if let Err(e) = plane.script(&["up"]) {
        eprintln!("chaos: starting the control plane: {e}");
        return false;
    }
    let servers = dbstores::Servers::new(&plane.root);
    if let Err(e) = servers.set_up().await {
        eprintln!("chaos: starting PostgreSQL and Redis: {e}");
        return false;
    }
    let admin = worker::client_from(&plane.kubeconfig()).await;
    let leases: Vec<String> = (0..args.leases).map(|i| format!("lease-{i}")).collect();
    if let Err(e) = set_up(&admin, plane, &leases).await {
        eprintln!("chaos: set-up: {e}");
        return false;
    }
    if let Err(e) = servers.create_marks(&leases).await {
        eprintln!("chaos: creating the Redis marks: {e}");
        return false;
    }

    // Separate proxies, so the controller's and the workers' links fail separately.
    let controller_proxy = Proxy::start(APISERVER_PORT).await.expect("proxy");
    let worker_proxy = Proxy::start(APISERVER_PORT).await.expect("proxy");
    let admin_text = std::fs::read_to_string(plane.kubeconfig()).expect("kubeconfig");
    let via = |proxy: &Proxy, name: &str| {
        let path = out.join(name);
        let text = admin_text.replace(
            &format!("https://127.0.0.1:{APISERVER_PORT}"),
            &format!("https://127.0.0.1:{}", proxy.port),
        );
        std::fs::write(&path, text).expect("writing a kubeconfig");
        path
    };
    let store = out.join("file-store");
    let mut procs = Processes {
        palisade: PathBuf::from(env!("CARGO_BIN_EXE_palisade")),
        out: out.clone(),
        controller_kubeconfig: via(&controller_proxy, "controller.kubeconfig"),
        worker_kubeconfig: via(&worker_proxy, "worker.kubeconfig"),
        controllers: Vec::new(),
        spawned_controllers: 0,
        workers: Vec::new(),
        spawned_workers: 0,
        worker_template: WorkerTemplate {
            leases: leases.clone(),
            store: store.clone(),
            seed: args.seed,
        },
    };
    // The store exists before any worker opens it.
    palisade::fence::FileStore::create(&store).expect("creating the file store");

    let observers = tokio::spawn(observe(admin.clone(), out.clone()));
    procs.start_missing_replicas();
    for _ in 0..args.workers {
        procs.spawn_worker();
    }
    // Let the first grants and writes happen before any fault.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut faults = Recorder::create(&out.join("faults.jsonl")).expect("fault log");
    // The order of fault kinds depends on the seed alone: this generator only
    // shuffles rounds and seeds each fault's own generator, the same number of draws
    // whatever the faults found. Each fault draws its parameters (and the pause after
    // it) from its own, so what one fault found cannot shift the next one's.
    let mut scheduler = Rng::new(args.seed);
    let mut schedule = Vec::new();
    let end = Instant::now() + args.duration;
    let mut first = true;
    while Instant::now() < end {
        if schedule.is_empty() {
            schedule = FAULTS.iter().chain(&dbstores::FAULTS).copied().collect();
            scheduler.shuffle(&mut schedule);
            if first {
                // The classic case comes first, so even a short run has stale writes;
                // its database twin second, so the database stores see stale writes
                // too; then the storm, the failover and flapping leadership, so the
                // short run has them.
                let last = schedule.len() - 1;
                for (k, kind) in FIRST_FAULTS.iter().enumerate() {
                    let i = schedule.iter().position(|f| f == kind).expect("listed");
                    schedule.swap(i, last - k);
                }
                first = false;
            }
        }
        let mut rng = Rng::new(scheduler.next_u64());
        let pause_after = rng.millis(500, 2500);
        let fault = schedule.pop().expect("refilled above");
        let ctx = FaultContext {
            admin: &admin,
            plane,
            leases: &leases,
            controller_proxy: &controller_proxy,
            worker_proxy: &worker_proxy,
        };
        let start_ns = now_ns();
        match inject(fault, &ctx, &mut procs, &mut rng).await {
            Ok(Some(target)) => {
                let end_ns = now_ns();
                println!(
                    "chaos: {:>6.1}s {fault} {target} ({} ms)",
                    started.elapsed().as_secs_f64(),
                    (end_ns - start_ns) / 1_000_000
                );
                faults.record(&Event::Fault {
                    fault: fault.into(),
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

    // Heal: everything resumed, restored and running, and nothing more injected.
    controller_proxy.set(Mode::Pass);
    worker_proxy.set(Mode::Pass);
    for (_, child) in &procs.workers {
        signal(-(child.id() as i32), libc::SIGCONT);
    }
    procs.start_missing_replicas();
    let healed = now_ns();
    faults.record(&Event::Healed { t_ns: healed });
    // Workers keep cycling through the Leases; give each time to be granted again.
    tokio::time::sleep(Duration::from_secs(LEASE_SECONDS) + LIVENESS_BOUND).await;
    drop(procs);
    observers.abort();
    let _ = observers.await;

    let events = match history::read_dir(&out) {
        Ok(events) => events,
        Err(e) => {
            eprintln!("chaos: reading the history: {e}");
            return false;
        }
    };
    let journal = match read_journal(&store) {
        Ok(journal) => journal,
        Err(e) => {
            eprintln!("chaos: reading the file fence's journal: {e}");
            return false;
        }
    };
    let db_journals = match servers.journals(&leases).await {
        Ok(journals) => journals,
        Err(e) => {
            eprintln!("chaos: reading the database stores' commit order: {e}");
            return false;
        }
    };
    let verdict = history::check_with_stores(
        &events,
        &journal,
        &db_journals,
        &Expectations {
            leases: leases.clone(),
            liveness_ns: (Duration::from_secs(LEASE_SECONDS) + LIVENESS_BOUND).as_nanos() as u64,
            holder_deadline_ns: (Duration::from_secs(LEASE_SECONDS) * 2 / 3).as_nanos() as u64,
        },
    );
    for v in &verdict.violations {
        println!("chaos: VIOLATION: {v}");
    }
    println!(
        "chaos: accepted writes {:?}, stale rejected {:?}, unknown outcomes {}, \
         recovery after healing (ms) {:?}, {} history events, {:.0} s in all",
        verdict.accepted,
        verdict.stale_rejected,
        verdict.unknown_outcomes,
        verdict.recovery_ms,
        events.len(),
        started.elapsed().as_secs_f64()
    );
    println!("{}", verdict.summary());
    if !verdict.violations.is_empty() {
        println!("chaos: FAILED; history kept in {}", out.display());
        return false;
    }
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
        let lost = verdict.faults.get(lossy.fault).copied().unwrap_or(0);
        let refused = verdict
            .no_mark_refused
            .get(lossy.store)
            .copied()
            .unwrap_or(0);
        if lost == 0 || refused == 0 {
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
    println!(
        "chaos: ok (seed {}, history in {})",
        args.seed,
        out.display()
    );
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

/// CRDs, the object-fencing admission policy (rendered from our chart), the
/// namespace, the Leases and one fenced ConfigMap per Lease.
async fn set_up(admin: &Client, plane: &ControlPlane, leases: &[String]) -> Result<(), String> {
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in [Lease::crd(), LeaseClaim::crd()] {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply("palisade-chaos").force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("applying CRD {name}: {e}"))?;
        tokio::time::timeout(
            Duration::from_secs(30),
            kube::runtime::wait::await_condition(
                crds.clone(),
                &name,
                kube::runtime::wait::conditions::is_crd_established(),
            ),
        )
        .await
        .map_err(|_| format!("CRD {name} not established within 30s"))?
        .map_err(|e| e.to_string())?;
    }
    let bin_dir = PathBuf::from(std::env::var("PALISADE_BIN_DIR").unwrap_or_default());
    let rendered = Command::new(bin_dir.join("helm"))
        .args(["template", "chaos"])
        .arg(plane.root.join("charts/palisade"))
        .args(["--show-only", "templates/policy-object-fencing.yaml"])
        .output()
        .map_err(|e| format!("helm template: {e}"))?;
    if !rendered.status.success() {
        return Err(format!(
            "helm template: {}",
            String::from_utf8_lossy(&rendered.stderr)
        ));
    }
    let mut apply = Command::new(bin_dir.join("kubectl"))
        .args([
            "apply",
            "--server-side",
            "--field-manager",
            "palisade-chaos",
            "-f",
            "-",
        ])
        .env("KUBECONFIG", plane.kubeconfig())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("kubectl apply: {e}"))?;
    {
        use std::io::Write;
        apply
            .stdin
            .take()
            .expect("piped")
            .write_all(&rendered.stdout)
            .map_err(|e| format!("kubectl apply: {e}"))?;
    }
    if !apply.wait().map_err(|e| e.to_string())?.success() {
        return Err("kubectl apply of the fencing policy failed".into());
    }

    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("creating namespace {NAMESPACE}: {e}")),
    }
    let client = LeaseClient::new(admin.clone(), NAMESPACE);
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    for lease in leases {
        client
            .ensure_lease(lease, LEASE_SECONDS as i64)
            .await
            .map_err(|e| format!("creating lease {lease}: {e}"))?;
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": worker::configmap_name(lease),
                "labels": {"palisade.dev/fenced-by": lease},
                "annotations": {"palisade.dev/fencing-token": "0"},
            },
        }))
        .unwrap();
        match configmaps.create(&PostParams::default(), &cm).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(format!("creating the fenced ConfigMap of {lease}: {e}")),
        }
    }
    wait_policy_active(&configmaps).await
}

/// The API server loads a new admission policy asynchronously: wait until a stale
/// write to a probe object is refused.
async fn wait_policy_active(configmaps: &Api<ConfigMap>) -> Result<(), String> {
    let probe: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "policy-probe",
            "labels": {"palisade.dev/fenced-by": "probe"},
            "annotations": {"palisade.dev/fencing-token": "5"},
        },
    }))
    .unwrap();
    match configmaps.create(&PostParams::default(), &probe).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("creating the policy probe: {e}")),
    }
    let stale = json!({"metadata": {"annotations": {"palisade.dev/fencing-token": "1"}}});
    for _ in 0..300 {
        match configmaps
            .patch(
                "policy-probe",
                &PatchParams::default(),
                &Patch::Merge(&stale),
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(()),
            Err(e) => return Err(format!("probing the fencing policy: {e}")),
            Ok(_) => {
                // Accepted: not enforced yet. Put the token back up and try again.
                let up = json!({"metadata": {"annotations": {"palisade.dev/fencing-token": "5"}}});
                let _ = configmaps
                    .patch("policy-probe", &PatchParams::default(), &Patch::Merge(&up))
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err("the object-fencing policy was not enforced within 30s".into())
}

/// Records every version of the Leases and fenced ConfigMaps that the harness's
/// own watches (straight to the API server, no proxy) deliver.
async fn observe(admin: Client, out: PathBuf) {
    let lease_api: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let cm_api: Api<ConfigMap> = Api::namespaced(admin, NAMESPACE);
    let mut lease_log = Recorder::create(&out.join("observed-leases.jsonl")).expect("log");
    let mut cm_log = Recorder::create(&out.join("observed-configmaps.jsonl")).expect("log");
    let leases = watcher::watcher(lease_api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let cms = watcher::watcher(
        cm_api,
        watcher::Config::default().labels("palisade.dev/fenced-by"),
    )
    .default_backoff()
    .boxed();
    let mut both = futures::stream::select(
        leases.map(|e| e.map(|e| (Some(e), None))),
        cms.map(|e| e.map(|e| (None, Some(e)))),
    );
    while let Some(event) = both.next().await {
        let t_ns = now_ns();
        match event {
            Ok((Some(watcher::Event::Apply(l) | watcher::Event::InitApply(l)), _)) => {
                let status = l.status.clone().unwrap_or_default();
                lease_log.record(&Event::LeaseSeen {
                    lease: l.name_any(),
                    rv: rv_of(&l),
                    holder_uid: status.holder.map(|h| h.claim_uid).unwrap_or_default(),
                    token: status.fencing_token.unwrap_or(0) as u64,
                    t_ns,
                });
            }
            Ok((_, Some(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)))) => {
                let Some(lease) = cm.labels().get("palisade.dev/fenced-by").cloned() else {
                    continue;
                };
                let token = cm
                    .annotations()
                    .get("palisade.dev/fencing-token")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                cm_log.record(&Event::ConfigMapSeen {
                    lease,
                    name: cm.name_any(),
                    rv: rv_of(&cm),
                    token,
                    t_ns,
                });
            }
            _ => {} // list boundaries, deletions, and errors the backoff retries
        }
    }
}

fn rv_of<K: ResourceExt>(object: &K) -> u64 {
    object
        .resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

const FAULTS: [&str; 15] = [
    "pause_holder",
    "flap_leadership",
    "storm",
    "kill_holder",
    "kill_controller",
    "failover",
    "split_brain",
    "restart_apiserver",
    "restart_etcd",
    "delay_controller_link",
    "delay_worker_links",
    "cut_controller_link",
    "cut_worker_links",
    "blackhole_controller_link",
    "blackhole_worker_links",
];

/// The first round begins with these, in this order (see `run`). The losses of
/// the lossy Redis stores come early too: before the first RDB snapshot (300 s),
/// so `redis-rdb` comes back empty, and within a short run.
const FIRST_FAULTS: [&str; 7] = [
    "pause_holder",
    "pause_in_transaction",
    "storm",
    "failover",
    "flap_leadership",
    "lose_redis_marks",
    "evict_redis_marks",
];

struct FaultContext<'a> {
    admin: &'a Client,
    plane: &'a ControlPlane,
    leases: &'a [String],
    controller_proxy: &'a Proxy,
    worker_proxy: &'a Proxy,
}

/// A current holder that is one of our live workers, picked at random.
async fn pick_holder(ctx: &FaultContext<'_>, procs: &Processes, rng: &mut Rng) -> Option<String> {
    pick_grant(ctx, procs, rng).await.map(|g| g.identity)
}

/// A grant held by one of our live workers.
struct HeldGrant {
    identity: String,
    lease: String,
    claim_uid: String,
}

/// [`pick_holder`], with the Lease and the claim.
async fn pick_grant(ctx: &FaultContext<'_>, procs: &Processes, rng: &mut Rng) -> Option<HeldGrant> {
    let api: Api<Lease> = Api::namespaced(ctx.admin.clone(), NAMESPACE);
    let mut holders = Vec::new();
    for lease in ctx.leases {
        if let Ok(l) = api.get(lease).await
            && let Some(h) = l.status.and_then(|s| s.holder)
            && procs.worker_pid(&h.identity).is_some()
        {
            holders.push(HeldGrant {
                identity: h.identity,
                lease: lease.clone(),
                claim_uid: h.claim_uid,
            });
        }
    }
    if holders.is_empty() {
        return None;
    }
    let i = rng.range(0, holders.len() as u64) as usize;
    Some(holders.swap_remove(i))
}

/// The current holders that are live workers, in Lease order, polled until every
/// Lease has one (or until one and a half seconds have passed): a storm should catch
/// every grant, not the moment between a release and the next grant.
async fn all_holders(ctx: &FaultContext<'_>, procs: &Processes) -> Vec<String> {
    let api: Api<Lease> = Api::namespaced(ctx.admin.clone(), NAMESPACE);
    let mut holders = Vec::new();
    for _ in 0..15 {
        holders.clear();
        for lease in ctx.leases {
            if let Ok(Ok(l)) = tokio::time::timeout(Duration::from_secs(2), api.get(lease)).await
                && let Some(h) = l.status.and_then(|s| s.holder)
                && procs.worker_pid(&h.identity).is_some()
                && !holders.contains(&h.identity)
            {
                holders.push(h.identity);
            }
        }
        if holders.len() == ctx.leases.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holders
}

/// Who the election record names (read straight from the API server), if anyone.
async fn election_holder(admin: &Client) -> Option<String> {
    let api: Api<CoordinationLease> = Api::namespaced(admin.clone(), NAMESPACE);
    match tokio::time::timeout(Duration::from_secs(2), api.get_opt(ELECTION_NAME)).await {
        Ok(Ok(Some(lease))) => lease
            .spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()),
        _ => None,
    }
}

/// Injects one fault and waits until it is over. Returns what it hit, or `None`
/// when there was nothing to hit.
async fn inject(
    fault: &str,
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let lease = Duration::from_secs(LEASE_SECONDS);
    let target = match fault {
        "pause_holder" => {
            let Some(holder) = pick_holder(ctx, procs, rng).await else {
                return Ok(None);
            };
            let pid = procs
                .worker_pid(&holder)
                .expect("picked among live workers");
            // Past its lease: 1.25 to 2.5 durations, a long GC pause.
            let pause = rng.millis(
                lease.as_millis() as u64 * 5 / 4,
                lease.as_millis() as u64 * 5 / 2,
            );
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(pause).await;
            signal(pid, libc::SIGCONT);
            format!("{holder} for {} ms", pause.as_millis())
        }
        "flap_leadership" => {
            // A silent holder is expired on time however often leadership changes:
            // its worker is stopped, then whichever replica leads is stopped until the
            // other takes over (after the 1 s election lease) and resumed, over and over
            // for five lease durations. A new leader that restarted every holder's
            // clock would never expire it.
            let Some(held) = pick_grant(ctx, procs, rng).await else {
                return Ok(None);
            };
            let pid = procs
                .worker_pid(&held.identity)
                .expect("picked among live workers");
            signal(pid, libc::SIGSTOP);
            let silenced = now_ns();
            let began = Instant::now();
            let mut takeovers = 0;
            while began.elapsed() < lease * 5 {
                let Some((leader, leader_pid)) = election_holder(ctx.admin)
                    .await
                    .and_then(|h| procs.controller_pid(&h).map(|pid| (h, pid)))
                else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                signal(leader_pid, libc::SIGSTOP);
                let stopped = Instant::now();
                while stopped.elapsed() < TAKEOVER_WAIT {
                    if election_holder(ctx.admin)
                        .await
                        .is_some_and(|h| h != leader)
                    {
                        takeovers += 1;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                signal(leader_pid, libc::SIGCONT);
            }
            signal(pid, libc::SIGCONT);
            Recorder::create(&procs.out.join("expectations.jsonl"))
                .map_err(|e| format!("opening the expectations file: {e}"))?
                .record(&Event::Silenced {
                    lease: held.lease,
                    claim_uid: held.claim_uid,
                    t_ns: silenced,
                    within_ns: (lease + SILENCED_EXPIRY_SLACK).as_nanos() as u64,
                });
            format!(
                "{} silent while leadership changed hands {takeovers} times in {} ms",
                held.identity,
                began.elapsed().as_millis()
            )
        }
        "storm" => {
            // Drawn first, whatever is found: the same draws for every run of a seed.
            let pause = rng.millis(
                lease.as_millis() as u64 * 3 / 2,
                lease.as_millis() as u64 * 3,
            );
            let spare_one = rng.range(0, 2) == 1;
            let spared_pick = rng.next_u64();
            let mut holders = all_holders(ctx, procs).await;
            if holders.is_empty() {
                return Ok(None);
            }
            let of = holders.len();
            // Most or all: with three holders or more, a seeded half of the storms spare one.
            if of >= 3 && spare_one {
                holders.remove((spared_pick % of as u64) as usize);
            }
            let pids: Vec<i32> = holders
                .iter()
                .map(|h| procs.worker_pid(h).expect("picked among live workers"))
                .collect();
            // Together: their grants expire in the same controller pass or nearly, the
            // waiters are granted in a burst, and every paused holder wakes up stale.
            for &pid in &pids {
                signal(pid, libc::SIGSTOP);
            }
            tokio::time::sleep(pause).await;
            for &pid in &pids {
                signal(pid, libc::SIGCONT);
            }
            format!(
                "{} ({} of {of} live holders, {} leases) for {} ms",
                holders.join(","),
                holders.len(),
                ctx.leases.len(),
                pause.as_millis()
            )
        }
        "kill_holder" => {
            let Some(holder) = pick_holder(ctx, procs, rng).await else {
                return Ok(None);
            };
            procs.kill_worker(&holder);
            procs.spawn_worker();
            holder
        }
        "kill_controller" => {
            // Every replica at once: no controller at all, then two new replicas
            // that find the dead leader's record and must wait it out.
            let down = rng.millis(200, 3000);
            let killed = procs.kill_controllers();
            tokio::time::sleep(down).await;
            let started = procs.start_missing_replicas();
            format!(
                "{} down for {} ms, {} started",
                killed.join(","),
                down.as_millis(),
                started.join(",")
            )
        }
        "failover" => {
            let replace_after = rng.millis(0, 2000);
            let Some(leader) = election_holder(ctx.admin)
                .await
                .filter(|h| procs.controllers.iter().any(|(id, _)| id == h))
            else {
                return Ok(None);
            };
            // SIGKILL: it cannot release, so the standby waits for the record to expire.
            procs.kill_replica(&leader);
            let killed = Instant::now();
            let mut took_over = None;
            while killed.elapsed() < TAKEOVER_WAIT {
                if let Some(h) = election_holder(ctx.admin).await
                    && h != leader
                {
                    took_over = Some((h, killed.elapsed()));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let takeover = match took_over {
                Some((h, after)) => format!("{h} leading {} ms later", after.as_millis()),
                None => {
                    println!(
                        "chaos: failover: no replica took over from {leader} within {} s",
                        TAKEOVER_WAIT.as_secs()
                    );
                    format!("no takeover within {} ms", TAKEOVER_WAIT.as_millis())
                }
            };
            tokio::time::sleep(replace_after).await;
            let started = procs.start_missing_replicas();
            format!(
                "leader {leader} killed, {takeover}, {} started {} ms after",
                started.join(","),
                replace_after.as_millis()
            )
        }
        "split_brain" => {
            // One more controller, election off, straight to the API server (so it
            // and the elected leader see the world with different delays), for 5 to
            // 15 s: grants must stay safe whatever the election says.
            let second = procs.start_controller(
                &ctx.plane.kubeconfig(),
                Election::Off,
                "controller-extra.log",
            );
            let span = rng.millis(5000, 15000);
            tokio::time::sleep(span).await;
            let mut second = second;
            let _ = second.kill();
            let _ = second.wait();
            format!(
                "a controller with election off beside the replicas for {} ms",
                span.as_millis()
            )
        }
        "restart_apiserver" | "restart_etcd" => {
            let component = if fault == "restart_apiserver" {
                "kube-apiserver"
            } else {
                "etcd"
            };
            let plane = ControlPlane {
                root: ctx.plane.root.clone(),
                state: ctx.plane.state.clone(),
            };
            let started = Instant::now();
            tokio::task::spawn_blocking(move || plane.script(&["restart", component]))
                .await
                .map_err(|e| e.to_string())??;
            format!("{component} back in {} ms", started.elapsed().as_millis())
        }
        "delay_controller_link" | "delay_worker_links" => {
            let proxy = if fault == "delay_controller_link" {
                ctx.controller_proxy
            } else {
                ctx.worker_proxy
            };
            let delay = rng.millis(100, 800);
            let span = rng.millis(3000, 8000);
            proxy.set(Mode::Delay(delay));
            tokio::time::sleep(span).await;
            proxy.set(Mode::Pass);
            format!(
                "{} ms per chunk for {} ms",
                delay.as_millis(),
                span.as_millis()
            )
        }
        "cut_controller_link" | "cut_worker_links" => {
            let proxy = if fault == "cut_controller_link" {
                ctx.controller_proxy
            } else {
                ctx.worker_proxy
            };
            let span = rng.millis(1000, 5000);
            proxy.set(Mode::Cut);
            tokio::time::sleep(span).await;
            proxy.set(Mode::Pass);
            format!("for {} ms", span.as_millis())
        }
        "blackhole_controller_link" | "blackhole_worker_links" => {
            let proxy = if fault == "blackhole_controller_link" {
                ctx.controller_proxy
            } else {
                ctx.worker_proxy
            };
            // Open connections go silent for good; new ones too while it lasts.
            let span = rng.millis(1000, 5000);
            proxy.set(Mode::Blackhole);
            tokio::time::sleep(span).await;
            proxy.set(Mode::Pass);
            format!("for {} ms", span.as_millis())
        }
        other => return inject_db(other, ctx, procs, rng).await,
    };
    Ok(Some(target))
}

/// The database faults (dbstores.rs): restart PostgreSQL (immediate shutdown) or
/// Redis (SIGKILL), SIGKILL a worker inside an open PostgreSQL transaction, or make
/// a lossy Redis lose its marks.
async fn inject_db(
    fault: &str,
    ctx: &FaultContext<'_>,
    procs: &mut Processes,
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let target = match fault {
        "restart_postgres" | "restart_redis" => {
            let which = fault.trim_start_matches("restart_").to_string();
            let servers = dbstores::Servers::new(&ctx.plane.root);
            let started = Instant::now();
            let arg = which.clone();
            tokio::task::spawn_blocking(move || servers.script(&["restart", &arg]))
                .await
                .map_err(|e| e.to_string())??;
            format!("{which} back in {} ms", started.elapsed().as_millis())
        }
        "lose_redis_marks" => {
            let servers = dbstores::Servers::new(&ctx.plane.root);
            tokio::task::spawn_blocking(move || servers.lose_marks())
                .await
                .map_err(|e| e.to_string())??
        }
        "evict_redis_marks" => {
            dbstores::Servers::new(&ctx.plane.root)
                .evict_marks(ctx.leases)
                .await?
        }
        "kill_worker_in_transaction" => {
            let live: Vec<String> = procs.workers.iter().map(|(id, _)| id.clone()).collect();
            let servers = dbstores::Servers::new(&ctx.plane.root);
            let Some(worker) = servers.worker_in_transaction(&live).await else {
                return Ok(None);
            };
            procs.kill_worker(&worker);
            procs.spawn_worker();
            worker
        }
        "pause_in_transaction" => {
            // The classic pause, inside an open transaction: its row lock holds up
            // the next holder's check until it resumes and commits.
            let live: Vec<String> = procs.workers.iter().map(|(id, _)| id.clone()).collect();
            let servers = dbstores::Servers::new(&ctx.plane.root);
            let Some(worker) = servers.worker_in_transaction(&live).await else {
                return Ok(None);
            };
            let pid = procs
                .worker_pid(&worker)
                .expect("picked among live workers");
            let lease = Duration::from_secs(LEASE_SECONDS).as_millis() as u64;
            let pause = rng.millis(lease * 5 / 4, lease * 5 / 2);
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(pause).await;
            signal(pid, libc::SIGCONT);
            format!("{worker} for {} ms", pause.as_millis())
        }
        other => return Err(format!("unknown fault {other}")),
    };
    Ok(Some(target))
}
