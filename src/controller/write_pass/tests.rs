//! Each step of a write pass on its own, against a scripted API server: what it
//! calls, what it learns, and which [`Next`] it ends the pass with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::*;
use crate::controller::Error;
use crate::crd::{LeaseClaim, LeaseClaimStatus};
use crate::fixtures::{ClaimBuilder, LeaseBuilder, NS, PodBuilder};

/// Answers reads with what it holds and writes by echoing them one version on,
/// unless a refusal (an HTTP code) is scripted for the object; logs every call.
#[derive(Clone, Default)]
struct Scripted {
    lease: Option<Lease>,
    claims: HashMap<String, LeaseClaim>,
    pods: HashMap<String, Pod>,
    refusals: HashMap<String, u16>,
    calls: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    fn log(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn refusal(&self, name: &str) -> Result<()> {
        match self.refusals.get(name) {
            Some(code) => Err(Error::api(
                "test",
                crate::kube_error::refusal(*code, "scripted"),
            )),
            None => Ok(()),
        }
    }
}

impl ApiServer for Scripted {
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<Lease>> {
        self.log(format!("get lease {}", key.name));
        self.refusal("get lease")?;
        Ok(self.lease.clone())
    }

    async fn get_claim(&self, _: &str, name: &str) -> Result<Option<LeaseClaim>> {
        self.log(format!("get claim {name}"));
        Ok(self.claims.get(name).cloned())
    }

    async fn get_pod(&self, _: &str, name: &str) -> Result<Option<Pod>> {
        self.log(format!("get pod {name}"));
        self.refusal(&format!("pod {name}"))?;
        Ok(self.pods.get(name).cloned())
    }

    async fn replace_lease_status(&self, key: &LeaseKey, desired: &Lease) -> Result<Lease> {
        self.log(format!("write lease {}", key.name));
        self.refusal("lease")?;
        Ok(desired.clone())
    }

