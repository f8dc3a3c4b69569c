//! The chart's object-fencing admission policies (DESIGN rule 6) against the real API
//! server: fenced objects refuse missing, malformed and stale tokens, also against the
//! token the Lease has published since; deletes, re-creates, writes that leave the token
//! untouched, changes of the label's value and subresource writes of fenced kinds are
//! refused; removing the label is judged against the Lease it named; a namespace with
//! fenced objects can still be deleted.
//!
//! The policy bindings are limited to the test's namespaces (`policies.namespaceSelector`),
//! so tests running at the same time never see each other's policies.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use palisade::crd::Lease;
use serde_json::json;
use support::admission::until_rejected;
use support::claims::create_lease;
use support::helm::Release;
use support::tools::{kubectl, text};
use support::{TestNamespace, WAIT, api_error, setup};

/// What a fenced write changes besides the token: ConfigMap `data`, Secret `stringData`.
trait Payload {
    const FIELD: &'static str;
}
impl Payload for ConfigMap {
    const FIELD: &'static str = "data";
}
impl Payload for Secret {
    const FIELD: &'static str = "stringData";
}

/// A value never used before in this test process, for `palisade.dev/write-id`.
fn next_write_id() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    n.to_string()
}

/// Sets (or with None removes) the token annotation, sets a new `palisade.dev/write-id`
/// and changes the data: a real write, as a merge patch (no resourceVersion precondition:
/// only the token decides).
async fn write_with_token<K>(
    api: &Api<K>,
    name: &str,
    token: Option<&str>,
) -> Result<K, kube::Error>
where
    K: kube::Resource + Payload + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let n = next_write_id();
    let patch = json!({
        "metadata": {"annotations": {"palisade.dev/fencing-token": token,
                                     "palisade.dev/write-id": n}},
        K::FIELD: {"n": n},
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

#[tokio::test]
async fn fenced_objects_refuse_missing_malformed_and_stale_tokens() {
    let ns = setup("helm-fencing").await;
    let _release = Release::install(
        &ns,
        &[&ns.name],
        &[
            "--set-json",
            r#"policies.fencing.resources=[{"apiGroups":[""],"apiVersions":["v1"],"resources":["secrets"]}]"#,
        ],
    );
    let cms = ns.api::<ConfigMap>();
    let pp = PostParams::default();
    let (cms_ref, pp_ref) = (&cms, &pp);
    let fenced = |name: &str, token: Option<&str>| -> ConfigMap {
        let mut cm = json!({
            "metadata": {"name": name, "labels": {"palisade.dev/fenced-by": "billing-cron"}},
            "data": {"n": "0"}
        });
        if let Some(t) = token {
            cm["metadata"]["annotations"] = json!({"palisade.dev/fencing-token": t});
        }
        serde_json::from_value(cm).unwrap()
    };

    // CREATE of a fenced object needs a token (the first expectation waits for the binding).
    let e = until_rejected(
        "creating a fenced ConfigMap without a token",
        "palisade.dev/fencing-token",
        move || {
            let cm = fenced("billing-config", None);
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, "billing-config").await },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("ConfigMap")
            && e.message.contains("billing-config")
            && e.message.contains("fenced by Lease billing-cron")
            && e.message.contains("must carry"),
        "{e:?}"
    );
    let e = api_error(
        cms.create(&pp, &fenced("billing-config", Some("soon")))
            .await,
    );
    assert!(e.message.contains("non-negative integer"), "{e:?}");
    cms.create(&pp, &fenced("billing-config", Some("12")))
        .await
        .expect("create with a well-formed token");

    // The holder with token 34 writes; a paused holder with 33 wakes up and is refused.
    write_with_token(&cms, "billing-config", Some("34"))
        .await
        .expect("token 34 is above 12");
    write_with_token(&cms, "billing-config", Some("34"))
        .await
        .expect("the same holder writes again with its token");
    let e = api_error(write_with_token(&cms, "billing-config", Some("33")).await);
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message
            .contains("stale fencing token 33 is lower than the current token 34"),
        "{e:?}"
    );

    // Missing and malformed tokens are refused; the object keeps token 34.
    let e = api_error(write_with_token(&cms, "billing-config", None).await);
    assert!(e.message.contains("must carry"), "{e:?}");
    for bad in [
        "",
        "-1",
        "+35",
        " 35",
        "35 ",
        "3.5e1",
        "0x23",
        "thirty-five",
        "١٢٣",
        "9223372036854775808",
        "99999999999999999999999999999999999999999999999999",
    ] {
        let e = api_error(write_with_token(&cms, "billing-config", Some(bad)).await);
        assert!(
            e.message.contains("must be a non-negative integer"),
            "token {bad:?}: {e:?}"
        );
    }
    // The largest accepted token: 18 digits, so int() cannot overflow.
    write_with_token(&cms, "billing-config", Some("999999999999999999"))
        .await
        .expect("an 18-digit token");
    let e = api_error(write_with_token(&cms, "billing-config", Some("1000000000000000000")).await);
    assert!(e.message.contains("at most 18 digits"), "{e:?}");
    let current = cms.get("billing-config").await.unwrap();
    assert_eq!(
        current
            .annotations()
            .get("palisade.dev/fencing-token")
            .map(String::as_str),
        Some("999999999999999999")
    );

    // Taking an object out of fencing is itself a fenced write.
    let unlabel = |token: &str| {
        Patch::Merge(json!({"metadata": {
            "labels": {"palisade.dev/fenced-by": null},
            "annotations": {"palisade.dev/fencing-token": token,
                            "palisade.dev/write-id": next_write_id()}
        }}))
    };
    let e = api_error(
        cms.patch("billing-config", &PatchParams::default(), &unlabel("35"))
            .await,
    );
    assert!(e.message.contains("stale fencing token 35"), "{e:?}");
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &unlabel("999999999999999999"),
    )
    .await
    .expect("the current holder may remove the label");
    write_with_token(&cms, "billing-config", None)
        .await
        .expect("no longer fenced");

    // Unlabelled objects are untouched.
    let plain: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "plain"}, "data": {"n": "0"}})).unwrap();
    cms.create(&pp, &plain).await.unwrap();
    for t in [Some("34"), Some("33"), Some("junk"), None] {
        write_with_token(&cms, "plain", t)
            .await
            .unwrap_or_else(|e| panic!("unlabelled ConfigMap with token {t:?}: {e}"));
    }

    // Kinds from values: here Secrets.
    let secrets = ns.api::<Secret>();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-password", "labels": {"palisade.dev/fenced-by": "billing-cron"},
                     "annotations": {"palisade.dev/fencing-token": "40"}},
        "stringData": {"n": "0"}
    }))
    .unwrap();
    secrets.create(&pp, &secret).await.expect("fenced Secret");
    write_with_token(&secrets, "db-password", Some("41"))
        .await
        .expect("a higher token");
    let e = api_error(write_with_token(&secrets, "db-password", Some("40")).await);
    assert!(
        e.message.contains("Secret")
            && e.message
                .contains("stale fencing token 40 is lower than the current token 41"),
        "{e:?}"
    );
}

