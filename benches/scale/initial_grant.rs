//! Phase 2: the initial grant (phase 3, the renewals alone, runs in between).

use super::*;

/// Starts the controller and the renewals; returns them and the controller CPU per renewal.
pub(crate) async fn initial_grant(
    s: &Size<'_>,
    procs: &mut Procs,
    pairs: &Arc<Vec<Pair>>,
    api_capacity: f64,
    report: &mut Report,
) -> Result<(Controller, Renewer, f64)> {
    let n = s.n;
    let ns = s.ns;
    let root = s.root;
    let args = s.args;
    let deadline = s.deadline;
    let cores = s.cores;
    let leases = s.leases.clone();
    let claims = s.claims.clone();
    let events = s.events.clone();
    let renew_rate = s.renew_rate;
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
    let wrong = wrong_holders(&leases, pairs, |_, p| &p.holder.0).await?;
    if wrong > 0 {
        bail!("after the initial grant, {wrong} Leases are not held by their h- claim");
    }
    let (per_renewal, renewal_figure) = renewals(s, procs, &mut ctrl, &renewer).await?;

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

    Ok((ctrl, renewer, per_renewal))
}
