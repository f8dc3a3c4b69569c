//! The agent's JSON on the wire: request bodies checked field by field (so that an
//! error names the field and the rule, which serde's messages do not do reliably),
//! and the error body every 4xx and 5xx carries. The schema is `openapi.yaml`.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::crd::{MAX_LEASE_DURATION_SECONDS, MAX_PERMITS};

pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(5);
pub const MIN_KEEPALIVE_MS: u64 = 1_000;
pub const MAX_KEEPALIVE_MS: u64 = 60_000;
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The longest a request may wait for a grant: a long poll, resumed by the next one.
pub const MAX_WAIT_MS: u64 = 30_000;
pub const DEFAULT_DURATION_SECS: i64 = 15;
const MAX_IDENTITY_LEN: usize = 253;
const MAX_SESSION_NAME_LEN: usize = 63;

/// An error answer: `{"error": code, "field": ..., "message": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: StatusCode,
    pub code: &'static str,
    pub field: Option<String>,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            field: None,
            message: message.into(),
        }
    }

    pub fn field(code: &'static str, field: &str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, code, message)
        }
    }

    pub fn unknown_session(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!(
                "no session {id}: it ended (its keepalive was missed, its event stream closed, or it was deleted) or never existed; start a new one"
            ),
        )
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    message: &'a str,
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code,
            field: self.field.as_deref(),
            message: &self.message,
        };
        json(self.status, &body)
    }
}

/// A JSON answer.
pub fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(body).expect("the agent's answers serialize");
    (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRequest {
    pub keepalive: Duration,
    pub name: Option<String>,
}

/// `POST /v1/sessions/{session}/leases`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    pub name: String,
    pub namespace: Option<String>,
    pub duration_secs: i64,
    pub holder_identity: Option<String>,
    pub wait: Duration,
    /// Only this slot of a semaphore (the claim's `spec.slot`); None: any slot.
    pub slot: Option<i32>,
}

pub fn session_request(headers: &HeaderMap, body: &[u8]) -> Result<SessionRequest, HttpError> {
    let mut fields = FieldReader::new(headers, body, true, &["keepaliveMs", "name"])?;
    let keepalive_ms = fields.integer("keepaliveMs", MIN_KEEPALIVE_MS, MAX_KEEPALIVE_MS)?;
    let name = fields.string("name", MAX_SESSION_NAME_LEN)?;
    fields.finish()?;
    Ok(SessionRequest {
        keepalive: keepalive_ms.map_or(DEFAULT_KEEPALIVE, Duration::from_millis),
        name,
    })
}

pub fn acquire_request(headers: &HeaderMap, body: &[u8]) -> Result<AcquireRequest, HttpError> {
    let known = [
        "name",
        "namespace",
        "durationSeconds",
        "holderIdentity",
        "waitMs",
        "slot",
    ];
    let mut fields = FieldReader::new(headers, body, false, &known)?;
    let name = fields.string("name", 63)?.ok_or_else(|| {
        HttpError::field(
            "missing_field",
            "name",
            "name (the Lease's name) is required",
        )
    })?;
    check_dns_label("name", &name)?;
    let namespace = fields.string("namespace", 63)?;
    if let Some(ns) = &namespace {
        check_dns_label("namespace", ns)?;
    }
    let duration_secs = fields
        .integer("durationSeconds", 1, MAX_LEASE_DURATION_SECONDS as u64)?
        .map_or(DEFAULT_DURATION_SECS, |d| d as i64);
    let holder_identity = fields.string("holderIdentity", MAX_IDENTITY_LEN)?;
    if holder_identity.as_deref() == Some("") {
        return Err(HttpError::field(
            "invalid_field",
            "holderIdentity",
            "holderIdentity must not be empty (leave it out for the pod's name)",
        ));
    }
    let wait = fields
        .integer("waitMs", 0, MAX_WAIT_MS)?
        .map_or(DEFAULT_WAIT, Duration::from_millis);
    // Any slot a semaphore can have; one at or above the Lease's permits waits until
    // they are raised, as the claim would (the agent does not read the Lease first).
    let slot = fields
        .integer("slot", 0, MAX_PERMITS as u64 - 1)?
        .map(|s| s as i32);
    fields.finish()?;
    Ok(AcquireRequest {
        name,
        namespace,
        duration_secs,
        holder_identity,
        wait,
        slot,
    })
}

