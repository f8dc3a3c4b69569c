//! A TCP proxy on loopback that a test (or the chaos suite's fault scheduler) can slow
//! down, cut, or black-hole. It forwards bytes and knows nothing of TLS, so a client
//! still talks TLS to the real API server (whose certificate names 127.0.0.1, whatever
//! the port). The same proxy carries the HA control plane's links
//! (`palisade-linkproxy`): with several upstreams it fails over like a load balancer,
//! and in front of an etcd member's peer port it tells which member dialled, so one
//! member can be partitioned from some others.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Every chunk is held this long before it is forwarded, both ways, one after
    /// another: a slow link whose throughput collapses too.
    Delay(Duration),
    /// Every chunk arrives this long after it was sent, both ways, and chunks still
    /// flow back to back: a long link (a replica whose watch cache falls behind).
    Latency(Duration),
    /// Open connections are dropped and new ones closed at once.
    Cut,
    /// Every connection open while this mode is set (and every one accepted during
    /// it) goes silent for good: no FIN, no RST, nothing delivered either way, the
    /// client's writes still accepted. Like a dropped NAT or conntrack entry: only
    /// the client's own timeouts notice. Connections made after it pass again.
    Blackhole,
}

/// How long a black-holed connection is kept open at most, unless its client
/// closes it first (bounded, as every fault is).
pub const BLACKHOLE_LIMIT: Duration = Duration::from_secs(60);

/// Where a proxy listens and what it forwards to.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The loopback port to listen on; 0 picks a free one.
    pub listen: u16,
    /// Tried in order for each new connection: the first that accepts carries it
    /// (a load balancer that prefers the first).
    pub upstreams: Vec<u16>,
    /// The proxy stands in front of an etcd member's peer port: it looks for the
    /// `X-Server-From` header (the dialling member's ID, which etcd's raft transport
    /// sends) in what each connection carries to the member, so
    /// [`Proxy::refuse_sources`] can partition members. Every request is looked at,
    /// not only a connection's first: etcd's health probes (which name no sender)
    /// share keep-alive connections with its raft messages.
    pub etcd_peer: bool,
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    /// Bumped when `Blackhole` is set or open connections are frozen: a connection
    /// born before the latest bump is dead.
    blackholes: watch::Sender<u64>,
    /// The sources (etcd member IDs) whose connections are refused and dropped.
    refused: watch::Sender<BTreeSet<String>>,
}

/// What one direction of one connection follows.
#[derive(Clone)]
struct Link {
    modes: watch::Receiver<Mode>,
    blackholes: watch::Receiver<u64>,
    refused: watch::Receiver<BTreeSet<String>>,
    /// The connection's sender, once seen (both directions share it).
    source: Arc<Mutex<Option<String>>>,
    /// This direction carries requests to an etcd member: look for their sender.
    identify: bool,
    born: u64,
    dead_from_start: bool,
}

impl Link {
    fn dead(&self) -> bool {
        self.dead_from_start || *self.blackholes.borrow() != self.born
    }

    /// Dropped: the proxy is cut, or the link's source is refused.
    fn cut(&self) -> bool {
        *self.modes.borrow() == Mode::Cut
            || self
                .source
                .lock()
                .expect("not poisoned")
                .as_ref()
                .is_some_and(|s| self.refused.borrow().contains(s))
    }
}

impl Proxy {
    /// A proxy on a free port to one upstream port.
    pub async fn start(upstream_port: u16) -> std::io::Result<Proxy> {
        Proxy::start_with(Options {
            upstreams: vec![upstream_port],
            ..Options::default()
        })
        .await
    }

    pub async fn start_with(options: Options) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", options.listen)).await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Pass);
        let (blackholes, _) = watch::channel(0u64);
        let (refused, _) = watch::channel(BTreeSet::new());
        let modes = mode.clone();
        let holes = blackholes.clone();
        let refusals = refused.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let now = *modes.borrow();
                if now == Mode::Cut {
                    continue; // dropped: the client sees the connection closed
                }
                let link = Link {
                    modes: modes.subscribe(),
                    blackholes: holes.subscribe(),
                    refused: refusals.subscribe(),
                    source: Arc::default(),
                    identify: false,
                    born: *holes.borrow(),
                    dead_from_start: now == Mode::Blackhole,
                };
                tokio::spawn(carry(client, link, options.clone()));
            }
        });
        Ok(Proxy {
            port,
            mode,
            blackholes,
            refused,
        })
    }

    /// `https://127.0.0.1:PORT`: the API server's URL through this proxy.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        if mode == Mode::Blackhole {
            self.freeze_open_connections();
        }
        self.mode.send_replace(mode);
    }

    /// Every connection open now goes silent for good, as under [`Mode::Blackhole`];
    /// the mode stays, so new connections are treated as before (under `Pass`, they pass).
    pub fn freeze_open_connections(&self) {
        self.blackholes.send_modify(|n| *n += 1);
    }

    /// Connections from these sources (etcd member IDs, see [`Options::etcd_peer`])
    /// are dropped, open ones at once and new ones when their source is read; an
    /// empty set lets every source through again.
    pub fn refuse_sources(&self, sources: BTreeSet<String>) {
        self.refused.send_replace(sources);
    }
}

