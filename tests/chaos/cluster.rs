//! The chaos suite's own control plane: started fresh (cluster.sh, on ports apart
//! from `make cluster`'s), set up with the CRDs, the namespace, the fencing policies
//! (objects' and operators') and the Leases, restarted piece by piece as faults, and torn down at the end. With
//! `--ha`, the replicated one (three etcd members, two API servers behind load
//! balancers, every link through palisade-linkproxy: cluster.sh HA=1).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use palisade::client::LeaseClient;
use palisade::crd::LeaseSpec;
use serde_json::json;

use crate::{dbstores, worker};

pub const NAMESPACE: &str = "chaos";
/// Lease duration of every Lease in the run.
pub const LEASE_SECONDS: u64 = 2;

/// A Lease the workers contend for: a lock (`lease-<n>`, one permit) or a semaphore
/// (`sem-<n>`, `permits` slots, each fenced under a key of its own).
#[derive(Debug, Clone, PartialEq)]
pub struct ChaosLease {
    pub name: String,
    pub permits: i32,
}

impl ChaosLease {
    /// The run's Leases: `locks` locks, then `semaphores` semaphores of `permits` each.
    pub fn all(locks: usize, semaphores: usize, permits: i32) -> Vec<ChaosLease> {
        let lock = |i| ChaosLease {
            name: format!("lease-{i}"),
            permits: 1,
        };
        let semaphore = |i| ChaosLease {
            name: format!("sem-{i}"),
            permits,
        };
        (0..locks)
            .map(lock)
            .chain((0..semaphores).map(semaphore))
            .collect()
    }

    pub fn slots(&self) -> std::ops::Range<i32> {
        0..self.permits
    }
}

/// Every slot's fence key (`chaos/lease-0`, `chaos/sem-0#1`, ...): the keys the stores
/// keep marks under.
pub fn fence_keys(leases: &[ChaosLease]) -> Vec<String> {
    leases
        .iter()
        .flat_map(|l| {
            l.slots()
                .map(|slot| palisade::permits::fence_key(NAMESPACE, &l.name, slot))
        })
        .collect()
}

/// The Leases' names, as the workers choose among them.
pub fn names(leases: &[ChaosLease]) -> Vec<String> {
    leases.iter().map(|l| l.name.clone()).collect()
}

// The suite's own control plane: ports apart from `make cluster`'s.
const ETCD_PORT: u16 = 23791;
const ETCD_PEER_PORT: u16 = 23801;
const APISERVER_PORT: u16 = 16444;
const KCM_PORT: u16 = 16258;
/// The HA plane's ports (their layout: cluster.sh), apart from `make cluster HA=1`'s.
const HA_PORT_BASE: u16 = 24100;
/// The API servers of the HA plane, each with its own watch cache.
pub const HA_APISERVERS: usize = 2;
/// The members of the HA plane's etcd.
pub const ETCD_MEMBERS: usize = 3;

/// The suite's own etcd + kube-apiserver (+ controller-manager), via cluster.sh.
#[derive(Clone)]
pub struct ControlPlane {
    pub root: PathBuf,
    state: PathBuf,
    pub ha: bool,
}

