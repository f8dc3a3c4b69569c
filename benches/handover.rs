//! Handover latency and API cost of palisade on the local control plane (`make bench`).
//!
//! Latency: from the moment the holder lets go (its release request is sent, its
//! Pod object is deleted, or its lease duration runs out) to the moment the next
//! holder's process observes its grant (its `acquire` returns). Release and Pod
//! deletion run one handover at a time on one Lease; expiry (2 s lease duration, a
//! holder that renews once when it sees its grant and then falls silent, reported as
//! the time past its renewal + the duration) runs `--expiry-lanes` independent
//! Leases side by side, `--expiry-rounds` handovers each, so that 200 of them take
//! under a minute; lane `l` starts `l / lanes` of the duration late, as the peers'
//! expiry lanes do, so that the lanes do not come due in step. The holders and waiters use a `LeaseClient` as the README builds it
//! (PINGed HTTP/2 connections of its own). Each Pod-deletion and expiry sample is
//! split where the controller decided it (the Lease's `status.acquireTime`, its wall
//! clock, on the same machine), and the note says, for the slowest 1%, how much CPU
//! the machine and the two busiest processes used over it: where a stall was spent.
//!
//! API cost: requests/s the API server counts (`apiserver_request_total`, group
//! `palisade.dev`, resources `leases` and `leaseclaims`: the holder's, the
//! waiters' and the controller's) at steady state for one Lease (15 s duration)
//! with one holder and three waiters, over `--steady` seconds after `--warmup`,
//! less the rate of an idle window of `--baseline` seconds before.
//!
//! A program that prints figures, not a test: `cargo bench --bench handover --
//! [--rounds N] [--expiry-lanes N] [--expiry-rounds N] [--steady S] [--warmup S]
//! [--baseline S] [--out DIR]`; writes `DIR/palisade-handover.json` in the schema
//! of `benches/common/schema.rs` (`benches/report.rs` merges it). Needs the cluster
//! of `make cluster`. `make test` runs a smoke version (a few rounds, debug build)
//! so this cannot rot.

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/cpu.rs"]
#[allow(dead_code)]
mod cpu;
use support::requests;
#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, Config, ResourceExt};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::crd::{LeaseClaim, RENEWED_TOKEN_ANNOTATION};
use serde_json::json;

use cluster::{WAIT_LIMIT, wait_waiting};
use cpu::Census;
use schema::{Figure, Latency, Source};

/// The lease duration of the API-cost Lease, client-go's default.
const STEADY_LEASE_SECS: i64 = 15;
/// An idle rate of palisade.dev requests above this (req/s) means someone else uses the cluster.
const NOT_IDLE: f64 = 1.0;

/// Handover latency and API cost of palisade (`make bench`; needs `make cluster`).
#[derive(clap::Parser)]
struct Args {
    /// Handovers after a release, and after a Pod deletion.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Expiry: independent Leases side by side (as many as the Rust peers' lanes).
    #[arg(long, default_value_t = 10)]
    expiry_lanes: usize,
    /// Expiry: handovers per lane.
    #[arg(long, default_value_t = 20)]
    expiry_rounds: usize,
    /// API cost: the window at steady state, seconds (0 skips the API cost).
    #[arg(long, default_value_t = 30.0)]
    steady: f64,
    /// API cost: seconds before the window.
    #[arg(long, default_value_t = 6.0)]
    warmup: f64,
    /// API cost: the idle window before, seconds (default: --steady).
    #[arg(long)]
    baseline: Option<f64>,
    /// Where palisade-handover.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Args {
    let a = <Args as clap::Parser>::parse();
    assert!(
        a.rounds <= 10_000 && a.expiry_lanes * a.expiry_rounds <= 10_000 && a.expiry_lanes >= 1,
        "rounds out of range"
    );
    assert!(
        (0.0..=600.0).contains(&a.steady) && (0.0..=600.0).contains(&a.warmup),
        "--steady and --warmup: 0 to 600 seconds"
    );
    a
}

