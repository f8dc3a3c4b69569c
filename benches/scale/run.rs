//! One size: its phases are in `setup`, `initial_grant` (with `renewals`),
//! `resync` and `handover`; the helpers they share are here.

use super::*;

pub(crate) fn lease_name(i: usize) -> String {
    format!("l-{i:05}")
}

/// A holder claim and its waiter, by name and UID.
pub(crate) struct Pair {
    pub(crate) holder: (String, String),
    pub(crate) waiter: (String, String),
}

pub(crate) async fn run_size(
    client: &Client,
    root: &Path,
    args: &Args,
    n: usize,
    ns: &str,
    deadline: Instant,
    report: &mut Report,
) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    create_namespace(client, ns).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let claims: Api<LeaseClaim> = Api::namespaced(client.clone(), ns);
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let cluster = root.join("target/cluster");
    let mut procs = Procs {
        controller: 0,
        apiserver: read_pid(&cluster.join("kube-apiserver.pid")),
        etcd: read_pid(&cluster.join("etcd.pid")),
        kcm: read_pid(&cluster.join("kube-controller-manager.pid")),
    };
    let renew_rate = n as f64 / (args.lease_duration as f64 / 3.0);
    let size = Size {
        n,
        ns,
        root,
        args,
        deadline,
        cores,
        leases,
        claims,
        events,
        renew_rate,
    };
    let phase = |name: &str, t: Instant| {
        println!(
            "scale: {name} phase took {:.0} s",
            t.elapsed().as_secs_f64()
        );
    };
    let t = Instant::now();
    let (pairs, api_capacity) = setup(&size, &procs, report).await?;
    phase("setup", t);
    let t = Instant::now();
    let (ctrl, renewer, per_renewal) =
        initial_grant(&size, &mut procs, &pairs, api_capacity, report).await?;
    phase("initial grant and renewals", t);
    let t = Instant::now();
    let (ctrl, first_hwm) = resync(&size, &mut procs, ctrl, &renewer, report).await?;
    phase("resync", t);
    let ctrl = if n == args.failover_at {
        let t = Instant::now();
        let ctrl = failover(&size, &mut procs, ctrl, &renewer, &pairs, report).await?;
        println!(
            "scale: failover phase took {:.0} s",
            t.elapsed().as_secs_f64()
        );
        ctrl
    } else {
        ctrl
    };
    let t = Instant::now();
    handover(
        &size,
        &procs,
        ctrl,
        renewer,
        &pairs,
        (per_renewal, api_capacity, first_hwm),
        report,
    )
    .await?;
    println!(
        "scale: handover phase took {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    storm(&size, &mut procs, api_capacity, report).await?;
    phase("storm", t);
    if n <= args.storm_semaphore_max {
        let t = Instant::now();
        semaphore_storm(client, &size, &mut procs, api_capacity, report).await?;
        phase("semaphore storm", t);
    }
    Ok(())
}

pub(crate) async fn create_namespace(client: &Client, ns: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {ns}"))?;
    Ok(())
}

/// What the phases of one size share.
pub(crate) struct Size<'a> {
    pub(crate) n: usize,
    pub(crate) ns: &'a str,
    pub(crate) root: &'a Path,
    pub(crate) args: &'a Args,
    pub(crate) deadline: Instant,
    pub(crate) cores: f64,
    pub(crate) leases: Api<Lease>,
    pub(crate) claims: Api<LeaseClaim>,
    pub(crate) events: Api<CoreEvent>,
    /// Renewals per second, the client's schedule.
    pub(crate) renew_rate: f64,
}

/// Objects whose resourceVersion changed (or that are gone), among those `which` names.
pub(crate) fn changed(
    before: &HashMap<String, String>,
    after: &HashMap<String, String>,
    which: impl Fn(&str) -> bool,
) -> usize {
    before
        .iter()
        .filter(|(name, rv)| which(name) && after.get(*name) != Some(rv))
        .count()
}

/// Waits for the controller to go idle with the renewals paused (they cost it CPU of
/// their own), then resumes them. Returns when it went idle.
pub(crate) async fn quiesce(
    ctrl: &mut Controller,
    renewer: &Renewer,
    deadline: Instant,
) -> Result<Instant> {
    renewer.pause(deadline).await?;
    let idle = ctrl.settle(deadline).await;
    renewer.resume();
    idle
}

pub(crate) fn claim_json(prefix: &str, i: usize) -> Value {
    named_claim_json(&format!("{prefix}-{i:05}"), i)
}

/// A bare claim `name` (its holder identity too) on Lease `i`, for any slot.
pub(crate) fn named_claim_json(name: &str, i: usize) -> Value {
    json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
           "metadata": {"name": name},
           "spec": {"leaseName": lease_name(i), "holderIdentity": name}})
}

pub(crate) fn name_uid<K: Resource>(o: &K) -> (String, String) {
    (o.name_any(), o.meta().uid.clone().unwrap_or_default())
}

