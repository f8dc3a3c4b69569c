//! Phase 3: renewals alone, at the nominal rate.

use super::*;

/// Returns the controller CPU per renewal and the renewals figure (value, note).
pub(crate) async fn renewals(
    s: &Size<'_>,
    procs: &Procs,
    ctrl: &mut Controller,
    renewer: &Renewer,
) -> Result<(f64, (f64, String))> {
    let n = s.n;
    let args = s.args;
    let deadline = s.deadline;
    let cores = s.cores;
    let leases = s.leases.clone();
    let claims = s.claims.clone();
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

    Ok((per_renewal, renewal_figure))
}
