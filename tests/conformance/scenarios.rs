//! The scenarios every client must pass. Each returns what it measured (a cell of
//! the README's table) or why it failed. The judge is the resource: a write the
//! fence admitted after a later grant's first write would be a violation, and each
//! scenario also checks what the holder itself was told.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use tokio::time::{Instant, sleep};

use crate::Suite;
use crate::holder::{Client, Grant, Holder, Resource, Said, Terms};
use crate::semaphore;
use crate::verdict::{self, LeaseTerms};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Exclusion,
    Kill,
    Freeze,
    AgentKill,
    AgentFreeze,
    Outage,
    Release,
    Semaphore,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::Exclusion,
        Scenario::Kill,
        Scenario::Freeze,
        Scenario::AgentKill,
        Scenario::AgentFreeze,
        Scenario::Outage,
        Scenario::Release,
        Scenario::Semaphore,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Exclusion => "exclusion",
            Scenario::Kill => "kill",
            Scenario::Freeze => "freeze",
            Scenario::AgentKill => "agent-kill",
            Scenario::AgentFreeze => "agent-freeze",
            Scenario::Outage => "api-outage",
            Scenario::Release => "release",
            Scenario::Semaphore => "semaphore",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Scenario::Exclusion => "mutual exclusion, tokens increase",
            Scenario::Kill => "holder SIGKILLed",
            Scenario::Freeze => "holder frozen past its lease",
            Scenario::AgentKill => "agent SIGKILLed",
            Scenario::AgentFreeze => "agent frozen, keepalive 10 s",
            Scenario::Outage => "API server unreachable 3 s",
            Scenario::Release => "clean exit releases",
            Scenario::Semaphore => "semaphore of 3, 6 contenders",
        }
    }

    pub async fn run(self, suite: &Suite, client: Client) -> Result<String, String> {
        let lease = format!("{}-{}", client.name(), self.name());
        let mut run = Run {
            suite,
            client,
            resource: Resource::new(&suite.setup.namespace, &lease),
            lease,
            holders: Vec::new(),
            terms: Terms {
                keepalive_ms: suite.setup.keepalive_ms,
                permits: 1,
            },
        };
        match self {
            Scenario::AgentFreeze => run.terms.keepalive_ms = FROZEN_AGENT_KEEPALIVE_MS,
            Scenario::Semaphore => run.terms.permits = semaphore::PERMITS,
            _ => {}
        }
        let result = match self {
            Scenario::Exclusion => exclusion(&mut run).await,
            Scenario::Kill => kill(&mut run).await,
            Scenario::Freeze => freeze(&mut run).await,
            Scenario::AgentKill => agent_kill(&mut run).await,
            Scenario::AgentFreeze => agent_freeze(&mut run).await,
            Scenario::Outage => outage(&mut run).await,
            Scenario::Release => release(&mut run).await,
            Scenario::Semaphore => semaphore::three_permits_six_contenders(&mut run).await,
        };
        // Whatever else a scenario checked: no stale write admitted, every grant in a
        // slot of its own with increasing tokens, never more believers than permits.
        let lease = LeaseTerms {
            namespace: &suite.setup.namespace,
            name: &run.lease,
            permits: run.terms.permits,
        };
        verdict::check(&run.resource.entries(), &lease).and(result)
    }
}

pub struct Run<'a> {
    pub suite: &'a Suite,
    pub client: Client,
    pub lease: String,
    pub resource: Resource,
    pub holders: Vec<Holder>,
    pub terms: Terms,
}

