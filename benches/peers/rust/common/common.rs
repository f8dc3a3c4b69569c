//! Shared by the two peer benchmarks (`kube-leader-election/` and `kubert/`),
//! each of which includes this file with `#[path]`. The two packages pin
//! different kube / k8s-openapi versions, so only APIs that are identical in
//! kube 1.1 and kube 4.2 are used here. The output schema is not here: each
//! binary includes `benches/common/schema.rs` as `crate::schema`, the one
//! definition every benchmark writes.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Res<T> = Result<T, BoxError>;

pub fn err(msg: impl Into<String>) -> BoxError {
    msg.into().into()
}

// --- command line --------------------------------------------------------------

/// Benchmark of a Rust lease crate against a real kube-apiserver (a peer baseline for
/// palisade); writes the result schema of benches/common/schema.rs.
#[derive(Debug, Clone, clap::Parser)]
pub struct Cli {
    /// Admin kubeconfig (`make cluster` prints the export line).
    #[arg(long, env = "KUBECONFIG", hide_env_values = true)]
    pub kubeconfig: std::path::PathBuf,
    /// Output file [default: rust-peers-<peer>.json in the working directory].
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Voluntary-release handovers, in total (split over the lanes).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=5000))]
    pub release_rounds: u64,
    /// Expiry handovers, in total (split over the lanes).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=5000))]
    pub expiry_rounds: u64,
    /// Independent Leases measured concurrently.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub lanes: u64,
    /// API-cost window in seconds, 0 skips it [default: 30 for kube-leader-election, 58 for kubert].
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub steady: Option<u64>,
    /// Seconds between starting the steady-state candidates and the window.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub warmup: u64,
    /// Idle window (seconds) measured before, and subtracted from, the steady window.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub baseline: u64,
    /// Baseline + window are redone while other lease traffic spoils them, up to this many times.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=5))]
    pub steady_attempts: u64,
    /// Overall timeout, seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=7200))]
    pub timeout: u64,
}

/// The flags, with the peer's own defaults filled in.
#[derive(Debug, Clone)]
pub struct Args {
    pub kubeconfig: std::path::PathBuf,
    pub out: std::path::PathBuf,
    pub release_rounds: usize,
    pub expiry_rounds: usize,
    pub lanes: usize,
    pub steady: u64,
    pub warmup: u64,
    pub baseline: u64,
    pub steady_attempts: u64,
    pub timeout: u64,
}

pub fn parse_args(default_out: &str, default_steady: u64) -> Args {
    let a = <Cli as clap::Parser>::parse();
    Args {
        kubeconfig: a.kubeconfig,
        out: a.out.unwrap_or_else(|| default_out.into()),
        release_rounds: a.release_rounds as usize,
        expiry_rounds: a.expiry_rounds as usize,
        lanes: a.lanes as usize,
        steady: a.steady.unwrap_or(default_steady),
        warmup: a.warmup,
        baseline: a.baseline,
        steady_attempts: a.steady_attempts,
        timeout: a.timeout,
    }
}

// --- output: the schema of benches/common/schema.rs --------------------------------

pub use crate::schema::{Figure, Latency, Source};

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn ms(d: Duration) -> f64 {
    round2(d.as_secs_f64() * 1000.0)
}

/// Signed difference `a - b` of two wall-clock instants, in ms.
pub fn wall_diff_ms(a: std::time::SystemTime, b: std::time::SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => ms(d),
        Err(e) => -ms(e.duration()),
    }
}

/// A latency row (nearest-rank percentiles, ms) with the mean rounded like the samples.
pub fn summarize(
    system: &str,
    config: &str,
    scenario: &str,
    samples: &[f64],
    note: String,
) -> Latency {
    let mut l = Latency::of(system, config, scenario, samples.to_vec(), &note);
    l.mean = round2(l.mean);
    l
}

