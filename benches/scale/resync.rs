//! Phase 4: resync after a restart.

use super::*;

/// Kills the controller and starts another; returns it and the first one's VmHWM (KiB).
pub(crate) async fn resync(
    s: &Size<'_>,
    procs: &mut Procs,
    mut ctrl: Controller,
    renewer: &Renewer,
    report: &mut Report,
) -> Result<(Controller, f64)> {
    let n = s.n;
    let ns = s.ns;
    let root = s.root;
    let deadline = s.deadline;
    let leases = s.leases.clone();
    let claims = s.claims.clone();
    // The log of the first controller (initial_grant), appended to.
    let log = s.args.out.join(format!("scale-controller-{n}.log"));

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

    Ok((ctrl, first_hwm))
}
