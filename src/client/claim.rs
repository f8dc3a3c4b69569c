//! The claim's life: its name, its creation (in a task of its own, so that a
//! cancelled acquire leaves nothing behind), and its deletion, by a [`ClaimGuard`]
//! from the moment this process knows it exists.

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use super::{CLIENT_MANAGER, Error, LeaseClient, call};
use crate::crd::{LeaseClaim, LeaseClaimSpec, PodRef, RENEWED_TOKEN_ANNOTATION};
use crate::kube_error::ApiErrorKind;

/// The longest claim name prefix, as for `generateName` (5 random characters follow).
const MAX_GENERATE_NAME_PREFIX: usize = 58;

/// How long a claim's deletion is retried (each attempt bounded by
/// [`CALL_TIMEOUT`](super::CALL_TIMEOUT)).
const DELETE_LIMIT: Duration = Duration::from_secs(10);

impl LeaseClient {
    /// Creates the claim in a task of its own: if this future is dropped while the
    /// request is in flight, that task deletes the claim the API server made anyway.
    /// The claim's name is chosen here, not by `generateName`, so that a create whose
    /// response never came (it may have been made all the same) is deleted by name.
    pub(super) async fn create_claim(&self, claim: LeaseClaim) -> Result<LeaseClaim, Error> {
        let (created_tx, created_rx) = oneshot::channel();
        let claims = self.claims.clone();
        self.cleanup.spawn(async move {
            let name = claim.name_any();
            let created = call(
                || format!("creating claim {name}"),
                claims.create(&post_params(), &claim),
            )
            .await;
            let timed_out = matches!(created, Err(Error::Unresponsive { .. }));
            let orphan_uid = match created_tx.send(created) {
                // Timed out: it may exist all the same. Its UID is unknown, but the name is ours.
                _ if timed_out => String::new(),
                // The caller has the claim (and a guard for it), or it was never made.
                Ok(()) | Err(Err(_)) => return,
                // The caller is gone: nobody else will delete it.
                Err(Ok(orphan)) => orphan.uid().unwrap_or_default(),
            };
            log_delete_failure(&name, delete_claim(&claims, &name, &orphan_uid).await);
        });
        // The task only fails to send when its runtime shuts down.
        created_rx.await.unwrap_or_else(|_| {
            Err(Error::Api(kube::Error::Service(
                "the runtime shut down while creating the claim".into(),
            )))
        })
    }
}

/// Deletes a claim when dropped while armed: from then on no code path of this
/// process leaks it, cancellation included.
pub(super) struct ClaimGuard {
    pub(super) claims: Api<LeaseClaim>,
    pub(super) name: String,
    pub(super) uid: String,
    cleanup: TaskTracker,
    armed: bool,
}

impl ClaimGuard {
    /// The guard of the claim `created`, armed.
    pub(super) fn new(claims: Api<LeaseClaim>, created: &LeaseClaim, cleanup: TaskTracker) -> Self {
        ClaimGuard {
            claims,
            name: created.name_any(),
            uid: created.uid().unwrap_or_default(),
            cleanup,
            armed: true,
        }
    }

    pub(super) async fn delete(mut self) -> Result<(), Error> {
        self.armed = false;
        delete_claim(&self.claims, &self.name, &self.uid).await
    }

    pub(super) async fn delete_or_warn(self) {
        let name = self.name.clone();
        log_delete_failure(&name, self.delete().await);
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (claims, name, uid) = (self.claims.clone(), self.name.clone(), self.uid.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.cleanup.spawn_on(
                    async move { log_delete_failure(&name, delete_claim(&claims, &name, &uid).await) },
                    &runtime,
                );
            }
            Err(_) => tracing::warn!(
                claim = %self.name,
                "no async runtime to delete the claim; it stays until its lease expires"
            ),
        }
    }
}

