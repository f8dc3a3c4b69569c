//! Objects written through the object-store fence ([`crate::fence::s3`]) with a grant's
//! own token: `PUT /v1/sessions/{session}/leases/{namespace}/{name}/objects/{bucket}/{key}`
//! writes the body at `key` in `bucket` with the grant's current token, and `GET` of the
//! same path reads the payload back with its token (`Palisade-Fencing-Token`).
//!
//! Why the agent writes with its own token, not one the client sends: the client never
//! handles a token, so it cannot send the wrong one (an old token kept across a loss, a
//! token of another Lease); and a program in any language gets the fence with one HTTP
//! request, without an S3 library that signs conditional PUTs and metadata.
//!
//! - **Not held, not written**: a grant that is waiting, lost or released is refused
//!   before any request to the store (409 `grant_not_held`, `grant_lost`). A grant the
//!   agent still believes held may be stale already (a frozen agent, a partition): the
//!   store decides, and refuses a token below the object's (409 `stale_token`, with the
//!   highest token), as it refuses any stale holder.
//! - **Configuration at first use**, from the agent's environment, the variables every
//!   AWS tool reads (`S3Config::from_env`): an agent without them still holds Leases,
//!   and says which variables are missing when an object is written (503
//!   `object_store_not_configured`). One fence per bucket, kept for the agent's life.
//! - **Bounded bodies** ([`MAX_OBJECT_BYTES`]): the agent is a sidecar with a small
//!   memory limit, and a single PUT holds the whole object in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::Agent;
use super::routes::grant_of;
use super::session::{Phase, SessionGrant};
use super::wire::{HttpError, json};
use crate::fence::Stale;
use crate::fence::s3::{Error as S3Error, S3Config, S3Fence};

/// The largest object body the agent takes (16 MiB).
pub const MAX_OBJECT_BYTES: usize = 16 << 20;
/// The response header that carries an object's token on a `GET`.
pub const TOKEN_HEADER: &str = "palisade-fencing-token";

/// The path's parameters: session, Lease namespace and name, bucket, key.
type ObjectPath = (String, String, String, String, String);

/// One fence per bucket, made at first use.
#[derive(Default)]
pub struct Fences {
    by_bucket: Mutex<HashMap<String, S3Fence>>,
}

impl Fences {
    fn of(&self, bucket: &str) -> Result<S3Fence, HttpError> {
        let mut fences = self.by_bucket.lock().unwrap();
        if let Some(fence) = fences.get(bucket) {
            return Ok(fence.clone());
        }
        let fence = S3Config::from_env(bucket)
            .and_then(|config| S3Fence::new(&config))
            .map_err(|e| {
                HttpError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "object_store_not_configured",
                    format!(
                        "the agent cannot write objects: {e}; give the agent AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_REGION, AWS_ENDPOINT_URL_S3 for a server other than AWS S3) in its environment"
                    ),
                )
            })?;
        fences.insert(bucket.to_owned(), fence.clone());
        Ok(fence)
    }
}

/// The answer to a write: an error of the API, or the fence's refusal.
pub enum Refusal {
    Http(HttpError),
    Stale(Stale),
}

