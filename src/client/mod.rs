//! The client side of a palisade Lease, for applications: ask for the lease, wait
//! for the grant, hold it while working, give it back. Needs no controller in
//! this process, only API access to `leases` and `leaseclaims`.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), palisade::client::Error> {
//! use palisade::client::{AcquireOptions, LeaseClient};
//! let leases = LeaseClient::new(client, "payments");
//! let grant = leases.acquire("billing-cron", AcquireOptions::default()).await?;
//! let token = grant.token(); // pass it along with every write to the protected resource
//! tokio::select! {
//!     reason = grant.lost() => eprintln!("lost the lease: {reason}"),
//!     _ = async { /* the work, fenced with `token` */ } => {}
//! }
//! grant.release().await?;
//! # Ok(()) }
//! ```
//!
//! How it keeps the contract (DESIGN.md, "Client side" and "Client library"):
//!
//! - The authority is `Lease.status` (rule 1): a claim holds the lease exactly
//!   when `status.holder.claimUID` is its UID, and the token is
//!   `status.fencingToken`. The claim's status is only read for *why* a grant ended.
//! - Waiting for the grant and noticing its loss use watches, never polling (rule 5).
//! - Renewal is one merge patch of the claim's `spec.renewTime` (rule 4) every
//!   third of `leaseDurationSeconds`, and the grant is given up on this process's
//!   own clock (`CLOCK_BOOTTIME`, `src/client/clock.rs`) before the controller can
//!   hand the lease on: the rule and its proof are DESIGN.md, "Client deadlines".
//!   [`LeaseClient::acquire`] returns a grant only once a first renewal, sent as soon
//!   as the grant is seen, has counted: a watch that resumed late may replay a grant
//!   the controller has already ended, and only a response from the API server
//!   now tells. That renewal must count within a third of a duration of seeing the
//!   grant, or the acquire fails.
//! - A claim is never left behind by this process: acquiring arms a guard that
//!   deletes the claim if the acquire fails, times out or is cancelled (its future
//!   dropped, even while the create request is in flight), and a [`Grant`] deletes
//!   its claim on [`Grant::release`] or drop. Deletes that had to be spawned from
//!   `Drop` are tracked; call [`LeaseClient::flush`] before the process exits to let
//!   them finish. (A process that is killed outright leaves its claim: a pending
//!   one waits in the queue, and once granted it expires after one lease duration.)

pub(crate) mod clock;
mod object_watch;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use clock::{BootInstant, BootTimer};
use object_watch::{Events, watch_one};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{
    ClaimPhase, Lease, LeaseClaim, LeaseClaimSpec, LeaseSpec, MAX_LEASE_DURATION_SECONDS, PodRef,
};
use crate::api_error::ApiErrorKind;
use crate::conditions::lost;

/// Field manager of the writes made by this library.
pub const CLIENT_MANAGER: &str = "palisade-client";

/// The longest claim name prefix, as for `generateName` (5 random characters follow).
const MAX_GENERATE_NAME_PREFIX: usize = 58;

/// The deadline of every single API request this library makes (a claim's create,
/// renewal patch or delete, a Lease's create, the status reads), so that a
/// connection that dies silently (no FIN, no RST) costs at most this long: the
/// request is abandoned with its connection, and a retry opens a new one. Watches
/// are bounded by their server-side timeout instead (`object_watch`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The server-side timeout of the watch a waiter learns of its grant from: a watch
/// that died silently is noticed within this plus `object_watch::SILENCE_MARGIN` (2 s),
/// so a waiter whose connection died sees its grant within about 7 s. Each waiter's
/// quiet watch costs one request per period.
pub const GRANT_WATCH_TIMEOUT_SECS: u32 = 5;

/// The server-side timeout of every other watch: a holder's (its renewals, each under
/// [`CALL_TIMEOUT`] and judged on the claim they return, notice an ended grant without
/// them) and a waiter's watch of its own claim (which only ends the wait early).
pub const QUIET_WATCH_TIMEOUT_SECS: u32 = 60;

/// How long a claim's deletion is retried (each attempt bounded by [`CALL_TIMEOUT`]).
const DELETE_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("lease {lease} was not granted within {timeout:?}")]
    Timeout { lease: String, timeout: Duration },
    #[error("claim {claim} on lease {lease} ended before it was granted: {reason}")]
    NotGranted {
        lease: String,
        claim: String,
        reason: LostReason,
    },
    #[error("the watch on lease {lease} ended unexpectedly")]
    WatchEnded { lease: String },
    #[error("{what}: no response from the API server within {after:?}")]
    Unresponsive { what: String, after: Duration },
    #[error("cannot set up the deadline timer (CLOCK_BOOTTIME timerfd): {0}")]
    Clock(#[source] std::io::Error),
}

