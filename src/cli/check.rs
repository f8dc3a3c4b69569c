//! `palisade check`: an installation, checked the way a workload meets it. A Lease is
//! granted with a fencing token; the object-fencing policy refuses a write with a lower
//! token; and, run in a pod, the claim-identity policy refuses a claim posing as another
//! pod. The chart's `helm test` runs it.
//!
//! The API server enforces a new ValidatingAdmissionPolicy only seconds after it is
//! created (it compiles policies in the background), so each policy probe is repeated
//! until it is refused or `--policy-wait` runs out; the report says how long it took.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Threads, block_on, init_logging, parse_duration};
use crate::client::{self, AcquireOptions, LeaseClient};
use crate::crd::{
    DEFAULT_LEASE_DURATION_SECONDS, FENCED_BY_LABEL, FENCING_TOKEN_ANNOTATION, LeaseClaim,
    LeaseClaimSpec, PodRef,
};

/// The annotation a fenced write changes when its token does not (see the chart's
/// object-fencing policy).
const WRITE_ID_ANNOTATION: &str = "palisade.dev/write-id";
/// The pod a posing claim names; no pod has this name (the probe's claim is refused).
const OTHER_POD: &str = "palisade-check-not-this-pod";
const FIELD_MANAGER: &str = "palisade-check";

/// Check the installation: a Lease is granted a fencing token, and the admission
/// policies refuse a stale write and a claim posing as another pod.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Namespace [default: $POD_NAMESPACE, else the kubeconfig's namespace].
    #[arg(short = 'n', long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// The Lease to take (created when missing). A ConfigMap `<lease>-check` is written
    /// and deleted again.
    #[arg(long, default_value = "palisade-check")]
    pub lease: String,

    /// Fail when the Lease is not granted within this long (e.g. 30s, 2m).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// How long each admission policy may take to refuse its probe.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub policy_wait: Duration,
}

/// Why `palisade check` failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("no Kubernetes client configuration (KUBECONFIG or in-cluster): {0}")]
    NoConfig(kube::Error),
    #[error("{doing}: {error}")]
    Client { doing: String, error: client::Error },
    #[error("{doing}: {error}")]
    Api { doing: String, error: kube::Error },
    #[error(
        "the {policy} policy accepted {what} for {waited:?}: it is not enforced in namespace \
         {namespace} (installed with policies.{value}.enabled=true, and \
         policies.namespaceSelector selecting this namespace?)"
    )]
    NotEnforced {
        policy: &'static str,
        what: String,
        waited: Duration,
        value: &'static str,
        namespace: String,
    },
}

