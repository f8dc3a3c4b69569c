//! The label: one Lease for the object's life (docs/fences.md, "Why the policy is built this way").

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PatchParams;
use support::admission::until_rejected;
use support::claims::create_lease;
use support::helm::Release;
use support::{api_error, setup};

use crate::{create_once_enforced, label_of, publish_token, relabel, token_of, write_with_token};

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
