//! Fencing in S3-compatible object stores: an object written only if its token is not
//! below the token recorded on the object, with the store's own conditional PUT as the
//! compare-and-swap. No lock service or database is involved: the object is its own
//! mark.
//!
//! [`S3Fence::put`] reads the object (HEAD: its ETag and the token in its metadata),
//! refuses a token below the recorded one ([`Error::Stale`], nothing written), and
//! writes with `If-Match: <that ETag>`, or `If-None-Match: *` when there is no object.
//! A 412 or 409 means another write came in between: it reads again and decides again
//! (bounded: [`Error::Contended`] after [`S3Config::max_attempts`]). The token travels
//! with the write, so the read-decide-write is one compare-and-swap on the object.
//!
//! # Why it is built this way
//!
//! - *The envelope, against ETag ABA.* A single-part PUT's ETag is the MD5 of its
//!   bytes, and metadata does not change it. With the token in metadata only, a stale
//!   writer (token 5) that read ETag E0 of bytes W would be let through by
//!   `If-Match: E0` after the new holder (token 6) wrote W again, directly or after
//!   other writes: the ETag came back, the token went down. So every fenced write
//!   stores a header line before the payload, `palisade-fence/1 token=T write=ID\n`
//!   ([`envelope`]), with a write id no other write shares: no two writes store the
//!   same bytes, an ETag never repeats, and an `If-Match` holds only against the very
//!   object that was read. [`S3Fence::get`] checks and strips the line. The token is
//!   also in the metadata (`x-amz-meta-palisade-token`) so a HEAD decides without
//!   reading the payload. Readers that bypass [`S3Fence::get`] see the header line.
//! - *An object without a palisade token is refused* ([`Error::Unfenced`]), not
//!   overwritten: it was written by something that does not fence, and treating it as
//!   token 0 would let any holder, however stale, replace it. Delete it, or write it
//!   through the fence from the start.
//! - *Deleting an object deletes its mark.* The next `put` finds no object and creates
//!   it with `If-None-Match: *` whatever its token, as a deleted file store starts over.
//!   Fenced objects are replaced, never deleted, while stale holders may exist.
//! - *A server that ignores or races the conditions defeats the fence*: a stale write
//!   whose precondition such a server does not check lands. Nothing at the client can
//!   tell, so [`probe`] (`palisade fence check s3://BUCKET/PREFIX`) tests a server
//!   before it is trusted: wrong preconditions must get 412, and of racing conditional
//!   writers exactly one may win.
//! - *404 on a PUT* is `NoSuchBucket` ([`Error::NoBucket`]) or, with `If-Match`, an
//!   object deleted since the read (read again). 403 is [`Error::Denied`].
//! - *Requests* are SigV4 presigned URLs (rusty-s3) whose signed headers include the
//!   conditions and metadata, sent with hyper; path-style addressing for a custom
//!   endpoint; every request bounded by [`S3Config::timeout`]. Single PUTs only (up
//!   to 5 GB): a multipart upload's ETag and its completion's conditions differ.
//! - *GCS and Azure* need no envelope: a GCS object's generation changes on every write
//!   (`ifGenerationMatch`, and `ifGenerationMatch=0` to create) and an Azure blob's ETag
//!   on every write (`If-Match`, `If-None-Match: *`), so neither can repeat.

mod client;
pub mod envelope;
pub mod probe;

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

pub use client::{Condition, Reply, S3Client};

use super::Stale;

/// Longest key, in bytes of UTF-8: the same for every fence.
pub const MAX_KEY_BYTES: usize = super::MAX_KEY_BYTES;
/// The metadata field of the token (`x-amz-meta-palisade-token`).
pub const TOKEN_METADATA: &str = "palisade-token";
/// The metadata field of the write id (`x-amz-meta-palisade-write`).
pub const WRITE_METADATA: &str = "palisade-write";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token is lower than the one on the object: the caller lost its Lease to a
    /// holder that has written since. Nothing was written. Do not retry.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The key or token cannot be fenced (empty key, key over [`MAX_KEY_BYTES`], token
    /// beyond i64).
    #[error("cannot fence: {0}")]
    BadInput(String),
    /// The configuration is incomplete or wrong (a missing credential, a bad endpoint).
    #[error("S3 configuration: {0}")]
    Config(String),
    /// The object exists but was not written by the fence: refused, not overwritten.
    #[error(
        "object {key:?} exists without a palisade fencing token (written unfenced?); \
         refusing to overwrite it: delete it or write it through the fence from the start"
    )]
    Unfenced { key: String },
    /// The object's token metadata or envelope cannot be read.
    #[error("object {key:?} is not a valid fenced object: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("bucket {bucket:?} does not exist")]
    NoBucket { bucket: String },
    #[error(
        "access denied to bucket {bucket:?} ({detail}); check AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY"
    )]
    Denied { bucket: String, detail: String },
    /// Other writers kept changing the object between the read and the conditional PUT.
    #[error("object {key:?} kept changing under {attempts} conditional writes; gave up")]
    Contended { key: String, attempts: u32 },
    #[error("S3 {what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("S3 {what} failed")]
    Http {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An answer the fence does not expect (a 5xx, a 400, ...).
    #[error("S3 {what} of {key:?}: {detail}")]
    Unexpected {
        what: &'static str,
        key: String,
        detail: String,
    },
}