// --- object fencing against the Lease's published token (DESIGN: object fencing policy) ----

/// A fenced ConfigMap: label `palisade.dev/fenced-by: lease`, token annotation `token`.
fn fenced_cm(name: &str, lease: &str, token: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"palisade.dev/fenced-by": lease},
                     "annotations": {"palisade.dev/fencing-token": token,
                                     "palisade.dev/write-id": next_write_id()}},
        "data": {"n": "0", "token": token}
    }))
    .unwrap()
}

/// The one way to delete a fenced object: remove the label in a write that carries a
/// token above any test token, then delete. Errors are ignored (used to undo).
async fn unfence_and_delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let unlabel = Patch::Merge(json!({"metadata": {
        "labels": {"palisade.dev/fenced-by": null},
        "annotations": {"palisade.dev/fencing-token": "999999999999999999",
                        "palisade.dev/write-id": next_write_id()}
    }}));
    let _ = api.patch(name, &PatchParams::default(), &unlabel).await;
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// Publishes `token` as the Lease's status.fencingToken, as the controller does on a grant
/// (no controller runs in these tests: the status is what the policy reads).
async fn publish_token(ns: &TestNamespace, lease: &str, token: i64) {
    ns.api::<Lease>()
        .patch_status(
            lease,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"fencingToken": token, "phase": "Held"}})),
        )
        .await
        .unwrap_or_else(|e| panic!("publishing token {token} on Lease {lease}: {e}"));
}

