//! The failover harness: operator processes on one Lease, the leader SIGKILLed, timed
//! to the new leader's first accepted write (module docs of main.rs, part 1).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher;
use palisade::client::LeaseClient;
use palisade::crd::{Lease, LeaseClaim};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use super::candidate::{self, LEADING, LOST, READY, TOKEN_ENV, WROTE};
use super::setup::{FAILOVER, FAILOVER_STATE, Setup};
use super::{cluster, ms, percentile};

/// The longest wait for any one step of a round.
const LIMIT: Duration = Duration::from_secs(30);

pub struct Run {
    /// Kill to the new leader's first accepted write, ms.
    pub to_write: Vec<f64>,
    /// Kill to the new leader's code starting, ms.
    pub to_leading: Vec<f64>,
    pub note: String,
}

/// A line an operator process wrote, or its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    Ready,
    Leading,
    /// The first accepted write, with the writes refused before it.
    Wrote(u64),
    Lost,
    Exited,
}

/// One operator process seen from the harness, with each line's arrival time.
struct Operator {
    id: String,
    child: Child,
    /// Held open: the process exits when it closes.
    _stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<(Line, Instant)>,
    seen: Vec<(Line, Instant)>,
}

impl Operator {
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// When it said something `is`, if it has by now.
    fn said(&mut self, is: impl Fn(Line) -> bool) -> Option<(Line, Instant)> {
        self.drain();
        self.seen.iter().copied().find(|(l, _)| is(*l))
    }

    /// Waits, at most [`LIMIT`], until it says something `is`.
    async fn wait(
        &mut self,
        what: &str,
        is: impl Fn(Line) -> bool,
    ) -> Result<(Line, Instant), String> {
        if let Some(found) = self.said(&is) {
            return Ok(found);
        }
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line);
                    if is(line.0) {
                        return Ok(line);
                    }
                    if line.0 == Line::Exited {
                        return Err(format!("{} exited before it {what}", self.id));
                    }
                }
                Ok(None) => return Err(format!("{} exited before it {what}", self.id)),
                Err(_) => return Err(format!("{} did not {what} within {LIMIT:?}", self.id)),
            }
        }
    }

    /// SIGKILL (if still running), and reaped.
    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("operator {} not reaped 10 s after SIGKILL", self.id);
        }
    }
}

struct Fleet<'a> {
    setup: &'a Setup,
    bin: PathBuf,
    token: String,
    started: usize,
}

impl Fleet<'_> {
    fn spawn(&mut self) -> Result<Operator, String> {
        let id = format!("op-{:03}", self.started);
        self.started += 1;
        let mut child = Command::new(&self.bin)
            .arg(candidate::MODE)
            .arg("--kubeconfig")
            .arg(&self.setup.kubeconfig)
            .args(["--namespace", &self.setup.ns, "--lease", FAILOVER])
            .args(["--id", &id, "--configmap", FAILOVER_STATE])
            .env(TOKEN_ENV, &self.token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take().expect("piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(text)) = reader.next_line().await {
                // Read first: the time is the harness's, when the line arrived.
                let at = Instant::now();
                let mut words = text.split_whitespace();
                let line = match words.next() {
                    Some(READY) => Line::Ready,
                    Some(LEADING) => Line::Leading,
                    Some(WROTE) => {
                        Line::Wrote(words.nth(1).and_then(|r| r.parse().ok()).unwrap_or(0))
                    }
                    Some(LOST) => Line::Lost,
                    _ => continue,
                };
                let _ = tx.send((line, at));
            }
            let _ = tx.send((Line::Exited, Instant::now()));
        });
        Ok(Operator {
            id,
            child,
            _stdin: stdin,
            lines,
            seen: Vec::new(),
        })
    }
}

fn wrote(line: Line) -> bool {
    matches!(line, Line::Wrote(_))
}

/// A pseudo-random phase in `0..max` (splitmix64): enough to decorrelate the kill
/// from the leader's renewals.
struct Phase(u64);

