//! `palisade controller`: the lease controller, with leader election among its
//! replicas and the admin server (/healthz, /readyz, /metrics).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Threads, block_on, default_identity, init_logging};
use crate::controller::{self, ControllerConfig};
use crate::election::{ElectionConfig, Elector};
use crate::telemetry::{self, Metrics, Readiness};

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
    let client = match crate::kube_client::controller_default().await {
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

    let admin = tokio::spawn(telemetry::serve_admin(
        args.admin_addr,
        metrics.clone(),
        ready.clone(),
        shutdown.clone(),
    ));
    let (leading_tx, leading_rx) = watch::channel(!args.leader_elect);
    let config = ControllerConfig {
        namespace: args.namespace.clone(),
        concurrency: args.concurrency.max(1),
        instance: identity.clone(),
    };
    // Standbys keep their caches warm, so a takeover only waits for the election.
    let controller = tokio::spawn(controller::run(
        client.clone(),
        config,
        metrics.clone(),
        ready.clone(),
        leading_rx,
        shutdown.clone(),
    ));

    let mut exit = ExitCode::SUCCESS;
    if args.leader_elect {
        let mut elector = Elector::new(
            client,
            ElectionConfig {
                namespace: args.election_namespace.clone(),
                name: args.election_name.clone(),
                identity: identity.clone(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
        );
        tracing::info!(%identity, "waiting for leadership");
        if elector.acquire(&shutdown).await {
            tracing::info!(%identity, "became leader");
            metrics.is_leader.set(1);
            let _ = leading_tx.send(true);
            if let Err(lost) = elector.hold(&shutdown).await {
                // Stop at once: another replica may be granting already.
                tracing::error!(%lost, "lost leadership; exiting");
                exit = ExitCode::FAILURE;
                let _ = leading_tx.send(false);
                shutdown.cancel();
            }
            let _ = controller.await;
            metrics.is_leader.set(0);
            if exit == ExitCode::SUCCESS {
                elector.release().await;
            }
        } else {
            let _ = controller.await;
        }
    } else {
        metrics.is_leader.set(1);
        let _ = controller.await;
    }
    shutdown.cancel();
    if let Ok(Err(e)) = admin.await {
        tracing::error!(error = %e, addr = %args.admin_addr, "admin server failed");
        return ExitCode::FAILURE;
    }
    exit
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
