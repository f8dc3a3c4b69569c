//! What `palisade agent` costs over the client library it wraps, side by side in one
//! run on the local control plane (`make bench`):
//!
//! - Release handover: from the holder's release (the library's `Grant::release`
//!   called; the agent's `DELETE .../leases/{ns}/{name}` sent) to the waiter
//!   learning of its grant (the library's `acquire` returning; the agent's
//!   long-polling `GET ...?waitMs=` answering `held`). The agent's holder and waiter
//!   are two agents, as two pods are; one Lease, one handover at a time.
//! - Holding `--leases` Leases (15 s duration) for `--steady` seconds: the agent's
//!   resident memory and CPU time, and the API server's count of requests to
//!   palisade's resources per held grant, against the library holding as many.
//!
//! A program that prints figures, not a test: `cargo bench --bench agent -- [--rounds
//! N] [--leases N] [--steady S] [--out DIR]`; writes `DIR/palisade-agent.json` in the
//! schema of `benches/common/schema.rs`. `make test` runs a smoke version.

use support::agent_http;
#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use serde_json::json;

use schema::{Figure, Latency, Source};

/// The steady Leases' duration: one renewal each per 5 s is the floor.
const STEADY_LEASE_SECS: i64 = 15;

#[derive(clap::Parser)]
struct Args {
    /// Release handovers, through the library and through the agent each.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
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
    async fn start(kubeconfig: &Path, ns: &str, dir: &Path, name: &str) -> Agent {
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
    }
}

async fn library_release(leases: &LeaseClient, rounds: usize) -> Vec<f64> {
    leases
        .ensure_lease("library-release", STEADY_LEASE_SECS)
        .await
        .unwrap();
    let mut holder = leases
        .acquire("library-release", options("lib-0"))
        .await
        .unwrap();
    let mut samples = Vec::new();
    for i in 1..=rounds {
        let l = leases.clone();
        let waiter = tokio::spawn(async move {
            l.acquire("library-release", options(&format!("lib-{i}")))
                .await
        });
        cluster::wait_waiting(leases, "library-release", 1).await;
        let let_go = Instant::now();
        holder.release().await.unwrap();
        holder = waiter.await.unwrap().unwrap();
        samples.push(let_go.elapsed().as_secs_f64() * 1e3);
    }
    holder.release().await.unwrap();
    samples
}

async fn agent_release(
    leases: &LeaseClient,
    agents: [&Agent; 2],
    ns: &str,
    rounds: usize,
) -> Vec<f64> {
    const LEASE: &str = "agent-release";
    let sessions = [agents[0].session().await, agents[1].session().await];
    let grant_path = |i: usize| format!("/v1/sessions/{}/leases/{ns}/{LEASE}", sessions[i]);
    assert_eq!(
        agents[0].acquire(&sessions[0], LEASE, 10_000).await["state"],
        "held"
    );
    let mut samples = Vec::new();
    for round in 0..rounds {
        let (holder, waiter) = (round % 2, (round + 1) % 2);
        assert_eq!(
            agents[waiter].acquire(&sessions[waiter], LEASE, 0).await["state"],
            "waiting"
        );
        cluster::wait_waiting(leases, LEASE, 1).await;
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
            agent_http::call(&agents[holder].socket, "DELETE", &grant_path(holder), None).await;
        assert_eq!(status, 200, "{released}");
        let (at, answer) = granted.await.unwrap();
        assert_eq!(answer["state"], "held", "{answer}");
        samples.push((at - let_go).as_secs_f64() * 1e3);
    }
    for (agent, session) in agents.iter().zip(&sessions) {
        agent_http::call(
            &agent.socket,
            "DELETE",
            &format!("/v1/sessions/{session}"),
            None,
        )
        .await;
    }
    samples
}