impl Error {
    /// What the API server's answer means, when this is one.
    pub fn api_kind(&self) -> Option<ApiErrorKind> {
        match self {
            Error::Api(e) => Some(ApiErrorKind::of(e)),
            _ => None,
        }
    }

    /// Worth another attempt: a transient API failure, or no answer in time.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api(e) => ApiErrorKind::of(e).is_transient(),
            Error::Unresponsive { .. } => true,
            _ => false,
        }
    }
}

/// `fut`, or [`Error::Unresponsive`] naming `what` after [`CALL_TIMEOUT`].
pub(crate) async fn call<T>(
    what: impl FnOnce() -> String,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(Error::Unresponsive {
            what: what(),
            after: CALL_TIMEOUT,
        }),
    }
}

/// Why a grant ended, as far as this process can tell. The first signal to arrive wins:
/// the controller writes the Lease before it mirrors the outcome into the claim, so a
/// revocation is often seen as [`LostReason::Superseded`] first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The controller revoked the grant (claim phase `Revoked`): the claim's pod is
    /// gone or terminal, the Lease was deleted, or a later grant superseded it.
    Revoked,
    /// The controller observed no renewal within the lease duration (claim phase `Expired`).
    Expired,
    /// `Lease.status` names another holder, or none.
    Superseded,
    /// The Lease was deleted.
    LeaseDeleted,
    /// The claim was deleted, by someone other than this [`Grant`].
    ClaimDeleted,
    /// No renewal succeeded in time, so this process gave up on its own clock,
    /// before the controller could expire the grant.
    LocalDeadline,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Revoked => lost::REVOKED,
            LostReason::Expired => lost::EXPIRED,
            LostReason::Superseded => lost::SUPERSEDED,
            LostReason::LeaseDeleted => lost::LEASE_DELETED,
            LostReason::ClaimDeleted => lost::CLAIM_DELETED,
            LostReason::LocalDeadline => lost::LOCAL_DEADLINE,
        })
    }
}

/// Which pod a claim belongs to. A claim bound to a pod loses its grant as soon as
/// that pod is gone or terminal, and is garbage-collected with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PodBinding {
    /// This pod, when both `POD_NAME` and `POD_UID` are set (downward API); else none.
    #[default]
    FromEnv,
    /// Not bound to a pod.
    None,
    /// Bound to the named pod.
    Pod { name: String, uid: String },
}