impl Run<'_> {
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.suite.setup.duration_secs as u64)
    }

    /// A new holder, and the instant before it started: any grant of it comes later.
    async fn spawn_timed(&mut self) -> (usize, Instant) {
        let before = Instant::now();
        (self.spawn().await, before)
    }

    /// A new holder (index into `holders`), bound to a Pod object of its own.
    pub async fn spawn(&mut self) -> usize {
        let id = format!("{}-{}", self.lease, self.holders.len());
        let pod = self.suite.pod(&id).await;
        let holder = Holder::spawn(
            &self.suite.setup,
            self.client,
            &self.lease,
            &id,
            Some(pod),
            &self.resource,
            self.terms,
        )
        .await;
        self.holders.push(holder);
        self.holders.len() - 1
    }

    /// A holder `a`, granted and writing, and a waiter `b` whose claim is queued
    /// behind it: where every fault scenario starts. Returns them and a's token.
    async fn holder_and_waiter(&mut self) -> Result<(usize, u64, usize), String> {
        let (a, spawned) = self.spawn_timed().await;
        let (at, token_a) = self.granted(a, spawned, self.duration() * 2).await?;
        let b = self.spawn().await;
        self.admitted_writes(a, 2, at).await?;
        sleep(Duration::from_secs(1)).await; // b's claim is queued
        Ok((a, token_a, b))
    }

    pub fn id(&self, h: usize) -> String {
        self.holders[h].id.clone()
    }

    async fn granted(
        &self,
        h: usize,
        since: Instant,
        limit: Duration,
    ) -> Result<(Instant, u64), String> {
        let (at, grant) = self.granted_slot(h, since, limit).await?;
        Ok((at, grant.token))
    }

    /// `h`'s grant: its token, slot and fence key.
    pub async fn granted_slot(
        &self,
        h: usize,
        since: Instant,
        limit: Duration,
    ) -> Result<(Instant, Grant), String> {
        self.resource.granted(&self.id(h), since, limit).await
    }

    /// Waits until `h` has made `n` admitted writes since `since`.
    pub async fn admitted_writes(&self, h: usize, n: usize, since: Instant) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.resource.writes(&self.id(h), since).0 < n {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} made fewer than {n} admitted writes in 5 s",
                    self.id(h)
                ));
            }
            sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// The holder was told it lost the grant: a `lost` line, or `palisade lock`'s exit 75.
    pub async fn told_lost(
        &self,
        h: usize,
        since: Instant,
        limit: Duration,
    ) -> Result<(Instant, String), String> {
        let id = self.id(h);
        let e = self
            .resource
            .wait_for(&format!("loss reported by {id}"), since, limit, |e| {
                e.holder == id && matches!(e.said, Said::Lost(_) | Said::Exited(Some(75)))
            })
            .await?;
        Ok(match e.said {
            Said::Lost(reason) => (e.at, reason),
            _ => (e.at, "exit 75".to_string()),
        })
    }

    /// Deletes the holder's Pod at once, as the kubelet reports a pod that died.
    pub async fn delete_pod(&self, h: usize) {
        let name = self.holders[h].pod.clone().expect("a pod");
        let pods: Api<Pod> = Api::namespaced(self.suite.kube.clone(), &self.suite.setup.namespace);
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap_or_else(|e| panic!("deleting pod {name}: {e}"));
    }
}

pub fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Three holders contend; each in turn writes, then exits cleanly. Four grants.
async fn exclusion(run: &mut Run<'_>) -> Result<String, String> {
    let limit = run.duration() * 2;
    // Before the spawns: the first holder may be granted while the others start.
    let start = Instant::now();
    for _ in 0..3 {
        run.spawn().await;
    }
    let mut tokens = Vec::new();
    let mut since = start;
    for _ in 0..4 {
        let live: Vec<String> = (0..run.holders.len())
            .filter(|h| !run.holders[*h].done)
            .map(|h| run.id(h))
            .collect();
        let e = run
            .resource
            .wait_for("the next grant", since, limit, |e| {
                live.contains(&e.holder) && matches!(e.said, Said::Granted(_))
            })
            .await?;
        let Said::Granted(Grant { token, .. }) = e.said else {
            unreachable!()
        };
        let h = (0..run.holders.len())
            .find(|h| run.id(*h) == e.holder)
            .unwrap();
        tokens.push(token);
        run.admitted_writes(h, 3, e.at).await?;
        since = Instant::now();
        run.holders[h].signal(libc::SIGTERM);
        let code = run.holders[h].exited(Duration::from_secs(12)).await?;
        if code != Some(0) {
            return Err(format!("{} exited {code:?} on SIGTERM, not 0", e.holder));
        }
        run.holders[h].done = true;
        run.spawn().await;
    }
    if !tokens.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!("tokens not strictly increasing: {tokens:?}"));
    }
    let refused: usize = (0..run.holders.len())
        .map(|h| run.resource.writes(&run.id(h), start).1)
        .sum();
    let admitted: usize = (0..run.holders.len())
        .map(|h| run.resource.writes(&run.id(h), start).0)
        .sum();
    if refused > 0 {
        return Err(format!("{refused} writes refused: two holders overlapped"));
    }
    Ok(format!(
        "4 grants, tokens increasing, {admitted} writes, 0 refused"
    ))
}

