//! The client's watch of one object (a Lease, or its own claim): the object each time
//! it changes, `None` while it does not exist.
//!
//! Written here rather than taken from kube's `watcher::watch_object` because the
//! client's promise is that a connection that dies silently (no FIN, no RST) costs
//! seconds, and kube's watcher keeps it only for the stream: its list and the request
//! that starts each watch have no deadline unless the caller's `Client` has a read
//! timeout (kube's default has none), so a dead pooled connection would leave the
//! watch waiting for ever. It also yields nothing when a quiet watch ends and
//! resumes, so no wrapper can tell a healthy quiet watch from a dead one without
//! restarting it (a list and a watch) every few seconds.
//!
//! Here every request runs under [`CALL_TIMEOUT`](super::CALL_TIMEOUT), and a watch asks the API server
//! to end it after `timeout` seconds (`timeoutSeconds`). Anything the stream
//! delivers, its end included, shows the connection alive; a stream silent for
//! [`SILENCE_MARGIN`] past its timeout is dropped with its connection. Either way
//! it resumes from the last resourceVersion seen, without a list; only an expired
//! resourceVersion (410 Gone) lists again. A quiet watch so costs one request per
//! `timeout`, and a dead one is noticed within `timeout` plus the margin, or sooner
//! when its connection is PINGed (`kube_client`), which fails the stream itself.

use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::watcher::ExponentialBackoff;

use super::{Error, call};
use crate::kube_error::ApiErrorKind;

/// The object (None: absent) each time it changes, or an error the watch retries.
pub type Events<K> = BoxStream<'static, Result<Option<K>, Error>>;

/// How long past its `timeoutSeconds` a watch may stay silent before it counts as dead.
pub const SILENCE_MARGIN: Duration = Duration::from_secs(2);

/// Watches the object `name` of `api`; the first item is its current state. Each watch
/// request asks the API server to end it after `timeout_secs` seconds (see the module
/// docs for what that costs and buys).
pub fn watch_one<K>(api: Api<K>, name: &str, timeout_secs: u32) -> Events<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    let state = State {
        api,
        name: name.to_string(),
        timeout_secs,
        resource_version: None,
        stream: None,
        backoff: crate::watch_backoff::backoff(),
    };
    futures::stream::unfold(state, |mut state| async move {
        let item = state.next().await;
        Some((item, state))
    })
    .boxed()
}

struct State<K: Clone + fmt::Debug> {
    api: Api<K>,
    name: String,
    timeout_secs: u32,
    /// Where the next watch resumes; None: list first.
    resource_version: Option<String>,
    stream: Option<BoxStream<'static, kube::Result<WatchEvent<K>>>>,
    backoff: ResetTimerBackoff<ExponentialBackoff>,
}

impl<K> State<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    fn fields(&self) -> String {
        format!("metadata.name={}", self.name)
    }

    /// The next change (or error); loops over what shows no change: bookmarks, the
    /// end of a watch, a resumed watch.
    async fn next(&mut self) -> Result<Option<K>, Error> {
        loop {
            let Some(rv) = self.resource_version.clone() else {
                return self.list().await;
            };
            let Some(stream) = &mut self.stream else {
                let params = WatchParams::default()
                    .fields(&self.fields())
                    .timeout(self.timeout_secs);
                let started = call(
                    || format!("starting the watch of {}", self.name),
                    self.api.watch(&params, &rv),
                )
                .await;
                match started {
                    Ok(stream) => self.stream = Some(stream.boxed()),
                    Err(e) if e.api_kind() == Some(ApiErrorKind::Expired) => {
                        self.resource_version = None;
                    }
                    Err(e) => return self.failed(e).await,
                }
                continue;
            };
            let limit = Duration::from_secs(self.timeout_secs.into()) + SILENCE_MARGIN;
            match tokio::time::timeout(limit, stream.next()).await {
                Ok(Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)))) => {
                    self.resource_version = object.meta().resource_version.clone();
                    self.backoff.reset();
                    return Ok(Some(object));
                }
                Ok(Some(Ok(WatchEvent::Deleted(object)))) => {
                    self.resource_version = object.meta().resource_version.clone();
                    self.backoff.reset();
                    return Ok(None);
                }
                Ok(Some(Ok(WatchEvent::Bookmark(bookmark)))) => {
                    self.resource_version = Some(bookmark.metadata.resource_version);
                }
                Ok(Some(Ok(WatchEvent::Error(status)))) => {
                    self.stream = None;
                    if status.code == 410 {
                        // Too old to resume from: list again, at once.
                        self.resource_version = None;
                        continue;
                    }
                    return self.failed(Error::Api(kube::Error::Api(status))).await;
                }
                Ok(Some(Err(e))) => {
                    self.stream = None;
                    return self.failed(Error::Api(e)).await;
                }
                // The API server ended it (`timeoutSeconds`): alive, resume.
                Ok(None) => self.stream = None,
                Err(_) => {
                    tracing::debug!(name = %self.name, "watch silent for {limit:?}; resuming it on a new connection");
                    // Dropping the stream closes its connection.
                    self.stream = None;
                }
            }
        }
    }

    /// The object now (a list of at most one, for the resourceVersion to watch from).
    async fn list(&mut self) -> Result<Option<K>, Error> {
        let params = ListParams::default().fields(&self.fields());
        let listed = call(|| format!("listing {}", self.name), self.api.list(&params)).await;
        match listed {
            Ok(list) => {
                self.resource_version = list.metadata.resource_version;
                self.backoff.reset();
                Ok(list.items.into_iter().next())
            }
            Err(e) => self.failed(e).await,
        }
    }

    /// Waits out the backoff, then reports the error (the caller's next poll retries).
    async fn failed(&mut self, error: Error) -> Result<Option<K>, Error> {
        if let Some(delay) = self.backoff.next() {
            tokio::time::sleep(delay).await;
        }
        Err(error)
    }
}
