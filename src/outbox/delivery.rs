//! One delivery: an HTTP POST of the intent's payload with `Idempotency-Key: <intent
//! id>`, bounded by a timeout, and what the provider answered. Plain HTTP and HTTPS
//! (the system's roots), HTTP/1.1; pooled connections, so a batch reuses them.
//!
//! Every request has a deadline: a provider that never answers costs one timeout,
//! and the intent stays pending for a retry with the same key. The answer body kept
//! is at most [`MAX_ANSWER_BYTES`], enough for a provider's error object, so one
//! huge answer cannot bloat the table.

use std::io::Cursor;
use std::time::Duration;

use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::error_chain;

/// The header the provider deduplicates by.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The longest answer body recorded, in bytes (longer ones are cut, on a char boundary).
pub const MAX_ANSWER_BYTES: usize = 4096;

/// A request body of owned bytes (`Cursor<Vec<u8>>` is a `bytes::Buf`).
type Body = Full<Cursor<Vec<u8>>>;

/// What a delivery attempt came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The provider's HTTP status; `None` when there was no answer (timeout,
    /// connection refused or cut), which is retried.
    pub status: Option<u16>,
    /// The provider's body, or why there was no answer.
    pub text: String,
}

/// An HTTP client for one endpoint.
#[derive(Clone)]
pub(crate) struct Deliverer {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    endpoint: Uri,
    timeout: Duration,
}

impl Deliverer {
    pub(crate) fn new(endpoint: Uri, timeout: Duration) -> std::io::Result<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_native_roots()?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            endpoint,
            timeout,
        })
    }

    /// POSTs `payload` (JSON) with the intent's id as its idempotency key.
    pub(crate) async fn deliver(&self, intent_id: &str, payload: String) -> Answer {
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_KEY, intent_id)
            .body(Full::new(Cursor::new(payload.into_bytes())));
        let request = match request {
            Ok(request) => request,
            Err(e) => return no_answer(format!("cannot build the request: {e}")),
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok((status, body))) => Answer {
                status: Some(status),
                text: truncated(&String::from_utf8_lossy(&body)),
            },
            Ok(Err(e)) => no_answer(format!("no answer: {}", error_chain(&*e))),
            Err(_) => no_answer(format!("no answer within {:?}", self.timeout)),
        }
    }
}

fn no_answer(text: String) -> Answer {
    Answer { status: None, text }
}

fn truncated(text: &str) -> String {
    if text.len() <= MAX_ANSWER_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_ANSWER_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_answers_are_cut_on_a_char_boundary() {
        assert_eq!(truncated("short"), "short");
        let long = "é".repeat(MAX_ANSWER_BYTES);
        let cut = truncated(&long);
        assert!(cut.len() <= MAX_ANSWER_BYTES && cut.len() >= MAX_ANSWER_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