/// Where and as whom: one bucket on one server.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// `http(s)://host[:port]`.
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`): set for a custom endpoint.
    pub path_style: bool,
    /// The bound on every request.
    pub timeout: Duration,
    /// Conditional PUTs tried before [`Error::Contended`].
    pub max_attempts: u32,
}

impl S3Config {
    /// From the standard AWS environment: `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`
    /// (a custom endpoint, addressed path-style; AWS S3 of the region otherwise),
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`
    /// or `AWS_DEFAULT_REGION` (default `us-east-1`).
    pub fn from_env(bucket: &str) -> Result<Self, Error> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let required =
            |name: &str| env(name).ok_or_else(|| Error::Config(format!("{name} is not set")));
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_owned());
        let custom = env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"));
        let path_style = custom.is_some();
        let endpoint = custom.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        Ok(S3Config {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            region,
            bucket: bucket.to_owned(),
            access_key_id: required("AWS_ACCESS_KEY_ID")?,
            secret_access_key: required("AWS_SECRET_ACCESS_KEY")?,
            session_token: env("AWS_SESSION_TOKEN"),
            path_style,
            timeout: Duration::from_secs(10),
            max_attempts: 16,
        })
    }
}

/// A successful fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub token: u64,
    /// The token on the object before; `None` when this write created it.
    pub previous: Option<u64>,
    /// The new object's ETag, as the server gave it.
    pub etag: Option<String>,
    /// Conditional PUTs it took (1 without contention).
    pub attempts: u32,
}

/// A fenced object, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedObject {
    pub token: u64,
    /// The bytes given to [`S3Fence::put`], without the envelope.
    pub payload: Vec<u8>,
    pub etag: Option<String>,
}

/// What a HEAD found.
#[derive(Debug)]
enum Found {
    Nothing,
    Object { etag: String, token: u64 },
}

/// The object-store fence on one bucket.
#[derive(Debug, Clone)]
pub struct S3Fence {
    client: S3Client,
    max_attempts: u32,
}

impl S3Fence {
    pub fn new(config: &S3Config) -> Result<Self, Error> {
        Ok(S3Fence {
            client: S3Client::new(config)?,
            max_attempts: config.max_attempts.max(1),
        })
    }

    /// The requests underneath, for setup (creating the bucket) and the probe.
    pub fn client(&self) -> &S3Client {
        &self.client
    }

    /// Writes `body` at `key` if `token` is not below the token on the object (equal
    /// passes: one holder writes many times). [`Error::Stale`] writes nothing.
    pub async fn put(&self, key: &str, token: u64, body: Vec<u8>) -> Result<Written, Error> {
        validate(key, token)?;
        let write_id = envelope::write_id();
        let bytes = Bytes::from(envelope::wrap(token, &write_id, &body));
        let token_text = token.to_string();
        let metadata = [
            (TOKEN_METADATA, token_text.as_str()),
            (WRITE_METADATA, write_id.as_str()),
        ];
        for attempt in 1..=self.max_attempts {
            let (condition, previous) = match self.read_mark(key).await? {
                Found::Nothing => (Condition::Absent, None),
                Found::Object { token: highest, .. } if token < highest => {
                    return Err(Error::Stale(Stale {
                        key: key.to_owned(),
                        token,
                        highest,
                    }));
                }
                Found::Object { etag, token } => (Condition::Matches(etag), Some(token)),
            };
            let reply = self
                .client
                .put(key, bytes.clone(), &condition, &metadata)
                .await?;
            if reply.status.is_success() {
                return Ok(Written {
                    token,
                    previous,
                    etag: reply.etag(),
                    attempts: attempt,
                });
            }
            self.lost_race(key, &condition, &reply)?;
            // Contention: back off a little (at most 160 ms) before reading again.
            let backoff = Duration::from_millis(5 << attempt.min(5));
            tokio::time::sleep(backoff).await;
        }
        Err(Error::Contended {
            key: key.to_owned(),
            attempts: self.max_attempts,
        })
    }

