//! Scale of the palisade controller on the local control plane (`cargo bench --bench scale`).
//!
//! For each size N (`--sizes 1000,10000`): N Leases, each with a holder that
//! renews and one waiter. A program that prints figures, not a test:
//! `cargo bench --bench scale -- [--sizes N,...] [--out DIR] [--timeout SECS]
//! [--lease-duration SECS] [--inflight N] [--steady SECS] [--handover SECS]`; smoke
//! run (debug build, figures mean nothing): `cargo test --bench scale -- --sizes 20`.
//! Needs the cluster of `make cluster`. Writes `DIR/scale.json` (figures named
//! `leases_<N>_...`) and prints them as a table.
//!
//! How, per size, in a namespace `scale-<pid>-<N>` of its own:
//!
//! 1. **Setup**, no controller running: N Leases (`leaseDurationSeconds` 600, see
//!    3.), then N holder claims `h-i`, then N waiter claims `w-i` (bare claims with
//!    a `holderIdentity` and no pod), `--inflight` (32) creates in flight. Holders
//!    are created first, so FIFO order makes `h-i` the first holder. The create rate
//!    is the API server's write throughput with no controller, the yardstick of 5.
//! 2. **Initial grant**: the controller under test is the binary of the same
//!    profile (`CARGO_BIN_EXE_palisade`, release under `cargo bench`) run as a child
//!    process with its defaults (`--concurrency 16`, info logs to
//!    `DIR/scale-controller-N.log`), so its CPU (utime+stime of /proc/PID/stat) and
//!    peak RSS (VmHWM of /proc/PID/status) are its own. It lists 3N objects, then
//!    makes N grants, each one Lease status write, two claim status writes (holder
//!    Granted, waiter Pending at position 1) and one Event. Timed from spawn to
//!    `palisade_grants_total` = N (polled on its /metrics). Its CPU is counted from
//!    spawn until it is idle again: the namespace holds all N Events, less those the
//!    controller dropped or failed (its metrics; it publishes them off the write path
//!    through a bounded queue, after the grants) and, renewals paused, it uses under 5%
//!    of a core over half a second. The renewals' share (4.) is subtracted.
//! 3. **Renewals**: from the controller's start to the end, the bench renews every
//!    current holder the way the client does (one merge patch of `spec.renewTime`
//!    with the claim's UID), round robin at N / (duration / 3) per second, the
//!    client's schedule: with 600 s leases N/200 per second (50/s at 10,000; at most
//!    32 in flight, a renewal that would exceed that is counted as not sent). 600 s
//!    rather than 300 s because on 2 cores the API server takes only a few hundred
//!    writes per second and N/100 would eat half of it. A window of renewals alone
//!    (`--steady`, 10 s; 3 s below 1,000 Leases) gives the controller's CPU per
//!    renewal, and checks that renewals cost no controller write (resourceVersions
//!    of the Leases and waiter claims before and after).
//! 4. **Resync after restart**: renewals paused and the controller idle, the
//!    resourceVersions of all Leases and claims are recorded, the controller is
//!    SIGKILLed and started again. Resync time is spawn to `/readyz` (all three
//!    watches listed, index built); the note adds when it is idle again (every
//!    Lease re-decided). Writes on resync are the Leases and claims whose
//!    resourceVersion changed (only the controller writes meanwhile): there should
//!    be none.
//! 5. **Handover, sustained grants**: the bench deletes holder claims in order
//!    (`--inflight` deletes in flight, as fast as the API server takes them) for at
//!    most `--handover` seconds (30), so their waiters are granted: per grant, the
//!    bench's delete, one Lease write, one claim write and two Events. Grants per
//!    second are taken between 10% and 90% of those grants (the steady part). Which
//!    side saturates: the controller if it uses about 100% of a core (it decides on
//!    one task); the API server if the API writes per second (bench and controller)
//!    come to 70% or more of the create rate it sustained alone in 1., or if
//!    kube-apiserver and etcd fill the machine. The note gives the CPU of each over
//!    the same window: controller, kube-apiserver, etcd, kube-controller-manager
//!    (pids from `target/cluster/*.pid`), the bench, and other processes (the rest of
//!    /proc/stat). The headline CPU per 1,000 grants is from this phase, counted as
//!    in 2. (first delete until idle, Events included, renewals subtracted).
//! 6. Peak RSS is the higher VmHWM of the two controller processes. Then the
//!    controller is killed and the namespace's claims, Leases and Events are
//!    deleted with the namespace (waited for, at most 3 minutes; also on failure).
//!
//! What the numbers mean: everything shares one machine (2 cores on the
//! development machine): etcd, kube-apiserver, kube-controller-manager, the bench,
//! the controller, and whatever else runs there (the notes show it as "other
//! processes"). So a grant rate is the rate of this whole system, not of the
//! controller alone; the CPU split says where the time went. The default run took
//! 8 minutes on the idle 2-core machine (1,000 Leases 71 s, 10,000 Leases 401 s) and
//! 13 to 17 minutes while other work ran there: it is API-server bound (at 10,000:
//! 30,000 creates, 40,000 writes for the initial grants, some 45,000 deletes to
//! clean up). Every wait is bounded, the whole run by `--timeout` (default 1200 s).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::stream::{self, FuturesUnordered, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt, Resource, ResourceExt};
use palisade::api::{Lease, LeaseClaim};
use palisade::client::CLIENT_MANAGER;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Args {
    sizes: Vec<usize>,
    out: PathBuf,
    timeout: Duration,
    lease_duration: i64,
    inflight: usize,
    steady: Option<Duration>,
    handover: Duration,
}

