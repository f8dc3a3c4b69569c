//! Handover latency of palisade on the local control plane (`make bench`).
//!
//! From the moment the holder lets go (its release request is sent, its Pod
//! object is deleted, or its lease duration runs out) to the moment the next
//! holder's process observes its grant (its `acquire` returns). A program that
//! prints figures, not a test: `cargo bench --bench handover -- [--rounds N]
//! [--expiry-rounds N] [--out DIR]`. Needs the cluster of `make cluster`.
//! `make test` runs a smoke version (a few rounds, debug build) so this cannot rot.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config, CustomResourceExt, ResourceExt};
use palisade::api::{Lease, LeaseClaim};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use serde_json::json;

struct Args {
    rounds: usize,
    expiry_rounds: usize,
    out: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 200,
        expiry_rounds: 30,
        out: PathBuf::from("target/bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--rounds" => a.rounds = value().parse().expect("--rounds N"),
            "--expiry-rounds" => a.expiry_rounds = value().parse().expect("--expiry-rounds N"),
            "--out" => a.out = PathBuf::from(value()),
            "--bench" => {} // passed by `cargo bench`
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

#[tokio::main]
async fn main() {
    let args = args();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let kubeconfig = root.join("target/cluster/kubeconfig");
    let kc = Kubeconfig::read_from(&kubeconfig)
        .expect("no target/cluster/kubeconfig: run `make cluster` (make bench does)");
    let client = Client::try_from(
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap(),
    )
    .unwrap();
    install_crds(&client).await;
    let ns = format!("bench-{}", std::process::id());
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    // The binary of the same profile: release under `cargo bench`, debug under the
    // smoke run of `make test` (`cargo test --bench handover`).
    let controller_bin = PathBuf::from(env!("CARGO_BIN_EXE_palisade"));
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut controller = tokio::process::Command::new(&controller_bin)
        .args([
            "controller",
            "--namespace",
            &ns,
            "--leader-elect=false",
            "--admin-addr",
            &format!("127.0.0.1:{admin_port}"),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting {}: {e} (make bench builds it)",
                controller_bin.display()
            )
        });
    tokio::time::sleep(Duration::from_millis(500)).await;

    let leases = LeaseClient::new(client.clone(), &ns);
    let release = voluntary_release(&leases, args.rounds).await;
    let pod = pod_deletion(&client, &leases, &ns, args.rounds).await;
    let expiry = expiry(&client, &leases, &ns, args.expiry_rounds).await;

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
    let _ = controller.start_kill();
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::background())
        .await;

    let rows = [
        ("voluntary release", release),
        ("holder's Pod deleted", pod),
        ("expiry, past the 2 s duration", expiry),
    ];
    std::fs::create_dir_all(&args.out).unwrap();
    let mut md = String::from(
        "| palisade handover | n | p50 | p95 | p99 | max |\n|---|---|---|---|---|---|\n",
    );
    let mut results = Vec::new();
    for (name, samples) in rows {
        let s = Summary::of(samples);
        md += &format!(
            "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |\n",
            s.n, s.p50, s.p95, s.p99, s.max
        );
        results.push(json!({"name": name, "unit": "ms", "n": s.n, "p50": s.p50, "p95": s.p95, "p99": s.p99, "max": s.max}));
    }
    md += &format!(
        "\nController's share (event received to handover write done), mean over all handovers: {controller_share:.1} ms\n"
    );
    let version = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let json =
        json!({"kubernetes": version, "palisade": env!("CARGO_PKG_VERSION"), "handover": results});
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    std::fs::write(args.out.join("results.md"), &md).unwrap();
    println!("\n{md}");
}

struct Summary {
    n: usize,
    p50: f64,
    p95: f64,
    p99: f64,
    max: f64,
}

impl Summary {
    fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
        Summary {
            n: ms.len(),
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: *ms.last().unwrap(),
        }
    }
}

async fn install_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [Lease::crd(), LeaseClaim::crd()] {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply("palisade-bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
        kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await
        .unwrap();
    }
}

fn options(identity: &str, pod: PodBinding) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod,
        timeout: Some(Duration::from_secs(30)),
    }
}

/// Waits until the Lease lists `n` waiting claims, so the next handover has someone to go to.
async fn wait_waiting(leases: &LeaseClient, lease: &str, n: i64) {
    let mut stream = watcher::watch_object(leases.leases().clone(), lease).boxed();
    while let Some(Ok(Some(l))) = stream.next().await {
        if l.status.as_ref().and_then(|s| s.waiting_count) == Some(n) {
            return;
        }
    }
    panic!("watch on {lease} ended");
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

async fn pod_deletion(client: &Client, leases: &LeaseClient, ns: &str, rounds: usize) -> Vec<f64> {
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
        let let_go = Instant::now();
        pods.delete(
            &format!("p{}", i - 1),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
        let next = waiter.await.unwrap().unwrap();
        samples.push(let_go.elapsed().as_secs_f64() * 1e3);
        drop(holder); // its claim is already revoked; drop deletes it
        holder = next;
    }
    drop(holder);
    samples
}

/// The holder is a bare claim that never renews; its grant is observed at `granted`,
/// so it expires no earlier than `granted + 2 s`: report the time past that.
async fn expiry(client: &Client, leases: &LeaseClient, ns: &str, rounds: usize) -> Vec<f64> {
    let claims: Api<LeaseClaim> = Api::namespaced(client.clone(), ns);
    leases.ensure_lease("expiry", 2).await.unwrap();
    let mut samples = Vec::new();
    for i in 0..rounds {
        let silent: LeaseClaim = serde_json::from_value(json!({
            "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
            "metadata": {"name": format!("silent-{i}")},
            "spec": {"leaseName": "expiry", "holderIdentity": format!("silent-{i}")}
        }))
        .unwrap();
        let silent = claims
            .create(&PostParams::default(), &silent)
            .await
            .unwrap();
        let mut stream = watcher::watch_object(leases.leases().clone(), "expiry").boxed();
        let granted = loop {
            let l = stream.next().await.unwrap().unwrap().unwrap();
            if l.status.and_then(|s| s.holder).map(|h| h.claim_uid) == silent.metadata.uid {
                break Instant::now();
            }
        };
        let next = leases
            .acquire("expiry", options(&format!("next-{i}"), PodBinding::None))
            .await
            .unwrap();
        let past = granted.elapsed().saturating_sub(Duration::from_secs(2));
        samples.push(past.as_secs_f64() * 1e3);
        next.release().await.unwrap();
        let _ = claims
            .delete(&silent.name_any(), &DeleteParams::default())
            .await;
    }
    samples
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
