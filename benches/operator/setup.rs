//! The bench's namespace, service accounts, RBAC and chart release, removed on drop.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Config};
use serde_json::{Value, json};

use super::cluster;

/// The account named in `policies.operators` for the admission cost, and its Lease.
pub const NAMED: &str = "op-admission";
/// An account like [`NAMED`] in every way but that the chart does not name it.
pub const NOT_NAMED: &str = "op-other";
/// The failover's operator account (named), its Lease and the ConfigMap it writes.
pub const FAILOVER: &str = "op-failover";
pub const FAILOVER_STATE: &str = "op-failover-state";
/// The ConfigMap both admission accounts write.
pub const TARGET: &str = "admission-target";

pub struct Setup {
    pub ns: String,
    pub release: String,
    pub kubeconfig: PathBuf,
    pub config: Config,
    pub client: Client,
    /// Helm's config, cache and data directories, the bench's own.
    helm_home: tempfile::TempDir,
    /// The cluster-scoped objects the bench creates beside the chart's.
    cluster_rbac: String,
}

impl Setup {
    pub async fn new(kubeconfig: &Path, config: &Config, client: &Client) -> Result<Self, String> {
        let ns = format!("bench-operator-{}", std::process::id());
        cluster::create_namespace(client, &ns).await;
        let setup = Self {
            release: format!("palisade-bench-op-{}", std::process::id()),
            cluster_rbac: format!("{ns}-fencing-extra"),
            ns,
            kubeconfig: kubeconfig.to_path_buf(),
            config: config.clone(),
            client: client.clone(),
            helm_home: tempfile::tempdir().map_err(|e| format!("a helm home: {e}"))?,
        };
        let operators = json!([
            {"serviceAccount": {"namespace": setup.ns, "name": NAMED}, "lease": {"name": NAMED}},
            {"serviceAccount": {"namespace": setup.ns, "name": FAILOVER}, "lease": {"name": FAILOVER}},
        ]);
        // The claim-identity and object-fencing policies judge the bench's namespace
        // only: other engineers' tests run on the same cluster.
        let selector = json!({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": [setup.ns]
        }]});
        let chart = support::helm::chart_dir();
        setup
            .helm(&[
                "install",
                &setup.release,
                chart.to_str().unwrap(),
                "--namespace",
                &setup.ns,
                "--set",
                "crds.enabled=false",
                "--set",
                "replicaCount=0",
                "--set-json",
                &format!("policies.namespaceSelector={selector}"),
                "--set-json",
                &format!("policies.operators={operators}"),
            ])
            .await?;
        setup.accounts().await?;
        Ok(setup)
    }

    /// helm `args` with the bench's helm home and the cluster's kubeconfig.
    pub async fn helm(&self, args: &[&str]) -> Result<(), String> {
        let out = tokio::process::Command::new(support::tools::tool("helm"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", self.helm_home.path().join("config"))
            .env("HELM_CACHE_HOME", self.helm_home.path().join("cache"))
            .env("HELM_DATA_HOME", self.helm_home.path().join("data"))
            .output()
            .await
            .map_err(|e| format!("running helm: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "helm {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// The release without `policies.operators`: its policies, bindings and RBAC go.
    pub async fn remove_operators_policy(&self) -> Result<(), String> {
        let chart = support::helm::chart_dir();
        self.helm(&[
            "upgrade",
            &self.release,
            chart.to_str().unwrap(),
            "--namespace",
            &self.ns,
            "--reuse-values",
            "--set-json",
            "policies.operators=[]",
        ])
        .await
    }

    /// The three accounts, what they may do, and the ConfigMaps they write.
    async fn accounts(&self) -> Result<(), String> {
        for sa in [NAMED, NOT_NAMED, FAILOVER] {
            self.create::<ServiceAccount>(json!({"metadata": {"name": sa}}))
                .await?;
        }
        for sa in [NAMED, FAILOVER] {
            support::accounts::bind_client_role(
                &self.ns,
                &self.client,
                &self.release,
                &self.ns,
                sa,
            )
            .await;
        }
        let subjects = |names: &[&str]| -> Value {
            names
                .iter()
                .map(|n| json!({"kind": "ServiceAccount", "name": n, "namespace": self.ns}))
                .collect()
        };
        self.create::<Role>(json!({
            "metadata": {"name": "bench-writes"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]
        }))
        .await?;
        self.create::<RoleBinding>(json!({
            "metadata": {"name": "bench-writes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bench-writes"},
            "subjects": subjects(&[NAMED, NOT_NAMED, FAILOVER])
        }))
        .await?;
        // The same impersonation rights as the chart gives a named account, to both
        // admission accounts: the two writes then differ only in whether the policy
        // names the account, and the named one keeps them once the policy is gone.
        let cluster_roles: Api<ClusterRole> = Api::all(self.client.clone());
        cluster_roles
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": self.cluster_rbac},
                    "rules": [{"apiGroups": ["authentication.k8s.io"],
                               "resources": ["userextras/palisade.dev/fencing-token"],
                               "verbs": ["impersonate"]}]
                }))
                .unwrap(),
            )
            .await
            .map_err(|e| format!("ClusterRole {}: {e}", self.cluster_rbac))?;
        let cluster_bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        cluster_bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": self.cluster_rbac},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": self.cluster_rbac},
                    "subjects": subjects(&[NAMED, NOT_NAMED])
                }))
                .unwrap(),
            )
            .await
            .map_err(|e| format!("ClusterRoleBinding {}: {e}", self.cluster_rbac))?;
        for sa in [NAMED, NOT_NAMED] {
            let name = format!("bench-impersonate-{sa}");
            self.create::<Role>(json!({
                "metadata": {"name": name},
                "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"],
                           "verbs": ["impersonate"], "resourceNames": [sa]}]
            }))
            .await?;
            self.create::<RoleBinding>(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": subjects(&[sa])
            }))
            .await?;
        }
        for name in [TARGET, FAILOVER_STATE] {
            self.create::<ConfigMap>(json!({"metadata": {"name": name}, "data": {"seq": "0"}}))
                .await?;
        }
        Ok(())
    }

    async fn create<K>(&self, object: Value) -> Result<(), String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
        <K as kube::Resource>::DynamicType: Default,
    {
        let what = format!(
            "{} {}",
            K::kind(&Default::default()),
            object["metadata"]["name"]
        );
        let object: K = serde_json::from_value(object).map_err(|e| format!("{what}: {e}"))?;
        Api::<K>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &object)
            .await
            .map(drop)
            .map_err(|e| format!("creating {what}: {e}"))
    }

    /// A token of `sa` (not bound to a pod: the operators here are host processes).
    pub async fn token(&self, sa: &str) -> Result<String, String> {
        let request =
            serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 7200}}))
                .unwrap();
        Api::<ServiceAccount>::namespaced(self.client.clone(), &self.ns)
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("TokenRequest for {sa}: {e}"))?
            .status
            .map(|s| s.token)
            .ok_or_else(|| format!("TokenRequest for {sa}: no status"))
    }

    /// The cluster's configuration, authenticated as `sa`.
    pub async fn config_of(&self, sa: &str) -> Result<Config, String> {
        Ok(as_token(self.config.clone(), self.token(sa).await?))
    }
}

