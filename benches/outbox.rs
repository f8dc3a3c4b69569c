//! The fenced outbox's relay (`cargo bench --bench outbox -- [--intents N]
//! [--rounds R] [--out DIR]`): intents per second through one relay, and the delay
//! from enqueue to the provider's execution for intents enqueued around a relay
//! failover. A program that prints figures, not a test. Needs `make cluster` and `make
//! databases`; writes `DIR/outbox.json` (figures only) in the schema of
//! benches/common/schema.rs.
//!
//! How: a database of its own with the fence and the outbox, the provider of the
//! tests (`support::provider`, in this process, so its execution instants and the
//! enqueue instants are on one clock), the controller for a namespace of its own and
//! `palisade outbox relay` processes of this build (release under `cargo bench`).
//!
//! - *Throughput*: N intents committed in one transaction while the relay holds its
//!   Lease, then the time until the last is recorded delivered; intents/s = N / that.
//! - *Failover*: a relay and a standby; an intent enqueued every 10 ms from 0.5 s
//!   before a SIGKILL of the holder to 1.5 s past the Lease's duration after it; the
//!   delay of each is its first execution by the provider less its commit. The
//!   standby takes over once the killed relay's grant expires (the Lease's duration,
//!   2 s here), so that is what p99 measures; R rounds, a new standby each.

#[path = "common/cluster.rs"]
#[allow(dead_code)]
mod cluster;
#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use schema::{Figure, Source, nearest_rank};
use support::provider::Provider;
use tokio_postgres::{Client, NoTls};

const LEASE_SECONDS: u64 = 2;
const DB: &str = "palisade_outbox_bench";
const LIMIT: Duration = Duration::from_secs(120);

