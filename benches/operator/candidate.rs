//! One operator process of the failover: leads through `run_while_leading` and, while
//! leading, writes its ConfigMap through the fenced client every [`WRITE_EVERY`].
//!
//! It tells the harness what happens, one line each on stdout: [`READY`] once it has
//! its identity and clients (then it claims the Lease), [`LEADING`] when its code
//! starts (the grant acquired and confirmed), [`WROTE`] at its first accepted write,
//! [`LOST`] if its grant ends (then it exits: the harness replaces it). It exits when
//! its stdin closes (the harness is gone).

use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Config;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::operator::{Fence, Outcome, run_while_leading};
use serde_json::json;

/// The first argument that makes this binary an operator process.
pub const MODE: &str = "candidate";
/// The service account's token, from the harness (kept off the command line).
pub const TOKEN_ENV: &str = "PALISADE_BENCH_OPERATOR_TOKEN";

pub const READY: &str = "ready";
pub const LEADING: &str = "leading";
pub const WROTE: &str = "wrote";
pub const LOST: &str = "lost";

/// How often a leader writes: an operator reconciling briskly.
pub const WRITE_EVERY: Duration = Duration::from_millis(50);

/// What the harness passes.
#[derive(clap::Parser)]
struct Args {
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    lease: String,
    /// The claim's holderIdentity.
    #[arg(long)]
    id: String,
    /// The ConfigMap it writes while leading.
    #[arg(long)]
    configmap: String,
}

fn say(line: &str) {
    // stdout is line-buffered: each line reaches the harness as it is written.
    println!("{line}");
}

pub fn main(argv: &[String]) -> ExitCode {
    let args = <Args as clap::Parser>::parse_from(
        std::iter::once(MODE.to_string()).chain(argv.iter().cloned()),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(lead(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("operator candidate: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn lead(args: Args) -> Result<(), String> {
    // The harness holds the write end of stdin: EOF means it is gone.
    tokio::spawn(async {
        let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut tokio::io::sink()).await;
        std::process::exit(0);
    });
    let token = std::env::var(TOKEN_ENV).map_err(|_| format!("{TOKEN_ENV} is not set"))?;
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig).map_err(|e| e.to_string())?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let config = super::setup::as_token(config, token);
    let leases = LeaseClient::from_config(config.clone(), Some(&args.namespace))
        .map_err(|e| e.to_string())?;
    let fence = Fence::new(config, &args.namespace, &args.lease)
        .await
        .map_err(|e| e.to_string())?;
    let options = AcquireOptions {
        identity: Some(args.id.clone()),
        pod: PodBinding::None,
        timeout: None,
        slot: None,
    };
    say(READY);
    let leader = fence.clone();
    let outcome = run_while_leading(&leases, &fence, options, |client| async move {
        say(&format!("{LEADING} {}", leader.token()));
        write_while_leading(client, &args, leader.token()).await
    })
    .await
    .map_err(|e| e.to_string())?;
    match outcome {
        Outcome::Lost(reason) => {
            say(&format!("{LOST} {reason:?}"));
            Ok(())
        }
        Outcome::Finished(()) => Err("the leader's code returned".into()),
    }
}

/// Writes the ConfigMap every [`WRITE_EVERY`] until cancelled (the grant ended); says
/// [`WROTE`] with the token and the writes refused before it, at the first accepted one.
async fn write_while_leading(client: kube::Client, args: &Args, token: i64) {
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    let mut refused = 0u64;
    let mut wrote = false;
    for seq in 1u64.. {
        let patch = json!({"data": {"leader": args.id, "seq": seq.to_string()}});
        match configmaps
            .patch(
                &args.configmap,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) if !wrote => {
                wrote = true;
                say(&format!("{WROTE} {token} {refused}"));
            }
            Ok(_) => {}
            Err(e) => {
                refused += 1;
                eprintln!("{}: write {seq} refused: {e}", args.id);
            }
        }
        tokio::time::sleep(WRITE_EVERY).await;
    }
}
