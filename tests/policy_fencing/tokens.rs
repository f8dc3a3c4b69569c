//! The token itself: fenced objects refuse missing, malformed and stale tokens, and a
//! write that leaves the token untouched.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::admission::until_rejected;
use support::claims::create_lease;
use support::helm::Release;
use support::{TestNamespace, api_error, setup};

use crate::{
    fenced_cm, next_write_id, publish_token, token_of, unfence_and_delete, write_with_token,
};

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

    stale_missing_and_malformed_tokens_are_refused(&cms).await;
    taking_an_object_out_of_fencing_is_a_fenced_write(&cms).await;
    unlabelled_objects_are_untouched(&cms, &pp).await;
    fenced_secrets_refuse_stale_tokens(&ns, &pp).await;
}

/// The holder with token 34 writes; a paused holder with 33 wakes up and is refused.
async fn stale_missing_and_malformed_tokens_are_refused(cms: &Api<ConfigMap>) {
    write_with_token(cms, "billing-config", Some("34"))
        .await
        .expect("token 34 is above 12");
    write_with_token(cms, "billing-config", Some("34"))
        .await
        .expect("the same holder writes again with its token");
    let e = api_error(write_with_token(cms, "billing-config", Some("33")).await);
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message
            .contains("stale fencing token 33 is lower than the current token 34"),
        "{e:?}"
    );

    // Missing and malformed tokens are refused; the object keeps token 34.
    let e = api_error(write_with_token(cms, "billing-config", None).await);
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
        let e = api_error(write_with_token(cms, "billing-config", Some(bad)).await);
        assert!(
            e.message.contains("must be a non-negative integer"),
            "token {bad:?}: {e:?}"
        );
    }
    // The largest accepted token: 18 digits, so int() cannot overflow.
    write_with_token(cms, "billing-config", Some("999999999999999999"))
        .await
        .expect("an 18-digit token");
    let e = api_error(write_with_token(cms, "billing-config", Some("1000000000000000000")).await);
    assert!(e.message.contains("at most 18 digits"), "{e:?}");
    let current = cms.get("billing-config").await.unwrap();
    assert_eq!(
        current
            .annotations()
            .get("palisade.dev/fencing-token")
            .map(String::as_str),
        Some("999999999999999999")
    );
}

/// Taking an object out of fencing is itself a fenced write.
async fn taking_an_object_out_of_fencing_is_a_fenced_write(cms: &Api<ConfigMap>) {
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
    write_with_token(cms, "billing-config", None)
        .await
        .expect("no longer fenced");
}

/// Unlabelled objects are untouched.
async fn unlabelled_objects_are_untouched(cms: &Api<ConfigMap>, pp: &PostParams) {
    let plain: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "plain"}, "data": {"n": "0"}})).unwrap();
    cms.create(pp, &plain).await.unwrap();
    for t in [Some("34"), Some("33"), Some("junk"), None] {
        write_with_token(cms, "plain", t)
            .await
            .unwrap_or_else(|e| panic!("unlabelled ConfigMap with token {t:?}: {e}"));
    }
}

/// Kinds from values: here Secrets.
async fn fenced_secrets_refuse_stale_tokens(ns: &TestNamespace, pp: &PostParams) {
    let secrets = ns.api::<Secret>();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-password", "labels": {"palisade.dev/fenced-by": "billing-cron"},
                     "annotations": {"palisade.dev/fencing-token": "40"}},
        "stringData": {"n": "0"}
    }))
    .unwrap();
    secrets.create(pp, &secret).await.expect("fenced Secret");
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
