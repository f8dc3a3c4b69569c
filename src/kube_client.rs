//! The Kubernetes client of the controller and the client library: kube's, with
//! `TCP_NODELAY` on its connections, and PINGed HTTP/2 ones for the library.
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
//! the kernel's TCP timeout, about 15 minutes. Two answers:
//!
//! - PINGed HTTP/2 ([`client`]): the client library's, the agent's and the
//!   controller's watch connections speak HTTP/2 where the API server offers it (kube
//!   offers HTTP/1.1 only), and are PINGed every [`PING_INTERVAL`], idle or not; one
//!   whose PING goes unanswered for [`PING_TIMEOUT`] is closed, failing every request
//!   and watch on it. That is how a quiet watch is known alive without a request
//!   (`crate::client`, "API deadlines"), so watches last [`PINGED_WATCH_SECS`].
//! - A read timeout: the controller's calls ([`controller_clients`]) give up on a
//!   connection that delivers nothing for [`READ_TIMEOUT`] (counted from when the
//!   request was written). Where we do not build the connections, its watches share
//!   that client and ask the API server to end them after
//!   [`CONTROLLER_WATCH_TIMEOUT_SECS`], before the timeout can fire on a healthy but
//!   quiet watch. [`within`] puts a deadline on a whole call, for those
//!   configurations.
//!
//! **The controller's calls and watches.** Without a read timeout 16 writes on
//! silently dead connections would stop all grants for those 15 minutes. Its calls
//! keep HTTP/1.1 (one connection per call in flight) with the 5 s read timeout; its
//! three watches share one PINGed HTTP/2 connection, like the client library's: a
//! dead one is closed within 6 s, failing all three, which resume from their
//! resourceVersions (no relist), and a quiet healthy watch lasts 5 minutes, so the
//! idle controller costs the API server next to nothing beyond its election
//! renewals. Where we do not build the connections (a proxy, an exec credential
//! plugin, a TLS server name) the 4 s `timeoutSeconds` above applies. Every write,
//! confirmation read and election call also runs under [`CONTROLLER_CALL_TIMEOUT`]
//! (10 s; an election attempt gets what is left of the renew deadline), so a leader
//! cut off silently steps down within its renew deadline. Bookmarks alone would not
//! do: the API server sends one about once a minute.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use http::{Request, Response, Version};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// The service under a [`Client`] of [`builder`], whichever stack it is.
pub type Transport = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// The client for this configuration, with `TCP_NODELAY` and PINGed HTTP/2
/// connections where [`builds_connections`] says we build them, and what its
/// responses show of the protocol.
pub fn client(config: Config) -> Result<(Client, Protocol), kube::Error> {
    let (builder, protocol) = builder(config)?;
    Ok((builder.build(), protocol))
}

/// Whether [`client`] builds this configuration's connections itself (TCP_NODELAY,
/// HTTP/2 PINGs), rather than handing it to kube unchanged.
pub fn builds_connections(config: &Config) -> bool {
    config.proxy_url.is_none()
        && config.auth_info.exec.is_none()
        && config.tls_server_name.is_none()
}

/// Which protocol the API server answered a client's last response in. Offering
/// HTTP/2 is not speaking it: a plain `http://` server (`kubectl proxy`) or one
/// started with `--disable-http2-serving` answers HTTP/1.1, whose connections
/// carry no PINGs, so only an answer in HTTP/2 makes a connection checked.
#[derive(Clone, Debug, Default)]
pub struct Protocol(Arc<AtomicU8>);

// 0: no answer seen yet.
const HTTP1: u8 = 1;
const HTTP2: u8 = 2;

impl Protocol {
    fn record(&self, version: Version) {
        let seen = if version == Version::HTTP_2 {
            HTTP2
        } else {
            HTTP1
        };
        self.0.store(seen, Ordering::Relaxed);
    }

    /// The last answer came in HTTP/2 on connections we built, so they are PINGed.
    /// False before any answer: nothing is known yet.
    pub fn pinged(&self) -> bool {
        self.0.load(Ordering::Relaxed) == HTTP2
    }
}

/// [`client`]'s stack, for callers that add a layer of their own.
pub fn builder(config: Config) -> Result<(ClientBuilder<Transport>, Protocol), kube::Error> {
    stack(config, true)
}

