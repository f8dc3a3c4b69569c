//! The storm's floor: the API server's own rate for the controller's kind of write, one
//! per Lease, with no controller running.

use super::*;

/// One pass of the floor: a status write per Lease, timed.
pub(crate) struct FloorPass {
    pub(crate) rate: f64,
    pub(crate) cpu: CpuWindow,
}

/// The controller's `--concurrency` default: its writes in flight.
const CONTROLLER_CONCURRENCY: usize = 16;

/// Every Lease as it is now, by name.
pub(crate) async fn list_leases(leases: &Api<Lease>) -> Result<HashMap<String, Lease>> {
    let mut out = HashMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = leases.list(&lp).await?;
        for l in page.items {
            out.insert(l.name_any(), l);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = ListParams::default().limit(2000).continue_token(&c),
            None => break,
        }
    }
    Ok(out)
}

/// One pass: every Lease's status replaced as a grant replaces it (a PUT of the whole
/// object, conditioned on its resourceVersion; holder, token, grants, waiting,
/// conditions and a semaphore's slots as they are), with every grant's recorded
/// duration set to `duration` and a fresh acquireTime, so every write changes the
/// object. 16 in flight, the controller's --concurrency. Fails if a write is refused or changes nothing.
pub(crate) async fn floor_pass(
    leases: &Api<Lease>,
    n: usize,
    duration: i64,
    procs: &Procs,
) -> Result<FloorPass> {
    let mut current = list_leases(leases).await?;
    let objects: Vec<Lease> = (0..n)
        .map(|i| {
            current
                .remove(&lease_name(i))
                .with_context(|| format!("floor: no Lease {}", lease_name(i)))
        })
        .collect::<Result<_>>()?;
    let t = Instant::now();
    let c0 = procs.snap();
    let unchanged: usize = stream::iter(objects)
        .map(|mut l| {
            let leases = leases.clone();
            async move {
                let (name, was) = (l.name_any(), l.metadata.resource_version.clone());
                let status = l.status.get_or_insert_with(Default::default);
                let slots = status.slots.iter_mut().filter_map(|s| s.holder.as_mut());
                for h in status.holder.iter_mut().chain(slots) {
                    h.lease_duration_seconds = Some(duration);
                }
                status.acquire_time = Some(MicroTime(Timestamp::now()));
                let pp = PostParams::default();
                let after = with_retry(|| leases.replace_status(&name, &pp, &l)).await?;
                let rv = after.metadata.resource_version;
                Ok::<_, anyhow::Error>(usize::from(rv.is_none() || rv == was))
            }
        })
        .buffer_unordered(CONTROLLER_CONCURRENCY)
        .try_fold(0, |sum, u| async move { Ok(sum + u) })
        .await
        .context("the floor's status writes")?;
    let secs = t.elapsed().as_secs_f64();
    let cpu = procs.snap().since(&c0);
    if unchanged > 0 {
        bail!("storm: {unchanged} of the floor's status writes left the resourceVersion as it was");
    }
    Ok(FloorPass {
        rate: n as f64 / secs,
        cpu,
    })
}

/// (min, median, max) of the passes' rates, and the median pass.
pub(crate) fn spread(passes: &[FloorPass]) -> (f64, f64, f64, &FloorPass) {
    let mut sorted: Vec<&FloorPass> = passes.iter().collect();
    sorted.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let median = sorted[sorted.len() / 2];
    (
        sorted[0].rate,
        median.rate,
        sorted[sorted.len() - 1].rate,
        median,
    )
}