    /// `Ok` when a failed PUT means "another write came in between: read again".
    fn lost_race(&self, key: &str, condition: &Condition, reply: &Reply) -> Result<(), Error> {
        match reply.status {
            // 412: the precondition failed; 409: a concurrent conditional write
            // (S3's ConditionalRequestConflict).
            StatusCode::PRECONDITION_FAILED | StatusCode::CONFLICT => Ok(()),
            StatusCode::NOT_FOUND => match reply.error_code().as_deref() {
                Some("NoSuchBucket") => Err(self.no_bucket()),
                // If-Match on an object deleted since the read.
                _ if matches!(condition, Condition::Matches(_)) => Ok(()),
                _ => Err(self.no_bucket()),
            },
            status => Err(self.unexpected("PUT", key, reply, status)),
        }
    }

    /// The object and its token, as stored with it, from the fenced bytes: `None` when
    /// there is no object.
    pub async fn get(&self, key: &str) -> Result<Option<FencedObject>, Error> {
        validate_key(key)?;
        let reply = self.client.get(key).await?;
        match reply.status {
            StatusCode::NOT_FOUND if reply.error_code().as_deref() == Some("NoSuchBucket") => {
                Err(self.no_bucket())
            }
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => {
                let unwrapped = envelope::unwrap(&reply.body).map_err(|e| match e {
                    envelope::NotFenced::Missing => Error::Unfenced {
                        key: key.to_owned(),
                    },
                    envelope::NotFenced::Damaged(reason) => Error::Corrupt {
                        key: key.to_owned(),
                        reason,
                    },
                })?;
                Ok(Some(FencedObject {
                    token: unwrapped.token,
                    payload: unwrapped.payload.to_vec(),
                    etag: reply.etag(),
                }))
            }
            status => Err(self.unexpected("GET", key, &reply, status)),
        }
    }

    /// HEAD: the ETag and the token from the metadata.
    async fn read_mark(&self, key: &str) -> Result<Found, Error> {
        let reply = self.client.head(key).await?;
        match reply.status {
            // No object, or no bucket (a HEAD has no body to tell): the create's
            // If-None-Match PUT finds out which.
            StatusCode::NOT_FOUND => Ok(Found::Nothing),
            status if status.is_success() => {
                let text = reply
                    .header(&format!("x-amz-meta-{TOKEN_METADATA}"))
                    .ok_or_else(|| Error::Unfenced {
                        key: key.to_owned(),
                    })?;
                let token = text.parse::<u64>().map_err(|_| Error::Corrupt {
                    key: key.to_owned(),
                    reason: format!("token metadata {text:?} is not an unsigned integer"),
                })?;
                let etag = reply.etag().ok_or_else(|| Error::Corrupt {
                    key: key.to_owned(),
                    reason: "the server gave no ETag".into(),
                })?;
                Ok(Found::Object { etag, token })
            }
            status => Err(self.unexpected("HEAD", key, &reply, status)),
        }
    }

    fn no_bucket(&self) -> Error {
        Error::NoBucket {
            bucket: self.client.bucket_name().to_owned(),
        }
    }

    fn unexpected(
        &self,
        what: &'static str,
        key: &str,
        reply: &Reply,
        status: StatusCode,
    ) -> Error {
        if status == StatusCode::FORBIDDEN {
            return Error::Denied {
                bucket: self.client.bucket_name().to_owned(),
                detail: reply.describe(),
            };
        }
        Error::Unexpected {
            what,
            key: key.to_owned(),
            detail: reply.describe(),
        }
    }
}

fn validate_key(key: &str) -> Result<(), Error> {
    super::check_key(key).map_err(Error::BadInput)
}

/// The checks of every fence: a key S3 can store, a token that fits in i64.
fn validate(key: &str, token: u64) -> Result<(), Error> {
    super::check_key_and_token(key, token, "a signed 64-bit integer")
        .map(drop)
        .map_err(Error::BadInput)
}