/// Deletes the claim with this UID (not a namesake created since; an empty UID:
/// whatever has the name); gone already is fine. Retried on transient errors and
/// unanswered attempts, for at most [`DELETE_LIMIT`].
async fn delete_claim(claims: &Api<LeaseClaim>, name: &str, uid: &str) -> Result<(), Error> {
    let params = DeleteParams {
        preconditions: (!uid.is_empty()).then(|| Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let attempt = || async {
        match call(
            || format!("deleting claim {name}"),
            claims.delete(name, &params),
        )
        .await
        {
            Ok(_) => Ok(()),
            // Not found: gone; a conflict: the UID precondition failed, so this claim is gone too.
            Err(e)
                if matches!(
                    e.api_kind(),
                    Some(ApiErrorKind::NotFound | ApiErrorKind::Conflict)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    };
    let retried = attempt
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(2))
                .with_max_times(6)
                .with_jitter(),
        )
        .when(Error::is_transient);
    match tokio::time::timeout(DELETE_LIMIT, retried).await {
        Ok(result) => result,
        Err(_) => Err(Error::Unresponsive {
            what: format!("deleting claim {name}"),
            after: DELETE_LIMIT,
        }),
    }
}

fn log_delete_failure(claim: &str, result: Result<(), Error>) {
    if let Err(e) = result {
        tracing::warn!(%claim, error = %e, "could not delete the claim; it stays until its lease expires");
    }
}

/// One merge patch of the claim's `spec.renewTime` to now: a holder's renewal of the
/// grant with `token`, or a waiter's early confirmation (no token: it has seen no
/// grant). The UID makes the patch fail (422: immutable) on another object of the
/// same name. The token says the renewal is of a grant this process has seen
/// ("Expiry is one write", in the controller's `index::holder`), so a waiter never
/// sends one. Returns the claim as the API server wrote it.
pub(super) async fn touch(
    claims: &Api<LeaseClaim>,
    name: &str,
    uid: &str,
    token: Option<i64>,
) -> kube::Result<LeaseClaim> {
    let mut metadata = serde_json::json!({"uid": uid});
    if let Some(token) = token {
        metadata["annotations"] = serde_json::json!({RENEWED_TOKEN_ANNOTATION: token.to_string()});
    }
    let patch = serde_json::json!({
        "metadata": metadata,
        "spec": {"renewTime": MicroTime(Timestamp::now())},
    });
    let params = PatchParams {
        field_manager: Some(CLIENT_MANAGER.to_string()),
        ..PatchParams::default()
    };
    claims.patch(name, &params, &Patch::Merge(&patch)).await
}

pub(super) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(CLIENT_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// A claim named `{lease}-{identity}-{5 random characters}`, like `generateName`
/// would, but chosen here (see [`LeaseClient::create_claim`]); for that one `slot` of
/// a semaphore, or (None) any slot.
pub(super) fn new_claim(
    lease: &str,
    identity: &str,
    pod: Option<(String, String)>,
    slot: Option<i32>,
) -> LeaseClaim {
    let slug = name_slug(identity);
    let mut prefix = if slug.is_empty() {
        format!("{lease}-")
    } else {
        format!("{lease}-{slug}-")
    };
    prefix.truncate(MAX_GENERATE_NAME_PREFIX);
    LeaseClaim {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}{}", random_suffix())),
            owner_references: pod.as_ref().map(|(name, uid)| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: name.clone(),
                    uid: uid.clone(),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: LeaseClaimSpec {
            lease_name: lease.to_string(),
            holder_identity: identity.to_string(),
            pod: pod.map(|(name, uid)| PodRef {
                name,
                uid: Some(uid),
            }),
            slot,
            renew_time: None,
        },
        status: None,
    }
}

/// 5 characters from the API server's own `generateName` alphabet (no vowels, no
/// look-alikes). From std's randomly seeded hasher: these names need to be unlikely
/// to collide, not unpredictable, and a collision is a 409, not a shared claim.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut n = hasher.finish();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// `identity` as a piece of an object name: lowercase letters, digits and single dashes.
fn name_slug(identity: &str) -> String {
    let mut slug = String::with_capacity(identity.len());
    for c in identity.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_are_lease_identity_and_a_random_suffix() {
        let claim = new_claim("billing", "Worker_0.example", None, None);
        let name = claim.metadata.name.unwrap();
        assert_eq!(name.len(), "billing-worker-0-example-".len() + 5, "{name}");
        assert!(name.starts_with("billing-worker-0-example-"), "{name}");
        assert_eq!(claim.spec.holder_identity, "Worker_0.example");
        assert!(claim.spec.pod.is_none() && claim.metadata.owner_references.is_none());
        assert_eq!(claim.spec.slot, None, "any slot");

        let long = "x".repeat(300);
        let claim = new_claim("billing", &long, None, None);
        assert_eq!(
            claim.metadata.name.unwrap().len(),
            MAX_GENERATE_NAME_PREFIX + 5
        );
        let claim = new_claim("billing", "!!!", None, None);
        let name = claim.metadata.name.unwrap();
        assert!(name.starts_with("billing-") && name.len() == 13, "{name}");
    }

    #[test]
    fn a_pod_bound_claim_names_the_pod_and_is_owned_by_it() {
        let claim = new_claim("l", "w", Some(("w-0".into(), "uid-1".into())), None);
        let pod = claim.spec.pod.unwrap();
        assert_eq!(
            (pod.name.as_str(), pod.uid.as_deref()),
            ("w-0", Some("uid-1"))
        );
        let owner = &claim.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "w-0", "uid-1")
        );
    }

    #[test]
    fn a_claim_for_one_slot_asks_for_it_in_its_spec() {
        let claim = new_claim("l", "w", None, Some(2));
        assert_eq!(claim.spec.slot, Some(2));
        let json = serde_json::to_value(&claim.spec).unwrap();
        assert_eq!(json["slot"], 2);
        let any = serde_json::to_value(&new_claim("l", "w", None, None).spec).unwrap();
        assert!(
            any.get("slot").is_none(),
            "no slot field for any slot: {any}"
        );
    }
}
