//! The thin clients' own test suites (`go test` in clients/go, pytest in
//! clients/python, Maven's in clients/java), run against a real agent on the local
//! control plane: a controller and a `palisade agent` for a namespace of their own,
//! whose socket the suites find in PALISADE_AGENT_SOCKET. The agent has the S3 server
//! of `make objectstores` (PALISADE_TEST_S3) in its environment, and the suites a
//! bucket of their own there (PALISADE_TEST_S3_BUCKET) holding one object a newer
//! holder wrote (PALISADE_TEST_S3_STALE_KEY), for the clients' object writes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use palisade::fence::s3::{S3Config, S3Fence};

use support::tools::run_suite;
use support::{ControllerProcess, kubeconfig_path, repo_root, setup};

/// A controller and an agent for `ns`; the agent's socket.
async fn agent_for(
    ns: &str,
    dir: &Path,
) -> (ControllerProcess, tokio::process::Child, std::path::PathBuf) {
    let controller = ControllerProcess::start(ns, &["--leader-elect=false"]).await;
    let socket = dir.join("agent.sock");
    let agent = tokio::process::Command::from(support::cli::palisade())
        .args([
            "agent",
            "--namespace",
            ns,
            "--admin-addr",
            "127.0.0.1:0",
            "--socket",
        ])
        .arg(&socket)
        .arg("--token-dir")
        .arg(dir.join("leases"))
        .env("KUBECONFIG", kubeconfig_path())
        .env("AWS_ENDPOINT_URL_S3", s3_endpoint())
        .env(
            "AWS_ACCESS_KEY_ID",
            env_or("AWS_ACCESS_KEY_ID", "palisade-test"),
        )
        .env(
            "AWS_SECRET_ACCESS_KEY",
            env_or("AWS_SECRET_ACCESS_KEY", "palisade-test-secret"),
        )
        .env("AWS_REGION", env_or("AWS_REGION", "us-east-1"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawning palisade agent");
    support::agent_http::wait_for_socket(&socket).await;
    (controller, agent, socket)
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// The S3 server of `make objectstores` (the Makefile's default otherwise).
fn s3_endpoint() -> String {
    env_or("PALISADE_TEST_S3", "http://127.0.0.1:18333")
}

/// The bucket the tests share (tests/s3's: SeaweedFS gives every bucket volumes of
/// its own, and the Makefile's server has room for a few buckets only), and the key of
/// an object in it written with a token no grant of the run reaches (as by a newer
/// holder): the suites' object writes.
async fn object_store(suite: &str) -> (String, String) {
    let bucket = "palisade-tests".to_string();
    let fence = S3Fence::new(&S3Config {
        endpoint: s3_endpoint(),
        region: env_or("AWS_REGION", "us-east-1"),
        bucket: bucket.clone(),
        access_key_id: env_or("AWS_ACCESS_KEY_ID", "palisade-test"),
        secret_access_key: env_or("AWS_SECRET_ACCESS_KEY", "palisade-test-secret"),
        session_token: None,
        path_style: true,
        timeout: Duration::from_secs(30),
        max_attempts: 16,
    })
    .expect("S3 configuration");
    let created = fence.client().create_bucket().await;
    let created = created.unwrap_or_else(|e| {
        panic!(
            "creating bucket {bucket} at {} (`make objectstores` starts the server): {e}",
            s3_endpoint()
        )
    });
    // 409: the bucket exists already.
    let status = created.status.as_u16();
    assert!(status < 300 || status == 409, "{}", created.describe());
    let stale_key = format!(
        "clients/{}/written-by-a-newer-holder",
        support::databases::unique(suite)
    );
    fence
        .put(
            &stale_key,
            i64::MAX as u64 / 2,
            b"the newer holder's".to_vec(),
        )
        .await
        .expect("writing the newer holder's object");
    (bucket, stale_key)
}

#[tokio::test]
async fn the_go_client_passes_its_tests_against_the_agent() {
    let ns = setup("client-go").await;
    let dir = tempfile::tempdir().unwrap();
    let (_controller, _agent, socket) = agent_for(&ns.name, dir.path()).await;
    let (bucket, stale_key) = object_store("client-go").await;
    let mut go = Command::new("go");
    go.args(["test", "-count=1", "./..."])
        .current_dir(repo_root().join("clients/go"))
        .env("PALISADE_AGENT_SOCKET", &socket)
        .env("PALISADE_TEST_S3_BUCKET", bucket)
        .env("PALISADE_TEST_S3_STALE_KEY", stale_key);
    run_suite("go test (clients/go)", go);
}

#[tokio::test]
async fn the_python_client_passes_its_tests_against_the_agent() {
    let python = repo_root().join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: `make python-venv` makes it (make test does)",
        python.display()
    );
    let ns = setup("client-python").await;
    let dir = tempfile::tempdir().unwrap();
    let (_controller, _agent, socket) = agent_for(&ns.name, dir.path()).await;
    let (bucket, stale_key) = object_store("client-python").await;
    let mut pytest = Command::new(python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(repo_root().join("clients/python"))
        .env("PALISADE_AGENT_SOCKET", &socket)
        .env("PALISADE_TEST_POSTGRES", support::databases::postgres_url())
        .env("PALISADE_TEST_S3_BUCKET", bucket)
        .env("PALISADE_TEST_S3_STALE_KEY", stale_key);
    run_suite("pytest (clients/python)", pytest);
}

/// The JDBC form of a `postgres://USER@HOST:PORT/DB` URL.
fn jdbc_url(url: &str) -> String {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .unwrap_or_else(|| panic!("not a postgres:// URL: {url}"));
    let (user, address) = rest.split_once('@').unwrap_or(("postgres", rest));
    format!("jdbc:postgresql://{address}?user={user}")
}

#[tokio::test]
async fn the_java_client_passes_its_tests_against_the_agent() {
    let jar = repo_root().join("target/clients/java/palisade-client.jar");
    assert!(
        jar.exists(),
        "{} is missing: `make java-build` makes it (and resolves what Maven needs offline)",
        jar.display()
    );
    let pg = jdbc_url(&support::databases::postgres_url());
    let ns = setup("client-java").await;
    let dir = tempfile::tempdir().unwrap();
    let (_controller, _agent, socket) = agent_for(&ns.name, dir.path()).await;
    // Every module's tests, all tags: the core's agent tests, the adapters' agent and
    // postgres ones. The core's frozen-agent test starts an agent of its own (this binary).
    let mut mvn = Command::new("mvn");
    mvn.args(["-B", "-q", "-o", "test"])
        .current_dir(repo_root().join("clients/java"))
        .env("PALISADE_AGENT_SOCKET", &socket)
        .env("PALISADE_TEST_PG_URL", pg)
        .env("PALISADE_BIN", support::cli::binary())
        .env("KUBECONFIG", kubeconfig_path());
    run_suite("mvn test (clients/java)", mvn);
}