/// A scenario the crate has no counterpart for: n = 0 and why.
pub fn not_applicable(system: &str, scenario: &str, note: &str) -> Latency {
    Latency::of(system, "-", scenario, Vec::new(), note)
}

pub fn write_json(path: &std::path::Path, o: &Source) -> Res<()> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let problems = o.problems();
    if !problems.is_empty() {
        // Written anyway (the figures are worth reading), but the run fails.
        eprintln!(
            "output breaks benches/common/schema.rs: {}",
            problems.join("; ")
        );
    }
    let mut data = serde_json::to_vec_pretty(o)?;
    data.push(b'\n');
    std::fs::write(path, data)?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(err("output breaks the schema (see above)"))
    }
}

pub fn print_table(o: &Source) {
    let f = |l: &Latency, x: f64| {
        if l.n == 0 {
            "-".to_string()
        } else {
            format!("{x:.1}")
        }
    };
    println!();
    println!("versions: {:?}", o.versions);
    println!();
    println!(
        "| system | scenario | config | n | p50 ms | p95 ms | p99 ms | min ms | max ms | mean ms |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for l in &o.latency {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.system,
            l.scenario,
            l.config,
            l.n,
            f(l, l.p50),
            f(l, l.p95),
            f(l, l.p99),
            f(l, l.min),
            f(l, l.max),
            f(l, l.mean)
        );
    }
    println!();
    println!("| system | figure | value | unit |");
    println!("|---|---|---:|---|");
    for g in &o.figures {
        println!(
            "| {} | {} | {:.3} | {} |",
            g.system, g.name, g.value, g.unit
        );
    }
    println!();
    for l in &o.latency {
        println!("note [{} / {}]: {}", l.system, l.scenario, l.note);
    }
    for g in &o.figures {
        println!("note [{} / {}]: {}", g.system, g.name, g.note);
    }
    if let Some(note) = o.parameters.get("note").and_then(|v| v.as_str()) {
        println!("note: {note}");
    }
}

// --- clients -------------------------------------------------------------------

/// Lease requests issued by the bench's candidates, counted client-side.
#[derive(Default, Debug)]
pub struct LeaseCounter {
    pub get: AtomicU64,
    pub patch: AtomicU64,
    pub put: AtomicU64,
    pub post: AtomicU64,
    pub other: AtomicU64,
}

impl LeaseCounter {
    pub fn snapshot(&self) -> [u64; 5] {
        [
            self.get.load(Ordering::Relaxed),
            self.patch.load(Ordering::Relaxed),
            self.put.load(Ordering::Relaxed),
            self.post.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        ]
    }
}

pub async fn load_config(path: &std::path::Path) -> Res<kube::Config> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    cfg.connect_timeout = Some(Duration::from_secs(5));
    cfg.read_timeout = Some(Duration::from_secs(10));
    cfg.write_timeout = Some(Duration::from_secs(10));
    Ok(cfg)
}

/// When a candidate's last write to its Lease went out: the wall clock taken as its
/// client hands the request to the connection, just before it is sent.
pub type LastWrite = Arc<std::sync::Mutex<Option<std::time::SystemTime>>>;

/// A client with its own connection pool (one per candidate, as separate
/// processes would have), counting its requests to `leases`, and the instant its
/// last write to them (PATCH, PUT, POST) was sent: every bench's expiry clock starts
/// at the silent holder's last renewal send, as the client saw it.
pub fn candidate_client(
    cfg: &kube::Config,
    counter: &Arc<LeaseCounter>,
) -> Res<(kube::Client, LastWrite)> {
    let counter = counter.clone();
    let last_write = LastWrite::default();
    let sent = last_write.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if req.uri().path().contains("/leases") {
            let c = match *req.method() {
                http::Method::GET => &counter.get,
                http::Method::PATCH => &counter.patch,
                http::Method::PUT => &counter.put,
                http::Method::POST => &counter.post,
                _ => &counter.other,
            };
            c.fetch_add(1, Ordering::Relaxed);
            if matches!(
                *req.method(),
                http::Method::PATCH | http::Method::PUT | http::Method::POST
            ) {
                *sent.lock().unwrap() = Some(std::time::SystemTime::now());
            }
        }
        req
    });
    let client = kube::client::ClientBuilder::try_from(cfg.clone())?
        .with_layer(&layer)
        .build();
    Ok((client, last_write))
}

