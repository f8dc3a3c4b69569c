//! The client side of a palisade Lease, for applications: ask for the lease, wait
//! for the grant, hold it while working, give it back. Needs no controller in
//! this process, only API access to `leases` and `leaseclaims`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade::client::Error> {
//! use palisade::client::{AcquireOptions, LeaseClient};
//! let leases = LeaseClient::try_default(Some("payments")).await?;
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
//! How it keeps the contract (DESIGN.md, "Client side" and "Client deadlines"):
//!
//! - The authority is `Lease.status` (rule 1): a claim holds the lease exactly
//!   when `status.holder.claimUID` is its UID, and the token is
//!   `status.fencingToken`. The claim's status is only read for *why* a grant ended.
//! - Waiting for the grant and noticing its loss use watches, never polling (rule 5).
//! - Renewal is one merge patch of the claim's `spec.renewTime` (rule 4), with the
//!   grant's token in the annotation `palisade.dev/renewed-token`, every
//!   third of `leaseDurationSeconds`, and the grant is given up on this process's
//!   own clock (`CLOCK_BOOTTIME`, `src/client/clock.rs`) before the controller can
//!   hand the lease on: the rule and its proof are DESIGN.md, "Client deadlines".
//!   [`LeaseClient::acquire`] returns a grant believed from a write of the claim's own
//!   whose response showed it not ended: its create, or the early confirmation the
//!   head of the queue sends as soon as it sees the holder let go or fall silent
//!   (`head`), when the grant is seen within a third of a duration of that write's
//!   send; otherwise only once a first renewal, sent as soon as the grant is seen,
//!   has counted (a watch that resumed late may replay a grant the controller has
//!   already ended, and only a response from the API server now tells). That renewal
//!   must count within a third of a duration of seeing the grant, or the acquire fails.
//! - A claim is never left behind by this process: acquiring arms a guard that
//!   deletes the claim if the acquire fails, times out or is cancelled (its future
//!   dropped, even while the create request is in flight), and a [`Grant`] deletes
//!   its claim on [`Grant::release`] or drop. Deletes that had to be spawned from
//!   `Drop` are tracked; call [`LeaseClient::flush`] before the process exits to let
//!   them finish. (A process that is killed outright leaves its claim: a pending
//!   one waits in the queue, and once granted it expires after one lease duration.)
//!
//! # Deadlines: the details
//!
//! The rule and the outline of its proof are DESIGN.md's "Client deadlines"; what
//! follows is why its parts are as they are.
//!
//! - **`CLOCK_BOOTTIME`** (a `timerfd`, `clock`): it keeps counting while the machine
//!   is suspended, where `CLOCK_MONOTONIC` stops.
//! - **The write before the grant** (`head`, module docs): the controller's clock for
//!   a grant starts after it, so it anchors the deadline as safely as a renewal; used
//!   only within a third of a duration, so no expiry can have come since. It takes
//!   the confirmation's write off the handover's critical path.
//! - **The first renewal.** A waiter's watch that resumed after a silent death may
//!   replay "granted to X" when the controller has already ended X's grant and
//!   granted Y, and only a response from the API server tells (the ended grant's
//!   claim was marked first, so the renewal's response shows it). Its third of a
//!   duration bounds the case where the controller's clock started well before the
//!   client saw the grant. Cost: one renewal, a few milliseconds, per acquire.
//! - **Durations.** The client takes the shorter of the spec it observes and the
//!   duration the grant recorded (`status.holder.leaseDurationSeconds`), so neither an
//!   edit nor a spec raised between the grant and the client's first sight of it
//!   makes it believe a longer deadline than the controller applies. The controller
//!   never applies a shorter one to a grant in progress: it expires the longer of the
//!   recorded duration and the current spec after the renewal it last observed,
//!   after a restart or failover too (rule 4's fresh duration is that one); the next
//!   grant uses the current spec. A lengthened spec so extends a grant on the
//!   controller's side only, which is safe because the client never believes it. A
//!   grant without the field (made by an older controller) is expired on the current
//!   spec; it is not backfilled, since the duration it was made with is unknown.
//! - **Unmirrored renewals count.** The mirror is written after the Lease, and in a
//!   storm after every pending grant; the controller marks the holder's claim
//!   `Expired` or `Revoked` before it hands the Lease on (an expiry of a holder that
//!   had renewed its grant excepted: its renewals no longer count by then) and a
//!   release deletes the claim, so an unmirrored claim's grant has not ended by the
//!   controller's hand (a deleted Lease, or one rewritten by someone else, shows on
//!   the Lease watch). Earlier versions retried an unmirrored response without moving
//!   the deadline, so a holder whose mirror waited out two thirds of the duration
//!   behind a storm lost its grant while the controller kept it.
//!
//! # API deadlines
//!
//! Every request of this library and of `palisade lock`/`status` (claim create,
//! renewal patch, delete, Lease create and reads) has a deadline of [`CALL_TIMEOUT`]
//! (5 s; a renewal attempt also at most a sixth of the duration); an abandoned
//! request drops its connection (HTTP/1.1) or its stream (HTTP/2, whose connection
//! the PINGs judge), and a retry goes out again. A claim's name is chosen here (5
//! random characters, as `generateName` would), so a create whose response never
//! came is deleted by name. Deletes are retried for at most 10 s. Watches resume from
//! their last resourceVersion (a list only after 410 Gone) and ask the API server to
//! end them after a timeout; a watch silent for 2 s past it is dropped with its
//! connection (`object_watch` says why not kube's watcher). How a dead connection is
//! noticed depends on who built the connections:
//!
//! - **Ours** ([`LeaseClient::try_default`]/`from_config`, the agent, `palisade
//!   lock`): HTTP/2, PINGed every 3 s and closed when a PING goes unanswered for 3 s
//!   (`crate::kube_client`), which fails every request and watch on it at once; they
//!   resume on a new connection. Requests keep the first connection, and watches
//!   spread over more as they grow in number (`connections`: an HTTP/2 connection
//!   carries only so many streams at once, and a watch holds one for minutes). So watches stay open for 5 minutes, like client-go's
//!   reflectors, and a waiter costs under one request a minute (one holder and three
//!   waiters: 0.233 requests/s, the holder alone 0.206 (its renewals, and its watches'
//!   restarts pro rata), each waiter 0.009; 0.90 with the 5 s Lease watch below). A waiter whose connections froze saw its grant 6.2 to 6.5 s
//!   after the release. client-go detects dead HTTP/2 connections the same way (PINGs
//!   after 30 s of silence). Offering HTTP/2 is not speaking it: the periods follow
//!   the protocol of the last answer (`kube_client::Protocol`), so behind a server
//!   that answers HTTP/1.1 (`kubectl proxy`, `--disable-http2-serving`) they are the
//!   short ones below, and the controller reads the server's version before it starts
//!   its watches and watches unPINGed with 4 s periods when the answer was not HTTP/2
//!   (`tests/protocol.rs`).
//! - **A `kube::Client` of the caller's** ([`LeaseClient::new`]): nothing is known of
//!   its connections (kube's are HTTP/1.1, unPINGed), so the only sign of life is the
//!   API server ending a watch on time. A waiter's Lease watch uses 5 s, so a silently
//!   dead connection costs it about 7 s, plus 5 s (and a backoff under 0.4 s) for each
//!   pooled connection the restart picks that died too (a CI run met one: 12.4 s);
//!   every other watch uses 60 s: a holder's renewals (judged on the claim they
//!   return) notice an ended grant without them, and a waiter's claim watch only ends
//!   a wait early. A quiet watch costs one request per period.

