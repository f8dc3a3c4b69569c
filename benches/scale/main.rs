//! Scale of the palisade controller on the local control plane (`cargo bench --bench scale`).
//!
//! For each size N (`--sizes 1000,10000`): N Leases, each with a holder that
//! renews and one waiter. A program that prints figures, not a test:
//! `cargo bench --bench scale -- [--sizes N,...] [--out DIR] [--timeout SECS]
//! [--lease-duration SECS] [--inflight N] [--steady SECS] [--handover SECS]
//! [--failover-at N] [--failover-kills K] [--failover-before-kills K]
//! [--storm-duration SECS] [--storm-library-max N] [--storm-permits N]
//! [--storm-semaphore-max N] [--controller-bin PATH]`; smoke run (debug build, figures
//! mean nothing): `cargo test --bench scale -- --sizes 20`. Needs the cluster of
//! `make cluster`. Writes `DIR/scale.json` (figures named `leases_<N>_...`; latency
//! rows `failover` and `storm-past-duration`) and prints them as a table, and the
//! time each phase took.
//!
//! Modules: one per phase below (`setup`, `initial_grant`, `renewals`, `resync`,
//! `failover`, `handover`, `storm` with `storm_floor`, `storm_run`, `storm_library`,
//! `storm_semaphore`), `run` (one size: the phases in order, and their
//! helpers), `controller` (the controller under test), `renewer` (the holders'
//! renewals), `procs` (CPU and memory from /proc), `output` (the figures).
//! `--controller-bin` runs another palisade binary as the controller (an older
//! one, for a before figure of the storm; one without the `--leader-elect-*` flags
//! needs `--failover-at 0`); the default is the one built with the bench.
//!
//! How, per size, in a namespace `scale-<pid>-<N>` of its own:
//!
//! 1. **Setup**, no controller running: N Leases (`leaseDurationSeconds` 600, see
//!    3.), then N holder claims `h-i`, then N waiter claims `w-i` (bare claims with
//!    a `holderIdentity` and no pod), `--inflight` (32) creates in flight. Holders
//!    are created first, so FIFO order makes `h-i` the first holder. The create rate
//!    is the API server's write throughput with no controller, the yardstick of 6.
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
//! 5. **Failover**, at one size only (`--failover-at`, default the smallest:
//!    1,000 in `make bench`; the goal is stated at 1,000, and at 10,000 every
//!    replacement replica's sync would cost seconds of listing 30,000 objects, 25
//!    times): the controller goes and two replicas with leader election take its
//!    place (`--election-namespace` the bench's namespace, `--election-name`
//!    `palisade-bench-<config>`, `--identity <config>-<i>`, distinct per replica).
//!    Each round: the leader is found (the election Lease's `holderIdentity`, and
//!    that replica's `palisade_is_leader` = 1), SIGKILLed, and at once the bench
//!    deletes one holder claim `h-k` (from the last Lease down; the handover phase
//!    skips those) so the new leader has a grant to make; the gap is from the SIGKILL
//!    to the Lease naming `w-k` as holder, as the bench's Lease watch saw it (the
//!    watch's delay is part of the figure). Then a replacement replica starts and the
//!    next round waits for its `/readyz` (on a standby it means: watches listed, index
//!    built, the same as on a leader), so every kill has a warm standby. Config
//!    `default` (`--failover-kills`, 20; 3 below 1,000 Leases) runs the binary's
//!    default timings; `before` (`--failover-before-kills`, 5; 1 below 1,000) the old
//!    15s/10s/2s, in the same run. Any grant missing 30 s (before: 60 s) after its
//!    kill fails the run, so the smoke run too. The election's own API cost: with
//!    both default replicas idle, the increase of kube-apiserver's
//!    `apiserver_request_total{group="coordination.k8s.io",resource="leases"}` (all
//!    verbs) over the steady window, less its increase over as long with no replica
//!    running just before (kube-controller-manager's and kube-apiserver's own
//!    Leases). Renewals go on meanwhile. Then a single controller (no election)
//!    takes over for 6.
//! 6. **Handover, sustained grants**: the bench deletes holder claims in order
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
//!    Peak RSS is the higher VmHWM of the two controller processes. Then the
//!    controller is killed and the renewals stop for good.
//! 7. **Storm** (`storm`, `storm_floor`, `storm_run`, `storm_library`): every holder
//!    silent at the same moment, each Lease with a waiter (`w-i` where `h-i` still
//!    holds, else a new claim `s-i`). Each holder then renews once, naming its grant's
//!    token as every renewal of the client library does (the renewer of the earlier
//!    phases does not know the tokens), so their expiries are one write each ("Expiry
//!    is one write", `src/controller/index/holder.rs`). How they come due at one
//!    instant without N renewals: the controller gives every held grant a fresh full
//!    duration when it takes over (DESIGN rule 4; a restart is a takeover), so a
//!    controller started with no holder renewing makes all N due one lease duration
//!    after its sync. The duration is the storm's D (`--storm-duration`; 10 s below
//!    1,000 Leases, else 6 s per 1,000 and at least 30: the sync's writes, the new
//!    waiters' Pending status, must be done before the due instant, and the note says
//!    if they were not); the spec is set to D (32 in flight), and since a shorter spec
//!    alone never cuts a grant short, the floor's first pass sets the grants' recorded
//!    `status.holder.leaseDurationSeconds` to D too.
//!    The **floor**: the API server's own rate for the controller's kind of write, one
//!    per Lease, no controller running, the bench's Lease watch open as in the storms:
//!    a status PUT of the whole Lease as a grant writes it (holder, token, grants,
//!    waiting, conditions; the recorded duration D and a fresh acquireTime, so each
//!    write changes it) conditioned on its resourceVersion, 16 in flight (the
//!    controller's `--concurrency`). Three passes, interleaved: floor, storm with bare
//!    claims, floor, storm with library waiters, floor; published as median, min and
//!    max, the fractions against the median.
//!    Each storm starts a controller (one replica, leader election off, so no election
//!    flaps) and waits for every re-grant, then kills it. Bare claims: a re-grant is
//!    the Lease naming the waiter, as the bench's Lease watch saw it. Library waiters
//!    (only up to `--storm-library-max`, 1,000): after the bare storm each new holder
//!    renews once naming its token, then one `LeaseClient::acquire` per Lease starts
//!    in this process, all on one `LeaseClient::from_config` as the agent serves its
//!    callers, and the controller starts once all their claims exist; a re-grant is `acquire`
//!    returning (an `acquire` that fails is counted and named in the note). Per Lease:
//!    delay = the re-grant - (`/readyz` + D), signed, never clamped (Latency
//!    `storm-past-duration`, config `N` or `N-library`). `/readyz` + D is the latest
//!    the due instant can be: the controller starts the holders' clocks during its
//!    initial list, so the delays are short by up to its sync (spawn to `/readyz`, in
//!    the note). The last one is a figure. The rates do not depend on the due instant:
//!    re-grants per second from the first to the last (n - 1 intervals), also as a
//!    fraction of the floor's median, with the Lease writes' own rate in the library
//!    storm; the CPU split from the due instant to the last says who saturated. A
//!    Lease not re-granted within 60 s + 20 ms per Lease of the due instant fails the
//!    run. At 10,000 Leases the library storm is not run (not tried: 10,000 acquires
//!    hold three watches each while waiting, their Lease, their claim and the
//!    holder's claim, 30,000 on a 2-core API server, and the phase must stay within
//!    minutes).
//! 8. **Storm on semaphores** (`storm_semaphore`, up to `--storm-semaphore-max`,
//!    1,000): the same storm on N semaphores of `--storm-permits` (3) permits, in a
//!    namespace of their own (`<namespace>-sem`): N Leases, then a holder claim per
//!    slot (`h-i-k`), then a waiter claim per slot (`w-i-k`), all bare claims for any
//!    slot; a controller grants every slot to its holder and goes; each holder renews
//!    once naming its slot's token; the spec's duration is set to D; then floor, storm,
//!    floor, floor (the floor's passes on these Leases, every slot's recorded duration
//!    set to D by the first). A re-grant is one slot's, the Lease naming its waiter as
//!    the bench's watch saw it; one Lease write may re-grant several slots, so the
//!    Lease writes that granted are counted too (config `N-semaphore`).
//! 9. The namespaces' claims, Leases and Events are deleted with the namespaces
//!    (waited for, at most 3 minutes each; also on failure).
//!
//! What the numbers mean: everything shares one machine (2 cores on the
//! development machine): etcd, kube-apiserver, kube-controller-manager, the bench,
//! the controller, and whatever else runs there (the notes show it as "other
//! processes"). So a grant rate is the rate of this whole system, not of the
//! controller alone; the CPU split says where the time went. The default run took
//! 8 minutes on the idle 2-core machine (1,000 Leases 71 s, 10,000 Leases 401 s) and
//! 13 to 17 minutes while other work ran there, before the storm with library waiters
//! (about 45 s more at 1,000: its D of 30 s, its waiters queued and released): it is API-server bound (at 10,000:
//! 30,000 creates, 40,000 writes for the initial grants, some 45,000 deletes to
//! clean up). Every wait is bounded, the whole run by `--timeout` (default 2400 s).