#[tokio::main]
async fn main() {
    let args = args();
    let (kubeconfig, config, client) = cluster::connect().await;
    let ns = format!("bench-{}", std::process::id());
    cluster::create_namespace(&client, &ns).await;
    let (mut controller, admin_port) = cluster::start_controller(&kubeconfig, &ns).await;
    let census = Arc::new(Census::new(
        kubeconfig.parent().expect("the cluster's directory"),
        &[
            ("controller", controller.id().unwrap_or(0)),
            ("bench", std::process::id()),
        ],
    ));

    // As the README has users build it: PINGed HTTP/2 connections of its own.
    let leases = LeaseClient::from_config(config.clone(), Some(&ns)).expect("a LeaseClient");
    let started = Instant::now();
    eprintln!("palisade: {} voluntary releases", args.rounds);
    let release = voluntary_release(&leases, args.rounds).await;
    eprintln!("palisade: {} Pod deletions", args.rounds);
    let pod = pod_deletion(&client, &leases, &ns, args.rounds, &census).await;
    eprintln!(
        "palisade: {} expiries ({} Leases side by side, {} rounds each)",
        args.expiry_lanes * args.expiry_rounds,
        args.expiry_lanes,
        args.expiry_rounds
    );
    let expiry = expiry_lanes(
        &client,
        &leases,
        &ns,
        (args.expiry_lanes, args.expiry_rounds),
        &census,
    )
    .await;

    // The controller's own share: from the event that ended a grant to the handover write.
    let metrics = http_get(admin_port, "/metrics").await;
    let metric = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    let controller_share = metric("palisade_handover_latency_seconds_sum")
        / metric("palisade_handover_latency_seconds_count")
        * 1e3;

    let cost = if args.steady > 0.0 {
        leases.flush(Duration::from_secs(10)).await;
        let baseline = args.baseline.unwrap_or(args.steady);
        eprintln!(
            "palisade: API cost, idle {baseline} s, then 1 holder + 3 waiters for {} s after {} s",
            args.steady, args.warmup
        );
        Some(api_cost(&client, config, &ns, baseline, args.warmup, args.steady).await)
    } else {
        None
    };
    let _ = controller.start_kill();
    let _ = controller.wait().await;
    cluster::delete_namespace(&client, &ns).await;

    let pod_note = format!(
        "holder's Pod deleted (grace period 0) -> the waiter's acquire returns; one Lease, one handover at a time{}",
        Split::note(
            &pod,
            "the controller decided the handover after the delete was sent"
        )
    );
    let expiry_note = format!(
        "2 s lease duration; the holder renews once when it sees its grant (naming its token, \
         as the library's acquire does) and falls silent; time from that renewal's response + 2 s \
         to the next holder's acquire returning, signed (negative: the handover landed before \
         the duration as the bench measured it); {} Leases side by side, {} handovers each, \
         their starts staggered over the duration{}",
        args.expiry_lanes,
        args.expiry_rounds,
        Split::note(
            &expiry,
            "the controller decided the handover past the renewal + 2 s"
        )
    );
    let latency = vec![
        Latency::of(
            "palisade",
            "default",
            "release",
            release,
            "Grant::release called -> the waiter's acquire returns; one Lease, one handover at a time",
        ),
        Latency::of(
            "palisade",
            "default",
            "pod-deletion",
            Split::totals(&pod),
            &pod_note,
        ),
        Latency::of(
            "palisade",
            "default",
            "expiry-past-duration",
            Split::totals(&expiry),
            &expiry_note,
        ),
    ];
    let mut figures = vec![Figure {
        system: "palisade".into(),
        config: "default".into(),
        name: "controller_handover_share_mean".into(),
        value: controller_share,
        unit: "ms".into(),
        note: "controller's metric palisade_handover_latency_seconds: event that ended a grant \
               received -> handover write done, mean over all handovers above"
            .into(),
    }];
    if let Some(c) = &cost {
        figures.push(Figure {
            system: "palisade".into(),
            config: "default".into(),
            name: "lease_requests_per_s_1_holder_3_waiters".into(),
            value: c.rate - c.baseline_rate,
            unit: "req/s".into(),
            note: format!(
                "apiserver_request_total{{group=palisade.dev, resource=leases|leaseclaims}}, all verbs \
                 (holder, waiters and controller), over {:.0} s at steady state, {STEADY_LEASE_SECS} s \
                 lease duration, less the idle rate ({:.3} req/s); watches count when they end",
                c.window, c.baseline_rate
            ) + if c.rate < c.baseline_rate {
                "; INVALID: below the idle rate (other traffic fell into the idle window)"
            } else {
                ""
            } + if c.baseline_rate > NOT_IDLE {
                "; CAUTION: the cluster was not idle (palisade.dev requests from elsewhere), \
                 so this figure is noise: see the client-side one"
            } else {
                ""
            },
        });
        figures.push(Figure {
            system: "palisade".into(),
            config: "default".into(),
            name: "lease_requests_per_s_1_holder_3_waiters_client_side".into(),
            value: c.client_side_rate,
            unit: "req/s".into(),
            note: "requests to leases and leaseclaims sent by the holder and the 3 waiters, counted in \
                   their client (the controller's are not in it)"
                .into(),
        });
        figures.push(Figure {
            system: "palisade".into(),
            config: "default".into(),
            name: "idle_requests_per_s".into(),
            value: c.baseline_rate,
            unit: "req/s".into(),
            note: format!(
                "the same counter with the controller running and no claim, over {:.0} s",
                c.baseline_window
            ),
        });
    }
    let version = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let source = Source {
        source: "palisade-handover".into(),
        versions: schema::palisade_versions(Some(version)),
        latency,
        figures,
        parameters: schema::parameters(
            vec![
                ("rounds", json!(args.rounds)),
                ("expiry_lanes", json!(args.expiry_lanes)),
                ("expiry_rounds_per_lane", json!(args.expiry_rounds)),
                ("steady_seconds", json!(args.steady)),
                ("warmup_seconds", json!(args.warmup)),
            ],
            started,
        ),
    };
    let path = source.write_to(&args.out);
    let md = source.summary("palisade handover", |l| &l.scenario);
    println!("\n{md}\n\nwrote {}", path.display());
}

