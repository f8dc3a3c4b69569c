//! The S3 requests the fence and the probe make: HEAD, GET, conditional PUT, DELETE and
//! CREATE BUCKET, each signed (SigV4 by rusty-s3, as a presigned URL whose signed
//! headers include the conditions and metadata), sent with hyper, and bounded by the
//! configured timeout. Answers are returned as they are ([`Reply`]); what a status means
//! for the fence is decided by its callers.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

use super::{Error, S3Config};

/// How long a signed URL stays valid: longer than any request's timeout.
const SIGNATURE_LIFETIME: Duration = Duration::from_secs(300);
/// The largest error body kept for a message.
const MAX_ERROR_BODY: usize = 512;

/// A precondition of a PUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// No precondition (an unfenced write: the probe's baselines, the bench's plain PUT).
    None,
    /// `If-None-Match: *`: only if the key has no object.
    Absent,
    /// `If-Match: ETAG`: only if the object's ETag is this one.
    Matches(String),
}

/// An answer: status, headers, and the body (empty for HEAD).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn etag(&self) -> Option<String> {
        self.header("etag")
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// The `<Code>` of an S3 error body (e.g. `NoSuchBucket`), when there is one.
    pub fn error_code(&self) -> Option<String> {
        let text = std::str::from_utf8(&self.body).ok()?;
        let start = text.find("<Code>")? + "<Code>".len();
        let end = start + text[start..].find("</Code>")?;
        Some(text[start..end].to_owned())
    }

    /// The status and the start of the body, for an error message.
    pub fn describe(&self) -> String {
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(MAX_ERROR_BODY)]);
        format!("HTTP {}: {}", self.status.as_u16(), body.trim())
    }
}

type RequestBody = UnsyncBoxBody<Bytes, Infallible>;

