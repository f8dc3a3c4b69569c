//! What `palisade agent` costs over the client library it wraps, and what the
//! library's release handover takes on each kind of connection, side by side in one
//! run on the local control plane (`make bench`):
//!
//! - Release handover through three paths: the README's client
//!   (`LeaseClient::from_config`: PINGed HTTP/2 connections of its own, watches of 5
//!   minutes), the library on a caller's `kube::Client` (`LeaseClient::new`: watches
//!   of 5 s), and the agent (two agents, as two pods are). From the holder's release
//!   (`Grant::release` called; the agent's `DELETE .../leases/{ns}/{name}` sent) to
//!   the waiter learning of its grant (`acquire` returning; the agent's long-polling
//!   `GET ...?waitMs=` answering `held`); each path on a Lease of its own, one
//!   handover at a time. Beside them, the same handover as the Go and the Java
//!   clients' applications see it (`benches/common/drivers.rs`): each client's
//!   conformance driver, a process per holder on the same two agents, from the
//!   holder's `release` line on its stdin to the waiting driver's `granted` line;
//!   the waiter started and queued before the round, so that its start (a JVM's)
//!   is outside the measure, but not its first acquire's (a cron job's figure). And
//!   warm, as a long-running service sees it: two long-lived drivers per client
//!   (`--grants`) handing a Lease back and forth, each acquiring again after its
//!   release, the first 2 handovers of each pair discarded as warm-up; the Java
//!   client's budget (its p99 within 2 ms of the Go client's) is about these.
//!   `--client-rounds` each (default: `--rounds`). The paths are here, not in `benches/handover.rs`, because
//!   only an A/B in one process, interleaved round by round (the first path of a
//!   round rotating), compares them: run minutes apart, in separate benches, their
//!   difference was smaller than the noise between the runs. `--rounds` each, cut
//!   into `--blocks` blocks; each path's p50 and p99 come with the spread of its
//!   blocks' p50s and p99s (lowest to highest), so that a reader can tell a change
//!   from noise. Beside them, per round, one serial API write (a merge patch of a
//!   LeaseClaim's `spec.renewTime` naming a token: exactly what a renewal sends) on
//!   the README client's connections and on the caller's client's: what one write
//!   on the same connections takes, at the same time.
//! - Holding `--leases` Leases (15 s duration) for `--steady` seconds: the agent's
//!   resident memory and CPU time, and the API server's count of requests to
//!   palisade's resources per held grant, against the library holding as many.
//!
//! A program that prints figures, not a test: `cargo bench --bench agent -- [--rounds
//! N] [--client-rounds N] [--blocks N] [--leases N] [--steady S] [--out DIR]`; writes
//! `DIR/palisade-agent.json` in the schema of `benches/common/schema.rs`. `make test`
//! runs a smoke version. The Go and Java drivers come from PALISADE_CONFORMANCE_GO
//! and PALISADE_CONFORMANCE_JAVA (the Makefile's CONFORMANCE_ENV); without them the
//! bench fails, saying so.

use support::agent_http;
#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/drivers.rs"]
mod drivers;
#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};
use palisade::crd::{LeaseClaim, RENEWED_TOKEN_ANNOTATION};
use serde_json::json;

use schema::{Figure, Latency, Source};

/// The steady Leases' duration: one renewal each per 5 s is the floor.
const STEADY_LEASE_SECS: i64 = 15;

#[derive(clap::Parser)]
struct Args {
    /// Release handovers through each of the three library and agent paths.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Release handovers through each client's driver (Go, Java); default: --rounds.
    #[arg(long)]
    client_rounds: Option<usize>,
    /// Blocks the rounds are cut into, for the spread of the block figures (at least 1).
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// Leases held at steady state.
    #[arg(long, default_value_t = 10)]
    leases: usize,
    /// Seconds at steady state, each for the agent and for the library.
    #[arg(long, default_value_t = 30.0)]
    steady: f64,
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

struct Agent {
    child: tokio::process::Child,
    socket: PathBuf,
}

impl Agent {
    async fn start(
        kubeconfig: &std::path::Path,
        ns: &str,
        dir: &std::path::Path,
        name: &str,
    ) -> Agent {
        let socket = dir.join(format!("{name}.sock"));
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args([
                "agent",
                "--namespace",
                ns,
                "--no-token-files",
                "--admin-addr",
                "127.0.0.1:0",
                "--socket",
            ])
            .arg(&socket)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("starting palisade agent");
        agent_http::wait_for_socket(&socket).await;
        Agent { child, socket }
    }

