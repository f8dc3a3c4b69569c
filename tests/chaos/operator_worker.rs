//! A fenced operator's process (`chaos operator-worker ...`): it runs as the service
//! account the chart's `policies.operators` names (operator_setup.rs), leads Lease
//! [`OPERATOR_LEASE`] through `palisade::operator::run_while_leading`, and while it
//! leads writes through the stamped client to the objects it owns: ConfigMap
//! [`STATE_CONFIGMAP`] (a main resource) and the status of Deployment
//! [`TARGET_DEPLOYMENT`] (a subresource). The deployment controller leaves a condition
//! type it does not own alone, and its own status write commits only on the version it
//! read, so it never undoes one of ours. Every write goes to the history with its token
//! and what the API server answered.
//!
//! A bad citizen, like the other workers, in two ways a real operator can be: each
//! round of writes runs in a task of its own (as a controller's reconcile does), which
//! a lost term does not cancel, so a round under way when leadership ends still goes
//! out with the old token; and after a lost term it writes once more through the
//! client it kept (a leftover reconciler). The fence must refuse both once a successor
//! leads: the checker (history/operator.rs) finds any that landed after the
//! successor's first write.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::operator::{Fence, Outcome as Led, run_while_leading};
use serde_json::json;

use crate::history::{Event, Outcome, Recorder};
use crate::rng::{Rng, now_ns};
use crate::worker::timed;

/// The namespace of the operator workers' account, Lease and objects: one of their
/// own, the one the operators policy is narrowed to (operator_setup.rs).
pub const OPERATOR_NAMESPACE: &str = "chaos-operators";
/// The Lease the operator workers lead by.
pub const OPERATOR_LEASE: &str = "operator";
/// The service account they run as.
pub const SERVICE_ACCOUNT: &str = "chaos-operator";
/// The ConfigMap they write.
pub const STATE_CONFIGMAP: &str = "operator-state";
/// The Deployment (no replicas) whose status they write.
pub const TARGET_DEPLOYMENT: &str = "operator-target";
/// The type of the Deployment's condition they write.
pub const CONDITION: &str = "ChaosOperatorWrite";
/// Operator workers per run (`o0`, `o1`): two contend for the Lease, and on the HA
/// plane each is pinned to an API server of its own, so a handover crosses servers.
pub const OPERATOR_WORKERS: usize = 2;

/// Rounds of writes (one to each object) per term: 100 to 300 ms apart, several lease
/// durations, so a pause usually catches a leader with writes ahead of it.
const TERM_ROUNDS: (u64, u64) = (20, 40);
/// How long a new leader waits for every API server to refuse its predecessor's
/// token before it gives the term up (and the Lease back).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(20);

/// The ConfigMap's name in the history.
pub fn state_object() -> String {
    format!("configmap/{STATE_CONFIGMAP}")
}

/// The Deployment's status in the history.
pub fn status_object() -> String {
    format!("deployment/{TARGET_DEPLOYMENT}/status")
}

/// The condition's message: the token first, so the harness's watch can read it.
fn condition_message(token: u64, worker: &str, seq: u64) -> String {
    format!("token {token} worker {worker} seq {seq}")
}

/// The token of the operator write that made this version of the ConfigMap.
pub fn token_of_state(cm: &ConfigMap) -> Option<u64> {
    cm.data.as_ref()?.get("token")?.parse().ok()
}

/// The token of the operator write that made the Deployment's condition.
pub fn token_of_status(deployment: &Deployment) -> Option<u64> {
    let conditions = deployment.status.as_ref()?.conditions.as_ref()?;
    let ours = conditions.iter().find(|c| c.type_ == CONDITION)?;
    let message = ours.message.as_deref()?.strip_prefix("token ")?;
    message.split_whitespace().next()?.parse().ok()
}

pub struct OperatorArgs {
    /// The worker's kubeconfig (its server: the proxy it is pinned to).
    pub kubeconfig: PathBuf,
    /// A file holding the service account's token, which replaces the kubeconfig's user.
    pub token_file: PathBuf,
    /// Every API server, as the harness reaches each (its load balancer on the HA
    /// plane), for the new leader's confirmation.
    pub servers: Vec<String>,
    pub identity: String,
    pub history: PathBuf,
    pub seed: u64,
}

impl OperatorArgs {
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "operator-worker".into(),
            self.kubeconfig.display().to_string(),
            self.token_file.display().to_string(),
            self.servers.join(","),
            self.identity.clone(),
            self.history.display().to_string(),
            self.seed.to_string(),
        ]
    }

    pub fn from_args(args: &[String]) -> Result<Self, String> {
        let [kubeconfig, token_file, servers, identity, history, seed] = args else {
            return Err(format!(
                "operator-worker: expected 6 arguments, got {args:?}"
            ));
        };
        Ok(OperatorArgs {
            kubeconfig: kubeconfig.into(),
            token_file: token_file.into(),
            servers: servers.split(',').map(str::to_string).collect(),
            identity: identity.clone(),
            history: history.into(),
            seed: seed
                .parse()
                .map_err(|e| format!("operator-worker seed {seed:?}: {e}"))?,
        })
    }
}