/// Creates objects 0..n with `inflight` requests in flight; returns them in index order.
pub(crate) async fn create_all<K>(
    api: &Api<K>,
    n: usize,
    inflight: usize,
    object: impl Fn(usize) -> Value,
) -> Result<Vec<K>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let obj = object(i);
            async move {
                let obj: K = serde_json::from_value(obj)?;
                let pp = PostParams::default();
                with_retry(|| api.create(&pp, &obj)).await
            }
        })
        .buffered(inflight)
        .try_collect()
        .await
}

#[derive(Default)]
pub(crate) struct DeleteProgress {
    pub(crate) deleted: AtomicUsize,
    pub(crate) done: AtomicBool,
}

/// Deletes holder claims in index order (after telling the renewer to renew the waiter
/// instead) until all are gone or `stop_at`, skipping those released already; returns
/// when the last delete was answered.
pub(crate) async fn delete_holders(
    claims: Api<LeaseClaim>,
    pairs: Arc<Vec<Pair>>,
    released: Arc<Vec<AtomicBool>>,
    inflight: usize,
    stop_at: Instant,
    progress: Arc<DeleteProgress>,
) -> Result<Instant> {
    let result = stream::iter(0..pairs.len())
        .take_while(|_| futures::future::ready(Instant::now() < stop_at))
        .map(|i| {
            let (claims, pairs, released) = (claims.clone(), pairs.clone(), released.clone());
            let progress = progress.clone();
            async move {
                // Released already (by the failover phase, whose grant it was): skipped.
                if released[i].swap(true, Ordering::Relaxed) {
                    return Ok(());
                }
                let (name, dp) = (&pairs[i].holder.0, DeleteParams::default());
                let r = match with_retry(|| claims.delete(name, &dp)).await {
                    Err(e) if is_status(&e, 404) => Ok(()),
                    r => r.map(|_| ()),
                };
                progress.deleted.fetch_add(1, Ordering::Relaxed);
                r
            }
        })
        .buffered(inflight)
        .try_collect::<Vec<()>>()
        .await;
    progress.done.store(true, Ordering::Relaxed);
    result?;
    Ok(Instant::now())
}

/// Leases not held by the claim `expected` names (one list, outside any measured window).
pub(crate) async fn wrong_holders(
    leases: &Api<Lease>,
    pairs: &[Pair],
    expected: impl Fn(usize, &Pair) -> &String,
) -> Result<usize> {
    let mut holders = HashMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = leases.list(&lp).await?;
        for l in page.items {
            let holder = l.status.and_then(|s| s.holder).map(|h| h.claim);
            holders.insert(l.metadata.name.unwrap_or_default(), holder);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(2000).continue_token(&c),
            None => break,
        }
    }
    Ok(pairs
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            holders.get(&lease_name(*i)).cloned().flatten().as_ref() != Some(expected(*i, p))
        })
        .count())
}

/// How many objects `api` lists (one list of one item: the rest is `remainingItemCount`).
pub(crate) async fn count_objects<K>(api: &Api<K>) -> Result<usize>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let page = api.list_metadata(&ListParams::default().limit(1)).await?;
    Ok(page.items.len() + page.metadata.remaining_item_count.unwrap_or(0).max(0) as usize)
}

/// name -> resourceVersion of every object (metadata-only lists).
pub(crate) async fn resource_versions<K>(api: &Api<K>) -> Result<HashMap<String, String>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = HashMap::new();
    let mut lp = ListParams::default().limit(5000);
    loop {
        let page = api.list_metadata(&lp).await?;
        for o in page.items {
            out.insert(
                o.metadata.name.unwrap_or_default(),
                o.metadata.resource_version.unwrap_or_default(),
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(5000).continue_token(&c),
            None => break,
        }
    }
    Ok(out)
}

/// Deletes the namespace's claims, Leases and Events (one request per object, 32 in
/// flight: a deletecollection deletes one object at a time), then the namespace, and
/// waits (at most 3 minutes in all) until none of those objects is left, so the API
/// server is not still busy deleting them when the next measurement starts. (The
/// namespace object itself goes a little later, when kube-controller-manager gets to
/// it.) Best effort: errors are printed.
pub(crate) async fn cleanup(client: &Client, ns: &str) -> Duration {
    let t = Instant::now();
    let until = t + Duration::from_secs(180);
    let claims: Api<LeaseClaim> = Api::namespaced(client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let deletes = async {
        tokio::join!(
            delete_each("claims", &claims),
            delete_each("Leases", &leases),
            delete_each("Events", &events),
        )
    };
    if tokio::time::timeout_at(until.into(), deletes)
        .await
        .is_err()
    {
        eprintln!("scale: cleanup: deleting the objects of {ns} took over 3 minutes");
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(ns, &DeleteParams::background()).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => eprintln!("scale: cleanup: deleting namespace {ns}: {e}"),
    }
    let mut left = 0;
    while Instant::now() < until {
        left = 0;
        for count in [
            count_objects(&claims).await,
            count_objects(&leases).await,
            count_objects(&events).await,
        ] {
            left += count.unwrap_or(1);
        }
        if left == 0 {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("scale: cleanup: {left} objects still in {ns} after 3 minutes (being deleted)");
    t.elapsed()
}

/// Deletes every object `api` lists, 32 requests in flight.
pub(crate) async fn delete_each<K>(what: &str, api: &Api<K>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let names = match resource_versions(api).await {
        Ok(names) => names.into_keys().collect::<Vec<_>>(),
        Err(e) => {
            eprintln!("scale: cleanup: listing {what}: {e:#}");
            return;
        }
    };
    let failed = stream::iter(names)
        .map(|name| async move {
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) | Err(kube::Error::Api(_)) => 0,
                Err(_) => 1,
            }
        })
        .buffer_unordered(32)
        .fold(0, |sum, f| async move { sum + f })
        .await;
    if failed > 0 {
        eprintln!(
            "scale: cleanup: {failed} {what} could not be deleted (the namespace's deletion will)"
        );
    }
}

pub(crate) fn is_status(e: &anyhow::Error, code: u16) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == code)
}