/// `waitMs` of a query string (`GET .../leases/{namespace}/{name}?waitMs=N`).
pub fn wait_query(query: Option<&str>) -> Result<Duration, HttpError> {
    let mut wait = Duration::ZERO;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "waitMs" {
            return Err(HttpError::field(
                "unknown_field",
                key,
                format!("unknown query parameter {key:?} (only waitMs)"),
            ));
        }
        wait = match value.parse::<u64>() {
            Ok(ms) if ms <= MAX_WAIT_MS => Duration::from_millis(ms),
            _ => {
                return Err(HttpError::field(
                    "invalid_field",
                    "waitMs",
                    format!("waitMs must be an integer from 0 to {MAX_WAIT_MS}, not {value:?}"),
                ));
            }
        };
    }
    Ok(wait)
}

/// A Lease's name and namespace are DNS labels (RFC 1123): the name doubles as a label
/// value (`palisade.dev/fenced-by`). Checked here so that the error names the field.
pub fn check_dns_label(field: &str, value: &str) -> Result<(), HttpError> {
    let valid = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(HttpError::field(
            "invalid_field",
            field,
            format!(
                "{field} {value:?} is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
            ),
        ))
    }
}

/// Takes the fields of a JSON object one by one; `finish` refuses any left over.
struct FieldReader {
    fields: Map<String, Value>,
}

impl FieldReader {
    /// Refuses fields other than `known` first: a misspelt field is the likely cause
    /// of a missing one.
    fn new(
        headers: &HeaderMap,
        body: &[u8],
        empty_ok: bool,
        known: &[&str],
    ) -> Result<Self, HttpError> {
        let reader = Self::parse(headers, body, empty_ok)?;
        match reader.fields.keys().find(|k| !known.contains(&k.as_str())) {
            Some(field) => Err(HttpError::field(
                "unknown_field",
                field,
                format!("unknown field {field:?} (known: {})", known.join(", ")),
            )),
            None => Ok(reader),
        }
    }

