//! One size.

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
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await
        .context("creating the namespace")?;
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

    // 1. Setup, with no controller running.
    let t = Instant::now();
    let c0 = procs.snap();
    create_all(&leases, n, args.inflight, |i| {
        json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
               "metadata": {"name": lease_name(i)},
               "spec": {"leaseDurationSeconds": args.lease_duration}})
    })
    .await
    .context("creating Leases")?;
    let holders = create_all(&claims, n, args.inflight, |i| claim_json("h", i))
        .await
        .context("creating holder claims")?;
    let waiters = create_all(&claims, n, args.inflight, |i| claim_json("w", i))
        .await
        .context("creating waiter claims")?;
    let setup = t.elapsed().as_secs_f64();
    let setup_cpu = procs.snap().since(&c0);
    let api_capacity = (3 * n) as f64 / setup;
    let pairs: Arc<Vec<Pair>> = Arc::new(
        holders
            .into_iter()
            .zip(waiters)
            .map(|(h, w)| Pair {
                holder: name_uid(&h),
                waiter: name_uid(&w),
            })
            .collect(),
    );
    report.fig(
        n,
        "setup_creates_per_s",
        api_capacity,
        "objects/s",
        format!(
            "API server write throughput with no controller: {n} Leases + {} claims created in {setup:.1} s, {} in flight. {}",
            2 * n,
            args.inflight,
            setup_cpu.split(cores)
        ),
    );

    // 2. Initial grant: the controller starts with N Leases and 2N claims.
    let log = args.out.join(format!("scale-controller-{n}.log"));
    let _ = std::fs::remove_file(&log);
    let t_spawn = Instant::now();
    let mut ctrl = Controller::spawn(root, ns, &log)?;
    procs.controller = ctrl.pid;
    let c0 = procs.snap();
    let renewer = Renewer::start(claims.clone(), pairs.clone(), renew_rate);
    let ready = ctrl.wait_ready(deadline).await?;
    let mut timeline = Vec::new();
    let granted = ctrl
        .wait_grants(&|| n as f64, t_spawn, deadline, &mut timeline)
        .await?;
    let c1 = procs.snap();
    let renewals_1 = renewer.ok();
    let (events_at, events_n, events_lost) = ctrl.wait_events(&events, n, deadline).await?;
    let renewals_2 = renewer.ok();
    let idle = quiesce(&mut ctrl, &renewer, deadline).await?;
    let c2 = procs.snap();
    let first = c2.since(&c0);
    let wrong = wrong_holders(&leases, &pairs, |_, p| &p.holder.0).await?;
    if wrong > 0 {
        bail!("after the initial grant, {wrong} Leases are not held by their h- claim");
    }

    // 3. Renewals alone, at the nominal rate.
    let steady = args.steady.unwrap_or(if n >= 1000 {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(3)
    });
    let lease_rvs = resource_versions(&leases).await?;
    let claim_rvs = resource_versions(&claims).await?;
    let before = procs.snap();
    let renewed_before = renewer.ok();
    let grants_before = ctrl.metric("palisade_grants_total").await?;
    sleep_within(steady, deadline).await?;
    let w = procs.snap().since(&before);
    let renewed = renewer.ok() - renewed_before;
    let grants_during = ctrl.metric("palisade_grants_total").await? - grants_before;
    renewer.pause(deadline).await?;
    ctrl.settle(deadline).await?;
    let lease_writes = changed(&lease_rvs, &resource_versions(&leases).await?, |_| true);
    let waiter_writes = changed(&claim_rvs, &resource_versions(&claims).await?, |name| {
        name.starts_with("w-")
    });
    renewer.resume();
    let per_renewal = w.controller / renewed.max(1) as f64;
    let renewal_figure = (
        w.pct(w.controller),
        format!(
            "{renewed} renewals in {:.0} s ({:.1}/s: {n} holders of {} s leases, each renewing every third of it): {:.0} µs controller CPU per renewal; controller writes meanwhile: {lease_writes} Leases, {waiter_writes} waiter claims, {grants_during} grants (a renewal should cost none). {}",
            w.secs,
            renewed as f64 / w.secs,
            args.lease_duration,
            per_renewal * 1e6,
            w.split(cores)
        ),
    );

    // The initial grant's figures, now that the renewals' share is known.
    let grant_s = (granted - ready).as_secs_f64();
    report.fig(
        n,
        "initial_grant",
        (granted - t_spawn).as_secs_f64(),
        "s",
        format!(
            "controller start to {n} grants: ready (3 lists, index) after {:.2} s, then {grant_s:.1} s of grants ({:.0}/s; each 1 Lease + 2 claim writes + 1 Event), {renewals_1} renewals meanwhile; {}",
            (ready - t_spawn).as_secs_f64(),
            n as f64 / grant_s.max(1e-3),
            {
                let w = c1.since(&c0);
                w.verdict(
                    cores,
                    ((4 * n) as f64 + renewals_1 as f64) / w.secs,
                    api_capacity,
                )
            }
        ),
    );
    let net = first.controller - renewals_2 as f64 * per_renewal;
    report.fig(
        n,
        "initial_grant_controller_cpu_s_per_1000_grants",
        net / n as f64 * 1000.0,
        "s",
        format!(
            "controller CPU from start (list of {} objects, index) until idle again, per 1,000 grants, less its {renewals_2} renewals at the measured {:.0} µs each ({:.3} s per 1,000 with them); its Events were all published or dropped {:.1} s after the last grant ({events_n} published, {events_lost} dropped by its bounded queue or failed), idle {:.1} s after it",
            3 * n,
            per_renewal * 1e6,
            first.controller / n as f64 * 1000.0,
            (events_at.max(granted) - granted).as_secs_f64(),
            (idle.max(granted) - granted).as_secs_f64(),
        ),
    );
    report.fig(
        n,
        "renewals_controller_cpu",
        renewal_figure.0,
        "% of a core",
        renewal_figure.1,
    );

    // 4. Resync after a restart with N Leases held.
    renewer.pause(deadline).await?;
    ctrl.settle(deadline).await?;
    let lease_rvs = resource_versions(&leases).await?;
    let claim_rvs = resource_versions(&claims).await?;
    let first_hwm = status_kib(ctrl.pid, "VmHWM").unwrap_or(0.0);
    ctrl.kill().await;
    let t_spawn = Instant::now();
    let mut ctrl = Controller::spawn(root, ns, &log)?;
    procs.controller = ctrl.pid;
    let c0 = procs.snap();
    let ready = ctrl.wait_ready(deadline).await?;
    let resync = (ready - t_spawn).as_secs_f64();
    let idle = ctrl.settle(deadline).await?;
    let resync_cpu = procs.snap().since(&c0);
    let lease_writes = changed(&lease_rvs, &resource_versions(&leases).await?, |_| true);
    let claim_writes = changed(&claim_rvs, &resource_versions(&claims).await?, |_| true);
    let resync_grants = ctrl.metric("palisade_grants_total").await?;
    renewer.resume();
    report.fig(
        n,
        "resync_after_restart",
        resync,
        "s",
        format!(
            "SIGKILL with {n} Leases held and {n} claims waiting, new process to /readyz (lists of {} objects, index); idle again (every Lease re-decided) {:.2} s after the start; controller CPU {:.2} s",
            3 * n,
            (idle.max(ready) - t_spawn).as_secs_f64(),
            resync_cpu.controller
        ),
    );
    report.fig(
        n,
        "resync_writes",
        (lease_writes + claim_writes) as f64,
        "writes",
        format!(
            "Leases and claims whose resourceVersion changed across the restart (renewals paused): {lease_writes} Leases, {claim_writes} claims; {resync_grants} grants"
        ),
    );

    // 5. Handover: delete holder claims (for at most --handover seconds); each waiter is granted.
    let base = ctrl.metric("palisade_grants_total").await?;
    let events_before = count_objects(&events).await?;
    let renewed_before = renewer.ok();
    let skipped_before = renewer.stats.skipped.load(Ordering::Relaxed);
    let c0 = procs.snap();
    let t0 = Instant::now();
    let progress = Arc::new(DeleteProgress::default());
    let deleter = tokio::spawn(delete_holders(
        claims.clone(),
        pairs.clone(),
        renewer.released.clone(),
        args.inflight,
        t0 + args.handover,
        progress.clone(),
    ));
    let target = || {
        base + if progress.done.load(Ordering::Relaxed) {
            progress.deleted.load(Ordering::Relaxed) as f64
        } else {
            n as f64
        }
    };
    let mut timeline = Vec::new();
    let granted = ctrl
        .wait_grants(&target, t0, deadline, &mut timeline)
        .await?;
    let c1 = procs.snap();
    let deleted_at = deleter.await??;
    let k = progress.deleted.load(Ordering::Relaxed);
    let renewals_1 = renewer.ok() - renewed_before;
    let skipped = renewer.stats.skipped.load(Ordering::Relaxed) - skipped_before;
    // The first controller's Events are in the namespace; this one adds two per handover.
    let (events_at, events_n, events_lost) = ctrl
        .wait_events(&events, events_before + 2 * k, deadline)
        .await?;
    let renewals_2 = renewer.ok() - renewed_before;
    let idle = quiesce(&mut ctrl, &renewer, deadline).await?;
    let c2 = procs.snap();
    let expirations = ctrl.metric("palisade_expirations_total").await?;
    let window = c1.since(&c0);
    let total_s = (granted - t0).as_secs_f64();
    let (rate, how) = match (
        crossing(&timeline, base + 0.1 * k as f64),
        crossing(&timeline, base + 0.9 * k as f64),
    ) {
        (Some(a), Some(b)) if b - a >= 0.5 => {
            (0.8 * k as f64 / (b - a), "between 10% and 90% of them")
        }
        _ => (k as f64 / total_s.max(1e-3), "over the whole phase"),
    };
    // API writes in the window: the bench's deletes and renewals, the controller's
    // Lease write, claim write and two Events per grant.
    let writes = k as f64 + renewals_1 as f64 + 4.0 * k as f64;
    report.fig(
        n,
        "sustained_grants_per_s",
        rate,
        "grants/s",
        format!(
            "{} Handover of {k} of {n} Leases: the bench deleted holder claims for at most {} s ({} in flight; done after {:.1} s), so their waiters were granted, all {k} after {total_s:.1} s; grants/s {how}; per grant 1 delete + 1 Lease + 1 claim write + 2 Events; {renewals_1} renewals meanwhile ({:.0}/s of the nominal {renew_rate:.0}/s; {skipped} not sent: 32 in flight){}",
            window.verdict(cores, writes / window.secs, api_capacity),
            args.handover.as_secs(),
            args.inflight,
            (deleted_at - t0).as_secs_f64(),
            renewals_1 as f64 / window.secs,
            if expirations > 0.0 {
                format!("; {expirations} grants EXPIRED (renewals fell behind)")
            } else {
                String::new()
            }
        ),
    );
    let cpu = c2.since(&c0).controller;
    let net = cpu - renewals_2 as f64 * per_renewal;
    let initial = report
        .value(n, "initial_grant_controller_cpu_s_per_1000_grants")
        .unwrap_or(f64::NAN);
    report.fig(
        n,
        "controller_cpu_s_per_1000_grants",
        net / k.max(1) as f64 * 1000.0,
        "s",
        format!(
            "handovers: controller CPU from the first delete until idle again, per 1,000 grants, less its {renewals_2} renewals at {:.0} µs each ({:.3} s per 1,000 with them); its Events (the namespace holds {events_n}; {events_lost} dropped by its bounded queue or failed) were all published or dropped {:.1} s after the last grant, idle {:.1} s after it; initial grants: {initial:.3} s per 1,000",
            per_renewal * 1e6,
            cpu / k.max(1) as f64 * 1000.0,
            (events_at.max(granted) - granted).as_secs_f64(),
            (idle.max(granted) - granted).as_secs_f64(),
        ),
    );
    let wrong = wrong_holders(&leases, &pairs, |i, p| {
        if i < k { &p.waiter.0 } else { &p.holder.0 }
    })
    .await?;
    let second_hwm = status_kib(ctrl.pid, "VmHWM").unwrap_or(0.0);
    let rss_now = status_kib(ctrl.pid, "VmRSS").unwrap_or(0.0);
    report.fig(
        n,
        "peak_rss",
        first_hwm.max(second_hwm) / 1024.0,
        "MiB",
        format!(
            "VmHWM of the controller: {:.1} MiB through the initial grant and renewals, {:.1} MiB through resync and handover (RSS at the end {:.1} MiB)",
            first_hwm / 1024.0,
            second_hwm / 1024.0,
            rss_now / 1024.0
        ),
    );
    drop(renewer);
    ctrl.kill().await;
    if wrong > 0 {
        bail!("after the handover, {wrong} Leases are not held by the expected claim");
    }
    Ok(())
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
    json!({"apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
           "metadata": {"name": format!("{prefix}-{i:05}")},
           "spec": {"leaseName": lease_name(i), "holderIdentity": format!("{prefix}-{i:05}")}})
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
/// instead) until all are gone or `stop_at`; returns when the last delete was answered.
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
                released[i].store(true, Ordering::Relaxed);
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
