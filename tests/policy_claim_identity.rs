//! The chart's claim-identity admission policy (DESIGN rule 7) against the real API
//! server: a pod may only create, renew or release claims for itself and shows its own
//! name; non-pod credentials can be kept from claims.
//!
//! The policy bindings are limited to the test's namespaces (`policies.namespaceSelector`),
//! so tests running at the same time never see each other's policies.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use palisade::crd::LeaseClaim;
use serde_json::json;
use support::accounts::{bind_client_role, create_sa_and_pod, service_account_token};
use support::admission::until_rejected;
use support::claims::{claim, pod_claim};
use support::helm::Release;
use support::{TestNamespace, api_error, setup};

#[tokio::test]
async fn a_pod_may_only_claim_for_itself() {
    let ns = setup("helm-identity").await;
    let other = TestNamespace::new("helm-identity-other").await;
    let release = Release::install(&ns, &[&ns.name, &other.name], &[]);
    let pods = create_sa_and_pod(&ns, "worker", &["worker-a", "worker-b"]).await;
    let (a, b) = (&pods[0], &pods[1]);
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, "worker").await;
    bind_client_role(&other.name, &ns.client, &release.name, &ns.name, "worker").await;
    let as_a =
        support::client_with_token(&service_account_token(&ns, "worker", Some(a)).await).await;
    let a_claims: Api<LeaseClaim> = Api::namespaced(as_a.clone(), &ns.name);
    let admin_claims = ns.api::<LeaseClaim>();
    let pp = PostParams::default();
    let (a_claims_ref, admin_ref, pp_ref) = (&a_claims, &admin_claims, &pp);

    // Pod A claiming for pod B is refused (once the new binding is in force).
    let refused = until_rejected(
        "pod worker-a creating a claim for worker-b",
        "a pod may only claim for itself",
        move || {
            let c = claim("for-b", "jobs", Some(json!({"name": "worker-b"})));
            async move { a_claims_ref.create(pp_ref, &c).await }
        },
        move || async move {
            let _ = admin_ref.delete("for-b", &DeleteParams::default()).await;
        },
    )
    .await;
    assert!(
        refused.message.contains("spec.pod.name is worker-b")
            && refused
                .message
                .contains("the request comes from pod worker-a"),
        "{refused:?}"
    );

    for_itself_with_its_name_and_uid_only(&a_claims, a, b).await;
    renews_and_releases_only_its_own(&a_claims, &admin_claims).await;

    // spec.pod is namespace-local: in another namespace "worker-a" is not this pod.
    let e = api_error(
        Api::<LeaseClaim>::namespaced(as_a.clone(), &other.name)
            .create(
                &pp,
                &claim("abroad", "jobs", Some(json!({"name": "worker-a"}))),
            )
            .await,
    );
    assert!(
        e.message.contains("a pod may only claim for itself") && e.message.contains("namespace"),
        "{e:?}"
    );

    // A token that is not bound to a pod is not a pod's request.
    let unbound =
        support::client_with_token(&service_account_token(&ns, "worker", None).await).await;
    Api::<LeaseClaim>::namespaced(unbound, &ns.name)
        .create(
            &pp,
            &claim("unbound", "jobs", Some(json!({"name": "worker-b"}))),
        )
        .await
        .expect("a service-account token without a pod is not checked");
}

/// Pod A claiming for itself is allowed, with or without its UID; without spec.pod, or
/// with B's UID, it is refused.
async fn for_itself_with_its_name_and_uid_only(a_claims: &Api<LeaseClaim>, a: &Pod, b: &Pod) {
    let pp = PostParams::default();
    // For itself it is allowed, with or without its UID.
    a_claims
        .create(
            &pp,
            &claim(
                "for-a",
                "jobs",
                Some(json!({"name": "worker-a", "uid": a.uid().unwrap()})),
            ),
        )
        .await
        .expect("pod worker-a claims for itself");
    a_claims
        .create(
            &pp,
            &claim("for-a-by-name", "jobs", Some(json!({"name": "worker-a"}))),
        )
        .await
        .expect("pod worker-a claims for itself (no uid)");

    // Without spec.pod, or with B's UID, it is refused.
    let e = api_error(a_claims.create(&pp, &claim("no-pod", "jobs", None)).await);
    assert!(
        e.message.contains("a pod may only claim for itself")
            && e.message.contains("spec.pod.name must be set to worker-a"),
        "{e:?}"
    );
    let e = api_error(
        a_claims
            .create(
                &pp,
                &claim(
                    "wrong-uid",
                    "jobs",
                    Some(json!({"name": "worker-a", "uid": b.uid().unwrap()})),
                ),
            )
            .await,
    );
    assert!(
        e.message.contains("a pod may only claim for itself") && e.message.contains("spec.pod.uid"),
        "{e:?}"
    );
}

/// Renewing (an UPDATE): its own claim yes, someone else's no; releasing its own.
async fn renews_and_releases_only_its_own(
    a_claims: &Api<LeaseClaim>,
    admin_claims: &Api<LeaseClaim>,
) {
    let pp = PostParams::default();
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    a_claims
        .patch("for-a", &PatchParams::default(), &renew)
        .await
        .expect("pod worker-a renews its own claim");
    admin_claims
        .create(
            &pp,
            &claim("b-by-admin", "jobs", Some(json!({"name": "worker-b"}))),
        )
        .await
        .expect("requests not from a pod are not affected");
    let e = api_error(
        a_claims
            .patch("b-by-admin", &PatchParams::default(), &renew)
            .await,
    );
    assert!(
        e.message.contains("a pod may only claim for itself"),
        "{e:?}"
    );
    a_claims
        .delete("for-a", &DeleteParams::default())
        .await
        .expect("pod worker-a releases its claim");
}