fn token_of(cm: &ConfigMap) -> Option<String> {
    cm.annotations().get("palisade.dev/fencing-token").cloned()
}

#[tokio::test]
async fn a_stale_holder_cannot_rewrite_a_fenced_object_by_deleting_and_recreating_it() {
    let ns = setup("helm-recreate").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron", 600).await;
    publish_token(&ns, "billing-cron", 34).await;
    let cms = ns.api::<ConfigMap>();
    let pp = PostParams::default();
    let (cms_ref, pp_ref) = (&cms, &pp);

    // Creating the object needs a token at least the Lease's published one.
    let e = until_rejected(
        "creating a fenced ConfigMap with token 33 while Lease billing-cron has published 34",
        "has granted since",
        move || {
            let cm = fenced_cm("billing-config", "billing-cron", "33");
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, "billing-config").await },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("ConfigMap")
            && e.message.contains("billing-config")
            && e.message.contains(
                "stale fencing token 33 is lower than the token 34 that Lease billing-cron has granted since"
            ),
        "{e:?}"
    );
    cms.create(&pp, &fenced_cm("billing-config", "billing-cron", "34"))
        .await
        .expect("the holder of token 34 creates the object");

    // The holder of 33 wakes up: it cannot delete the object, ...
    let e = api_error(cms.delete("billing-config", &DeleteParams::default()).await);
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("billing-config")
            && e.message.contains("a delete cannot carry a fencing token"),
        "{e:?}"
    );
    // ... nor replace it (kubectl replace --force deletes, then creates).
    let manifest =
        serde_json::to_string(&fenced_cm("billing-config", "billing-cron", "33")).unwrap();
    let out = kubectl(
        &["replace", "--force", "--namespace", &ns.name, "-f", "-"],
        Some(&manifest),
    );
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr)
                .contains("a delete cannot carry a fencing token"),
        "kubectl replace --force by a stale holder must be refused:\n{}",
        text(&out)
    );
    let kept = cms.get("billing-config").await.unwrap();
    assert_eq!(token_of(&kept).as_deref(), Some("34"), "{kept:?}");

    // The next holder (35) deletes it the fenced way: the label goes first, with its token.
    publish_token(&ns, "billing-cron", 35).await;
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "labels": {"palisade.dev/fenced-by": null},
            "annotations": {"palisade.dev/fencing-token": "35", "palisade.dev/write-id": next_write_id()}
        }})),
    )
    .await
    .expect("the holder of 35 takes the object out of fencing");
    cms.delete("billing-config", &DeleteParams::default())
        .await
        .expect("an unfenced object can be deleted");

    // Now the holder of 34 re-creates it with its old token (kubectl apply, or a create):
    // refused, since the Lease has published 35 (the policy's view of the Lease may lag a moment).
    let e = until_rejected(
        "re-creating the deleted fenced ConfigMap with token 34 after Lease billing-cron published 35",
        "has granted since",
        move || {
            let cm = fenced_cm("billing-config", "billing-cron", "34");
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, "billing-config").await },
    )
    .await;
    assert!(
        e.message
            .contains("stale fencing token 34 is lower than the token 35"),
        "{e:?}"
    );
    let manifest =
        serde_json::to_string(&fenced_cm("billing-config", "billing-cron", "34")).unwrap();
    let out = kubectl(
        &["apply", "--namespace", &ns.name, "-f", "-"],
        Some(&manifest),
    );
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("stale fencing token 34"),
        "kubectl apply by a stale holder must be refused:\n{}",
        text(&out)
    );
    assert!(cms.get_opt("billing-config").await.unwrap().is_none());
    cms.create(&pp, &fenced_cm("billing-config", "billing-cron", "35"))
        .await
        .expect("the holder of 35 re-creates it");

    // A label naming no existing Lease: the write is judged by the object's own token.
    cms.create(&pp, &fenced_cm("orphan", "no-such-lease", "1"))
        .await
        .expect("fenced by a Lease that does not exist: a well-formed token suffices");
    let e = api_error(write_with_token(&cms, "orphan", Some("0")).await);
    assert!(
        e.message
            .contains("stale fencing token 0 is lower than the current token 1"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_namespace_with_fenced_objects_can_still_be_deleted() {
    let ns = setup("helm-ns-delete").await;
    let doomed = TestNamespace::new("helm-ns-doomed").await;
    let _release = Release::install(&ns, &[&ns.name, &doomed.name], &[]);
    let cms = doomed.api::<ConfigMap>();
    let cms_ref = &cms;
    until_rejected(
        "deleting a fenced ConfigMap",
        "a delete cannot carry a fencing token",
        move || async move {
            let _ = cms_ref
                .create(
                    &PostParams::default(),
                    &fenced_cm("doomed", "billing-cron", "1"),
                )
                .await;
            cms_ref.delete("doomed", &DeleteParams::default()).await
        },
        || async {},
    )
    .await;
    cms.get("doomed")
        .await
        .expect("the fenced ConfigMap is still there");
    // The namespace controller's deletes happen while the namespace is terminating: allowed.
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    namespaces
        .delete(&doomed.name, &DeleteParams::background())
        .await
        .unwrap();
    support::wait_for_within(
        namespaces,
        &doomed.name,
        "the namespace with a fenced ConfigMap to be deleted",
        Duration::from_secs(60),
        |n| n.is_none(),
    )
    .await;
}

#[tokio::test]
async fn a_write_that_leaves_the_token_untouched_is_refused() {
    let ns = setup("helm-untouched").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron", 600).await;
    publish_token(&ns, "billing-cron", 34).await;
    let cms = ns.api::<ConfigMap>();
    let pp = PostParams::default();
    cms.create(&pp, &fenced_cm("billing-config", "billing-cron", "34"))
        .await
        .expect("the holder of 34 creates the object");
    let cms_ref = &cms;
    let untouched = |what: &str| Patch::Merge(json!({"data": {"n": what.to_string()}}));

    // A write that changes only the data (a merge patch without the annotations, as a
    // writer that forgot its token sends it) would inherit token 34: refused.
    let e = until_rejected(
        "a data-only patch of a fenced ConfigMap",
        "carries no fencing token",
        move || async move {
            cms_ref
                .patch(
                    "billing-config",
                    &PatchParams::default(),
                    &untouched("stale"),
                )
                .await
        },
        || async {},
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("billing-config")
            && e.message.contains("fenced by Lease billing-cron")
            && e.message.contains("palisade.dev/write-id"),
        "{e:?}"
    );
    // So is a label edit that carries no token.
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "payments"}}})),
        )
        .await,
    );
    assert!(e.message.contains("carries no fencing token"), "{e:?}");

    // The holder writes again and again with its token and a new write id each time.
    for _ in 0..3 {
        write_with_token(&cms, "billing-config", Some("34"))
            .await
            .expect("the holder of 34 writes again with a new write id");
    }
    // Replaying its last write (same token, same write id) is refused too.
    let last = cms.get("billing-config").await.unwrap();
    let replay = Patch::Merge(json!({"metadata": {"annotations": {
        "palisade.dev/fencing-token": "34",
        "palisade.dev/write-id": last.annotations()["palisade.dev/write-id"].clone()
    }}, "data": {"n": "replayed"}}));
    let e = api_error(
        cms.patch("billing-config", &PatchParams::default(), &replay)
            .await,
    );
    assert!(e.message.contains("carries no fencing token"), "{e:?}");

    // A new grant (35) is published and its holder has not written yet: the holder of 34 is
    // refused even with its token and a new write id.
    publish_token(&ns, "billing-cron", 35).await;
    let e = until_rejected(
        "a write with token 34 after Lease billing-cron published 35",
        "has granted since",
        move || async move { write_with_token(cms_ref, "billing-config", Some("34")).await },
        || async {},
    )
    .await;
    assert!(
        e.message
            .contains("stale fencing token 34 is lower than the token 35 that Lease billing-cron"),
        "{e:?}"
    );
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &untouched("stale"),
        )
        .await,
    );
    // Both policies refuse it; which one answers first is the API server's choice.
    assert!(
        e.message.contains("carries no fencing token")
            || e.message
                .contains("stale fencing token 34 is lower than the token 35"),
        "{e:?}"
    );

    // The new holder writes; a write without a token is still refused, though it would now
    // inherit the current token.
    write_with_token(&cms, "billing-config", Some("35"))
        .await
        .expect("the holder of 35 writes");
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &untouched("stale"),
        )
        .await,
    );
    assert!(e.message.contains("carries no fencing token"), "{e:?}");
    let now = cms.get("billing-config").await.unwrap();
    assert_eq!(token_of(&now).as_deref(), Some("35"));
    assert_ne!(now.data.unwrap()["n"], "stale");
}

