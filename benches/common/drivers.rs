//! The thin clients' release handover, as their applications see it: the conformance
//! drivers of the Go and Java clients (tests/conformance/README.md has their protocol),
//! one process per holder, each through an agent. A round: the holder's driver reads
//! `release` on its stdin; measured from the write of that line to the waiting driver's
//! `granted` line. The waiter is started, and its claim queued, before the round, so
//! that a process's start (a JVM's especially) is outside the measure; still, a new
//! process's first acquire is measured (a JVM's class loading and interpretation on the
//! grant path), as a cron job sees it. The warm paths measure what a long-running
//! service sees, a later acquire in the same process: two long-lived drivers
//! (`--grants`), one on each agent, hand the Lease back and forth, the released one
//! queueing again for its next grant.
//!
//! The drivers come from PALISADE_CONFORMANCE_GO and PALISADE_CONFORMANCE_JAVA (the
//! Makefile's CONFORMANCE_ENV sets them, as for the conformance suite).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::watcher;
use palisade::client::LeaseClient;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// How long a driver may take to say what it must (a JVM's start on a busy machine included).
const SAY_LIMIT: Duration = Duration::from_secs(30);
/// After the waiter's claim is queued: its JVM's start-up compilation is over and its
/// wait for the grant is in flight before the release.
const SETTLE: Duration = Duration::from_millis(200);

/// The client whose driver hands over, and the environment variable naming the driver.
#[derive(Debug, Clone, Copy)]
pub enum Client {
    Go,
    Java,
}

impl Client {
    pub fn config(self) -> &'static str {
        match self {
            Client::Go => "go-client",
            Client::Java => "java-client",
        }
    }

    fn env(self) -> &'static str {
        match self {
            Client::Go => "PALISADE_CONFORMANCE_GO",
            Client::Java => "PALISADE_CONFORMANCE_JAVA",
        }
    }

    /// The driver's program, or why there is none.
    pub fn program(self) -> Result<PathBuf, String> {
        let var = self.env();
        let path = std::env::var_os(var).map(PathBuf::from).ok_or(format!(
            "{var} (the {} conformance driver's path) is not set: run the bench through \
             `make bench` (or set it as the Makefile's CONFORMANCE_ENV does)",
            self.config()
        ))?;
        if !path.exists() {
            return Err(format!(
                "{var}={} does not exist (make conformance-go-driver conformance-java-driver \
                 builds the drivers)",
                path.display()
            ));
        }
        Ok(path)
    }
}

/// Handovers of each warm path's pair of drivers before its measured rounds, discarded:
/// each process's first grant and first wait (its first-use costs) are outside the measure.
pub const WARM_UP: usize = 2;

/// One driver process: its stdin (None once hung up), and its stdout's lines with the
/// instant each arrived.
struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
    log: PathBuf,
}

impl Driver {
    /// The driver, with `--grants` when given.
    fn spawn(
        program: &Path,
        socket: &Path,
        lease: &LeaseSpec,
        grants: Option<usize>,
        log: PathBuf,
    ) -> Driver {
        let grants = grants.map(|n| ["--grants".to_string(), n.to_string()]);
        let mut child = Command::new(program)
            .args([
                "--lease",
                &lease.name,
                "--namespace",
                &lease.ns,
                "--duration-seconds",
            ])
            .arg(lease.duration_secs.to_string())
            .args(grants.iter().flatten())
            .env("PALISADE_AGENT_SOCKET", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a driver log"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Driver {
            child,
            stdin,
            lines,
            log,
        }
    }

    /// The next line starting with `word` (the writes in between skipped), and when it arrived.
    async fn said(&mut self, word: &str) -> (Instant, String) {
        let wanted = async {
            while let Some((at, line)) = self.lines.recv().await {
                if line.split(' ').next() == Some(word) {
                    return Some((at, line));
                }
                if line.starts_with("lost") {
                    return None;
                }
            }
            None
        };
        match tokio::time::timeout(SAY_LIMIT, wanted).await {
            Ok(Some(said)) => said,
            Ok(None) => panic!(
                "the driver lost its grant or ended before `{word}`: {}",
                self.tail()
            ),
            Err(_) => panic!(
                "no `{word}` from the driver in {SAY_LIMIT:?}: {}",
                self.tail()
            ),
        }
    }

    /// The token of a `granted <token> ...` line.
    fn token(granted: &str) -> i64 {
        granted
            .split(' ')
            .nth(1)
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("not a grant: {granted:?}"))
    }

    /// Writes the `release` line; the instant just before the write.
    async fn release(&mut self) -> Instant {
        let at = Instant::now();
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"release\n").await.unwrap();
        stdin.flush().await.unwrap();
        at
    }

    /// Closes its stdin: it releases, or gives up its wait, and exits 0 at once.
    async fn hang_up(mut self) {
        self.stdin = None;
        self.released().await;
    }

    /// Waits for `released` and the driver's exit 0.
    async fn released(mut self) {
        self.said("released").await;
        let status = tokio::time::timeout(SAY_LIMIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the driver did not exit: {}", self.tail()))
            .unwrap();
        assert!(
            status.success(),
            "the driver exited {status}: {}",
            self.tail()
        );
    }

    /// The end of its stderr, for a failure's message.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        format!("{} ends:\n{}", self.log.display(), &text[start..])
    }
}

/// The Lease a path hands over.
struct LeaseSpec {
    name: String,
    ns: String,
    duration_secs: i64,
}

