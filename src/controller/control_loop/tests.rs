//! The loop with a stand-in API server: what an outcome changes, the retry
//! policies on the work queue's timers, and when claim mirrors are written.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::ResourceExt;

use super::*;
use crate::controller::index::Learned;
use crate::controller::{ControllerConfig, Error, KubeApiServer, Result};
use crate::crd::{Lease, LeaseClaim};

mod outcomes {
    use super::*;
    use crate::crd::LeasePhase;
    use crate::fixtures::LeaseBuilder;

    /// A client for tests that never reach the API server (its calls fail at once).
    fn offline_client() -> Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, tower::BoxError>("offline".into())
        });
        Client::new(service, "default")
    }

    fn outcome(lease_uid: &str, lease: Option<Lease>, lease_gone: bool) -> Outcome {
        Outcome {
            key: LeaseKey::new("ns", "db"),
            pass: Pass::Decision,
            learned: Learned {
                lease_uid: Some(lease_uid.to_string()),
                lease,
                lease_gone,
                ..Learned::default()
            },
            next: Next::AfterError,
            wrote_lease: false,
            mirrors_due: false,
        }
    }

    /// A write's outcome for a deleted Lease must neither overwrite
    /// nor remove the Lease re-created under the same name.
    #[tokio::test]
    async fn an_outcome_applies_only_to_the_lease_object_it_was_computed_for() {
        let config = ControllerConfig {
            namespace: None,
            concurrency: 1,
            instance: "test".into(),
        };
        let metrics = Arc::new(Metrics::default());
        let events = Publisher::spawn(offline_client(), "test", metrics.clone());
        let mut state = Loop::new(
            KubeApiServer::new(offline_client()),
            config,
            metrics,
            events,
        );
        let key = LeaseKey::new("ns", "db");
        let now = Instant::now();
        let old = LeaseBuilder::new("db")
            .uid("uid-old")
            .resource_version(10)
            .phase(LeasePhase::Free)
            .token(10)
            .build();
        let uid = |state: &Loop<KubeApiServer>| {
            state.index.lease(&key).and_then(|l| l.metadata.uid.clone())
        };

        // A write computed for the old Lease is in flight when the watch reports it
        // deleted and re-created; then the write's outcome arrives.
        state.index.apply_lease(old.clone(), now);
        state.index.delete_lease(&old);
        let new = LeaseBuilder::new("db")
            .uid("uid-new")
            .resource_version(20)
            .phase(LeasePhase::Free)
            .token(20)
            .build();
        state.index.apply_lease(new, now);
        state.begin(key.clone(), Pass::Decision);
        let old_written = LeaseBuilder::new("db")
            .uid("uid-old")
            .resource_version(11)
            .phase(LeasePhase::Held)
            .token(11)
            .holder("a", "a", "a")
            .build();
        state.finish(outcome("uid-old", Some(old_written), false), now);
        assert_eq!(uid(&state).as_deref(), Some("uid-new"), "overwritten");
        assert!(
            state
                .index
                .view(&key, now)
                .unwrap()
                .lease
                .unwrap()
                .status
                .as_ref()
                .unwrap()
                .holder
                .is_none()
        );

        // A failed write of the old Lease, whose re-read found no Lease (before the new
        // one was created): the new one stays.
        state.begin(key.clone(), Pass::Decision);
        state.finish(outcome("uid-old", None, true), now);
        assert_eq!(uid(&state).as_deref(), Some("uid-new"), "removed");

        // The outcome of a write to the object the index holds still applies.
        state.begin(key.clone(), Pass::Decision);
        let new_written = LeaseBuilder::new("db")
            .uid("uid-new")
            .resource_version(21)
            .phase(LeasePhase::Held)
            .token(21)
            .holder("b", "b", "b")
            .build();
        state.finish(outcome("uid-new", Some(new_written), false), now);
        assert_eq!(
            state
                .index
                .lease(&key)
                .unwrap()
                .resource_version()
                .as_deref(),
            Some("21")
        );
        state.begin(key.clone(), Pass::Decision);
        state.finish(outcome("uid-new", None, true), now);
        assert_eq!(uid(&state), None);
    }
}

/// The named retry policies, through the loop: a pass whose Lease write fails is
/// decided again at once after a conflict and [`Next::AFTER_ERROR`] later after an
/// error, on the work queue's timers (paused time).
mod retries {
    use std::sync::Mutex;

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    use super::*;
    use crate::controller::grant::ClaimUpdate;
    use crate::controller::metrics::WriteLabels;
    use crate::fixtures::{ClaimBuilder, LeaseBuilder};

    /// Answers reads with its Lease and every Lease write with `refusal`.
    #[derive(Clone)]
    struct Refusing {
        lease: Lease,
        refusal: Arc<Mutex<u16>>,
    }

