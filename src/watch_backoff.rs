//! How the controller's and the client's watches retry after an error.
//!
//! **Backoff.**
//! kube-runtime's default backoff doubles from 0.8 s up to 30 s, so after an API
//! server outage of ten seconds a watch may wait several more seconds before it
//! reconnects, and every handover waits on the watches. Ours doubles from 0.2 s
//! and stops at 2 s (plus jitter): a few extra requests per watch while the API
//! server is down, and no watch sleeps more than 4 s once it is back. (After a
//! kube-apiserver restart its watch cache takes a few more seconds to serve;
//! `make chaos` measures the whole recovery.)

use std::time::Duration;

use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::ExponentialBackoff;

/// The retry delays of a watch: 0.2 s doubling to 2 s, with jitter, starting over
/// once the watch has run for two minutes without an error.
pub fn backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), Duration::from_secs(120))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_200ms_and_stop_at_two_seconds() {
        let delays: Vec<Duration> = backoff().take(12).collect();
        assert_eq!(delays.len(), 12, "never gives up");
        // Jitter adds up to one more delay: each lies in [d, 2d) of the plain schedule.
        assert!(delays[0] >= Duration::from_millis(200) && delays[0] < Duration::from_millis(400));
        assert!(
            delays.iter().all(|d| *d < Duration::from_secs(4)),
            "{delays:?}"
        );
        assert!(
            delays[8..].iter().all(|d| *d >= Duration::from_secs(2)),
            "{delays:?}"
        );
    }
}
