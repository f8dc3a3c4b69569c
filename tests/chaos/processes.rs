//! The processes the run starts and supervises: the controller's elected replicas
//! (and the extra one of `split_brain`) and the worker processes (the operator workers
//! among them), each worker in a process group of its own so that a signal reaches its
//! agent and driver too.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cluster::NAMESPACE;
use crate::history::{Event, Recorder};
use crate::{dbstores, worker};

/// Writes per grant of the long-holding workers: 50 to 250 ms apart, one and a half
/// to three lease durations (short enough to leave the liveness bound its margin).
const LONG_HOLD_WRITES: u64 = 20;

/// The controller runs as this many replicas with leader election on.
const REPLICAS: usize = 2;
/// The election's coordination.k8s.io Lease, in [`NAMESPACE`].
pub const ELECTION_NAME: &str = "chaos-controller";
/// The election timings, passed as flags (the controller's defaults, stated here so
/// the liveness bound, `verdict::LIVENESS_BOUND`, is computed from what the replicas
/// really run with).
pub const ELECTION_LEASE: Duration = Duration::from_secs(1);
const ELECTION_RENEW_DEADLINE: Duration = Duration::from_millis(750);
pub const ELECTION_RETRY: Duration = Duration::from_millis(250);

/// Every process the run started; all SIGKILLed when it ends.
pub struct Processes {
    palisade: PathBuf,
    pub out: PathBuf,
    /// One per API server (one in all without `--ha`): replica `n` is pinned to
    /// number `n % len` and worker `n` to `n / 2 % len`, as a load balancer pins a
    /// client's connections.
    controller_kubeconfigs: Vec<PathBuf>,
    worker_kubeconfigs: Vec<PathBuf>,
    /// The elected replicas, by identity (`c0`, `c1`, ...; a replacement gets a new
    /// name, as a Deployment's pod does).
    pub controllers: Vec<(String, std::process::Child)>,
    spawned_controllers: usize,
    pub workers: Vec<(String, std::process::Child)>,
    spawned_workers: usize,
    spawned_operators: usize,
    /// The API server each worker (operator workers too) is pinned to, by identity.
    pins: std::collections::HashMap<String, usize>,
    worker_template: WorkerTemplate,
    /// The fenced outbox's relays (outbox_store.rs), once started; taken out before
    /// the rest is killed, so that they deliver what is left while it is judged.
    pub relays: Option<crate::outbox_store::Relays>,
}

pub struct WorkerTemplate {
    pub leases: Vec<String>,
    pub store: PathBuf,
    pub seed: u64,
    /// The operator workers' service account token (a file: operator_setup.rs).
    pub operator_token: PathBuf,
    /// Every API server as the workers reach it (a proxy each), as base URLs.
    pub servers: Vec<String>,
}

/// How a controller process takes part in leader election.
pub enum Election<'a> {
    /// A replica of the elected pair, with this identity.
    Replica(&'a str),
    /// `--leader-elect=false`: grants from the start, whoever else is leading.
    Off,
}

impl Processes {
    /// None started yet: the replicas reach the API server through
    /// `controller_kubeconfigs`, the workers through `worker_kubeconfigs` (each
    /// pinned to one), and every log and history file goes to `out`.
    pub fn new(
        out: PathBuf,
        controller_kubeconfigs: Vec<PathBuf>,
        worker_kubeconfigs: Vec<PathBuf>,
        worker_template: WorkerTemplate,
    ) -> Self {
        assert!(!controller_kubeconfigs.is_empty() && !worker_kubeconfigs.is_empty());
        Processes {
            palisade: PathBuf::from(env!("CARGO_BIN_EXE_palisade")),
            out,
            controller_kubeconfigs,
            worker_kubeconfigs,
            controllers: Vec::new(),
            spawned_controllers: 0,
            workers: Vec::new(),
            spawned_workers: 0,
            spawned_operators: 0,
            pins: Default::default(),
            worker_template,
            relays: None,
        }
    }

    /// The outbox's relays and their provider (outbox_store.rs), reaching the API
    /// server as the workers do, and PostgreSQL at `store`.
    pub async fn start_relays(&mut self, store: String) {
        let relays = crate::outbox_store::Relays::start(
            &self.palisade,
            &self.worker_kubeconfigs[0],
            store,
            &self.out,
        )
        .await;
        self.relays = Some(relays);
    }

