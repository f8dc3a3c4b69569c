//! `palisade agent` against the local control plane: its API over the Unix socket
//! (spoken here as raw HTTP/1.1, as any client would), its sessions' ends, its
//! token files, its shutdown, its metrics.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::agent_http::{self, request};
use support::{ControllerProcess, TestNamespace, free_port, kubeconfig_path, setup};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

struct AgentProcess {
    child: tokio::process::Child,
    socket: PathBuf,
    tokens: PathBuf,
    admin_port: u16,
    _dir: tempfile::TempDir,
}

impl AgentProcess {
    async fn start(ns: &TestNamespace) -> Self {
        Self::start_with(ns, kubeconfig_path()).await
    }

    /// An agent that reaches the API server with `kubeconfig`.
    async fn start_with(ns: &TestNamespace, kubeconfig: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (socket, tokens) = (dir.path().join("agent.sock"), dir.path().join("leases"));
        let admin_port = free_port();
        let child = tokio::process::Command::from(support::cli::palisade())
            .args(["agent", "--namespace", &ns.name, "--socket"])
            .arg(&socket)
            .arg("--token-dir")
            .arg(&tokens)
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{admin_port}"))
            .env("KUBECONFIG", kubeconfig)
            .kill_on_drop(true)
            .spawn()
            .expect("spawning palisade agent");
        agent_http::wait_for_socket(&socket).await;
        Self {
            child,
            socket,
            tokens,
            admin_port,
            _dir: dir,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        agent_http::call(&self.socket, method, path, body).await
    }

    async fn session(&self, keepalive_ms: u64) -> String {
        let (status, body) = self
            .call(
                "POST",
                "/v1/sessions",
                Some(json!({"keepaliveMs": keepalive_ms})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    async fn acquire(&self, session: &str, lease: &str, wait_ms: u64) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/v1/sessions/{session}/leases"),
            Some(json!({"name": lease, "durationSeconds": 6, "waitMs": wait_ms})),
        )
        .await
    }

    async fn acquire_slot(
        &self,
        session: &str,
        lease: &str,
        slot: i32,
        wait_ms: u64,
    ) -> (u16, Value) {
        let body = json!({"name": lease, "durationSeconds": 6, "slot": slot, "waitMs": wait_ms});
        self.call(
            "POST",
            &format!("/v1/sessions/{session}/leases"),
            Some(body),
        )
        .await
    }

    fn token_file(&self, ns: &str, lease: &str) -> PathBuf {
        self.tokens.join(ns).join(lease).join("token")
    }

    /// The token file and the slot file beside it, as read now.
    fn token_files(&self, ns: &str, lease: &str) -> (String, String) {
        let file = self.token_file(ns, lease);
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        (read(&file), read(&file.with_file_name("slot")))
    }
}

/// Keeps a session alive from a task, until dropped.
struct Keepalive(tokio::task::JoinHandle<()>);

impl Keepalive {
    fn start(socket: &Path, session: &str, every: Duration) -> Self {
        let (socket, path) = (
            socket.to_path_buf(),
            format!("/v1/sessions/{session}/keepalive"),
        );
        Keepalive(tokio::spawn(async move {
            loop {
                request(&socket, "POST", &path, None, None).await;
                tokio::time::sleep(every).await;
            }
        }))
    }
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[tokio::test]
async fn bad_input_gets_a_4xx_that_names_the_field() {
    let ns = setup("agent-input").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let agent = AgentProcess::start(&ns).await;
    let id = agent.session(10_000).await;
    let leases = format!("/v1/sessions/{id}/leases");
    bodies_that_name_a_bad_field(&agent, &leases).await;
    second_acquire_and_long_polls(&agent, &ns, &id).await;
    unknown_sessions_grants_and_namespaces(&agent, &ns, &id).await;

    // The document the clients are written against is served as it is in the repository.
    let (status, doc) = request(&agent.socket, "GET", "/v1/openapi.yaml", None, None).await;
    let file =
        std::fs::read_to_string(support::repo_root().join("src/agent/openapi.yaml")).unwrap();
    assert_eq!((status, doc.as_str()), (200, Some(file.as_str())));
}

/// Each bad body or content type of an acquire: its status, error code and field.
async fn bodies_that_name_a_bad_field(agent: &AgentProcess, leases: &str) {
    // (body, content type, status, error code, field)
    type Case<'a> = (&'a str, Option<&'a str>, u16, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            r#"{"name": "Billing"}"#,
            None,
            400,
            "invalid_field",
            Some("name"),
        ),
        (
            r#"{"name": "b", "durationSeconds": 0}"#,
            None,
            400,
            "invalid_field",
            Some("durationSeconds"),
        ),
        (
            r#"{"name": "b", "durationSeconds": 86401}"#,
            None,
            400,
            "invalid_field",
            Some("durationSeconds"),
        ),
        (
            r#"{"name": "b", "namespace": "No"}"#,
            None,
            400,
            "invalid_field",
            Some("namespace"),
        ),
        (
            r#"{"name": "b", "waitMs": 30001}"#,
            None,
            400,
            "invalid_field",
            Some("waitMs"),
        ),
        (
            r#"{"name": "b", "slot": 64}"#,
            None,
            400,
            "invalid_field",
            Some("slot"),
        ),
        (
            r#"{"lease": "b"}"#,
            None,
            400,
            "unknown_field",
            Some("lease"),
        ),
        (r#"{}"#, None, 400, "missing_field", Some("name")),
        (r#"{"name": "b""#, None, 400, "invalid_json", None),
        (
            r#"{"name": "b"}"#,
            Some("text/plain"),
            415,
            "unsupported_media_type",
            None,
        ),
    ];
    for (body, kind, status, code, field) in cases {
        let (got, answer) = request(
            &agent.socket,
            "POST",
            leases,
            Some(body),
            kind.or(Some("application/json")),
        )
        .await;
        assert_eq!(
            (got, answer["error"].as_str()),
            (status, Some(code)),
            "{body}: {answer}"
        );
        assert_eq!(answer["field"].as_str(), field, "{body}: {answer}");
        assert!(
            answer["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
}

/// A second acquire of a held Lease is a conflict; a second session waits, and its
/// acquire and polls answer after their waitMs, not later.
async fn second_acquire_and_long_polls(agent: &AgentProcess, ns: &TestNamespace, id: &str) {
    let (status, held) = agent.acquire(id, "billing", 10_000).await;
    assert_eq!(
        (status, held["state"].as_str()),
        (200, Some("held")),
        "{held}"
    );
    let (status, again) = agent.acquire(id, "billing", 0).await;
    assert_eq!(
        (status, again["error"].as_str()),
        (409, Some("already_acquired")),
        "{again}"
    );

    // A second session waits; its acquire answers 202 after its waitMs, not later.
    let other = agent.session(10_000).await;
    let started = Instant::now();
    let (status, waiting) = agent.acquire(&other, "billing", 500).await;
    assert_eq!(
        (status, waiting["state"].as_str()),
        (202, Some("waiting")),
        "{waiting}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a 500 ms long poll took {:?}",
        started.elapsed()
    );
    let (status, resumed) = agent
        .call(
            "GET",
            &format!("/v1/sessions/{other}/leases/{}/billing?waitMs=300", ns.name),
            None,
        )
        .await;
    assert_eq!(
        (status, resumed["state"].as_str()),
        (200, Some("waiting")),
        "{resumed}"
    );
    let (status, e) = agent
        .call(
            "GET",
            &format!(
                "/v1/sessions/{other}/leases/{}/billing?waitMs=oops",
                ns.name
            ),
            None,
        )
        .await;
    assert_eq!((status, e["field"].as_str()), (400, Some("waitMs")), "{e}");
}

/// Unknown sessions, grants and namespaces are 404s; a keepalive too short is a 400.
async fn unknown_sessions_grants_and_namespaces(
    agent: &AgentProcess,
    ns: &TestNamespace,
    id: &str,
) {
    let (status, e) = agent
        .call("GET", "/v1/sessions/nope/leases/x/y", None)
        .await;
    assert_eq!(
        (status, e["error"].as_str()),
        (404, Some("unknown_session")),
        "{e}"
    );
    let (status, e) = agent
        .call(
            "GET",
            &format!("/v1/sessions/{id}/leases/{}/other", ns.name),
            None,
        )
        .await;
    assert_eq!(
        (status, e["error"].as_str()),
        (404, Some("unknown_grant")),
        "{e}"
    );
    let (status, e) = agent
        .call("POST", "/v1/sessions", Some(json!({"keepaliveMs": 10})))
        .await;
    assert_eq!(
        (status, e["field"].as_str()),
        (400, Some("keepaliveMs")),
        "{e}"
    );
    let (status, e) = agent
        .call(
            "POST",
            &format!("/v1/sessions/{id}/leases"),
            Some(json!({"name": "elsewhere", "namespace": "no-such-namespace-here"})),
        )
        .await;
    assert_eq!(
        (status, e["field"].as_str()),
        (404, Some("namespace")),
        "{e}"
    );
}

#[tokio::test]
async fn a_session_that_stops_its_keepalives_lets_go_and_its_token_file_goes() {
    let ns = setup("agent-keepalive").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let agent = AgentProcess::start(&ns).await;
    let hung = agent.session(1_000).await;
    // Kept alive until it holds: a first grant on a cold cluster can take longer than
    // the 1 s keepalive, and a session that lapsed before would let go at once.
    let until_held = Keepalive::start(&agent.socket, &hung, Duration::from_millis(300));
    let (status, first) = agent.acquire(&hung, "cron", 10_000).await;
    assert_eq!(status, 200, "{first}");
    let file = agent.token_file(&ns.name, "cron");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{}\n", first["token"])
    );
    assert!(first["validForMs"].as_u64().unwrap() > 0, "{first}");
    drop(until_held);

    let waiter = agent.session(1_000).await;
    let _alive = Keepalive::start(&agent.socket, &waiter, Duration::from_millis(300));
    // The first session sends nothing more: like a hung or frozen application.
    let (status, _) = agent.acquire(&waiter, "cron", 0).await;
    assert_eq!(status, 202);
    let asked = Instant::now();
    let (_, second) = agent
        .call(
            "GET",
            &format!("/v1/sessions/{waiter}/leases/{}/cron?waitMs=10000", ns.name),
            None,
        )
        .await;
    assert_eq!(second["state"], "held", "{second}");
    assert!(
        second["token"].as_i64() > first["token"].as_i64(),
        "{first} then {second}"
    );
    // Well before the lease's 6 s: released when the keepalive (1 s) was missed.
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "granted after {:?}",
        asked.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{}\n", second["token"])
    );

    let (status, gone) = agent
        .call("GET", &format!("/v1/sessions/{hung}"), None)
        .await;
    assert_eq!(
        (status, gone["error"].as_str()),
        (404, Some("unknown_session")),
        "{gone}"
    );
}

#[tokio::test]
async fn closing_the_event_stream_releases_at_once_and_the_stream_reports_changes() {
    let ns = setup("agent-stream").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let agent = AgentProcess::start(&ns).await;
    let app = agent.session(30_000).await;
    let mut stream = UnixStream::connect(&agent.socket).await.unwrap();
    stream
        .write_all(
            format!("GET /v1/sessions/{app}/events HTTP/1.1\r\nHost: agent\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut events = BufReader::new(stream);
    let (status, held) = agent.acquire(&app, "stream", 10_000).await;
    assert_eq!(status, 200, "{held}");
    // `event: session` first, then the grant as it became held.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen
        .iter()
        .any(|l: &String| l.contains("\"state\":\"held\""))
    {
        assert!(Instant::now() < deadline, "no held event in 5 s: {seen:?}");
        let mut line = String::new();
        events.read_line(&mut line).await.unwrap();
        seen.push(line);
    }
    let session_at = seen
        .iter()
        .position(|l| l.starts_with("event: session"))
        .expect("a session event");
    let grant_at = seen
        .iter()
        .position(|l| l.starts_with("event: grant"))
        .expect("a grant event");
    assert!(session_at < grant_at, "{seen:?}");
    let (status, _) = agent
        .call("GET", &format!("/v1/sessions/{app}/events"), None)
        .await;
    assert_eq!(status, 409, "one stream per session");

    let waiter = agent.session(30_000).await;
    assert_eq!(agent.acquire(&waiter, "stream", 0).await.0, 202);
    let closed = Instant::now();
    drop(events); // the application's process died: the kernel closes its socket
    let (_, next) = agent
        .call(
            "GET",
            &format!(
                "/v1/sessions/{waiter}/leases/{}/stream?waitMs=10000",
                ns.name
            ),
            None,
        )
        .await;
    assert_eq!(next["state"], "held", "{next}");
    assert!(
        closed.elapsed() < Duration::from_secs(2),
        "granted {:?} after the stream closed",
        closed.elapsed()
    );
}

#[tokio::test]
async fn sigterm_releases_every_grant_and_removes_the_socket() {
    let ns = setup("agent-sigterm").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let mut agent = AgentProcess::start(&ns).await;
    let id = agent.session(30_000).await;
    for lease in ["one", "two"] {
        assert_eq!(agent.acquire(&id, lease, 10_000).await.0, 200);
    }
    let metrics = support::admin_get(agent.admin_port, "/metrics")
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l == "palisade_agent_grants_held 2"),
        "{metrics}"
    );

    let pid = agent.child.id().unwrap() as i32;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(15), agent.child.wait())
        .await
        .expect("exits within 15 s")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!agent.socket.exists(), "the socket is removed");
    assert!(!agent.token_file(&ns.name, "one").exists());
    let claims = support::claim_names(&ns).await;
    assert!(claims.is_empty(), "claims left behind: {claims:?}");
}

#[tokio::test]
async fn the_api_listens_on_loopback_only() {
    let output = support::cli::palisade()
        .args([
            "agent",
            "--namespace",
            "x",
            "--socket",
            "/nonexistent/dir/agent.sock",
            "--listen",
            "0.0.0.0:7800",
        ])
        .env("KUBECONFIG", kubeconfig_path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("loopback"), "{stderr}");

    let ns = setup("agent-tcp").await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let _agent = tokio::process::Command::from(support::cli::palisade())
        .args([
            "agent",
            "--namespace",
            &ns.name,
            "--no-token-files",
            "--admin-addr",
            "127.0.0.1:0",
            "--socket",
        ])
        .arg(dir.path().join("a.sock"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("KUBECONFIG", kubeconfig_path())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tcp = loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("the TCP port is not up: {e}"),
        }
    };
    tcp.write_all(
        b"POST /v1/sessions HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}

/// `palisade agent ARGS` with `env`, expected to refuse to start: its stderr.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = support::cli::palisade()
        .args(["agent", "--namespace", "x"])
        .args(args)
        .envs(env.iter().copied())
        .env("KUBECONFIG", kubeconfig_path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    stderr
}

#[tokio::test]
async fn a_start_that_would_expose_the_api_or_lose_data_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/agent.sock");
    let socket = socket.to_str().unwrap();
    // Under hostNetwork the loopback is the node's: the Downward API says so.
    let host = [
        ("POD_NAME", "p"),
        ("POD_IP", "10.1.2.3"),
        ("HOST_IP", "10.1.2.3"),
    ];
    let stderr = refused_start(&["--socket", socket, "--listen", "127.0.0.1:7801"], &host);
    assert!(stderr.contains("node's network"), "{stderr}");
    let stderr = refused_start(
        &["--socket", socket, "--listen", "127.0.0.1:7801"],
        &[("POD_NAME", "p")],
    );
    assert!(stderr.contains("POD_IP and HOST_IP"), "{stderr}");

    // A token directory holding the socket (and the user's data) is left alone.
    let data = dir.path().join("run/keep.txt");
    std::fs::create_dir_all(data.parent().unwrap()).unwrap();
    std::fs::write(&data, "mine").unwrap();
    let run = dir.path().join("run");
    let stderr = refused_start(
        &["--socket", socket, "--token-dir", run.to_str().unwrap()],
        &[],
    );
    assert!(stderr.contains("holds the socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "mine");

    // An admin address in use fails the start instead of serving without probes.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = taken.local_addr().unwrap().to_string();
    let stderr = refused_start(
        &[
            "--socket",
            socket,
            "--no-token-files",
            "--admin-addr",
            &admin,
        ],
        &[],
    );
    assert!(
        stderr.contains(&format!("admin address {admin}")),
        "{stderr}"
    );
    assert!(!Path::new(socket).exists(), "no socket is left behind");
}

#[tokio::test]
async fn an_acquire_whose_caller_hangs_up_leaves_nothing_behind() {
    let ns = setup("agent-hangup").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let proxy = support::proxy::Proxy::start(support::apiserver_port())
        .await
        .unwrap();
    let agent = AgentProcess::start_with(&ns, &support::kubeconfig_through(&proxy, &ns.name)).await;
    let id = agent.session(30_000).await;
    // The API server answers 2 s late: the acquire is still making sure the Lease
    // exists when its caller hangs up.
    proxy.set(support::proxy::Mode::Latency(Duration::from_secs(2)));
    let body = json!({"name": "hangup", "durationSeconds": 6, "waitMs": 0}).to_string();
    let mut caller = UnixStream::connect(&agent.socket).await.unwrap();
    let head = format!(
        "POST /v1/sessions/{id}/leases HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    caller.write_all(head.as_bytes()).await.unwrap();
    caller.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(caller);
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set(support::proxy::Mode::Pass);
    // The session holds and waits for nothing: the Lease can be acquired again.
    let (status, grant) = agent.acquire(&id, "hangup", 20_000).await;
    assert_eq!(status, 200, "{grant}");
}

/// A semaphore of two: a grant names its slot and that slot's fence key, the token
/// files show the latest grant with its slot, and a waiter for one slot gets that
/// slot when its holder releases it.
#[tokio::test]
async fn a_semaphores_grants_name_their_slots_fence_keys_and_token_files() {
    let ns = setup("agent-slots").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let lease: palisade::crd::Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": "workers"},
        "spec": {"leaseDurationSeconds": 6, "permits": 2}
    }))
    .unwrap();
    ns.api::<palisade::crd::Lease>()
        .create(&Default::default(), &lease)
        .await
        .expect("create the semaphore");
    let agent = AgentProcess::start(&ns).await;
    let (first, second, third) = (
        agent.session(10_000).await,
        agent.session(10_000).await,
        agent.session(10_000).await,
    );

    let (status, one) = agent.acquire_slot(&first, "workers", 1, 10_000).await;
    assert_eq!(
        (status, one["state"].as_str()),
        (200, Some("held")),
        "{one}"
    );
    assert_eq!(one["slot"], 1, "{one}");
    assert_eq!(one["fenceKey"], format!("{}/workers#1", ns.name), "{one}");
    let token_of = |grant: &Value| format!("{}\n", grant["token"]);
    assert_eq!(
        agent.token_files(&ns.name, "workers"),
        (token_of(&one), "1\n".into())
    );

    // Any slot: the lowest free one, keyed as a lock's.
    let (status, zero) = agent.acquire(&second, "workers", 10_000).await;
    assert_eq!((status, zero["slot"].as_i64()), (200, Some(0)), "{zero}");
    assert_eq!(zero["fenceKey"], format!("{}/workers", ns.name), "{zero}");
    assert_eq!(
        agent.token_files(&ns.name, "workers"),
        (token_of(&zero), "0\n".into()),
        "the latest grant of the Lease in the pod"
    );

    // A waiter for slot 1 says so, and gets it when its holder lets go.
    let (status, waiting) = agent.acquire_slot(&third, "workers", 1, 300).await;
    assert_eq!(
        (status, waiting["state"].as_str()),
        (202, Some("waiting")),
        "{waiting}"
    );
    assert_eq!(
        (waiting["slot"].as_i64(), waiting.get("token")),
        (Some(1), None)
    );
    let (_, session) = agent
        .call("GET", &format!("/v1/sessions/{first}"), None)
        .await;
    assert_eq!(session["grants"][0]["slot"], 1, "{session}");
    let (status, released) = agent
        .call(
            "DELETE",
            &format!("/v1/sessions/{first}/leases/{}/workers", ns.name),
            None,
        )
        .await;
    assert_eq!(
        (status, released["state"].as_str()),
        (200, Some("released")),
        "{released}"
    );
    assert_eq!(
        (&released["slot"], &released["token"]),
        (&one["slot"], &one["token"])
    );
    let (_, handed) = agent
        .call(
            "GET",
            &format!(
                "/v1/sessions/{third}/leases/{}/workers?waitMs=10000",
                ns.name
            ),
            None,
        )
        .await;
    assert_eq!(
        (handed["state"].as_str(), handed["slot"].as_i64()),
        (Some("held"), Some(1)),
        "{handed}"
    );
    assert!(
        handed["token"].as_i64() > one["token"].as_i64(),
        "{one} then {handed}"
    );
    assert_eq!(
        agent.token_files(&ns.name, "workers"),
        (token_of(&handed), "1\n".into())
    );
}