#[derive(clap::Parser)]
struct Args {
    /// Intents of the throughput run.
    #[arg(long, default_value_t = 2000)]
    intents: usize,
    /// Failover rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where outbox.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// A `palisade outbox relay` of this build; SIGKILLed when dropped.
fn relay(
    kubeconfig: &Path,
    ns: &str,
    name: &str,
    url: &str,
    endpoint: &str,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "outbox",
            "relay",
            "-n",
            ns,
            "--lease",
            "relay",
            "--identity",
            name,
        ])
        .args(["--store", url, "--endpoint", endpoint, "--batch", "64"])
        .args([
            "--duration",
            &format!("{LEASE_SECONDS}s"),
            "--poll",
            "20ms",
            "--timeout",
            "5s",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawning palisade outbox relay")
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// The bench's database, created afresh, with the fence and the outbox; its URL.
async fn database() -> String {
    let base = std::env::var("PALISADE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:15432/postgres".into());
    let admin = connect(&base).await;
    for sql in [
        format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"),
        format!("CREATE DATABASE {DB}"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let url = format!(
        "{}/{DB}",
        base.rsplit_once('/').expect("a URL with a database").0
    );
    let client = connect(&url).await;
    palisade::fence::postgres::install(&client)
        .await
        .expect("install the fence");
    palisade::outbox::install(&client)
        .await
        .expect("install the outbox");
    url
}

/// Polls (every 10 ms, at most [`LIMIT`]) until `count` intents are delivered.
async fn wait_delivered(db: &Client, count: i64) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let delivered: i64 = db
            .query_one(
                "SELECT count(*) FROM palisade.outbox WHERE state = 'delivered'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if delivered >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{delivered} of {count} delivered after {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the Lease `relay` is held by `identity`.
async fn wait_holder(leases: &palisade::client::LeaseClient, identity: &str) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let lease = leases.leases().get_opt("relay").await.ok().flatten();
        let holder = lease.and_then(|l| l.status?.holder.map(|h| h.identity));
        if holder.as_deref() == Some(identity) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{identity} did not take the relay's lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn throughput(db: &mut Client, intents: usize) -> f64 {
    let tx = db.transaction().await.unwrap();
    for n in 0..intents {
        palisade::outbox::enqueue(&tx, "bench/writer", 1, &serde_json::json!({"amount": n}))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let committed = Instant::now();
    wait_delivered(db, intents as i64).await;
    intents as f64 / committed.elapsed().as_secs_f64()
}

/// One failover round: the delays (ms) of the intents enqueued around the kill.
async fn failover_round(
    db: &Client,
    provider: &Provider,
    holder: &mut tokio::process::Child,
) -> Vec<f64> {
    let tick = Duration::from_millis(10);
    let start = Instant::now();
    let kill_at = start + Duration::from_millis(500);
    let end = kill_at + Duration::from_secs(LEASE_SECONDS) + Duration::from_millis(1500);
    let mut enqueued = Vec::new();
    let mut killed = false;
    while Instant::now() < end {
        if !killed && Instant::now() >= kill_at {
            holder.start_kill().expect("SIGKILL the holding relay");
            killed = true;
        }
        let id: String = db
            .query_one(
                "SELECT palisade.enqueue('bench/writer', 1, '{\"failover\": true}')::text",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        enqueued.push((id, Instant::now()));
        tokio::time::sleep(tick).await;
    }
    let total: i64 = db
        .query_one("SELECT count(*) FROM palisade.outbox", &[])
        .await
        .unwrap()
        .get(0);
    wait_delivered(db, total).await;
    let keys = provider.keys();
    enqueued
        .iter()
        .map(|(id, at)| {
            let executed = keys[id]
                .executed_at
                .expect("delivered intents were executed");
            executed.saturating_duration_since(*at).as_secs_f64() * 1000.0
        })
        .collect()
}

fn figure(name: &str, value: f64, unit: &str, note: &str) -> Figure {
    Figure {
        system: "palisade".into(),
        config: format!("lease-{LEASE_SECONDS}s"),
        name: name.into(),
        value,
        unit: unit.into(),
        note: note.into(),
    }
}

async fn run(args: &Args) -> Source {
    let started = Instant::now();
    let (kubeconfig, config, client) = cluster::connect().await;
    let ns = format!("outbox-bench-{}", std::process::id());
    cluster::create_namespace(&client, &ns).await;
    let (_controller, _) = cluster::start_controller(&kubeconfig, &ns).await;
    let leases = palisade::client::LeaseClient::from_config(config, Some(&ns)).unwrap();
    let url = database().await;
    let mut db = connect(&url).await;
    let provider = Provider::start().await;

    let mut holder = relay(&kubeconfig, &ns, "relay-0", &url, &provider.url());
    wait_holder(&leases, "relay-0").await;
    let per_s = throughput(&mut db, args.intents).await;

    let mut delays = Vec::new();
    for round in 1..=args.rounds {
        let standby = relay(
            &kubeconfig,
            &ns,
            &format!("relay-{round}"),
            &url,
            &provider.url(),
        );
        delays.extend(failover_round(&db, &provider, &mut holder).await);
        wait_holder(&leases, &format!("relay-{round}")).await;
        holder = standby;
    }
    drop(holder);
    cluster::delete_namespace(&client, &ns).await;
    delays.sort_by(f64::total_cmp);
    let note = "enqueue commit to the provider's first execution, intents enqueued every 10 ms from 0.5 s before a SIGKILL of the holding relay to 1.5 s past the lease duration after it";
    let mut source = Source {
        source: "outbox".into(),
        versions: schema::palisade_versions(None),
        ..Source::default()
    };
    source.figures = vec![
        figure(
            "outbox_intents_per_s",
            per_s,
            "intents/s",
            "one relay, batch 64, N intents committed at once until the last recorded delivered",
        ),
        figure(
            "outbox_failover_delay_p50",
            nearest_rank(&delays, 0.5),
            "ms",
            note,
        ),
        figure(
            "outbox_failover_delay_p99",
            nearest_rank(&delays, 0.99),
            "ms",
            note,
        ),
        figure(
            "outbox_failover_delay_max",
            delays.last().copied().unwrap_or(f64::NAN),
            "ms",
            note,
        ),
    ];
    source.parameters = schema::parameters(
        vec![
            ("intents", serde_json::json!(args.intents)),
            ("rounds", serde_json::json!(args.rounds)),
            ("failover_intents", serde_json::json!(delays.len())),
        ],
        started,
    );
    source
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    if args.intents == 0 || args.rounds == 0 {
        eprintln!("outbox: --intents and --rounds must be at least 1");
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let source = runtime.block_on(run(&args));
    for f in &source.figures {
        println!("outbox: {:<28} {:>10.1} {}", f.name, f.value, f.unit);
    }
    let path = source.write_to(&args.out);
    println!("outbox: wrote {}", path.display());
    ExitCode::SUCCESS
}