// --- the label: one Lease for the object's life (DESIGN: object fencing policy) -----------

/// A write with `token` and a new write id that sets the label `palisade.dev/fenced-by` to
/// `lease` (None: removes it) and the data `n` to `data`, in one merge patch.
fn relabel(lease: Option<&str>, token: &str, data: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({
        "metadata": {"labels": {"palisade.dev/fenced-by": lease},
                     "annotations": {"palisade.dev/fencing-token": token,
                                     "palisade.dev/write-id": next_write_id()}},
        "data": {"n": data}
    }))
}

fn label_of(cm: &ConfigMap) -> Option<String> {
    cm.labels().get("palisade.dev/fenced-by").cloned()
}

/// Waits until both policies are enforced in the namespace of `cms` (a new binding takes a
/// moment): a create with a token below the Lease's published `published`, and a create
/// without a token, are refused. Then creates the object with token `published`.
async fn create_once_enforced(cms: &Api<ConfigMap>, name: &str, lease: &str, published: i64) {
    let pp = PostParams::default();
    let (cms_ref, pp_ref) = (cms, &pp);
    let stale = (published - 1).to_string();
    let stale_ref = stale.as_str();
    until_rejected(
        &format!(
            "creating {name} with token {stale} while Lease {lease} has published {published}"
        ),
        "has granted since",
        move || {
            let cm = fenced_cm(name, lease, stale_ref);
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, name).await },
    )
    .await;
    until_rejected(
        &format!("creating {name} without a token"),
        "must carry",
        move || {
            let mut cm = fenced_cm(name, lease, "0");
            cm.metadata.annotations = None;
            async move { cms_ref.create(pp_ref, &cm).await }
        },
        move || async move { unfence_and_delete(cms_ref, name).await },
    )
    .await;
    cms.create(&pp, &fenced_cm(name, lease, &published.to_string()))
        .await
        .unwrap_or_else(|e| panic!("the holder of {published} creates {name}: {e}"));
}

