//! Leader election among controller replicas on a `coordination.k8s.io/v1` Lease.
//!
//! Every write is conditioned on the resourceVersion it read (unlike crates that
//! acquire with an unconditional patch, where the last writer wins). Expiry is
//! judged on our own monotonic clock: a record that has not changed for
//! `lease_duration` since we first saw it is free to take, as in client-go.
//! Correctness of grants never depends on the election (DESIGN rule 2); it only
//! keeps standby replicas from doing wasted work.
//!
//! A slow API server must cost latency, not leadership. Every attempt waits up to
//! [`ATTEMPT_DEADLINE`] for its answer, far longer than the renew deadline, so a
//! write that lands is seen by the replica that made it: no replica keeps the
//! record alive without knowing it leads. A leader steps down only when it finds
//! another holder, or when an attempt *failed* and none has succeeded since the
//! renew deadline (counted from the start of the last successful attempt); a slow
//! renewal that succeeds keeps it leading. Two replicas may then both act for a
//! few seconds, which rule 2 makes safe.
//!
//! Takeover is timed to the record: a standby that saw the record unchanged tries
//! again the moment it would expire rather than at its next retry tick, so a dead
//! leader is replaced within the lease duration plus one retry period. It waits
//! the record's duration plus twice its own latest read's round trip: when calls
//! are slow, a live leader's renewals land that much further apart.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease as CoordinationLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::kube_client::within;
use crate::kube_error::ApiErrorKind;

/// How long one attempt (a read and a write of the record) may take. It bounds a
/// call on a connection that died silently too; the controller's connections also
/// count as dead after 5 s without a byte (`kube_client::READ_TIMEOUT`).
pub const ATTEMPT_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub timings: ElectionTimings,
}

/// How long a leader's record stands, how long a leader keeps trying to renew it,
/// and how often it tries. Why these defaults: the controller module's docs, "Leader election".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionTimings {
    /// Written as the record's `leaseDurationSeconds`, so whole seconds, at least 1.
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for ElectionTimings {
    fn default() -> Self {
        ElectionTimings {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(750),
            retry_period: Duration::from_millis(250),
        }
    }
}

/// Why a leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The write of the election lease failed (classified once by [`ApiErrorKind`]).
    #[error("write the election lease: {source}")]
    Api {
        kind: ApiErrorKind,
        #[source]
        source: kube::Error,
    },
    /// Another replica holds the election lease now.
    #[error("another replica took the election lease")]
    Lost,
    /// The election lease could not be renewed within the renew deadline.
    #[error("could not renew the election lease within {0:?}")]
    RenewDeadline(Duration),
}

impl ElectionError {
    /// The log label: one of a fixed set of short words.
    pub fn label(&self) -> &'static str {
        match self {
            ElectionError::Api { kind, .. } => kind.label(),
            ElectionError::Lost => "election_lost",
            ElectionError::RenewDeadline(_) => "renew_deadline",
        }
    }
}

/// Timings that cannot work: named, with the values given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error(
        "leader election lease duration {0:?} must be whole seconds, at least 1s \
         (it is written as the election Lease's leaseDurationSeconds)"
    )]
    LeaseDurationNotWholeSeconds(Duration),
    #[error(
        "leader election renew deadline {renew_deadline:?} must be shorter than the lease \
         duration {lease_duration:?}, or a standby could take over while the leader still grants"
    )]
    RenewDeadlineNotShorter {
        renew_deadline: Duration,
        lease_duration: Duration,
    },
    #[error(
        "leader election retry period {retry_period:?} must be greater than zero and shorter \
         than the renew deadline {renew_deadline:?}, or a leader gets no second try to renew"
    )]
    RetryPeriodNotShorter {
        retry_period: Duration,
        renew_deadline: Duration,
    },
}