pub fn run(args: CheckArgs) -> ExitCode {
    init_logging("warn", false);
    block_on("check", Threads::One, async {
        match check(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("palisade check: FAILED: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn check(args: CheckArgs) -> Result<(), CheckError> {
    let leases = LeaseClient::try_default(args.namespace.as_deref())
        .await
        .map_err(CheckError::NoConfig)?;
    let ns = leases.namespace().to_string();
    let lease = args.lease.as_str();
    let failed = |doing: String| move |error| CheckError::Client { doing, error };
    leases
        .ensure_lease(lease, DEFAULT_LEASE_DURATION_SECONDS)
        .await
        .map_err(failed(format!("creating lease {ns}/{lease}")))?;
    let started = Instant::now();
    let options = AcquireOptions {
        timeout: Some(args.timeout),
        ..AcquireOptions::default()
    };
    let grant = leases
        .acquire(lease, options)
        .await
        .map_err(failed(format!("taking lease {ns}/{lease}")))?;
    println!(
        "ok: lease {ns}/{lease} granted to {} with fencing token {} in {:.1}s",
        grant.identity(),
        grant.token(),
        started.elapsed().as_secs_f64()
    );
    let kube = leases.leases().clone().into_client();
    let probes = async {
        let configmaps = Api::<ConfigMap>::namespaced(kube.clone(), &ns);
        stale_write_refused(&configmaps, &ns, lease, grant.token(), args.policy_wait).await?;
        posing_claim_refused(&Api::namespaced(kube, &ns), &ns, lease, args.policy_wait).await
    }
    .await;
    let released = grant.release().await;
    leases.flush(Duration::from_secs(5)).await;
    probes?;
    released.map_err(failed(format!("releasing lease {ns}/{lease}")))
}

/// Writes a ConfigMap fenced by `lease` with the current token, then the same with a
/// lower token until the object-fencing policy refuses it; then takes the object out of
/// fencing (removing the label is a fenced write: it needs the current token) and
/// deletes it.
async fn stale_write_refused(
    configmaps: &Api<ConfigMap>,
    namespace: &str,
    lease: &str,
    token: i64,
    wait: Duration,
) -> Result<(), CheckError> {
    let name = format!("{lease}-check");
    let name = name.as_str();
    let write = |token: i64, fenced: bool| {
        let mut labels = json!({});
        if fenced {
            labels[FENCED_BY_LABEL] = json!(lease);
        }
        let object = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels, "annotations": {
                FENCING_TOKEN_ANNOTATION: token.to_string(),
                WRITE_ID_ANNOTATION: write_id(),
            }},
            "data": {"written-with-token": token.to_string()},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        async move { configmaps.patch(name, &params, &Patch::Apply(object)).await }
    };
    let api = |doing: String| move |error| CheckError::Api { doing, error };
    write(token, true).await.map_err(api(format!(
        "writing ConfigMap {name} with the current token {token}"
    )))?;
    let stale = token - 1;
    let refused = until_refused(wait, || write(stale, true), || write(token, true)).await;
    let cleanup = async {
        write(token, false).await?;
        configmaps.delete(name, &DeleteParams::default()).await
    };
    let cleaned = cleanup.await;
    let (after, message) = refused.map_err(|e| match e {
        Probe::Accepted(waited) => CheckError::NotEnforced {
            policy: "object-fencing",
            what: format!("a write of ConfigMap {name} with the stale token {stale}"),
            waited,
            value: "fencing",
            namespace: namespace.to_string(),
        },
        Probe::Failed(error) => api(format!("writing ConfigMap {name} with token {stale}"))(error),
    })?;
    println!(
        "ok: object fencing refused a write with the stale token {stale} (after {:.1}s): {message}",
        after.as_secs_f64()
    );
    cleaned.map(|_| ()).map_err(api(format!(
        "taking ConfigMap {name} out of fencing and deleting it"
    )))
}

/// Creates a claim on `lease` for another pod until the claim-identity policy refuses
/// it. The policy judges pods' requests only: outside a pod there is nothing to check.
async fn posing_claim_refused(
    claims: &Api<LeaseClaim>,
    namespace: &str,
    lease: &str,
    wait: Duration,
) -> Result<(), CheckError> {
    if std::env::var_os("POD_NAME").is_none() {
        println!(
            "not checked: claim identity (it judges pods' requests; this is not a pod: POD_NAME is not set)"
        );
        return Ok(());
    }
    let name = format!("{lease}-{OTHER_POD}");
    let claim = LeaseClaim::new(
        &name,
        LeaseClaimSpec {
            slot: None,
            lease_name: lease.to_string(),
            holder_identity: OTHER_POD.to_string(),
            pod: Some(PodRef {
                name: OTHER_POD.to_string(),
                uid: None,
            }),
            renew_time: None,
        },
    );
    let create = || async { claims.create(&PostParams::default(), &claim).await };
    let undo = || async { claims.delete(&name, &DeleteParams::default()).await };
    match until_refused(wait, create, undo).await {
        Ok((after, message)) => {
            println!(
                "ok: claim identity refused a claim for pod {OTHER_POD} (after {:.1}s): {message}",
                after.as_secs_f64()
            );
            Ok(())
        }
        Err(Probe::Accepted(waited)) => Err(CheckError::NotEnforced {
            policy: "claim-identity",
            what: format!("a claim on lease {lease} for pod {OTHER_POD}"),
            waited,
            value: "claimIdentity",
            namespace: namespace.to_string(),
        }),
        Err(Probe::Failed(error)) => Err(CheckError::Api {
            doing: format!("creating claim {name}"),
            error,
        }),
    }
}

/// How a probe that should be refused ended otherwise.
enum Probe {
    /// Still accepted when the wait ran out.
    Accepted(Duration),
    /// Failed for another reason than an admission policy.
    Failed(kube::Error),
}

/// Runs `probe` until an admission policy refuses it, undoing each accepted attempt.
/// Returns how long that took and the refusal's message.
async fn until_refused<T, U, P, PF, D, DF>(
    wait: Duration,
    probe: P,
    undo: D,
) -> Result<(Duration, String), Probe>
where
    P: Fn() -> PF,
    PF: Future<Output = Result<T, kube::Error>>,
    D: Fn() -> DF,
    DF: Future<Output = Result<U, kube::Error>>,
{
    let started = Instant::now();
    loop {
        match probe().await {
            Err(kube::Error::Api(status)) if refused_by_policy(&status.message) => {
                return Ok((started.elapsed(), status.message));
            }
            Err(error) => return Err(Probe::Failed(error)),
            Ok(_) => {
                undo().await.map_err(Probe::Failed)?;
                if started.elapsed() >= wait {
                    return Err(Probe::Accepted(started.elapsed()));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Whether an API error is a ValidatingAdmissionPolicy's refusal (the API server names
/// the policy and the binding in the message).
fn refused_by_policy(message: &str) -> bool {
    message.contains("ValidatingAdmissionPolicy") && message.contains("denied")
}

/// A value the writer never reuses.
fn write_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("check-{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::refused_by_policy;

    #[test]
    fn a_policy_refusal_is_told_from_other_errors() {
        assert!(refused_by_policy(
            "configmaps \"x\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: stale token"
        ));
        assert!(!refused_by_policy(
            "configmaps \"x\" is forbidden: User \"u\" cannot patch"
        ));
    }
}
