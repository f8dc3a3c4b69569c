//! The controller processes: one without election (the handover part), and the
//! elected pair of the failover part, whose election record the bench reads. Each
//! logs to a file of its own under `target/bench-ha-logs/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease as ElectionLease;
use kube::api::Api;

use crate::plane::Plane;

/// The election's coordination.k8s.io Lease, in the bench's namespace.
pub const ELECTION_NAME: &str = "palisade-bench-ha";
/// The election timings of the chaos suite's replicas (tests/chaos/processes.rs):
/// lease 1 s, renew deadline 750 ms, retry 250 ms.
const ELECTION_FLAGS: [&str; 3] = [
    "--leader-elect-lease-duration=1s",
    "--leader-elect-renew-deadline=750ms",
    "--leader-elect-retry-period=250ms",
];
/// How long a replica may take to lead once started, with the record free or expiring.
const LEAD_LIMIT: Duration = Duration::from_secs(30);
/// What a controller logs once its watch caches have synced (src/controller/control_loop.rs).
const SYNCED: &str = "caches synced";
/// How long a controller may take to shut down on SIGTERM before it is SIGKILLed.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// A `palisade controller` process (the binary of the bench's profile).
pub struct Controller {
    pub identity: String,
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl Controller {
    /// A controller of `ns` through `kubeconfig`: elected with this identity, or,
    /// `None`, without election (it grants from the start).
    pub fn start(
        plane: &Plane,
        kubeconfig: &Path,
        ns: &str,
        identity: Option<&str>,
    ) -> Result<Controller, String> {
        let name = identity.unwrap_or("unelected");
        let log_path = plane.logs.join(format!("controller-{name}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("creating {}: {e}", log_path.display()))?;
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
        command.args(["controller", "--namespace", ns]);
        match identity {
            Some(id) => {
                command
                    .args(["--leader-elect=true", "--election-namespace", ns])
                    .args(["--election-name", ELECTION_NAME, "--identity", id])
                    .args(ELECTION_FLAGS);
            }
            None => {
                command.arg("--leader-elect=false");
            }
        }
        let child = command
            .args(["--admin-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", env!("CARGO_BIN_EXE_palisade")))?;
        Ok(Controller {
            identity: name.to_string(),
            log: log_path,
            child,
        })
    }

    /// SIGTERM (a leader releases the election record), then SIGKILL if it has not
    /// exited within [`STOP_LIMIT`].
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child, not yet reaped (id() is Some).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(STOP_LIMIT, self.child.wait())
            .await
            .is_err()
        {
            eprintln!("ha: controller {} ignored SIGTERM; SIGKILL", self.identity);
            let _ = self.child.kill().await;
        }
    }

    /// Waits (at most [`LEAD_LIMIT`]) until a line of its log contains `needle`.
    async fn wait_log(&self, needle: &str) -> Result<(), String> {
        let deadline = Instant::now() + LEAD_LIMIT;
        while self.log_count(needle) == 0 {
            if Instant::now() >= deadline {
                return Err(format!(
                    "controller {}: no {needle:?} in its log within {LEAD_LIMIT:?} ({})",
                    self.identity,
                    self.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// How many lines of its log contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }
}

/// The election record: who holds it ("" when nobody) and how often it changed hands.
pub struct Record {
    pub holder: String,
    pub transitions: i32,
}

pub async fn record(elections: &Api<ElectionLease>) -> Result<Record, String> {
    let lease = tokio::time::timeout(Duration::from_secs(10), elections.get_opt(ELECTION_NAME))
        .await
        .map_err(|_| format!("reading the election Lease {ELECTION_NAME}: no answer in 10s"))?
        .map_err(|e| format!("reading the election Lease {ELECTION_NAME}: {e}"))?;
    let spec = lease.and_then(|l| l.spec).unwrap_or_default();
    Ok(Record {
        holder: spec.holder_identity.unwrap_or_default(),
        transitions: spec.lease_transitions.unwrap_or(0),
    })
}

/// Waits (at most [`LEAD_LIMIT`]) until the election record names `identity`.
async fn wait_leader(elections: &Api<ElectionLease>, identity: &str) -> Result<(), String> {
    let deadline = Instant::now() + LEAD_LIMIT;
    loop {
        let holder = record(elections).await?.holder;
        if holder == identity {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{identity} did not lead within {LEAD_LIMIT:?} (the record names {holder:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The elected pair: the leader reaches the API servers through lb-0 (which
/// prefers kube-apiserver-0), the standby through lb-1.
pub struct Pair {
    pub leader: Controller,
    pub standby: Controller,
}

impl Pair {
    /// A fresh pair for round `round`, new identities `lb0-ROUND` and `lb1-ROUND`:
    /// the lb-0 replica first, and once the record names it, the lb-1 one.
    pub async fn start(
        plane: &Plane,
        ns: &str,
        elections: &Api<ElectionLease>,
        round: usize,
    ) -> Result<Pair, String> {
        let id = format!("lb0-{round}");
        let leader = Controller::start(plane, &plane.kubeconfig("kubeconfig"), ns, Some(&id))?;
        wait_leader(elections, &id).await?;
        let id = format!("lb1-{round}");
        let standby =
            Controller::start(plane, &plane.kubeconfig("kubeconfig-lb-1"), ns, Some(&id))?;
        // A standby keeps its caches warm: have them synced before any kill.
        standby.wait_log(SYNCED).await?;
        Ok(Pair { leader, standby })
    }

    pub async fn stop(self) {
        tokio::join!(self.leader.stop(), self.standby.stop());
    }

    /// Which replica an identity of the record is: `lb-0`, `lb-1`, or `none`.
    pub fn side(&self, identity: &str) -> String {
        if identity.is_empty() {
            "none".into()
        } else if identity == self.leader.identity {
            "lb-0".into()
        } else if identity == self.standby.identity {
            "lb-1".into()
        } else {
            format!("other ({identity})")
        }
    }
}