/// Requests/s to palisade's resources the API server counted over `window`.
async fn request_rate(client: &kube::Client, window: f64) -> f64 {
    let count = || async {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = client
            .request_text(req)
            .await
            .expect("GET /metrics of the API server");
        text.lines()
            .filter(|l| {
                l.starts_with("apiserver_request_total{")
                    && l.contains(r#"group="palisade.dev""#)
                    && (l.contains(r#"resource="leases""#)
                        || l.contains(r#"resource="leaseclaims""#))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = count().await;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(window)).await;
    (count().await - before) / t0.elapsed().as_secs_f64()
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

#[tokio::main]
async fn main() {
    let args = <Args as clap::Parser>::parse();
    assert!(
        args.rounds <= 10_000 && args.leases <= 1_000 && (0.0..=600.0).contains(&args.steady),
        "arguments out of range"
    );
    let (kubeconfig, _, client) = cluster::connect().await;
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
        "palisade-agent: {} release handovers each, library and agent, alternating in blocks",
        args.rounds
    );
    let (mut library, mut agent) = (Vec::new(), Vec::new());
    // Alternating blocks, so that neither side gets the quieter minutes.
    for block in 0..4 {
        let n = args.rounds / 4 + usize::from(block < args.rounds % 4);
        library.extend(library_release(&leases, n).await);
        agent.extend(agent_release(&leases, [&agents[0], &agents[1]], &ns, n).await);
    }

    eprintln!(
        "palisade-agent: {} Leases held {} s through the agent, then through the library",
        args.leases, args.steady
    );
    let session = agents[0].session().await;
    let names: Vec<String> = (0..args.leases).map(|i| format!("steady-{i}")).collect();
    for name in &names {
        assert_eq!(
            agents[0].acquire(&session, name, 10_000).await["state"],
            "held"
        );
    }
    let keepalive = {
        let (socket, path) = (
            agents[0].socket.clone(),
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
    let (cpu_before, _) = agents[0].usage();
    let t0 = Instant::now();
    let agent_rate = request_rate(&client, args.steady).await / args.leases as f64;
    let (cpu_after, rss) = agents[0].usage();
    let cpu_share = (cpu_after - cpu_before) / t0.elapsed().as_secs_f64();
    keepalive.abort();
    agent_http::call(
        &agents[0].socket,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        None,
    )
    .await;

    let mut held = Vec::new();
    for name in &names {
        held.push(
            leases
                .acquire(name, options(&format!("lib-{name}")))
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let library_rate = request_rate(&client, args.steady).await / args.leases as f64;
    for grant in held {
        grant.release().await.unwrap();
    }
    let _ = controller.start_kill();
    cluster::delete_namespace(&client, &ns).await;

    let note = "one Lease, one handover at a time; alternating blocks of library and agent rounds";
    let latency = vec![
        Latency::of(
            "palisade-agent",
            "library",
            "release",
            library,
            &format!("Grant::release called -> the waiter's acquire returns; {note}"),
        ),
        Latency::of(
            "palisade-agent",
            "agent",
            "release",
            agent,
            &format!(
                "DELETE of the grant sent to the holder's agent -> the waiter's long poll (GET ?waitMs) on its own agent answers held; {note}"
            ),
        ),
    ];
    let figures = vec![
        figure(
            "rss_bytes_holding_leases",
            rss,
            "bytes",
            format!(
                "VmRSS of the agent holding {} Leases in one session",
                args.leases
            ),
        ),
        figure(
            "cpu_share_holding_leases",
            cpu_share * 100.0,
            "%",
            format!(
                "user+system CPU time of the agent over {} s holding {} Leases, as a share of one core",
                args.steady, args.leases
            ),
        ),
        figure(
            "requests_per_s_per_grant_agent",
            agent_rate,
            "req/s",
            format!(
                "apiserver_request_total (palisade.dev leases+leaseclaims) over {} s, per held grant, {STEADY_LEASE_SECS} s lease, through the agent",
                args.steady
            ),
        ),
        figure(
            "requests_per_s_per_grant_library",
            library_rate,
            "req/s",
            format!(
                "the same, {} Leases held by the library in-process",
                args.leases
            ),
        ),
    ];
    let source = Source {
        source: "palisade-agent".into(),
        versions: schema::palisade_versions(None),
        latency,
        figures,
        parameters: schema::parameters(
            vec![
                ("rounds", json!(args.rounds)),
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