/// The kubeconfig's cluster, authenticated as the service account.
async fn account_config(args: &OperatorArgs) -> Config {
    let kc = Kubeconfig::read_from(&args.kubeconfig)
        .unwrap_or_else(|e| panic!("reading {}: {e}", args.kubeconfig.display()));
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let token = std::fs::read_to_string(&args.token_file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", args.token_file.display()));
    config.auth_info = AuthInfo {
        token: Some(token.trim().to_string().into()),
        ..Default::default()
    };
    config
}

pub async fn run(args: OperatorArgs) {
    let config = account_config(&args).await;
    let claims = Client::try_from(config.clone()).expect("client");
    // Renewals and releases go into the history: the timing contract judges this
    // Lease too. The claim client is not stamped (a candidate's claims carry no token).
    let claims = crate::renewals::recording(claims, &args.history, &args.identity);
    let leases = LeaseClient::new(claims, OPERATOR_NAMESPACE);
    let servers: Vec<http::Uri> = args
        .servers
        .iter()
        .map(|s| s.parse().expect("a server's base URL"))
        .collect();
    let fence = loop {
        match Fence::new(config.clone(), OPERATOR_NAMESPACE, OPERATOR_LEASE).await {
            Ok(fence) => break fence,
            Err(e) => eprintln!("{}: {e}", args.identity),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let fence = fence
        .with_servers(servers)
        .with_confirm_timeout(CONFIRM_TIMEOUT);
    // Stamps whatever token the fence holds: after a lost term, still that term's.
    let kept = fence.client().expect("a stamped client");
    let writer = Writer {
        identity: args.identity.clone(),
        history: Arc::new(Mutex::new(
            Recorder::create(&args.history).expect("creating the history file"),
        )),
        seq: Arc::default(),
    };
    let mut rng = Rng::new(args.seed);
    loop {
        let rounds = rng.range(TERM_ROUNDS.0, TERM_ROUNDS.1);
        let term_rng = Rng::new(rng.next_u64());
        let options = AcquireOptions {
            identity: Some(args.identity.clone()),
            pod: PodBinding::None,
            timeout: Some(Duration::from_secs(30)),
            slot: None,
        };
        let outcome = run_while_leading(&leases, &fence, options, |client| {
            let token = fence.token() as u64;
            println!("{}: leading with token {token}", args.identity);
            writer.clone().term(client, token, rounds, term_rng)
        })
        .await;
        match outcome {
            Ok(Led::Finished(())) => {}
            Ok(Led::Lost(reason)) => {
                let token = fence.token() as u64;
                println!(
                    "{}: term of token {token} lost ({reason:?}); one more round with it",
                    args.identity
                );
                writer.round(&kept, token).await;
            }
            Err(e) => eprintln!("{}: {e}", args.identity),
        }
        tokio::time::sleep(rng.millis(0, 300)).await;
    }
}

/// Writes to the operator's objects and records each write.
#[derive(Clone)]
struct Writer {
    identity: String,
    history: Arc<Mutex<Recorder>>,
    /// Shared with the rounds' tasks, which may outlive their term.
    seq: Arc<AtomicU64>,
}

impl Writer {
    /// `rounds` rounds with `token`, 100 to 300 ms apart.
    async fn term(self, client: Client, token: u64, rounds: u64, mut rng: Rng) {
        for _ in 0..rounds {
            let (writer, client) = (self.clone(), client.clone());
            // Spawned: a lost term drops this future, not the task, whose writes still go
            // out (with the old token, since the client stamps the term's).
            let _ = tokio::spawn(async move { writer.round(&client, token).await }).await;
            tokio::time::sleep(rng.millis(100, 300)).await;
        }
    }

    /// One write to each object: a merge patch of the ConfigMap's data and a strategic
    /// merge patch of the Deployment's status (its condition, merged by type). Each
    /// names a new `seq`, so each is a change: a new version of the object.
    async fn round(&self, client: &Client, token: u64) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
        let data = json!({"data": {"worker": self.identity, "token": token.to_string(),
                                   "seq": seq.to_string()}});
        let start_ns = now_ns();
        let result = timed(configmaps.patch(
            STATE_CONFIGMAP,
            &PatchParams::default(),
            &Patch::Merge(&data),
        ))
        .await
        .map(|cm| cm.resource_version());
        self.record(state_object(), token, seq, start_ns, result);

        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
        let status = json!({"status": {"conditions": [{
            "type": CONDITION, "status": "True", "reason": "Written",
            "message": condition_message(token, &self.identity, seq),
        }]}});
        let start_ns = now_ns();
        let result = timed(deployments.patch_status(
            TARGET_DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Strategic(&status),
        ))
        .await
        .map(|d| d.resource_version());
        self.record(status_object(), token, seq, start_ns, result);
    }

    fn record(
        &self,
        object: String,
        token: u64,
        seq: u64,
        start_ns: u64,
        result: Result<Option<String>, kube::Error>,
    ) {
        let end_ns = now_ns();
        let (outcome, rv, detail) = match result {
            Ok(rv) => (
                Outcome::Accepted,
                rv.and_then(|rv| rv.parse().ok()),
                String::new(),
            ),
            // The operators policy's refusals name the fencing token; any other 403
            // (authorization) is no verdict of the fence.
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("fencing token") => {
                (Outcome::Stale, None, e.message)
            }
            Err(e) => (Outcome::Error, None, e.to_string()),
        };
        self.history
            .lock()
            .expect("not poisoned")
            .record(&Event::OperatorWrite {
                worker: self.identity.clone(),
                token,
                object,
                seq,
                start_ns,
                end_ns,
                outcome,
                rv,
                detail,
            });
    }
}