/// `config` with its credentials replaced by a bearer token.
pub fn as_token(mut config: Config, token: String) -> Config {
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    config
}

impl Drop for Setup {
    fn drop(&mut self) {
        let mut helm = std::process::Command::new(support::tools::tool("helm"));
        helm.args([
            "uninstall",
            &self.release,
            "--namespace",
            &self.ns,
            "--ignore-not-found",
        ])
        .env("KUBECONFIG", &self.kubeconfig)
        .env("HELM_CONFIG_HOME", self.helm_home.path().join("config"))
        .env("HELM_CACHE_HOME", self.helm_home.path().join("cache"))
        .env("HELM_DATA_HOME", self.helm_home.path().join("data"));
        match helm.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "helm uninstall {}: {}",
                self.release,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("helm uninstall {}: {e}", self.release),
        }
        let (config, ns, rbac) = (
            self.config.clone(),
            self.ns.clone(),
            self.cluster_rbac.clone(),
        );
        // The bench's runtime may be the one dropping this: a client of its own.
        support::clean_up(move || async move {
            let Ok(client) = Client::try_from(config) else {
                return;
            };
            let dp = DeleteParams::default();
            let _ = Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&rbac, &dp)
                .await;
            let _ = Api::<ClusterRole>::all(client.clone())
                .delete(&rbac, &dp)
                .await;
            cluster::delete_namespace(&client, &ns).await;
        });
    }
}
