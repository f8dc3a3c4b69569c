//! Sessions and their grants. A session is one application process; each of its
//! grants is one [`crate::client`] acquire, held by a task of its own, whose phase the
//! handlers read and wait on. The timing contract stays in the client library: this
//! module only decides *when to let go* (the session ended) and reports what happened.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::AgentMetrics;
use super::token_files::TokenFiles;
use super::wire::AcquireRequest;
use crate::client::clock::BootInstant;
use crate::client::{AcquireOptions, Error as ClientError, LeaseClient, LostReason, PodBinding};
use crate::permits::fence_key;

/// A grant's identity within its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrantKey {
    pub namespace: String,
    pub name: String,
}

/// Where a grant is in its life. `Lost` and `Released` are final.
#[derive(Debug, Clone)]
pub enum Phase {
    Waiting {
        claim: Option<String>,
    },
    Held {
        token: i64,
        slot: i32,
        claim: String,
        claim_uid: String,
        duration: Duration,
        /// The client library's local deadline on `CLOCK_BOOTTIME`.
        deadline: watch::Receiver<Duration>,
    },
    Lost {
        token: Option<i64>,
        slot: Option<i32>,
        claim: Option<String>,
        reason: &'static str,
        message: String,
    },
    Released {
        token: Option<i64>,
        slot: Option<i32>,
        claim: Option<String>,
    },
}

impl Phase {
    pub fn is_waiting(&self) -> bool {
        matches!(self, Phase::Waiting { .. })
    }

    pub fn is_live(&self) -> bool {
        matches!(self, Phase::Waiting { .. } | Phase::Held { .. })
    }
}

/// The `state` of a `Grant` in the OpenAPI document; the clients match these strings.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GrantState {
    Waiting,
    Held,
    Lost,
    Released,
}

/// The `Grant` of the OpenAPI document.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GrantView {
    pub name: String,
    pub namespace: String,
    pub state: GrantState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<i64>,
    /// The slot held (0 on a lock), with the token; while waiting, the one asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<i32>,
    /// [`fence_key`] of `slot`, so that no client rebuilds the rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_key: Option<String>,
    pub valid_for_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_uid: Option<String>,
    pub holder_identity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u64>,
}

/// One grant of a session.
pub struct SessionGrant {
    pub key: GrantKey,
    pub identity: String,
    /// The slot asked for (the acquire's `slot`); None: any.
    pub asked_slot: Option<i32>,
    phase: watch::Sender<Phase>,
    /// Cancelled to let go: a release, or the end of the session.
    pub release: CancellationToken,
    events: broadcast::Sender<GrantView>,
    /// The session's end unless a request names it first (caps `validForMs`).
    session_expiry: Arc<Mutex<Instant>>,
    keepalive: Duration,
}

impl SessionGrant {
    pub fn phase(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    fn set(&self, phase: Phase) {
        self.phase.send_replace(phase);
        // Nobody listening is fine: the stream is optional.
        let _ = self.events.send(self.view());
    }

    /// The grant as the API shows it, on the clock now. `validForMs` is capped by the
    /// session's end: it ends (and the grant with it) once that passes without a
    /// keepalive.
    pub fn view(&self) -> GrantView {
        let session_left = Some(
            (*self.session_expiry.lock().unwrap() + self.keepalive)
                .saturating_duration_since(Instant::now()),
        );
        let mut view = GrantView {
            name: self.key.name.clone(),
            namespace: self.key.namespace.clone(),
            state: GrantState::Waiting,
            token: None,
            slot: None,
            fence_key: None,
            valid_for_ms: 0,
            lost_reason: None,
            lost_message: None,
            claim: None,
            claim_uid: None,
            holder_identity: self.identity.clone(),
            duration_seconds: None,
        };
        match &*self.phase.borrow() {
            Phase::Waiting { claim } => {
                view.claim = claim.clone();
                view.slot = self.asked_slot;
            }
            Phase::Held {
                token,
                slot,
                claim,
                claim_uid,
                duration,
                deadline,
            } => {
                view.token = Some(*token);
                view.slot = Some(*slot);
                view.claim = Some(claim.clone());
                view.claim_uid = Some(claim_uid.clone());
                view.duration_seconds = Some(duration.as_secs());
                let left = deadline
                    .borrow()
                    .saturating_sub(BootInstant::now().since_boot());
                if left.is_zero() {
                    // Past the local deadline: lost, even if the keeper has not run yet.
                    view.state = GrantState::Lost;
                    view.lost_reason = Some(reason_code(LostReason::LocalDeadline));
                    view.lost_message = Some(LostReason::LocalDeadline.to_string());
                } else {
                    view.state = GrantState::Held;
                    let left = session_left.map_or(left, |s| s.min(left));
                    view.valid_for_ms = left.as_millis() as u64;
                }
            }
            Phase::Lost {
                token,
                slot,
                claim,
                reason,
                message,
            } => {
                view.state = GrantState::Lost;
                view.token = *token;
                view.slot = *slot;
                view.claim = claim.clone();
                view.lost_reason = Some(reason);
                view.lost_message = Some(message.clone());
            }
            Phase::Released { token, slot, claim } => {
                view.state = GrantState::Released;
                view.token = *token;
                view.slot = *slot;
                view.claim = claim.clone();
            }
        }
        view.fence_key = view
            .slot
            .map(|slot| fence_key(&view.namespace, &view.name, slot));
        view
    }
}

/// The `lostReason` codes of the API: the client library's reasons by name, and
/// `AcquireFailed` for an acquire that failed before a grant.
pub fn reason_code(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Revoked => "Revoked",
        LostReason::Expired => "Expired",
        LostReason::Superseded => "Superseded",
        LostReason::LeaseDeleted => "LeaseDeleted",
        LostReason::ClaimDeleted => "ClaimDeleted",
        LostReason::LocalDeadline => "LocalDeadline",
    }
}