/// One accepted connection, carried to the first upstream that accepts until either
/// side ends or a fault drops it.
async fn carry(client: TcpStream, link: Link, options: Options) {
    let mut server = None;
    for port in &options.upstreams {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", *port)).await {
            server = Some(s);
            break;
        }
    }
    let Some(server) = server else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let to_server = Link {
        identify: options.etcd_peer,
        ..link.clone()
    };
    tokio::join!(
        pump(client_read, server_write, to_server),
        pump(server_read, client_write, link),
    );
}

/// The value of the last `X-Server-From` header in `bytes`, if a whole one is there.
fn sender_in(bytes: &[u8]) -> Option<String> {
    const HEADER: &[u8] = b"X-Server-From:";
    let at = bytes.windows(HEADER.len()).rposition(|w| w == HEADER)?;
    let rest = &bytes[at + HEADER.len()..];
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some(String::from_utf8_lossy(&rest[..end]).trim().to_string())
}

/// Copies one direction until EOF, an error, or a cut (which drops both halves);
/// a black-holed direction swallows what it reads until [`BLACKHOLE_LIMIT`]. Chunks
/// go through a queue to a writer, each with the instant it may be delivered, so a
/// latency delays them without slowing the flow.
async fn pump(mut from: OwnedReadHalf, to: OwnedWriteHalf, mut link: Link) {
    let (queue, chunks) = mpsc::unbounded_channel();
    let writer = tokio::spawn(deliver(chunks, to, link.clone()));
    let mut buf = vec![0u8; 64 * 1024];
    // The end of what came before, so a header split between reads is still found.
    let mut seen_tail: Vec<u8> = Vec::new();
    loop {
        link.modes.borrow_and_update();
        link.refused.borrow_and_update();
        if link.cut() {
            writer.abort();
            return;
        }
        if link.dead() {
            return swallow(from, &mut buf).await;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return, // the writer shuts its side down once drained
                Ok(n) => n,
            },
            changed = link.modes.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            changed = link.blackholes.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            changed = link.refused.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        if link.identify {
            seen_tail.extend_from_slice(&buf[..n]);
            if let Some(sender) = sender_in(&seen_tail) {
                *link.source.lock().expect("not poisoned") = Some(sender);
            }
            let keep = seen_tail.len().saturating_sub(128);
            seen_tail.drain(..keep);
            if link.cut() {
                writer.abort();
                return;
            }
        }
        if link.dead() {
            return swallow(from, &mut buf).await;
        }
        let mode = *link.modes.borrow();
        let deliver_at = match mode {
            Mode::Delay(d) => {
                tokio::time::sleep(d).await;
                Instant::now()
            }
            Mode::Latency(d) => Instant::now() + d,
            Mode::Pass | Mode::Blackhole | Mode::Cut => Instant::now(),
        };
        if queue.send((deliver_at, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

/// Writes each queued chunk at its instant; stops writing (holding `to` open) once
/// the link is dead, and drops it when the link is cut.
async fn deliver(
    mut chunks: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
    link: Link,
) {
    while let Some((at, chunk)) = chunks.recv().await {
        // No timer for a chunk already due: passing through costs no timer tick.
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
        if link.cut() {
            return;
        }
        if link.dead() {
            // Silent: keep the connection open, deliver nothing more.
            while chunks.recv().await.is_some() {}
            return;
        }
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

/// Reads and drops everything until the sender closes or [`BLACKHOLE_LIMIT`] passes.
async fn swallow(mut from: OwnedReadHalf, buf: &mut [u8]) {
    let until = Instant::now() + BLACKHOLE_LIMIT;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, from.read(buf)).await {
        if n == 0 {
            break;
        }
    }
}