mod claim;
pub(crate) mod clock;
mod connections;
mod grant;
mod head;
mod object_watch;
mod wait;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use kube::api::Api;
use kube::{Client, Config};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use claim::{ClaimGuard, new_claim, post_params};
use clock::BootTimer;
use connections::WatchConnections;
pub use grant::Grant;
use wait::{await_grant, until_deadline};

use crate::conditions::lost;
use crate::crd::{Lease, LeaseClaim, LeaseSpec};
use crate::kube_error::ApiErrorKind;

/// Field manager of the writes made by this library.
pub const CLIENT_MANAGER: &str = "palisade-client";

/// The deadline of every single API request this library makes (a claim's create,
/// renewal patch or delete, a Lease's create, the status reads), so that a
/// connection that dies silently (no FIN, no RST) costs at most this long: the
/// request is abandoned with its connection, and a retry opens a new one. Watches
/// are bounded by their server-side timeout instead (`object_watch`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long each watch stays open before the API server ends it (`timeoutSeconds`)
/// and the client resumes it: what a quiet watch costs, one request per period, and,
/// on connections nobody health-checks, how soon a silently dead one is noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WatchPeriods {
    /// The Lease watch a waiter learns of its grant from.
    pub(crate) grant_secs: u32,
    /// Every other watch: a holder's (its renewals, each under [`CALL_TIMEOUT`] and
    /// judged on the claim they return, notice an ended grant without them) and a
    /// waiter's watch of its own claim (which only ends a wait early).
    pub(crate) quiet_secs: u32,
}