#[tokio::test]
async fn a_stale_holder_cannot_move_a_fenced_object_to_another_lease() {
    let ns = setup("helm-relabel").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron", 600).await;
    publish_token(&ns, "billing-cron", 34).await;
    create_lease(&ns, "reports", 600).await;
    publish_token(&ns, "reports", 3).await;
    let cms = ns.api::<ConfigMap>();
    create_once_enforced(&cms, "billing-config", "billing-cron", 34).await;
    let cms_ref = &cms;

    // A new grant (35) is published and its holder has not written yet. The holder of 34
    // wakes up: a plain write is refused (the policy's view of the Lease may lag a moment).
    publish_token(&ns, "billing-cron", 35).await;
    until_rejected(
        "a write with token 34 after Lease billing-cron published 35",
        "has granted since",
        move || async move { write_with_token(cms_ref, "billing-config", Some("34")).await },
        || async {},
    )
    .await;
    // So it names another Lease in the same write as its stale data: one with a lower
    // token, one that does not exist, an empty name. Each is refused.
    for other in ["reports", "no-such-lease", ""] {
        let e = api_error(
            cms.patch(
                "billing-config",
                &PatchParams::default(),
                &relabel(Some(other), "34", "stale"),
            )
            .await,
        );
        assert_eq!(e.code, 403, "relabel to {other:?}: {e:?}");
        // Both policies refuse it; which one answers first is the API server's choice.
        assert!(
            e.message.contains(
                "stale fencing token 34 is lower than the token 35 that Lease billing-cron"
            ) || e.message.contains(&format!(
                "fenced by Lease billing-cron (label palisade.dev/fenced-by): the write changes the label to \"{other}\""
            )),
            "relabel to {other:?}: {e:?}"
        );
        let kept = cms.get("billing-config").await.unwrap();
        assert_eq!(label_of(&kept).as_deref(), Some("billing-cron"), "{kept:?}");
        assert_eq!(token_of(&kept).as_deref(), Some("34"), "{kept:?}");
        assert_ne!(kept.data.as_ref().unwrap()["n"], "stale", "{kept:?}");
    }
    write_with_token(&cms, "billing-config", Some("35"))
        .await
        .expect("the holder of 35 writes");
}

