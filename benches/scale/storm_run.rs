//! One storm: a controller starts with no holder renewing, and every re-grant is timed.

use super::*;

/// What one storm saw.
pub(crate) struct StormOutcome {
    /// Per waiter, when its grant was seen: bare claims, the bench's watch seeing the
    /// Lease name the waiter in a slot; library waiters, `acquire` returning (those
    /// whose `acquire` failed are missing: see `failed`).
    pub(crate) regrants: Vec<Instant>,
    /// Library waiters whose `acquire` failed after the Lease write named them: why.
    pub(crate) failed: Vec<String>,
    /// Per Lease write that granted waiters (one on a lock; one or more slots' on a
    /// semaphore): when the bench's watch saw it.
    pub(crate) lease_writes: Vec<Instant>,
    /// /readyz + D: the latest the due instant can be.
    pub(crate) due: Instant,
    /// From the controller's spawn to /readyz: the due instant is at most this much
    /// earlier than `due` (the holders' clocks start during its initial list).
    pub(crate) sync_secs: f64,
    pub(crate) window: CpuWindow,
    pub(crate) api_writes_per_s: f64,
    /// The controller's state around the storm (busy at the due instant, early grants,
    /// expirations), for the notes.
    pub(crate) notes: String,
}

/// Who the storm waits for.
pub(crate) enum Waiters<'a> {
    /// Bare claims: Lease name -> the waiter claims the Lease must come to name (one
    /// per slot).
    Bare(&'a HashMap<String, Vec<String>>),
    /// Library waiters (their claims named by `storm_library::is_library_claim`), and
    /// each `acquire` returning (Lease index, when).
    Library(&'a mut tokio::sync::mpsc::UnboundedReceiver<Result<(usize, Instant), String>>),
}

/// Starts a controller (log `scale-storm-<n>-<kind>.log`), waits for every re-grant
/// (at most 60 s + 20 ms per grant past the due instant), then kills it.
pub(crate) async fn run_storm(
    s: &Size<'_>,
    procs: &mut Procs,
    watch: &mut LeaseWatch,
    d: i64,
    kind: &str,
    mut waiters: Waiters<'_>,
) -> Result<StormOutcome> {
    let grants = match &waiters {
        Waiters::Bare(expected) => expected.values().map(Vec::len).sum(),
        Waiters::Library(_) => s.n,
    };
    let client = s.leases.clone().into_client();
    watch.drain();
    let log = s.args.out.join(format!("scale-storm-{}-{kind}.log", s.n));
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

    let bound =
        (due + Duration::from_secs(60) + Duration::from_millis(20 * grants as u64)).min(s.deadline);
    // Waiter claim -> when the watch first saw it hold a slot.
    let mut writes: HashMap<String, Instant> = HashMap::new();
    let mut lease_writes = Vec::new();
    let mut acquired: HashMap<usize, Instant> = HashMap::new();
    let mut failed = Vec::new();
    let library = matches!(waiters, Waiters::Library(_));
    while writes.len() < grants || (library && acquired.len() + failed.len() < grants) {
        let event = tokio::time::timeout_at(bound.into(), async {
            match &mut waiters {
                Waiters::Bare(_) => Seen::Watch(watch.rx.recv().await),
                Waiters::Library(rx) => tokio::select! {
                    w = watch.rx.recv() => Seen::Watch(w),
                    a = rx.recv(), if acquired.len() + failed.len() < grants => Seen::Acquired(a),
                },
            }
        })
        .await;
        match event {
            Err(_) => {
                break;
            }
            Ok(Seen::Watch(None)) => bail!("the Lease watch ended"),
            Ok(Seen::Watch(Some(seen))) => {
                let mut granted = false;
                for (_, h) in &seen.holders {
                    let waiter = match &waiters {
                        Waiters::Bare(expected) => {
                            expected.get(&seen.lease).is_some_and(|w| w.contains(h))
                        }
                        Waiters::Library(_) => is_library_claim(&seen.lease, h),
                    };
                    if waiter && !writes.contains_key(h) {
                        writes.insert(h.clone(), seen.at);
                        granted = true;
                    }
                }
                if granted {
                    lease_writes.push(seen.at);
                }
            }
            Ok(Seen::Acquired(Some(Ok((i, at))))) => {
                acquired.entry(i).or_insert(at);
            }
            // Counted and said: the library refuses a grant it cannot confirm in time.
            Ok(Seen::Acquired(Some(Err(e)))) => failed.push(e),
            Ok(Seen::Acquired(None)) => bail!("storm ({kind}): the library waiters are gone"),
        }
    }
    let c1 = procs.snap();
    let writes_1 = apiserver_requests(&client, is_write_request).await?;
    ctrl.check_alive()?;
    let expirations = ctrl.metric("palisade_expirations_total").await?;
    ctrl.kill().await;
    let done = if library {
        acquired.len() + failed.len()
    } else {
        writes.len()
    };
    if writes.len() < grants || done < grants {
        bail!(
            "storm ({kind}): {} of {grants} waiters granted ({done} seen by their waiters) within {:.0} s of the due instant (log: {})",
            writes.len(),
            (bound - due).as_secs_f64(),
            log.display()
        );
    }
    if !failed.is_empty() && acquired.len() < 2 {
        bail!(
            "storm ({kind}): {} of {grants} acquires failed, the first: {}",
            failed.len(),
            failed[0]
        );
    }
    let regrants = if library {
        acquired.into_values().collect()
    } else {
        writes.into_values().collect()
    };
    let window = c1.since(&c0);
    let notes = format!(
        "{busy_note}; grants before the due instant: {early_grants}; expirations counted by the controller: {expirations}{}",
        if expirations > grants as f64 {
            " (more than the grants held: a waiter granted early had its own grant expire before the last re-grant, nobody renewing it; those writes fell into the storm too)"
        } else {
            ""
        }
    );
    Ok(StormOutcome {
        regrants,
        failed,
        lease_writes,
        due,
        sync_secs: (ready - t_spawn).as_secs_f64(),
        api_writes_per_s: (writes_1 - writes_0) / window.secs,
        window,
        notes,
    })
}

enum Seen {
    Watch(Option<LeaseSeen>),
    Acquired(Option<Result<(usize, Instant), String>>),
}

/// Milliseconds from `due` to `at`, signed: before the due instant is negative.
pub(crate) fn signed_ms(at: Instant, due: Instant) -> f64 {
    if at >= due {
        (at - due).as_secs_f64() * 1e3
    } else {
        -(due - at).as_secs_f64() * 1e3
    }
}

/// Events per second from the first to the last (n - 1 intervals), and that span in
/// seconds; NaN below two events.
pub(crate) fn first_to_last(times: &[Instant]) -> (f64, f64) {
    let (Some(first), Some(last)) = (times.iter().min(), times.iter().max()) else {
        return (f64::NAN, f64::NAN);
    };
    let span = (*last - *first).as_secs_f64();
    if times.len() < 2 || span <= 0.0 {
        return (f64::NAN, span);
    }
    ((times.len() - 1) as f64 / span, span)
}