/// The stack of [`builder`]; `http2`: offer HTTP/2 (and PING its connections).
fn stack(config: Config, http2: bool) -> Result<(ClientBuilder<Transport>, Protocol), kube::Error> {
    // A stack of kube's own is never PINGed: its Protocol stays unknown.
    let protocol = Protocol::default();
    if !builds_connections(&config) {
        return Ok((ClientBuilder::try_from(config)?, protocol));
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = https_connector(&config, http, http2)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let transport = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(transport)
        .map_response({
            let protocol = protocol.clone();
            move |response: Response<_>| {
                protocol.record(response.version());
                response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
            }
        });
    let builder = ClientBuilder::new(BoxService::new(service), config.default_namespace);
    Ok((builder, protocol))
}

/// kube's TLS connector, offering HTTP/2 as well when `http2` (kube's offers HTTP/1.1 only).
fn https_connector(
    config: &Config,
    http: HttpConnector,
    http2: bool,
) -> Result<hyper_rustls::HttpsConnector<HttpConnector>, kube::Error> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http()
        .enable_http1();
    Ok(if http2 {
        connector.enable_http2().wrap_connector(http)
    } else {
        connector.wrap_connector(http)
    })
}

/// How often an HTTP/2 connection is PINGed, idle or not.
pub const PING_INTERVAL: Duration = Duration::from_secs(3);

/// How long a PING may go unanswered before its connection is closed, and every
/// request and watch on it fails (to be retried or resumed on a new one).
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a watch on PINGed connections lasts (`timeoutSeconds`): five minutes,
/// like client-go's reflectors, so a quiet watch costs under one request a minute.
pub const PINGED_WATCH_SECS: u32 = 300;

/// The inferred configuration (kubeconfig, or in-cluster).
pub async fn infer() -> Result<Config, kube::Error> {
    Config::infer().await.map_err(kube::Error::InferConfig)
}

/// How long a controller connection may deliver nothing after a request was written
/// before it counts as dead.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The server-side timeout of the controller's watches on its call client
/// (`timeoutSeconds`): shorter than [`READ_TIMEOUT`], so a quiet healthy watch ends
/// and is resumed (from its last resourceVersion, no relist) before the read timeout
/// would take it for dead.
pub const CONTROLLER_WATCH_TIMEOUT_SECS: u32 = 4;

/// The deadline of one controller API call, connection set-up and retries included.
pub const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The controller's clients: one for its calls, one for its three watches.
#[derive(Clone)]
pub struct ControllerClients {
    /// Writes, quorum reads, Events and the election: HTTP/1.1, a connection each
    /// (the write pass is measured on them, `make bench`), each given up after
    /// [`READ_TIMEOUT`] of silence.
    pub calls: Client,
    /// The watches: PINGed HTTP/2 where we build the connections and the API
    /// server answered in HTTP/2.
    pub watches: Client,
    /// The watches' `timeoutSeconds`: [`PINGED_WATCH_SECS`] on PINGed connections,
    /// else [`CONTROLLER_WATCH_TIMEOUT_SECS`].
    pub watch_timeout_secs: u32,
}

impl ControllerClients {
    /// Watches on the call client itself, with short watch timeouts: for a client
    /// whose connections we did not build.
    pub fn unpinged(calls: Client) -> Self {
        ControllerClients {
            watches: calls.clone(),
            calls,
            watch_timeout_secs: CONTROLLER_WATCH_TIMEOUT_SECS,
        }
    }
}

/// The controller's clients for the inferred configuration.
pub async fn controller_clients() -> Result<ControllerClients, kube::Error> {
    let config = infer().await?;
    let mut calls = config.clone();
    calls.read_timeout = Some(READ_TIMEOUT);
    calls.reset_reader_on_write = true;
    let calls = stack(calls, false)?.0.build();
    let (watches, protocol) = client(config)?;
    // The watches' period is set once, so the protocol is learned before they start.
    if let Err(e) = within(CONTROLLER_CALL_TIMEOUT, watches.apiserver_version()).await {
        tracing::warn!(error = %e, "reading the API server's version failed; watching on unchecked connections");
    }
    if !protocol.pinged() {
        tracing::info!(
            "the API server does not answer in HTTP/2 (or we do not build the connections): watches end every few minutes instead of being PINGed"
        );
        return Ok(ControllerClients::unpinged(calls));
    }
    Ok(ControllerClients {
        calls,
        watches,
        watch_timeout_secs: PINGED_WATCH_SECS,
    })
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
