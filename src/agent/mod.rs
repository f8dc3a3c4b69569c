//! `palisade agent`: holds palisade Leases for the containers of its pod, so that a
//! program in any language gets fencing tokens and the client library's timing
//! contract through a local HTTP API (`openapi.yaml`), without re-implementing it.
//!
//! - [`wire`]: the JSON of requests and errors, checked field by field.
//! - [`session`]: sessions (one per application process) and their grants, each held
//!   by a task that runs [`crate::client::LeaseClient::acquire`] and keeps the grant.
//! - [`routes`]: the HTTP handlers.
//! - `objects`: objects written through the object-store fence with a grant's token.
//! - `token_files`: the token files for shell-level programs.
//!
//! Why a session ends, and so lets go of its Leases: it missed its keepalive (the
//! application is dead or hung), its event stream closed (the application's process
//! died: the kernel closed its socket), or it was deleted. DESIGN.md, "The agent",
//! has the contract and what an application must do in each case; why it is so:
//!
//! - **A native sidecar**, because it then starts before the application containers
//!   and stops after them. As an ordinary container (clusters before 1.29) it may
//!   stop first: it releases its grants on SIGTERM, the application sees the loss on
//!   its event stream and must stop writing; the fence covers the rest.
//! - **No authentication, and that is sound.** Only the pod's own containers reach
//!   the socket (an `emptyDir` is not shared across pods) or the pod's loopback; the
//!   agent's power is exactly its service account's, which every container of the pod
//!   may use anyway (a mounted token, or the same service account); and a grant holds
//!   nothing by itself: the fence decides at the resource. The socket is mode 0666 so
//!   containers running as other users reach it. Hence a non-loopback `--listen` is
//!   refused, and so is any `--listen` in a pod on the node's network (`hostNetwork:
//!   true`: the Downward API's `POD_IP` equals `HOST_IP`, and a pod that does not
//!   pass both is refused too), where the loopback is every node process's.
//! - **The event stream ends a session, but is no keepalive.** When the application
//!   dies the kernel closes its socket and hyper notices within milliseconds, so its
//!   grants are released (the claims deleted, the next waiter granted at once); a
//!   frozen process keeps its sockets open, so only a missed keepalive ends its
//!   session. Keepalives are liveness, not safety: a frozen application that wakes
//!   after its session ended is refused by the fence, as any stale holder is.
//! - **When the agent dies** (SIGKILL, OOM) every connection to it drops, so every
//!   client reports the loss at once, while the Leases themselves end only at the
//!   normal deadlines (one duration after the last renewal): applications learn of
//!   the loss before anyone else can be granted.
//! - **The timing contract stays in the library**: a grant here is the library's
//!   `Grant` (renewals every third of the duration, the local deadline on
//!   `CLOCK_BOOTTIME`, acquire confirmed by a first renewal). The thin clients count
//!   `validForMs` down from when they *sent* the request, because a frozen or starved
//!   agent, a blocked event loop or a forked child must stop believing by its own
//!   clock, not by its keepalive, which nothing bounds by the lease duration.
//! - **Acquire is a bounded long poll** (`waitMs`, at most 30 s), so no request is
//!   held open longer than its caller asked.
//! - **Bad input**: unknown fields are reported before missing ones (a misspelt field
//!   is the likely cause), and names are checked before any API call.

mod metrics;
#[cfg(feature = "s3")]
mod objects;
pub mod routes;
pub mod session;
mod token_files;
pub mod wire;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;

use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::metrics::AgentMetrics;
use self::session::{GrantKey, Session, SessionGrant, hold};
use self::token_files::TokenFiles;
use self::wire::{AcquireRequest, HttpError, SessionRequest};
use crate::admin::{self, Readiness};
use crate::client::{Error as ClientError, LeaseClient, default_identity};
use crate::kube_error::ApiErrorKind;

/// The socket's default path: in an `emptyDir` mounted at `/run/palisade` in every
/// container of the pod.
pub const DEFAULT_SOCKET: &str = "/run/palisade/agent.sock";
pub const DEFAULT_TOKEN_DIR: &str = "/run/palisade/leases";

/// How long the agent's shutdown waits for its releases to finish.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(12);
/// How long ending a session waits for its releases: each API call is bounded by 5 s
/// and retried once, and a request is answered within its `waitMs` plus 11 s.
const END_SESSION_LIMIT: Duration = Duration::from_secs(10);

pub struct AgentConfig {
    /// The Lease namespace when a request names none.
    pub namespace: String,
    pub socket: PathBuf,
    /// A loopback address to listen on too; anything else is refused.
    pub listen: Option<SocketAddr>,
    pub token_dir: Option<PathBuf>,
    pub admin_addr: SocketAddr,
    /// Whose network the agent's loopback is, for `--listen`.
    pub network: PodNetwork,
}