#[tokio::test]
async fn removing_the_label_is_judged_against_the_lease_it_named() {
    let ns = setup("helm-unlabel").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron", 600).await;
    publish_token(&ns, "billing-cron", 34).await;
    let cms = ns.api::<ConfigMap>();
    create_once_enforced(&cms, "billing-config", "billing-cron", 34).await;
    let cms_ref = &cms;
    publish_token(&ns, "billing-cron", 40).await;
    until_rejected(
        "a write with token 34 after Lease billing-cron published 40",
        "has granted since",
        move || async move { write_with_token(cms_ref, "billing-config", Some("34")).await },
        || async {},
    )
    .await;

    // After the write no label names the Lease, yet the write is judged against it: a
    // token equal to or above the object's own (34) but below the Lease's (40) is refused.
    for stale in ["34", "39"] {
        let e = api_error(
            cms.patch(
                "billing-config",
                &PatchParams::default(),
                &relabel(None, stale, "stale"),
            )
            .await,
        );
        assert_eq!(e.code, 403, "{e:?}");
        assert!(
            e.message.contains(&format!(
                "stale fencing token {stale} is lower than the token 40 that Lease billing-cron has granted since"
            )),
            "removing the label with token {stale}: {e:?}"
        );
        let kept = cms.get("billing-config").await.unwrap();
        assert_eq!(label_of(&kept).as_deref(), Some("billing-cron"), "{kept:?}");
        assert_eq!(token_of(&kept).as_deref(), Some("34"), "{kept:?}");
    }
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &relabel(None, "40", "released"),
    )
    .await
    .expect("the holder of 40 removes the label");
    write_with_token(&cms, "billing-config", None)
        .await
        .expect("no longer fenced");
}