pub async fn create_namespace(admin: &kube::Client, name: &str) -> Res<()> {
    let api: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "rpeer-bench"}}
    }))?;
    tokio::time::timeout(
        Duration::from_secs(15),
        api.create(&PostParams::default(), &ns),
    )
    .await
    .map_err(|_| err("namespace create timed out"))??;
    Ok(())
}

pub async fn delete_namespace(admin: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(admin.clone());
    match tokio::time::timeout(
        Duration::from_secs(30),
        api.delete(name, &DeleteParams::default()),
    )
    .await
    {
        Ok(Ok(_)) => println!("deleted namespace {name}"),
        Ok(Err(e)) => eprintln!("namespace {name} cleanup: {e}"),
        Err(_) => eprintln!("namespace {name} cleanup timed out"),
    }
}

pub async fn server_version(admin: &kube::Client) -> String {
    match tokio::time::timeout(Duration::from_secs(10), admin.apiserver_version()).await {
        Ok(Ok(v)) => v.git_version,
        _ => "unknown".into(),
    }
}

/// Sum of apiserver_request_total{group="coordination.k8s.io",resource="leases"}.
pub async fn lease_request_total(admin: &kube::Client) -> Res<f64> {
    let text = retry("GET /metrics", || async {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        admin.request_text(req).await.map_err(|e| e.to_string())
    })
    .await?;
    Ok(parse_lease_total(&text))
}

