//! The admin server.

use std::time::Duration;

use futures::StreamExt;
use support::TestNamespace;

/// `--admin-addr 127.0.0.1:0` asks the kernel for a port: the log must name the one
/// bound, or nobody can reach /metrics.
#[tokio::test]
async fn the_admin_server_logs_the_port_it_bound() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    support::install_crds().await;
    let ns = TestNamespace::new("admin-port").await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "controller",
            "--leader-elect=false",
            "--namespace",
            &ns.name,
        ])
        .args(["--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", support::kubeconfig_path())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut lines = futures::stream::select(tokio_stream_lines(stdout), tokio_stream_lines(stderr));
    let line = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next().await {
            if line.contains("admin server listening") {
                return line;
            }
        }
        panic!("the controller exited without logging its admin address");
    })
    .await
    .expect("the admin server logged its address");
    let addr: std::net::SocketAddr = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in {line:?}"))
        .trim_matches('"')
        .parse()
        .unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_ne!(addr.port(), 0, "{line}");
    let body = support::admin_get(addr.port(), "/healthz").await.unwrap();
    assert!(body.contains("ok"), "{body}");
}

fn tokio_stream_lines<R: tokio::io::AsyncBufRead + Unpin + Send + 'static>(
    lines: tokio::io::Lines<R>,
) -> futures::stream::BoxStream<'static, String> {
    futures::stream::unfold(lines, |mut lines| async move {
        let line = lines.next_line().await.ok()??;
        Some((line, lines))
    })
    .boxed()
}