pub const ACQUIRE_FAILED: &str = "AcquireFailed";

/// One application process's session.
pub struct Session {
    pub id: String,
    /// The agent's default namespace.
    pub namespace: String,
    pub name: Option<String>,
    pub keepalive: Duration,
    last_seen: Arc<Mutex<Instant>>,
    grants: Mutex<HashMap<GrantKey, Arc<SessionGrant>>>,
    pub events: broadcast::Sender<GrantView>,
    /// Cancelled when the session ends, for whatever reason.
    pub ended: CancellationToken,
    /// Whether its event stream has been opened (there is one at most).
    pub stream_opened: std::sync::atomic::AtomicBool,
}

impl Session {
    pub fn new(id: String, namespace: String, name: Option<String>, keepalive: Duration) -> Self {
        Self {
            id,
            namespace,
            name,
            keepalive,
            last_seen: Arc::new(Mutex::new(Instant::now())),
            grants: Mutex::new(HashMap::new()),
            events: broadcast::channel(256).0,
            ended: CancellationToken::new(),
            stream_opened: Default::default(),
        }
    }

    /// A request named this session: it lives another `keepalive`.
    pub fn seen(&self) {
        *self.last_seen.lock().unwrap() = Instant::now();
    }

    /// When the session ends unless a request names it first.
    pub fn expires_at(&self) -> Instant {
        *self.last_seen.lock().unwrap() + self.keepalive
    }

    pub fn time_left(&self) -> Duration {
        self.expires_at().saturating_duration_since(Instant::now())
    }

    pub fn grant(&self, key: &GrantKey) -> Option<Arc<SessionGrant>> {
        self.grants.lock().unwrap().get(key).cloned()
    }

    pub fn grants(&self) -> Vec<Arc<SessionGrant>> {
        let mut grants: Vec<_> = self.grants.lock().unwrap().values().cloned().collect();
        grants
            .sort_by(|a, b| (&a.key.namespace, &a.key.name).cmp(&(&b.key.namespace, &b.key.name)));
        grants
    }

    pub fn views(&self) -> Vec<GrantView> {
        self.grants().iter().map(|s| s.view()).collect()
    }

    /// Drops a grant that never started (its Lease could not be created).
    pub fn forget(&self, key: &GrantKey) {
        self.grants.lock().unwrap().remove(key);
    }

    /// A new grant for `key`, unless the session holds or waits for it already (then
    /// that grant is returned as the error). A lost or released grant is replaced.
    pub fn insert(
        &self,
        key: GrantKey,
        identity: String,
        asked_slot: Option<i32>,
    ) -> Result<Arc<SessionGrant>, Arc<SessionGrant>> {
        let mut grants = self.grants.lock().unwrap();
        if let Some(existing) = grants.get(&key)
            && existing.phase.borrow().is_live()
        {
            return Err(existing.clone());
        }
        let grant = Arc::new(SessionGrant {
            key: key.clone(),
            identity,
            asked_slot,
            phase: watch::channel(Phase::Waiting { claim: None }).0,
            release: self.ended.child_token(),
            events: self.events.clone(),
            session_expiry: self.last_seen.clone(),
            keepalive: self.keepalive,
        });
        grants.insert(key, grant.clone());
        Ok(grant)
    }
}

