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
    let leases = s.leases.clone();
    let claims = s.claims.clone();

    // 1. Who holds each Lease (claim, UID, token); a waiter for each: w-i where h-i
    // still holds, else a new s-i.
    type Held = Option<(String, String, i64)>;
    let holders: HashMap<String, Held> = list_leases(&leases)
        .await?
        .into_iter()
        .map(|(name, l)| {
            let held = l.status.and_then(|s| {
                let h = s.holder?;
                Some((h.claim, h.claim_uid, s.fencing_token?))
            });
            (name, held)
        })
        .collect();
    let mut expected = HashMap::new();
    let mut missing = Vec::new();
    for i in 0..n {
        let name = lease_name(i);
        let holder = match holders.get(&name) {
            Some(Some((h, _, _))) => h.clone(),
            _ => bail!("storm: {name} has no holder after the handover phase"),
        };
        let waiter = if holder == format!("h-{i:05}") {
            format!("w-{i:05}")
        } else {
            missing.push(i);
            format!("s-{i:05}")
        };
        expected.insert(name, vec![waiter]);
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
    last_renewals(s, holders.into_values().flatten().collect())
        .await
        .context("the holders' last renewals")?;

    // 2. The spec's duration, so that the re-grants' own duration is short too (not
    // timed: the floor's passes set the grants' recorded one).
    let spec_s = set_spec_duration(s, d).await?;
    println!(
        "scale: storm at {n}: {} waiters created in {created_s:.1} s, spec durations set in {spec_s:.1} s",
        missing.len(),
    );

    // 3. Floor, storm with bare claims, floor, storm with library waiters, floor: the
    // floor's passes interleaved with the storms, the bench's Lease watch open in all.
    // The first pass also sets every grant's recorded duration
    // (status.holder.leaseDurationSeconds) to the storm's: a shorter spec alone never
    // cuts a grant short.
    let mut watch = LeaseWatch::start(leases.clone()).await?;
    let mut floors = vec![floor_pass(&leases, n, d, procs).await?];
    let bare = run_storm(s, procs, &mut watch, d, "bare", Waiters::Bare(&expected)).await?;
    floors.push(floor_pass(&leases, n, d, procs).await?);
    let library = if n <= s.args.storm_library_max {
        Some(library_storm(s, procs, &mut watch, d).await?)
    } else {
        None
    };
    floors.push(floor_pass(&leases, n, d, procs).await?);
    drop(watch);
    println!(
        "scale: storm at {n}: floor passes {}",
        floors
            .iter()
            .map(|f| format!("{:.0}", f.rate))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let floor = floor_figures(s, d, "storm_floor", &floors, report);
    storm_figures(s, d, "bare", &bare, floor, api_capacity, report);
    if let Some(library) = library {
        storm_figures(s, d, "library", &library, floor, api_capacity, report);
    }
    Ok(())
}

/// The storm with library waiters, after the bare one (no controller running): each
/// holder (the bare storm's waiter) renews once naming its token, then one library
/// waiter per Lease queues, then the storm runs.
async fn library_storm(
    s: &Size<'_>,
    procs: &mut Procs,
    watch: &mut LeaseWatch,
    d: i64,
) -> Result<StormOutcome> {
    last_renewals(s, held_grants(&s.leases).await?)
        .await
        .context("the holders' last renewals before the library storm")?;
    let t = Instant::now();
    let mut waiters = LibraryWaiters::start(s).await?;
    println!(
        "scale: storm at {}: {} library waiters queued in {:.1} s",
        s.n,
        s.n,
        t.elapsed().as_secs_f64()
    );
    let outcome = run_storm(
        s,
        procs,
        watch,
        d,
        "library",
        Waiters::Library(&mut waiters.acquired),
    )
    .await;
    waiters.release().await;
    outcome
}

/// Every held grant of the namespace's Leases, every slot: (claim, claim UID, token).
pub(crate) async fn held_grants(leases: &Api<Lease>) -> Result<Vec<(String, String, i64)>> {
    Ok(list_leases(leases)
        .await?
        .into_values()
        .filter_map(|l| l.status)
        .flat_map(|st| st.slot_rows())
        .filter_map(|row| {
            let h = row.holder?;
            Some((h.claim, h.claim_uid, row.fencing_token?))
        })
        .collect())
}

/// Each holder's last renewal, as the client library sends every one: it names the
/// grant renewed ("Expiry is one write", src/controller/index/holder.rs).
pub(crate) async fn last_renewals(s: &Size<'_>, held: Vec<(String, String, i64)>) -> Result<()> {
    stream::iter(held)
        .map(|(claim, uid, token)| {
            let claims = s.claims.clone();
            async move {
                with_retry(|| renew(claims.clone(), claim.clone(), uid.clone(), Some(token))).await
            }
        })
        .buffer_unordered(s.args.inflight)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Sets every Lease's `leaseDurationSeconds` to `d`; returns the seconds it took.
pub(crate) async fn set_spec_duration(s: &Size<'_>, d: i64) -> Result<f64> {
    let t = Instant::now();
    stream::iter(0..s.n)
        .map(|i| {
            let leases = s.leases.clone();
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
    Ok(t.elapsed().as_secs_f64())
}

/// The floor's figures (`<prefix>_status_writes_per_s`): median, min and max of the
/// passes. Returns the median.
pub(crate) fn floor_figures(
    s: &Size<'_>,
    d: i64,
    prefix: &str,
    floors: &[FloorPass],
    report: &mut Report,
) -> f64 {
    let n = s.n;
    let (min, median, max, pass) = spread(floors);
    let rates = floors
        .iter()
        .map(|f| format!("{:.0}", f.rate))
        .collect::<Vec<_>>()
        .join(", ");
    let how = format!(
        "the API server's own rate for the controller's kind of write, one per Lease: a status PUT of the whole Lease (holder, fencingToken, grants, acquireTime, waiting, conditions as a grant writes them, and every slot's row on a semaphore; the grants' recorded duration {d} s and a fresh acquireTime) conditioned on its resourceVersion, 16 in flight (the controller's --concurrency), no controller running, the bench's Lease watch open as in the storms; {} passes of {n} writes, {}: {rates} writes/s",
        floors.len(),
        if prefix == "storm_floor" {
            "interleaved with the storms (floor, bare storm, floor, library storm, floor)"
        } else {
            "around the semaphore storm (floor, storm, floor, floor)"
        }
    );
    report.fig(
        n,
        &format!("{prefix}_status_writes_per_s"),
        median,
        "writes/s",
        format!(
            "the median pass: {how}. The median pass's {}",
            pass.cpu.split(s.cores)
        ),
    );
    report.fig(
        n,
        &format!("{prefix}_min_status_writes_per_s"),
        min,
        "writes/s",
        format!("the slowest pass: {how}"),
    );
    report.fig(
        n,
        &format!("{prefix}_max_status_writes_per_s"),
        max,
        "writes/s",
        format!("the fastest pass: {how}"),
    );
    median
}

/// One storm's figures and latency row (config `N`, bare claims; `N-library`;
/// `N-semaphore`).
pub(crate) fn storm_figures(
    s: &Size<'_>,
    d: i64,
    kind: &str,
    o: &StormOutcome,
    floor: f64,
    api_capacity: f64,
    report: &mut Report,
) {
    let n = s.n;
    let semaphore_what;
    let (prefix, config, what) = match kind {
        "bare" => (
            "storm",
            n.to_string(),
            "re-grant = the Lease naming the waiter (a bare claim), as the bench's Lease watch saw it (its delay included)",
        ),
        "semaphore" => {
            semaphore_what = format!(
                "semaphores of {} permits, every slot's holder silent and a bare claim waiting per slot: {} grants; re-grant = the Lease naming a waiter in any slot, as the bench's Lease watch saw it (its delay included); one Lease write may re-grant several slots",
                s.args.storm_permits,
                o.regrants.len()
            );
            (
                "storm_semaphore",
                format!("{n}-semaphore"),
                semaphore_what.as_str(),
            )
        }
        _ => (
            "storm_library",
            format!("{n}-library"),
            "re-grant = the waiter's palisade::client::LeaseClient::acquire returning (after the Lease write and its watch; the head waiter's write made before the grant, or its confirming write after it), all N waiters in the bench's process on one LeaseClient::from_config, as the agent serves all its callers",
        ),
    };
    let samples: Vec<f64> = o.regrants.iter().map(|at| signed_ms(*at, o.due)).collect();
    let failed = match o.failed.first() {
        None => String::new(),
        Some(first) => format!(
            "; CAUTION: {} of the {n} acquires failed after the Lease named their claim (left out of the samples and the rate), the first: {first}",
            o.failed.len()
        ),
    };
    let last_past = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max) / 1e3;
    let (rate, span) = first_to_last(&o.regrants);
    let (write_rate, write_span) = first_to_last(&o.lease_writes);
    let how = format!(
        "{} holders silent at once (each had renewed its grant once, naming its token as the client library does, then none renews), each with one waiter; lease duration {d} s; {what}; one replica, leader election off. Past-due delays are counted from /readyz + {d} s (a restarted controller gives every held grant a fresh full duration, DESIGN rule 4): the latest the due instant can be, since the controller starts the holders' clocks during its initial list, at most {:.2} s (spawn to /readyz) earlier, so the delays are short by up to that much and early re-grants come out negative; {}",
        o.regrants.len() + o.failed.len(),
        o.sync_secs,
        o.notes
    ) + &failed;
    report.latency(schema::Latency::of(
        "palisade",
        &config,
        "storm-past-duration",
        samples,
        &how,
    ));
    let name = |f: &str| format!("{prefix}_{f}");
    report.fig(
        n,
        &name(if kind == "library" {
            "last_acquire_past_duration"
        } else {
            "last_regrant_past_duration"
        }),
        last_past,
        "s",
        format!(
            "the last of the {} re-grants past /readyz + {d} s (signed). {how}",
            o.regrants.len()
        ),
    );
    let verdict = o.window.verdict(s.cores, o.api_writes_per_s, api_capacity);
    report.fig(
        n,
        &name(if kind == "library" { "acquires_per_s" } else { "regrants_per_s" }),
        rate,
        "grants/s",
        format!(
            "{} re-grants, first to last ({} intervals over {span:.2} s; the due instant's uncertainty does not enter); Lease writes as the watch saw them: {write_rate:.0}/s first to last over {write_span:.2} s; {:.0} API writes/s in all from the due instant. {verdict}",
            o.regrants.len(),
            o.regrants.len().saturating_sub(1),
            o.api_writes_per_s
        ),
    );
    if kind != "bare" {
        report.fig(
            n,
            &name("lease_writes_per_s"),
            write_rate,
            "writes/s",
            format!(
                "the {kind} storm's Lease writes that granted waiters (as the bench's watch saw them), first to last over {write_span:.2} s: {} writes for {} grants",
                o.lease_writes.len(),
                o.regrants.len()
            ),
        );
    }
    report.fig(
        n,
        &name("fraction_of_floor"),
        rate / floor,
        "ratio",
        format!("re-grants/s ({rate:.0}, first to last) over the floor's median status writes/s ({floor:.0})"),
    );
}
