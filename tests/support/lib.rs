//! Shared test support, the crate `palisade-test-support` (`support` in the tests):
//! the real local control plane (`make cluster`), a client for it, a namespace per
//! test that is deleted afterwards, and waiting for an object by watching it. One
//! module per concept:
//!
//! - `claims`: creating Leases and LeaseClaims, waiting for grants and claim phases
//! - `helm`: the chart, installed as a release per test namespace
//! - `admission`: the chart's admission policies as a test meets them
//! - `accounts`: ServiceAccounts, their pods and tokens, the client role bound to them
//! - `tools`: helm and kubectl from PATH, and how a failed process is shown
//! - `cli`: the `palisade` binary as a process
//! - `crd_reference`: the CRD reference page (docs/crd-reference.md)
//! - `provider`: an HTTP payment provider that deduplicates by idempotency key (the outbox)
//! - `proxy`: a TCP proxy to the API server that delays, cuts or black-holes connections
//! - `linkproxy`: commands to the HA control plane's link proxy (`palisade-linkproxy`)
//! - `databases`: PostgreSQL and Redis (`make databases`)
//! - `requests`, `agent_http`: what a client sent; the agent's API over its socket
//!
//! Integration tests never skip: when the cluster cannot be started they fail
//! with the reason (the failing component's log tail, printed by cluster.sh).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub mod accounts;
pub mod admission;
pub mod agent_http;
pub mod claims;
pub mod cli;
pub mod crd_reference;
pub mod databases;
pub mod helm;
pub mod linkproxy;
pub mod provider;
pub mod proxy;
pub mod requests;
pub mod tools;

/// The repository (this crate lives in its tests/support/).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("tests/support/ is two levels below the repository")
}

/// Starts the local control plane once per test binary (or reuses the running
/// one) and returns the admin kubeconfig path. Panics with the reason otherwise.
pub fn kubeconfig_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = Command::new("make")
            .args(["-s", "cluster"])
            .current_dir(repo_root())
            .output()
            .expect("cannot run `make cluster` (is make installed?)");
        if !out.status.success() {
            panic!(
                "the local control plane could not be started (`make cluster` exited with {}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        repo_root().join("target/cluster/kubeconfig")
    })
}

pub fn kubeconfig() -> Kubeconfig {
    let path = kubeconfig_path();
    Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub async fn admin_config() -> Config {
    Config::from_custom_kubeconfig(kubeconfig(), &KubeConfigOptions::default())
        .await
        .expect("the admin kubeconfig written by cluster.sh is valid")
}

/// The test cluster's API server URL, as the admin kubeconfig names it.
fn apiserver_url() -> String {
    kubeconfig().clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .expect("the kubeconfig names a server")
}

/// The test cluster's API server port (on loopback), for a proxy in front of it.
pub fn apiserver_port() -> u16 {
    apiserver_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("the API server's URL names its port")
}

/// The admin kubeconfig with its server replaced by `proxy` (which forwards to the
/// API server), written to `target/proxied-<name>.kubeconfig`: for processes whose
/// API connections a test cuts or slows.
pub fn kubeconfig_through(proxy: &proxy::Proxy, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(kubeconfig_path()).unwrap();
    let server = apiserver_url();
    assert_ne!(
        apiserver_port(),
        proxy.port,
        "the proxy is not the API server"
    );
    let path = repo_root().join(format!("target/proxied-{name}.kubeconfig"));
    std::fs::write(
        &path,
        text.replace(&server, &format!("https://127.0.0.1:{}", proxy.port)),
    )
    .unwrap();
    path
}

/// A client configuration for the test cluster, for `namespace`, whose connections go
/// through a new [`proxy::Proxy`] (which can make them die silently).
pub async fn proxied_config(namespace: &str) -> (Config, proxy::Proxy) {
    let mut config = admin_config().await;
    assert_eq!(
        config.cluster_url.host(),
        Some("127.0.0.1"),
        "the proxy forwards to the API server on loopback"
    );
    let port = config
        .cluster_url
        .port_u16()
        .expect("the API server's URL names its port");
    let proxy = proxy::Proxy::start(port)
        .await
        .expect("a proxy on loopback");
    config.cluster_url = proxy.url().parse().unwrap();
    config.default_namespace = namespace.to_string();
    (config, proxy)
}

pub async fn client() -> Client {
    Client::try_from(admin_config().await).expect("a client for the local control plane")
}

/// A client that authenticates with a bearer token instead of the admin certificate.
pub async fn client_with_token(token: &str) -> Client {
    let mut config = admin_config().await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    Client::try_from(config).expect("a token client for the local control plane")
}

/// A namespace of its own for one test; deleted (with everything in it) on drop.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    pub async fn new(prefix: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let client = client().await;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "t-{}-{}-{:x}",
            prefix.replace('_', "-"),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos % 0xfffff
        );
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"palisade.dev/test": "true"}}
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {name}: {e}"));
        Self { name, client }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        clean_up(|| async move {
            let _ = Api::<Namespace>::all(client().await)
                .delete(&name, &DeleteParams::background())
                .await;
        });
    }
}

