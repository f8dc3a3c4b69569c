//! A TCP proxy to the API server whose connections can die silently: they stay
//! open (no FIN, no RST) and stop delivering bytes in both directions, the way a
//! connection through a crashed NAT or a dead peer behaves. TLS passes through
//! untouched (the server certificate is for 127.0.0.1, where this listens too).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Blackhole {
    /// `https://127.0.0.1:PORT`, for a kube `Config`'s `cluster_url`.
    pub url: String,
    /// Bumped to freeze every connection accepted before it.
    freeze: watch::Sender<u64>,
    /// Set: new connections are accepted and then left silent too.
    all: Arc<AtomicBool>,
}

impl Blackhole {
    /// Forwards to `upstream` (host:port) until told otherwise.
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let (freeze, _) = watch::channel(0u64);
        let all = Arc::new(AtomicBool::new(false));
        let (frozen, silent) = (freeze.subscribe(), all.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut frozen = frozen.clone();
                let generation = *frozen.borrow_and_update();
                let silent = silent.load(Ordering::SeqCst);
                let upstream = upstream.clone();
                // Each connection lives in a task of the test's runtime: never closed by us.
                tokio::spawn(async move {
                    if silent {
                        return hold(inbound, None).await;
                    }
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let froze = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                        changed = frozen.wait_for(|g| *g > generation) => changed.is_ok(),
                    };
                    if froze {
                        hold(inbound, Some(outbound)).await;
                    }
                });
            }
        });
        Self { url, freeze, all }
    }

    /// The connections open now go silent; new connections still pass.
    pub fn freeze_open_connections(&self) {
        self.freeze.send_modify(|g| *g += 1);
    }

    /// Every connection, open or new, goes silent.
    pub fn swallow_everything(&self) {
        self.all.store(true, Ordering::SeqCst);
        self.freeze_open_connections();
    }
}

/// Keeps the sockets open and reads nothing, for as long as the test runs.
async fn hold(inbound: TcpStream, outbound: Option<TcpStream>) {
    std::future::pending::<()>().await;
    drop((inbound, outbound));
}

/// A client configuration for the test cluster that goes through a new proxy.
pub async fn proxied_config(namespace: &str) -> (kube::Config, Blackhole) {
    let mut config = super::admin_config().await;
    let upstream = config.cluster_url.authority().unwrap().to_string();
    let proxy = Blackhole::start(upstream).await;
    config.cluster_url = proxy.url.parse().unwrap();
    config.default_namespace = namespace.to_string();
    (config, proxy)
}