impl ControlPlane {
    pub fn new(ha: bool) -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let state = root.join("target/chaos-cluster");
        ControlPlane { root, state, ha }
    }

    /// The API server's port in the admin kubeconfig (HA: the first load balancer).
    pub fn apiserver_port(&self) -> u16 {
        if self.ha {
            HA_PORT_BASE + 70
        } else {
            APISERVER_PORT
        }
    }

    /// The ports a client may be pinned to: the API server, or (HA) each load
    /// balancer, which prefers its own API server and fails over to the other.
    pub fn entry_ports(&self) -> Vec<u16> {
        if self.ha {
            (0..HA_APISERVERS as u16)
                .map(|j| HA_PORT_BASE + 70 + j)
                .collect()
        } else {
            vec![APISERVER_PORT]
        }
    }

    /// HA: the kubeconfig straight to API server `j`, no load balancer.
    pub fn apiserver_kubeconfig(&self, j: usize) -> PathBuf {
        self.state.join(format!("kubeconfig-apiserver-{j}"))
    }

    /// HA: one command to the link proxy (see tests/support/bin/linkproxy.rs).
    pub async fn links(&self, command: &str) -> Result<String, String> {
        support::linkproxy::send(HA_PORT_BASE + 50, command).await
    }

    /// HA: what etcd member `i` says of itself, through its client port (etcd's
    /// JSON gateway, straight, no proxy).
    pub async fn etcd_status(&self, i: usize) -> Result<EtcdStatus, String> {
        let reply = etcd_call(HA_PORT_BASE + i as u16, "maintenance/status", "{}").await?;
        let number = |v: &serde_json::Value| -> Result<u64, String> {
            v.as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("etcd member {i}: unexpected status {reply}"))
        };
        Ok(EtcdStatus {
            member_id: number(&reply["header"]["member_id"])?,
            // The gateway leaves zero out: no leader known.
            leader: match &reply["leader"] {
                serde_json::Value::Null => 0,
                leader => number(leader)?,
            },
            revision: number(&reply["header"]["revision"])?,
        })
    }

    /// HA: compacts etcd's history up to `revision`, through member `i`.
    pub async fn compact(&self, i: usize, revision: u64) -> Result<(), String> {
        let body = serde_json::json!({"revision": revision.to_string(), "physical": true});
        etcd_call(HA_PORT_BASE + i as u16, "kv/compaction", &body.to_string())
            .await
            .map(|_| ())
    }

    pub fn script(&self, args: &[&str]) -> Result<(), String> {
        let bin_dir = std::env::var("PALISADE_BIN_DIR")
            .map_err(|_| "PALISADE_BIN_DIR is not set: run through `make chaos` or `make test`")?;
        let status = Command::new(self.root.join("tests/controlplane/cluster.sh"))
            .args(args)
            .env("BIN_DIR", bin_dir)
            .env("STATE_DIR", &self.state)
            .env("ETCD_PORT", ETCD_PORT.to_string())
            .env("ETCD_PEER_PORT", ETCD_PEER_PORT.to_string())
            .env("APISERVER_PORT", APISERVER_PORT.to_string())
            .env("KCM_PORT", KCM_PORT.to_string())
            .env("HA", if self.ha { "1" } else { "0" })
            .env("HA_PORT_BASE", HA_PORT_BASE.to_string())
            // The machine's one node belongs to `make cluster`; the suite needs none.
            .env("NODE", "0")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cluster.sh: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("cluster.sh {} failed: {status}", args.join(" ")))
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.state.join("kubeconfig")
    }

    pub fn down(&self) {
        if let Err(e) = self.script(&["down"]) {
            eprintln!("chaos: {e}");
        }
    }
}

/// One member's view of etcd.
pub struct EtcdStatus {
    pub member_id: u64,
    /// The member it takes for the leader (0: none).
    pub leader: u64,
    pub revision: u64,
}

/// POSTs `body` to etcd's JSON gateway (`/v3/<path>`) on `port`, with curl (as
/// cluster.sh does): the reply, parsed.
async fn etcd_call(port: u16, path: &str, body: &str) -> Result<serde_json::Value, String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sf", "--max-time", "3", "-X", "POST", "-d", body])
        .arg(format!("http://127.0.0.1:{port}/v3/{path}"))
        .output()
        .await
        .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "etcd on {port}: /v3/{path} failed ({})",
            out.status
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("etcd on {port}: /v3/{path}: {e}"))
}

/// A fresh control plane and database servers, set up for a run with these Leases:
/// the admin client (straight to the API server) and the servers; `None` (the cause
/// printed) when something failed.
pub async fn bring_up(
    plane: &ControlPlane,
    leases: &[ChaosLease],
) -> Option<(Client, dbstores::Servers)> {
    // A fresh control plane: nothing left over from an earlier run.
    plane.down();
    if let Err(e) = plane.script(&["up"]) {
        eprintln!("chaos: starting the control plane: {e}");
        return None;
    }
    let servers = dbstores::Servers::new(&plane.root);
    if let Err(e) = servers.set_up().await {
        eprintln!("chaos: starting PostgreSQL and Redis: {e}");
        return None;
    }
    let admin = worker::client_from(&plane.kubeconfig()).await;
    if let Err(e) = set_up(&admin, plane, leases).await {
        eprintln!("chaos: set-up: {e}");
        return None;
    }
    if let Err(e) = servers.create_marks(&fence_keys(leases)).await {
        eprintln!("chaos: creating the Redis marks: {e}");
        return None;
    }
    Some((admin, servers))
}

/// CRDs, the namespace, the fencing admission policies (rendered from our chart), the
/// Leases and one fenced ConfigMap per slot.
async fn set_up(admin: &Client, plane: &ControlPlane, leases: &[ChaosLease]) -> Result<(), String> {
    support::apply_crds(admin, "palisade-chaos").await?;
    // First: the operators policy's RBAC has Roles in them.
    create_namespace(admin, NAMESPACE).await?;
    create_namespace(admin, crate::operator_worker::OPERATOR_NAMESPACE).await?;
    apply_fencing_policy(plane)?;
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    create_leases(admin, &configmaps, leases).await?;
    wait_policy_active(&configmaps).await
}