    fn refused(code: u16) -> Error {
        Error::api("test", crate::kube_error::refusal(code, "test"))
    }

    impl ApiServer for Refusing {
        async fn get_lease(&self, _: &LeaseKey) -> Result<Option<Lease>> {
            Ok(Some(self.lease.clone()))
        }
        async fn get_claim(&self, _: &str, _: &str) -> Result<Option<LeaseClaim>> {
            Ok(None)
        }
        async fn get_pod(&self, _: &str, _: &str) -> Result<Option<Pod>> {
            Ok(None)
        }
        async fn replace_lease_status(&self, _: &LeaseKey, _: &Lease) -> Result<Lease> {
            Err(refused(*self.refusal.lock().unwrap()))
        }
        async fn patch_claim_status(&self, _: &str, _: &ClaimUpdate) -> Result<LeaseClaim> {
            Err(refused(404))
        }
    }

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lease_write_is_retried_at_once_after_a_conflict_and_later_after_an_error() {
        let lease = LeaseBuilder::new("db").uid("L").resource_version(5).build();
        let claim = ClaimBuilder::new("a", "db")
            .uid("u1")
            .resource_version(6)
            .build();
        let refusal = Arc::new(Mutex::new(503));
        let store = Refusing {
            lease: lease.clone(),
            refusal: refusal.clone(),
        };
        let metrics = Arc::new(Metrics::default());
        let (events, _events) = Publisher::detached("test", metrics.clone());
        let config = ControllerConfig {
            namespace: None,
            concurrency: 1,
            instance: "test".into(),
        };
        let mut state = Loop::new(store, config, metrics.clone(), events);
        let ready = Readiness::default();
        let inputs = [
            Input::Lease(Ok(Event::Init)),
            Input::Lease(Ok(Event::InitApply(DeserializeGuard(Ok(lease))))),
            Input::Lease(Ok(Event::InitDone)),
            Input::Claim(Ok(Event::Init)),
            Input::Claim(Ok(Event::InitApply(DeserializeGuard(Ok(claim))))),
            Input::Claim(Ok(Event::InitDone)),
            Input::Pod(Ok(Event::Init)),
            Input::Pod(Ok(Event::InitDone)),
        ];
        for input in inputs {
            state.handle_input(input, &ready, now());
        }
        assert!(state.is_synced() && ready.get());
        let counter = |family: &Family<WriteLabels, Counter>| {
            family.get_or_create(&WriteLabels { kind: "lease" }).get()
        };

        // An error (503): decided again after AFTER_ERROR, not before.
        let pass = state.next_write(now()).expect("a grant to write");
        let outcome = pass.await;
        state.finish(outcome, now());
        assert_eq!(counter(&metrics.write_errors), 1);
        assert!(state.next_write(now()).is_none(), "not at once");
        let start = now();
        assert_eq!(state.expired().await, Some(LeaseKey::new("ns", "db")));
        assert_eq!(now() - start, Next::AFTER_ERROR);
        assert_eq!(Next::AFTER_ERROR, std::time::Duration::from_millis(500));

        // A conflict (409): the Lease is re-read and decided again at once.
        *refusal.lock().unwrap() = 409;
        let pass = state.next_write(now()).expect("decided again");
        state.finish(pass.await, now());
        assert_eq!(counter(&metrics.write_conflicts), 1);
        assert!(state.next_write(now()).is_some(), "at once");
    }
}

/// Under load only the Lease write is urgent. Claim mirrors wait until no
/// Lease is dirty, are decided afresh when written (coalesced: one pass however many
/// grants went before), and never take more than half the write slots.
mod mirrors {
    use super::*;
    use crate::controller::grant::ClaimUpdate;
    use crate::crd::LeasePhase;
    use crate::fixtures::{ClaimBuilder, LeaseBuilder};

    /// Accepts every write, as written.
    #[derive(Clone)]
    struct Accepting;

    impl ApiServer for Accepting {
        async fn get_lease(&self, _: &LeaseKey) -> Result<Option<Lease>> {
            Ok(None)
        }
        async fn get_claim(&self, _: &str, _: &str) -> Result<Option<LeaseClaim>> {
            Ok(None)
        }
        async fn get_pod(&self, _: &str, _: &str) -> Result<Option<Pod>> {
            Ok(None)
        }
        async fn replace_lease_status(&self, _: &LeaseKey, desired: &Lease) -> Result<Lease> {
            let mut written = desired.clone();
            let rv: u64 = written.resource_version().unwrap().parse().unwrap();
            written.metadata.resource_version = Some((rv + 1000).to_string());
            Ok(written)
        }
        async fn patch_claim_status(&self, ns: &str, update: &ClaimUpdate) -> Result<LeaseClaim> {
            let mut claim = ClaimBuilder::new(&update.name, "l")
                .namespace(ns)
                .uid(&update.uid)
                .resource_version(1)
                .created_at(&format!("2026-01-01T00:00:{:02}Z", update.name.len()))
                .build();
            claim.status = Some(update.status.clone());
            Ok(claim)
        }
    }