fn options(identity: &str, pod: PodBinding) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod,
        timeout: Some(Duration::from_secs(30)),
    }
}

async fn voluntary_release(leases: &LeaseClient, rounds: usize) -> Vec<f64> {
    leases.ensure_lease("release", 15).await.unwrap();
    let mut holder = leases
        .acquire("release", options("h0", PodBinding::None))
        .await
        .unwrap();
    let mut samples = Vec::new();
    for i in 1..=rounds {
        let l = leases.clone();
        let waiter = tokio::spawn(async move {
            l.acquire("release", options(&format!("h{i}"), PodBinding::None))
                .await
        });
        wait_waiting(leases, "release", 1).await;
        let let_go = Instant::now();
        holder.release().await.unwrap();
        holder = waiter.await.unwrap().unwrap();
        samples.push(let_go.elapsed().as_secs_f64() * 1e3);
    }
    holder.release().await.unwrap();
    samples
}

async fn pod_deletion(
    client: &Client,
    leases: &LeaseClient,
    ns: &str,
    rounds: usize,
    census: &Census,
) -> Vec<Split> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let new_pod = |i: usize| {
        let pods = pods.clone();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("p{i}")},
                "spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "registry.invalid/none:0"}]}
            }))
            .unwrap();
            let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
            PodBinding::Pod {
                name: pod.name_any(),
                uid: pod.uid().unwrap(),
            }
        }
    };
    leases.ensure_lease("podgone", 600).await.unwrap();
    let mut holder = leases
        .acquire("podgone", options("p0", new_pod(0).await))
        .await
        .unwrap();
    let mut samples = Vec::new();
    for i in 1..=rounds {
        let binding = new_pod(i).await;
        let l = leases.clone();
        let waiter = tokio::spawn(async move {
            l.acquire("podgone", options(&format!("p{i}"), binding))
                .await
        });
        wait_waiting(leases, "podgone", 1).await;
        let cpu_before = census.snap();
        let (let_go, let_go_wall) = (Instant::now(), Timestamp::now());
        pods.delete(
            &format!("p{}", i - 1),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
        let next = waiter.await.unwrap().unwrap();
        let total = let_go.elapsed().as_secs_f64() * 1e3;
        let cpu = census.top(&cpu_before, &census.snap());
        let decided = ms_between(let_go_wall, decided_at(leases, "podgone").await);
        samples.push(Split {
            total,
            decided,
            cpu,
        });
        drop(holder); // its claim is already revoked; drop deletes it
        holder = next;
    }
    drop(holder);
    samples
}

/// The expiry scenario's lease duration.
const EXPIRY_DURATION: Duration = Duration::from_secs(2);

/// `lanes` independent Leases side by side, `rounds` expiries each.
async fn expiry_lanes(
    client: &Client,
    leases: &LeaseClient,
    ns: &str,
    (lanes, rounds): (usize, usize),
    census: &Arc<Census>,
) -> Vec<Split> {
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let (client, leases, ns) = (client.clone(), leases.clone(), ns.to_string());
            let census = census.clone();
            // Staggered over the duration, as every bench's expiry lanes are: lanes
            // in step would come due in one burst, a small storm, not one expiry each.
            let stagger = EXPIRY_DURATION * lane as u32 / lanes as u32;
            tokio::spawn(async move {
                tokio::time::sleep(stagger).await;
                expiry(&client, &leases, &ns, (lane, rounds), &census).await
            })
        })
        .collect();
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.expect("an expiry lane failed"));
    }
    samples
}

