//! The handlers of the local API (`openapi.yaml`): each one turns a request into a
//! call on the agent's sessions, and their state into JSON.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::{Instant, timeout};

use super::Agent;
use super::session::{GrantKey, GrantState, GrantView, Phase, Session, SessionGrant};
use super::wire::{self, HttpError, json};

/// The OpenAPI document, served as it is in the repository.
pub const OPENAPI: &str = include_str!("openapi.yaml");

/// How often an event stream carries a comment: a connection whose application died
/// fails its next write, which ends the session.
const STREAM_KEEPALIVE: Duration = Duration::from_secs(1);

/// The longest a release waits for the claim's deletion (the client retries for 10 s).
const RELEASE_LIMIT: Duration = Duration::from_secs(11);

pub fn router(agent: Arc<Agent>) -> Router {
    let router = Router::new()
        .route("/v1/openapi.yaml", get(openapi))
        .route("/v1/sessions", post(create_session))
        .route(
            "/v1/sessions/{session}",
            get(get_session).delete(end_session),
        )
        .route("/v1/sessions/{session}/keepalive", post(keepalive))
        .route("/v1/sessions/{session}/events", get(events))
        .route("/v1/sessions/{session}/leases", post(acquire))
        .route(
            "/v1/sessions/{session}/leases/{namespace}/{name}",
            get(get_grant).delete(release),
        );
    #[cfg(feature = "s3")]
    let router = router.route(
        "/v1/sessions/{session}/leases/{namespace}/{name}/objects/{bucket}/{*key}",
        axum::routing::put(super::objects::put_object)
            .get(super::objects::get_object)
            .layer(axum::extract::DefaultBodyLimit::max(
                super::objects::MAX_OBJECT_BYTES,
            )),
    );
    router
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(agent.clone(), observe))
        .with_state(agent)
}

async fn observe(State(agent): State<Arc<Agent>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    agent
        .metrics
        .request(route, method, started.elapsed().as_secs_f64());
    response
}

async fn not_found() -> HttpError {
    HttpError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such path in the agent's API (see /v1/openapi.yaml)",
    )
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionView {
    id: String,
    /// The agent's default namespace: that of the Leases acquired without one.
    namespace: String,
    keepalive_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    grants: Vec<GrantView>,
}

fn session_view(session: &Session) -> SessionView {
    SessionView {
        id: session.id.clone(),
        namespace: session.namespace.clone(),
        keepalive_ms: session.keepalive.as_millis() as u64,
        name: session.name.clone(),
        grants: session.views(),
    }
}

async fn create_session(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let request = wire::session_request(&headers, &body)?;
    let session = agent.start_session(request);
    Ok(json(StatusCode::CREATED, &session_view(&session)))
}

async fn get_session(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let session = agent.session(&id)?;
    Ok(json(StatusCode::OK, &session_view(&session)))
}

async fn end_session(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    let session = agent.session(&id)?;
    agent.end_session(&session, "deleted").await;
    Ok(StatusCode::NO_CONTENT)
}

async fn keepalive(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    agent.session(&id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Ends its session when dropped: the stream's connection closed.
struct StreamGuard {
    agent: Arc<Agent>,
    session: Arc<Session>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.session.ended.is_cancelled() {
            return;
        }
        let (agent, session) = (self.agent.clone(), self.session.clone());
        tokio::spawn(async move { agent.end_session(&session, "event stream closed").await });
    }
}

async fn events(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, HttpError> {
    let session = agent.session(&id)?;
    if session.stream_opened.swap(true, Ordering::SeqCst) {
        return Err(HttpError::new(
            StatusCode::CONFLICT,
            "stream_open",
            format!("session {id} has an event stream already (one per session)"),
        ));
    }
    let receiver = session.events.subscribe();
    let guard = StreamGuard {
        agent: agent.clone(),
        session,
    };
    let snapshot = |session: &Session| {
        Event::default()
            .event("session")
            .data(serde_json::to_string(&session_view(session)).expect("a session serializes"))
    };
    let first = snapshot(&guard.session);
    let stream = futures::stream::unfold(
        (Some(first), receiver, guard),
        move |(first, mut receiver, guard)| async move {
            if let Some(first) = first {
                return Some((Ok(first), (None, receiver, guard)));
            }
            let event = tokio::select! {
                () = guard.session.ended.cancelled() => return None,
                received = receiver.recv() => match received {
                    Ok(view) => Event::default().event("grant").data(serde_json::to_string(&view).expect("a grant serializes")),
                    // Too slow a reader: the whole state again, then on.
                    Err(RecvError::Lagged(_)) => snapshot(&guard.session),
                    Err(RecvError::Closed) => return None,
                },
            };
            Some((Ok(event), (None, receiver, guard)))
        },
    );
    Ok(Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(STREAM_KEEPALIVE)
            .text("keepalive"),
    ))
}

async fn acquire(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let session = agent.session(&id)?;
    let request = wire::acquire_request(&headers, &body)?;
    let wait = request.wait;
    let grant = agent.acquire(&session, request).await?;
    let phase = wait_while_waiting(&grant, wait).await;
    let status = if phase.is_waiting() {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok(json(status, &grant.view()))
}

/// The grant's phase once it is no longer waiting, or after `wait`.
async fn wait_while_waiting(grant: &SessionGrant, wait: Duration) -> Phase {
    let mut phase = grant.phase();
    let _ = timeout(wait, phase.wait_for(|p| !p.is_waiting())).await;
    phase.borrow().clone()
}

pub(super) fn grant_of(
    session: &Session,
    namespace: String,
    name: String,
) -> Result<Arc<SessionGrant>, HttpError> {
    let key = GrantKey { namespace, name };
    session.grant(&key).ok_or_else(|| {
        HttpError::new(
            StatusCode::NOT_FOUND,
            "unknown_grant",
            format!(
                "session {} has not acquired Lease {}/{}",
                session.id, key.namespace, key.name
            ),
        )
    })
}

async fn get_grant(
    State(agent): State<Arc<Agent>>,
    Path((id, namespace, name)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let session = agent.session(&id)?;
    let wait = wire::wait_query(query.as_deref())?;
    let grant = grant_of(&session, namespace, name)?;
    if !wait.is_zero() {
        wait_while_waiting(&grant, wait).await;
        session.seen();
    }
    Ok(json(StatusCode::OK, &grant.view()))
}

async fn release(
    State(agent): State<Arc<Agent>>,
    Path((id, namespace, name)): Path<(String, String, String)>,
) -> Result<Response, HttpError> {
    let session = agent.session(&id)?;
    let grant = grant_of(&session, namespace, name)?;
    let view = grant.view();
    if view.state == GrantState::Lost {
        return Err(HttpError::new(
            StatusCode::CONFLICT,
            "grant_lost",
            format!(
                "the grant of Lease {}/{} is lost already ({}): there is nothing to release",
                view.namespace,
                view.name,
                view.lost_message.unwrap_or_default()
            ),
        ));
    }
    grant.release.cancel();
    let mut phase = grant.phase();
    let ended = timeout(RELEASE_LIMIT, phase.wait_for(|p| !p.is_live())).await;
    if ended.is_err() {
        return Err(HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "kubernetes_unavailable",
            "the claim's deletion did not finish in time; the grant ends at its deadline",
        ));
    }
    Ok(json(StatusCode::OK, &grant.view()))
}
