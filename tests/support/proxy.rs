//! A TCP proxy on loopback between a process and the API server, that a test (or the
//! chaos suite's fault scheduler) can slow down, cut, or black-hole. It forwards bytes
//! and knows nothing of TLS or HTTP, so the client still talks TLS to the real API
//! server (whose certificate names 127.0.0.1, whatever the port).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Every chunk is held this long before it is forwarded, both ways.
    Delay(Duration),
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

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    /// Bumped when `Blackhole` is set or open connections are frozen: a connection
    /// born before the latest bump is dead.
    blackholes: watch::Sender<u64>,
}

/// What one direction of one connection follows.
#[derive(Clone)]
struct Link {
    modes: watch::Receiver<Mode>,
    blackholes: watch::Receiver<u64>,
    born: u64,
    dead_from_start: bool,
}

impl Link {
    fn dead(&self) -> bool {
        self.dead_from_start || *self.blackholes.borrow() != self.born
    }
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Pass);
        let (blackholes, _) = watch::channel(0u64);
        let modes = mode.clone();
        let holes = blackholes.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let now = *modes.borrow();
                if now == Mode::Cut {
                    continue; // dropped: the client sees the connection closed
                }
                let link = Link {
                    modes: modes.subscribe(),
                    blackholes: holes.subscribe(),
                    born: *holes.borrow(),
                    dead_from_start: now == Mode::Blackhole,
                };
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::join!(
                            pump(client_read, server_write, link.clone()),
                            pump(server_read, client_write, link),
                        );
                    }
                });
            }
        });
        Ok(Proxy {
            port,
            mode,
            blackholes,
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
}

/// Copies one direction until EOF, an error, or a cut (which drops both halves);
/// a black-holed direction swallows what it reads until [`BLACKHOLE_LIMIT`].
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut link: Link) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if *link.modes.borrow_and_update() == Mode::Cut {
            return;
        }
        if link.dead() {
            return swallow(from, to, &mut buf).await;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
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
        };
        if link.dead() {
            return swallow(from, to, &mut buf).await;
        }
        let mode = *link.modes.borrow();
        match mode {
            Mode::Cut => return,
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Pass | Mode::Blackhole => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Reads and drops everything, holding `to` open without writing to it, until the
/// sender closes or [`BLACKHOLE_LIMIT`] passes.
async fn swallow(mut from: OwnedReadHalf, to: OwnedWriteHalf, buf: &mut [u8]) {
    let until = Instant::now() + BLACKHOLE_LIMIT;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, from.read(buf)).await {
        if n == 0 {
            break;
        }
    }
    drop(to);
}
