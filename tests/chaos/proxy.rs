//! A TCP proxy on loopback between a process and the API server, that the fault
//! scheduler can slow down or cut. It forwards bytes and knows nothing of TLS or
//! HTTP, so the client still talks TLS to the real API server (whose certificate
//! names 127.0.0.1, whatever the port).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Every chunk is held this long before it is forwarded, both ways.
    Delay(Duration),
    /// Open connections are dropped and new ones closed at once.
    Cut,
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Pass);
        let modes = mode.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *modes.borrow() == Mode::Cut {
                    continue; // dropped: the client sees the connection closed
                }
                let modes = modes.subscribe();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::join!(
                            pump(client_read, server_write, modes.clone()),
                            pump(server_read, client_write, modes),
                        );
                    }
                });
            }
        });
        Ok(Proxy { port, mode })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Copies one direction until EOF, an error, or a cut (which drops both halves).
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut modes: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if *modes.borrow_and_update() == Mode::Cut {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            changed = modes.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let mode = *modes.borrow();
        match mode {
            Mode::Cut => return,
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Pass => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