    fn parse(headers: &HeaderMap, body: &[u8], empty_ok: bool) -> Result<Self, HttpError> {
        if let Some(kind) = headers.get(header::CONTENT_TYPE) {
            let kind = kind.to_str().unwrap_or("");
            let essence = kind.split(';').next().unwrap_or("").trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                return Err(HttpError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    format!("the body must be application/json, not {kind:?}"),
                ));
            }
        }
        if body.iter().all(u8::is_ascii_whitespace) && empty_ok {
            return Ok(Self { fields: Map::new() });
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(fields)) => Ok(Self { fields }),
            Ok(_) => Err(HttpError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "the body must be a JSON object",
            )),
            Err(e) => Err(HttpError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the body is not JSON: {e}"),
            )),
        }
    }

    fn integer(&mut self, field: &str, min: u64, max: u64) -> Result<Option<u64>, HttpError> {
        match self.fields.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some_and(|v| (min..=max).contains(&v)) => {
                Ok(n.as_u64())
            }
            Some(other) => Err(HttpError::field(
                "invalid_field",
                field,
                format!("{field} must be an integer from {min} to {max}, not {other}"),
            )),
        }
    }

    fn string(&mut self, field: &str, max_len: usize) -> Result<Option<String>, HttpError> {
        match self.fields.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() <= max_len => Ok(Some(s)),
            Some(Value::String(s)) => Err(HttpError::field(
                "invalid_field",
                field,
                format!("{field} is {} characters long; at most {max_len}", s.len()),
            )),
            Some(other) => Err(HttpError::field(
                "invalid_field",
                field,
                format!("{field} must be a string, not {other}"),
            )),
        }
    }

    fn finish(self) -> Result<(), HttpError> {
        debug_assert!(self.fields.is_empty(), "every known field is read");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(body: &str) -> Result<AcquireRequest, HttpError> {
        acquire_request(&HeaderMap::new(), body.as_bytes())
    }

    fn refused(body: &str) -> (&'static str, Option<String>) {
        let e = acquire(body).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
        (e.code, e.field)
    }

    #[test]
    fn an_acquire_takes_its_defaults() {
        let request = acquire(r#"{"name": "billing"}"#).unwrap();
        assert_eq!(
            request,
            AcquireRequest {
                name: "billing".into(),
                namespace: None,
                duration_secs: DEFAULT_DURATION_SECS,
                holder_identity: None,
                wait: DEFAULT_WAIT,
                slot: None,
            }
        );
        let request = acquire(
            r#"{"name":"b","namespace":"pay","durationSeconds":6,"holderIdentity":"w-1","waitMs":0}"#,
        )
        .unwrap();
        assert_eq!(request.duration_secs, 6);
        assert_eq!(request.wait, Duration::ZERO);
        assert_eq!(request.namespace.as_deref(), Some("pay"));
        assert_eq!(request.slot, None, "any slot");
        for slot in [0, 5, 63] {
            let request = acquire(&format!(r#"{{"name":"b","slot":{slot}}}"#)).unwrap();
            assert_eq!(request.slot, Some(slot));
        }
        let request = acquire(r#"{"name":"b","slot":null}"#).unwrap();
        assert_eq!(
            request.slot, None,
            "null is any slot, as for every optional field"
        );
    }

    #[test]
    fn a_slot_outside_0_to_63_names_the_field() {
        for slot in ["64", "-1", "1.5", "\"2\"", "true", "4294967296"] {
            let e = acquire(&format!(r#"{{"name":"a","slot":{slot}}}"#)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{slot}");
            assert_eq!(
                (e.code, e.field.as_deref()),
                ("invalid_field", Some("slot")),
                "{slot}"
            );
            assert!(e.message.contains("from 0 to 63"), "{}", e.message);
        }
    }

    #[test]
    fn bad_acquires_name_the_field() {
        assert_eq!(refused("{}"), ("missing_field", Some("name".into())));
        assert_eq!(
            refused(r#"{"name":"Billing"}"#),
            ("invalid_field", Some("name".into()))
        );
        assert_eq!(
            refused(r#"{"name":"-a"}"#),
            ("invalid_field", Some("name".into()))
        );
        assert_eq!(
            refused(&format!(r#"{{"name":"{}"}}"#, "a".repeat(64))).1,
            Some("name".into())
        );
        assert_eq!(
            refused(r#"{"name":7}"#),
            ("invalid_field", Some("name".into()))
        );
        assert_eq!(
            refused(r#"{"name":"a","namespace":"a_b"}"#),
            ("invalid_field", Some("namespace".into()))
        );
        for d in ["0", "86401", "-1", "1.5", "\"15\""] {
            assert_eq!(
                refused(&format!(r#"{{"name":"a","durationSeconds":{d}}}"#)),
                ("invalid_field", Some("durationSeconds".into())),
                "{d}"
            );
        }
        assert_eq!(
            refused(r#"{"name":"a","waitMs":30001}"#),
            ("invalid_field", Some("waitMs".into()))
        );
        assert_eq!(
            refused(r#"{"name":"a","holderIdentity":""}"#),
            ("invalid_field", Some("holderIdentity".into()))
        );
        assert_eq!(
            refused(r#"{"name":"a","leaseName":"x"}"#),
            ("unknown_field", Some("leaseName".into()))
        );
        assert_eq!(refused("not json").0, "invalid_json");
        assert_eq!(refused("[1]").0, "invalid_json");
        assert_eq!(refused("").0, "invalid_json");
    }

    #[test]
    fn a_body_of_another_media_type_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        let e = acquire_request(&headers, br#"{"name":"a"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        headers.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert!(acquire_request(&headers, br#"{"name":"a"}"#).is_ok());
    }

    #[test]
    fn a_session_may_have_an_empty_body() {
        let request = session_request(&HeaderMap::new(), b"").unwrap();
        assert_eq!(request.keepalive, DEFAULT_KEEPALIVE);
        let request = session_request(&HeaderMap::new(), br#"{"keepaliveMs": 2000}"#).unwrap();
        assert_eq!(request.keepalive, Duration::from_millis(2000));
        let e = session_request(&HeaderMap::new(), br#"{"keepaliveMs": 999}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("keepaliveMs"));
    }

    #[test]
    fn wait_queries_are_bounded() {
        assert_eq!(wait_query(None).unwrap(), Duration::ZERO);
        assert_eq!(
            wait_query(Some("waitMs=250")).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            wait_query(Some("waitMs=30001"))
                .unwrap_err()
                .field
                .as_deref(),
            Some("waitMs")
        );
        assert_eq!(
            wait_query(Some("waitMs=x")).unwrap_err().code,
            "invalid_field"
        );
        assert_eq!(
            wait_query(Some("wait=1")).unwrap_err().code,
            "unknown_field"
        );
    }
}
