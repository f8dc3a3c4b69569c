//! The admin HTTP server of the controller and the agent: the health endpoints
//! (`/healthz`, `/readyz`) and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The OpenMetrics text of a registry.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// Readiness: true once the watches delivered their initial state, false again during shutdown.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What `/metrics` serves: the text exposition of a process's registry.
pub type MetricsText = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
struct AdminState {
    metrics: MetricsText,
    ready: Readiness,
}

/// Serves `/healthz` (the process answers), `/readyz` and `/metrics` until `shutdown`
/// (the controller's and the agent's admin server).
/// Binds the admin address, before anything reports ready: a port in use or an
/// address the host lacks fails the start, naming the address, instead of leaving
/// a process that probes can never reach.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("admin address {addr} (/healthz, /readyz, /metrics): {e}"),
        )
    })
}

pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    metrics: MetricsText,
    ready: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { metrics, ready });
    // The bound address: with port 0 the kernel chose the port.
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "admin server listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.ready.get() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: caches not synced, or shutting down",
        )
    }
}

async fn metrics_text(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        (state.metrics)(),
    )
}
