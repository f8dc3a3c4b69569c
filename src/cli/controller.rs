//! `palisade controller`: the lease controller, with leader election among its
//! replicas and the admin server (/healthz, /readyz, /metrics).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    Threads, block_on, default_identity, init_logging, parse_duration, parse_lease_duration,
};
use crate::admin::{self, Readiness};
use crate::controller::election::{ElectionConfig, ElectionTimings, Elector};
use crate::controller::metrics::Metrics;
use crate::controller::{self, ControllerConfig};

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Only manage Leases in this namespace (default: all namespaces).
    #[arg(long, env = "PALISADE_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:8080", env = "PALISADE_ADMIN_ADDR")]
    pub admin_addr: SocketAddr,
    /// Log one JSON object per line.
    #[arg(long)]
    pub log_json: bool,
    /// Run as one of several replicas, one active at a time.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the coordination.k8s.io Lease used for the election.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub election_namespace: String,
    #[arg(long, default_value = "palisade-controller")]
    pub election_name: String,
    /// This replica's name (defaults to the pod name, else host name and PID).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a leader's election record stands without renewal before a standby
    /// takes over (whole seconds: it is the election Lease's leaseDurationSeconds).
    #[arg(long, default_value = "1s", value_parser = parse_lease_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long after its last successful renewal a leader whose renewal failed stops
    /// granting and stands by (a slow renewal that succeeds keeps it leading).
    #[arg(long, default_value = "750ms", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and a standby tries to take over.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Leases decided and written concurrently.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
}

pub fn run(args: ControllerArgs) -> ExitCode {
    block_on("controller", Threads::Many, run_controller(args))
}

/// This replica's identity when neither `--identity` nor `$POD_NAME` names it: the
/// host name and the process id, so that two replicas on one host never share an
/// identity in the election.
fn replica_identity() -> String {
    format!("{}-{}", default_identity(), std::process::id())
}

async fn run_controller(args: ControllerArgs) -> ExitCode {
    init_logging("info", args.log_json);
    let timings = match (ElectionTimings {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    })
    .validate()
    {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let clients = match crate::kube_client::controller_clients().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes client configuration (KUBECONFIG or in-cluster)");
            return ExitCode::FAILURE;
        }
    };
    let identity = args.identity.clone().unwrap_or_else(replica_identity);
    let metrics = Arc::new(Metrics::default());
    let ready = Readiness::default();
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone()));

    let admin = match start_admin(args.admin_addr, &metrics, &ready, &shutdown).await {
        Ok(admin) => admin,
        Err(e) => {
            eprintln!("palisade controller: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (leading_tx, leading_rx) = watch::channel(!args.leader_elect);
    let config = ControllerConfig {
        namespace: args.namespace.clone(),
        concurrency: args.concurrency.max(1),
        instance: identity.clone(),
    };
    // Standbys keep their caches warm, so a takeover only waits for the election.
    let controller = tokio::spawn(controller::run(
        clients.clone(),
        config,
        metrics.clone(),
        ready.clone(),
        leading_rx,
        shutdown.clone(),
    ));

    // Set on shutdown while leading: released once in-flight writes have finished.
    let release = if args.leader_elect {
        let config = ElectionConfig {
            namespace: args.election_namespace.clone(),
            name: args.election_name.clone(),
            identity: identity.clone(),
            timings,
        };
        let elector = Elector::new(clients.calls, config);
        lead(elector, &identity, &metrics, &leading_tx, &shutdown).await
    } else {
        metrics.is_leader.set(1);
        None
    };
    let _ = controller.await;
    if let Some(mut elector) = release {
        // In-flight writes have finished: a standby may take over at once.
        elector.release().await;
    }
    shutdown.cancel();
    if let Ok(Err(e)) = admin.await {
        tracing::error!(error = %e, addr = %args.admin_addr, "admin server failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The admin server on its bound address (a bind that fails, fails the start).
async fn start_admin(
    addr: std::net::SocketAddr,
    metrics: &Arc<Metrics>,
    ready: &Readiness,
    shutdown: &CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener = admin::bind(addr).await?;
    let metrics = metrics.clone();
    let metrics_text = Arc::new(move || metrics.encode());
    Ok(tokio::spawn(admin::serve_admin(
        listener,
        metrics_text,
        ready.clone(),
        shutdown.clone(),
    )))
}

/// Takes part in the election until shutdown: grants while leading, stands by
/// otherwise. Returns the elector when shutdown came while leading, so the election
/// Lease can be released once in-flight writes have finished.
async fn lead(
    mut elector: Elector,
    identity: &str,
    metrics: &Metrics,
    leading: &watch::Sender<bool>,
    shutdown: &CancellationToken,
) -> Option<Elector> {
    loop {
        tracing::info!(%identity, "waiting for leadership");
        if !elector.acquire(shutdown).await {
            return None; // shutdown
        }
        tracing::info!(%identity, "became leader");
        metrics.is_leader.set(1);
        let _ = leading.send(true);
        let held = elector.hold(shutdown).await;
        let _ = leading.send(false);
        metrics.is_leader.set(0);
        match held {
            Ok(()) => return Some(elector),
            // Stop granting at once (another replica may be granting already) and
            // stand by with warm caches: cheaper than a restart when a loaded API
            // server delays renewals (the controller module's docs, "Leader election").
            Err(lost) => tracing::error!(%lost, "lost leadership; standing by"),
        }
    }
}

/// SIGTERM or Ctrl-C: stop granting, finish in-flight writes, release the election lease.
async fn shutdown_on_signal(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}