    fn state(concurrency: usize) -> Loop<Accepting> {
        let metrics = Arc::new(Metrics::default());
        let (events, _) = Publisher::detached("test", metrics.clone());
        let config = ControllerConfig {
            namespace: None,
            concurrency,
            instance: "test".into(),
        };
        Loop::new(Accepting, config, metrics, events)
    }

    #[tokio::test]
    async fn mirrors_wait_for_every_grant_and_are_written_once_from_the_latest_decision() {
        let mut state = state(4);
        let now = Instant::now();
        // "a" gets the Lease; two waiters queue behind it.
        state.index.apply_lease(
            LeaseBuilder::new("a").uid("a").resource_version(10).build(),
            now,
        );
        for name in ["h", "w1", "w2"] {
            let claim = ClaimBuilder::new(name, "a")
                .uid(&format!("u-{name}"))
                .resource_version(1)
                .created_at(&format!("2026-01-01T00:00:{:02}Z", name.len()))
                .build();
            state.index.apply_claim(claim, now);
        }
        let a = LeaseKey::new("ns", "a");
        state.mark_dirty(a.clone(), now);
        let grant = state.next_write(now).unwrap().await;
        assert_eq!((grant.pass, grant.mirrors_due), (Pass::Decision, true));
        assert!(
            grant.learned.written_claims.is_empty(),
            "the grant pass wrote no mirror"
        );

        // Before its outcome is back, another Lease needs a grant.
        state.index.apply_lease(
            LeaseBuilder::new("b").uid("b").resource_version(20).build(),
            now,
        );
        state.index.apply_claim(
            ClaimBuilder::new("x", "b")
                .uid("u-x")
                .resource_version(1)
                .created_at("2026-01-01T00:00:01Z")
                .build(),
            now,
        );
        let b = LeaseKey::new("ns", "b");
        state.mark_dirty(b.clone(), now);
        state.finish(grant, now);
        assert_eq!(state.queue.deferred_len(), 1);
        let next = state.next_write(now).unwrap().await;
        assert_eq!(
            (next.key.clone(), next.pass),
            (b.clone(), Pass::Decision),
            "a dirty Lease goes before deferred mirrors"
        );
        // Nothing dirty now: a's mirrors may go while b's grant is written.
        let mut written = Vec::new();
        let mut record = |outcome: &Outcome| {
            assert_eq!(outcome.pass, Pass::Mirrors);
            written.extend(outcome.learned.written_claims.iter().map(|c| {
                let s = c.status.as_ref().unwrap();
                (c.metadata.name.clone(), s.phase, s.position)
            }));
        };
        let mirrors_a = state.next_write(now).unwrap().await;
        assert_eq!(mirrors_a.key, a);
        record(&mirrors_a);
        assert!(
            state.next_write(now).is_none(),
            "b's mirrors wait for its pass"
        );
        state.finish(mirrors_a, now);
        state.finish(next, now);
        let mirrors_b = state.next_write(now).unwrap().await;
        assert_eq!(mirrors_b.key, b);
        record(&mirrors_b);
        state.finish(mirrors_b, now);
        written.sort_by(|x, y| x.0.cmp(&y.0));
        use crate::crd::ClaimPhase::{Granted, Pending};
        assert_eq!(
            written,
            [
                (Some("h".into()), Some(Granted), None),
                (Some("w1".into()), Some(Pending), Some(1)),
                (Some("w2".into()), Some(Pending), Some(2)),
                (Some("x".into()), Some(Granted), None),
            ]
        );
        assert_eq!(state.queue.deferred_len(), 0);
        assert!(state.next_write(now).is_none(), "settled: nothing to write");
    }

