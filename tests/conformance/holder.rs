//! The holders of the suite: one driver process per holder (and, for the agent's
//! clients, one `palisade agent` per holder, as one per pod), and the protected
//! resource they all write to: a fence in this process that admits each `write T`
//! line in the order the lines arrive.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade::fence::{Fence, MemoryStore};
use palisade::permits::fence_key;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;
use tokio::time::Instant;

/// Every way to hold a Lease that the suite checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// The Rust library (`palisade::client`), in this binary's driver mode.
    Rust,
    /// `palisade lock LEASE -- sh -c ...`.
    Lock,
    /// The Go client through the agent.
    Go,
    /// The Python client through the agent.
    Python,
    /// The Java client through the agent.
    Java,
}

impl Client {
    pub const ALL: [Client; 5] = [
        Client::Rust,
        Client::Lock,
        Client::Go,
        Client::Python,
        Client::Java,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Client::Rust => "rust",
            Client::Lock => "lock",
            Client::Go => "go",
            Client::Python => "python",
            Client::Java => "java",
        }
    }

    pub fn parse(name: &str) -> Option<Client> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    pub fn through_agent(self) -> bool {
        matches!(self, Client::Go | Client::Python | Client::Java)
    }
}

/// A grant, as its holder's `granted` line reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    /// 0 on a lock, and from a driver that names no slot.
    pub slot: u32,
    /// The key the client gives for the slot: the holder's writes are fenced under it.
    pub fence_key: String,
}

/// What a holder said, or did, or what the suite did to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Granted(Grant),
    /// A write, fenced under its grant's key, and whether the fence admitted it.
    Wrote {
        token: u64,
        fence_key: String,
        admitted: bool,
    },
    Lost(String),
    Released,
    Exited(Option<i32>),
    /// The suite sent the driver this signal.
    Signalled(i32),
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub holder: String,
    pub at: Instant,
    pub said: Said,
}

/// Everything the holders said, in arrival order, and the fence they wrote through:
/// one fence, with a mark per key, so each slot of a semaphore is fenced on its own.
#[derive(Clone)]
pub struct Resource {
    log: Arc<Mutex<Vec<Entry>>>,
    fence: Arc<Fence<MemoryStore>>,
    /// Slot 0's key (a lock's): that of a grant whose line names no key.
    lock_key: String,
}

impl Resource {
    pub fn new(namespace: &str, lease: &str) -> Self {
        Self {
            log: Arc::default(),
            fence: Arc::new(Fence::new(MemoryStore::default())),
            lock_key: fence_key(namespace, lease, 0),
        }
    }

    fn record(&self, holder: &str, said: Said) {
        let said = match said {
            Said::Wrote {
                token, fence_key, ..
            } => Said::Wrote {
                admitted: self.fence.admit(&fence_key, token).is_ok(),
                token,
                fence_key,
            },
            other => other,
        };
        self.log.lock().unwrap().push(Entry {
            holder: holder.to_string(),
            at: Instant::now(),
            said,
        });
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.log.lock().unwrap().clone()
    }