impl From<HttpError> for Refusal {
    fn from(e: HttpError) -> Self {
        Refusal::Http(e)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StaleBody<'a> {
    error: &'a str,
    message: String,
    key: &'a str,
    token: u64,
    highest: u64,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Http(e) => e.into_response(),
            Refusal::Stale(stale) => json(
                StatusCode::CONFLICT,
                &StaleBody {
                    error: "stale_token",
                    message: format!(
                        "{stale}: a newer holder of the Lease wrote the object; nothing was written, stop writing"
                    ),
                    key: &stale.key,
                    token: stale.token,
                    highest: stale.highest,
                },
            ),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WrittenView {
    bucket: String,
    key: String,
    token: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    etag: Option<String>,
}

pub async fn put_object(
    State(agent): State<Arc<Agent>>,
    Path((id, namespace, name, bucket, key)): Path<ObjectPath>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    let session = agent.session(&id)?;
    let grant = grant_of(&session, namespace, name)?;
    check_bucket(&bucket)?;
    let body = body.map_err(|e| {
        HttpError::new(
            e.status(),
            "invalid_body",
            format!("the object's body cannot be read ({e}); at most {MAX_OBJECT_BYTES} bytes"),
        )
    })?;
    let token = held_token(&grant)?;
    let fence = agent.objects.of(&bucket)?;
    let written = fence
        .put(&key, token, body.to_vec())
        .await
        .map_err(|e| store_error(e, &bucket))?;
    let view = WrittenView {
        bucket,
        key,
        token: written.token,
        previous_token: written.previous,
        etag: written.etag,
    };
    Ok(json(StatusCode::OK, &view))
}

/// The payload as written (without the fence's envelope), its token in a header.
pub async fn get_object(
    State(agent): State<Arc<Agent>>,
    Path((id, namespace, name, bucket, key)): Path<ObjectPath>,
) -> Result<Response, Refusal> {
    let session = agent.session(&id)?;
    grant_of(&session, namespace, name)?;
    check_bucket(&bucket)?;
    let fence = agent.objects.of(&bucket)?;
    let object = fence
        .get(&key)
        .await
        .map_err(|e| store_error(e, &bucket))?
        .ok_or_else(|| {
            HttpError::new(
                StatusCode::NOT_FOUND,
                "no_such_object",
                format!("there is no object {key:?} in bucket {bucket:?}"),
            )
        })?;
    let token = HeaderValue::from(object.token);
    let kind = HeaderValue::from_static("application/octet-stream");
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, kind),
            (TOKEN_HEADER.parse().unwrap(), token),
        ],
        object.payload,
    )
        .into_response())
}

/// The grant's token while it is held; the reason it is not otherwise.
fn held_token(grant: &SessionGrant) -> Result<u64, HttpError> {
    let lease = format!("{}/{}", grant.key.namespace, grant.key.name);
    let refused = |code, message: String| HttpError::new(StatusCode::CONFLICT, code, message);
    match &*grant.phase().borrow() {
        Phase::Held { token, .. } => u64::try_from(*token).map_err(|_| {
            refused(
                "grant_not_held",
                format!("the grant of Lease {lease} has a negative token {token}"),
            )
        }),
        Phase::Waiting { .. } => Err(refused(
            "grant_not_held",
            format!(
                "the grant of Lease {lease} is still waiting: nothing is written before it is held"
            ),
        )),
        Phase::Lost { message, .. } => Err(refused(
            "grant_lost",
            format!("the grant of Lease {lease} is lost ({message}): stop writing"),
        )),
        Phase::Released { .. } => Err(refused(
            "grant_not_held",
            format!("the grant of Lease {lease} was released: acquire it again to write"),
        )),
    }
}

/// S3's bucket names: 3 to 63 lowercase letters, digits, '.' and '-', starting and
/// ending with a letter or digit. Checked here so that the error names the field.
fn check_bucket(bucket: &str) -> Result<(), HttpError> {
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let valid = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && edge(bucket.as_bytes().first())
        && edge(bucket.as_bytes().last());
    if valid {
        return Ok(());
    }
    Err(HttpError::field(
        "invalid_field",
        "bucket",
        format!(
            "bucket {bucket:?} is not an S3 bucket name (3 to 63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit)"
        ),
    ))
}

/// The fence's errors as answers: the stale token is the client's to act on; the rest
/// name the store's problem.
fn store_error(error: S3Error, bucket: &str) -> Refusal {
    let http = |status, code, message: String| Refusal::Http(HttpError::new(status, code, message));
    match error {
        S3Error::Stale(stale) => Refusal::Stale(stale),
        S3Error::BadInput(message) => {
            Refusal::Http(HttpError::field("invalid_field", "key", message))
        }
        S3Error::NoBucket { .. } => http(
            StatusCode::NOT_FOUND,
            "no_such_bucket",
            format!("bucket {bucket:?} does not exist in the object store"),
        ),
        e @ S3Error::Unfenced { .. } => {
            http(StatusCode::CONFLICT, "unfenced_object", e.to_string())
        }
        e => http(
            StatusCode::BAD_GATEWAY,
            "object_store_error",
            error_chain(&e),
        ),
    }
}

/// An error and its sources, for the message.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_are_checked() {
        for good in ["abc", "palisade-tests", "a.b-c.1", &"a".repeat(63)] {
            assert!(check_bucket(good).is_ok(), "{good}");
        }
        for bad in ["ab", "Abc", "-abc", "abc.", "a_b", &"a".repeat(64)] {
            let e = check_bucket(bad).unwrap_err();
            assert_eq!(
                (e.code, e.field.as_deref()),
                ("invalid_field", Some("bucket")),
                "{bad}"
            );
        }
    }
}