    /// The queue gauges show the Leases' queues as the loop decides and writes them.
    #[tokio::test]
    async fn the_queue_gauges_follow_the_written_lease_statuses() {
        let mut state = state(4);
        let now = Instant::now();
        let gauges = |state: &Loop<Accepting>| {
            let m = &state.metrics;
            (m.claims_waiting.get(), m.longest_queue.get())
        };
        let claim = |name: &str, lease: &str| {
            ClaimBuilder::new(name, lease)
                .uid(&format!("u-{name}"))
                .resource_version(1)
                .created_at(&format!("2026-01-01T00:00:{:02}Z", name.len()))
                .build()
        };
        let grant = async |state: &mut Loop<Accepting>, lease: &str| {
            state.mark_dirty(LeaseKey::new("ns", lease), now);
            let outcome = state.next_write(now).unwrap().await;
            assert!(outcome.wrote_lease);
            state.finish(outcome, now);
        };
        for (lease, claims) in [("a", &["h", "w1", "w2"][..]), ("b", &["x", "yy"][..])] {
            let built = LeaseBuilder::new(lease).uid(lease).resource_version(10);
            state.index.apply_lease(built.build(), now);
            for name in claims {
                state.index.apply_claim(claim(name, lease), now);
            }
        }
        assert_eq!(gauges(&state), (0, 0), "nothing decided yet");
        grant(&mut state, "a").await;
        assert_eq!(gauges(&state), (2, 2));
        grant(&mut state, "b").await;
        assert_eq!(gauges(&state), (3, 2));
        // a's holder leaves: w1 takes over, w2 still waits.
        let mut gone = claim("h", "a");
        gone.metadata.uid = Some("u-h".into());
        state.index.delete_claim(&gone);
        grant(&mut state, "a").await;
        assert_eq!(gauges(&state), (2, 1));
    }

    #[tokio::test]
    async fn mirrors_take_at_most_half_the_write_slots() {
        let mut state = state(4);
        let now = Instant::now();
        for i in 0..5 {
            let name = format!("l{i}");
            state.index.apply_lease(
                LeaseBuilder::new(&name)
                    .uid(&name)
                    .resource_version(10 + i)
                    .build(),
                now,
            );
            for claim in [format!("h{i}"), format!("w{i}")] {
                let claim = ClaimBuilder::new(&claim, &name)
                    .uid(&format!("u-{claim}"))
                    .resource_version(1)
                    .created_at(&format!("2026-01-01T00:00:{:02}Z", claim.len()))
                    .build();
                state.index.apply_claim(claim, now);
            }
            state.mark_dirty(LeaseKey::new("ns", name.as_str()), now);
        }
        let mut grants = Vec::new();
        while let Some(pass) = state.next_write(now) {
            grants.push(pass.await);
        }
        assert_eq!(grants.len(), 5, "decisions are not limited by mirror slots");
        for outcome in grants {
            state.finish(outcome, now);
        }
        let mut mirrors = Vec::new();
        while let Some(pass) = state.next_write(now) {
            mirrors.push(pass.await);
        }
        assert_eq!(mirrors.len(), 2, "2 of 4 slots");
        assert!(!state.has_urgent_work());
        // A grant that comes up now is not held back by the mirrors in flight.
        state.index.apply_lease(
            LeaseBuilder::new("late")
                .uid("late")
                .resource_version(99)
                .build(),
            now,
        );
        state.index.apply_claim(
            ClaimBuilder::new("z", "late")
                .uid("u-z")
                .resource_version(1)
                .created_at("2026-01-01T00:00:01Z")
                .build(),
            now,
        );
        state.mark_dirty(LeaseKey::new("ns", "late"), now);
        assert!(state.has_urgent_work());
        let late = state.next_write(now).unwrap().await;
        assert_eq!(
            (late.key, late.pass),
            (LeaseKey::new("ns", "late"), Pass::Decision)
        );
    }

    /// Leadership that changes more often than once per lease duration (a replica that
    /// misses its renew deadline and takes its own record back) must not postpone a
    /// silent holder's expiry: a standby's clocks are its own observations, and an
    /// ending is confirmed by a read and a mark conditioned on the claim it saw.
    #[tokio::test]
    async fn taking_leadership_again_and_again_does_not_postpone_an_expiry() {
        let mut state = state(1);
        let seen = Instant::now();
        let held = LeaseBuilder::new("a")
            .uid("a")
            .resource_version(10)
            .phase(LeasePhase::Held)
            .token(11)
            .grants(1)
            .holder("h", "u-h", "h")
            .granted_with(15)
            .build();
        state.index.apply_lease(held, seen);
        state.index.apply_claim(
            ClaimBuilder::new("h", "a")
                .uid("u-h")
                .resource_version(1)
                .created_at("2026-01-01T00:00:01Z")
                .build(),
            seen,
        );
        let key = LeaseKey::new("ns", "a");
        let deadline = |state: &Loop<Accepting>, now| {
            state
                .index
                .view(&key, now)
                .unwrap()
                .holders
                .first()
                .and_then(|h| h.deadline)
        };
        let first = deadline(&state, seen).expect("the holder has a deadline");
        assert_eq!(first, seen + std::time::Duration::from_secs(15));
        // Leadership changes every half second for a whole lease duration and more.
        for flap in 1..=40u64 {
            let now = seen + std::time::Duration::from_millis(500 * flap);
            state.take_leadership(now);
            assert_eq!(
                deadline(&state, now),
                Some(first),
                "take-over {flap} moved the silent holder's expiry"
            );
        }
    }
}
