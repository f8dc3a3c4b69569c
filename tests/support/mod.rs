//! Shared test support: the real local control plane (`make cluster`), a client
//! for it, and a namespace per test that is deleted afterwards.
//!
//! Integration tests never skip: when the cluster cannot be started they fail
//! with the reason (the failing component's log tail, printed by cluster.sh).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
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
        // Drop cannot await, and may run inside the test's runtime: delete from a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = Api::<Namespace>::all(client().await)
                    .delete(&name, &DeleteParams::background())
                    .await;
            });
        })
        .join();
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