impl Phase {
    fn next(&mut self, max: Duration) -> Duration {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        max.mul_f64((z >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// The claims `id` left behind (a killed leader's, expired), so the Lease's queue stays
/// as small as at the first kill.
async fn remove_claims_of(claims: &Api<LeaseClaim>, id: &str) {
    let Ok(list) = claims.list(&ListParams::default()).await else {
        return;
    };
    for claim in list.items.iter().filter(|c| c.spec.holder_identity == id) {
        let _ = claims
            .delete(&claim.name_any(), &DeleteParams::default())
            .await;
    }
}

/// Each change of the Lease's holder as the harness's watch sees it: (identity, when),
/// so that a failover splits at the controller's grant.
struct Grants {
    seen: Arc<Mutex<Vec<(String, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Grants {
    fn watch(leases: Api<Lease>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher::watch_object(leases, FAILOVER).boxed();
            let mut last = None;
            while let Some(event) = stream.next().await {
                let Ok(lease) = event else { continue };
                let holder = lease.and_then(|l| Some(l.status?.holder?.identity));
                if holder != last {
                    if let Some(identity) = &holder {
                        record
                            .lock()
                            .unwrap()
                            .push((identity.clone(), Instant::now()));
                    }
                    last = holder;
                }
            }
        });
        Self { seen, task }
    }

    /// When `identity` was first seen holding after `since`.
    fn of(&self, identity: &str, since: Instant) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .find(|(id, at)| id == identity && *at >= since)
            .map(|(_, at)| *at)
    }
}

impl Drop for Grants {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn run(setup: &Setup, kills: usize, lease_secs: i64) -> Result<Run, String> {
    let leases = LeaseClient::from_config(setup.config.clone(), Some(&setup.ns))
        .map_err(|e| e.to_string())?;
    leases
        .ensure_lease(FAILOVER, lease_secs)
        .await
        .map_err(|e| e.to_string())?;
    let claims: Api<LeaseClaim> = Api::namespaced(setup.client.clone(), &setup.ns);
    let grants = Grants::watch(leases.leases().clone());
    let mut fleet = Fleet {
        setup,
        bin: std::env::current_exe().map_err(|e| e.to_string())?,
        token: setup.token(FAILOVER).await?,
        started: 0,
    };
    let duration = Duration::from_secs(lease_secs as u64);
    let mut phase = Phase(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()),
    );

    let mut leader = fleet.spawn()?;
    leader.wait("wrote as the first leader", wrote).await?;
    let mut standby = fleet.spawn()?;
    let (mut to_write, mut to_leading, mut to_grant) = (Vec::new(), Vec::new(), Vec::new());
    let (mut discarded, mut refused) = (0usize, 0u64);
    while to_write.len() < kills {
        if discarded > kills {
            return Err(format!(
                "{discarded} rounds in which the leader lost its grant before the kill"
            ));
        }
        cluster::wait_waiting(&leases, FAILOVER, 1).await;
        tokio::time::sleep(phase.next(duration)).await;
        if standby.said(|l| l == Line::Leading).is_some()
            || leader
                .said(|l| matches!(l, Line::Lost | Line::Exited))
                .is_some()
        {
            // The leader's grant ended by itself: not a failover after a kill.
            discarded += 1;
            standby
                .wait("wrote after the leader lost its grant", wrote)
                .await?;
            leader.kill().await;
            remove_claims_of(&claims, &leader.id).await;
            leader = std::mem::replace(&mut standby, fleet.spawn()?);
            continue;
        }
        let killed_at = Instant::now();
        let _ = leader.child.start_kill();
        let (_, leading_at) = standby.wait("led", |l| l == Line::Leading).await?;
        let (line, wrote_at) = standby.wait("wrote", wrote).await?;
        if leading_at < killed_at {
            discarded += 1;
        } else {
            to_leading.push(ms(leading_at - killed_at));
            to_write.push(ms(wrote_at - killed_at));
            if let Some(granted_at) = grants.of(&standby.id, killed_at) {
                to_grant.push(ms(granted_at - killed_at));
            }
            if let Line::Wrote(n) = line {
                refused += n;
            }
            eprintln!(
                "  [operator failover] kill {}/{kills}: {} -> {} wrote in {:.1} ms",
                to_write.len(),
                leader.id,
                standby.id,
                ms(wrote_at - killed_at)
            );
        }
        leader.kill().await;
        remove_claims_of(&claims, &leader.id).await;
        leader = std::mem::replace(&mut standby, fleet.spawn()?);
    }
    leader.kill().await;
    standby.kill().await;

    let mut note = format!(
        "SIGKILL of the leading operator process -> the new leader's first accepted write through \
         its fenced client (a merge patch of its ConfigMap, sent as soon as its code runs and every \
         {} ms after), on the harness's monotonic clock as it reads the new leader's stdout. Lease \
         of {lease_secs} s (client-go's tuned LeaseDuration); two operator processes \
         (palisade::operator::run_while_leading, a service-account token each) whose claims are \
         bound to no pod, so a killed leader's grant ends by expiry; one controller process, not \
         killed. After each kill a replacement starts and is queued before the next kill, at a \
         random phase (0..1 lease duration). To the grant, as the harness's watch of the Lease saw \
         the new holder ({} of {} kills): p50 {:.0} ms, p99 {:.0} ms; to leading (the grant \
         acquired, its first renewal answered, every API server confirmed to refuse the \
         predecessor's token): p50 {:.0} ms, p99 {:.0} ms; writes refused before the first \
         accepted one: {refused}",
        candidate::WRITE_EVERY.as_millis(),
        to_grant.len(),
        to_write.len(),
        percentile(&to_grant, 0.50),
        percentile(&to_grant, 0.99),
        percentile(&to_leading, 0.50),
        percentile(&to_leading, 0.99),
    );
    if discarded > 0 {
        note += &format!(
            "; {discarded} round(s) discarded: the leader lost its grant before the kill (its \
             renewals late on the loaded machine)"
        );
    }
    Ok(Run {
        to_write,
        to_leading,
        note,
    })
}
