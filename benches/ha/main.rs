//! palisade on a highly available control plane (`cargo bench --bench ha`): three
//! etcd members and two kube-apiservers, each with its own watch cache, behind two
//! load balancers (`tests/controlplane/cluster.sh` with `HA=1`, a plane of the
//! bench's own in `target/bench-ha-cluster`, started fresh and torn down at the end).
//!
//! 1. **Release handover across API servers** (`--rounds`, default 30): from the
//!    holder's `Grant::release` (deleting its claim) to the waiter's `acquire`
//!    returning, the holder's client straight to kube-apiserver-0 (with the
//!    controller, one replica, no election) and the waiter's to kube-apiserver-1;
//!    each such handover is followed by one back the other way (holder on -1,
//!    waiter on -0), measured too.
//! 2. **Failover gap when the leader's API server dies** (`--failovers`, default 5):
//!    two replicas with leader election (lease 1 s, renew deadline 750 ms, retry
//!    250 ms); the leader through lb-0 (prefers kube-apiserver-0), the standby, the
//!    holder and the waiter through lb-1. From the start of `cluster.sh kill
//!    kube-apiserver-0` (SIGKILL; the holder releases as soon as the process is
//!    gone) to the waiter's `acquire` returning; and which replica led afterwards.
//!    Then kube-apiserver-0 is started again and a fresh pair set up, the lb-0
//!    replica first.
//!
//! A program that prints figures, not a test: `cargo bench --bench ha -- [--rounds N]
//! [--failovers K] [--out DIR]`; writes `DIR/ha.json` in the schema of
//! `benches/common/schema.rs` (rows [`schema::HA_ROWS`]), which `benches/report.rs`
//! merges. Needs env `PALISADE_BIN_DIR` (the control-plane binaries) and `LINKPROXY`
//! (palisade-linkproxy), both set by the Makefile. Controller logs go to
//! `target/bench-ha-logs/`. Smoke run (debug build, figures mean nothing):
//! `cargo test --bench ha -- --rounds 3 --failovers 1`.
//!
//! Modules: `plane` (cluster.sh, clients, CRDs, the kill), `replicas` (the
//! controller processes and the election record), `handover` (part 1), `failover`
//! (part 2).

#[path = "../common/schema.rs"]
#[allow(dead_code)]
mod schema;

mod failover;
mod handover;
mod plane;
mod replicas;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use plane::Plane;
use schema::{Figure, HA_LEADER_MOVED, HA_ROWS, Latency, Source};

/// The bench's namespace (its plane is its own).
const NS: &str = "bench-ha";

/// palisade on the HA control plane (needs PALISADE_BIN_DIR and LINKPROXY; see make bench).
#[derive(clap::Parser)]
#[command(allow_negative_numbers = true)]
struct Args {
    /// Release handovers from a holder on kube-apiserver-0 to a waiter on
    /// kube-apiserver-1 (each followed by one back); 0 skips them.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    rounds: u32,
    /// SIGKILLs of the leading replica's API server; 0 skips them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    failovers: u32,
    /// Where ha.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `cluster.sh down` when dropped: at the end of the run, on error and on panic.
struct Down<'a>(&'a Plane);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        eprintln!("ha: tearing the HA control plane down");
        self.0.down();
    }
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let plane = match Plane::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ha: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let result = {
        let _down = Down(&plane);
        let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
        // The controllers (kill_on_drop) go with the future, before the plane.
        runtime.block_on(async {
            tokio::select! {
                r = run(&plane, &args) => r,
                Ok(()) = tokio::signal::ctrl_c() => Err("interrupted".to_string()),
            }
        })
    };
    match result {
        Ok(outcome) => {
            let source = outcome.source(&args, started);
            let path = source.write_to(&args.out);
            let md = source.summary("palisade on the HA plane", |l| &l.config);
            println!("\n{md}\n\nwrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ha: {e}");
            eprintln!("ha: controller logs in {}", plane.logs.display());
            ExitCode::FAILURE
        }
    }
}

/// What the two parts measured.
struct Outcome {
    kubernetes: String,
    handovers: handover::Handovers,
    failovers: Vec<failover::Round>,
}

async fn run(plane: &Plane, args: &Args) -> Result<Outcome, String> {
    let _ = std::fs::remove_dir_all(&plane.logs);
    std::fs::create_dir_all(&plane.logs)
        .map_err(|e| format!("creating {}: {e}", plane.logs.display()))?;
    eprintln!("ha: starting a fresh HA control plane (cluster.sh HA=1, target/bench-ha-cluster)");
    plane.script(&["down"], false).await?;
    plane.script(&["up"], true).await?;
    let admin = plane.client("kubeconfig").await?;
    support::apply_crds(&admin, "palisade-bench-ha").await?;
    plane::create_namespace(&admin, NS).await?;
    let kubernetes = admin
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let t = Instant::now();
    eprintln!(
        "ha: {} release handovers each way between the API servers",
        args.rounds
    );
    let handovers = handover::run(plane, NS, args.rounds as usize).await?;
    eprintln!("ha: handovers took {:.0} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    eprintln!(
        "ha: {} failovers (SIGKILL of the leading replica's API server)",
        args.failovers
    );
    let failovers = failover::run(plane, NS, args.failovers as usize).await?;
    eprintln!("ha: failovers took {:.0} s", t.elapsed().as_secs_f64());
    Ok(Outcome {
        kubernetes,
        handovers,
        failovers,
    })
}