/// Holds one grant from acquire to its end: the grant's phase follows it. Lets go
/// (deleting the claim) when the grant's `release` is cancelled.
pub async fn hold(
    leases: LeaseClient,
    request: AcquireRequest,
    grant: Arc<SessionGrant>,
    token_files: Arc<TokenFiles>,
    metrics: Arc<AgentMetrics>,
) {
    let options = AcquireOptions {
        identity: Some(grant.identity.clone()),
        pod: PodBinding::FromEnv,
        timeout: None,
        slot: request.slot,
    };
    let acquired = tokio::select! {
        acquired = leases.acquire(&request.name, options) => acquired,
        // Dropping the acquire deletes its claim (tracked by the client's `flush`).
        () = grant.release.cancelled() => {
            grant.set(Phase::Released { token: None, slot: None, claim: None });
            return;
        }
    };
    let held = match acquired {
        Ok(held) => held,
        Err(e) => {
            let (reason, token) = match &e {
                ClientError::NotGranted { reason, .. } => (reason_code(*reason), None),
                _ => (ACQUIRE_FAILED, None),
            };
            metrics.lost(reason);
            grant.set(Phase::Lost {
                token,
                slot: None,
                claim: None,
                reason,
                message: e.to_string(),
            });
            return;
        }
    };
    let (token, slot, claim) = (held.token(), held.slot(), held.claim_name().to_string());
    token_files.write(&grant.key, token, slot).await;
    metrics.held.inc();
    grant.set(Phase::Held {
        token,
        slot,
        claim: claim.clone(),
        claim_uid: held.claim_uid().to_string(),
        duration: held.lease_duration(),
        deadline: held.local_deadline(),
    });
    tokio::select! {
        reason = held.lost() => {
            token_files.remove(&grant.key, token, slot).await;
            metrics.held.dec();
            metrics.lost(reason_code(reason));
            grant.set(Phase::Lost {
                token: Some(token),
                slot: Some(slot),
                claim: Some(claim),
                reason: reason_code(reason),
                message: reason.to_string(),
            });
            // Dropping `held` deletes its claim.
        }
        () = grant.release.cancelled() => {
            // The token file goes first: from here on nothing in the pod may use it.
            token_files.remove(&grant.key, token, slot).await;
            metrics.held.dec();
            if let Err(e) = held.release().await {
                tracing::warn!(lease = %grant.key.name, error = %e, "releasing: the claim's delete failed; it expires");
            }
            grant.set(Phase::Released { token: Some(token), slot: Some(slot), claim: Some(claim) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(asked_slot: Option<i32>) -> Arc<SessionGrant> {
        let session = Session::new("s".into(), "pay".into(), None, Duration::from_secs(5));
        let key = GrantKey {
            namespace: "pay".into(),
            name: "workers".into(),
        };
        let Ok(grant) = session.insert(key, "w-0".into(), asked_slot) else {
            unreachable!("a new session has no grant")
        };
        grant
    }

    fn held(token: i64, slot: i32) -> Phase {
        let deadline = BootInstant::now().since_boot() + Duration::from_secs(60);
        Phase::Held {
            token,
            slot,
            claim: "c".into(),
            claim_uid: "u".into(),
            duration: Duration::from_secs(15),
            deadline: watch::channel(deadline).1,
        }
    }

    /// The thin clients read `slot` and `fenceKey` with the token, and the slot asked
    /// for while waiting.
    #[test]
    fn a_grant_shows_its_slot_and_that_slots_fence_key() {
        let any = grant(None);
        let json = serde_json::to_value(any.view()).unwrap();
        assert!(
            json.get("slot").is_none() && json.get("fenceKey").is_none(),
            "{json}"
        );
        any.set(held(7, 0));
        let json = serde_json::to_value(any.view()).unwrap();
        assert_eq!(
            (&json["slot"], &json["fenceKey"]),
            (&0.into(), &"pay/workers".into())
        );

        let third = grant(Some(2));
        let json = serde_json::to_value(third.view()).unwrap();
        assert_eq!(json["state"], "waiting");
        assert_eq!(
            (&json["slot"], &json["fenceKey"]),
            (&2.into(), &"pay/workers#2".into())
        );
        third.set(held(9, 2));
        assert_eq!(third.view().slot, Some(2));
        third.set(Phase::Released {
            token: Some(9),
            slot: Some(2),
            claim: Some("c".into()),
        });
        let view = third.view();
        assert_eq!(
            (view.token, view.slot),
            (Some(9), Some(2)),
            "kept once released"
        );
        assert_eq!(view.fence_key.as_deref(), Some("pay/workers#2"));
        for field in ["slot:", "fenceKey:"] {
            assert!(super::super::routes::OPENAPI.contains(field), "{field}");
        }
    }

    /// The Go and Python clients match these strings: they stay the OpenAPI document's.
    #[test]
    fn grant_states_are_the_openapi_documents() {
        let states = [
            GrantState::Waiting,
            GrantState::Held,
            GrantState::Lost,
            GrantState::Released,
        ];
        let names: Vec<String> = states
            .iter()
            .map(|s| {
                serde_json::to_value(s)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["waiting", "held", "lost", "released"]);
        let listed = format!("enum: [{}]", names.join(", "));
        assert!(super::super::routes::OPENAPI.contains(&listed), "{listed}");
    }
}