/// One client's release handover path: two agents (as two pods), one Lease handed back
/// and forth between a new driver process on one agent and the holder on the other. The
/// agents are the agent path's own two, shared by the Go and the Java path: then the
/// agent's HTTP row and the clients' rows differ in the client alone, not in the agents
/// (their build, their connections to the API server, their warm-up). The rounds run one
/// at a time, so a path never waits on another's traffic.
pub struct DriverPath {
    client: Client,
    program: PathBuf,
    sockets: [PathBuf; 2],
    leases: LeaseClient,
    lease: LeaseSpec,
    dir: PathBuf,
    /// The holding driver and its token.
    holder: Option<(Driver, i64)>,
    round: usize,
}

impl DriverPath {
    /// The path, its first holder granted.
    pub async fn start(
        client: Client,
        program: PathBuf,
        sockets: [PathBuf; 2],
        leases: LeaseClient,
        (ns, duration_secs): (&str, i64),
        dir: &Path,
    ) -> DriverPath {
        let mut path = DriverPath {
            client,
            program,
            sockets,
            leases,
            lease: LeaseSpec {
                name: format!("{}-release", client.config()),
                ns: ns.to_string(),
                duration_secs,
            },
            dir: dir.to_path_buf(),
            holder: None,
            round: 0,
        };
        let mut first = path.spawn(0);
        let (_, granted) = first.said("granted").await;
        path.holder = Some((first, Driver::token(&granted)));
        path
    }

    fn spawn(&self, n: usize) -> Driver {
        let log = self.dir.join(format!("{}-{n}.log", self.client.config()));
        Driver::spawn(&self.program, &self.sockets[n % 2], &self.lease, None, log)
    }

    /// One release handover, ms: the next waiter started on the other agent and queued,
    /// then from the holder's `release` line to the waiter's `granted` line.
    pub async fn handover(&mut self) -> f64 {
        self.round += 1;
        let (mut holder, token) = self.holder.take().unwrap();
        let mut waiter = self.spawn(self.round);
        queued_behind(&self.leases, &self.lease.name, token).await;
        tokio::time::sleep(SETTLE).await;
        let let_go = holder.release().await;
        let (at, granted) = waiter.said("granted").await;
        let took = (at - let_go).as_secs_f64() * 1e3;
        let next = Driver::token(&granted);
        assert!(next > token, "token {next} after {token}");
        holder.released().await;
        self.holder = Some((waiter, next));
        took
    }

    /// Releases the last holder.
    pub async fn finish(mut self) {
        let (mut holder, _) = self.holder.take().unwrap();
        holder.release().await;
        holder.released().await;
    }
}

/// Waits until the Lease shows the grant of `token` with one claim waiting: the
/// waiter's (an older status, from before that grant, cannot match).
async fn queued_behind(leases: &LeaseClient, lease: &str, token: i64) {
    let mut stream = watcher::watch_object(leases.leases().clone(), lease).boxed();
    let seen = tokio::time::timeout(SAY_LIMIT, async {
        while let Some(Ok(Some(l))) = stream.next().await {
            let status = l.status.unwrap_or_default();
            if status.fencing_token == Some(token) && status.waiting_count == Some(1) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        seen == Ok(true),
        "{lease}: no waiter queued behind token {token} within {SAY_LIMIT:?}"
    );
}

/// One client's warm release handover path: two long-lived drivers, one on each agent,
/// handing one Lease back and forth; each acquires again after its release, in the same
/// process and session. A round goes from the holder's `release` line to the other's
/// `granted` line, the waiter queued and settled before it, as on [`DriverPath`].
pub struct WarmPath {
    drivers: [Driver; 2],
    leases: LeaseClient,
    lease: String,
    /// The holding driver's index and its token.
    holder: (usize, i64),
}

impl WarmPath {
    /// The path, after its [`WARM_UP`] handovers: its drivers make up to `rounds` more.
    pub async fn start(
        client: Client,
        program: PathBuf,
        sockets: [PathBuf; 2],
        leases: LeaseClient,
        (ns, duration_secs): (&str, i64),
        dir: &Path,
        rounds: usize,
    ) -> WarmPath {
        let lease = LeaseSpec {
            name: format!("{}-warm-release", client.config()),
            ns: ns.to_string(),
            duration_secs,
        };
        // Enough grants for every round falling to either driver.
        let grants = Some(WARM_UP + rounds + 1);
        let spawn = |n: usize| {
            let log = dir.join(format!("{}-warm-{n}.log", client.config()));
            Driver::spawn(&program, &sockets[n], &lease, grants, log)
        };
        let mut first = spawn(0);
        let (_, granted) = first.said("granted").await;
        let mut path = WarmPath {
            drivers: [first, spawn(1)],
            leases,
            lease: lease.name,
            holder: (0, Driver::token(&granted)),
        };
        for _ in 0..WARM_UP {
            path.handover().await;
        }
        path
    }

    /// One release handover, ms: the other driver's claim queued (its next acquire),
    /// then from the holder's `release` line to the other's `granted` line.
    pub async fn handover(&mut self) -> f64 {
        let (holder, token) = self.holder;
        let waiter = 1 - holder;
        queued_behind(&self.leases, &self.lease, token).await;
        tokio::time::sleep(SETTLE).await;
        let let_go = self.drivers[holder].release().await;
        let (at, granted) = self.drivers[waiter].said("granted").await;
        let took = (at - let_go).as_secs_f64() * 1e3;
        let next = Driver::token(&granted);
        assert!(next > token, "token {next} after {token}");
        // Released, it acquires again: the next round's waiter.
        self.drivers[holder].said("released").await;
        self.holder = (waiter, next);
        took
    }

    /// Ends both drivers: the waiter gives up its wait, the holder releases.
    pub async fn finish(self) {
        let [a, b] = self.drivers;
        let (holder, waiter) = if self.holder.0 == 0 { (a, b) } else { (b, a) };
        waiter.hang_up().await;
        holder.hang_up().await;
    }
}
