//! Phase 7: the storm: every holder silent at once, each Lease with a waiter.

use super::*;

/// The storm's lease duration (seconds) at `n` Leases.
pub(crate) fn storm_duration(args: &Args, n: usize) -> i64 {
    args.storm_duration.unwrap_or(if n < 1000 {
        10
    } else {
        (6 * n as i64 / 1000).max(30)
    })
}

/// After the handover phase (controller stopped, renewals stopped for good).
pub(crate) async fn storm(
    s: &Size<'_>,
    procs: &mut Procs,
    api_capacity: f64,
    report: &mut Report,
) -> Result<()> {
    let n = s.n;
    let d = storm_duration(s.args, n);
    if d == s.args.lease_duration {
        bail!(
            "--storm-duration must differ from --lease-duration (its write must change the Lease)"
        );
    }
    let client = s.leases.clone().into_client();
    let leases = s.leases.clone();
    let claims = s.claims.clone();

    // 1. Who holds each Lease (claim, UID, token); a waiter for each: w-i where h-i
    // still holds, else a new s-i.
    type Held = Option<(String, String, i64)>;
    let mut holders: HashMap<String, (Held, String)> = HashMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = leases.list(&lp).await?;
        for l in page.items {
            let rv = l.metadata.resource_version.clone().unwrap_or_default();
            let held = l.status.and_then(|s| {
                let h = s.holder?;
                Some((h.claim, h.claim_uid, s.fencing_token?))
            });
            holders.insert(l.metadata.name.unwrap_or_default(), (held, rv));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(2000).continue_token(&c),
            None => break,
        }
    }
    let mut expected = HashMap::new();
    let mut missing = Vec::new();
    for i in 0..n {
        let name = lease_name(i);
        let holder = match holders.get(&name) {
            Some((Some((h, _, _)), _)) => h.clone(),
            _ => bail!("storm: {name} has no holder after the handover phase"),
        };
        let waiter = if holder == format!("h-{i:05}") {
            format!("w-{i:05}")
        } else {
            missing.push(i);
            format!("s-{i:05}")
        };
        expected.insert(name, waiter);
    }
    let t = Instant::now();
    stream::iter(missing.iter().copied())
        .map(|i| {
            let claims = claims.clone();
            async move {
                let obj: LeaseClaim = serde_json::from_value(claim_json("s", i))?;
                let pp = PostParams::default();
                with_retry(|| claims.create(&pp, &obj)).await
            }
        })
        .buffered(s.args.inflight)
        .try_collect::<Vec<_>>()
        .await
        .context("creating the storm's waiter claims")?;
    let created_s = t.elapsed().as_secs_f64();
    // Each holder's last renewal, as the client library sends every one: it names
    // the grant renewed ("Expiry is one write", src/controller/index/holder.rs).
    let held: Vec<(String, String, i64)> = holders.values().filter_map(|h| h.0.clone()).collect();
    stream::iter(held)
        .map(|(claim, uid, token)| {
            let claims = claims.clone();
            async move {
                with_retry(|| renew(claims.clone(), claim.clone(), uid.clone(), Some(token))).await
            }
        })
        .buffer_unordered(s.args.inflight)
        .try_collect::<Vec<_>>()
        .await
        .context("the holders' last renewals")?;

    // 2. The floor: the API server's own rate for one status write per Lease, no
    // controller running, 16 in flight (the controller's --concurrency), with the
    // bench's Lease watch open as it is in the storm. Three passes, two before the
    // storm and one after it; the floor is their median, since one pass of a
    // thousand writes is a second or two and its rate moves by half within an hour.
    // The second pass is what sets the grants' recorded duration
    // (status.holder.leaseDurationSeconds) to the storm's: a shorter spec alone
    // never cuts a grant short.
    let mut watch = LeaseWatch::start(leases.clone()).await?;
    let rvs: HashMap<String, String> = holders
        .iter()
        .map(|(l, h)| (l.clone(), h.1.clone()))
        .collect();
    let (first, rvs) = floor_pass(&leases, n, d + 1, rvs, procs).await?;
    let (second, _) = floor_pass(&leases, n, d, rvs, procs).await?;
    // ... and the spec, so that the re-grants' own duration is short too.
    let t = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let leases = leases.clone();
            async move {
                let patch = Patch::Merge(json!({"spec": {"leaseDurationSeconds": d}}));
                let (pp, name) = (PatchParams::default(), lease_name(i));
                with_retry(|| leases.patch(&name, &pp, &patch)).await
            }
        })
        .buffer_unordered(s.args.inflight)
        .try_collect::<Vec<_>>()
        .await
        .context("setting the storm's lease duration")?;
    let spec_s = t.elapsed().as_secs_f64();
    println!(
        "scale: storm at {n}: {} waiters created in {created_s:.1} s, floor passes {:.0} and {:.0} status writes/s, spec durations set in {spec_s:.1} s",
        missing.len(),
        first.rate,
        second.rate
    );

    // 3. A controller starts: on sync it takes every Lease over (DESIGN rule 4, a fresh
    // full duration for every held grant), so all n are due d seconds after its sync,
    // taken as /readyz turning true. No holder renews.
    let log = s.args.out.join(format!("scale-storm-{n}.log"));
    let _ = std::fs::remove_file(&log);
    let t_spawn = Instant::now();
    let mut ctrl = Controller::spawn(s.root, s.ns, &log)?;
    procs.controller = ctrl.pid;
    let ready = ctrl.wait_ready(s.deadline).await?;
    let due = ready + Duration::from_secs(d as u64);
    // Busy at the due instant (writing the new waiters' Pending status): the storm
    // would then overlap its sync's writes; said in the note.
    let idle_at = tokio::time::timeout_at(due.into(), ctrl.settle(s.deadline)).await;
    let busy_note = match idle_at {
        Ok(Ok(t)) => format!(
            "the controller was idle {:.1} s before the due instant",
            (due - t).as_secs_f64()
        ),
        Ok(Err(e)) => return Err(e),
        Err(_) => "CAUTION: the controller was still busy at the due instant (its sync's writes overlapped the storm: use a longer --storm-duration)".into(),
    };
    let early_grants = ctrl.metric("palisade_grants_total").await?;
    tokio::time::sleep_until(due.into()).await;
    let c0 = procs.snap();
    let writes_0 = apiserver_requests(&client, is_write_request).await?;

    // 4. Every re-grant as the watch sees it, until all n or the bound.
    let bound = due + Duration::from_secs(60) + Duration::from_millis(20 * n as u64);
    let bound = bound.min(s.deadline);
    let mut regrants: HashMap<String, Instant> = HashMap::new();
    while regrants.len() < n {
        match tokio::time::timeout_at(bound.into(), watch.rx.recv()).await {
            Ok(Some((l, h, at))) => {
                if h.is_some() && expected.get(&l) == h.as_ref() {
                    regrants.entry(l).or_insert(at);
                }
            }
            Ok(None) => bail!("the Lease watch ended"),
            Err(_) => break,
        }
    }
    let c1 = procs.snap();
    let writes_1 = apiserver_requests(&client, is_write_request).await?;
    ctrl.check_alive()?;
    let expirations = ctrl.metric("palisade_expirations_total").await?;
    ctrl.kill().await;
    if regrants.len() < n {
        bail!(
            "storm: {} of {n} Leases re-granted within {:.0} s of the due instant (log: {})",
            regrants.len(),
            (bound - due).as_secs_f64(),
            log.display()
        );
    }
    let rvs = resource_versions(&leases).await?;
    let (third, _) = floor_pass(&leases, n, d + 1, rvs, procs).await?;
    drop(watch);
    let mut passes = [&first, &second, &third];
    passes.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let floor = passes[1].rate;
    let samples: Vec<f64> = (0..n)
        .map(|i| {
            let at = regrants[&lease_name(i)];
            // Signed: a re-grant before the estimated due instant is negative.
            if at >= due {
                (at - due).as_secs_f64() * 1e3
            } else {
                -(due - at).as_secs_f64() * 1e3
            }
        })
        .collect();
    let last = regrants.values().max().copied().unwrap_or(due);
    let last_past = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max) / 1e3;
    let window = c1.since(&c0);
    let span = (last.max(due) - due).as_secs_f64().max(1e-3);
    let rate = n as f64 / span;
    let writes_per_s = (writes_1 - writes_0) / window.secs;
    let how = format!(
        "{n} holders silent at once (each had renewed its grant once, naming its token as the client library does, then none renews), each Lease with one waiter; lease duration {d} s; due {d} s after the controller's sync (a restarted controller gives every held grant a fresh full duration, DESIGN rule 4), the sync taken as /readyz turning true ({:.2} s after spawn; the true instant is a little earlier, so the delays are a little short); re-grant = the Lease naming the waiter, as the bench's Lease watch saw it (its delay included); one replica, leader election off (no flaps to count); {busy_note}; grants before the due instant: {early_grants}; expirations counted by the controller: {expirations}{}",
        (ready - t_spawn).as_secs_f64(),
        if expirations > n as f64 {
            " (more than N: a waiter granted early had its own grant expire before the last re-grant, nobody renewing it; those writes fell into the storm too)"
        } else {
            ""
        }
    );
    report.latency(schema::Latency::of(
        "palisade",
        &n.to_string(),
        "storm-past-duration",
        samples,
        &how,
    ));
    report.fig(
        n,
        "storm_last_regrant_past_duration",
        last_past,
        "s",
        format!("the last of the {n} re-grants, past its due instant (signed). {how}"),
    );
    report.fig(
        n,
        "storm_floor_status_writes_per_s",
        floor,
        "writes/s",
        format!(
            "the API server's own rate for one status write per Lease (a JSON merge patch of status.holder.leaseDurationSeconds, every resourceVersion changed), 16 in flight (the controller's --concurrency), no controller running, the bench's Lease watch open as in the storm: the median of three passes of {n} writes, two just before the storm and one just after it: {:.0}, {:.0} and {:.0} writes/s. The median pass's {}",
            first.rate,
            second.rate,
            third.rate,
            passes[1].cpu.split(s.cores)
        ),
    );
    report.fig(
        n,
        "storm_regrants_per_s",
        rate,
        "grants/s",
        format!(
            "{n} re-grants over {span:.2} s from the due instant to the last (per re-grant: 1 Lease write, claim writes, Events); {:.0} API writes/s in all. {}",
            writes_per_s,
            window.verdict(s.cores, writes_per_s, api_capacity)
        ),
    );
    report.fig(
        n,
        "storm_fraction_of_floor",
        rate / floor,
        "ratio",
        format!("re-grants/s ({rate:.0}) over the floor's status writes/s ({floor:.0})"),
    );
    Ok(())
}