/// The holder is a bare claim that renews once, the moment its grant is observed, as
/// the client library's `acquire` does, naming the grant's token; then it falls
/// silent. It expires 2 s after the controller observed that renewal: report the
/// time past the renewal's response + 2 s, signed. The controller observes the
/// renewal a little after it landed, so a handover can come before that point: such
/// a sample is negative and reported as it is.
async fn expiry(
    client: &Client,
    leases: &LeaseClient,
    ns: &str,
    (lane, rounds): (usize, usize),
    census: &Census,
) -> Vec<Split> {
    let claims: Api<LeaseClaim> = Api::namespaced(client.clone(), ns);
    let lease = format!("expiry-{lane}");
    leases
        .ensure_lease(&lease, EXPIRY_DURATION.as_secs() as i64)
        .await
        .unwrap();
    let mut samples = Vec::new();
    for i in 0..rounds {
        let silent: LeaseClaim = serde_json::from_value(json!({
            "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
            "metadata": {"name": format!("silent-{lane}-{i}")},
            "spec": {"leaseName": lease, "holderIdentity": format!("silent-{lane}-{i}")}
        }))
        .unwrap();
        let silent = claims
            .create(&PostParams::default(), &silent)
            .await
            .unwrap();
        let mut stream = watcher::watch_object(leases.leases().clone(), &lease).boxed();
        let token = tokio::time::timeout(WAIT_LIMIT, async {
            loop {
                let status = stream.next().await.unwrap().unwrap().unwrap().status;
                let status = status.unwrap_or_default();
                if status.holder.map(|h| h.claim_uid) == silent.metadata.uid {
                    break status.fencing_token.unwrap_or_default();
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{lease}: the silent claim not granted within {WAIT_LIMIT:?}"));
        drop(stream);
        let renewal = json!({
            "metadata": {"annotations": {RENEWED_TOKEN_ANNOTATION: token.to_string()}},
            "spec": {"renewTime": MicroTime(Timestamp::now())},
        });
        claims
            .patch(
                &silent.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&renewal),
            )
            .await
            .unwrap();
        let (renewed, renewed_wall) = (Instant::now(), Timestamp::now());
        let cpu_before = census.snap();
        let next = leases
            .acquire(
                &lease,
                options(&format!("next-{lane}-{i}"), PodBinding::None),
            )
            .await
            .unwrap();
        // Signed milliseconds: never clamped to 0.
        let total = (renewed.elapsed().as_secs_f64() - EXPIRY_DURATION.as_secs_f64()) * 1e3;
        let cpu = census.top(&cpu_before, &census.snap());
        let decided = ms_between(renewed_wall, decided_at(leases, &lease).await)
            - EXPIRY_DURATION.as_secs_f64() * 1e3;
        samples.push(Split {
            total,
            decided,
            cpu,
        });
        next.release().await.unwrap();
        let _ = claims
            .delete(&silent.name_any(), &DeleteParams::default())
            .await;
    }
    samples
}

/// One handover sample, split where the controller decided it.
#[derive(Clone)]
struct Split {
    /// The sample, ms.
    total: f64,
    /// From the same start to the Lease's `status.acquireTime`: the controller's wall
    /// clock when it computed the grant (the same machine's as the bench's), ms.
    decided: f64,
    /// CPU over the sample: the machine's, and the two processes that used most.
    cpu: String,
}

impl Split {
    fn totals(samples: &[Split]) -> Vec<f64> {
        samples.iter().map(|s| s.total).collect()
    }

    /// Which part of the samples the controller's decision took, and which the rest
    /// (its Lease write, the watch to the waiter, the waiter's first renewal), for the
    /// figure's note: p50 and p99 of each, and the slowest 1% split.
    fn note(samples: &[Split], decided: &str) -> String {
        if samples.is_empty() {
            return String::new();
        }
        let sorted = |f: fn(&Split) -> f64| {
            let mut v: Vec<f64> = samples.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let (d, r) = (sorted(|s| s.decided), sorted(|s| s.total - s.decided));
        let mut slowest = samples.to_vec();
        slowest.sort_by(|a, b| b.total.total_cmp(&a.total));
        slowest.truncate((samples.len() / 100).max(1));
        let slowest: Vec<String> = slowest
            .iter()
            .map(|s| {
                let (total, decided) = (s.total, s.decided);
                format!(
                    "{total:.0} = {decided:.0} + {:.0} ({})",
                    total - decided,
                    s.cpu
                )
            })
            .collect();
        format!(
            "; split at the Lease's status.acquireTime (the controller's wall clock when it \
             decided, same machine): {decided} p50 {:.1} / p99 {:.1} ms, then its Lease write, \
             the watch to the waiter and the waiter's first renewal p50 {:.1} / p99 {:.1} ms; \
             the slowest 1% (ms, total = decided + rest; CPU ms over it, the machine's \
             and the two processes' that used most): {}",
            schema::nearest_rank(&d, 0.5),
            schema::nearest_rank(&d, 0.99),
            schema::nearest_rank(&r, 0.5),
            schema::nearest_rank(&r, 0.99),
            slowest.join(", ")
        )
    }
}

/// The Lease's `status.acquireTime`: when the controller decided its current grant.
async fn decided_at(leases: &LeaseClient, lease: &str) -> Timestamp {
    let l = leases.leases().get(lease).await.unwrap();
    l.status
        .and_then(|s| s.acquire_time)
        .map(|t| t.0)
        .unwrap_or_else(|| panic!("{lease}: granted, yet no status.acquireTime"))
}

/// Signed milliseconds from `from` to `to`.
fn ms_between(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_microsecond() - from.as_microsecond()) as f64 / 1e3
}

struct Cost {
    /// Requests/s counted with the holder and the waiters in place.
    rate: f64,
    window: f64,
    /// Requests/s counted before, with the controller running and no claim.
    baseline_rate: f64,
    baseline_window: f64,
    /// Requests/s the holder and the waiters sent, counted in their client.
    client_side_rate: f64,
}

/// The API server's count of requests to palisade's resources, all verbs and codes.
async fn palisade_requests(client: &Client) -> f64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(req)
        .await
        .expect("GET /metrics of the API server");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(r#"group="palisade.dev""#)
                && (l.contains(r#"resource="leases""#) || l.contains(r#"resource="leaseclaims""#))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The rate of [`palisade_requests`] over `window` seconds.
async fn request_rate(client: &Client, window: f64) -> (f64, f64) {
    let before = palisade_requests(client).await;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(window)).await;
    let after = palisade_requests(client).await;
    let elapsed = t0.elapsed().as_secs_f64();
    ((after - before) / elapsed, elapsed)
}

/// One Lease (15 s duration), one holder, three waiters: requests/s at steady state.
async fn api_cost(
    client: &Client,
    config: Config,
    ns: &str,
    baseline: f64,
    warmup: f64,
    window: f64,
) -> Cost {
    // The holder and the waiters send through a client of their own that counts.
    let sent = requests::Recorded::default();
    let (builder, protocol) = palisade::kube_client::builder(config).unwrap();
    let counted = builder.with_layer(&sent).build();
    let leases = &LeaseClient::on_pinged_connections(counted, protocol, ns);
    let (baseline_rate, baseline_window) = request_rate(client, baseline).await;
    leases
        .ensure_lease("steady", STEADY_LEASE_SECS)
        .await
        .unwrap();
    let holder = leases
        .acquire("steady", options("steady-holder", PodBinding::None))
        .await
        .unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let l = leases.clone();
            tokio::spawn(async move {
                let mut o = options(&format!("steady-waiter-{i}"), PodBinding::None);
                o.timeout = None;
                l.acquire("steady", o).await
            })
        })
        .collect();
    wait_waiting(leases, "steady", 3).await;
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    let sent_before = palisade_requests_sent(&sent);
    let (rate, window) = request_rate(client, window).await;
    let client_side_rate = (palisade_requests_sent(&sent) - sent_before) as f64 / window;
    assert!(
        holder.lost_reason().is_none(),
        "the steady holder lost its grant"
    );
    // Waiters first (a cancelled acquire deletes its claim), so that nothing is handed over.
    for w in waiters {
        w.abort();
        assert!(
            w.await.is_err_and(|e| e.is_cancelled()),
            "a waiter was granted"
        );
    }
    holder.release().await.unwrap();
    leases.flush(Duration::from_secs(10)).await;
    Cost {
        rate,
        window,
        baseline_rate,
        baseline_window,
        client_side_rate,
    }
}

/// GET a path of the controller's admin server (plain HTTP/1.0).
async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// How many of the recorded requests went to palisade's resources.
fn palisade_requests_sent(sent: &requests::Recorded) -> usize {
    sent.taken()
        .iter()
        .filter(|r| {
            let path = r.split(' ').nth(1).unwrap_or_default();
            path.starts_with("/apis/palisade.dev/")
                && (path.contains("/leases") || path.contains("/leaseclaims"))
        })
        .count()
}
