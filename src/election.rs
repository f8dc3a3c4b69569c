//! Leader election among controller replicas on a `coordination.k8s.io/v1` Lease.
//!
//! Every write is conditioned on the resourceVersion it read (unlike crates that
//! acquire with an unconditional patch, where the last writer wins). Expiry is
//! judged on our own monotonic clock: a record that has not changed for
//! `lease_duration` since we first saw it is free to take, as in client-go.
//! Correctness of grants never depends on the election (DESIGN rule 2); it only
//! keeps standby replicas from doing wasted work.
//!
//! Every call has a deadline: an attempt to renew may take no longer than what is
//! left of the renew deadline, so a leader stuck on a dead connection gives up
//! leadership on time instead of waiting for the kernel's TCP timeout.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease as CoordinationLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::controller::{Error, Result};
use crate::error::ApiErrorKind;
use crate::kube_client::within;

#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

pub struct Elector {
    api: Api<CoordinationLease>,
    config: ElectionConfig,
    /// The last record seen (resourceVersion) and when we first saw it.
    observed: Option<(String, Instant)>,
}

impl Elector {
    pub fn new(client: Client, config: ElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    /// Waits until this replica holds the election lease. Returns false on shutdown.
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        loop {
            match self.attempt(self.config.renew_deadline).await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.label(), "leader election: acquire attempt failed")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
    }

    /// Renews until shutdown (Ok) or until the lease cannot be renewed within the renew deadline (Err).
    pub async fn hold(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let mut last_renewed = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let left = self
                .config
                .renew_deadline
                .saturating_sub(last_renewed.elapsed());
            match self.attempt(left).await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => return Err(Error::ElectionLost),
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.label(), "leader election: renewal failed")
                }
            }
            if last_renewed.elapsed() > self.config.renew_deadline {
                return Err(Error::RenewDeadline(self.config.renew_deadline));
            }
        }
    }

    /// Gives the election lease up so a standby takes over at once.
    pub async fn release(&mut self) {
        let limit = self.config.retry_period;
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

    /// One attempt, given up (as a failed attempt) after `limit`.
    async fn attempt(&mut self, limit: Duration) -> Result<bool> {
        within(limit, self.try_acquire_or_renew())
            .await
            .map_err(|e| Error::api("write the election lease", e))
    }

    async fn try_acquire_or_renew(&mut self) -> std::result::Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let me = self.config.identity.clone();
        let duration_secs = self.config.lease_duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = CoordinationLease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if ApiErrorKind::of(&e) == ApiErrorKind::Conflict => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = lease.resource_version().unwrap_or_default();
        let first_seen = match &self.observed {
            Some((seen_rv, at)) if *seen_rv == rv => *at,
            _ => Instant::now(),
        };
        self.observed = Some((rv, first_seen));
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let their_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        let ours = holder == me;
        let free = holder.is_empty() || first_seen.elapsed() >= their_duration;
        if !ours && !free {
            return Ok(false);
        }
        if !ours {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me);
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(now);
        // `replace` carries metadata.resourceVersion: a concurrent writer makes this fail with 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observed = Some((
                    written.resource_version().unwrap_or_default(),
                    Instant::now(),
                ));
                Ok(true)
            }
            Err(e) if ApiErrorKind::of(&e) == ApiErrorKind::Conflict => Ok(false),
            Err(e) => Err(e),
        }
    }
}
