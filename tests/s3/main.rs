//! The object-store fence (`palisade::fence::s3`) against real S3-compatible servers
//! (`make objectstores`): SeaweedFS, whose conditional PUTs are atomic, for the fence;
//! and moto's server mode, whose are not, for the probe to catch. Writes, stale tokens,
//! the ETag ABA case, racing holders with and without the fence, bad input, the probe
//! and the CLI.
//!
//! The servers are shared with other runs: every test works on keys of its own in one
//! bucket ([`BUCKET`]), or in a bucket of its own.
#![cfg(feature = "s3")]

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use palisade::fence::s3::{S3Config, S3Fence};

mod aba;
mod bad_input;
mod cli;
mod probe;
mod races;
mod writes;

/// The bucket the tests share (made on first use).
const BUCKET: &str = "palisade-tests";
/// The credentials `make objectstores` configures (mk/objectstores.mk), unless the
/// environment has others.
const ACCESS_KEY_DEFAULT: &str = "palisade-test";
const SECRET_KEY_DEFAULT: &str = "palisade-test-secret";

/// `make objectstores`, once per test binary: a test fails with the reason when the
/// servers cannot be started, never skips.
fn ensure_started() {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = STARTED.get_or_init(|| {
        let out = Command::new("make")
            .args(["-s", "--no-print-directory", "objectstores"])
            .current_dir(support::repo_root())
            .output()
            .map_err(|e| format!("running make objectstores: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "make objectstores failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The endpoint in `var` (the Makefile's default otherwise), checked to answer.
fn server(var: &str, default: &str) -> String {
    ensure_started();
    let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    let authority = url
        .split("://")
        .nth(1)
        .unwrap_or(&url)
        .trim_end_matches('/');
    let answers = authority
        .parse::<std::net::SocketAddr>()
        .ok()
        .and_then(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .is_some();
    assert!(
        answers,
        "no S3 server at {url} ({var}; `make objectstores` starts it)"
    );
    url
}

/// SeaweedFS: conditional PUTs are atomic there.
fn atomic_server() -> String {
    server("PALISADE_TEST_S3", "http://127.0.0.1:18333")
}

/// moto's server mode: conditions checked apart from the write.
fn broken_server() -> String {
    server("PALISADE_TEST_S3_BROKEN", "http://127.0.0.1:18334")
}

fn credentials() -> (String, String) {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    (
        env("AWS_ACCESS_KEY_ID", ACCESS_KEY_DEFAULT),
        env("AWS_SECRET_ACCESS_KEY", SECRET_KEY_DEFAULT),
    )
}

/// A path-style configuration for `bucket` on `endpoint`, with the test credentials.
fn config(endpoint: &str, bucket: &str) -> S3Config {
    let (access_key_id, secret_access_key) = credentials();
    S3Config {
        endpoint: endpoint.to_owned(),
        region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        bucket: bucket.to_owned(),
        access_key_id,
        secret_access_key,
        session_token: None,
        path_style: true,
        timeout: Duration::from_secs(60),
        max_attempts: 64,
    }
}

/// The fence on `bucket` of `endpoint`, the bucket made if missing.
async fn fence_in(endpoint: &str, bucket: &str) -> S3Fence {
    let fence = S3Fence::new(&config(endpoint, bucket)).expect("S3 configuration");
    let reply = fence.client().create_bucket().await.expect("create bucket");
    // 409: the bucket exists already (BucketAlreadyOwnedByYou, BucketAlreadyExists).
    assert!(
        reply.status.is_success() || reply.status.as_u16() == 409,
        "creating bucket {bucket} on {endpoint}: {}",
        reply.describe()
    );
    fence
}

/// The fence on [`BUCKET`] of SeaweedFS.
async fn fence() -> S3Fence {
    fence_in(&atomic_server(), BUCKET).await
}

/// A key no other test (or earlier run) uses.
fn unique_key(name: &str) -> String {
    format!("tests/{}", support::databases::unique(name))
}

/// The runtime of a test: two worker threads, so racing writers really run at once.
fn runtime() -> tokio::runtime::Runtime {
    support::databases::runtime()
}