/// What the Downward API says of the agent's pod (`POD_NAME`, `POD_IP`, `HOST_IP`):
/// whether its loopback is the pod's own. Under `hostNetwork: true` it is the node's,
/// where every process on the node could act as the pod through `--listen`.
#[derive(Debug, Clone, Default)]
pub struct PodNetwork {
    pub pod_name: Option<String>,
    pub pod_ip: Option<String>,
    pub host_ip: Option<String>,
}

impl PodNetwork {
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            pod_name: var("POD_NAME"),
            pod_ip: var("POD_IP"),
            host_ip: var("HOST_IP"),
        }
    }

    /// Refuses a `--listen` address that is not loopback, or a loopback shared
    /// with the node. Outside a pod (no `POD_NAME`) the loopback is the machine's,
    /// which its user controls already.
    fn check_listen(&self, addr: SocketAddr) -> Result<(), StartError> {
        if !addr.ip().is_loopback() {
            return Err(StartError::NotLoopback(addr));
        }
        if self.pod_name.is_none() {
            return Ok(());
        }
        match (&self.pod_ip, &self.host_ip) {
            (Some(pod), Some(host)) if pod != host => Ok(()),
            (Some(_), Some(_)) => Err(StartError::HostNetwork(addr)),
            _ => Err(StartError::NetworkUnknown(addr)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "--listen {0}: the agent listens on loopback addresses only (127.0.0.1, ::1): its API has no authentication beyond the pod boundary"
    )]
    NotLoopback(SocketAddr),
    #[error(
        "--listen {0}: the pod runs on the node's network (POD_IP equals HOST_IP: hostNetwork: true), whose loopback every process on the node shares, and the agent's API has no authentication; use the Unix socket"
    )]
    HostNetwork(SocketAddr),
    #[error(
        "--listen {0}: inside a pod (POD_NAME is set) the agent needs POD_IP and HOST_IP from the Downward API (fieldRef status.podIP and status.hostIP) to refuse the node's network, whose loopback every process on the node shares"
    )]
    NetworkUnknown(SocketAddr),
    #[error(
        "--token-dir {dir}: it holds the socket {socket}; the agent removes what a previous agent left there, so give the token files a directory of their own"
    )]
    TokenDirHoldsSocket { dir: PathBuf, socket: PathBuf },
    #[error("{0}")]
    Admin(io::Error),
    #[error("socket {path}: another agent is listening on it")]
    SocketInUse { path: PathBuf },
    #[error("socket {path}: {source}")]
    Socket { path: PathBuf, source: io::Error },
    #[error("--listen {addr}: {source}")]
    Listen { addr: SocketAddr, source: io::Error },
    #[error("token directory: {0}")]
    TokenDir(io::Error),
}

/// The agent's state, shared by its handlers and tasks.
pub struct Agent {
    /// In the default namespace; the others' are made from it.
    kube: LeaseClient,
    default_namespace: String,
    clients: Mutex<HashMap<String, LeaseClient>>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    token_files: Arc<TokenFiles>,
    metrics: Arc<AgentMetrics>,
    /// The grant holders, so that shutdown can wait for their releases.
    holders: TaskTracker,
    /// The object-store fences of `objects`, one per bucket.
    #[cfg(feature = "s3")]
    objects: objects::Fences,
}

impl Agent {
    fn leases(&self, namespace: &str) -> LeaseClient {
        let mut clients = self.clients.lock().unwrap();
        clients
            .entry(namespace.to_string())
            .or_insert_with(|| self.kube.in_namespace(namespace))
            .clone()
    }

    pub fn start_session(self: &Arc<Self>, request: SessionRequest) -> Arc<Session> {
        let session = Arc::new(Session::new(
            new_id(),
            self.default_namespace.clone(),
            request.name,
            request.keepalive,
        ));
        self.sessions
            .lock()
            .unwrap()
            .insert(session.id.clone(), session.clone());
        self.metrics.sessions.inc();
        let (agent, watched) = (self.clone(), session.clone());
        tokio::spawn(async move {
            // Ends the session once it has gone a whole keepalive without a request.
            loop {
                tokio::select! {
                    () = watched.ended.cancelled() => return,
                    () = sleep_until(watched.expires_at()) => {}
                }
                if watched.time_left().is_zero() {
                    agent.end_session(&watched, "keepalive missed").await;
                    return;
                }
            }
        });
        session
    }