/// On a `kube::Client` of the caller's ([`LeaseClient::new`]), whose connections may
/// die silently and stay open: a watch silent for `object_watch::SILENCE_MARGIN` (2 s)
/// past its period is dropped with its connection, so a waiter's watch is noticed
/// dead within 7 s and resumed on another connection (5 s more, under
/// [`CALL_TIMEOUT`], for each pooled one that died too).
pub(crate) const UNCHECKED_CONNECTIONS: WatchPeriods = WatchPeriods {
    grant_secs: 5,
    quiet_secs: 60,
};

/// On connections `kube_client` built: HTTP/2, PINGed every
/// [`PING_INTERVAL`](crate::kube_client::PING_INTERVAL) and closed when a PING goes
/// unanswered for [`PING_TIMEOUT`](crate::kube_client::PING_TIMEOUT), which fails every
/// watch on them at once. The period only bounds how long a watch lasts.
pub(crate) const PINGED_CONNECTIONS: WatchPeriods = WatchPeriods {
    grant_secs: crate::kube_client::PINGED_WATCH_SECS,
    quiet_secs: crate::kube_client::PINGED_WATCH_SECS,
};

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
    /// On a semaphore, only this slot (`0..permits`), for work sharded by slot: the
    /// claim's `spec.slot`. Default (None): any slot, the lowest free one. A lock has
    /// slot 0 only. The API server refuses a slot outside 0..63 ([`Error::Api`]).
    pub slot: Option<i32>,
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
    /// What the connections' answers show, on connections we built; `None` on a
    /// caller's `kube::Client` ([`LeaseClient::new`]).
    protocol: Option<crate::kube_client::Protocol>,
    /// Where the watches go (`connections`).
    watches: WatchConnections,
    /// Claim creations and the deletions spawned from `Drop`, so that `flush` can wait for them.
    cleanup: TaskTracker,
}

impl LeaseClient {
    /// A client on `client`'s connections. Nothing is known of their health, so a
    /// waiter's Lease watch is ended and resumed every 5 s, the sign of life a silently
    /// dead connection cannot give; [`LeaseClient::from_config`] waits for free.
    pub fn new(client: Client, namespace: &str) -> Self {
        let watches = WatchConnections::Caller(client.clone());
        Self::with_periods(client, namespace, None, watches)
    }