/// One pass of the floor: a status write per Lease, timed.
struct FloorPass {
    rate: f64,
    cpu: CpuWindow,
}

/// Writes `status.holder.leaseDurationSeconds = value` on every Lease, 16 in flight,
/// each conditioned on nothing but checked to have changed the resourceVersion it had
/// in `before`; returns the pass and the resourceVersions it left.
async fn floor_pass(
    leases: &Api<Lease>,
    n: usize,
    value: i64,
    before: HashMap<String, String>,
    procs: &Procs,
) -> Result<(FloorPass, HashMap<String, String>)> {
    let t = Instant::now();
    let c0 = procs.snap();
    let after: Vec<(String, Option<String>, bool)> = stream::iter(0..n)
        .map(|i| {
            let leases = leases.clone();
            let name = lease_name(i);
            let was = before.get(&name).cloned();
            async move {
                let patch =
                    Patch::Merge(json!({"status": {"holder": {"leaseDurationSeconds": value}}}));
                let pp = PatchParams::default();
                let l = with_retry(|| leases.patch_status(&name, &pp, &patch)).await?;
                let rv = l.metadata.resource_version;
                let changed = rv.is_some() && rv != was;
                Ok::<_, anyhow::Error>((name, rv, changed))
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await
        .context("the floor's status writes")?;
    let secs = t.elapsed().as_secs_f64();
    let cpu = procs.snap().since(&c0);
    let unchanged = after.iter().filter(|(_, _, c)| !c).count();
    if unchanged > 0 {
        bail!("storm: {unchanged} of the floor's status writes left the resourceVersion as it was");
    }
    let rvs = after
        .into_iter()
        .filter_map(|(name, rv, _)| Some((name, rv?)))
        .collect();
    Ok((
        FloorPass {
            rate: n as f64 / secs,
            cpu,
        },
        rvs,
    ))
}

/// Every Lease's resourceVersion, by name.
async fn resource_versions(leases: &Api<Lease>) -> Result<HashMap<String, String>> {
    let mut rvs = HashMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = leases.list_metadata(&lp).await?;
        for l in page.items {
            if let (Some(name), Some(rv)) = (l.metadata.name, l.metadata.resource_version) {
                rvs.insert(name, rv);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(2000).continue_token(&c),
            None => break,
        }
    }
    Ok(rvs)
}
