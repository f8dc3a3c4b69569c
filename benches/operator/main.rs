//! Fenced operators on the local control plane (`cargo bench --bench operator`): what
//! the chart's `policies.operators` admission policy costs a write, and how long a
//! fenced operator's role stays unowned when its leader is SIGKILLed.
//!
//! The chart is installed once for the run (`replicaCount=0`: the bench runs its own
//! controller, as every bench does; the other policies limited to the bench's
//! namespace), naming two service accounts in `policies.operators`, and uninstalled at
//! the end.
//!
//! 1. **Failover** (`--kills`, default 60): two operator processes (this binary
//!    re-executed as `operator candidate`, each a service account's token and a
//!    `palisade::operator::run_while_leading` loop on one Lease of `--lease-seconds`,
//!    default 1: client-go's tuned LeaseDuration, which the client-go side of the
//!    figure runs with). The leader writes an owned ConfigMap through its fenced
//!    client as soon as its code runs and every 50 ms after. The harness SIGKILLs the
//!    leader and measures, on its own monotonic clock, from just before the kill to
//!    reading the standby's "first accepted write" line from its stdout (the note
//!    splits it at the grant, as the harness's watch of the Lease saw it, and at the
//!    new leader's code starting, its grant confirmed). The holders are plain
//!    processes on the host, their claims bound to no pod, so a killed leader's grant
//!    ends by expiry, one lease duration after its last renewal. Then
//!    the harness removes the dead claim, starts a replacement, waits until the Lease
//!    lists it waiting, and waits a random phase (0 to one lease duration) against the
//!    leader's renewals before the next kill. A round in which the standby led before
//!    the kill (the leader lost its grant by itself on the loaded machine) is
//!    discarded and counted. (`failover`, `candidate`.)
//! 2. **Admission cost** (`--rounds`, default 1,000): the same write, a merge patch of
//!    one ConfigMap's data, one in flight, by the account named in
//!    `policies.operators` (through `Fence::client`, stamped with its grant's token:
//!    the policy judges it) and by an identical account not named (stamped the same
//!    way, with the same impersonation rights: the policy's match condition is false),
//!    alternating A/B, B/A round by round after a warm-up. Before, the named account's
//!    write without a token must be refused and the other's accepted (the policy judges
//!    the one and not the other). Then the release is upgraded with
//!    `policies.operators=[]` and, once the named account's write without a token is
//!    accepted (the API server no longer has the policy), the same two writes again:
//!    the cost of no policy at all, and the noise between the two accounts.
//!    (`admission`.)
//!
//! A program that prints figures, not a test: `cargo bench --bench operator --
//! [--rounds N] [--kills K] [--lease-seconds S] [--out DIR]`; writes
//! `DIR/palisade-operator.json` in the schema of `benches/common/schema.rs` (scenarios
//! [`schema::OPERATOR_SCENARIOS`]). Needs the cluster of `make cluster` and helm on
//! PATH (the Makefile puts the control-plane binaries first). Smoke run (debug build,
//! figures mean nothing): `cargo test --bench operator -- --rounds 20 --kills 2`.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/schema.rs"]
#[allow(dead_code)]
mod schema;

mod admission;
mod candidate;
mod failover;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;

use schema::{Figure, Latency, OPERATOR_SCENARIOS, OPERATOR_TO_LEADING, Source, nearest_rank};

/// Fenced operators: the admission policy's cost, and failover to the first write.
#[derive(clap::Parser)]
struct Args {
    /// Admission: rounds, each one write by the named account and one by the other
    /// (with the policy, then again without it); 0 skips the admission cost.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    rounds: u32,
    /// Failover: leader kills; 0 skips the failover.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(0..=1_000))]
    kills: u32,
    /// Failover: the Lease's duration, seconds (client-go's tuned LeaseDuration is 1 s).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=60))]
    lease_seconds: i64,
    /// Where palisade-operator.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(candidate::MODE) {
        return candidate::main(&argv[2..]);
    }
    let args = <Args as clap::Parser>::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("operator bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    nearest_rank(&sorted, q)
}

async fn run(args: Args) -> Result<(), String> {
    let started = Instant::now();
    let (kubeconfig, config, client) = cluster::connect().await;
    let setup = setup::Setup::new(&kubeconfig, &config, &client).await?;
    let (mut controller, _) = cluster::start_controller(&kubeconfig, &setup.ns).await;

    let mut latency = Vec::new();
    let mut figures = Vec::new();
    let mut failed = Vec::new();
    if args.kills > 0 {
        eprintln!(
            "operator failover: {} kills, Lease of {} s",
            args.kills, args.lease_seconds
        );
        let config_name = format!("lease-{}s", args.lease_seconds);
        match failover::run(&setup, args.kills as usize, args.lease_seconds).await {
            Ok(run) => {
                for (name, q) in OPERATOR_TO_LEADING.iter().zip([0.50, 0.99]) {
                    figures.push(Figure {
                        system: "palisade".into(),
                        config: config_name.clone(),
                        name: (*name).into(),
                        value: percentile(&run.to_leading, q),
                        unit: "ms".into(),
                        note: "from the kill to the new leader's code starting in run_while_leading: \
                               its grant acquired (the first renewal answered) and every API server \
                               confirmed to refuse its predecessor's token"
                            .into(),
                    });
                }
                latency.push(Latency::of(
                    "palisade",
                    &config_name,
                    OPERATOR_SCENARIOS[1],
                    run.to_write,
                    &run.note,
                ));
            }
            Err(e) => {
                failed.push(format!("failover: {e}"));
                latency.push(Latency::of(
                    "palisade",
                    &config_name,
                    OPERATOR_SCENARIOS[1],
                    vec![],
                    &format!("RUN FAILED: {e}"),
                ));
            }
        }
    }
    if args.rounds > 0 {
        eprintln!(
            "operator admission: {} rounds with the policy, {} without",
            args.rounds, args.rounds
        );
        match admission::run(&setup, args.rounds as usize).await {
            Ok(run) => {
                latency.extend(run.latency);
                figures.extend(run.figures);
            }
            Err(e) => failed.push(format!("admission: {e}")),
        }
    }
    let _ = controller.start_kill();
    let _ = controller.wait().await;

    let version = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let source = Source {
        source: "palisade-operator".into(),
        versions: schema::palisade_versions(Some(version)),
        latency,
        figures,
        parameters: schema::parameters(
            vec![
                ("rounds", json!(args.rounds)),
                ("kills", json!(args.kills)),
                ("lease_seconds", json!(args.lease_seconds)),
                ("namespace", json!(setup.ns)),
            ],
            started,
        ),
    };
    drop(setup);
    let path = source.write_to(&args.out);
    let md = source.summary("palisade fenced operator", |l| &l.config);
    println!("\n{md}\n\nwrote {}", path.display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}