#[tokio::test]
async fn a_fenced_object_moves_to_another_lease_only_by_removing_and_adding_the_label() {
    let ns = setup("helm-move").await;
    let _release = Release::install(&ns, &[&ns.name], &[]);
    create_lease(&ns, "billing-cron", 600).await;
    publish_token(&ns, "billing-cron", 50).await;
    create_lease(&ns, "reports", 600).await;
    publish_token(&ns, "reports", 7).await;
    let cms = ns.api::<ConfigMap>();
    create_once_enforced(&cms, "billing-config", "billing-cron", 50).await;
    let cms_ref = &cms;

    // Even the current holder may not change the label's value; the refusal says how to
    // move the object.
    let e = until_rejected(
        "the holder of 50 changing the label from billing-cron to reports",
        "changes the label",
        move || async move {
            cms_ref
                .patch(
                    "billing-config",
                    &PatchParams::default(),
                    &relabel(Some("reports"), "50", "moved"),
                )
                .await
        },
        move || async move {
            let _ = cms_ref
                .patch(
                    "billing-config",
                    &PatchParams::default(),
                    &relabel(Some("billing-cron"), "50", "back"),
                )
                .await;
        },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains(
            "/billing-config is fenced by Lease billing-cron (label palisade.dev/fenced-by): \
             the write changes the label to \"reports\""
        ) && e.message.contains("remove the label")
            && e.message.contains("current token of Lease billing-cron")
            && e.message.contains("then a holder of Lease reports adds it"),
        "{e:?}"
    );
    let kept = cms.get("billing-config").await.unwrap();
    assert_eq!(label_of(&kept).as_deref(), Some("billing-cron"), "{kept:?}");

    // The way described: the holder of billing-cron removes the label with its token, ...
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &relabel(None, "50", "released"),
    )
    .await
    .expect("the holder of 50 removes the label");
    // ... and a holder of reports adds it with its token, which is judged against reports
    // alone (not against the 50 left behind: any writer could set that while unfenced).
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &relabel(Some("reports"), "6", "taken"),
        )
        .await,
    );
    assert!(
        e.message
            .contains("stale fencing token 6 is lower than the token 7 that Lease reports"),
        "{e:?}"
    );
    cms.patch(
        "billing-config",
        &PatchParams::default(),
        &relabel(Some("reports"), "7", "taken"),
    )
    .await
    .expect("the holder of reports (7) adds the label");
    let moved = cms.get("billing-config").await.unwrap();
    assert_eq!(label_of(&moved).as_deref(), Some("reports"), "{moved:?}");
    assert_eq!(token_of(&moved).as_deref(), Some("7"), "{moved:?}");
    write_with_token(&cms, "billing-config", Some("7"))
        .await
        .expect("the holder of reports writes again");
    // Now it is fenced by reports: the holder of billing-cron cannot take it back in one write.
    let e = api_error(
        cms.patch(
            "billing-config",
            &PatchParams::default(),
            &relabel(Some("billing-cron"), "50", "back"),
        )
        .await,
    );
    assert!(
        e.message
            .contains("the write changes the label to \"billing-cron\""),
        "{e:?}"
    );
}

// --- subresources of fenced kinds -----------------------------------------------------------

/// A namespaced custom resource `widgets.<group>` with /status and /scale; deleted on drop.
struct WidgetCrd {
    group: String,
    client: Client,
}

impl WidgetCrd {
    async fn create(ns: &TestNamespace) -> Self {
        let group = format!("{}.palisade-tests.example", ns.name);
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("widgets.{group}")},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                        "status": {"type": "object", "properties": {
                            "replicas": {"type": "integer"}, "note": {"type": "string"}}}
                    }}},
                    "subresources": {"status": {}, "scale": {
                        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}
                }]
            }
        }))
        .unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
        let name = crd.name_any();
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("creating CRD {name}: {e}"));
        tokio::time::timeout(
            WAIT,
            kube::runtime::wait::await_condition(
                crds,
                &name,
                kube::runtime::wait::conditions::is_crd_established(),
            ),
        )
        .await
        .expect("the test CRD is established")
        .unwrap();
        Self {
            group,
            client: ns.client.clone(),
        }
    }

    fn api(&self, ns: &str) -> Api<kube::api::DynamicObject> {
        let resource = kube::api::ApiResource {
            group: self.group.clone(),
            version: "v1".into(),
            api_version: format!("{}/v1", self.group),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        Api::namespaced_with(self.client.clone(), ns, &resource)
    }

    fn widget(&self, name: &str, fenced_token: Option<&str>) -> kube::api::DynamicObject {
        let mut w = json!({
            "apiVersion": format!("{}/v1", self.group), "kind": "Widget",
            "metadata": {"name": name}, "spec": {"replicas": 1}
        });
        if let Some(t) = fenced_token {
            w["metadata"]["labels"] = json!({"palisade.dev/fenced-by": "widget-lease"});
            w["metadata"]["annotations"] = json!({"palisade.dev/fencing-token": t});
        }
        serde_json::from_value(w).unwrap()
    }
}