/// Scale of palisade: many Leases on one controller (`make bench`; needs `make cluster`).
#[derive(clap::Parser)]
struct Cli {
    /// Numbers of Leases, one run each.
    #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
    sizes: Vec<usize>,
    /// Where scale.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Seconds the whole run may take.
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
    /// The Leases' duration, seconds.
    #[arg(long, default_value_t = 600)]
    lease_duration: i64,
    /// Requests in flight at once while creating and granting.
    #[arg(long, default_value_t = 32)]
    inflight: usize,
    /// The steady-state window, seconds (default 10; 3 below 1,000 Leases).
    #[arg(long)]
    steady: Option<u64>,
    /// The sustained-handover window, seconds.
    #[arg(long, default_value_t = 30)]
    handover: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Args {
    let c = <Cli as clap::Parser>::parse();
    let a = Args {
        sizes: c.sizes,
        out: c.out,
        timeout: Duration::from_secs(c.timeout),
        lease_duration: c.lease_duration,
        inflight: c.inflight.clamp(1, 256),
        steady: c.steady.map(Duration::from_secs),
        handover: Duration::from_secs(c.handover),
    };
    assert!(
        a.sizes.iter().all(|n| (1..=99_999).contains(n)),
        "--sizes: 1..=99999 Leases each"
    );
    assert!(
        (3..=86_400).contains(&a.lease_duration),
        "--lease-duration: 3..=86400"
    );
    a
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = args();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let run_started = Instant::now();
    let deadline = run_started + args.timeout;
    let client = match admin_client(&root).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("scale: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let kubernetes = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let mut report = Report::default();
    let mut failure = None;
    if let Err(e) = install_crds(&client).await {
        failure = Some(e);
    }
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("scale: creating {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    for &n in &args.sizes {
        if failure.is_some() {
            break;
        }
        let ns = format!("scale-{}-{n}", std::process::id());
        let size_started = Instant::now();
        println!("scale: {n} Leases in namespace {ns}");
        let run = run_size(&client, &root, &args, n, &ns, deadline, &mut report);
        let outcome = tokio::select! {
            r = tokio::time::timeout_at(deadline.into(), run) => match r {
                Ok(r) => r,
                Err(_) => Err(anyhow!("--timeout of {} s reached", args.timeout.as_secs())),
            },
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        };
        // The controller (kill_on_drop) and the renewer (aborted on drop) are gone by now.
        let cleanup = cleanup(&client, &ns).await;
        println!(
            "scale: {n} Leases done in {:.0} s (cleanup {:.0} s)",
            size_started.elapsed().as_secs_f64(),
            cleanup.as_secs_f64()
        );
        if let Err(e) = outcome {
            failure = Some(e.context(format!("{n} Leases")));
        }
    }
    let total = run_started.elapsed().as_secs_f64();
    let json = json!({
        "source": "scale",
        "versions": {"palisade": env!("CARGO_PKG_VERSION"), "kubernetes": kubernetes},
        "latency": [],
        "figures": report.figures,
    });
    let path = args.out.join("scale.json");
    if let Err(e) = std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        eprintln!("scale: writing {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("\n{}", report.table());
    println!(
        "scale: {} written; the run took {total:.0} s",
        path.display()
    );
    match failure {
        None => ExitCode::SUCCESS,
        Some(e) => {
            eprintln!("scale: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn admin_client(root: &Path) -> Result<Client> {
    let kubeconfig = root.join("target/cluster/kubeconfig");
    let kc = Kubeconfig::read_from(&kubeconfig)
        .context("no target/cluster/kubeconfig: run `make cluster` first")?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn install_crds(client: &Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [Lease::crd(), LeaseClaim::crd()] {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply("palisade-bench").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        let established = kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .context("CRD not established in 30 s")??;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// One size
// ---------------------------------------------------------------------------

fn lease_name(i: usize) -> String {
    format!("l-{i:05}")
}

/// A holder claim and its waiter, by name and UID.
struct Pair {
    holder: (String, String),
    waiter: (String, String),
}

async fn run_size(
    client: &Client,
    root: &Path,
    args: &Args,
    n: usize,
    ns: &str,
    deadline: Instant,
    report: &mut Report,
) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await
        .context("creating the namespace")?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let claims: Api<LeaseClaim> = Api::namespaced(client.clone(), ns);
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let cluster = root.join("target/cluster");
    let mut procs = Procs {
        controller: 0,
        apiserver: read_pid(&cluster.join("kube-apiserver.pid")),
        etcd: read_pid(&cluster.join("etcd.pid")),
        kcm: read_pid(&cluster.join("kube-controller-manager.pid")),
    };
    let renew_rate = n as f64 / (args.lease_duration as f64 / 3.0);

    // 1. Setup, with no controller running.
    let t = Instant::now();
    let c0 = procs.snap();
    create_all(&leases, n, args.inflight, |i| {
        json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
               "metadata": {"name": lease_name(i)},
               "spec": {"leaseDurationSeconds": args.lease_duration}})
    })
    .await
    .context("creating Leases")?;
    let holders = create_all(&claims, n, args.inflight, |i| claim_json("h", i))
        .await
        .context("creating holder claims")?;
    let waiters = create_all(&claims, n, args.inflight, |i| claim_json("w", i))
        .await
        .context("creating waiter claims")?;
    let setup = t.elapsed().as_secs_f64();
    let setup_cpu = procs.snap().since(&c0);
    let api_capacity = (3 * n) as f64 / setup;
    let pairs: Arc<Vec<Pair>> = Arc::new(
        holders
            .into_iter()
            .zip(waiters)
            .map(|(h, w)| Pair {
                holder: name_uid(&h),
                waiter: name_uid(&w),
            })
            .collect(),
    );
    report.fig(
        n,
        "setup_creates_per_s",
        api_capacity,
        "objects/s",
        format!(
            "API server write throughput with no controller: {n} Leases + {} claims created in {setup:.1} s, {} in flight. {}",
            2 * n,
            args.inflight,
            setup_cpu.split(cores)
        ),
    );

    // 2. Initial grant: the controller starts with N Leases and 2N claims.
    let log = args.out.join(format!("scale-controller-{n}.log"));
    let _ = std::fs::remove_file(&log);
    let t_spawn = Instant::now();
    let mut ctrl = Controller::spawn(root, ns, &log)?;
    procs.controller = ctrl.pid;
    let c0 = procs.snap();
    let renewer = Renewer::start(claims.clone(), pairs.clone(), renew_rate);
    let ready = ctrl.wait_ready(deadline).await?;
    let mut timeline = Vec::new();
    let granted = ctrl
        .wait_grants(&|| n as f64, t_spawn, deadline, &mut timeline)
        .await?;
    let c1 = procs.snap();
    let renewals_1 = renewer.ok();
    let (events_at, events_n, events_lost) = ctrl.wait_events(&events, n, deadline).await?;
    let renewals_2 = renewer.ok();
    let idle = quiesce(&mut ctrl, &renewer, deadline).await?;
    let c2 = procs.snap();
    let first = c2.since(&c0);
    let wrong = wrong_holders(&leases, &pairs, |_, p| &p.holder.0).await?;
    if wrong > 0 {
        bail!("after the initial grant, {wrong} Leases are not held by their h- claim");
    }

    // 3. Renewals alone, at the nominal rate.
    let steady = args.steady.unwrap_or(if n >= 1000 {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(3)
    });
    let lease_rvs = resource_versions(&leases).await?;
    let claim_rvs = resource_versions(&claims).await?;
    let before = procs.snap();
    let renewed_before = renewer.ok();
    let grants_before = ctrl.metric("palisade_grants_total").await?;
    sleep_within(steady, deadline).await?;
    let w = procs.snap().since(&before);
    let renewed = renewer.ok() - renewed_before;
    let grants_during = ctrl.metric("palisade_grants_total").await? - grants_before;
    renewer.pause(deadline).await?;
    ctrl.settle(deadline).await?;
    let lease_writes = changed(&lease_rvs, &resource_versions(&leases).await?, |_| true);
    let waiter_writes = changed(&claim_rvs, &resource_versions(&claims).await?, |name| {
        name.starts_with("w-")
    });
    renewer.resume();
    let per_renewal = w.controller / renewed.max(1) as f64;
    let renewal_figure = (
        w.pct(w.controller),
        format!(
            "{renewed} renewals in {:.0} s ({:.1}/s: {n} holders of {} s leases, each renewing every third of it): {:.0} µs controller CPU per renewal; controller writes meanwhile: {lease_writes} Leases, {waiter_writes} waiter claims, {grants_during} grants (a renewal should cost none). {}",
            w.secs,
            renewed as f64 / w.secs,
            args.lease_duration,
            per_renewal * 1e6,
            w.split(cores)
        ),
    );

    // The initial grant's figures, now that the renewals' share is known.
    let grant_s = (granted - ready).as_secs_f64();
    report.fig(
        n,
        "initial_grant",
        (granted - t_spawn).as_secs_f64(),
        "s",
        format!(
            "controller start to {n} grants: ready (3 lists, index) after {:.2} s, then {grant_s:.1} s of grants ({:.0}/s; each 1 Lease + 2 claim writes + 1 Event), {renewals_1} renewals meanwhile; {}",
            (ready - t_spawn).as_secs_f64(),
            n as f64 / grant_s.max(1e-3),
            {
                let w = c1.since(&c0);
                w.verdict(
                    cores,
                    ((4 * n) as f64 + renewals_1 as f64) / w.secs,
                    api_capacity,
                )
            }
        ),
    );
    let net = first.controller - renewals_2 as f64 * per_renewal;
    report.fig(
        n,
        "initial_grant_controller_cpu_s_per_1000_grants",
        net / n as f64 * 1000.0,
        "s",
        format!(
            "controller CPU from start (list of {} objects, index) until idle again, per 1,000 grants, less its {renewals_2} renewals at the measured {:.0} µs each ({:.3} s per 1,000 with them); its Events were all published or dropped {:.1} s after the last grant ({events_n} published, {events_lost} dropped by its bounded queue or failed), idle {:.1} s after it",
            3 * n,
            per_renewal * 1e6,
            first.controller / n as f64 * 1000.0,
            (events_at.max(granted) - granted).as_secs_f64(),
            (idle.max(granted) - granted).as_secs_f64(),
        ),
    );
    report.fig(
        n,
        "renewals_controller_cpu",
        renewal_figure.0,
        "% of a core",
        renewal_figure.1,
    );

    // 4. Resync after a restart with N Leases held.
    renewer.pause(deadline).await?;
    ctrl.settle(deadline).await?;
    let lease_rvs = resource_versions(&leases).await?;
    let claim_rvs = resource_versions(&claims).await?;
    let first_hwm = status_kib(ctrl.pid, "VmHWM").unwrap_or(0.0);
    ctrl.kill().await;
    let t_spawn = Instant::now();
    let mut ctrl = Controller::spawn(root, ns, &log)?;
    procs.controller = ctrl.pid;
    let c0 = procs.snap();
    let ready = ctrl.wait_ready(deadline).await?;
    let resync = (ready - t_spawn).as_secs_f64();
    let idle = ctrl.settle(deadline).await?;
    let resync_cpu = procs.snap().since(&c0);
    let lease_writes = changed(&lease_rvs, &resource_versions(&leases).await?, |_| true);
    let claim_writes = changed(&claim_rvs, &resource_versions(&claims).await?, |_| true);
    let resync_grants = ctrl.metric("palisade_grants_total").await?;
    renewer.resume();
    report.fig(
        n,
        "resync_after_restart",
        resync,
        "s",
        format!(
            "SIGKILL with {n} Leases held and {n} claims waiting, new process to /readyz (lists of {} objects, index); idle again (every Lease re-decided) {:.2} s after the start; controller CPU {:.2} s",
            3 * n,
            (idle.max(ready) - t_spawn).as_secs_f64(),
            resync_cpu.controller
        ),
    );
    report.fig(
        n,
        "resync_writes",
        (lease_writes + claim_writes) as f64,
        "writes",
        format!(
            "Leases and claims whose resourceVersion changed across the restart (renewals paused): {lease_writes} Leases, {claim_writes} claims; {resync_grants} grants"
        ),
    );

    // 5. Handover: delete holder claims (for at most --handover seconds); each waiter is granted.
    let base = ctrl.metric("palisade_grants_total").await?;
    let events_before = count_objects(&events).await?;
    let renewed_before = renewer.ok();
    let skipped_before = renewer.stats.skipped.load(Ordering::Relaxed);
    let c0 = procs.snap();
    let t0 = Instant::now();
    let progress = Arc::new(DeleteProgress::default());
    let deleter = tokio::spawn(delete_holders(
        claims.clone(),
        pairs.clone(),
        renewer.released.clone(),
        args.inflight,
        t0 + args.handover,
        progress.clone(),
    ));
    let target = || {
        base + if progress.done.load(Ordering::Relaxed) {
            progress.deleted.load(Ordering::Relaxed) as f64
        } else {
            n as f64
        }
    };
    let mut timeline = Vec::new();
    let granted = ctrl
        .wait_grants(&target, t0, deadline, &mut timeline)
        .await?;
    let c1 = procs.snap();
    let deleted_at = deleter.await??;
    let k = progress.deleted.load(Ordering::Relaxed);
    let renewals_1 = renewer.ok() - renewed_before;
    let skipped = renewer.stats.skipped.load(Ordering::Relaxed) - skipped_before;
    // The first controller's Events are in the namespace; this one adds two per handover.
    let (events_at, events_n, events_lost) = ctrl
        .wait_events(&events, events_before + 2 * k, deadline)
        .await?;
    let renewals_2 = renewer.ok() - renewed_before;
    let idle = quiesce(&mut ctrl, &renewer, deadline).await?;
    let c2 = procs.snap();
    let expirations = ctrl.metric("palisade_expirations_total").await?;
    let window = c1.since(&c0);
    let total_s = (granted - t0).as_secs_f64();
    let (rate, how) = match (
        crossing(&timeline, base + 0.1 * k as f64),
        crossing(&timeline, base + 0.9 * k as f64),
    ) {
        (Some(a), Some(b)) if b - a >= 0.5 => {
            (0.8 * k as f64 / (b - a), "between 10% and 90% of them")
        }
        _ => (k as f64 / total_s.max(1e-3), "over the whole phase"),
    };
    // API writes in the window: the bench's deletes and renewals, the controller's
    // Lease write, claim write and two Events per grant.
    let writes = k as f64 + renewals_1 as f64 + 4.0 * k as f64;
    report.fig(
        n,
        "sustained_grants_per_s",
        rate,
        "grants/s",
        format!(
            "{} Handover of {k} of {n} Leases: the bench deleted holder claims for at most {} s ({} in flight; done after {:.1} s), so their waiters were granted, all {k} after {total_s:.1} s; grants/s {how}; per grant 1 delete + 1 Lease + 1 claim write + 2 Events; {renewals_1} renewals meanwhile ({:.0}/s of the nominal {renew_rate:.0}/s; {skipped} not sent: 32 in flight){}",
            window.verdict(cores, writes / window.secs, api_capacity),
            args.handover.as_secs(),
            args.inflight,
            (deleted_at - t0).as_secs_f64(),
            renewals_1 as f64 / window.secs,
            if expirations > 0.0 {
                format!("; {expirations} grants EXPIRED (renewals fell behind)")
            } else {
                String::new()
            }
        ),
    );
    let cpu = c2.since(&c0).controller;
    let net = cpu - renewals_2 as f64 * per_renewal;
    let initial = report
        .value(n, "initial_grant_controller_cpu_s_per_1000_grants")
        .unwrap_or(f64::NAN);
    report.fig(
        n,
        "controller_cpu_s_per_1000_grants",
        net / k.max(1) as f64 * 1000.0,
        "s",
        format!(
            "handovers: controller CPU from the first delete until idle again, per 1,000 grants, less its {renewals_2} renewals at {:.0} µs each ({:.3} s per 1,000 with them); its Events (the namespace holds {events_n}; {events_lost} dropped by its bounded queue or failed) were all published or dropped {:.1} s after the last grant, idle {:.1} s after it; initial grants: {initial:.3} s per 1,000",
            per_renewal * 1e6,
            cpu / k.max(1) as f64 * 1000.0,
            (events_at.max(granted) - granted).as_secs_f64(),
            (idle.max(granted) - granted).as_secs_f64(),
        ),
    );
    let wrong = wrong_holders(&leases, &pairs, |i, p| {
        if i < k { &p.waiter.0 } else { &p.holder.0 }
    })
    .await?;
    let second_hwm = status_kib(ctrl.pid, "VmHWM").unwrap_or(0.0);
    let rss_now = status_kib(ctrl.pid, "VmRSS").unwrap_or(0.0);
    report.fig(
        n,
        "peak_rss",
        first_hwm.max(second_hwm) / 1024.0,
        "MiB",
        format!(
            "VmHWM of the controller: {:.1} MiB through the initial grant and renewals, {:.1} MiB through resync and handover (RSS at the end {:.1} MiB)",
            first_hwm / 1024.0,
            second_hwm / 1024.0,
            rss_now / 1024.0
        ),
    );
    drop(renewer);
    ctrl.kill().await;
    if wrong > 0 {
        bail!("after the handover, {wrong} Leases are not held by the expected claim");
    }
    Ok(())
}

/// Objects whose resourceVersion changed (or that are gone), among those `which` names.
fn changed(
    before: &HashMap<String, String>,
    after: &HashMap<String, String>,
    which: impl Fn(&str) -> bool,
) -> usize {
    before
        .iter()
        .filter(|(name, rv)| which(name) && after.get(*name) != Some(rv))
        .count()
}

/// Waits for the controller to go idle with the renewals paused (they cost it CPU of
/// their own), then resumes them. Returns when it went idle.
async fn quiesce(ctrl: &mut Controller, renewer: &Renewer, deadline: Instant) -> Result<Instant> {
    renewer.pause(deadline).await?;
    let idle = ctrl.settle(deadline).await;
    renewer.resume();
    idle
}

fn claim_json(prefix: &str, i: usize) -> Value {
    json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
           "metadata": {"name": format!("{prefix}-{i:05}")},
           "spec": {"leaseName": lease_name(i), "holderIdentity": format!("{prefix}-{i:05}")}})
}

fn name_uid<K: Resource>(o: &K) -> (String, String) {
    (o.name_any(), o.meta().uid.clone().unwrap_or_default())
}

/// Creates objects 0..n with `inflight` requests in flight; returns them in index order.
async fn create_all<K>(
    api: &Api<K>,
    n: usize,
    inflight: usize,
    object: impl Fn(usize) -> Value,
) -> Result<Vec<K>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let obj = object(i);
            async move {
                let obj: K = serde_json::from_value(obj)?;
                let pp = PostParams::default();
                with_retry(|| api.create(&pp, &obj)).await
            }
        })
        .buffered(inflight)
        .try_collect()
        .await
}

#[derive(Default)]
struct DeleteProgress {
    deleted: AtomicUsize,
    done: AtomicBool,
}

/// Deletes holder claims in index order (after telling the renewer to renew the waiter
/// instead) until all are gone or `stop_at`; returns when the last delete was answered.
async fn delete_holders(
    claims: Api<LeaseClaim>,
    pairs: Arc<Vec<Pair>>,
    released: Arc<Vec<AtomicBool>>,
    inflight: usize,
    stop_at: Instant,
    progress: Arc<DeleteProgress>,
) -> Result<Instant> {
    let result = stream::iter(0..pairs.len())
        .take_while(|_| futures::future::ready(Instant::now() < stop_at))
        .map(|i| {
            let (claims, pairs, released) = (claims.clone(), pairs.clone(), released.clone());
            let progress = progress.clone();
            async move {
                released[i].store(true, Ordering::Relaxed);
                let (name, dp) = (&pairs[i].holder.0, DeleteParams::default());
                let r = match with_retry(|| claims.delete(name, &dp)).await {
                    Err(e) if is_status(&e, 404) => Ok(()),
                    r => r.map(|_| ()),
                };
                progress.deleted.fetch_add(1, Ordering::Relaxed);
                r
            }
        })
        .buffered(inflight)
        .try_collect::<Vec<()>>()
        .await;
    progress.done.store(true, Ordering::Relaxed);
    result?;
    Ok(Instant::now())
}

/// Leases not held by the claim `expected` names (one list, outside any measured window).
async fn wrong_holders(
    leases: &Api<Lease>,
    pairs: &[Pair],
    expected: impl Fn(usize, &Pair) -> &String,
) -> Result<usize> {
    let mut holders = HashMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = leases.list(&lp).await?;
        for l in page.items {
            let holder = l.status.and_then(|s| s.holder).map(|h| h.claim);
            holders.insert(l.metadata.name.unwrap_or_default(), holder);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(2000).continue_token(&c),
            None => break,
        }
    }
    Ok(pairs
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            holders.get(&lease_name(*i)).cloned().flatten().as_ref() != Some(expected(*i, p))
        })
        .count())
}