/// The Kubernetes release the control plane is built from (tests/controlplane/kube/go.mod).
pub fn pinned_kubernetes_version() -> String {
    let gomod =
        std::fs::read_to_string(repo_root().join("tests/controlplane/kube/go.mod")).unwrap();
    gomod
        .lines()
        .find_map(|l| {
            let mut fields = l
                .split_whitespace()
                .skip_while(|f| *f != "k8s.io/kubernetes");
            fields.next()?;
            fields
                .next()
                .filter(|v| v.starts_with('v'))
                .map(str::to_string)
        })
        .expect("go.mod requires k8s.io/kubernetes")
}

/// Installs (server-side applies) the palisade CRDs once per test binary and waits until they serve.
pub async fn install_crds() {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        apply_crds(&client().await, "palisade-tests")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    })
    .await;
}

/// Server-side applies the palisade CRDs as field manager `manager` through `client`
/// and waits (at most 30 s each) until they are established.
pub async fn apply_crds(client: &Client, manager: &str) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        palisade::crd::Lease::crd(),
        palisade::crd::LeaseClaim::crd(),
    ] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(
            &name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("applying CRD {name}: {e}"))?;
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            kube::runtime::wait::await_condition(crds.clone(), &name, established),
        )
        .await
        .map_err(|_| format!("CRD {name} not established within 30s"))?
        .map_err(|e| format!("waiting for CRD {name}: {e}"))?;
    }
    Ok(())
}

/// The palisade CRDs installed ([`install_crds`]) and a namespace of the test's own.
pub async fn setup(prefix: &str) -> TestNamespace {
    install_crds().await;
    TestNamespace::new(prefix).await
}

/// The API server's refusal; panics if the call was not refused by it.
pub fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// A free TCP port on 127.0.0.1 (for a controller's admin server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `palisade controller` process for one namespace; SIGKILLed when dropped.
pub struct ControllerProcess {
    pub child: tokio::process::Child,
    pub admin_port: u16,
}

impl ControllerProcess {
    pub async fn start(namespace: &str, extra: &[&str]) -> Self {
        Self::start_with_kubeconfig(namespace, kubeconfig_path(), extra).await
    }

    /// [`ControllerProcess::start`] with a kubeconfig of the test's own.
    pub async fn start_with_kubeconfig(namespace: &str, kubeconfig: &Path, extra: &[&str]) -> Self {
        let admin_port = free_port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(repo_root().join(format!("target/controller-{namespace}.log")))
            .unwrap();
        let child = tokio::process::Command::new(cli::binary())
            .args(["controller", "--namespace", namespace, "--admin-addr"])
            .arg(format!("127.0.0.1:{admin_port}"))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,palisade=debug")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawning palisade controller");
        let process = Self { child, admin_port };
        process.wait_ready().await;
        process
    }

    async fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Ok(body) = self.get("/readyz").await
                && body.starts_with("ready")
            {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "controller not ready within 30s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// GET a path of this controller's admin server.
    pub async fn get(&self, path: &str) -> std::io::Result<String> {
        admin_get(self.admin_port, path).await
    }

    /// The value of a metric without labels (or the sum over its label sets).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter(|l| l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The metric once it has reached `expected` (the controller counts a write after
    /// its response, which may come after a watcher already saw the write), or
    /// whatever it is after two seconds.
    pub async fn settled_metric(&self, name: &str, expected: f64) -> f64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let value = self.metric(name).await;
            if value == expected || std::time::Instant::now() > deadline {
                return value;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The `palisade` CLI ([`cli::palisade`]) as a tokio process against the test cluster:
/// its kubeconfig, warnings only, no stdin, killed when dropped.
pub fn palisade_on_cluster() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::from(cli::palisade());
    cmd.env("KUBECONFIG", kubeconfig_path())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `work` to completion on a runtime of its own, in a thread of its own: cleanup
/// for `Drop`, which cannot await and may run inside the test's runtime.
pub fn clean_up<F>(work: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work());
    })
    .join();
}