    /// The first entry after `since` that `pick` selects, waiting up to `limit` for it.
    pub async fn wait_for(
        &self,
        what: &str,
        since: Instant,
        limit: Duration,
        pick: impl Fn(&Entry) -> bool,
    ) -> Result<Entry, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(e) = self
                .entries()
                .into_iter()
                .find(|e| e.at >= since && pick(e))
            {
                return Ok(e);
            }
            if Instant::now() > deadline {
                return Err(format!("no {what} within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn granted(
        &self,
        holder: &str,
        since: Instant,
        limit: Duration,
    ) -> Result<(Instant, Grant), String> {
        let e = self
            .wait_for(&format!("grant to {holder}"), since, limit, |e| {
                e.holder == holder && matches!(e.said, Said::Granted(_))
            })
            .await?;
        let Said::Granted(grant) = e.said else {
            unreachable!()
        };
        Ok((e.at, grant))
    }

    /// Writes of `holder` after `since`: (admitted, refused).
    pub fn writes(&self, holder: &str, since: Instant) -> (usize, usize) {
        let mut counts = (0, 0);
        for e in self.entries() {
            if e.holder == holder
                && e.at >= since
                && let Said::Wrote { admitted, .. } = e.said
            {
                if admitted {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
            }
        }
        counts
    }
}

/// Where the holders find the cluster and the clients' programs.
pub struct Setup {
    pub namespace: String,
    /// A kubeconfig through the proxy the outage scenario cuts.
    pub kubeconfig: PathBuf,
    pub out: PathBuf,
    pub go_driver: Option<PathBuf>,
    pub python: Option<(PathBuf, PathBuf)>,
    /// The Java driver's launcher script.
    pub java_driver: Option<PathBuf>,
    pub duration_secs: i64,
    pub keepalive_ms: u64,
}

/// What a holder's Lease and session are to be.
#[derive(Debug, Clone, Copy)]
pub struct Terms {
    /// The agent clients' session keepalive.
    pub keepalive_ms: u64,
    /// spec.permits of the Lease: the library's driver and `palisade lock` create it
    /// so (the agent creates locks only: the suite creates a semaphore for its clients).
    pub permits: u32,
}

pub struct Holder {
    pub id: String,
    pid: i32,
    /// Where the signals the suite sends it are recorded, between its lines.
    resource: Resource,
    /// The driver's exit code once it exited (128+N for signal N); recorded as `Exited`.
    exit: watch::Receiver<Option<Option<i32>>>,
    /// Held open: a driver releases when its stdin ends.
    _stdin: Option<ChildStdin>,
    agent: Option<Child>,
    /// The Pod object its claims are bound to (deleted as a kubelet would report it).
    pub pod: Option<String>,
    /// Done with: the scenario waits for it no more.
    pub done: bool,
}

impl Drop for Holder {
    fn drop(&mut self) {
        if self.exit.borrow().is_none() {
            self.signal(libc::SIGKILL);
        }
    }
}

/// The shell loop `palisade lock` runs: the protocol of the drivers, in sh.
const LOCK_SCRIPT: &str = r#"echo "granted $PALISADE_FENCING_TOKEN slot=$PALISADE_SLOT fence-key=$PALISADE_FENCE_KEY"
trap 'echo released; exit 0' TERM
while :; do echo "write $PALISADE_FENCING_TOKEN"; sleep 0.1; done"#;

impl Holder {
    pub async fn spawn(
        setup: &Setup,
        client: Client,
        lease: &str,
        id: &str,
        pod: Option<(String, String)>,
        resource: &Resource,
        terms: Terms,
    ) -> Holder {
        let log = |what: &str| {
            std::fs::File::create(setup.out.join(format!("{id}.{what}.log"))).expect("a log file")
        };
        let duration = setup.duration_secs.to_string();
        // Passed only for a semaphore: a lock's command lines stay as they were.
        let permits: Vec<String> = match terms.permits {
            1 => vec![],
            n => vec!["--permits".into(), n.to_string()],
        };
        let mut agent = None;
        let mut command = match client {
            Client::Rust => {
                let mut c = Command::new(std::env::current_exe().unwrap());
                c.args(["driver", "--lease", lease, "--namespace", &setup.namespace])
                    .args(["--duration-seconds", &duration])
                    .args(&permits);
                c
            }
            Client::Lock => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_palisade"));
                c.args(["lock", "-n", &setup.namespace, "--duration"])
                    .arg(format!("{duration}s"))
                    .args(&permits)
                    .args([lease, "--", "sh", "-c", LOCK_SCRIPT]);
                c
            }
            Client::Go | Client::Python | Client::Java => {
                let socket = setup.out.join(format!("{id}.sock"));
                let mut a = Command::new(env!("CARGO_BIN_EXE_palisade"));
                a.args(["agent", "--namespace", &setup.namespace, "--socket"])
                    .arg(&socket)
                    .arg("--token-dir")
                    .arg(setup.out.join(format!("{id}.leases")))
                    .args(["--admin-addr", "127.0.0.1:0"])
                    .env("KUBECONFIG", &setup.kubeconfig)
                    .env("RUST_LOG", "info")
                    .stdout(log("agent"))
                    .stderr(log("agent"))
                    .kill_on_drop(true);
                if let Some((name, uid)) = &pod {
                    a.env("POD_NAME", name).env("POD_UID", uid);
                }
                agent = Some(a.spawn().expect("spawning palisade agent"));
                support::agent_http::wait_for_socket(&socket).await;
                let mut c = match client {
                    Client::Go => Command::new(setup.go_driver.as_ref().expect("the Go driver")),
                    Client::Java => {
                        Command::new(setup.java_driver.as_ref().expect("the Java driver"))
                    }
                    _ => {
                        let (python, script) = setup.python.as_ref().expect("the Python driver");
                        let mut c = Command::new(python);
                        c.arg(script);
                        c
                    }
                };
                c.args(["--lease", lease, "--namespace", &setup.namespace])
                    .args(["--duration-seconds", &duration])
                    .arg("--keepalive-ms")
                    .arg(terms.keepalive_ms.to_string())
                    .env("PALISADE_AGENT_SOCKET", &socket);
                c
            }
        };
        for var in [
            "POD_NAME",
            "POD_UID",
            "POD_NAMESPACE",
            "PALISADE_FENCING_TOKEN",
        ] {
            command.env_remove(var);
        }
        if !client.through_agent()
            && let Some((name, uid)) = &pod
        {
            command.env("POD_NAME", name).env("POD_UID", uid);
        }
        command
            .env("KUBECONFIG", &setup.kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log("driver"))
            .kill_on_drop(true);
        let mut driver = command.spawn().expect("spawning a driver");
        let pid = driver.id().expect("the driver runs") as i32;
        let stdin = driver.stdin.take();
        Holder {
            id: id.to_string(),
            pid,
            resource: resource.clone(),
            exit: record_lines(driver, resource.clone(), id.to_string()),
            _stdin: stdin,
            agent,
            pod: pod.map(|(name, _)| name),
            done: false,
        }
    }

    /// Signals the driver, recording it first: a holder the suite stops, asks to
    /// release or kills is believed no more (its writes are the fence's to judge).
    pub fn signal(&self, signal: i32) {
        if self.exit.borrow().is_none() {
            self.resource.record(&self.id, Said::Signalled(signal));
            // SAFETY: kill(2) on a child this process spawned; a pid is not reused before
            // the reaper task above has waited for it, and signals after that are not sent.
            unsafe { libc::kill(self.pid, signal) };
        }
    }

    /// Sends `signal` to the holder's agent (SIGSTOP: frozen, as by CPU starvation).
    pub fn signal_agent(&self, signal: i32) {
        if let Some(pid) = self.agent.as_ref().and_then(Child::id) {
            // SAFETY: kill(2) on a child this process spawned and has not reaped.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    pub fn kill_agent(&mut self) {
        if let Some(agent) = &mut self.agent {
            let _ = agent.start_kill();
        }
    }

    /// Waits for the driver to exit; its exit code.
    pub async fn exited(&mut self, limit: Duration) -> Result<Option<i32>, String> {
        match tokio::time::timeout(limit, self.exit.wait_for(Option::is_some)).await {
            Ok(Ok(code)) => Ok(code.expect("waited for Some")),
            Ok(Err(_)) => Err(format!("{}: its reaper is gone", self.id)),
            Err(_) => Err(format!("{} did not exit within {limit:?}", self.id)),
        }
    }
}

/// Records the driver's lines as they arrive, then its exit; the receiver sees its
/// exit code (128+N for signal N) once it exited.
fn record_lines(
    mut driver: Child,
    resource: Resource,
    who: String,
) -> watch::Receiver<Option<Option<i32>>> {
    let stdout = driver.stdout.take().expect("the driver's stdout");
    let (exit_tx, exit) = watch::channel(None);
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut reader = LineReader::new(&resource.lock_key);
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(said) = reader.said(&line) {
                resource.record(&who, said);
            }
        }
        // Its output ended: it exited (or closed stdout, and exits soon).
        use std::os::unix::process::ExitStatusExt;
        let code = driver
            .wait()
            .await
            .ok()
            .and_then(|s| s.code().or(s.signal().map(|n| 128 + n)));
        resource.record(&who, Said::Exited(code));
        exit_tx.send_replace(Some(code));
    });
    exit
}