pub fn parse_lease_total(text: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(r#"resource="leases""#)
                && l.contains(r#"group="coordination.k8s.io""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub struct Rate {
    pub server_rps: f64,
    pub client_rps: f64,
    pub client_by_method: [f64; 5],
    pub seconds: f64,
}

/// The server's lease request total, and the client-side counts and instant
/// taken as the midpoint of the /metrics request (when the server read it).
async fn snapshot(admin: &kube::Client, counter: &LeaseCounter) -> Res<(f64, [f64; 5], Instant)> {
    let (a, ta) = (counter.snapshot(), Instant::now());
    let s = lease_request_total(admin).await?;
    let (b, tb) = (counter.snapshot(), Instant::now());
    let mut c = [0.0; 5];
    for i in 0..5 {
        c[i] = (a[i] + b[i]) as f64 / 2.0;
    }
    Ok((s, c, ta + (tb - ta) / 2))
}

/// Server-side (whole cluster) and client-side (our candidates) lease request
/// rates over `window`.
pub async fn measure_rate(
    admin: &kube::Client,
    counter: &LeaseCounter,
    window: Duration,
) -> Res<Rate> {
    let (s0, c0, t0) = snapshot(admin, counter).await?;
    tokio::time::sleep(window).await;
    let (s1, c1, t1) = snapshot(admin, counter).await?;
    let el = (t1 - t0).as_secs_f64();
    let mut by = [0.0; 5];
    for i in 0..5 {
        by[i] = (c1[i] - c0[i]) / el;
    }
    Ok(Rate {
        server_rps: (s1 - s0) / el,
        client_rps: by.iter().sum(),
        client_by_method: by,
        seconds: el,
    })
}

/// A warning when the cluster-wide (server-side) figure disagrees with what
/// the candidates themselves sent: other clients' lease traffic changed
/// between the baseline and the window, so the server-side value is not
/// this crate's cost.
pub fn contamination(server_excess: f64, client: f64) -> Option<String> {
    let tol = (0.3 * client).max(0.15);
    ((server_excess - client).abs() > tol).then(|| {
        format!(
            " UNRELIABLE: baseline-subtracted server-side rate {server_excess:.3} req/s differs from the candidates' \
             own {client:.3} req/s by more than {tol:.2} req/s: other clients' lease traffic changed during the \
             measurement (another benchmark sharing the apiserver?); rerun on a quiet cluster or use the client-side figure."
        )
    })
}

pub fn methods_note(by: &[f64; 5]) -> String {
    let names = ["GET", "PATCH", "PUT", "POST", "other"];
    names
        .iter()
        .zip(by.iter())
        .filter(|(_, v)| **v > 0.0)
        .map(|(n, v)| format!("{n} {v:.3}/s"))
        .collect::<Vec<_>>()
        .join(", ")
}

// --- lanes ---------------------------------------------------------------------

/// Aborts a task when dropped, so nothing outlives its scenario or the timeout.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug, Default, Clone)]
pub struct LaneOut {
    /// Primary samples (ms).
    pub samples: Vec<f64>,
    /// Secondary samples (ms), scenario-specific.
    pub extra: Vec<f64>,
    pub error: Option<String>,
    /// Rounds discarded because the holder lost the lease before the
    /// measured handover (the waiter took over on its own).
    pub spurious: Vec<String>,
}

/// What the lanes of one scenario produced.
#[derive(Debug, Default)]
pub struct LanesOut {
    pub samples: Vec<f64>,
    pub extra: Vec<f64>,
    pub errors: Vec<String>,
    pub spurious: Vec<String>,
}

impl LanesOut {
    /// Appended to the scenario's note.
    pub fn note_suffix(&self) -> String {
        let mut s = String::new();
        if !self.spurious.is_empty() {
            s.push_str(&format!(
                " {} round(s) discarded and redone because the holder lost the lease before the measured handover \
                 (renewal too slow on the loaded machine): {}.",
                self.spurious.len(),
                self.spurious.join("; ")
            ));
        }
        if !self.errors.is_empty() {
            s.push_str(&format!(" ERRORS: {}", self.errors.join("; ")));
        }
        s
    }
}

pub struct Progress {
    pub label: String,
    pub total: usize,
    pub done: AtomicUsize,
}

impl Progress {
    pub fn new(label: &str, total: usize) -> Arc<Self> {
        Arc::new(Progress {
            label: label.into(),
            total,
            done: AtomicUsize::new(0),
        })
    }
    pub fn tick(&self, lane: usize, sample_ms: f64) {
        let n = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let step = (self.total / 10).max(1);
        if n.is_multiple_of(step) || n == self.total {
            println!(
                "  [{}] {n}/{} handovers (lane {lane}: {sample_ms:.1} ms)",
                self.label, self.total
            );
        }
    }
}

/// Splits `total` rounds over `lanes` concurrent lanes and runs `f(lane, rounds)`
/// for each, lane `l` starting `l / lanes` of `spread` after the first, so that
/// lanes whose rounds take `spread` each do not come due in step (every bench
/// staggers its expiry lanes over the lease duration the same way).
pub async fn run_lanes<F, Fut>(total: usize, lanes: usize, spread: Duration, f: F) -> LanesOut
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = LaneOut> + Send + 'static,
{
    let lanes = lanes.min(total).max(1);
    let mut set = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let rounds = total / lanes + usize::from(lane < total % lanes);
        if rounds > 0 {
            let lane_run = f(lane, rounds);
            let delay = spread * lane as u32 / lanes as u32;
            set.spawn(async move {
                tokio::time::sleep(delay).await;
                lane_run.await
            });
        }
    }
    let mut all = LanesOut::default();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(o) => {
                all.samples.extend(o.samples);
                all.extra.extend(o.extra);
                all.spurious.extend(o.spurious);
                if let Some(e) = o.error {
                    all.errors.push(e);
                }
            }
            Err(e) => all.errors.push(format!("lane task: {e}")),
        }
    }
    all
}

