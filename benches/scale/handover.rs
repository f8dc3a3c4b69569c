//! Phase 6: handover, sustained grants; then the peak RSS.

use super::*;

/// `earlier`: the controller CPU per renewal, the create rate and the first VmHWM.
pub(crate) async fn handover(
    s: &Size<'_>,
    procs: &Procs,
    mut ctrl: Controller,
    renewer: Renewer,
    pairs: &Arc<Vec<Pair>>,
    earlier: (f64, f64, f64),
    report: &mut Report,
) -> Result<()> {
    let (per_renewal, api_capacity, first_hwm) = earlier;
    let n = s.n;
    let args = s.args;
    let deadline = s.deadline;
    let cores = s.cores;
    let leases = s.leases.clone();
    let claims = s.claims.clone();
    let events = s.events.clone();
    let renew_rate = s.renew_rate;
    // 6. Handover: delete holder claims (for at most --handover seconds); each waiter is granted.
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
    let wrong = wrong_holders(&leases, pairs, |i, p| {
        if renewer.released[i].load(Ordering::Relaxed) {
            &p.waiter.0
        } else {
            &p.holder.0
        }
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