/// Reads a driver's lines. A write is fenced under the key of the grant before it:
/// the drivers name the slot and key on the `granted` line only.
struct LineReader {
    lock_key: String,
    fence_key: String,
}

impl LineReader {
    fn new(lock_key: &str) -> Self {
        Self {
            lock_key: lock_key.to_string(),
            fence_key: lock_key.to_string(),
        }
    }

    fn said(&mut self, line: &str) -> Option<Said> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "granted" => {
                let grant = self.grant(rest)?;
                self.fence_key = grant.fence_key.clone();
                Some(Said::Granted(grant))
            }
            "write" => rest.trim().parse().ok().map(|token| Said::Wrote {
                token,
                fence_key: self.fence_key.clone(),
                admitted: false,
            }),
            "lost" => Some(Said::Lost(rest.to_string())),
            "released" => Some(Said::Released),
            _ => None,
        }
    }

    /// `<token> [<claim UID>] [slot=<n> fence-key=<key>]`; without them, slot 0 (a lock's).
    fn grant(&self, rest: &str) -> Option<Grant> {
        let mut words = rest.split_whitespace();
        let mut grant = Grant {
            token: words.next()?.parse().ok()?,
            slot: 0,
            fence_key: self.lock_key.clone(),
        };
        for word in words {
            if let Some(slot) = word.strip_prefix("slot=") {
                grant.slot = slot.parse().ok()?;
            } else if let Some(key) = word.strip_prefix("fence-key=") {
                grant.fence_key = key.to_string();
            }
        }
        Some(grant)
    }
}