pub async fn jitter(max: Duration) {
    let max_us = max.as_micros() as u64;
    if max_us > 0 {
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..max_us))).await;
    }
}

/// Runs `f` up to 3 times (10 s timeout each), for bench-side calls that a
/// transient connection error should not turn into a lost lane.
pub async fn retry<T, E, F, Fut>(what: &str, mut f: F) -> Res<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut last = String::new();
    for i in 1..=3u32 {
        match tokio::time::timeout(Duration::from_secs(10), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(100) * i).await;
    }
    Err(err(format!("{what} (3 attempts): {last}")))
}

/// The machine's 1-minute load average, for the record.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Polls `cond` every 2 ms until it holds, or fails after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Res<()> {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(err(format!("timed out after {limit:?} waiting for {what}")));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What a peer binary is, for its output and its namespace.
pub struct Peer {
    /// The crate under test, also the system name in the output.
    pub system: &'static str,
    /// Short name: output file `rust-peers-<slug>.json`, namespace `rpeer-<slug>-<pid>`.
    pub slug: &'static str,
    pub version: &'static str,
    pub kube: &'static str,
    pub k8s_openapi: &'static str,
    /// Where the other peer's figures come from.
    pub other: &'static str,
    /// Default `--steady` seconds.
    pub default_steady: u64,
}

/// What both binaries' candidates share.
pub struct Env {
    pub cfg: kube::Config,
    pub admin: kube::Client,
    pub counter: Arc<LeaseCounter>,
    pub ns: String,
}

/// A started run: its flags, its namespace (created), and its output so far.
pub struct Run {
    pub args: Args,
    pub env: Arc<Env>,
    pub output: Source,
    /// How the run went, for `parameters.note`.
    note: String,
    started: Instant,
    load0: String,
}

/// Parses the flags, connects, creates the namespace; exits 1 if any of that fails.
pub async fn start(peer: &Peer) -> Run {
    let args = parse_args(
        &format!("rust-peers-{}.json", peer.slug),
        peer.default_steady,
    );
    let started = Instant::now();
    let cfg = match load_config(&args.kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fatal: kubeconfig {}: {e}", args.kubeconfig.display());
            std::process::exit(1);
        }
    };
    let admin = match kube::Client::try_from(cfg.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fatal: client: {e}");
            std::process::exit(1);
        }
    };
    let ns = format!("rpeer-{}-{}", peer.slug, std::process::id());
    let note = format!(
            "{} only ({}). All candidates \
             run in one process, each with its own kube::Client (own TLS connection); lanes = independent Leases \
             measured concurrently (--lanes {}; expiry lanes start staggered over the lease duration); namespace {ns} (deleted after the run). Flags: release-rounds {}, \
             expiry-rounds {}, steady {}s, warm-up {}s, baseline {}s, steady attempts <= {}.",
            peer.system, peer.other, args.lanes, args.release_rounds, args.expiry_rounds, args.steady, args.warmup,
            args.baseline, args.steady_attempts
    );
    let mut o = Source {
        source: "rust-peers".into(),
        ..Default::default()
    };
    for (k, v) in [
        ("release_rounds", args.release_rounds as u64),
        ("expiry_rounds", args.expiry_rounds as u64),
        ("lanes", args.lanes as u64),
        ("steady_s", args.steady),
        ("warmup_s", args.warmup),
        ("baseline_s", args.baseline),
        ("steady_attempts", args.steady_attempts),
    ] {
        o.parameters.insert(k.into(), v.into());
    }
    o.parameters.insert("namespace".into(), ns.clone().into());
    o.versions.insert(peer.system.into(), peer.version.into());
    o.versions
        .insert(format!("kube (for {})", peer.system), peer.kube.into());
    o.versions.insert(
        format!("k8s-openapi (for {})", peer.system),
        peer.k8s_openapi.into(),
    );
    o.versions
        .insert("kubernetes".into(), server_version(&admin).await);
    println!(
        "{} {} (kube {}) vs kube-apiserver {}; namespace {ns}",
        peer.system, peer.version, peer.kube, o.versions["kubernetes"]
    );
    if let Err(e) = create_namespace(&admin, &ns).await {
        eprintln!("fatal: create namespace {ns}: {e}");
        std::process::exit(1);
    }
    let env = Arc::new(Env {
        cfg,
        admin,
        counter: Arc::new(LeaseCounter::default()),
        ns,
    });
    Run {
        args,
        env,
        output: o,
        note,
        started,
        load0: loadavg(),
    }
}