impl PodBinding {
    fn resolve(&self) -> Option<(String, String)> {
        match self {
            PodBinding::FromEnv => {
                let name = non_empty_env("POD_NAME")?;
                let uid = non_empty_env("POD_UID")?;
                Some((name, uid))
            }
            PodBinding::None => None,
            PodBinding::Pod { name, uid } => Some((name.clone(), uid.clone())),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AcquireOptions {
    /// `spec.holderIdentity`; default: env `POD_NAME`, else the host name.
    pub identity: Option<String>,
    /// The pod the claim belongs to; default: [`PodBinding::FromEnv`].
    pub pod: PodBinding,
    /// Give up when not granted within this long ([`Error::Timeout`]); the claim is
    /// deleted before `acquire` returns. Default: wait for as long as it takes.
    pub timeout: Option<Duration>,
}

/// The holder identity used when none is given: the pod name, else the host name.
pub fn default_identity() -> String {
    non_empty_env("POD_NAME")
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
        .or_else(|| non_empty_env("HOSTNAME"))
        .unwrap_or_else(|| "palisade-client".to_string())
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Leases and claims of one namespace.
#[derive(Clone)]
pub struct LeaseClient {
    namespace: String,
    leases: Api<Lease>,
    claims: Api<LeaseClaim>,
    /// Claim creations and the deletions spawned from `Drop`, so that `flush` can wait for them.
    cleanup: TaskTracker,
}

impl LeaseClient {
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            leases: Api::namespaced(client.clone(), namespace),
            claims: Api::namespaced(client, namespace),
            cleanup: TaskTracker::new(),
        }
    }

    /// A client from `KUBECONFIG` (or the in-cluster config), in `namespace` or else
    /// the configuration's default namespace.
    pub async fn try_default(namespace: Option<&str>) -> Result<Self, kube::Error> {
        let client = crate::kube_client::try_default().await?;
        let namespace = namespace
            .map(str::to_string)
            .unwrap_or_else(|| client.default_namespace().to_string());
        Ok(Self::new(client, &namespace))
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn leases(&self) -> &Api<Lease> {
        &self.leases
    }

    pub fn claims(&self) -> &Api<LeaseClaim> {
        &self.claims
    }

    /// Creates the Lease with this duration unless it exists (an existing Lease is left as it is).
    /// Returns whether it was created.
    pub async fn ensure_lease(&self, name: &str, duration_secs: i64) -> Result<bool, Error> {
        let lease = Lease::new(
            name,
            LeaseSpec {
                lease_duration_seconds: duration_secs,
            },
        );
        let created = call(
            || format!("creating lease {name}"),
            self.leases.create(&post_params(), &lease),
        )
        .await;
        match created {
            Ok(_) => Ok(true),
            Err(e) if e.api_kind() == Some(ApiErrorKind::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates a claim on `lease` and waits (watching, not polling) until the Lease
    /// names it as holder. Dropping the returned future deletes the claim.
    pub async fn acquire(&self, lease: &str, options: AcquireOptions) -> Result<Grant, Error> {
        let deadline = options.timeout.map(|t| Instant::now() + t);
        let timed_out = || Error::Timeout {
            lease: lease.to_string(),
            timeout: options.timeout.unwrap_or_default(),
        };
        let identity = options.identity.clone().unwrap_or_else(default_identity);
        let claim = new_claim(lease, &identity, options.pod.resolve());
        let timer = BootTimer::new().map_err(Error::Clock)?;
        let created = until_deadline(deadline, self.create_claim(claim))
            .await
            .ok_or_else(timed_out)??;
        let guard = ClaimGuard {
            claims: self.claims.clone(),
            name: created.name_any(),
            uid: created.uid().unwrap_or_default(),
            cleanup: self.cleanup.clone(),
            armed: true,
        };

        // Watch both before deciding anything: the first event of each is the current state.
        let mut lease_events = watch_one(self.leases.clone(), lease, GRANT_WATCH_TIMEOUT_SECS);
        let mut claim_events =
            watch_one(self.claims.clone(), &guard.name, QUIET_WATCH_TIMEOUT_SECS);
        let waited = until_deadline(
            deadline,
            wait_for_grant(lease, &guard, &mut lease_events, &mut claim_events),
        )
        .await;
        let granted = match waited {
            Some(Ok(granted)) => granted,
            Some(Err(e)) => {
                guard.delete_or_warn().await;
                return Err(e);
            }
            None => {
                // Delete before returning, so that a caller that exits at once leaves nothing behind.
                guard.delete_or_warn().await;
                return Err(timed_out());
            }
        };
        let observed_at = BootInstant::now();
        let status = granted.status.clone().unwrap_or_default();
        // The holder's Lease watch on the slower period: its first event is the Lease
        // now, so nothing since the grant is missed.
        drop(lease_events);
        let lease_events = watch_one(self.leases.clone(), lease, QUIET_WATCH_TIMEOUT_SECS);

        let (lost_tx, lost_rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let (claim, claim_uid) = (guard.name.clone(), guard.uid.clone());
        let (duration_tx, duration_rx) = watch::channel(lease_duration(&granted));
        let (deadline_tx, deadline_rx) =
            watch::channel((observed_at + lease_duration(&granted) / 3).since_boot());
        let keeper = Keeper {
            duration: duration_tx,
            deadline: deadline_tx,
            token: status.fencing_token.unwrap_or_default(),
            guard,
            lost: lost_tx,
            stop: stop.clone(),
            timer,
        };
        let confirmed_at = match keeper.confirm(observed_at).await {
            Ok(sent_at) => {
                keeper
                    .deadline
                    .send_replace((sent_at + keeper.deadline_after_renewal()).since_boot());
                sent_at
            }
            Err(reason) => {
                let claim = keeper.guard.name.clone();
                keeper.guard.delete_or_warn().await;
                return Err(Error::NotGranted {
                    lease: lease.to_string(),
                    claim,
                    reason,
                });
            }
        };
        Ok(Grant {
            namespace: self.namespace.clone(),
            lease: lease.to_string(),
            identity,
            claim,
            claim_uid,
            token: status.fencing_token.unwrap_or_default(),
            lost: lost_rx,
            duration: duration_rx,
            deadline: deadline_rx,
            stop,
            keeper: Some(tokio::spawn(keeper.run(
                confirmed_at,
                lease_events,
                claim_events,
            ))),
            cleanup: self.cleanup.clone(),
        })
    }

    /// Creates the claim in a task of its own: if this future is dropped while the
    /// request is in flight, that task deletes the claim the API server made anyway.
    /// The claim's name is chosen here, not by `generateName`, so that a create whose
    /// response never came (it may have been made all the same) is deleted by name.
    async fn create_claim(&self, claim: LeaseClaim) -> Result<LeaseClaim, Error> {
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

    /// Waits (at most `limit`) for the claim deletions that a dropped [`Grant`] or a
    /// cancelled acquire spawned. Call it before the process exits. Returns whether
    /// they all finished.
    pub async fn flush(&self, limit: Duration) -> bool {
        self.cleanup.close();
        let done = tokio::time::timeout(limit, self.cleanup.wait())
            .await
            .is_ok();
        self.cleanup.reopen();
        done
    }
}

/// A held Lease. Renewed in the background until released, dropped or lost.
pub struct Grant {
    namespace: String,
    lease: String,
    identity: String,
    claim: String,
    claim_uid: String,
    token: i64,
    lost: watch::Receiver<Option<LostReason>>,
    duration: watch::Receiver<Duration>,
    deadline: watch::Receiver<Duration>,
    /// Tells the keeper to stop renewing and delete the claim.
    stop: CancellationToken,
    keeper: Option<JoinHandle<Result<(), Error>>>,
    cleanup: TaskTracker,
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("claim", &self.claim)
            .field("identity", &self.identity)
            .field("token", &self.token)
            .field("lost", &*self.lost.borrow())
            .finish()
    }
}

impl Grant {
    /// The fencing token of this grant: send it with every write to the protected resource.
    pub fn token(&self) -> i64 {
        self.token
    }

    pub fn lease(&self) -> &str {
        &self.lease
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn claim_name(&self) -> &str {
        &self.claim
    }

    pub fn claim_uid(&self) -> &str {
        &self.claim_uid
    }

    /// The lease duration this grant is held under: `leaseDurationSeconds` as the
    /// grant was observed, or a shorter value seen since; an edit never makes it
    /// longer. The local deadline is two thirds of it after the last renewal sent.
    pub fn lease_duration(&self) -> Duration {
        *self.duration.borrow()
    }

    /// Why the grant was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
    }

    /// The local deadline, as a time on `CLOCK_BOOTTIME` (since boot, suspensions
    /// included): unless a renewal counts before it, this process stops believing it
    /// holds the grant then. Later with every renewal that counts, earlier when the
    /// Lease is shortened. For a supervisor that must act even when this process
    /// cannot (`palisade lock`'s watchdog).
    pub fn local_deadline(&self) -> watch::Receiver<Duration> {
        self.deadline.clone()
    }

    /// Whether the grant is held as far as this process knows right now: not lost,
    /// and its local deadline not passed on the clock, which is read here, so the
    /// answer is right even before the keeper has run after a pause.
    pub fn is_held(&self) -> bool {
        self.lost_reason().is_none() && BootInstant::now().since_boot() < *self.deadline.borrow()
    }

    /// Completes when the grant is lost. Does not borrow the grant, so it can be
    /// awaited next to work that uses it.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut lost = self.lost.clone();
        async move {
            match lost.wait_for(Option::is_some).await {
                Ok(reason) => reason.expect("waited for Some"),
                // The keeper is gone without saying why: only when its runtime shut down.
                Err(_) => LostReason::LocalDeadline,
            }
        }
    }

    /// Stops renewing and deletes the claim, which frees the Lease for the next waiter.
    pub async fn release(mut self) -> Result<(), Error> {
        self.stop.cancel();
        match self.keeper.take() {
            Some(keeper) => match keeper.await {
                Ok(deleted) => deleted,
                // The keeper panicked or its runtime is shutting down; the controller expires the claim.
                Err(_) => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        // The keeper deletes the claim when it sees this (see `release`); tracked, for `flush`.
        self.stop.cancel();
        if let (Some(keeper), Ok(runtime)) =
            (self.keeper.take(), tokio::runtime::Handle::try_current())
        {
            self.cleanup.spawn_on(keeper, &runtime);
        }
    }
}

/// Deletes a claim when dropped while armed: from then on no code path of this
/// process leaks it, cancellation included.
struct ClaimGuard {
    claims: Api<LeaseClaim>,
    name: String,
    uid: String,
    cleanup: TaskTracker,
    armed: bool,
}

impl ClaimGuard {
    async fn delete(mut self) -> Result<(), Error> {
        self.armed = false;
        delete_claim(&self.claims, &self.name, &self.uid).await
    }

    async fn delete_or_warn(self) {
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

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(CLIENT_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// A claim named `{lease}-{identity}-{5 random characters}`, like `generateName`
/// would, but chosen here (see [`LeaseClient::create_claim`]).
fn new_claim(lease: &str, identity: &str, pod: Option<(String, String)>) -> LeaseClaim {
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

async fn until_deadline<T>(deadline: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => timeout_at(deadline, fut).await.ok(),
        None => Some(fut.await),
    }
}

fn holds(lease: &Lease, claim_uid: &str) -> bool {
    lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .is_some_and(|h| h.claim_uid == claim_uid)
}

/// The Lease still publishes this claim's grant: the claim as holder, with the token
/// it was granted (a Lease re-created under the name and granted to the same claim
/// would publish another).
fn holds_grant(lease: &Lease, claim_uid: &str, token: i64) -> bool {
    holds(lease, claim_uid) && lease.status.as_ref().and_then(|s| s.fencing_token) == Some(token)
}

/// The duration a holder may rely on: `leaseDurationSeconds`, but never more than the
/// grant was made with (`status.holder.leaseDurationSeconds`, which the controller
/// applies at least), so a spec raised between the grant and this process seeing it
/// is not believed either.
fn lease_duration(lease: &Lease) -> Duration {
    let spec = lease.spec.lease_duration_seconds;
    let granted_with = lease
        .status
        .as_ref()
        .and_then(|s| s.holder.as_ref())
        .and_then(|h| h.lease_duration_seconds);
    let seconds = granted_with.map_or(spec, |g| spec.min(g));
    Duration::from_secs(seconds.clamp(1, MAX_LEASE_DURATION_SECONDS) as u64)
}

/// What the claim itself says about a grant that ended (None: nothing ended).
fn claim_ending(claim: Option<&LeaseClaim>) -> Option<LostReason> {
    let Some(claim) = claim else {
        return Some(LostReason::ClaimDeleted);
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Some(LostReason::ClaimDeleted);
    }
    match claim.status.as_ref().and_then(|s| s.phase)? {
        ClaimPhase::Pending | ClaimPhase::Granted => None,
        ClaimPhase::Expired => Some(LostReason::Expired),
        ClaimPhase::Revoked => Some(LostReason::Revoked),
        ClaimPhase::Released => Some(LostReason::ClaimDeleted),
    }
}

/// Until the Lease names the claim: returns that Lease. A claim that ends first
/// (its pod is gone, someone deleted it) is an error; a missing Lease is waited for.
async fn wait_for_grant(
    lease: &str,
    guard: &ClaimGuard,
    lease_events: &mut Events<Lease>,
    claim_events: &mut Events<LeaseClaim>,
) -> Result<Lease, Error> {
    loop {
        tokio::select! {
            Some(event) = lease_events.next() => match event {
                Ok(Some(l)) if holds(&l, &guard.uid) => return Ok(l),
                Ok(_) => {}
                // Warned: a watch that keeps failing (e.g. forbidden) would otherwise wait silently.
                Err(e) => tracing::warn!(%lease, error = %e, "lease watch error; retrying"),
            },
            Some(event) = claim_events.next() => match event {
                Ok(claim) => {
                    if let Some(reason) = claim_ending(claim.as_ref()) {
                        return Err(Error::NotGranted {
                            lease: lease.to_string(),
                            claim: guard.name.clone(),
                            reason,
                        });
                    }
                }
                Err(e) => tracing::warn!(claim = %guard.name, error = %e, "claim watch error; retrying"),
            },
            else => return Err(Error::WatchEnded { lease: lease.to_string() }),
        }
    }
}

/// The background task of a [`Grant`]: renews, watches for the loss, and deletes
/// the claim when the grant is released or dropped.
struct Keeper {
    /// The lease duration this grant is held under: the one the grant was observed
    /// with, lowered by every shorter one seen since, never raised (DESIGN.md).
    duration: watch::Sender<Duration>,
    /// The grant's fencing token: a renewal counts only when the claim shows this grant.
    token: i64,
    guard: ClaimGuard,
    lost: watch::Sender<Option<LostReason>>,
    /// The local deadline, published for [`Grant::local_deadline`] and [`Grant::is_held`].
    deadline: watch::Sender<Duration>,
    stop: CancellationToken,
    /// Fires at the local deadline, on CLOCK_BOOTTIME.
    timer: BootTimer,
}

impl Keeper {
    async fn run(
        mut self,
        confirmed_at: BootInstant,
        lease_events: Events<Lease>,
        claim_events: Events<LeaseClaim>,
    ) -> Result<(), Error> {
        // The watches end with `hold`: nothing more to learn once the grant is over.
        if let Some(reason) = self.hold(confirmed_at, lease_events, claim_events).await {
            tracing::info!(claim = %self.guard.name, %reason, "grant lost");
            self.lost.send_replace(Some(reason));
            // The claim stays (its status says what happened) until the owner lets go.
            self.stop.cancelled().await;
        }
        self.guard.delete().await
    }

    fn duration(&self) -> Duration {
        *self.duration.borrow()
    }

    /// How long after the send time of its last renewal that counted this holder
    /// stops believing: two thirds of the duration (see the module docs).
    fn deadline_after_renewal(&self) -> Duration {
        self.duration() * 2 / 3
    }

    /// The first renewal, before [`LeaseClient::acquire`] returns: the send time of
    /// one that counted within a third of a duration of `observed_at` (the
    /// controller's clock started at the grant, possibly well before the watch
    /// showed it), or why the grant is not to be believed.
    async fn confirm(&self, observed_at: BootInstant) -> Result<BootInstant, LostReason> {
        let limit = self.duration() / 3;
        let deadline = observed_at + limit;
        match tokio::time::timeout(limit, self.renewal()).await {
            Ok(Ok(sent_at)) if BootInstant::now() < deadline => Ok(sent_at),
            Ok(Ok(_)) | Err(_) => Err(LostReason::LocalDeadline),
            Ok(Err(RenewalError::Ended(reason))) => Err(reason),
            Ok(Err(_)) => Err(LostReason::ClaimDeleted),
        }
    }

    /// Renews until the grant is lost (returns why) or the owner stops it (returns None).
    async fn hold(
        &mut self,
        confirmed_at: BootInstant,
        mut lease_events: Events<Lease>,
        mut claim_events: Events<LeaseClaim>,
    ) -> Option<LostReason> {
        // The send time of the last renewal that counted: the first is the confirmation.
        let mut last_renewal = confirmed_at;
        // When to renew next: only a schedule, so tokio's (monotonic) timers do.
        let mut next_renewal = Instant::now()
            + (confirmed_at + self.duration() / 3).saturating_duration_since(BootInstant::now());
        let mut renewing: Option<BoxFuture<'static, Result<BootInstant, RenewalError>>> = None;
        loop {
            let deadline = last_renewal + self.deadline_after_renewal();
            let since_boot = deadline.since_boot();
            self.deadline
                .send_if_modified(|d| std::mem::replace(d, since_boot) != since_boot);
            // Every wake-up checks the deadline first: after a pause or a suspension
            // it has passed, whatever else is ready.
            if BootInstant::now() >= deadline {
                return Some(LostReason::LocalDeadline);
            }
            if let Err(e) = self.timer.arm(deadline) {
                tracing::error!(claim = %self.guard.name, error = %e, "cannot arm the deadline timer");
                return Some(LostReason::LocalDeadline);
            }
            tokio::select! {
                // Checked first: an overdue deadline wins over a renewal that
                // completes in the same instant.
                biased;
                _ = self.stop.cancelled() => return None,
                _ = self.timer.fired() => {}
                Some(event) = lease_events.next() => match event {
                    Ok(None) => return Some(LostReason::LeaseDeleted),
                    Ok(Some(lease)) if !holds_grant(&lease, &self.guard.uid, self.token) => {
                        return Some(LostReason::Superseded);
                    }
                    // An edit may shorten the duration (the controller may apply it at
                    // once); a longer one is never believed.
                    Ok(Some(lease)) => {
                        let seen = lease_duration(&lease);
                        self.duration.send_if_modified(|d| {
                            let shorter = seen < *d;
                            *d = (*d).min(seen);
                            shorter
                        });
                    }
                    Err(e) => tracing::debug!(claim = %self.guard.name, error = %e, "lease watch error; retrying"),
                },
                Some(event) = claim_events.next() => match event {
                    Ok(claim) => {
                        if let Some(reason) = claim_ending(claim.as_ref()) {
                            return Some(reason);
                        }
                    }
                    Err(e) => tracing::debug!(claim = %self.guard.name, error = %e, "claim watch error; retrying"),
                },
                renewed = async { renewing.as_mut().expect("guarded by is_some").await }, if renewing.is_some() => {
                    renewing = None;
                    match renewed {
                        // Too late counts for nothing: the deadline passing is final.
                        Ok(_) if BootInstant::now() >= deadline => return Some(LostReason::LocalDeadline),
                        Ok(sent_at) => {
                            last_renewal = sent_at;
                            next_renewal = Instant::now()
                                + (sent_at + self.duration() / 3)
                                    .saturating_duration_since(BootInstant::now());
                        }
                        Err(RenewalError::Ended(reason)) => {
                            tracing::warn!(claim = %self.guard.name, %reason, "a renewal found the grant ended");
                            return Some(reason);
                        }
                        Err(e) => {
                            tracing::warn!(claim = %self.guard.name, error = %e, "renewal refused: the claim is gone");
                            return Some(LostReason::ClaimDeleted);
                        }
                    }
                }
                _ = sleep_until(next_renewal), if renewing.is_none() => {
                    renewing = Some(self.renewal().boxed());
                }
            }
        }
    }

    /// One renewal, retried on any failure except "this claim is gone" (see
    /// [`ApiErrorKind`]): not found, or a conflict or invalid (409/422) when the name now
    /// belongs to another object (the UID in the patch cannot change),
    /// and except a response that shows the grant ended. Returns the send time of the
    /// attempt that succeeded: the retries never extend the deadline, only a success
    /// does, and a success is a response that shows this claim's grant not ended
    /// ([`judge_renewal`]). Each attempt is bounded, so one hung request
    /// cannot use up the whole deadline.
    fn renewal(&self) -> impl Future<Output = Result<BootInstant, RenewalError>> + Send + 'static {
        let claims = self.guard.claims.clone();
        let name = self.guard.name.clone();
        let uid = self.guard.uid.clone();
        let token = self.token;
        let attempt_limit = (self.duration() / 6).min(CALL_TIMEOUT);
        let attempt = move || {
            let (claims, name, uid) = (claims.clone(), name.clone(), uid.clone());
            async move {
                let sent_at = BootInstant::now();
                // The UID makes the patch fail (422: immutable) on another object of the same name.
                let patch = serde_json::json!({
                    "metadata": {"uid": uid},
                    "spec": {"renewTime": MicroTime(Timestamp::now())},
                });
                let params = PatchParams {
                    field_manager: Some(CLIENT_MANAGER.to_string()),
                    ..PatchParams::default()
                };
                match tokio::time::timeout(
                    attempt_limit,
                    claims.patch(&name, &params, &Patch::Merge(&patch)),
                )
                .await
                {
                    Ok(Ok(claim)) => judge_renewal(&claim, &uid, token).map(|()| sent_at),
                    Ok(Err(e)) => Err(RenewalError::Api(e)),
                    Err(_) => Err(RenewalError::TimedOut(attempt_limit)),
                }
            }
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay((self.duration() / 6).max(Duration::from_millis(50)))
            .without_max_times()
            .with_jitter();
        attempt
            .retry(backoff)
            .when(RenewalError::is_retried)
            .notify(|e, after| tracing::debug!(error = %e, ?after, "renewal failed; retrying"))
    }
}

/// Why a renewal attempt did not count.
#[derive(Debug, thiserror::Error)]
enum RenewalError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("no response within {0:?}")]
    TimedOut(Duration),
    /// The response shows that the grant ended (a final phase, a deletion, another token).
    #[error("the claim shows the grant ended: {0}")]
    Ended(LostReason),
}

impl RenewalError {
    fn is_retried(&self) -> bool {
        match self {
            RenewalError::Api(e) => match ApiErrorKind::of(e) {
                // Invalid (422): the UID in the patch cannot change, another object has
                // the name. A BadRequest (400, an admission webhook's default refusal)
                // says nothing of the kind, and is retried like any other failure.
                ApiErrorKind::NotFound | ApiErrorKind::Conflict | ApiErrorKind::Invalid => false,
                _ => true,
            },
            RenewalError::TimedOut(_) => true,
            RenewalError::Ended(_) => false,
        }
    }
}

/// What the claim in a renewal's response says about the grant with `token`: it
/// counts while the claim shows this grant (`Granted` with that token) or none yet. A
/// final phase, a deletion mark or another token is the grant's end, reported at
/// once, even when the watches (stalled, say) have not said so.
fn judge_renewal(claim: &LeaseClaim, uid: &str, token: i64) -> Result<(), RenewalError> {
    if claim.uid().as_deref() != Some(uid) {
        return Err(RenewalError::Ended(LostReason::ClaimDeleted));
    }
    if let Some(reason) = claim_ending(Some(claim)) {
        return Err(RenewalError::Ended(reason));
    }
    let status = claim.status.as_ref();
    match status.and_then(|s| s.phase) {
        Some(ClaimPhase::Granted) if status.and_then(|s| s.fencing_token) == Some(token) => Ok(()),
        // A claim is granted once: Granted with another token is not this grant.
        Some(ClaimPhase::Granted) => Err(RenewalError::Ended(LostReason::Superseded)),
        // Pending or no status (final phases returned above): not mirrored yet, since
        // the Lease is written first and in a storm the mirror waits behind every
        // pending grant. The grant has not ended: the controller marks the claim
        // before it hands the Lease on (DESIGN "Endings are confirmed").
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_held_for_no_longer_than_the_duration_it_was_made_with() {
        let held = |spec: i64, recorded: Option<i64>| {
            let mut lease: Lease = serde_json::from_value(serde_json::json!({
                "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
                "metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": spec},
                "status": {"holder": {"claim": "c", "claimUID": "u", "identity": "i"}}
            }))
            .unwrap();
            if let Some(h) = lease.status.as_mut().and_then(|s| s.holder.as_mut()) {
                h.lease_duration_seconds = recorded;
            }
            lease_duration(&lease)
        };
        // Raised from 3 s to 600 s before this process saw the grant: 3 s.
        assert_eq!(held(600, Some(3)), Duration::from_secs(3));
        // Lowered since the grant: the lower spec.
        assert_eq!(held(2, Some(10)), Duration::from_secs(2));
        // A grant made by a controller that records no duration: the spec.
        assert_eq!(held(15, None), Duration::from_secs(15));
    }

    /// A Lease re-created under the name and granted to the same claim publishes
    /// another token: the holder of the old one no longer holds.
    #[test]
    fn a_grant_is_held_only_while_the_lease_publishes_its_claim_with_its_token() {
        let lease = |uid: &str, token: i64| -> Lease {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
                "metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 15},
                "status": {"fencingToken": token,
                           "holder": {"claim": "c", "claimUID": uid, "identity": "i"}}
            }))
            .unwrap()
        };
        assert!(holds_grant(&lease("u", 7), "u", 7));
        assert!(!holds_grant(&lease("u", 9), "u", 7), "another token");
        assert!(!holds_grant(&lease("v", 7), "u", 7), "another claim");
    }

    #[test]
    fn claim_names_are_lease_identity_and_a_random_suffix() {
        let claim = new_claim("billing", "Worker_0.example", None);
        let name = claim.metadata.name.unwrap();
        assert_eq!(name.len(), "billing-worker-0-example-".len() + 5, "{name}");
        assert!(name.starts_with("billing-worker-0-example-"), "{name}");
        assert_eq!(claim.spec.holder_identity, "Worker_0.example");
        assert!(claim.spec.pod.is_none() && claim.metadata.owner_references.is_none());

        let long = "x".repeat(300);
        let claim = new_claim("billing", &long, None);
        assert_eq!(
            claim.metadata.name.unwrap().len(),
            MAX_GENERATE_NAME_PREFIX + 5
        );
        let claim = new_claim("billing", "!!!", None);
        let name = claim.metadata.name.unwrap();
        assert!(name.starts_with("billing-") && name.len() == 13, "{name}");
    }

    #[test]
    fn a_pod_bound_claim_names_the_pod_and_is_owned_by_it() {
        let claim = new_claim("l", "w", Some(("w-0".into(), "uid-1".into())));
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
    fn a_renewal_counts_unless_the_claim_shows_another_grant_or_an_end() {
        let mut claim = LeaseClaim::new("c", LeaseClaimSpec::default());
        claim.metadata.uid = Some("u1".into());
        let with = |phase, token| crate::api::LeaseClaimStatus {
            phase: Some(phase),
            fencing_token: token,
            ..Default::default()
        };
        claim.status = Some(with(ClaimPhase::Granted, Some(7)));
        assert!(judge_renewal(&claim, "u1", 7).is_ok());
        // Another object under the name, or another grant: not this one.
        assert!(matches!(
            judge_renewal(&claim, "u2", 7),
            Err(RenewalError::Ended(LostReason::ClaimDeleted))
        ));
        assert!(matches!(
            judge_renewal(&claim, "u1", 8),
            Err(RenewalError::Ended(LostReason::Superseded))
        ));
        // The grant is not mirrored yet: it has not ended, so the renewal counts.
        claim.status = Some(with(ClaimPhase::Pending, None));
        assert!(judge_renewal(&claim, "u1", 7).is_ok());
        claim.status = None;
        assert!(judge_renewal(&claim, "u1", 7).is_ok());
        for (phase, reason) in [
            (ClaimPhase::Expired, LostReason::Expired),
            (ClaimPhase::Revoked, LostReason::Revoked),
            (ClaimPhase::Released, LostReason::ClaimDeleted),
        ] {
            claim.status = Some(with(phase, Some(7)));
            let ended = judge_renewal(&claim, "u1", 7).unwrap_err();
            assert!(!ended.is_retried(), "{phase:?}");
            assert!(
                matches!(ended, RenewalError::Ended(r) if r == reason),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn a_renewal_gives_up_only_when_the_claim_is_gone() {
        let refused = |code: u16| RenewalError::Api(crate::api_error::refusal(code, "refused"));
        for code in [404, 409, 422] {
            assert!(!refused(code).is_retried(), "{code}");
        }
        for code in [400, 401, 403, 410, 429, 500, 503] {
            assert!(refused(code).is_retried(), "{code}");
        }
        let unreachable = RenewalError::Api(kube::Error::Service("connection reset".into()));
        assert!(unreachable.is_retried());
        assert!(RenewalError::TimedOut(Duration::from_secs(1)).is_retried());
    }

    #[test]
    fn only_final_claim_phases_end_a_grant() {
        let mut claim = LeaseClaim::new("c", LeaseClaimSpec::default());
        assert_eq!(claim_ending(Some(&claim)), None);
        for (phase, reason) in [
            (ClaimPhase::Pending, None),
            (ClaimPhase::Granted, None),
            (ClaimPhase::Expired, Some(LostReason::Expired)),
            (ClaimPhase::Revoked, Some(LostReason::Revoked)),
            (ClaimPhase::Released, Some(LostReason::ClaimDeleted)),
        ] {
            claim.status = Some(crate::api::LeaseClaimStatus {
                phase: Some(phase),
                ..Default::default()
            });
            assert_eq!(claim_ending(Some(&claim)), reason, "{phase:?}");
        }
        assert_eq!(claim_ending(None), Some(LostReason::ClaimDeleted));
    }
}