/// How long a test waits for the cluster to reach an expected state.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits (watching, not polling) until the named object satisfies `pred`
/// (None: absent), returning it. Panics after [`WAIT`].
pub async fn wait_for<K>(
    api: Api<K>,
    name: &str,
    what: &str,
    pred: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    wait_for_within(api, name, what, WAIT, pred).await
}

/// [`wait_for`] with a time limit of its own; the panic shows the object as last seen.
pub async fn wait_for_within<K>(
    api: Api<K>,
    name: &str,
    what: &str,
    limit: std::time::Duration,
    pred: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt;
    let mut events = kube::runtime::watcher::watch_object(api, name).boxed();
    let deadline = std::time::Instant::now() + limit;
    let mut last = None;
    loop {
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(remaining, events.next()).await {
            Ok(Some(Ok(obj))) if pred(obj.as_ref()) => return obj,
            Ok(Some(Ok(obj))) => last = obj,
            Ok(Some(Err(_))) => continue,
            Ok(None) => panic!("watch on {name} ended"),
            Err(_) => {
                panic!("{name}: timed out after {limit:?} waiting for {what}; last seen: {last:?}")
            }
        }
    }
}

/// Waits until the Lease exists and satisfies `pred`, returning it.
pub async fn wait_lease(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    pred: impl Fn(&palisade::crd::Lease) -> bool,
) -> palisade::crd::Lease {
    wait_for(ns.api(), name, what, |l| l.is_some_and(&pred))
        .await
        .expect("a Lease that satisfies the predicate exists")
}

/// The names of all LeaseClaims in the namespace, sorted.
pub async fn claim_names(ns: &TestNamespace) -> Vec<String> {
    use kube::ResourceExt;
    let claims = ns.api::<palisade::crd::LeaseClaim>();
    let mut names: Vec<String> = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    names.sort();
    names
}

/// GET a path of a controller's admin server on 127.0.0.1 (plain HTTP/1.0, no
/// client library needed); returns the body.
pub async fn admin_get(port: u16, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

/// The claim that holds the Lease, if any.
pub fn holder_claim(lease: &palisade::crd::Lease) -> Option<String> {
    lease
        .status
        .as_ref()?
        .holder
        .as_ref()
        .map(|h| h.claim.clone())
}

/// The Lease's fencing token; panics when it has none.
pub fn token(lease: &palisade::crd::Lease) -> i64 {
    lease
        .status
        .as_ref()
        .and_then(|s| s.fencing_token)
        .expect("a fencing token")
}

/// A Pod object (no kubelet runs it) to bind claims and tokens to.
pub async fn create_pod(ns: &TestNamespace, name: &str) -> k8s_openapi::api::core::v1::Pod {
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "registry.invalid/none:0"}]
        }
    }))
    .unwrap();
    ns.api()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"))
}

/// Server-side applies an invalid palisade manifest (`kind` Lease or LeaseClaim)
/// with strict field validation and returns the API server's error message.
/// Panics, naming `case`, if the server accepted it.
pub async fn apply_rejected(ns: &TestNamespace, case: &str, mut body: serde_json::Value) -> String {
    use kube::api::{Patch, PatchParams};
    use palisade::crd::{Lease, LeaseClaim};
    body["apiVersion"] = serde_json::json!("palisade.dev/v1alpha1");
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    let strict = PatchParams::apply("palisade-tests").validation_strict();
    let patch = Patch::Apply(&body);
    let result = if body["kind"] == "Lease" {
        ns.api::<Lease>()
            .patch(&name, &strict, &patch)
            .await
            .map(|_| ())
    } else {
        ns.api::<LeaseClaim>()
            .patch(&name, &strict, &patch)
            .await
            .map(|_| ())
    };
    result.expect_err(case).to_string()
}