/// The holder is SIGKILLed; the next holder must not wait for the lease to expire.
async fn kill(run: &mut Run<'_>) -> Result<String, String> {
    let (a, token_a, b) = run.holder_and_waiter().await?;
    let killed = Instant::now();
    run.holders[a].signal(libc::SIGKILL);
    let how = if run.client.through_agent() {
        "socket closed"
    } else {
        // A killed process cannot release: the pod's end (reported by the kubelet) revokes.
        run.delete_pod(a).await;
        "pod deleted"
    };
    let (at_b, token_b) = run.granted(b, killed, run.duration() * 2).await?;
    if token_b <= token_a {
        return Err(format!("token {token_b} after {token_a}"));
    }
    let handover = at_b - killed;
    if handover > run.duration() / 2 {
        return Err(format!(
            "next grant {} after SIGKILL: not well before the lease ({:?}) would expire",
            ms(handover),
            run.duration()
        ));
    }
    Ok(format!("next grant {} after SIGKILL ({how})", ms(handover)))
}

/// The holder is SIGSTOPped past its lease: another is granted; once continued, the
/// holder is told it lost the grant, and the fence refuses its stale write.
async fn freeze(run: &mut Run<'_>) -> Result<String, String> {
    let (a, token_a, b) = run.holder_and_waiter().await?;
    let stopped = Instant::now();
    run.holders[a].signal(libc::SIGSTOP);
    let (at_b, token_b) = run.granted(b, stopped, run.duration() * 3).await?;
    run.admitted_writes(b, 2, at_b).await?;
    let continued = Instant::now();
    run.holders[a].signal(libc::SIGCONT);
    let (at_lost, reason) = run
        .told_lost(a, continued, run.duration() + Duration::from_secs(5))
        .await?;
    sleep(Duration::from_millis(300)).await; // its last (stale) write
    let (admitted, refused) = run.resource.writes(&run.id(a), at_b);
    if token_b <= token_a || admitted > 0 {
        return Err(format!(
            "token {token_b} after {token_a}; {admitted} stale writes admitted"
        ));
    }
    let stale = if run.client == Client::Lock {
        // The watchdog SIGKILLed the command at the local deadline: it never wrote stale.
        format!("{refused} stale writes (command killed by the watchdog)")
    } else if refused == 0 {
        return Err("the frozen holder's stale write never reached the fence".into());
    } else {
        format!("{refused} stale writes refused")
    };
    Ok(format!(
        "next grant {} after SIGSTOP; {stale}; told lost ({reason}) {} after SIGCONT",
        ms(at_b - stopped),
        ms(at_lost - continued)
    ))
}

/// The agent dies: the application must learn of the loss before anyone else can be granted.
async fn agent_kill(run: &mut Run<'_>) -> Result<String, String> {
    if !run.client.through_agent() {
        return Ok("n/a (no agent)".into());
    }
    let (a, token_a, b) = run.holder_and_waiter().await?;
    let killed = Instant::now();
    run.holders[a].kill_agent();
    let (at_lost, reason) = run.told_lost(a, killed, Duration::from_secs(5)).await?;
    let (at_b, token_b) = run.granted(b, killed, run.duration() * 3).await?;
    if at_lost >= at_b || token_b <= token_a {
        return Err(format!(
            "told lost {} after the kill, but the next grant came {} after it",
            ms(at_lost - killed),
            ms(at_b - killed)
        ));
    }
    Ok(format!(
        "told lost ({reason}) {} after SIGKILL; next grant {} after it (expiry)",
        ms(at_lost - killed),
        ms(at_b - killed)
    ))
}

/// A session keepalive longer than two thirds of the lease (allowed: up to 60 s), so
/// a client that believed its grant until a keepalive failed would believe it past
/// the next grant.
const FROZEN_AGENT_KEEPALIVE_MS: u64 = 10_000;

