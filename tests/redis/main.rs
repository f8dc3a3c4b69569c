//! The Redis fencing script in a real Redis (`make databases`, AOF with
//! `appendfsync always`): concurrent writers, refusals, bad input, NOSCRIPT
//! fallback, and a SIGKILL restart that keeps marks and writes. And in servers of
//! the tests' own (default persistence, `allkeys-lru`, an ACL without CONFIG): a
//! Redis that lost its marks fails closed, and the settings check names what is unsafe.
#![cfg(feature = "redis")]

use std::io::{Read, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use palisade::fence::redis::{self as fence_redis, Error, RedisFence};
use redis::aio::MultiplexedConnection;

use support::databases;

mod cli;
mod lost_marks;
mod refusals;
mod settings;
mod writers;

/// The restart test kills the server: it takes this for writing, others for reading.
static SERVER: RwLock<()> = RwLock::new(());

async fn connect() -> MultiplexedConnection {
    redis::Client::open(databases::redis_url())
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to the test Redis")
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

async fn journal(conn: &mut MultiplexedConnection, key: &str) -> Vec<u64> {
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(fence_redis::data_key(key, "journal"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    items.iter().map(|t| t.parse().unwrap()).collect()
}

async fn connect_to(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to the test's own Redis")
}

async fn create(conn: &mut MultiplexedConnection, key: &str) {
    let created = RedisFence::create(conn, key).await.unwrap();
    assert!(created.new, "{key}: {created:?}");
}

/// A redis-server of the test's own on a free loopback port, with the settings
/// under test and its data in a temporary directory; SIGKILLed when dropped.
struct OwnRedis {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    settings: Vec<String>,
}

impl OwnRedis {
    fn start(settings: &[&str]) -> Self {
        // `make databases` installs redis-server when it is missing.
        databases::redis_url();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        let child = Self::spawn(port, dir.path(), &settings);
        let server = OwnRedis {
            child,
            port,
            dir,
            settings,
        };
        server.wait_ready();
        server
    }

    fn spawn(port: u16, dir: &std::path::Path, settings: &[String]) -> Child {
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--protected-mode", "yes", "--port"])
            .arg(port.to_string())
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(settings)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server")
    }

    /// Until it answers PING with PONG (not LOADING), for at most 10 s; a TLS
    /// server until its log says it is ready.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let tls = self.settings.iter().any(|s| s == "--tls-port");
        loop {
            let log_path = self.dir.path().join("redis.log");
            if tls
                && std::fs::read_to_string(&log_path)
                    .is_ok_and(|log| log.contains("Ready to accept connections"))
            {
                return;
            }
            let pong = std::net::TcpStream::connect(("127.0.0.1", self.port)).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                s.write_all(b"PING\r\n")?;
                let mut buf = [0u8; 64];
                let n = s.read(&mut buf)?;
                Ok(buf[..n].starts_with(b"+PONG"))
            });
            if !tls && matches!(pong, Ok(true)) {
                return;
            }
            let log =
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "redis-server on 127.0.0.1:{} did not answer within 10 s; log:\n{log}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL (no shutdown save) and start again on the same directory.
    fn kill_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn(self.port, self.dir.path(), &self.settings);
        self.wait_ready();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis' own defaults: RDB snapshots only (after 3600 s, 300 s or 60 s, given
/// enough changes), no AOF.
const DEFAULT_PERSISTENCE: &[&str] = &[];
/// What the fence needs (tests/databases/databases.sh starts the shared one so).
const SAFE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn assert_no_mark(result: Result<palisade::fence::Admitted, Error>, key: &str) {
    match result {
        Err(Error::NoMark { key: k }) => assert_eq!(k, key),
        other => panic!("expected Error::NoMark for {key:?}, got {other:?}"),
    }
}
