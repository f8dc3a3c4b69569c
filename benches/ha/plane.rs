//! The bench's own HA control plane: `tests/controlplane/cluster.sh` with `HA=1`, on
//! ports apart from `make cluster`'s and the chaos suite's; its kubeconfigs, clients,
//! the CRDs, and the SIGKILL of one API server.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

/// The HA plane's ports (their layout: cluster.sh): etcd on B+0..2, the link proxy's
/// control port B+50, the API servers B+60/61, the load balancers lb-0/lb-1 B+70/71.
const HA_PORT_BASE: u16 = 24200;
/// kube-controller-manager's port, apart from `make cluster`'s (16257) and chaos' (16258).
const KCM_PORT: u16 = 16259;
/// The longest one cluster.sh command may take (it bounds each of its own waits at 90 s).
const SCRIPT_LIMIT: Duration = Duration::from_secs(300);
/// The longest a SIGKILLed API server may take to be gone.
const EXIT_LIMIT: Duration = Duration::from_secs(10);

/// The plane's state directory, the binaries cluster.sh runs, and where the bench's
/// controller logs go.
pub struct Plane {
    root: PathBuf,
    state: PathBuf,
    bin_dir: PathBuf,
    linkproxy: PathBuf,
    pub logs: PathBuf,
}

impl Plane {
    /// From env `PALISADE_BIN_DIR` and `LINKPROXY` (both set by the Makefile).
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str, hint: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .ok_or_else(|| format!("{name} is not set: {hint}"))
        };
        let bin_dir = var(
            "PALISADE_BIN_DIR",
            "run through make, or export PALISADE_BIN_DIR=$(ls -d $HOME/.cache/palisade/bin-*)",
        )?;
        let linkproxy = var(
            "LINKPROXY",
            "run through make, or `cargo build -p palisade-test-support --bin palisade-linkproxy` \
             and export LINKPROXY=$PWD/target/debug/palisade-linkproxy",
        )?;
        if !linkproxy.is_file() {
            return Err(format!(
                "LINKPROXY={}: no such file (make linkproxy builds it)",
                linkproxy.display()
            ));
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        Ok(Plane {
            state: root.join("target/bench-ha-cluster"),
            logs: root.join("target/bench-ha-logs"),
            root,
            bin_dir,
            linkproxy,
        })
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command =
            std::process::Command::new(self.root.join("tests/controlplane/cluster.sh"));
        command
            .args(args)
            .env("HA", "1")
            .env("HA_PORT_BASE", HA_PORT_BASE.to_string())
            .env("STATE_DIR", &self.state)
            .env("KCM_PORT", KCM_PORT.to_string())
            .env("NODE", "0")
            .env("BIN_DIR", &self.bin_dir)
            .env("LINKPROXY", &self.linkproxy)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    }

    /// Runs `cluster.sh ARGS` to its end (at most [`SCRIPT_LIMIT`]). Its messages are
    /// shown when `verbose`, else only when it fails.
    pub async fn script(&self, args: &[&str], verbose: bool) -> Result<(), String> {
        let what = format!("cluster.sh {}", args.join(" "));
        let mut command = tokio::process::Command::from(self.command(args));
        command.kill_on_drop(true);
        if verbose {
            command.stderr(Stdio::inherit());
        } else {
            command.stderr(Stdio::piped());
        }
        let child = command.spawn().map_err(|e| format!("{what}: {e}"))?;
        let out = tokio::time::timeout(SCRIPT_LIMIT, child.wait_with_output())
            .await
            .map_err(|_| format!("{what}: not done within {SCRIPT_LIMIT:?}"))?
            .map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!("{what} failed ({}): {}", out.status, stderr.trim()))
    }

    /// `cluster.sh down`, blocking: for the end of the run, whatever happened.
    pub fn down(&self) {
        match self.command(&["down"]).status() {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("ha: cluster.sh down failed ({s})"),
            Err(e) => eprintln!("ha: cluster.sh down: {e}"),
        }
    }

    /// One of the kubeconfigs cluster.sh writes: `kubeconfig` (through lb-0),
    /// `kubeconfig-lb-1`, `kubeconfig-apiserver-0`, `kubeconfig-apiserver-1`.
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// A client through that kubeconfig (palisade's, with TCP_NODELAY).
    pub async fn client(&self, name: &str) -> Result<Client, String> {
        let path = self.kubeconfig(name);
        let kc = Kubeconfig::read_from(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?;
        palisade::kube_client::client(config)
            .map(|(client, _)| client)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// SIGKILLs kube-apiserver-`j` (`cluster.sh kill`, which goes on to wait for its
    /// process to be reaped, up to 5 s: this machine's init reaps late) and runs
    /// `then` as soon as the process is gone or a zombie, its sockets closed. Returns
    /// how long after the start of the kill the process was gone, and `then`'s output.
    pub async fn kill_apiserver<T>(
        &self,
        j: usize,
        then: impl Future<Output = T>,
    ) -> Result<(Duration, T), String> {
        let component = format!("kube-apiserver-{j}");
        let pid_file = self.state.join(format!("{component}.pid"));
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("{}: no pid", pid_file.display()))?;
        let started = Instant::now();
        let args = ["kill", component.as_str()];
        let kill = self.script(&args, false);
        let after = async {
            wait_gone(pid, EXIT_LIMIT).await?;
            let gone = started.elapsed();
            Ok::<_, String>((gone, then.await))
        };
        let (killed, after) = tokio::join!(kill, after);
        killed?;
        after
    }
}

/// Waits until process `pid` has exited (no such process, or a zombie).
async fn wait_gone(pid: u32, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    while running(&stat) {
        if Instant::now() >= deadline {
            return Err(format!(
                "process {pid} still running {limit:?} after SIGKILL"
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Whether the process of this /proc/PID/stat runs: its state (after the command
/// name in parentheses) is neither Z (zombie) nor X (dead).
fn running(stat: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(stat) else {
        return false;
    };
    let state = text
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

pub async fn create_namespace(admin: &Client, ns: &str) -> Result<(), String> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    match Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("creating namespace {ns}: {e}")),
    }
}