    pub fn start_controller(
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
        // Every namespace: the operator workers' Lease is in one of its own.
        command.arg("controller");
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

    /// One more elected replica, behind a controller proxy. Returns its identity.
    fn start_replica(&mut self) -> String {
        let n = self.spawned_controllers;
        let identity = format!("c{n}");
        self.spawned_controllers += 1;
        let child = self.start_controller(
            &self.controller_kubeconfigs[n % self.controller_kubeconfigs.len()],
            Election::Replica(&identity),
            &format!("controller-{identity}.log"),
        );
        self.controllers.push((identity.clone(), child));
        identity
    }

    /// Starts replicas until [`REPLICAS`] run.
    pub fn start_missing_replicas(&mut self) -> Vec<String> {
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
    pub fn controller_pid(&self, identity: &str) -> Option<i32> {
        self.controllers
            .iter()
            .find(|(id, _)| id == identity)
            .map(|(_, child)| child.id() as i32)
    }

    /// SIGKILLs one replica (it cannot release the election lease). False: no such replica.
    pub fn kill_replica(&mut self, identity: &str) -> bool {
        let Some(i) = self.controllers.iter().position(|(id, _)| id == identity) else {
            return false;
        };
        let (_, mut child) = self.controllers.remove(i);
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    pub fn spawn_worker(&mut self) {
        let n = self.spawned_workers;
        self.spawned_workers += 1;
        let identity = format!("w{n}");
        // n / 2: long and short holders, agent and library workers, on each server.
        let server = self.pin(&identity, n / 2);
        let args = worker::WorkerArgs {
            kubeconfig: self.worker_kubeconfigs[server].clone(),
            namespace: NAMESPACE.into(),
            leases: self.worker_template.leases.clone(),
            identity: identity.clone(),
            store: self.worker_template.store.clone(),
            history: self.out.join(format!("worker-{identity}.jsonl")),
            seed: self.worker_template.seed ^ ((n as u64 + 1) * 0x9E37_79B9),
            // Every other worker holds its grants for several lease durations, so
            // renewals (and the timing contract) matter, not only short holds.
            writes_per_grant: writes_per_grant(&identity),
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
            .env(crate::mysql_store::MYSQL_ENV, crate::mysql_store::url())
            .env(
                crate::s3_store::S3_ENV,
                dbstores::s3_location().expect("the stores are set up before any worker"),
            )
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning a worker");
        self.workers.push((identity, child));
    }

    /// Pins worker `identity` to API server `n` (modulo their number), recorded on the
    /// HA plane. Returns the server's index.
    fn pin(&mut self, identity: &str, n: usize) -> usize {
        let server = n % self.worker_kubeconfigs.len();
        if self.worker_kubeconfigs.len() > 1 {
            Recorder::create(&self.out.join("pins.jsonl"))
                .expect("the pins' history file")
                .record(&Event::Pinned {
                    worker: identity.to_string(),
                    server: server as u8,
                });
        }
        self.pins.insert(identity.to_string(), server);
        server
    }

    /// The API server worker `identity` is pinned to.
    pub fn server_of(&self, identity: &str) -> Option<usize> {
        self.pins.get(identity).copied()
    }

    /// One more operator worker (`o<n>`, operator_worker.rs), pinned to server `n`.
    pub fn spawn_operator_worker(&mut self) {
        let n = self.spawned_operators;
        self.spawned_operators += 1;
        let identity = format!("o{n}");
        let server = self.pin(&identity, n);
        let args = crate::operator_worker::OperatorArgs {
            kubeconfig: self.worker_kubeconfigs[server].clone(),
            token_file: self.worker_template.operator_token.clone(),
            servers: self.worker_template.servers.clone(),
            identity: identity.clone(),
            history: self.out.join(format!("operator-{identity}.jsonl")),
            seed: self.worker_template.seed ^ ((n as u64 + 1) * 0x85EB_CA6B),
        };
        let log = std::fs::File::create(self.out.join(format!("operator-{identity}.log")))
            .expect("operator worker log");
        let child = Command::new(std::env::current_exe().expect("current exe"))
            .args(args.to_args())
            .process_group(0)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning an operator worker");
        self.workers.push((identity, child));
    }

    /// The writes worker `identity` still has to make with `token` (its history file,
    /// read to its last whole line): a holder paused after its last one wakes only to
    /// release, and its pause proves nothing.
    pub fn writes_left(&self, identity: &str, token: u64) -> u64 {
        let path = self.out.join(format!("worker-{identity}.jsonl"));
        let journal = std::fs::read_to_string(path).unwrap_or_default();
        let events: Vec<serde_json::Value> = journal
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        // Not in its write loop yet: a pause inside `acquire` makes it give up on the
        // grant (its deadline passes), not write with a stale token.
        if !events
            .iter()
            .any(|e| e["kind"] == "grant" && e["token"] == token)
        {
            return 0;
        }
        let made = events
            .iter()
            .filter(|e| e["kind"] == "write" && e["token"] == token)
            .filter_map(|e| e["seq"].as_u64())
            .collect::<std::collections::HashSet<_>>()
            .len() as u64;
        writes_per_grant(identity).saturating_sub(made)
    }

    /// The worker's process group, as kill(2) takes it (negative): the worker and,
    /// for an agent worker, its agent and driver.
    pub fn worker_pid(&self, identity: &str) -> Option<i32> {
        self.workers
            .iter()
            .find(|(id, _)| id == identity)
            .map(|(_, c)| -(c.id() as i32))
    }

    pub fn kill_worker(&mut self, identity: &str) {
        if let Some(i) = self.workers.iter().position(|(id, _)| id == identity) {
            let (_, mut child) = self.workers.remove(i);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGCONTs every worker's process group, paused or not.
    pub fn resume_workers(&self) {
        for (_, child) in &self.workers {
            signal(-(child.id() as i32), libc::SIGCONT);
        }
    }

    /// SIGKILLs every elected replica: no controller at all.
    pub fn kill_controllers(&mut self) -> Vec<String> {
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
        self.relays = None;
        self.kill_controllers();
        for (_, child) in &mut self.workers {
            // A paused worker dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How many writes worker `identity` makes with each grant before it releases.
fn writes_per_grant(identity: &str) -> u64 {
    if holds_long(identity) {
        LONG_HOLD_WRITES
    } else {
        3
    }
}

/// Whether worker `identity` (`w<n>`) holds its grants for several lease durations
/// (every other worker, the odd ones), writing many times while it holds.
pub fn holds_long(identity: &str) -> bool {
    identity
        .strip_prefix('w')
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n % 2 == 1)
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid (or, negative, a process group) we spawned and have not reaped.
    unsafe { libc::kill(pid, sig) };
}