/// Retries what an overloaded API server may answer (429, 5xx, transport errors), 6 attempts.
pub(crate) async fn with_retry<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let transient = match &e {
                    kube::Error::Api(s) => s.code == 429 || s.code >= 500,
                    _ => true,
                };
                attempt += 1;
                if !transient || attempt >= 6 {
                    return Err(e.into());
                }
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
    }
}

pub(crate) async fn sleep_within(d: Duration, deadline: Instant) -> Result<()> {
    if Instant::now() + d > deadline {
        bail!("--timeout reached");
    }
    tokio::time::sleep(d).await;
    Ok(())
}

/// When the counter in `timeline` (seconds, value) first reached `level`, interpolated.
pub(crate) fn crossing(timeline: &[(f64, f64)], level: f64) -> Option<f64> {
    let i = timeline.iter().position(|(_, v)| *v >= level)?;
    if i == 0 {
        return Some(timeline[0].0);
    }
    let ((t0, v0), (t1, v1)) = (timeline[i - 1], timeline[i]);
    Some(t0 + (t1 - t0) * (level - v0) / (v1 - v0).max(1e-9))
}

/// The namespace's Leases as this bench's watch sees them ([`LeaseSeen`]). The
/// arrival time includes the watch's delay, which is part of every figure timed from
/// it.
pub(crate) struct LeaseWatch {
    pub(crate) rx: tokio::sync::mpsc::UnboundedReceiver<LeaseSeen>,
    task: tokio::task::JoinHandle<()>,
}

/// A Lease as the bench's watch saw it.
pub(crate) struct LeaseSeen {
    pub(crate) lease: String,
    /// Each held slot and its holder's claim, in slot order (a lock: slot 0 alone).
    pub(crate) holders: Vec<(i32, String)>,
    pub(crate) at: Instant,
}

impl LeaseSeen {
    /// Whether `claim` holds one of the Lease's slots.
    pub(crate) fn held_by(&self, claim: &str) -> bool {
        self.holders.iter().any(|(_, h)| h == claim)
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaseWatch {
    /// Starts the watch; returns once its initial list was delivered (at most 60 s).
    pub(crate) async fn start(leases: Api<Lease>) -> Result<Self> {
        use kube::runtime::{WatchStreamExt, watcher};
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (init_tx, init_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut init_tx = Some(init_tx);
            let stream = watcher(leases, watcher::Config::default()).default_backoff();
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let at = Instant::now();
                match ev {
                    Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                        let holders = l.status.map_or_else(Vec::new, |s| {
                            s.slot_rows()
                                .into_iter()
                                .filter_map(|row| Some((row.slot, row.holder?.claim)))
                                .collect()
                        });
                        let lease = l.metadata.name.unwrap_or_default();
                        if tx.send(LeaseSeen { lease, holders, at }).is_err() {
                            return;
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(t) = init_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("scale: Lease watch: {e} (retrying)"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), init_rx)
            .await
            .context("the Lease watch did not list in 60 s")?
            .context("the Lease watch ended")?;
        Ok(Self { rx, task })
    }

    /// Drops what arrived so far.
    pub(crate) fn drain(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }
}

/// The API server's `apiserver_request_total`, summed over the lines `keep` accepts.
pub(crate) async fn apiserver_requests(
    client: &Client,
    keep: impl Fn(&str) -> bool,
) -> Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("GET /metrics of the API server")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Requests to coordination.k8s.io Leases (the election's), all verbs.
pub(crate) fn is_election_request(line: &str) -> bool {
    line.contains(r#"group="coordination.k8s.io""#) && line.contains(r#"resource="leases""#)
}

/// Writes of any kind (create, update, patch, delete), every resource.
pub(crate) fn is_write_request(line: &str) -> bool {
    ["POST", "PUT", "PATCH", "DELETE", "APPLY"]
        .iter()
        .any(|v| line.contains(&format!(r#"verb="{v}""#)))
}
