//! The agent's API spoken as raw HTTP/1.1 over its Unix socket, as any client would:
//! one request per connection. Needs nothing else of `support`: the benches include it
//! by path.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// One request on its own connection (`Content-Type: kind` when given); the status
/// and the body, parsed as JSON when it is JSON.
pub async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    kind: Option<&str>,
) -> (u16, Value) {
    let mut stream = UnixStream::connect(socket)
        .await
        .expect("the agent's socket");
    let body = body.unwrap_or("");
    let kind = kind
        .map(|k| format!("Content-Type: {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n{kind}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(40), stream.read_to_string(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within 40 s"))
        .unwrap();
    let status = answer[9..12].parse().unwrap();
    let json = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .filter(|b| !b.is_empty())
        .map(|b| serde_json::from_str(b).unwrap_or(Value::String(b.to_string())))
        .unwrap_or(Value::Null);
    (status, json)
}

/// A JSON request.
pub async fn call(socket: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    request(
        socket,
        method,
        path,
        body.as_deref(),
        Some("application/json"),
    )
    .await
}

/// Waits (at most 10 s) until an agent answers on `socket`.
pub async fn wait_for_socket(socket: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(socket).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's socket {} is not up in 10 s",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
