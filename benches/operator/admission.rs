//! The admission policy's cost to one write (module docs of main.rs, part 2).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use palisade::operator::TokenCell;
use palisade::operator::{Fence, Outcome, run_while_leading, stamped_client};
use serde_json::json;

use super::schema::{
    Figure, Latency, OPERATOR_ADMISSION_ADDED, OPERATOR_ADMISSION_CONFIGS,
    OPERATOR_ADMISSION_NO_POLICY_DIFFERENCE, OPERATOR_SCENARIOS,
};
use super::setup::{NAMED, NOT_NAMED, Setup, TARGET};
use super::{ms, percentile};

/// Rounds before the measured ones: connections, caches and the policy's compiled
/// expressions warm.
const WARMUP: usize = 50;
/// The longest wait for the API server to drop the uninstalled policy.
const POLICY_GONE_LIMIT: Duration = Duration::from_secs(60);

pub struct Run {
    pub latency: Vec<Latency>,
    pub figures: Vec<Figure>,
}

/// A client of `config` stamped with `token` for `username`, built as
/// `Fence::client` builds the leader's, so that both accounts send the same request.
fn stamped(config: Config, username: &str, token: i64) -> Result<Client, String> {
    stamped_client(config, username, TokenCell::fixed(token)).map_err(|e| e.to_string())
}