impl Run {
    /// Runs the measurements within `--timeout` (or until SIGINT); the error, if any.
    pub async fn bounded(timeout: u64, measure: impl Future<Output = Res<()>>) -> Option<String> {
        tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(timeout), measure) => match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("overall timeout of {timeout}s reached")),
            },
            _ = tokio::signal::ctrl_c() => Some("interrupted (SIGINT)".to_string()),
        }
    }

    /// Deletes the namespace, writes and prints the output; exits 1 if the run failed.
    pub async fn finish(self, failure: Option<String>) {
        let Run {
            args,
            env,
            output: mut o,
            mut note,
            started,
            load0,
        } = self;
        note.push_str(&format!(
            " 1-min load average at start {load0}, at end {} (2-core machine shared with other work; the apiserver \
             serves other clients too).",
            loadavg()
        ));
        delete_namespace(&env.admin, &env.ns).await;
        if let Some(f) = &failure {
            note.push_str(&format!(" RUN FAILED: {f}"));
        }
        o.parameters.insert("note".into(), note.into());
        let written = write_json(&args.out, &o);
        if let Err(e) = &written {
            eprintln!("write {}: {e}", args.out.display());
        }
        print_table(&o);
        println!(
            "wrote {} in {:.1}s",
            args.out.display(),
            started.elapsed().as_secs_f64()
        );
        if let Some(f) = failure {
            eprintln!("ERROR: {f}");
            std::process::exit(1);
        }
        if written.is_err() {
            std::process::exit(1);
        }
    }
}

/// The holder alone's request rate and a waiter's (1 holder + 3 waiters less the
/// holder alone, over 3), server-side less the idle `base`, each over its window
/// after `warmup` seconds; `cfg` names the timings. The same for both peers.
pub fn holder_and_waiter_figures(
    system: &str,
    cfg: &str,
    warmup: u64,
    (base, alone, r): (&Rate, &Rate, &Rate),
) -> Vec<crate::schema::Figure> {
    use crate::schema::Figure;
    vec![
        Figure {
            system: system.into(),
            config: String::new(),
            name: "lease_requests_per_s_holder_only".into(),
            value: round3(alone.server_rps - base.server_rps),
            unit: "req/s".into(),
            note: format!(
                "{cfg}; the holder alone on the Lease: apiserver_request_total{{group=coordination.k8s.io,resource=leases}} \
                 delta over a window of {:.1}s after {}s warm-up, minus the idle baseline {:.3} req/s; its client counted \
                 {:.3} req/s ({}); no candidate opens a watch",
                alone.seconds,
                warmup,
                base.server_rps,
                alone.client_rps,
                methods_note(&alone.client_by_method)
            ),
        },
        Figure {
            system: system.into(),
            config: String::new(),
            name: "lease_requests_per_s_per_waiter".into(),
            value: round3((r.server_rps - alone.server_rps) / 3.0),
            unit: "req/s".into(),
            note: format!(
                "(1 holder + 3 waiters less the holder alone) / 3, server-side, both over windows of {:.1}s; \
                 client-side {:.3} req/s",
                r.seconds,
                (r.client_rps - alone.client_rps) / 3.0
            ),
        },
    ]
}
