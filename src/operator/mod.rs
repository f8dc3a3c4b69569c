//! Fenced operators: a kube-runtime controller (or any code on a [`kube::Client`])
//! that runs only while it leads through a palisade Lease, and whose every request
//! the API server judges against the Lease's fencing token.
//!
//! The chart's `policies.operators` names the operator's service account and Lease;
//! its admission policy refuses every write of that account whose token is below the
//! Lease's published one, or that carries none. [`Fence`] learns the account's name,
//! stamps the token on a client's requests ([`stamp`]) and, before the leader's first
//! write, confirms every API server already refuses the predecessor's token
//! ([`confirm`]). [`run_while_leading`] puts the three together around a grant. The
//! protocol, what it covers and what it does not: docs/operators.md.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use palisade::client::{AcquireOptions, LeaseClient};
//! use palisade::operator::{Fence, Outcome, run_while_leading};
//!
//! let config = kube::Config::infer().await?;
//! let leases = LeaseClient::from_config(config.clone(), None)?;
//! let fence = Fence::new(config, "ops", "my-operator").await?;
//! let outcome = run_while_leading(&leases, &fence, AcquireOptions::default(), |client| async move {
//!     // Build the controllers on `client`: every write carries the token.
//!     let _ = client;
//! })
//! .await?;
//! if let Outcome::Lost(reason) = outcome {
//!     eprintln!("stopped leading: {reason:?}");
//! }
//! # Ok(()) }
//! ```

pub mod confirm;
#[cfg(test)]
mod model_tests;
pub mod stamp;

use std::future::Future;
use std::time::Duration;

use http::Uri;
use kube::{Client, Config};

use crate::client::{AcquireOptions, LeaseClient, LostReason};
pub use stamp::{TOKEN_EXTRA, TokenCell};

/// How long [`Fence::lead`] waits for every API server by default.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a fenced operator could not start or keep leading.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("fenced operator: {0}")]
    Identity(String),
    #[error("fenced operator: building a client: {0}")]
    Client(#[source] kube::Error),
    #[error(
        "fenced operator: listing the API servers (EndpointSlices of Service default/kubernetes): {0}"
    )]
    Discover(#[source] kube::Error),
    #[error("fenced operator: {0}")]
    Servers(String),
    #[error(
        "fenced operator: Lease {0} does not exist, so the API server judges nothing; create it first"
    )]
    LeaseMissing(String),
    #[error(
        "fenced operator: not every API server refuses the predecessor's tokens yet (below {token}); still waiting for {waiting}. Is the chart's policies.operators entry for this service account installed?"
    )]
    NotConfirmed { token: i64, waiting: String },
    #[error("fenced operator: acquiring the Lease: {0}")]
    Acquire(#[source] crate::client::Error),
}

/// One operator's identity, Lease and current token.
#[derive(Clone, Debug)]
pub struct Fence {
    config: Config,
    username: String,
    namespace: String,
    lease: String,
    token: TokenCell,
    servers: Option<Vec<Uri>>,
    confirm_timeout: Duration,
}

impl Fence {
    /// The fence for the service account `config` authenticates as, leading by
    /// `namespace/lease`. Asks the API server who that is (a SelfSubjectReview); any
    /// other user is refused, since only a service account is named in the policy.
    pub async fn new(config: Config, namespace: &str, lease: &str) -> Result<Self, Error> {
        let client = Client::try_from(config.clone()).map_err(Error::Client)?;
        let username = whoami(&client).await?;
        if !username.starts_with("system:serviceaccount:") {
            return Err(Error::Identity(format!(
                "the configuration authenticates as {username:?}, not a service account; a fenced operator runs as the service account named in policies.operators"
            )));
        }
        Ok(Self {
            config,
            username,
            namespace: namespace.to_string(),
            lease: lease.to_string(),
            token: TokenCell::default(),
            servers: None,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        })
    }

    /// Confirm against these API servers rather than the discovered ones.
    pub fn with_servers(mut self, servers: Vec<Uri>) -> Self {
        self.servers = Some(servers);
        self
    }

    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The service account's username.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The token its clients stamp now; 0 before [`Fence::lead`].
    pub fn token(&self) -> i64 {
        self.token.get()
    }

    /// A client whose every request carries the current token (none before
    /// [`Fence::lead`], and the API server refuses those writes).
    pub fn client(&self) -> Result<Client, Error> {
        stamped_client(self.config.clone(), &self.username, self.token.clone())
    }

    /// Stamps `token` from now on, then waits until every API server refuses the
    /// tokens before it.
    pub async fn lead(&self, token: i64) -> Result<(), Error> {
        self.token.set(token);
        let servers = match &self.servers {
            Some(servers) => servers.clone(),
            None => {
                let client = Client::try_from(self.config.clone()).map_err(Error::Client)?;
                confirm::discover(&client, &self.config).await?
            }
        };
        confirm::confirm(
            &self.config,
            &servers,
            &self.username,
            &self.namespace,
            &self.lease,
            token,
            self.confirm_timeout,
        )
        .await
    }
}

/// A client of `config` whose every request impersonates `username` with the token
/// `token` holds (unstamped while it holds none): the leader's, the confirmation's probes.
pub fn stamped_client(config: Config, username: &str, token: TokenCell) -> Result<Client, Error> {
    let stamp = stamp::Stamp::new(username, token).map_err(|e| Error::Identity(e.to_string()))?;
    let (builder, _) = crate::kube_client::builder(config).map_err(Error::Client)?;
    Ok(builder
        .with_layer(&tower::util::MapRequestLayer::new(move |r| stamp.apply(r)))
        .build())
}

/// The username the API server gives this client's credentials.
async fn whoami(client: &Client) -> Result<String, Error> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let reviews: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = reviews
        .create(&Default::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| {
            Error::Identity(format!(
                "asking the API server who this is (SelfSubjectReview): {e}"
            ))
        })?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .ok_or_else(|| Error::Identity("the SelfSubjectReview named no user".into()))
}

/// How [`run_while_leading`] ended.
#[derive(Debug)]
pub enum Outcome<T> {
    /// The leader's code returned; the grant was released.
    Finished(T),
    /// The grant ended first; the leader's code was dropped (cancelled).
    Lost(LostReason),
}

/// Acquires the fence's Lease, confirms the API servers refuse the predecessor, then
/// runs `run` with a stamped client until it returns (the grant is released) or the
/// grant is lost (`run`'s future is dropped, and any request it still sends carries
/// the old token, which the API server refuses).
pub async fn run_while_leading<F, Fut>(
    leases: &LeaseClient,
    fence: &Fence,
    options: AcquireOptions,
    run: F,
) -> Result<Outcome<Fut::Output>, Error>
where
    F: FnOnce(Client) -> Fut,
    Fut: Future,
{
    let grant = leases
        .in_namespace(&fence.namespace)
        .acquire(&fence.lease, options)
        .await
        .map_err(Error::Acquire)?;
    let lost = grant.lost();
    let token = grant.token();
    let client = fence.client()?;
    tokio::select! {
        reason = lost => Ok(Outcome::Lost(reason)),
        outcome = async {
            fence.lead(token).await?;
            Ok::<_, Error>(run(client).await)
        } => match outcome {
            Ok(value) => {
                if let Err(e) = grant.release().await {
                    tracing::warn!(error = %e, "releasing the Lease after the leader's code returned");
                }
                Ok(Outcome::Finished(value))
            }
            Err(e) => {
                let _ = grant.release().await;
                Err(e)
            }
        },
    }
}
