//! The fault proxy's own behaviour (`support::proxy`), on loopback with echo servers
//! of the test's own: what the HA control plane's links rely on. No cluster needed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Options, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server on a free port that prefixes every reply with `tag`.
async fn echo_server(tag: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut reply = tag.as_bytes().to_vec();
                    reply.extend_from_slice(&buf[..n]);
                    if conn.write_all(&reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Sends `message` and reads the reply; `None` when the connection is closed
/// or nothing comes back within 2 s.
async fn round_trip(conn: &mut TcpStream, message: &str) -> Option<String> {
    conn.write_all(message.as_bytes()).await.ok()?;
    let mut buf = [0u8; 4096];
    match tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn a_load_balancer_prefers_its_first_upstream_and_fails_over_when_it_is_down() {
    let first = echo_server("first:").await;
    let second = echo_server("second:").await;
    let dead = closed_port().await;
    let both = Proxy::start_with(Options {
        upstreams: vec![first, second],
        ..Options::default()
    })
    .await
    .unwrap();
    let failing = Proxy::start_with(Options {
        upstreams: vec![dead, second],
        ..Options::default()
    })
    .await
    .unwrap();
    let mut conn = TcpStream::connect(("127.0.0.1", both.port)).await.unwrap();
    assert_eq!(round_trip(&mut conn, "a").await.as_deref(), Some("first:a"));
    let mut conn = TcpStream::connect(("127.0.0.1", failing.port))
        .await
        .unwrap();
    assert_eq!(
        round_trip(&mut conn, "b").await.as_deref(),
        Some("second:b")
    );
}

#[tokio::test]
async fn a_refused_etcd_member_is_cut_off_even_when_it_names_itself_in_a_later_request() {
    let member = echo_server("").await;
    let proxy = Proxy::start_with(Options {
        upstreams: vec![member],
        etcd_peer: true,
        ..Options::default()
    })
    .await
    .unwrap();
    // A health probe names no sender; the raft message after it on the same
    // connection does.
    let mut from_a = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let probe = "GET /raft/probing HTTP/1.1\r\nHost: m\r\n\r\n";
    assert!(round_trip(&mut from_a, probe).await.is_some());
    let mut from_b = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let from_b_request = "POST /raft HTTP/1.1\r\nX-Server-From: b2\r\n\r\n";
    assert!(round_trip(&mut from_b, from_b_request).await.is_some());

    proxy.refuse_sources(BTreeSet::from(["a1".to_string()]));
    let from_a_request = "POST /raft HTTP/1.1\r\nX-Server-From: a1\r\n\r\n";
    assert_eq!(
        round_trip(&mut from_a, from_a_request).await,
        None,
        "a1's request went through"
    );
    assert!(
        round_trip(&mut from_b, from_b_request).await.is_some(),
        "b2 was cut off too"
    );
    // Refusing b2 drops its open connection; clearing the set lets it in again.
    proxy.refuse_sources(BTreeSet::from(["b2".to_string()]));
    assert_eq!(round_trip(&mut from_b, "more").await, None);
    proxy.refuse_sources(BTreeSet::new());
    let mut again = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    assert!(round_trip(&mut again, from_b_request).await.is_some());
}

#[tokio::test]
async fn a_latency_delays_every_chunk_without_queueing_them_one_after_another() {
    let upstream = echo_server("").await;
    let proxy = Proxy::start(upstream).await.unwrap();
    let latency = Duration::from_millis(300);
    proxy.set(Mode::Latency(latency));
    let mut conn = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let started = Instant::now();
    // Five messages sent at once: each crosses the proxy twice (one latency each
    // way), and they travel side by side, not one after another.
    for i in 0..5 {
        conn.write_all(format!("{i}").as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut got = String::new();
    let mut buf = [0u8; 64];
    while got.len() < 5 {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("the echo came back")
            .unwrap();
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let took = started.elapsed();
    assert_eq!(got, "01234");
    assert!(took >= latency * 2, "came back after {took:?}");
    assert!(
        took < latency * 5,
        "came back after {took:?}: chunks were held one after another"
    );
}
