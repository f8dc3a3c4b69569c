//! Which connection each watch of this client goes on.
//!
//! An HTTP/2 connection carries at most as many streams at once as the server allows
//! (`SETTINGS_MAX_CONCURRENT_STREAMS`: 100 until its first SETTINGS frame, the least
//! the protocol recommends), and hyper queues every request past that until a stream
//! ends. A watch holds its stream for minutes, and a waiter holds two or three. So a
//! client shared by many waiters (the agent serves every session from one) would, past
//! about 30 of them, queue its renewals and claim creates behind watches that do not
//! end: grants seen but never confirmed, holders that miss their deadline. Go's
//! transport opens another connection when a connection is full (so client-go does not
//! meet this); hyper's pool keeps one HTTP/2 connection per server, hence this module.
//!
//! On connections of our own, requests stay on the first connection, which carries at
//! most [`WATCHES_ON_FIRST`] watches, so that requests always have streams; further
//! watches go [`WATCHES_PER_CONNECTION`] to a connection, each built like the first
//! (`kube_client::client`: HTTP/2, PINGed) when every one is full. A connection stays
//! open once built (hyper closes it when idle PINGs fail). On a caller's client nothing
//! is known of its connections (kube's own are HTTP/1.1: a connection per request), so
//! every watch goes on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::{Client, Config};

use super::object_watch::{Events, watch_one};

/// Watches on the connection that also carries this client's requests.
pub(crate) const WATCHES_ON_FIRST: usize = 40;
/// Watches on each further connection: under the 100 streams any server allows.
pub(crate) const WATCHES_PER_CONNECTION: usize = 90;

/// Where this client's watches go.
#[derive(Clone)]
pub(crate) enum WatchConnections {
    /// A caller's client: every watch on it.
    Caller(Client),
    /// Connections of our own, built from `config` as needed.
    Own(Arc<Pool>),
}

pub(crate) struct Pool {
    config: Config,
    /// The first is the requests' connection.
    connections: Mutex<Vec<Connection>>,
}

struct Connection {
    client: Client,
    watches: Arc<AtomicUsize>,
    capacity: usize,
}

/// A watch's place on a connection, given back when the watch is dropped.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WatchConnections {
    /// Watches of ours beside `requests`, the client built from `config`.
    pub(crate) fn own(requests: Client, config: Config) -> Self {
        WatchConnections::Own(Arc::new(Pool {
            config,
            connections: Mutex::new(vec![Connection {
                client: requests,
                watches: Arc::default(),
                capacity: WATCHES_ON_FIRST,
            }]),
        }))
    }

    /// Watches the object `name` in `namespace` (`object_watch::watch_one`) on a
    /// connection with room for it.
    pub(crate) fn watch<K>(&self, namespace: &str, name: &str, timeout_secs: u32) -> Events<K>
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let (client, place) = match self {
            WatchConnections::Caller(client) => (client.clone(), None),
            WatchConnections::Own(pool) => {
                let (client, place) = pool.place();
                (client, Some(place))
            }
        };
        let events = watch_one(Api::namespaced(client, namespace), name, timeout_secs);
        // The place is held as long as the watch is.
        events
            .map(move |event| {
                let _held = &place;
                event
            })
            .boxed()
    }

    /// How many connections carry watches or requests (for tests).
    pub(crate) fn connections(&self) -> usize {
        match self {
            WatchConnections::Caller(_) => 1,
            WatchConnections::Own(pool) => pool.connections.lock().expect("not poisoned").len(),
        }
    }
}

impl Pool {
    /// A connection with room for one more watch, and that place on it.
    fn place(&self) -> (Client, Place) {
        let mut connections = self.connections.lock().expect("not poisoned");
        let roomy = connections
            .iter()
            .position(|c| c.watches.load(Ordering::Relaxed) < c.capacity);
        let index = roomy.unwrap_or_else(|| {
            match crate::kube_client::client(self.config.clone()) {
                Ok((client, _)) => connections.push(Connection {
                    client,
                    watches: Arc::default(),
                    capacity: WATCHES_PER_CONNECTION,
                }),
                // The same configuration built the first connection, so this does not
                // happen; if it did, an overfull connection still beats no watch.
                Err(e) => tracing::warn!(error = %e, "cannot build another connection for watches"),
            }
            connections.len() - 1
        });
        let connection = &connections[index];
        connection.watches.fetch_add(1, Ordering::Relaxed);
        (connection.client.clone(), Place(connection.watches.clone()))
    }
}
