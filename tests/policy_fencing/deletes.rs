//! Deletes: a stale holder cannot rewrite a fenced object by deleting and re-creating
//! it, and a namespace with fenced objects can still be deleted.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::admission::until_rejected;
use support::claims::create_lease;
use support::helm::Release;
use support::tools::{kubectl, text};
use support::{TestNamespace, api_error, setup};

use crate::{
    fenced_cm, next_write_id, publish_token, token_of, unfence_and_delete, write_with_token,
};

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