/// A body sent in two parts, the second only once `release` is ready: the probe's
/// racing writers send all but their last byte, then finish together.
struct HeldBody {
    first: Option<Bytes>,
    release: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    last: Option<Bytes>,
    len: u64,
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if let Some(release) = self.release.as_mut() {
            if release.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.release = None;
        }
        Poll::Ready(self.last.take().map(|last| Ok(Frame::data(last))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// One bucket on one server, with the credentials that sign every request.
#[derive(Clone)]
pub struct S3Client {
    http: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, RequestBody>,
    bucket: Bucket,
    credentials: Credentials,
    timeout: Duration,
}

impl std::fmt::Debug for S3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Client")
            .field("bucket", &self.bucket.name())
            .field("endpoint", &self.bucket.base_url().as_str())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl S3Client {
    pub fn new(config: &S3Config) -> Result<Self, Error> {
        let endpoint = config
            .endpoint
            .parse()
            .map_err(|e| Error::Config(format!("endpoint {:?}: {e}", config.endpoint)))?;
        // Path-style for a custom endpoint: a bucket name need not be a DNS label there,
        // and 127.0.0.1 has no subdomains.
        let style = if config.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(
            endpoint,
            style,
            config.bucket.clone(),
            config.region.clone(),
        )
        .map_err(|e| Error::Config(format!("bucket {:?}: {e}", config.bucket)))?;
        let credentials = match &config.session_token {
            Some(token) => Credentials::new_with_token(
                config.access_key_id.clone(),
                config.secret_access_key.clone(),
                token.clone(),
            ),
            None => Credentials::new(
                config.access_key_id.clone(),
                config.secret_access_key.clone(),
            ),
        };
        let https = config.endpoint.starts_with("https://");
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.timeout));
        let http =
            HyperClient::builder(TokioExecutor::new()).build(tls_connector(https, connector)?);
        Ok(S3Client {
            http,
            bucket,
            credentials,
            timeout: config.timeout,
        })
    }

    pub fn bucket_name(&self) -> &str {
        self.bucket.name()
    }

    pub async fn head(&self, key: &str) -> Result<Reply, Error> {
        let action = self.bucket.head_object(Some(&self.credentials), key);
        self.send(Method::HEAD, action, &[], empty(), 0).await
    }

    pub async fn get(&self, key: &str) -> Result<Reply, Error> {
        let action = self.bucket.get_object(Some(&self.credentials), key);
        self.send(Method::GET, action, &[], empty(), 0).await
    }

    pub async fn delete(&self, key: &str) -> Result<Reply, Error> {
        let action = self.bucket.delete_object(Some(&self.credentials), key);
        self.send(Method::DELETE, action, &[], empty(), 0).await
    }

    pub async fn create_bucket(&self) -> Result<Reply, Error> {
        let action = self.bucket.create_bucket(&self.credentials);
        self.send(Method::PUT, action, &[], empty(), 0).await
    }

    /// PUT `body` at `key` under `condition`, with `x-amz-meta-*` headers `metadata`
    /// (names in lowercase, without the prefix).
    pub async fn put(
        &self,
        key: &str,
        body: Bytes,
        condition: &Condition,
        metadata: &[(&str, &str)],
    ) -> Result<Reply, Error> {
        let headers: Vec<(String, String)> = metadata
            .iter()
            .map(|(name, value)| (format!("x-amz-meta-{name}"), (*value).to_owned()))
            .collect();
        let headers = condition_headers(condition, headers);
        let action = self.bucket.put_object(Some(&self.credentials), key);
        let len = body.len() as u64;
        let body = Full::new(body).boxed_unsync();
        self.send(Method::PUT, action, &headers, body, len).await
    }

    /// [`put`](Self::put) with `body` sent all but its last byte first, and the last
    /// byte only once `release` is ready (the probe's racing writers).
    pub async fn put_held(
        &self,
        key: &str,
        mut body: Bytes,
        condition: &Condition,
        release: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Reply, Error> {
        let headers = condition_headers(condition, Vec::new());
        let action = self.bucket.put_object(Some(&self.credentials), key);
        let len = body.len() as u64;
        let last = body.split_off(body.len().saturating_sub(1));
        let held = HeldBody {
            first: Some(body),
            release: Some(Box::pin(release)),
            last: Some(last),
            len,
        };
        self.send(Method::PUT, action, &headers, held.boxed_unsync(), len)
            .await
    }

    /// Signs `action` with `headers` among its signed headers and sends it.
    async fn send<'a, A: S3Action<'a>>(
        &self,
        method: Method,
        mut action: A,
        headers: &'a [(String, String)],
        body: RequestBody,
        len: u64,
    ) -> Result<Reply, Error> {
        for (name, value) in headers {
            action.headers_mut().insert(name.as_str(), value.as_str());
        }
        let url = action.sign(SIGNATURE_LIFETIME);
        let mut request = Request::builder().method(method.clone()).uri(url.as_str());
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if method == Method::PUT {
            // hyper leaves it out for an empty body, which S3 answers with 411.
            request = request.header(http::header::CONTENT_LENGTH, len);
        }
        let request = request
            .body(body)
            .map_err(|e| Error::Config(format!("cannot build the {method} request: {e}")))?;
        let exchange = async {
            let response = self.http.request(request).await.map_err(|e| Error::Http {
                what: method.to_string(),
                source: Box::new(e),
            })?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| Error::Http {
                what: format!("{method} (reading the answer)"),
                source: Box::new(e),
            })?;
            Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                body: body.to_bytes(),
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Error::Timeout {
                what: method.to_string(),
                after: self.timeout,
            })?
    }
}

fn empty() -> RequestBody {
    Full::new(Bytes::new()).boxed_unsync()
}

/// `headers` with those of `condition` added.
fn condition_headers(
    condition: &Condition,
    mut headers: Vec<(String, String)>,
) -> Vec<(String, String)> {
    match condition {
        Condition::None => {}
        Condition::Absent => headers.push(("if-none-match".into(), "*".into())),
        Condition::Matches(etag) => headers.push(("if-match".into(), etag.clone())),
    }
    headers
}

/// TLS with the system's roots for `https://` endpoints (ring, as everywhere in
/// palisade); none are loaded for plain `http://`, which never uses them.
fn tls_connector(
    https: bool,
    connector: HttpConnector,
) -> Result<hyper_rustls::HttpsConnector<HttpConnector>, Error> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = if https {
        builder
            .with_provider_and_native_roots(provider)
            .map_err(|e| Error::Config(format!("cannot load the system's CA roots: {e}")))?
    } else {
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS setup: {e}")))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        builder.with_tls_config(config)
    };
    Ok(builder
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector))
}