    async fn patch_claim_status(&self, _: &str, update: &ClaimUpdate) -> Result<LeaseClaim> {
        self.log(format!("write claim {}", update.name));
        self.refusal(&update.name)?;
        let mut claim = ClaimBuilder::new(&update.name, "db")
            .uid(&update.uid)
            .build();
        claim.status = Some(update.status.clone());
        Ok(claim)
    }
}

fn pass(api: &Scripted) -> WritePass<Scripted> {
    let metrics = Arc::new(Metrics::default());
    let (events, _) = Publisher::detached("test", metrics.clone());
    WritePass {
        api: api.clone(),
        key: LeaseKey::new(NS, "db"),
        metrics,
        events,
    }
}

fn lease(rv: u64) -> Lease {
    LeaseBuilder::new("db")
        .uid("L")
        .resource_version(rv)
        .build()
}

fn update(name: &str, condition_on: Option<&str>) -> ClaimUpdate {
    ClaimUpdate {
        name: name.into(),
        uid: format!("uid-{name}"),
        status: LeaseClaimStatus::default(),
        condition_on: condition_on.map(Into::into),
    }
}

#[tokio::test]
async fn confirm_goes_on_when_every_check_holds_and_keeps_what_refuted_one() {
    let mut api = Scripted::default();
    let checks = [Check::ClaimGone {
        name: "a".into(),
        uid: "uid-a".into(),
    }];
    let mut learned = Learned::default();
    let confirmed = pass(&api).confirm(None, &checks, &mut learned).await;
    assert_eq!(confirmed, Ok(()), "the claim is gone: the ending holds");

    let claim = ClaimBuilder::new("a", "db").uid("uid-a").build();
    api.claims.insert("a".into(), claim);
    api.pods.insert(
        "p".into(),
        PodBuilder::new("p").uid("uid-p").phase("Running").build(),
    );
    let checks = [
        Check::ClaimGone {
            name: "a".into(),
            uid: "uid-a".into(),
        },
        Check::PodGone {
            name: "p".into(),
            uid: Some("uid-p".into()),
        },
    ];
    let mut learned = Learned::default();
    let refuted = pass(&api).confirm(None, &checks, &mut learned).await;
    assert_eq!(refuted, Err(Next::Refuted));
    assert_eq!(learned.read_claims.len(), 1, "the claim as read");
    assert_eq!(learned.read_pods[0].name_any(), "p", "the pod as read");
}

#[tokio::test]
async fn confirm_decides_again_at_once_when_the_lease_moved_on_and_later_when_a_read_fails() {
    let api = Scripted {
        lease: Some(lease(7)),
        ..Scripted::default()
    };
    let mut learned = Learned::default();
    let checks = [Check::LeaseUnchanged];
    let moved = pass(&api)
        .confirm(Some(&lease(5)), &checks, &mut learned)
        .await;
    assert_eq!(moved, Err(Next::Now));
    assert_eq!(learned.lease, Some(lease(7)), "the Lease as read");

    let mut learned = Learned::default();
    let unchanged = pass(&api)
        .confirm(Some(&lease(7)), &checks, &mut learned)
        .await;
    assert_eq!(unchanged, Ok(()));

    let failing = Scripted {
        refusals: HashMap::from([("get lease".into(), 503)]),
        ..api
    };
    let failed = pass(&failing)
        .confirm(Some(&lease(7)), &checks, &mut Learned::default())
        .await;
    assert_eq!(failed, Err(Next::AfterError));
}

#[tokio::test]
async fn ending_the_holder_goes_on_if_written_or_gone_and_stops_if_the_claim_changed() {
    let mark = update("a", Some("6"));
    let mut api = Scripted::default();
    let mut learned = Learned::default();
    assert_eq!(pass(&api).end_holder(&mark, &mut learned).await, Ok(()));
    assert_eq!(learned.written_claims.len(), 1, "the mark as written");

    api.refusals.insert("a".into(), 404);
    let gone = pass(&api).end_holder(&mark, &mut Learned::default()).await;
    assert_eq!(gone, Ok(()), "a deleted claim ends its grant all the same");

    // A renewal landed since the decision: the conditional write fails (422).
    api.refusals.insert("a".into(), 422);
    api.claims.insert(
        "a".into(),
        ClaimBuilder::new("a", "db")
            .uid("uid-a")
            .resource_version(8)
            .build(),
    );
    let mut learned = Learned::default();
    let renewed = pass(&api).end_holder(&mark, &mut learned).await;
    assert_eq!(renewed, Err(Next::Refuted));
    assert_eq!(learned.read_claims.len(), 1, "the renewed claim as read");

    api.refusals.insert("a".into(), 500);
    let failed = pass(&api).end_holder(&mark, &mut Learned::default()).await;
    assert_eq!(failed, Err(Next::AfterError));
}

#[tokio::test]
async fn a_mark_refused_while_the_claim_is_unchanged_is_an_error_not_a_renewal() {
    // An admission policy refuses the controller's write (422): the claim still has
    // the resourceVersion the mark was conditioned on, so nothing renewed it.
    let mark = update("a", Some("6"));
    let mut api = Scripted::default();
    api.refusals.insert("a".into(), 422);
    api.claims.insert(
        "a".into(),
        ClaimBuilder::new("a", "db")
            .uid("uid-a")
            .resource_version(6)
            .build(),
    );
    let mut learned = Learned::default();
    let refused = pass(&api).end_holder(&mark, &mut learned).await;
    assert_eq!(refused, Err(Next::AfterError));
    assert!(learned.read_claims.is_empty(), "{:?}", learned.read_claims);
}

#[tokio::test]
async fn a_refused_lease_write_reads_the_lease_again() {
    let mut api = Scripted {
        lease: Some(lease(9)),
        refusals: HashMap::from([("lease".into(), 409)]),
        ..Scripted::default()
    };
    let status = LeaseStatus::default();
    let mut learned = Learned::default();
    let conflict = pass(&api)
        .write_lease(&lease(5), &status, &mut learned)
        .await;
    assert_eq!(conflict, Err(Next::Now));
    assert_eq!(learned.lease, Some(lease(9)), "re-read after the conflict");
    assert_eq!(api.calls(), ["write lease db", "get lease db"]);

    api.refusals.insert("lease".into(), 500);
    let failed = pass(&api)
        .write_lease(&lease(5), &status, &mut Learned::default())
        .await;
    assert_eq!(failed, Err(Next::AfterError));
}

#[tokio::test]
async fn every_mirror_is_tried_and_one_failure_retries_the_pass_later() {
    let api = Scripted {
        refusals: HashMap::from([("b".into(), 404), ("c".into(), 500)]),
        ..Scripted::default()
    };
    let mirrors = [update("a", None), update("b", None), update("c", None)];
    let mut learned = Learned::default();
    let step = pass(&api).write_mirrors(&mirrors, &mut learned).await;
    assert_eq!(step, Err(Next::AfterError), "c failed");
    let written: Vec<String> = learned
        .written_claims
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(written, ["a"], "b is gone: its own watch event re-decides");
    assert_eq!(api.calls().len(), 3);
}

#[tokio::test]
async fn a_decision_pass_runs_its_steps_in_order_and_leaves_the_mirrors_to_their_own_pass() {
    let api = Scripted::default();
    let decision = Decision {
        confirm: vec![Check::ClaimGone {
            name: "a".into(),
            uid: "uid-a".into(),
        }],
        end_holder: vec![update("a", Some("6"))],
        lease_status: Some(LeaseStatus::default()),
        mirrors: vec![update("b", None)],
        ..Decision::default()
    };
    let now = Instant::now();
    let outcome = pass(&api)
        .write(Some(lease(5)), decision.clone(), now, Pass::Decision)
        .await;
    assert_eq!(
        api.calls(),
        ["get claim a", "write claim a", "write lease db"]
    );
    assert_eq!(outcome.next, Next::AtDeadline);
    assert!(outcome.wrote_lease && outcome.mirrors_due);

    let api = Scripted::default();
    let outcome = pass(&api)
        .write(Some(lease(5)), decision, now, Pass::Mirrors)
        .await;
    assert_eq!(api.calls(), ["get claim a", "write claim b"]);
    assert!(!outcome.wrote_lease && !outcome.mirrors_due);
}
