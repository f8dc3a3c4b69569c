//! The thin clients' own test suites (`go test` in clients/go, pytest in
//! clients/python, Maven's in clients/java), run against a real agent on the local
//! control plane: a controller and a `palisade agent` for a namespace of their own,
//! whose socket the suites find in PALISADE_AGENT_SOCKET.

use std::path::Path;
use std::process::Command;

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
        .kill_on_drop(true)
        .spawn()
        .expect("spawning palisade agent");
    support::agent_http::wait_for_socket(&socket).await;
    (controller, agent, socket)
}

#[tokio::test]
async fn the_go_client_passes_its_tests_against_the_agent() {
    let ns = setup("client-go").await;
    let dir = tempfile::tempdir().unwrap();
    let (_controller, _agent, socket) = agent_for(&ns.name, dir.path()).await;
    let mut go = Command::new("go");
    go.args(["test", "-count=1", "./..."])
        .current_dir(repo_root().join("clients/go"))
        .env("PALISADE_AGENT_SOCKET", &socket);
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
    let mut pytest = Command::new(python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(repo_root().join("clients/python"))
        .env("PALISADE_AGENT_SOCKET", &socket)
        .env("PALISADE_TEST_POSTGRES", support::databases::postgres_url());
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