/// The agent stops (SIGSTOP: as under CPU starvation) while its application holds a
/// grant: the application must stop believing by its own clock, before the next
/// holder can be granted, however long its session keepalive.
async fn agent_freeze(run: &mut Run<'_>) -> Result<String, String> {
    if !run.client.through_agent() {
        return Ok("n/a (no agent)".into());
    }
    let (a, token_a, b) = run.holder_and_waiter().await?;
    let frozen = Instant::now();
    run.holders[a].signal_agent(libc::SIGSTOP);
    let granted_b = run.granted(b, frozen, run.duration() * 3).await;
    let lost = run.told_lost(a, frozen, Duration::ZERO).await;
    run.holders[a].signal_agent(libc::SIGCONT);
    let (at_b, token_b) = granted_b?;
    let Ok((at_lost, reason)) = lost else {
        return Err(format!(
            "the next holder was granted {} after the agent froze, and the application still believed its grant",
            ms(at_b - frozen)
        ));
    };
    if at_lost >= at_b || token_b <= token_a {
        return Err(format!(
            "told lost {} after the agent froze, but the next grant came {} after it",
            ms(at_lost - frozen),
            ms(at_b - frozen)
        ));
    }
    Ok(format!(
        "told lost ({reason}) {} after SIGSTOP of the agent; next grant {} after it",
        ms(at_lost - frozen),
        ms(at_b - frozen)
    ))
}

/// Every holder's link to the API server is cut for 3 s, then healed.
async fn outage(run: &mut Run<'_>) -> Result<String, String> {
    let (a, _, b) = run.holder_and_waiter().await?;
    let cut = Instant::now();
    run.suite.cut_api(Duration::from_secs(3)).await;
    let healed = Instant::now();
    // Either a keeps its grant, or it is told it lost it before b is granted.
    sleep(run.duration() + Duration::from_secs(2)).await;
    let lost = run.told_lost(a, cut, Duration::ZERO).await.ok();
    // A holder that lost its grant leaves the Lease to b, which may still be catching
    // up on its own cut connections on a loaded machine: it gets two more durations.
    let more = if lost.is_some() {
        run.duration() * 2
    } else {
        Duration::ZERO
    };
    let granted_b = run.granted(b, cut, more).await.ok();
    match (lost, granted_b) {
        (None, None) => {
            run.admitted_writes(a, 5, healed).await?;
            Ok("kept the grant through the outage; writes resumed".into())
        }
        (Some((at_lost, reason)), Some((at_b, _))) if at_lost < at_b => {
            run.admitted_writes(b, 2, at_b).await?;
            Ok(format!(
                "told lost ({reason}) {} into the outage; next grant {} after healing",
                ms(at_lost - cut),
                ms(at_b.saturating_duration_since(healed))
            ))
        }
        (Some((at_lost, reason)), None) => Err(format!(
            "told lost ({reason}) {} into the outage, but no next grant",
            ms(at_lost - cut)
        )),
        (lost, Some((at_b, _))) => Err(format!(
            "the next holder was granted {} after the cut while the holder was told {lost:?}",
            ms(at_b - cut)
        )),
    }
}

/// A clean exit (SIGTERM) releases: the next holder is granted at once.
async fn release(run: &mut Run<'_>) -> Result<String, String> {
    let (a, token_a, b) = run.holder_and_waiter().await?;
    let asked = Instant::now();
    run.holders[a].signal(libc::SIGTERM);
    let (at_b, token_b) = run.granted(b, asked, run.duration()).await?;
    let code = run.holders[a].exited(Duration::from_secs(12)).await?;
    if code != Some(0) || token_b <= token_a {
        return Err(format!(
            "exit {code:?} on SIGTERM; token {token_b} after {token_a}"
        ));
    }
    if at_b - asked > run.duration() / 3 {
        return Err(format!(
            "next grant {} after SIGTERM: the release did not free the Lease",
            ms(at_b - asked)
        ));
    }
    Ok(format!(
        "exit 0; next grant {} after SIGTERM",
        ms(at_b - asked)
    ))
}
