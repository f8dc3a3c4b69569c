//! `palisade agent` writing S3 objects through the object-store fence with a grant's own
//! token (`PUT .../leases/{namespace}/{name}/objects/{bucket}/{key}`), against the local
//! control plane and a real S3 server (SeaweedFS, `make objectstores`; its endpoint in
//! `PALISADE_TEST_S3`, the credentials in `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`).
//!
//! The S3 server is shared with other runs: every test writes keys of its own in one
//! bucket ([`BUCKET`], tests/s3's): SeaweedFS gives every bucket volumes of its own, and
//! the Makefile's server has room for a few buckets only.
#![cfg(feature = "s3")]

use std::path::PathBuf;
use std::time::Duration;

use palisade::fence::s3::{S3Config, S3Fence};
use serde_json::{Value, json};
use support::agent_http::{self, request};
use support::{ControllerProcess, TestNamespace, free_port, kubeconfig_path, setup};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The bucket the tests share (made on first use).
const BUCKET: &str = "palisade-tests";
/// The credentials `make objectstores` configures (mk/objectstores.mk), unless the
/// environment has others.
const ACCESS_KEY_DEFAULT: &str = "palisade-test";
const SECRET_KEY_DEFAULT: &str = "palisade-test-secret";

/// The S3 endpoint, checked to answer: a test fails with the reason, never skips.
fn endpoint() -> String {
    let url = std::env::var("PALISADE_TEST_S3").unwrap_or_else(|_| "http://127.0.0.1:18333".into());
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
        "no S3 server at {url} (PALISADE_TEST_S3; `make objectstores` starts it)"
    );
    url
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// The library's fence on [`BUCKET`] (made if missing), and a key prefix of the
/// test's own.
async fn shared_bucket(name: &str) -> (String, String, S3Fence) {
    let bucket = BUCKET.to_string();
    let config = S3Config {
        endpoint: endpoint(),
        region: env_or("AWS_REGION", "us-east-1"),
        bucket: bucket.clone(),
        access_key_id: env_or("AWS_ACCESS_KEY_ID", ACCESS_KEY_DEFAULT),
        secret_access_key: env_or("AWS_SECRET_ACCESS_KEY", SECRET_KEY_DEFAULT),
        session_token: None,
        path_style: true,
        timeout: Duration::from_secs(30),
        max_attempts: 16,
    };
    let fence = S3Fence::new(&config).expect("S3 configuration");
    let reply = fence.client().create_bucket().await.expect("create bucket");
    // 409: the bucket exists already (BucketAlreadyOwnedByYou, BucketAlreadyExists).
    assert!(
        reply.status.is_success() || reply.status.as_u16() == 409,
        "creating bucket {bucket}: {}",
        reply.describe()
    );
    (
        bucket,
        format!("agent/{}", support::databases::unique(name)),
        fence,
    )
}

struct AgentProcess {
    _child: tokio::process::Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl AgentProcess {
    /// An agent with the S3 server and its credentials in its environment, or (`s3`
    /// false) with no S3 configuration at all.
    async fn start(ns: &TestNamespace, s3: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let mut command = tokio::process::Command::from(support::cli::palisade());
        command
            .args([
                "agent",
                "--namespace",
                &ns.name,
                "--no-token-files",
                "--socket",
            ])
            .arg(&socket)
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .env("KUBECONFIG", kubeconfig_path())
            .kill_on_drop(true);
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
        ] {
            command.env_remove(name);
        }
        if s3 {
            command
                .env("AWS_ENDPOINT_URL_S3", endpoint())
                .env("AWS_REGION", env_or("AWS_REGION", "us-east-1"))
                .env(
                    "AWS_ACCESS_KEY_ID",
                    env_or("AWS_ACCESS_KEY_ID", ACCESS_KEY_DEFAULT),
                )
                .env(
                    "AWS_SECRET_ACCESS_KEY",
                    env_or("AWS_SECRET_ACCESS_KEY", SECRET_KEY_DEFAULT),
                );
        }
        let child = command.spawn().expect("spawning palisade agent");
        agent_http::wait_for_socket(&socket).await;
        Self {
            _child: child,
            socket,
            _dir: dir,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        agent_http::call(&self.socket, method, path, body).await
    }

    async fn session(&self) -> String {
        let (status, body) = self
            .call("POST", "/v1/sessions", Some(json!({"keepaliveMs": 60_000})))
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    /// Acquires `lease` (waiting for it up to 20 s): its token.
    async fn hold(&self, session: &str, lease: &str) -> u64 {
        let (status, grant) = self
            .call(
                "POST",
                &format!("/v1/sessions/{session}/leases"),
                Some(json!({"name": lease, "durationSeconds": 6, "waitMs": 20_000})),
            )
            .await;
        assert_eq!(
            (status, grant["state"].as_str()),
            (200, Some("held")),
            "{grant}"
        );
        grant["token"].as_u64().unwrap()
    }

    /// A write of `body` at `bucket/key` with the grant of `lease` in `session`.
    async fn put(
        &self,
        session: &str,
        ns: &str,
        lease: &str,
        object: &str,
        body: &str,
    ) -> (u16, Value) {
        let path = format!("/v1/sessions/{session}/leases/{ns}/{lease}/objects/{object}");
        request(&self.socket, "PUT", &path, Some(body), Some("text/plain")).await
    }

    /// A read: status, the token header, the body's bytes.
    async fn get(&self, path: &str) -> (u16, Option<u64>, Vec<u8>) {
        let mut stream = UnixStream::connect(&self.socket).await.unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(40), stream.read_to_end(&mut answer))
            .await
            .expect("an answer within 40 s")
            .unwrap();
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&answer[..split]).to_lowercase();
        let status = head[9..12].parse().unwrap();
        let token = head
            .lines()
            .find_map(|l| l.strip_prefix("palisade-fencing-token: "))
            .map(|t| t.trim().parse().unwrap());
        (status, token, answer[split + 4..].to_vec())
    }
}

