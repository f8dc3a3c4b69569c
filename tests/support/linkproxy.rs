//! The client side of `palisade-linkproxy` (tests/support/bin/linkproxy.rs), the
//! HA control plane's links: one command, one reply.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `command` to the link proxy's control port; its reply after `ok`, or the
/// error it gave (or why it could not be reached).
pub async fn send(control_port: u16, command: &str) -> Result<String, String> {
    let talk = async {
        let mut stream = TcpStream::connect(("127.0.0.1", control_port)).await?;
        stream.write_all(format!("{command}\n").as_bytes()).await?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), talk)
        .await
        .map_err(|_| format!("link proxy on port {control_port}: no reply within 10s"))?
        .map_err(|e| format!("link proxy on port {control_port}: {e}"))?;
    match reply.strip_prefix("ok\n") {
        Some(rest) => Ok(rest.to_string()),
        None => Err(format!(
            "link proxy: {command:?}: {}",
            reply.trim().trim_start_matches("error: ")
        )),
    }
}