    /// The session named by a request, which counts as its keepalive.
    pub fn session(&self, id: &str) -> Result<Arc<Session>, HttpError> {
        let session = self.sessions.lock().unwrap().get(id).cloned();
        let session = session.ok_or_else(|| HttpError::unknown_session(id))?;
        session.seen();
        Ok(session)
    }

    /// Ends a session: lets go of all its grants, and waits (bounded) until they are released.
    pub async fn end_session(&self, session: &Session, why: &str) {
        if self.sessions.lock().unwrap().remove(&session.id).is_none() {
            return;
        }
        tracing::info!(session = %session.id, name = ?session.name, why, "session ended");
        self.metrics.sessions.dec();
        session.ended.cancel();
        let releases = session.grants().into_iter().map(|grant| async move {
            let mut phase = grant.phase();
            let _ = phase.wait_for(|p| !p.is_live()).await;
        });
        let _ = tokio::time::timeout(END_SESSION_LIMIT, futures::future::join_all(releases)).await;
    }

    /// Starts holding a grant for `session`; the grant's phase tells how it goes.
    pub async fn acquire(
        &self,
        session: &Session,
        request: AcquireRequest,
    ) -> Result<Arc<SessionGrant>, HttpError> {
        let namespace = request
            .namespace
            .clone()
            .unwrap_or_else(|| self.default_namespace.clone());
        let key = GrantKey {
            namespace: namespace.clone(),
            name: request.name.clone(),
        };
        let leases = self.leases(&namespace);
        let identity = request
            .holder_identity
            .clone()
            .unwrap_or_else(default_identity);
        let grant = session
            .insert(key, identity, request.slot)
            .map_err(|existing| {
                HttpError::new(
                    StatusCode::CONFLICT,
                    "already_acquired",
                    format!(
                        "session {} {} Lease {namespace}/{} already; release it first",
                        session.id,
                        if existing.phase().borrow().is_waiting() {
                            "waits for"
                        } else {
                            "holds"
                        },
                        request.name
                    ),
                )
            })?;
        // Until the holder task owns it, the grant is this request's: if the request
        // fails, or is dropped because its caller hung up, nothing would ever hold
        // it, and every later acquire of the Lease in this session would be refused.
        let unowned = Unowned {
            session,
            grant: Some(grant),
        };
        if let Err(e) = leases
            .ensure_lease(&request.name, request.duration_secs)
            .await
        {
            return Err(kubernetes_error(&e, &namespace));
        }
        let grant = unowned.hand_over();
        self.holders.spawn(hold(
            leases,
            request,
            grant.clone(),
            self.token_files.clone(),
            self.metrics.clone(),
        ));
        Ok(grant)
    }

    /// Ends every session (the agent is stopping) and lets the claims' deletions finish.
    async fn shut_down(&self) {
        let sessions: Vec<_> = self.sessions.lock().unwrap().values().cloned().collect();
        let ends = sessions
            .iter()
            .map(|s| self.end_session(s, "agent stopping"));
        futures::future::join_all(ends).await;
        self.holders.close();
        let _ = tokio::time::timeout(SHUTDOWN_LIMIT, self.holders.wait()).await;
        let clients: Vec<_> = self.clients.lock().unwrap().values().cloned().collect();
        for client in clients {
            client.flush(SHUTDOWN_LIMIT).await;
        }
    }
}

/// A session's grant that no holder task owns yet: forgotten when dropped, unless
/// handed over.
struct Unowned<'a> {
    session: &'a Session,
    grant: Option<Arc<SessionGrant>>,
}

impl Unowned<'_> {
    fn hand_over(mut self) -> Arc<SessionGrant> {
        self.grant.take().expect("handed over once")
    }
}

impl Drop for Unowned<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            grant.release.cancel();
            self.session.forget(&grant.key);
        }
    }
}

/// An API server error of an acquire's Lease creation, as an answer.
fn kubernetes_error(error: &ClientError, namespace: &str) -> HttpError {
    match error.api_kind() {
        Some(ApiErrorKind::Forbidden) => HttpError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "the agent may not create or read Leases in namespace {namespace} (bind its service account to the chart's client ClusterRole there): {error}"
            ),
        ),
        Some(ApiErrorKind::NotFound) => HttpError {
            field: Some("namespace".into()),
            ..HttpError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "namespace {namespace} does not exist, or the palisade CRDs are not installed in this cluster: {error}"
                ),
            )
        },
        Some(ApiErrorKind::Invalid) => HttpError::field(
            "invalid_field",
            "name",
            format!("the API server refused the Lease: {error}"),
        ),
        _ => HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "kubernetes_unavailable",
            format!("the Kubernetes API could not be reached in time: {error}"),
        ),
    }
}