/// The payload on the object now, as the library reads it.
async fn stored(fence: &S3Fence, key: &str) -> (u64, String) {
    let object = fence.get(key).await.unwrap().expect("the object exists");
    (object.token, String::from_utf8(object.payload).unwrap())
}

#[tokio::test]
async fn a_holder_writes_with_its_grants_token_and_a_released_one_writes_nothing() {
    let ns = setup("agent-objects").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let (bucket, prefix, fence) = shared_bucket("holder").await;
    let agent = AgentProcess::start(&ns, true).await;
    let (first, second) = (agent.session().await, agent.session().await);
    let n = &ns.name;
    // A key with slashes: the route takes the rest of the path.
    let key = format!("{prefix}/reports/2026/q4.txt");
    let object = format!("{bucket}/{key}");

    let token = agent.hold(&first, "reports").await;
    let (status, written) = agent.put(&first, n, "reports", &object, "first").await;
    assert_eq!(status, 200, "{written}");
    assert_eq!(written["token"].as_u64(), Some(token), "{written}");
    assert_eq!(written["bucket"].as_str(), Some(bucket.as_str()));
    assert_eq!(written["key"].as_str(), Some(key.as_str()));
    assert!(written.get("previousToken").is_none(), "{written}");
    assert!(written["etag"].as_str().is_some(), "{written}");
    let path = format!("/v1/sessions/{first}/leases/{n}/reports/objects/{object}");
    assert_eq!(
        agent.get(&path).await,
        (200, Some(token), b"first".to_vec())
    );
    // The holder writes again with the same token.
    let (status, again) = agent
        .put(&first, n, "reports", &object, "first, again")
        .await;
    assert_eq!(
        (status, again["previousToken"].as_u64()),
        (200, Some(token))
    );

    let (status, _) = agent
        .call(
            "DELETE",
            &format!("/v1/sessions/{first}/leases/{n}/reports"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let newer = agent.hold(&second, "reports").await;
    assert!(newer > token, "{newer} after {token}");
    let (status, written) = agent.put(&second, n, "reports", &object, "second").await;
    assert_eq!(status, 200, "{written}");
    assert_eq!(
        (written["token"].as_u64(), written["previousToken"].as_u64()),
        (Some(newer), Some(token))
    );

    // The released grant writes nothing: refused before the store is asked.
    let (status, refused) = agent.put(&first, n, "reports", &object, "late").await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("grant_not_held")),
        "{refused}"
    );
    assert_eq!(stored(&fence, &key).await, (newer, "second".into()));
}

/// The grant the agent holds is stale at the store: a newer holder (here the library,
/// with the next token, as a holder elsewhere after this agent froze past its Lease)
/// wrote the object. Without the fence the agent's write would replace it.
#[tokio::test]
async fn the_store_refuses_a_grant_whose_token_a_newer_holder_passed() {
    let ns = setup("agent-objects-stale").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let (bucket, prefix, fence) = shared_bucket("stale").await;
    let agent = AgentProcess::start(&ns, true).await;
    let session = agent.session().await;
    let n = &ns.name;
    let key = format!("{prefix}/ledger");
    let object = format!("{bucket}/{key}");

    let token = agent.hold(&session, "ledger").await;
    let (status, written) = agent.put(&session, n, "ledger", &object, "mine").await;
    assert_eq!(status, 200, "{written}");
    fence
        .put(&key, token + 1, b"the newer holder's".to_vec())
        .await
        .unwrap();

    let (status, refused) = agent.put(&session, n, "ledger", &object, "stale").await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("stale_token")),
        "{refused}"
    );
    assert_eq!(
        (refused["token"].as_u64(), refused["highest"].as_u64()),
        (Some(token), Some(token + 1)),
        "{refused}"
    );
    assert!(refused["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(
        stored(&fence, &key).await,
        (token + 1, "the newer holder's".into())
    );
}

#[tokio::test]
async fn missing_buckets_bad_names_and_an_unconfigured_agent_get_named_errors() {
    let ns = setup("agent-objects-errors").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let agent = AgentProcess::start(&ns, true).await;
    let session = agent.session().await;
    let n = &ns.name;
    agent.hold(&session, "files").await;
    let missing = support::databases::unique("no-such-bucket");
    // (bucket/key, lease, status, error code)
    let cases = [
        (format!("{missing}/k"), "files", 404, "no_such_bucket"),
        ("Bad_Bucket/k".to_string(), "files", 400, "invalid_field"),
        (format!("{missing}/k"), "other", 404, "unknown_grant"),
        (
            format!("{missing}/{}", "k".repeat(1025)),
            "files",
            400,
            "invalid_field",
        ),
    ];
    for (object, lease, status, code) in cases {
        let (got, answer) = agent.put(&session, n, lease, &object, "x").await;
        assert_eq!(
            (got, answer["error"].as_str()),
            (status, Some(code)),
            "{object}: {answer}"
        );
    }

    let unconfigured = AgentProcess::start(&ns, false).await;
    let session = unconfigured.session().await;
    unconfigured.hold(&session, "plain").await;
    let (status, answer) = unconfigured
        .put(&session, n, "plain", &format!("{missing}/k"), "x")
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("object_store_not_configured")),
        "{answer}"
    );
    let message = answer["message"].as_str().unwrap();
    assert!(message.contains("AWS_ACCESS_KEY_ID"), "{message}");
    assert!(message.contains("AWS_SECRET_ACCESS_KEY"), "{message}");
}
