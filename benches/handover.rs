//! Handover latency and API cost of palisade on the local control plane (`make bench`).
//!
//! Latency: from the moment the holder lets go (its release request is sent, its
//! Pod object is deleted, or its lease duration runs out) to the moment the next
//! holder's process observes its grant (its `acquire` returns). Release and Pod
//! deletion run one handover at a time on one Lease; expiry (2 s lease duration, a
//! holder that renews once when it sees its grant and then falls silent, reported as
//! the time past its renewal's send, taken client-side, + the duration) runs `--expiry-lanes` independent
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
//! waiters' and the controller's) at steady state for one Lease (15 s duration),
//! first with its holder alone, then with one holder and three waiters (the
//! per-waiter cost is the difference over three), each over `--steady` seconds after
//! `--warmup`, less the rate of an idle window of `--baseline` seconds before. The
//! counter counts a watch when it ends, every 5 minutes on the library's
//! connections, which a window of seconds never sees: each watch open beyond the idle
//! ones (the API server's `apiserver_longrunning_requests` gauge) adds one request per
//! its period (the `timeoutSeconds` the candidates' watches asked for), pro rata.
//!
//! A program that prints figures, not a test: `cargo bench --bench handover --
//! [--rounds N] [--expiry-lanes N] [--expiry-rounds N] [--steady S] [--warmup S]
//! [--baseline S] [--out DIR]`; writes `DIR/palisade-handover.json` in the schema
//! of `benches/common/schema.rs` (`benches/report.rs` merges it). Needs the cluster
//! of `make cluster`. `make test` runs a smoke version (a few rounds, debug build)
//! so this cannot rot.

#[path = "common/api_cost.rs"]
mod api_cost;
#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/cpu.rs"]
#[allow(dead_code)]
mod cpu;
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
use kube::{Client, ResourceExt};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::crd::{LeaseClaim, RENEWED_TOKEN_ANNOTATION};
use serde_json::json;

use cluster::{WAIT_LIMIT, wait_waiting};
use cpu::Census;
use schema::{Figure, Latency, Source};

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
            "palisade: API cost, idle {baseline} s, then the holder alone and 1 holder + 3 \
             waiters, each for {} s after {} s",
            args.steady, args.warmup
        );
        Some(api_cost::api_cost(&client, config, &ns, baseline, args.warmup, args.steady).await)
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
         as the library's acquire does) and falls silent; time from that renewal's send (taken \
         client-side just before the request goes out) + 2 s to the next holder's acquire returning, signed (negative: the handover landed before \
         the duration as the bench measured it); {} Leases side by side, {} handovers each, \
         their starts staggered over the duration{}",
        args.expiry_lanes,
        args.expiry_rounds,
        Split::note(
            &expiry,
            "the controller decided the handover past the renewal's send + 2 s"
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
        figures.extend(api_cost::cost_figures(c));
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
        slot: None,
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
/// silent. Report the time from that renewal's send (taken client-side, just before
/// the request goes out, as the peers' benches take their silent holder's) + 2 s to
/// the next holder's `acquire` returning, signed, whatever the library does in
/// between. The controller expires 2 s after it observed the renewal, a little after
/// the send; a handover before send + 2 s is a negative sample, reported as it is.
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
        // Every bench's expiry clock starts here: the silent holder's last renewal as
        // its client sends it, just before the request goes out.
        let (sent, sent_wall) = (Instant::now(), Timestamp::now());
        claims
            .patch(
                &silent.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&renewal),
            )
            .await
            .unwrap();
        let cpu_before = census.snap();
        let next = leases
            .acquire(
                &lease,
                options(&format!("next-{lane}-{i}"), PodBinding::None),
            )
            .await
            .unwrap();
        // Signed milliseconds: never clamped to 0.
        let total = (sent.elapsed().as_secs_f64() - EXPIRY_DURATION.as_secs_f64()) * 1e3;
        let cpu = census.top(&cpu_before, &census.snap());
        let decided = ms_between(sent_wall, decided_at(leases, &lease).await)
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
    /// (its Lease write, the watch to the waiter, what the waiter's `acquire` does), for the
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
             decided, same machine): {decided} p50 {:.1} / p99 {:.1} ms, then the rest (its \
             Lease write, the watch to the waiter, and what the waiter's acquire does before \
             it returns) p50 {:.1} / p99 {:.1} ms; \
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