impl Drop for WidgetCrd {
    fn drop(&mut self) {
        let name = format!("widgets.{}", self.group);
        support::clean_up(|| async move {
            let _ = Api::<CustomResourceDefinition>::all(support::client().await)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

#[tokio::test]
async fn subresource_writes_of_fenced_kinds_are_refused() {
    let ns = setup("helm-subres").await;
    let crd = WidgetCrd::create(&ns).await;
    let rules =
        json!([{"apiGroups": [crd.group], "apiVersions": ["v1"], "resources": ["widgets"]}]);
    let _release = Release::install(
        &ns,
        &[&ns.name],
        &["--set-json", &format!("policies.fencing.resources={rules}")],
    );
    let widgets = crd.api(&ns.name);
    let pp = PostParams::default();
    widgets
        .create(&pp, &crd.widget("fenced", Some("5")))
        .await
        .expect("a fenced widget");
    widgets
        .create(&pp, &crd.widget("plain", None))
        .await
        .expect("an unfenced widget");
    let pp_patch = PatchParams::default();
    let widgets_ref = &widgets;
    let pp_patch_ref = &pp_patch;

    // /status of a fenced object: the API server ignores metadata there, so no token can
    // come with it. Refused.
    let e = until_rejected(
        "a /status write of a fenced widget",
        "status subresource",
        move || async move {
            widgets_ref
                .patch_status(
                    "fenced",
                    pp_patch_ref,
                    &Patch::Merge(json!({"status": {"note": "stale"}})),
                )
                .await
        },
        || async {},
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("Widget")
            && e.message.contains("fenced")
            && e.message.contains("cannot carry a fencing token"),
        "{e:?}"
    );
    // /scale: a Scale shows neither label nor token, so it is refused for the whole kind.
    let scale = Patch::Merge(json!({"spec": {"replicas": 3}}));
    let e = until_rejected(
        "a /scale write of a fenced widget",
        "/scale",
        move || {
            let scale = scale.clone();
            async move {
                widgets_ref
                    .patch_scale("fenced", pp_patch_ref, &scale)
                    .await
            }
        },
        || async {},
    )
    .await;
    assert!(
        e.message.contains("widgets/scale")
            && e.message
                .contains("neither the palisade.dev/fenced-by label nor a fencing token"),
        "{e:?}"
    );
    let e = api_error(
        widgets
            .patch_scale(
                "plain",
                &pp_patch,
                &Patch::Merge(json!({"spec": {"replicas": 3}})),
            )
            .await,
    );
    assert!(e.message.contains("/scale"), "{e:?}");
    // The fenced write path: spec with a token.
    widgets
        .patch(
            "fenced",
            &pp_patch,
            &Patch::Merge(json!({
                "metadata": {"annotations": {"palisade.dev/fencing-token": "6",
                                             "palisade.dev/write-id": next_write_id()}},
                "spec": {"replicas": 3}
            })),
        )
        .await
        .expect("a write of spec.replicas with a token");
    // Unfenced objects' /status is untouched.
    widgets
        .patch_status(
            "plain",
            &pp_patch,
            &Patch::Merge(json!({"status": {"note": "fine"}})),
        )
        .await
        .expect("/status of an unfenced widget");
}