#[path = "../common/cpu.rs"]
#[allow(dead_code)]
mod cpu;
#[path = "../common/schema.rs"]
#[allow(dead_code)]
mod schema;

mod controller;
mod failover;
mod handover;
mod initial_grant;
mod output;
mod procs;
mod renewals;
mod renewer;
mod resync;
mod run;
mod setup;
mod storm;
mod storm_floor;
mod storm_library;
mod storm_run;
mod storm_semaphore;

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
use palisade::client::CLIENT_MANAGER;
use palisade::crd::{Lease, LeaseClaim, RENEWED_TOKEN_ANNOTATION};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use controller::*;
use failover::failover;
use handover::handover;
use initial_grant::initial_grant;
use output::*;
use procs::*;
use renewals::renewals;
use renewer::*;
use resync::resync;
use run::*;
use setup::setup;
use storm::*;
use storm_floor::*;
use storm_library::*;
use storm_run::*;
use storm_semaphore::*;

struct Args {
    sizes: Vec<usize>,
    out: PathBuf,
    timeout: Duration,
    lease_duration: i64,
    inflight: usize,
    steady: Option<Duration>,
    handover: Duration,
    failover_at: usize,
    failover_kills: Option<usize>,
    failover_before_kills: Option<usize>,
    storm_duration: Option<i64>,
    storm_library_max: usize,
    storm_permits: i32,
    storm_semaphore_max: usize,
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
    #[arg(long, default_value_t = 2400)]
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
    /// The size at which the failover phase runs (default: the smallest of --sizes).
    #[arg(long)]
    failover_at: Option<usize>,
    /// Leaders SIGKILLed with the default election timings (default 20; 3 below 1,000 Leases).
    #[arg(long)]
    failover_kills: Option<usize>,
    /// Leaders SIGKILLed with the old timings 15s/10s/2s (default 5; 1 below 1,000 Leases).
    #[arg(long)]
    failover_before_kills: Option<usize>,
    /// The storm's lease duration, seconds (default 10 below 1,000 Leases, else
    /// 6 s per 1,000 Leases and at least 30).
    #[arg(long)]
    storm_duration: Option<i64>,
    /// The largest size at which the storm runs a second time with library waiters
    /// (`LeaseClient::acquire`, all in this process).
    #[arg(long, default_value_t = 1000)]
    storm_library_max: usize,
    /// The permits of each semaphore in the storm on semaphores.
    #[arg(long, default_value_t = 3)]
    storm_permits: i32,
    /// The largest size at which the storm runs on semaphores too (0: never).
    #[arg(long, default_value_t = 1000)]
    storm_semaphore_max: usize,
    /// The palisade binary to run as the controller (default: the one built with this
    /// bench). One without the `--leader-elect-*` flags needs `--failover-at 0`.
    #[arg(long)]
    controller_bin: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Args {
    let c = <Cli as clap::Parser>::parse();
    let smallest = c.sizes.iter().copied().min().unwrap_or(0);
    let a = Args {
        sizes: c.sizes,
        out: c.out,
        timeout: Duration::from_secs(c.timeout),
        lease_duration: c.lease_duration,
        inflight: c.inflight.clamp(1, 256),
        steady: c.steady.map(Duration::from_secs),
        handover: Duration::from_secs(c.handover),
        failover_at: c.failover_at.unwrap_or(smallest),
        failover_kills: c.failover_kills,
        failover_before_kills: c.failover_before_kills,
        storm_duration: c.storm_duration,
        storm_library_max: c.storm_library_max,
        storm_permits: c.storm_permits,
        storm_semaphore_max: c.storm_semaphore_max,
    };
    if let Some(bin) = c.controller_bin {
        assert!(
            bin.is_file(),
            "--controller-bin {}: no such file",
            bin.display()
        );
        let _ = CONTROLLER_BIN.set(bin);
    }
    assert!(
        a.sizes.iter().all(|n| (1..=99_999).contains(n)),
        "--sizes: 1..=99999 Leases each"
    );
    assert!(
        (3..=86_400).contains(&a.lease_duration),
        "--lease-duration: 3..=86400"
    );
    assert!(
        a.storm_duration.is_none_or(|d| (3..=3_600).contains(&d)),
        "--storm-duration: 3..=3600"
    );
    assert!(
        (2..=palisade::permits::MAX_PERMITS).contains(&a.storm_permits),
        "--storm-permits: 2..={}",
        palisade::permits::MAX_PERMITS
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
        let cleanup =
            cleanup(&client, &ns).await + cleanup(&client, &semaphore_namespace(&ns)).await;
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
        "latency": report.latency,
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