impl ElectionTimings {
    pub fn validate(self) -> Result<Self, TimingsError> {
        let ElectionTimings {
            lease_duration,
            renew_deadline,
            retry_period,
        } = self;
        if lease_duration.subsec_nanos() != 0 || lease_duration < Duration::from_secs(1) {
            return Err(TimingsError::LeaseDurationNotWholeSeconds(lease_duration));
        }
        if renew_deadline >= lease_duration {
            return Err(TimingsError::RenewDeadlineNotShorter {
                renew_deadline,
                lease_duration,
            });
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return Err(TimingsError::RetryPeriodNotShorter {
                retry_period,
                renew_deadline,
            });
        }
        Ok(self)
    }
}

pub struct Elector {
    api: Api<CoordinationLease>,
    config: ElectionConfig,
    /// The last record seen: its resourceVersion, when we first saw it, and when it
    /// expires unless it changes (None: ours or free).
    observed: Option<Observed>,
    /// The record as we last wrote it, while we lead.
    written: Option<CoordinationLease>,
    last_attempt_started: Option<Instant>,
}

struct Observed {
    resource_version: String,
    first_seen: Instant,
    expires_at: Option<Instant>,
}

impl Elector {
    pub fn new(client: Client, config: ElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            written: None,
            last_attempt_started: None,
        }
    }

    /// Waits until this replica holds the election lease. Returns false on shutdown.
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        let timings = self.config.timings;
        loop {
            match self.attempt().await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.label(), "leader election: acquire attempt failed")
                }
            }
            // Try again at the next tick, or the moment the record we saw expires; an
            // expiry already past (the attempt failed) waits for the tick, or a standby
            // cut off from the API server would retry without pause.
            let now = Instant::now();
            let next_tick = now + timings.retry_period;
            let wake = match self.observed.as_ref().and_then(|o| o.expires_at) {
                Some(expiry) if expiry > now => next_tick.min(expiry),
                _ => next_tick,
            };
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    /// Renews until shutdown (Ok) or until the lease cannot be renewed within the renew deadline (Err).
    pub async fn hold(&mut self, shutdown: &CancellationToken) -> Result<(), ElectionError> {
        let timings = self.config.timings;
        // Counted from the start of the attempt that acquired or renewed: see the module doc.
        let mut last_renewed = self.last_attempt_started.unwrap_or_else(Instant::now);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(timings.retry_period) => {}
            }
            let started = Instant::now();
            match self.attempt().await {
                Ok(true) => last_renewed = started,
                Ok(false) => return Err(ElectionError::Lost),
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.label(), "leader election: renewal failed");
                    if last_renewed.elapsed() > timings.renew_deadline {
                        return Err(ElectionError::RenewDeadline(timings.renew_deadline));
                    }
                }
            }
        }
    }

    /// Gives the election lease up so a standby takes over at once.
    pub async fn release(&mut self) {
        let limit = self.config.timings.retry_period;
        let Ok(Some(mut lease)) = within(limit, self.api.get_opt(&self.config.name)).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(&self.config.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        if let Err(e) = within(
            limit,
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease),
        )
        .await
        {
            tracing::warn!(error = %e, "leader election: release failed");
        } else {
            tracing::info!("leader election: released");
        }
    }

    /// Our write of the record landed: we lead, and renew from it next time.
    fn wrote(&mut self, written: CoordinationLease) -> bool {
        self.observed = Some(Observed {
            resource_version: written.resource_version().unwrap_or_default(),
            first_seen: Instant::now(),
            expires_at: None,
        });
        self.written = Some(written);
        true
    }

    /// One attempt, given up (as a failed attempt) after [`ATTEMPT_DEADLINE`].
    async fn attempt(&mut self) -> Result<bool, ElectionError> {
        self.last_attempt_started = Some(Instant::now());
        within(ATTEMPT_DEADLINE, self.try_acquire_or_renew())
            .await
            .map_err(|source| ElectionError::Api {
                kind: ApiErrorKind::of(&source),
                source,
            })
    }

    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        // A leader renews the record it wrote last without reading it first: half the
        // requests of read-then-write. A conflict means someone else wrote it since,
        // and the read below decides.
        if let Some(mut mine) = self.written.take() {
            mine.spec.get_or_insert_with(Default::default).renew_time =
                Some(MicroTime(Timestamp::now()));
            match self
                .api
                .replace(&self.config.name, &PostParams::default(), &mine)
                .await
            {
                Ok(written) => return Ok(self.wrote(written)),
                Err(e) if ApiErrorKind::of(&e) == ApiErrorKind::Conflict => {}
                Err(e) => return Err(e),
            }
        }
        let wall = MicroTime(Timestamp::now());
        let me = self.config.identity.clone();
        let duration_secs = self.config.timings.lease_duration.as_secs().max(1) as i32;
        let read_started = Instant::now();
        let read = self.api.get_opt(&self.config.name).await?;
        let round_trip = read_started.elapsed();
        let Some(mut lease) = read else {
            let lease = CoordinationLease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(wall.clone()),
                    renew_time: Some(wall),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => Ok(self.wrote(written)),
                Err(e) if ApiErrorKind::of(&e) == ApiErrorKind::Conflict => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = lease.resource_version().unwrap_or_default();
        let first_seen = match &self.observed {
            Some(seen) if seen.resource_version == rv => seen.first_seen,
            _ => Instant::now(),
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let their_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        let ours = holder == me;
        let expires_at = first_seen + their_duration + 2 * round_trip;
        let free = holder.is_empty() || Instant::now() >= expires_at;
        self.observed = Some(Observed {
            resource_version: rv,
            first_seen,
            expires_at: (!ours && !free).then_some(expires_at),
        });
        if !ours && !free {
            return Ok(false);
        }
        if !ours {
            spec.acquire_time = Some(wall.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me);
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(wall);
        // `replace` carries metadata.resourceVersion: a concurrent writer makes this fail with 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(self.wrote(written)),
            Err(e) if ApiErrorKind::of(&e) == ApiErrorKind::Conflict => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn election_failures_have_their_own_labels() {
        assert_eq!(ElectionError::Lost.label(), "election_lost");
        let e = ElectionError::RenewDeadline(Duration::from_secs(10));
        assert_eq!(e.label(), "renew_deadline");
        assert_eq!(
            e.to_string(),
            "could not renew the election lease within 10s"
        );
        let api = ElectionError::Api {
            kind: ApiErrorKind::Conflict,
            source: crate::kube_error::refusal(409, "test"),
        };
        assert_eq!(api.label(), "conflict");
        assert!(
            api.to_string().starts_with("write the election lease: "),
            "{api}"
        );
    }

    fn timings(lease_ms: u64, renew_ms: u64, retry_ms: u64) -> ElectionTimings {
        ElectionTimings {
            lease_duration: Duration::from_millis(lease_ms),
            renew_deadline: Duration::from_millis(renew_ms),
            retry_period: Duration::from_millis(retry_ms),
        }
    }

    #[test]
    fn the_defaults_and_client_gos_defaults_are_valid() {
        assert!(ElectionTimings::default().validate().is_ok());
        assert!(timings(15_000, 10_000, 2_000).validate().is_ok());
    }

    #[test]
    fn timings_that_cannot_work_are_refused_with_the_values_named() {
        let cases = [
            (timings(1_500, 750, 250), "whole seconds"),
            (timings(0, 0, 0), "whole seconds"),
            (
                timings(1_000, 1_000, 250),
                "renew deadline 1s must be shorter",
            ),
            (
                timings(2_000, 750, 750),
                "retry period 750ms must be greater than zero",
            ),
            (timings(2_000, 750, 0), "retry period 0ns"),
        ];
        for (bad, message) in cases {
            let error = bad.validate().expect_err(&format!("{bad:?} accepted"));
            assert!(error.to_string().contains(message), "{error}");
        }
    }
}