/// The object-fencing admission policy, and the operators policy with its RBAC and the
/// client role for the operator workers' account (operator_setup.rs), rendered from
/// our chart and applied.
fn apply_fencing_policy(plane: &ControlPlane) -> Result<(), String> {
    let bin_dir = PathBuf::from(std::env::var("PALISADE_BIN_DIR").unwrap_or_default());
    let rendered = Command::new(bin_dir.join("helm"))
        .args(["template", "chaos"])
        .arg(plane.root.join("charts/palisade"))
        .args(["--show-only", "templates/policy-object-fencing.yaml"])
        .args(["--show-only", "templates/policy-operator-fencing.yaml"])
        .args(["--show-only", "templates/rbac-client.yaml"])
        .args(["--set-json", &crate::operator_setup::chart_value()])
        .output()
        .map_err(|e| format!("helm template: {e}"))?;
    if !rendered.status.success() {
        return Err(format!(
            "helm template: {}",
            String::from_utf8_lossy(&rendered.stderr)
        ));
    }
    let mut apply = Command::new(bin_dir.join("kubectl"))
        .args([
            "apply",
            "--server-side",
            "--field-manager",
            "palisade-chaos",
            "-f",
            "-",
        ])
        .env("KUBECONFIG", plane.kubeconfig())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("kubectl apply: {e}"))?;
    {
        use std::io::Write;
        apply
            .stdin
            .take()
            .expect("piped")
            .write_all(&rendered.stdout)
            .map_err(|e| format!("kubectl apply: {e}"))?;
    }
    if !apply.wait().map_err(|e| e.to_string())?.success() {
        return Err("kubectl apply of the fencing policies failed".into());
    }
    Ok(())
}

async fn create_namespace(admin: &Client, name: &str) -> Result<(), String> {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("creating namespace {name}: {e}")),
    }
    Ok(())
}

/// The Leases, each slot with its fenced ConfigMap (labelled with its slot above 0).
async fn create_leases(
    admin: &Client,
    configmaps: &Api<ConfigMap>,
    leases: &[ChaosLease],
) -> Result<(), String> {
    let client = LeaseClient::new(admin.clone(), NAMESPACE);
    for lease in leases {
        let spec = LeaseSpec {
            lease_duration_seconds: LEASE_SECONDS as i64,
            permits: lease.permits,
        };
        client
            .ensure_lease_with(&lease.name, spec)
            .await
            .map_err(|e| format!("creating lease {}: {e}", lease.name))?;
        for slot in lease.slots() {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {
                    "name": worker::configmap_name(&lease.name, slot),
                    "labels": worker::fenced_labels(&lease.name, slot),
                    "annotations": {"palisade.dev/fencing-token": "0"},
                },
            }))
            .unwrap();
            match configmaps.create(&PostParams::default(), &cm).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    return Err(format!(
                        "creating the fenced ConfigMap of {}: {e}",
                        crate::history::slot_key(&lease.name, slot)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The API server loads a new admission policy asynchronously: wait until a stale
/// write to a probe object is refused.
async fn wait_policy_active(configmaps: &Api<ConfigMap>) -> Result<(), String> {
    let probe: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "policy-probe",
            "labels": {"palisade.dev/fenced-by": "probe"},
            "annotations": {"palisade.dev/fencing-token": "5"},
        },
    }))
    .unwrap();
    match configmaps.create(&PostParams::default(), &probe).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("creating the policy probe: {e}")),
    }
    let stale = json!({"metadata": {"annotations": {"palisade.dev/fencing-token": "1"}}});
    for _ in 0..300 {
        match configmaps
            .patch(
                "policy-probe",
                &PatchParams::default(),
                &Patch::Merge(&stale),
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(()),
            Err(e) => return Err(format!("probing the fencing policy: {e}")),
            Ok(_) => {
                // Accepted: not enforced yet. Put the token back up and try again.
                let up = json!({"metadata": {"annotations": {"palisade.dev/fencing-token": "5"}}});
                let _ = configmaps
                    .patch("policy-probe", &PatchParams::default(), &Patch::Merge(&up))
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err("the object-fencing policy was not enforced within 30s".into())
}

/// The admin kubeconfig (`admin_text`, whose server is on `admin_port`) with the API
/// server's address replaced by a proxy's (on `port`), written to `path`.
pub fn kubeconfig_via(admin_text: &str, admin_port: u16, port: u16, path: PathBuf) -> PathBuf {
    let text = admin_text.replace(
        &format!("https://127.0.0.1:{admin_port}"),
        &format!("https://127.0.0.1:{port}"),
    );
    std::fs::write(&path, text).expect("writing a kubeconfig");
    path
}
