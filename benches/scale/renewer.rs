//! The holders' renewals.

use super::*;

#[derive(Default)]
pub(crate) struct RenewStats {
    pub(crate) ok: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) gone: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) in_flight: AtomicUsize,
}

/// Renews the current holder of each Lease, round robin, at `per_sec` patches per second.
pub(crate) struct Renewer {
    pub(crate) stats: Arc<RenewStats>,
    /// Lease i's holder claim was deleted: renew its waiter (now the holder) instead.
    pub(crate) released: Arc<Vec<AtomicBool>>,
    pub(crate) paused: Arc<AtomicBool>,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) stop: CancellationToken,
}

pub(crate) const RENEW_IN_FLIGHT: usize = 32;

impl Renewer {
    pub(crate) fn start(claims: Api<LeaseClaim>, pairs: Arc<Vec<Pair>>, per_sec: f64) -> Self {
        let stats = Arc::new(RenewStats::default());
        let released: Arc<Vec<AtomicBool>> =
            Arc::new((0..pairs.len()).map(|_| AtomicBool::new(false)).collect());
        let paused = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(
            claims,
            pairs,
            per_sec,
            stats.clone(),
            released.clone(),
            paused.clone(),
            stop.clone(),
        ));
        Self {
            stats,
            released,
            paused,
            task,
            stop,
        }
    }

    /// Stops sending renewals and waits (at most 30 s) for those in flight.
    pub(crate) async fn pause(&self, deadline: Instant) -> Result<()> {
        self.paused.store(true, Ordering::Relaxed);
        let until = deadline.min(Instant::now() + Duration::from_secs(30));
        while self.stats.in_flight.load(Ordering::Relaxed) > 0 {
            if Instant::now() > until {
                bail!("renewals still in flight after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub(crate) fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    /// Renewals answered with success so far.
    pub(crate) fn ok(&self) -> u64 {
        self.stats.ok.load(Ordering::Relaxed)
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

pub(crate) async fn renew_loop(
    claims: Api<LeaseClaim>,
    pairs: Arc<Vec<Pair>>,
    per_sec: f64,
    stats: Arc<RenewStats>,
    released: Arc<Vec<AtomicBool>>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = FuturesUnordered::new();
    let mut credit = 0.0;
    let mut next = 0usize;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let now = Instant::now();
                let dt = (now - last).as_secs_f64();
                last = now;
                if paused.load(Ordering::Relaxed) {
                    credit = 0.0;
                } else {
                    credit += per_sec * dt;
                }
                while credit >= 1.0 {
                    credit -= 1.0;
                    if running.len() >= RENEW_IN_FLIGHT {
                        stats.skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let i = next % pairs.len();
                    next += 1;
                    let pair = &pairs[i];
                    let (name, uid) = if released[i].load(Ordering::Relaxed) {
                        pair.waiter.clone()
                    } else {
                        pair.holder.clone()
                    };
                    running.push(renew(claims.clone(), name, uid, None));
                }
            }
            Some(result) = running.next(), if !running.is_empty() => {
                let counter = match result {
                    Ok(()) => &stats.ok,
                    Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => &stats.gone,
                    Err(_) => &stats.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        stats.in_flight.store(running.len(), Ordering::Relaxed);
    }
}

/// What the client library does to renew: one merge patch of `spec.renewTime`, and
/// of the annotation that names the grant renewed, when the renewer knows its token
/// (the library always does; the bench's renewer knows it only in the storm).
pub(crate) async fn renew(
    claims: Api<LeaseClaim>,
    name: String,
    uid: String,
    token: Option<i64>,
) -> Result<(), kube::Error> {
    let mut patch = json!({
        "metadata": {"uid": uid},
        "spec": {"renewTime": MicroTime(Timestamp::now())},
    });
    if let Some(token) = token {
        patch["metadata"]["annotations"] = json!({RENEWED_TOKEN_ANNOTATION: token.to_string()});
    }
    let params = PatchParams {
        field_manager: Some(CLIENT_MANAGER.to_string()),
        ..PatchParams::default()
    };
    claims
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
}