    /// A client on connections that `kube_client::client` or `kube_client::builder`
    /// built, with the [`Protocol`](crate::kube_client::Protocol) they returned: its
    /// watches stay open for minutes while the API server answers in HTTP/2 (PINGed),
    /// and are resumed every few seconds otherwise. Any other `kube::Client` belongs
    /// in [`LeaseClient::new`], or a dead connection goes unnoticed for minutes.
    pub fn on_pinged_connections(
        client: Client,
        protocol: crate::kube_client::Protocol,
        namespace: &str,
    ) -> Self {
        let watches = WatchConnections::Caller(client.clone());
        Self::with_periods(client, namespace, Some(protocol), watches)
    }

    fn with_periods(
        client: Client,
        namespace: &str,
        protocol: Option<crate::kube_client::Protocol>,
        watches: WatchConnections,
    ) -> Self {
        Self {
            namespace: namespace.to_string(),
            leases: Api::namespaced(client.clone(), namespace),
            claims: Api::namespaced(client, namespace),
            protocol,
            watches,
            cleanup: TaskTracker::new(),
        }
    }

    /// A client on connections of its own for `config` (`kube_client::client`):
    /// HTTP/2 where the API server speaks it, PINGed, so its watches stay open for
    /// minutes; in `namespace` or else the configuration's default namespace.
    pub fn from_config(config: Config, namespace: Option<&str>) -> Result<Self, kube::Error> {
        let (client, protocol) = crate::kube_client::client(config.clone())?;
        let namespace = namespace
            .map(str::to_string)
            .unwrap_or_else(|| client.default_namespace().to_string());
        let watches = WatchConnections::own(client.clone(), config);
        Ok(Self::with_periods(
            client,
            &namespace,
            Some(protocol),
            watches,
        ))
    }

    /// How long this client's watches last: minutes on connections whose last
    /// answer came in HTTP/2 (PINGed), seconds otherwise. Decided when a watch
    /// starts, after the claim's create has answered, so from the protocol the
    /// API server actually spoke.
    pub(crate) fn watch_periods(&self) -> WatchPeriods {
        match &self.protocol {
            Some(protocol) if protocol.pinged() => PINGED_CONNECTIONS,
            _ => UNCHECKED_CONNECTIONS,
        }
    }

    /// Whether this client's watches are on PINGed connections now (for tests).
    #[doc(hidden)]
    pub fn watches_pinged(&self) -> bool {
        self.watch_periods() == PINGED_CONNECTIONS
    }

    /// How many connections this client's watches and requests use (for tests).
    #[doc(hidden)]
    pub fn connections(&self) -> usize {
        self.watches.connections()
    }

    /// [`LeaseClient::from_config`] with `KUBECONFIG` (or the in-cluster config).
    pub async fn try_default(namespace: Option<&str>) -> Result<Self, kube::Error> {
        Self::from_config(crate::kube_client::infer().await?, namespace)
    }

    /// This client (its connections and cleanup) in another namespace.
    pub fn in_namespace(&self, namespace: &str) -> Self {
        let client = self.leases.clone().into_client();
        Self {
            namespace: namespace.to_string(),
            leases: Api::namespaced(client.clone(), namespace),
            claims: Api::namespaced(client, namespace),
            protocol: self.protocol.clone(),
            watches: self.watches.clone(),
            cleanup: self.cleanup.clone(),
        }
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
                permits: 1,
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
        let claim = new_claim(lease, &identity, options.pod.resolve(), options.slot);
        let timer = BootTimer::new().map_err(Error::Clock)?;
        let created_at = clock::BootInstant::now();
        let created = until_deadline(deadline, self.create_claim(claim))
            .await
            .ok_or_else(timed_out)??;
        let guard = ClaimGuard::new(self.claims.clone(), &created, self.cleanup.clone());
        let granted = await_grant(
            &self.watches,
            &self.namespace,
            lease,
            guard,
            created_at,
            self.watch_periods(),
            deadline,
            timed_out,
        )
        .await?;
        Grant::confirmed(
            &self.namespace,
            lease,
            identity,
            timer,
            granted,
            &self.cleanup,
        )
        .await
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