/// A session id: 128 random bits from the kernel. Ids need not be secret (whoever
/// can reach the socket is inside the pod), only unique; the kernel's generator
/// makes that so without another dependency.
fn new_id() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom is readable");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the agent until `shutdown`, then releases every grant and returns.
pub async fn run(
    kube: LeaseClient,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    if let Some(addr) = config.listen {
        config.network.check_listen(addr)?;
    }
    if let Some(dir) = &config.token_dir
        && config.socket.starts_with(dir)
    {
        return Err(StartError::TokenDirHoldsSocket {
            dir: dir.clone(),
            socket: config.socket.clone(),
        });
    }
    let token_files = TokenFiles::new(config.token_dir.clone()).map_err(StartError::TokenDir)?;
    let admin_listener = admin::bind(config.admin_addr)
        .await
        .map_err(StartError::Admin)?;
    let unix = bind_socket(&config.socket).await?;
    let tcp = bind_listen(config.listen).await?;
    let agent = Arc::new(Agent {
        kube,
        default_namespace: config.namespace.clone(),
        clients: Mutex::default(),
        sessions: Mutex::default(),
        token_files: Arc::new(token_files),
        metrics: Arc::new(AgentMetrics::default()),
        #[cfg(feature = "s3")]
        objects: objects::Fences::default(),
        holders: TaskTracker::new(),
    });
    let ready = Readiness::default();
    let metrics_text = {
        let metrics = agent.metrics.clone();
        Arc::new(move || admin::encode(&metrics.registry))
    };
    let admin_stop = CancellationToken::new();
    let admin = tokio::spawn(admin::serve_admin(
        admin_listener,
        metrics_text,
        ready.clone(),
        admin_stop.clone(),
    ));

    let app = routes::router(agent.clone());
    let stop_serving = CancellationToken::new();
    let serve_unix = {
        let stop = stop_serving.clone();
        tokio::spawn(
            axum::serve(unix, app.clone())
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .into_future(),
        )
    };
    let serve_tcp = tcp.map(|tcp| {
        let stop = stop_serving.clone();
        tokio::spawn(
            axum::serve(tcp, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .into_future(),
        )
    });
    tracing::info!(socket = %config.socket.display(), listen = ?config.listen, namespace = %config.namespace, "agent listening");
    ready.set(true);

    shutdown.cancelled().await;
    ready.set(false);
    tracing::info!("agent stopping: releasing every grant");
    agent.shut_down().await;
    // Open connections (event streams) would keep a graceful shutdown waiting.
    serve_unix.abort();
    if let Some(serve_tcp) = serve_tcp {
        serve_tcp.abort();
    }
    stop_serving.cancel();
    let _ = std::fs::remove_file(&config.socket);
    admin_stop.cancel();
    let _ = admin.await;
    Ok(())
}

/// Binds the Unix socket, replacing a stale one a killed agent left (no one answers
/// on it) but never one another agent is listening on.
/// The loopback TCP listener of `--listen`, when there is one.
async fn bind_listen(
    listen: Option<SocketAddr>,
) -> Result<Option<tokio::net::TcpListener>, StartError> {
    let Some(addr) = listen else { return Ok(None) };
    tokio::net::TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|source| StartError::Listen { addr, source })
}

async fn bind_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener, StartError> {
    let failed = |source| StartError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(StartError::SocketInUse {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(failed)?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(failed)?;
    // Every container of the pod may connect, whatever its user: the pod is the boundary.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(failed)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(pod_name: Option<&str>, pod_ip: Option<&str>, host_ip: Option<&str>) -> PodNetwork {
        PodNetwork {
            pod_name: pod_name.map(Into::into),
            pod_ip: pod_ip.map(Into::into),
            host_ip: host_ip.map(Into::into),
        }
    }

    #[test]
    fn listen_is_refused_where_the_loopback_is_the_nodes() {
        let lo: SocketAddr = "127.0.0.1:7800".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7800".parse().unwrap();
        let own = network(Some("p"), Some("10.88.0.5"), Some("192.168.1.2"));
        assert!(own.check_listen(lo).is_ok());
        assert!(matches!(
            own.check_listen(any),
            Err(StartError::NotLoopback(_))
        ));
        let host = network(Some("p"), Some("192.168.1.2"), Some("192.168.1.2"));
        assert!(matches!(
            host.check_listen(lo),
            Err(StartError::HostNetwork(_))
        ));
        let unknown = network(Some("p"), None, Some("192.168.1.2"));
        assert!(matches!(
            unknown.check_listen(lo),
            Err(StartError::NetworkUnknown(_))
        ));
        let outside_a_pod = network(None, None, None);
        assert!(outside_a_pod.check_listen(lo).is_ok());
    }
}