impl Outcome {
    fn source(&self, args: &Args, started: Instant) -> Source {
        let rounds: Vec<serde_json::Value> = self
            .failovers
            .iter()
            .map(|r| {
                json!({
                    "gap_ms": r.gap_ms, "apiserver_gone_ms": r.exit_ms,
                    "leader_at_grant": r.leader_at_grant, "leader_after": r.leader_after,
                    "record_transitions": r.transitions, "lb0_replica_stepped_down": r.stepped_down,
                })
            })
            .collect();
        Source {
            source: "ha".into(),
            versions: schema::palisade_versions(Some(self.kubernetes.clone())),
            latency: self.latency(),
            figures: self.figures(),
            parameters: schema::parameters(
                vec![
                    ("rounds", json!(args.rounds)),
                    ("failovers", json!(args.failovers)),
                    (
                        "election",
                        json!("lease 1s, renew deadline 750ms, retry 250ms"),
                    ),
                    ("settle_seconds", json!(failover::SETTLE.as_secs())),
                    ("failover_rounds", json!(rounds)),
                ],
                started,
            ),
        }
    }

    fn latency(&self) -> Vec<Latency> {
        let row = |(scenario, config): (&str, &str), samples: Vec<f64>, note: &str, flag: &str| {
            let note = if samples.is_empty() {
                format!("not run ({flag} 0)")
            } else {
                format!(
                    "{note}; HA plane: 3 etcd members, 2 kube-apiservers with their own watch caches"
                )
            };
            Latency::of("palisade", config, scenario, samples, &note)
        };
        let gaps = self.failovers.iter().map(|r| r.gap_ms).collect();
        vec![
            row(
                HA_ROWS[0],
                self.handovers.to_other.clone(),
                "Grant::release by the holder (client on kube-apiserver-0, with the controller) -> the \
                 waiter's acquire returns (client on kube-apiserver-1); one Lease, one handover at a time",
                "--rounds",
            ),
            row(
                HA_ROWS[1],
                self.handovers.back.clone(),
                "Grant::release by the holder (client on kube-apiserver-1) -> the waiter's acquire returns \
                 (client on kube-apiserver-0, with the controller); one Lease, one handover at a time",
                "--rounds",
            ),
            row(
                HA_ROWS[2],
                gaps,
                "cluster.sh kill kube-apiserver-0 (SIGKILL) started -> the waiter's acquire returns; the \
                 leading replica on lb-0 (prefers kube-apiserver-0), the standby, holder and waiter on lb-1; \
                 the holder releases once the API server's process is gone; election lease 1 s, renew \
                 deadline 750 ms, retry 250 ms",
                "--failovers",
            ),
        ]
    }

    fn figures(&self) -> Vec<Figure> {
        let k = self.failovers.len();
        if k == 0 {
            return Vec::new();
        }
        let moved = self
            .failovers
            .iter()
            .filter(|r| r.leader_after == "lb-1")
            .count();
        let per_round: Vec<String> = (self.failovers.iter().enumerate())
            .map(|(i, r)| {
                format!(
                    "{}: {} -> {} ({} changes, {} step-downs)",
                    i + 1,
                    r.leader_at_grant,
                    r.leader_after,
                    r.transitions,
                    r.stepped_down
                )
            })
            .collect();
        let gone = self.failovers.iter().map(|r| r.exit_ms).sum::<f64>() / k as f64;
        let figure = |name: &str, value: f64, unit: &str, note: String| Figure {
            system: "palisade".into(),
            config: "ha".into(),
            name: name.into(),
            value,
            unit: unit.into(),
            note,
        };
        vec![
            figure(
                HA_LEADER_MOVED,
                moved as f64,
                "rounds",
                format!(
                    "the failover rounds (of {k}) after which the standby (the lb-1 replica) led, {} s \
                     after the SIGKILL of the leader's API server; per round, who led when the waiter had \
                     its grant -> {} s after the kill (the election record's changes of hands, the lb-0 \
                     replica's step-downs): {}",
                    failover::SETTLE.as_secs(),
                    failover::SETTLE.as_secs(),
                    per_round.join("; ")
                ),
            ),
            figure(
                "ha_failover_apiserver_gone_mean",
                gone,
                "ms",
                "from the start of cluster.sh kill kube-apiserver-0 to its process gone, when the holder \
                 releases: part of each failover gap"
                    .into(),
            ),
        ]
    }
}
