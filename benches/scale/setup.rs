//! Phase 1: setup, with no controller running.

use super::*;

/// Creates the Leases and claims; returns the pairs and the create rate (objects/s).
pub(crate) async fn setup(
    s: &Size<'_>,
    procs: &Procs,
    report: &mut Report,
) -> Result<(Arc<Vec<Pair>>, f64)> {
    let n = s.n;
    let args = s.args;
    let cores = s.cores;
    let leases = s.leases.clone();
    let claims = s.claims.clone();
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

    Ok((pairs, api_capacity))
}
