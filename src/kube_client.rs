//! The Kubernetes client of the controller and the client library: kube's, with
//! `TCP_NODELAY` on its connections.
//!
//! kube 5 leaves Nagle's algorithm on (kube-rs issue 2056). A request written in
//! two pieces then waits for the API server's delayed ACK of the first, about 40 ms,
//! and a third of all handovers took 40 to 80 ms instead of 10 to 20 (`make bench`).
//! kube offers no switch, so this builds kube's client stack from its public parts
//! (the same layers: base URI, auth, extra headers, retries of 429/503/504, and
//! connect/read/write timeouts) on a connector with `TCP_NODELAY`. A configuration
//! this does not reproduce (a proxy, or client certificates from an exec plugin,
//! which kube tracks for expiry) gets kube's own client unchanged.
//!
//! **Dead connections.** kube sets no read timeout, so a request on a connection
//! that died silently (no FIN, no RST: a dropped NAT entry, a partition) waits for
//! the kernel's TCP timeout, about 15 minutes. The controller's client
//! ([`controller_default`]) gives up on a connection that delivers nothing for
//! [`READ_TIMEOUT`] (counted from when the request was written); its watches ask the
//! API server to end them after [`CONTROLLER_WATCH_TIMEOUT_SECS`], before that timeout can fire
//! on a healthy but quiet watch, so a dead watch is noticed within
//! [`READ_TIMEOUT`] too. [`within`] puts a deadline on a whole call, for the
//! configurations where we do not build the connector ourselves.

use std::future::Future;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// The client for this configuration, with `TCP_NODELAY` where we can set it.
pub fn client(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let transport =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(transport);
    Ok(Client::new(service, config.default_namespace))
}

/// [`client`] for the inferred configuration (kubeconfig, or in-cluster).
pub async fn try_default() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    client(config)
}

/// How long a controller connection may deliver nothing after a request was written
/// before it counts as dead.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The server-side timeout of the controller's watches (`timeoutSeconds`): shorter
/// than [`READ_TIMEOUT`], so a quiet healthy watch ends and is resumed (from its last
/// resourceVersion, no relist) before the read timeout would take it for dead.
pub const CONTROLLER_WATCH_TIMEOUT_SECS: u32 = 4;

/// The deadline of one controller API call, connection set-up and retries included.
pub const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The controller's client: [`client`] with [`READ_TIMEOUT`] on every connection.
pub async fn controller_default() -> Result<Client, kube::Error> {
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    client(config)
}

/// Error of a call that did not finish within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the API server within {0:?}")]
pub struct DeadlineExceeded(pub Duration);

/// Runs one API call with a deadline; when it passes, the call is dropped (and
/// with it its connection) and a `kube::Error::Service` says so.
pub async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(Box::new(DeadlineExceeded(limit)))),
    }
}