/// How many objects `api` lists (one list of one item: the rest is `remainingItemCount`).
async fn count_objects<K>(api: &Api<K>) -> Result<usize>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let page = api.list_metadata(&ListParams::default().limit(1)).await?;
    Ok(page.items.len() + page.metadata.remaining_item_count.unwrap_or(0).max(0) as usize)
}

/// name -> resourceVersion of every object (metadata-only lists).
async fn resource_versions<K>(api: &Api<K>) -> Result<HashMap<String, String>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = HashMap::new();
    let mut lp = ListParams::default().limit(5000);
    loop {
        let page = api.list_metadata(&lp).await?;
        for o in page.items {
            out.insert(
                o.metadata.name.unwrap_or_default(),
                o.metadata.resource_version.unwrap_or_default(),
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(5000).continue_token(&c),
            None => break,
        }
    }
    Ok(out)
}

/// Deletes the namespace's claims, Leases and Events (one request per object, 32 in
/// flight: a deletecollection deletes one object at a time), then the namespace, and
/// waits (at most 3 minutes in all) until none of those objects is left, so the API
/// server is not still busy deleting them when the next measurement starts. (The
/// namespace object itself goes a little later, when kube-controller-manager gets to
/// it.) Best effort: errors are printed.
async fn cleanup(client: &Client, ns: &str) -> Duration {
    let t = Instant::now();
    let until = t + Duration::from_secs(180);
    let claims: Api<LeaseClaim> = Api::namespaced(client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let deletes = async {
        tokio::join!(
            delete_each("claims", &claims),
            delete_each("Leases", &leases),
            delete_each("Events", &events),
        )
    };
    if tokio::time::timeout_at(until.into(), deletes)
        .await
        .is_err()
    {
        eprintln!("scale: cleanup: deleting the objects of {ns} took over 3 minutes");
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(ns, &DeleteParams::background()).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => eprintln!("scale: cleanup: deleting namespace {ns}: {e}"),
    }
    let mut left = 0;
    while Instant::now() < until {
        left = 0;
        for count in [
            count_objects(&claims).await,
            count_objects(&leases).await,
            count_objects(&events).await,
        ] {
            left += count.unwrap_or(1);
        }
        if left == 0 {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("scale: cleanup: {left} objects still in {ns} after 3 minutes (being deleted)");
    t.elapsed()
}

/// Deletes every object `api` lists, 32 requests in flight.
async fn delete_each<K>(what: &str, api: &Api<K>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let names = match resource_versions(api).await {
        Ok(names) => names.into_keys().collect::<Vec<_>>(),
        Err(e) => {
            eprintln!("scale: cleanup: listing {what}: {e:#}");
            return;
        }
    };
    let failed = stream::iter(names)
        .map(|name| async move {
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) | Err(kube::Error::Api(_)) => 0,
                Err(_) => 1,
            }
        })
        .buffer_unordered(32)
        .fold(0, |sum, f| async move { sum + f })
        .await;
    if failed > 0 {
        eprintln!(
            "scale: cleanup: {failed} {what} could not be deleted (the namespace's deletion will)"
        );
    }
}

fn is_status(e: &anyhow::Error, code: u16) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == code)
}