/// One merge patch of the target's data, timed from the send to the answer.
async fn write(api: &Api<ConfigMap>, seq: u64) -> Result<f64, kube::Error> {
    let patch = json!({"data": {"seq": seq.to_string()}});
    let start = Instant::now();
    api.patch(TARGET, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(ms(start.elapsed()))
}

/// The samples of one pass: each account's writes, and per round the first's less
/// the second's.
struct Pass {
    first: Vec<f64>,
    second: Vec<f64>,
    differences: Vec<f64>,
}

/// `rounds` after [`WARMUP`], each one write by `first` and one by `second`, which
/// goes first alternating round by round, one write in flight.
async fn alternate(
    first: &Api<ConfigMap>,
    second: &Api<ConfigMap>,
    rounds: usize,
    seq: &mut u64,
) -> Result<Pass, String> {
    let mut pass = Pass {
        first: Vec::with_capacity(rounds),
        second: Vec::with_capacity(rounds),
        differences: Vec::with_capacity(rounds),
    };
    for round in 0..WARMUP + rounds {
        let mut took = [0.0; 2];
        for turn in 0..2 {
            let which = (round + turn) % 2;
            *seq += 1;
            took[which] = write([first, second][which], *seq)
                .await
                .map_err(|e| format!("write {seq} by account {}: {e}", which + 1))?;
        }
        if round >= WARMUP {
            pass.first.push(took[0]);
            pass.second.push(took[1]);
            pass.differences.push(took[0] - took[1]);
        }
    }
    Ok(pass)
}

pub async fn run(setup: &Setup, rounds: usize) -> Result<Run, String> {
    let named = setup.config_of(NAMED).await?;
    let other = setup.config_of(NOT_NAMED).await?;
    LeaseClient::from_config(setup.config.clone(), Some(&setup.ns))
        .map_err(|e| e.to_string())?
        .ensure_lease(NAMED, 15)
        .await
        .map_err(|e| e.to_string())?;
    let leases =
        LeaseClient::from_config(named.clone(), Some(&setup.ns)).map_err(|e| e.to_string())?;
    let fence = Fence::new(named.clone(), &setup.ns, NAMED)
        .await
        .map_err(|e| e.to_string())?;
    // Asked of the API server as the fence asks its own: the same header value.
    let other_user = Fence::new(other.clone(), &setup.ns, NAMED)
        .await
        .map_err(|e| e.to_string())?
        .username()
        .to_string();
    let options = AcquireOptions {
        identity: Some("admission".into()),
        pod: PodBinding::None,
        timeout: Some(Duration::from_secs(60)),
        slot: None,
    };
    let leader = fence.clone();
    let outcome = run_while_leading(&leases, &fence, options, |client| async move {
        measure(
            setup,
            client,
            leader.token(),
            (named, other, &other_user),
            rounds,
        )
        .await
    })
    .await
    .map_err(|e| e.to_string())?;
    match outcome {
        Outcome::Finished(run) => run,
        Outcome::Lost(reason) => Err(format!(
            "the named account's grant ended during the run: {reason:?}"
        )),
    }
}

async fn measure(
    setup: &Setup,
    leader: Client,
    token: i64,
    (named, other, other_user): (Config, Config, &str),
    rounds: usize,
) -> Result<Run, String> {
    let a: Api<ConfigMap> = Api::namespaced(leader, &setup.ns);
    let b: Api<ConfigMap> = Api::namespaced(stamped(other.clone(), other_user, token)?, &setup.ns);
    // The named account without a token: refused while the policy judges it.
    let bare: Api<ConfigMap> = Api::namespaced(
        Client::try_from(named).map_err(|e| e.to_string())?,
        &setup.ns,
    );
    let mut seq = 0;
    if write(&bare, 0).await.is_ok() {
        return Err(format!(
            "a write of {NAMED} without a token was accepted: the operators policy does not judge it"
        ));
    }
    // The other account's accepted even without a token: the policy does not judge it.
    let other_bare: Api<ConfigMap> = Api::namespaced(
        Client::try_from(other.clone()).map_err(|e| e.to_string())?,
        &setup.ns,
    );
    write(&other_bare, 0).await.map_err(|e| {
        format!("a write of {NOT_NAMED} without a token was refused, so something judges it: {e}")
    })?;
    let with = alternate(&a, &b, rounds, &mut seq).await?;

    setup.remove_operators_policy().await?;
    let deadline = Instant::now() + POLICY_GONE_LIMIT;
    while write(&bare, 0).await.is_err() {
        if Instant::now() > deadline {
            return Err(format!(
                "the API server still refuses {NAMED}'s tokenless write {POLICY_GONE_LIMIT:?} after the policy's removal"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let without = alternate(&a, &b, rounds, &mut seq).await?;

    let how = format!(
        "a merge patch of one ConfigMap's data, one in flight, {rounds} rounds after {WARMUP} of \
         warm-up, each one write by each account, which goes first alternating; both accounts \
         stamped with the grant's token {token} (impersonating themselves, the same RBAC)"
    );
    let notes = [
        format!(
            "the account named in policies.operators, through Fence::client while leading: the policy judges it; {how}"
        ),
        format!(
            "an account not named, stamped the same way: the policy's match condition is false; {how}"
        ),
        format!(
            "the named account once the release was upgraded with policies.operators=[] (its tokenless write accepted): no operators policy; {how}"
        ),
        format!("the account not named, no operators policy; {how}"),
    ];
    let samples = [
        with.first.clone(),
        with.second.clone(),
        without.first.clone(),
        without.second.clone(),
    ];
    let latency = OPERATOR_ADMISSION_CONFIGS
        .iter()
        .zip(samples)
        .zip(notes)
        .map(|((config, samples), note)| {
            Latency::of("palisade", config, OPERATOR_SCENARIOS[0], samples, &note)
        })
        .collect();
    let figure = |name: &str, value: f64, note: &str| Figure {
        system: "palisade".into(),
        config: String::new(),
        name: name.into(),
        value,
        unit: "ms".into(),
        note: note.into(),
    };
    let p = percentile;
    let figures = vec![
        figure(
            OPERATOR_ADMISSION_ADDED[0],
            p(&with.first, 0.50) - p(&with.second, 0.50),
            "p50 of the named account's writes less the not-named account's, same run",
        ),
        figure(
            OPERATOR_ADMISSION_ADDED[1],
            p(&with.first, 0.99) - p(&with.second, 0.99),
            "p99 of the named account's writes less the not-named account's, same run",
        ),
        figure(
            OPERATOR_ADMISSION_ADDED[2],
            p(&with.differences, 0.50),
            "median of the per-round differences (named - not named), so drift cancels out",
        ),
        figure(
            OPERATOR_ADMISSION_NO_POLICY_DIFFERENCE,
            p(&without.first, 0.50) - p(&without.second, 0.50),
            "with no operators policy, p50 of the named account's writes less the other's: the noise between the two accounts",
        ),
    ];
    Ok(Run { latency, figures })
}
