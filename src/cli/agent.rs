//! `palisade agent`: the per-pod sidecar that holds Leases for the pod's containers
//! behind a local HTTP API ([`crate::agent`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{Threads, block_on, init_logging};
use crate::agent::{self, AgentConfig, DEFAULT_SOCKET, DEFAULT_TOKEN_DIR};
use crate::client::LeaseClient;

const AFTER_HELP: &str = "\
Run it as a native sidecar (an init container with restartPolicy: Always) with the
socket's directory in an emptyDir that every container of the pod mounts, and
POD_NAME, POD_UID and POD_NAMESPACE from the downward API: its claims are then bound
to the pod, and revoked as soon as the pod is gone. The API is /v1/openapi.yaml on
the socket. On SIGTERM or SIGINT it releases every grant, then exits 0.";

/// Hold Leases for this pod's applications behind a local HTTP API.
#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct AgentArgs {
    /// Default namespace of the Leases [default: $POD_NAMESPACE, else the kubeconfig's namespace].
    #[arg(short = 'n', long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// The Unix socket of the API.
    #[arg(long, default_value = DEFAULT_SOCKET, env = "PALISADE_AGENT_SOCKET")]
    pub socket: PathBuf,
    /// Serve the API on this loopback TCP address too (e.g. 127.0.0.1:7800).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Where token files are written: DIR/NAMESPACE/LEASE/token.
    #[arg(long, default_value = DEFAULT_TOKEN_DIR)]
    pub token_dir: PathBuf,
    /// Write no token files.
    #[arg(long, conflicts_with = "token_dir")]
    pub no_token_files: bool,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        default_value = "0.0.0.0:9465",
        env = "PALISADE_AGENT_ADMIN_ADDR"
    )]
    pub admin_addr: SocketAddr,
    /// Log one JSON object per line.
    #[arg(long)]
    pub log_json: bool,
}

pub fn run(args: AgentArgs) -> ExitCode {
    init_logging("info", args.log_json);
    block_on("agent", Threads::One, async move {
        let client = match LeaseClient::try_default(args.namespace.as_deref()).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "palisade agent: no Kubernetes client configuration (KUBECONFIG or in-cluster): {e}"
                );
                return ExitCode::FAILURE;
            }
        };
        let namespace = client.namespace().to_string();
        let config = AgentConfig {
            namespace,
            socket: args.socket,
            listen: args.listen,
            token_dir: (!args.no_token_files).then_some(args.token_dir),
            admin_addr: args.admin_addr,
            network: agent::PodNetwork::from_env(),
        };
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        match agent::run(client, config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("palisade agent: {e}");
                ExitCode::from(2)
            }
        }
    })
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    shutdown.cancel();
}