    async fn session(&self) -> String {
        let (status, body) = agent_http::call(
            &self.socket,
            "POST",
            "/v1/sessions",
            Some(json!({"keepaliveMs": 60_000})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    async fn acquire(&self, session: &str, lease: &str, wait_ms: u64) -> serde_json::Value {
        let body = json!({"name": lease, "durationSeconds": STEADY_LEASE_SECS, "waitMs": wait_ms});
        agent_http::call(
            &self.socket,
            "POST",
            &format!("/v1/sessions/{session}/leases"),
            Some(body),
        )
        .await
        .1
    }

    /// (user + system CPU seconds, resident set in bytes) of the agent process.
    fn usage(&self) -> (f64, f64) {
        let pid = self.child.id().expect("the agent runs");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let rss_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        (ticks / hz, rss_kib * 1024.0)
    }
}

fn options(identity: &str) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod: PodBinding::None,
        timeout: Some(Duration::from_secs(30)),
        slot: None,
    }
}

/// One release-handover path of the A/B: the holder it hands over from, on one Lease.
enum HandoverPath<'a> {
    /// The client library, through the `LeaseClient` given.
    Library {
        leases: LeaseClient,
        lease: &'static str,
        holder: Option<Grant>,
        round: usize,
    },
    /// A thin client's conformance drivers, through the same two agents.
    Driver(Box<drivers::DriverPath>),
    /// The same, two long-lived drivers acquiring again and again.
    Warm(Box<drivers::WarmPath>),
    /// Two agents, as two pods are, handing one Lease back and forth.
    Agent {
        leases: LeaseClient,
        agents: [&'a Agent; 2],
        sessions: [String; 2],
        ns: String,
        round: usize,
    },
}

const AGENT_LEASE: &str = "agent-release";

impl<'a> HandoverPath<'a> {
    async fn library(leases: LeaseClient, lease: &'static str) -> HandoverPath<'a> {
        leases.ensure_lease(lease, STEADY_LEASE_SECS).await.unwrap();
        let holder = leases
            .acquire(lease, options(&format!("{lease}-0")))
            .await
            .unwrap();
        HandoverPath::Library {
            leases,
            lease,
            holder: Some(holder),
            round: 0,
        }
    }

    async fn agent(leases: LeaseClient, agents: [&'a Agent; 2], ns: &str) -> HandoverPath<'a> {
        let sessions = [agents[0].session().await, agents[1].session().await];
        assert_eq!(
            agents[0].acquire(&sessions[0], AGENT_LEASE, 10_000).await["state"],
            "held"
        );
        HandoverPath::Agent {
            leases,
            agents,
            sessions,
            ns: ns.to_string(),
            round: 0,
        }
    }

    /// One release handover, ms.
    async fn handover(&mut self) -> f64 {
        match self {
            HandoverPath::Library {
                leases,
                lease,
                holder,
                round,
            } => {
                *round += 1;
                let (l, lease) = (leases.clone(), *lease);
                let identity = format!("{lease}-{round}");
                let waiter =
                    tokio::spawn(async move { l.acquire(lease, options(&identity)).await });
                cluster::wait_waiting(leases, lease, 1).await;
                let let_go = Instant::now();
                holder.take().unwrap().release().await.unwrap();
                *holder = Some(waiter.await.unwrap().unwrap());
                let_go.elapsed().as_secs_f64() * 1e3
            }
            HandoverPath::Agent {
                leases,
                agents,
                sessions,
                ns,
                round,
            } => {
                let (holder, waiter) = (*round % 2, (*round + 1) % 2);
                *round += 1;
                let grant_path =
                    |i: usize| format!("/v1/sessions/{}/leases/{ns}/{AGENT_LEASE}", sessions[i]);
                assert_eq!(
                    agents[waiter]
                        .acquire(&sessions[waiter], AGENT_LEASE, 0)
                        .await["state"],
                    "waiting"
                );
                cluster::wait_waiting(leases, AGENT_LEASE, 1).await;
                // The waiter's long poll is in flight before the release.
                let socket = agents[waiter].socket.clone();
                let poll = format!("{}?waitMs=30000", grant_path(waiter));
                let granted = tokio::spawn(async move {
                    let answer = agent_http::call(&socket, "GET", &poll, None).await.1;
                    (Instant::now(), answer)
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                let let_go = Instant::now();
                let (status, released) =
                    agent_http::call(&agents[holder].socket, "DELETE", &grant_path(holder), None)
                        .await;
                assert_eq!(status, 200, "{released}");
                let (at, answer) = granted.await.unwrap();
                assert_eq!(answer["state"], "held", "{answer}");
                (at - let_go).as_secs_f64() * 1e3
            }
            HandoverPath::Driver(path) => path.handover().await,
            HandoverPath::Warm(path) => path.handover().await,
        }
    }

    async fn finish(self) {
        match self {
            HandoverPath::Library { holder, .. } => holder.unwrap().release().await.unwrap(),
            HandoverPath::Agent {
                agents, sessions, ..
            } => {
                for (agent, session) in agents.iter().zip(&sessions) {
                    let path = format!("/v1/sessions/{session}");
                    agent_http::call(&agent.socket, "DELETE", &path, None).await;
                }
            }
            HandoverPath::Driver(path) => path.finish().await,
            HandoverPath::Warm(path) => path.finish().await,
        }
    }
}

/// One serial API write, exactly what a renewal sends (a merge patch of a claim's
/// `spec.renewTime` naming a token), on the connections of `claims`, ms.
async fn serial_write(claims: &Api<LeaseClaim>, claim: &str) -> f64 {
    let renewal = json!({
        "metadata": {"annotations": {RENEWED_TOKEN_ANNOTATION: "1"}},
        "spec": {"renewTime": MicroTime(Timestamp::now())},
    });
    let sent = Instant::now();
    claims
        .patch(claim, &PatchParams::default(), &Patch::Merge(&renewal))
        .await
        .unwrap();
    sent.elapsed().as_secs_f64() * 1e3
}

/// The A/B's configs, in the order of its rows.
const PATHS: [&str; 7] = [
    "readme-client",
    "library",
    "agent",
    "go-client",
    "java-client",
    "go-client-warm",
    "java-client-warm",
];
/// The first path through a client's driver: the paths from here on take `--client-rounds`.
const FIRST_DRIVER_PATH: usize = 3;
/// What each path's samples start and end with.
const PATH_NOTES: [&str; 7] = [
    "Grant::release called -> the waiter's acquire returns, both on a LeaseClient::from_config \
     (the README's client: PINGed HTTP/2 connections of its own, watches of 5 minutes)",
    "Grant::release called -> the waiter's acquire returns, both on LeaseClient::new over the \
     caller's kube::Client (watches of 5 s)",
    "DELETE of the grant sent to the holder's agent -> the waiter's long poll (GET ?waitMs) on \
     its own agent answers held",
    "first acquire of a fresh process: the line `release` written to the holding Go driver's \
     stdin -> the waiting Go driver's `granted` line read (tests/conformance/go, a process per \
     holder, each on its own agent of the agent path's two; the waiter started and queued \
     before the round)",
    "first acquire of a fresh JVM: the line `release` written to the holding Java driver's \
     stdin -> the waiting Java driver's `granted` line read (tests/conformance/java, a JVM per \
     holder, each on its own agent of the agent path's two; the waiter started and queued \
     before the round, so the JVM's start is outside the measure, not its first acquire's)",
    "warm, a later acquire in a long-lived process: the line `release` written to the holding \
     Go driver's stdin -> the other Go driver's `granted` line read (two drivers with \
     --grants, one on each agent, handing the Lease back and forth; the released one queued \
     again before the next round; the first 2 handovers of the pair discarded as warm-up)",
    "warm, a later acquire in a long-lived JVM: the line `release` written to the holding \
     Java driver's stdin -> the other Java driver's `granted` line read (two drivers with \
     --grants, one on each agent, handing the Lease back and forth; the released one queued \
     again before the next round; the first 2 handovers of the pair discarded as warm-up)",
];

/// Per path, its samples by block; and per connection set (README client, caller's
/// client), the serial writes' samples.
struct AbResult {
    release: [Vec<Vec<f64>>; 7],
    writes: [Vec<f64>; 2],
}

/// The clients' drivers and where their processes' logs go.
struct DriverSetup {
    go: PathBuf,
    java: PathBuf,
    logs: PathBuf,
}

/// The release A/B: the seven paths interleaved round by round (the first path of a
/// round rotates, so no path always follows another), `rounds` each (the drivers'
/// paths `client_rounds`) in `blocks` blocks; one serial write on each library path's
/// connections per round of those.
async fn release_ab(
    readme: LeaseClient,
    library: LeaseClient,
    agents: [&Agent; 2],
    ns: &str,
    drivers: &DriverSetup,
    (rounds, client_rounds, blocks): (usize, usize, usize),
) -> AbResult {
    let probe = "write-probe";
    library.ensure_lease(probe, 3600).await.unwrap();
    let claim: LeaseClaim = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": probe},
        "spec": {"leaseName": probe, "holderIdentity": probe}
    }))
    .unwrap();
    library
        .claims()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let probes = [readme.claims().clone(), library.claims().clone()];
    let sockets = [agents[0].socket.clone(), agents[1].socket.clone()];
    let driver_path = |client, program: &PathBuf| {
        drivers::DriverPath::start(
            client,
            program.clone(),
            sockets.clone(),
            library.clone(),
            (ns, STEADY_LEASE_SECS),
            &drivers.logs,
        )
    };
    let warm_path = |client, program: &PathBuf| {
        drivers::WarmPath::start(
            client,
            program.clone(),
            sockets.clone(),
            library.clone(),
            (ns, STEADY_LEASE_SECS),
            &drivers.logs,
            client_rounds,
        )
    };
    let mut paths = [
        HandoverPath::library(readme.clone(), "readme-release").await,
        HandoverPath::library(library.clone(), "library-release").await,
        HandoverPath::agent(library.clone(), agents, ns).await,
        HandoverPath::Driver(Box::new(
            driver_path(drivers::Client::Go, &drivers.go).await,
        )),
        HandoverPath::Driver(Box::new(
            driver_path(drivers::Client::Java, &drivers.java).await,
        )),
        HandoverPath::Warm(Box::new(warm_path(drivers::Client::Go, &drivers.go).await)),
        HandoverPath::Warm(Box::new(
            warm_path(drivers::Client::Java, &drivers.java).await,
        )),
    ];
    let in_block =
        |total: usize, block: usize| total / blocks + usize::from(block < total % blocks);
    let mut out = AbResult {
        release: Default::default(),
        writes: Default::default(),
    };
    for block in 0..blocks {
        let n = in_block(rounds, block);
        let n_clients = in_block(client_rounds, block);
        let mut samples: [Vec<f64>; 7] = Default::default();
        for round in 0..n.max(n_clients) {
            for k in 0..PATHS.len() {
                let i = (round + k) % PATHS.len();
                if round < if i < FIRST_DRIVER_PATH { n } else { n_clients } {
                    samples[i].push(paths[i].handover().await);
                }
            }
            if round >= n {
                continue;
            }
            for k in 0..2 {
                let i = (round + k) % 2;
                out.writes[i].push(serial_write(&probes[i], probe).await);
            }
        }
        for (all, s) in out.release.iter_mut().zip(samples) {
            all.push(s);
        }
    }
    for p in paths {
        p.finish().await;
    }
    let _ = library
        .claims()
        .delete(probe, &DeleteParams::default())
        .await;
    out
}

/// p50 and p99 (nearest rank) of some samples.
fn p50_p99(samples: &[f64]) -> (f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    (
        schema::nearest_rank(&s, 0.5),
        schema::nearest_rank(&s, 0.99),
    )
}

/// The path's latency entry and the spread of its blocks' p50s and p99s.
fn ab_entries(config: &str, note: &str, blocks: &[Vec<f64>]) -> (Latency, Vec<Figure>) {
    let per_block: Vec<(f64, f64)> = blocks.iter().map(|b| p50_p99(b)).collect();
    let range = |f: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = per_block.iter().map(f).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    let (p50s, p99s) = (range(|b| b.0), range(|b| b.1));
    let all: Vec<f64> = blocks.concat();
    let spread = format!(
        "{} blocks of {}: block p50s {:.1} to {:.1} ms, block p99s {:.1} to {:.1} ms",
        blocks.len(),
        blocks.first().map_or(0, Vec::len),
        p50s.0,
        p50s.1,
        p99s.0,
        p99s.1
    );
    let latency = Latency::of(
        "palisade-agent",
        config,
        "release",
        all,
        &format!("{note}; {AB_NOTE}; {spread}"),
    );
    let fig = |name: &str, value: f64, what: &str| Figure {
        system: "palisade-agent".into(),
        config: config.into(),
        name: name.into(),
        value,
        unit: "ms".into(),
        note: format!("release handover, {what} of the block figures ({spread})"),
    };
    let figures = vec![
        fig("release_block_p50_min", p50s.0, "the lowest p50"),
        fig("release_block_p50_max", p50s.1, "the highest p50"),
        fig("release_block_p99_min", p99s.0, "the lowest p99"),
        fig("release_block_p99_max", p99s.1, "the highest p99"),
    ];
    (latency, figures)
}

const AB_NOTE: &str = "one handover at a time, each path on a Lease of its own; the \
     paths interleaved round by round in one process (the first of a round rotating), the \
     controller and the API server the same";

/// The Java client's release handover p99 less the Go client's, same run, on the
/// first-acquire paths or the warm ones (`config`: the Java path's): the Java client's
/// budget is 2 ms, warm.
fn java_over_go(go: &[Vec<f64>], java: &[Vec<f64>], config: &str, name: &str) -> Figure {
    let (go, java) = (p50_p99(&go.concat()).1, p50_p99(&java.concat()).1);
    let (what, budget) = match config {
        "java-client" => ("first acquire of a fresh process", "as a cron job sees it"),
        _ => (
            "warm: a later acquire in a long-lived process",
            "the budget is 2 ms",
        ),
    };
    Figure {
        system: "palisade-agent".into(),
        config: config.into(),
        name: name.into(),
        value: java - go,
        unit: "ms".into(),
        note: format!(
            "release handover p99 through the Java client's driver less the Go client's, {what}, \
             interleaved in the same run ({java:.2} ms against {go:.2} ms); {budget}"
        ),
    }
}

/// Requests/s to palisade's resources the API server counted over `window`.
async fn request_rate(client: &kube::Client, window: f64) -> f64 {
    let before = cluster::palisade_requests(client).await;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(window)).await;
    (cluster::palisade_requests(client).await - before) / t0.elapsed().as_secs_f64()
}

fn figure(name: &str, value: f64, unit: &str, note: String) -> Figure {
    Figure {
        system: "palisade-agent".into(),
        config: "default".into(),
        name: name.into(),
        value,
        unit: unit.into(),
        note,
    }
}

/// The A/B's latency entries, and its figures: block spreads, Java over Go, serial writes.
fn ab_output(ab: &AbResult) -> (Vec<Latency>, Vec<Figure>) {
    let mut latency = Vec::new();
    let mut ab_figures = Vec::new();
    for ((config, note), blocks) in PATHS.iter().zip(PATH_NOTES).zip(&ab.release) {
        let (l, f) = ab_entries(config, note, blocks);
        latency.push(l);
        ab_figures.extend(f);
    }
    for (go, java, config, name) in [
        (3, 4, "java-client", "release_p99_over_go_client"),
        (5, 6, "java-client-warm", "release_p99_warm_java_over_go"),
    ] {
        ab_figures.push(java_over_go(
            &ab.release[go],
            &ab.release[java],
            config,
            name,
        ));
    }
    for (config, writes) in PATHS.iter().zip(&ab.writes) {
        let (p50, p99) = p50_p99(writes);
        let note = format!(
            "one serial API write, a merge patch of a LeaseClaim's spec.renewTime naming a token \
             (what a renewal sends), on the {config} path's connections, one per round of the \
             release A/B, interleaved with it; n = {}",
            writes.len()
        );
        for (name, value) in [("serial_write_p50", p50), ("serial_write_p99", p99)] {
            ab_figures.push(Figure {
                system: "palisade-agent".into(),
                config: (*config).into(),
                name: name.into(),
                value,
                unit: "ms".into(),
                note: note.clone(),
            });
        }
    }
    (latency, ab_figures)
}

/// `n` Leases held `secs` through the agent, then through the library: the agent's RSS
/// and CPU share, and requests/s per held grant through the agent and the library.
async fn steady(
    agent: &Agent,
    leases: &LeaseClient,
    client: &kube::Client,
    n: usize,
    secs: f64,
) -> Vec<Figure> {
    eprintln!(
        "palisade-agent: {n} Leases held {secs} s through the agent, then through the library"
    );
    let session = agent.session().await;
    let names: Vec<String> = (0..n).map(|i| format!("steady-{i}")).collect();
    for name in &names {
        assert_eq!(agent.acquire(&session, name, 10_000).await["state"], "held");
    }
    let keepalive = {
        let (socket, path) = (
            agent.socket.clone(),
            format!("/v1/sessions/{session}/keepalive"),
        );
        tokio::spawn(async move {
            loop {
                agent_http::call(&socket, "POST", &path, None).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu_before, _) = agent.usage();
    let t0 = Instant::now();
    let agent_rate = request_rate(client, secs).await / n as f64;
    let (cpu_after, rss) = agent.usage();
    let cpu_share = (cpu_after - cpu_before) / t0.elapsed().as_secs_f64();
    keepalive.abort();
    let path = format!("/v1/sessions/{session}");
    agent_http::call(&agent.socket, "DELETE", &path, None).await;

    let mut held = Vec::new();
    for name in &names {
        let identity = format!("lib-{name}");
        held.push(leases.acquire(name, options(&identity)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let library_rate = request_rate(client, secs).await / n as f64;
    for grant in held {
        grant.release().await.unwrap();
    }
    vec![
        figure(
            "rss_bytes_holding_leases",
            rss,
            "bytes",
            format!("VmRSS of the agent holding {n} Leases in one session"),
        ),
        figure(
            "cpu_share_holding_leases",
            cpu_share * 100.0,
            "%",
            format!(
                "user+system CPU time of the agent over {secs} s holding {n} Leases, as a share of one core"
            ),
        ),
        figure(
            "requests_per_s_per_grant_agent",
            agent_rate,
            "req/s",
            format!(
                "apiserver_request_total (palisade.dev leases+leaseclaims) over {secs} s, per held grant, {STEADY_LEASE_SECS} s lease, through the agent"
            ),
        ),
        figure(
            "requests_per_s_per_grant_library",
            library_rate,
            "req/s",
            format!("the same, {n} Leases held by the library in-process"),
        ),
    ]
}

#[tokio::main]
async fn main() {
    let args = <Args as clap::Parser>::parse();
    assert!(
        args.rounds <= 10_000
            && (1..=args.rounds.max(1)).contains(&args.blocks)
            && args.leases <= 1_000
            && (0.0..=600.0).contains(&args.steady),
        "arguments out of range"
    );
    let client_rounds = args.client_rounds.unwrap_or(args.rounds);
    assert!(client_rounds <= 10_000, "arguments out of range");
    let programs = (
        drivers::Client::Go.program(),
        drivers::Client::Java.program(),
    );
    let (go, java) = match programs {
        (Ok(go), Ok(java)) => (go, java),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("palisade-agent: {e}");
            std::process::exit(1);
        }
    };
    let (kubeconfig, config, client) = cluster::connect().await;
    let ns = format!("bench-agent-{}", std::process::id());
    cluster::create_namespace(&client, &ns).await;
    let (mut controller, _) = cluster::start_controller(&kubeconfig, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let agents = [
        Agent::start(&kubeconfig, &ns, dir.path(), "a").await,
        Agent::start(&kubeconfig, &ns, dir.path(), "b").await,
    ];
    let leases = LeaseClient::new(client.clone(), &ns);
    let started = Instant::now();

    eprintln!(
        "palisade-agent: {} release handovers each through the README's client, the library \
         on the caller's client and the agent, and {client_rounds} through the Go and the Java \
         client's drivers (a fresh process's first acquire, and warm), interleaved round by round in {} blocks",
        args.rounds, args.blocks
    );
    let readme = LeaseClient::from_config(config.clone(), Some(&ns)).expect("a LeaseClient");
    let drivers = DriverSetup {
        go,
        java,
        logs: dir.path().to_path_buf(),
    };
    let ab = release_ab(
        readme,
        leases.clone(),
        [&agents[0], &agents[1]],
        &ns,
        &drivers,
        (args.rounds, client_rounds, args.blocks),
    )
    .await;

    let mut figures = steady(&agents[0], &leases, &client, args.leases, args.steady).await;
    let _ = controller.start_kill();
    cluster::delete_namespace(&client, &ns).await;

    let (latency, ab_figures) = ab_output(&ab);
    figures.extend(ab_figures);
    let source = Source {
        source: "palisade-agent".into(),
        versions: schema::palisade_versions(None),
        latency,
        figures,
        parameters: schema::parameters(
            vec![
                ("rounds", json!(args.rounds)),
                ("client_rounds", json!(client_rounds)),
                ("blocks", json!(args.blocks)),
                ("leases", json!(args.leases)),
                ("steady_seconds", json!(args.steady)),
            ],
            started,
        ),
    };
    let path = source.write_to(&args.out);
    let md = source.summary("release handover", |l| &l.config);
    println!("\n{md}\n\nwrote {}", path.display());
}