/// Retries what an overloaded API server may answer (429, 5xx, transport errors), 6 attempts.
async fn with_retry<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let transient = match &e {
                    kube::Error::Api(s) => s.code == 429 || s.code >= 500,
                    _ => true,
                };
                attempt += 1;
                if !transient || attempt >= 6 {
                    return Err(e.into());
                }
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
    }
}

async fn sleep_within(d: Duration, deadline: Instant) -> Result<()> {
    if Instant::now() + d > deadline {
        bail!("--timeout reached");
    }
    tokio::time::sleep(d).await;
    Ok(())
}

/// When the counter in `timeline` (seconds, value) first reached `level`, interpolated.
fn crossing(timeline: &[(f64, f64)], level: f64) -> Option<f64> {
    let i = timeline.iter().position(|(_, v)| *v >= level)?;
    if i == 0 {
        return Some(timeline[0].0);
    }
    let ((t0, v0), (t1, v1)) = (timeline[i - 1], timeline[i]);
    Some(t0 + (t1 - t0) * (level - v0) / (v1 - v0).max(1e-9))
}

// ---------------------------------------------------------------------------
// The controller under test
// ---------------------------------------------------------------------------

struct Controller {
    child: tokio::process::Child,
    pid: u32,
    port: u16,
}

impl Controller {
    fn spawn(root: &Path, ns: &str, log: &Path) -> Result<Self> {
        // The binary of the same profile: release under `cargo bench`, debug under `cargo test`.
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_palisade"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = tokio::process::Command::new(&bin)
            .args([
                "controller",
                "--namespace",
                ns,
                "--leader-elect=false",
                "--admin-addr",
                &format!("127.0.0.1:{port}"),
            ])
            .env("KUBECONFIG", root.join("target/cluster/kubeconfig"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("controller exited at once")?;
        Ok(Self { child, pid, port })
    }

    async fn kill(&mut self) {
        let _ = self.child.start_kill(); // SIGKILL
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("the controller exited: {status} (see its log)"),
            None => Ok(()),
        }
    }

    /// GET a path of the admin server: (status code, body).
    async fn get(&self, path: &str) -> Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fetch = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        };
        let out = tokio::time::timeout(Duration::from_secs(5), fetch)
            .await
            .context("admin server did not answer in 5 s")??;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((code, body.to_string()))
    }

    async fn metric(&self, name: &str) -> Result<f64> {
        let (_, body) = self.get("/metrics").await?;
        Ok(body
            .lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            .filter_map(|rest| rest.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum())
    }

    /// Polls /readyz every 10 ms.
    async fn wait_ready(&mut self, deadline: Instant) -> Result<Instant> {
        while Instant::now() < deadline {
            self.check_alive()?;
            if let Ok((200, _)) = self.get("/readyz").await {
                return Ok(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!("the controller was not ready before --timeout")
    }

    /// Polls `palisade_grants_total` until it reaches `target()`, recording (s since `t0`, grants).
    async fn wait_grants(
        &mut self,
        target: &dyn Fn() -> f64,
        t0: Instant,
        deadline: Instant,
        timeline: &mut Vec<(f64, f64)>,
    ) -> Result<Instant> {
        while Instant::now() < deadline {
            self.check_alive()?;
            if let Ok(g) = self.metric("palisade_grants_total").await {
                let now = Instant::now();
                timeline.push(((now - t0).as_secs_f64(), g));
                if g >= target() {
                    return Ok(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let last = timeline.last().map_or(0.0, |(_, g)| *g);
        bail!("{last} of {} grants before --timeout", target())
    }

    /// Waits until the controller uses under 5% of a core over half a second; returns
    /// the start of that quiet half second. After a minute it says so and goes on.
    async fn settle(&mut self, deadline: Instant) -> Result<Instant> {
        let until = Instant::now() + Duration::from_secs(60);
        let mut last = (Instant::now(), proc_cpu(self.pid).unwrap_or(0.0));
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.check_alive()?;
            let now = (Instant::now(), proc_cpu(self.pid).unwrap_or(0.0));
            let secs = (now.0 - last.0).as_secs_f64();
            if secs >= 0.5 {
                if (now.1 - last.1) / secs < 0.05 {
                    return Ok(last.0);
                }
                last = now;
            }
        }
        if Instant::now() >= deadline {
            bail!("--timeout reached");
        }
        eprintln!("scale: the controller was not idle after a minute; going on");
        Ok(Instant::now())
    }

    /// Waits until the namespace holds `expected` Events, less those this controller
    /// dropped (its queue is bounded) or failed to create: it publishes them off the
    /// write path, so they trail the grants. Stops waiting when nothing has changed for
    /// 30 s. Returns when the last change was seen, the namespace's count, and the
    /// Events this controller lost.
    async fn wait_events(
        &mut self,
        events: &Api<CoreEvent>,
        expected: usize,
        deadline: Instant,
    ) -> Result<(Instant, usize, usize)> {
        let mut seen = (Instant::now(), 0, 0);
        while Instant::now() < deadline {
            self.check_alive()?;
            let count = count_objects(events).await?;
            let lost = (self.metric("palisade_events_dropped_total").await?
                + self.metric("palisade_events_failed_total").await?)
                as usize;
            if (count, lost) != (seen.1, seen.2) {
                seen = (Instant::now(), count, lost);
            }
            if count + lost >= expected {
                return Ok(seen);
            }
            if seen.0.elapsed() > Duration::from_secs(30) {
                eprintln!(
                    "scale: {} of {expected} Events, none for 30 s; going on",
                    seen.1
                );
                return Ok(seen);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("{} of {expected} Events before --timeout", seen.1)
    }
}

// ---------------------------------------------------------------------------
// The holders' renewals
// ---------------------------------------------------------------------------

#[derive(Default)]
struct RenewStats {
    ok: AtomicU64,
    failed: AtomicU64,
    gone: AtomicU64,
    skipped: AtomicU64,
    in_flight: AtomicUsize,
}

/// Renews the current holder of each Lease, round robin, at `per_sec` patches per second.
struct Renewer {
    stats: Arc<RenewStats>,
    /// Lease i's holder claim was deleted: renew its waiter (now the holder) instead.
    released: Arc<Vec<AtomicBool>>,
    paused: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

const RENEW_IN_FLIGHT: usize = 32;

impl Renewer {
    fn start(claims: Api<LeaseClaim>, pairs: Arc<Vec<Pair>>, per_sec: f64) -> Self {
        let stats = Arc::new(RenewStats::default());
        let released: Arc<Vec<AtomicBool>> =
            Arc::new((0..pairs.len()).map(|_| AtomicBool::new(false)).collect());
        let paused = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(
            claims,
            pairs,
            per_sec,
            stats.clone(),
            released.clone(),
            paused.clone(),
            stop.clone(),
        ));
        Self {
            stats,
            released,
            paused,
            task,
            stop,
        }
    }

    /// Stops sending renewals and waits (at most 30 s) for those in flight.
    async fn pause(&self, deadline: Instant) -> Result<()> {
        self.paused.store(true, Ordering::Relaxed);
        let until = deadline.min(Instant::now() + Duration::from_secs(30));
        while self.stats.in_flight.load(Ordering::Relaxed) > 0 {
            if Instant::now() > until {
                bail!("renewals still in flight after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    /// Renewals answered with success so far.
    fn ok(&self) -> u64 {
        self.stats.ok.load(Ordering::Relaxed)
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

async fn renew_loop(
    claims: Api<LeaseClaim>,
    pairs: Arc<Vec<Pair>>,
    per_sec: f64,
    stats: Arc<RenewStats>,
    released: Arc<Vec<AtomicBool>>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = FuturesUnordered::new();
    let mut credit = 0.0;
    let mut next = 0usize;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let now = Instant::now();
                let dt = (now - last).as_secs_f64();
                last = now;
                if paused.load(Ordering::Relaxed) {
                    credit = 0.0;
                } else {
                    credit += per_sec * dt;
                }
                while credit >= 1.0 {
                    credit -= 1.0;
                    if running.len() >= RENEW_IN_FLIGHT {
                        stats.skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let i = next % pairs.len();
                    next += 1;
                    let pair = &pairs[i];
                    let (name, uid) = if released[i].load(Ordering::Relaxed) {
                        pair.waiter.clone()
                    } else {
                        pair.holder.clone()
                    };
                    running.push(renew(claims.clone(), name, uid));
                }
            }
            Some(result) = running.next(), if !running.is_empty() => {
                let counter = match result {
                    Ok(()) => &stats.ok,
                    Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => &stats.gone,
                    Err(_) => &stats.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        stats.in_flight.store(running.len(), Ordering::Relaxed);
    }
}

/// What the client library does to renew: one merge patch of `spec.renewTime`.
async fn renew(claims: Api<LeaseClaim>, name: String, uid: String) -> Result<(), kube::Error> {
    let patch = json!({
        "metadata": {"uid": uid},
        "spec": {"renewTime": MicroTime(Timestamp::now())},
    });
    let params = PatchParams {
        field_manager: Some(CLIENT_MANAGER.to_string()),
        ..PatchParams::default()
    };
    claims
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

// ---------------------------------------------------------------------------
// CPU and memory from /proc
// ---------------------------------------------------------------------------

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime of a process (all its threads), in seconds.
fn proc_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: count fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest begins with field 3 (state); utime is field 14, stime 15.
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

/// (busy, total) CPU seconds of the whole machine, all cores.
fn machine_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<f64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some(((total - idle) / clock_ticks(), total / clock_ticks()))
}

/// A `VmHWM`/`VmRSS` line of /proc/PID/status, in KiB.
fn status_kib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

struct Procs {
    controller: u32,
    apiserver: Option<u32>,
    etcd: Option<u32>,
    kcm: Option<u32>,
}

#[derive(Clone, Copy)]
struct CpuSnap {
    at: Instant,
    controller: f64,
    apiserver: f64,
    etcd: f64,
    kcm: f64,
    bench: f64,
    busy: f64,
}

impl Procs {
    fn snap(&self) -> CpuSnap {
        let cpu = |pid: Option<u32>| pid.and_then(proc_cpu).unwrap_or(0.0);
        CpuSnap {
            at: Instant::now(),
            controller: cpu(Some(self.controller).filter(|p| *p != 0)),
            apiserver: cpu(self.apiserver),
            etcd: cpu(self.etcd),
            kcm: cpu(self.kcm),
            bench: cpu(Some(std::process::id())),
            busy: machine_cpu().map_or(0.0, |(busy, _)| busy),
        }
    }
}

impl CpuSnap {
    fn since(&self, start: &CpuSnap) -> CpuWindow {
        CpuWindow {
            secs: (self.at - start.at).as_secs_f64().max(1e-3),
            controller: self.controller - start.controller,
            apiserver: self.apiserver - start.apiserver,
            etcd: self.etcd - start.etcd,
            kcm: self.kcm - start.kcm,
            bench: self.bench - start.bench,
            machine: self.busy - start.busy,
        }
    }
}

/// CPU seconds used in a window of `secs` seconds.
struct CpuWindow {
    secs: f64,
    controller: f64,
    apiserver: f64,
    etcd: f64,
    kcm: f64,
    bench: f64,
    machine: f64,
}

impl CpuWindow {
    /// Percent of one core.
    fn pct(&self, cpu_s: f64) -> f64 {
        cpu_s / self.secs * 100.0
    }

    /// CPU of processes outside this benchmark and its control plane (other work on the machine).
    fn others(&self) -> f64 {
        (self.machine - self.apiserver - self.etcd - self.kcm - self.controller - self.bench)
            .max(0.0)
    }

    fn split(&self, cores: f64) -> String {
        format!(
            "CPU over {:.1} s (% of one core): kube-apiserver {:.0}%, etcd {:.0}%, controller {:.0}%, bench {:.0}%, kube-controller-manager {:.0}%, other processes {:.0}%; machine {:.0}% of {:.0}%",
            self.secs,
            self.pct(self.apiserver),
            self.pct(self.etcd),
            self.pct(self.controller),
            self.pct(self.bench),
            self.pct(self.kcm),
            self.pct(self.others()),
            self.pct(self.machine),
            cores * 100.0
        )
    }

    /// Which side ran out: the controller if it uses about 100% of a core (it decides
    /// on one task); else, when the machine is full, whoever used most of it (the API
    /// server is kube-apiserver and etcd); else the API server if its write rate is
    /// near the create rate it took alone during setup; else nothing CPU-bound.
    fn verdict(&self, cores: f64, writes_per_s: f64, capacity: f64) -> String {
        let ctrl = self.pct(self.controller);
        let api = self.pct(self.apiserver);
        let etcd = self.pct(self.etcd);
        let others = self.pct(self.others());
        let machine = self.pct(self.machine);
        let load = writes_per_s / capacity.max(1e-3) * 100.0;
        let rate = format!(
            "{writes_per_s:.0} API writes/s ({load:.0}% of the {capacity:.0} creates/s it took alone in setup)"
        );
        let apiserver = format!(
            "kube-apiserver (cpu {api:.0}%, etcd {etcd:.0}%; {rate}), controller cpu {ctrl:.0}%"
        );
        let who = if ctrl >= 90.0 {
            format!(
                "controller (cpu {ctrl:.0}% of a core: it decides on one task), kube-apiserver cpu {api:.0}%; {rate}"
            )
        } else if machine >= 0.85 * cores * 100.0 {
            if api + etcd >= others.max(ctrl) {
                format!("{apiserver}; the machine was full and the API server used most of it")
            } else {
                format!(
                    "the machine ({machine:.0}% of {:.0}%), mostly other processes ({others:.0}%); kube-apiserver cpu {api:.0}%, controller cpu {ctrl:.0}%; {rate}",
                    cores * 100.0
                )
            }
        } else if load >= 70.0 || api + etcd >= 0.85 * cores * 100.0 {
            apiserver
        } else {
            format!(
                "nothing CPU-bound (latency: the controller writes 16 Leases at a time), kube-apiserver cpu {api:.0}%, controller cpu {ctrl:.0}%; {rate}"
            )
        };
        format!("saturated: {who}. {}", self.split(cores))
    }
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Report {
    figures: Vec<Value>,
}

impl Report {
    fn fig(&mut self, n: usize, name: &str, value: f64, unit: &str, note: String) {
        // Not finite (not measured): written as null, never as 0.
        let value = if value.is_finite() {
            (value * 1000.0).round() / 1000.0
        } else {
            f64::NAN
        };
        println!("scale: leases_{n}_{name} = {value} {unit}");
        self.figures.push(json!({
            "system": "palisade",
            "name": format!("leases_{n}_{name}"),
            "value": value,
            "unit": unit,
            "note": note,
        }));
    }

    fn value(&self, n: usize, name: &str) -> Option<f64> {
        let name = format!("leases_{n}_{name}");
        self.figures
            .iter()
            .find(|f| f["name"] == name.as_str())?
            .get("value")?
            .as_f64()
    }

    fn table(&self) -> String {
        let mut md = String::from("| figure | value | unit | note |\n|---|---|---|---|\n");
        for f in &self.figures {
            md += &format!(
                "| {} | {} | {} | {} |\n",
                f["name"].as_str().unwrap_or_default(),
                f["value"],
                f["unit"].as_str().unwrap_or_default(),
                f["note"].as_str().unwrap_or_default()
            );
        }
        md
    }
}