#[tokio::test]
async fn a_pod_may_only_renew_or_release_its_own_claims_and_shows_its_own_name() {
    let ns = setup("helm-own-claims").await;
    let release = Release::install(&ns, &[&ns.name], &[]);
    let pods = create_sa_and_pod(&ns, "worker", &["worker-a", "worker-b"]).await;
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, "worker").await;
    let as_a =
        support::client_with_token(&service_account_token(&ns, "worker", Some(&pods[0])).await)
            .await;
    let as_b =
        support::client_with_token(&service_account_token(&ns, "worker", Some(&pods[1])).await)
            .await;
    let a_claims: Api<LeaseClaim> = Api::namespaced(as_a, &ns.name);
    let b_claims: Api<LeaseClaim> = Api::namespaced(as_b, &ns.name);
    let pp = PostParams::default();
    b_claims
        .create(&pp, &pod_claim("jobs-b", "jobs", "worker-b", "worker-b"))
        .await
        .expect("pod worker-b claims for itself");
    let (a_ref, b_ref, pp_ref) = (&a_claims, &b_claims, &pp);

    // Pod A deleting B's claim (and so taking B's lease) is refused.
    let e = until_rejected(
        "pod worker-a deleting the claim of worker-b",
        "a pod may only claim for itself",
        move || async move { a_ref.delete("jobs-b", &DeleteParams::default()).await },
        move || async move {
            let _ = b_ref
                .create(pp_ref, &pod_claim("jobs-b", "jobs", "worker-b", "worker-b"))
                .await;
        },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("delete refused")
            && e.message.contains("spec.pod.name is worker-b")
            && e.message.contains("the request comes from pod worker-a"),
        "{e:?}"
    );
    // ... and renewing it.
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    let e = api_error(
        a_claims
            .patch("jobs-b", &PatchParams::default(), &renew)
            .await,
    );
    assert!(e.message.contains("update refused"), "{e:?}");

    // A pod's claim shows the pod: holderIdentity must be its name.
    let e = api_error(
        a_claims
            .create(&pp, &pod_claim("jobs-a", "jobs", "worker-b", "worker-a"))
            .await,
    );
    assert!(
        e.message.contains("spec.holderIdentity is worker-b")
            && e.message.contains("it must be worker-a"),
        "{e:?}"
    );
    a_claims
        .create(&pp, &pod_claim("jobs-a", "jobs", "worker-a", "worker-a"))
        .await
        .expect("pod worker-a claims for itself, as worker-a");
    a_claims
        .patch("jobs-a", &PatchParams::default(), &renew)
        .await
        .expect("pod worker-a renews its own claim");
    a_claims
        .delete("jobs-a", &DeleteParams::default())
        .await
        .expect("pod worker-a releases its own claim");
    // A claim bound to no pod (made by a user) is not a pod's to delete either.
    ns.api::<LeaseClaim>()
        .create(&pp, &claim("by-user", "jobs", None))
        .await
        .unwrap();
    let e = api_error(a_claims.delete("by-user", &DeleteParams::default()).await);
    assert!(e.message.contains("spec.pod.name must be set"), "{e:?}");
    b_claims
        .delete("jobs-b", &DeleteParams::default())
        .await
        .expect("pod worker-b releases its own claim");
}

#[tokio::test]
async fn non_pod_credentials_can_be_kept_from_claims() {
    let ns = setup("helm-no-pod-creds").await;
    let release = Release::install(
        &ns,
        &[&ns.name],
        &[
            "--set",
            "policies.claimIdentity.allowNonPodCredentials=false",
        ],
    );
    let pods = create_sa_and_pod(&ns, "worker", &["worker-a"]).await;
    bind_client_role(&ns.name, &ns.client, &release.name, &ns.name, "worker").await;
    let as_pod =
        support::client_with_token(&service_account_token(&ns, "worker", Some(&pods[0])).await)
            .await;
    let unbound =
        support::client_with_token(&service_account_token(&ns, "worker", None).await).await;
    let pod_claims: Api<LeaseClaim> = Api::namespaced(as_pod, &ns.name);
    let unbound_claims: Api<LeaseClaim> = Api::namespaced(unbound, &ns.name);
    let pp = PostParams::default();
    let (u_ref, pp_ref) = (&unbound_claims, &pp);
    let admin_claims = ns.api::<LeaseClaim>();
    let admin_ref = &admin_claims;

    let e = until_rejected(
        "a token not bound to a pod creating a claim",
        "only pods may create LeaseClaims here",
        move || async move {
            u_ref
                .create(pp_ref, &pod_claim("by-ci", "jobs", "worker-a", "worker-a"))
                .await
        },
        move || async move {
            let _ = admin_ref.delete("by-ci", &DeleteParams::default()).await;
        },
    )
    .await;
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains("allowNonPodCredentials is false")
            && e.message
                .contains(&format!("system:serviceaccount:{}:worker", ns.name)),
        "{e:?}"
    );
    pod_claims
        .create(&pp, &pod_claim("jobs-a", "jobs", "worker-a", "worker-a"))
        .await
        .expect("the pod claims for itself");
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    let e = api_error(
        unbound_claims
            .patch("jobs-a", &PatchParams::default(), &renew)
            .await,
    );
    assert!(e.message.contains("only pods may update"), "{e:?}");
    let e = api_error(
        unbound_claims
            .delete("jobs-a", &DeleteParams::default())
            .await,
    );
    assert!(e.message.contains("only pods may delete"), "{e:?}");
    // Cluster administrators (system:masters) remain able to clean up.
    admin_claims
        .delete("jobs-a", &DeleteParams::default())
        .await
        .expect("system:masters may delete any claim");
}
