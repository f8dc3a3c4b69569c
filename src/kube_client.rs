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
