//! What the policy refuses and what it lets through, verb by verb.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use palisade::crd::{Lease, LeaseSpec};
use palisade::operator::Error;
use serde_json::json;
use support::TestNamespace;
use support::admission::until_rejected;

use super::{LEASE, configmaps, fence, fenced_operator, lease_with_token, refusal};

const PUBLISHED: i64 = 5000;

fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}]}}}
    }))
    .unwrap()
}

/// Every kind of write `client` can make, each refused with a message containing
/// `expected`; `what` names the client in failures. `custom`: also a custom resource
/// (palisade's own Lease: a write to palisade.dev is judged when it carries a token).
async fn every_write_is_refused(
    client: &Client,
    ns: &TestNamespace,
    what: &str,
    expected: &str,
    custom: bool,
) {
    let cms = configmaps(client, &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let pp = PostParams::default();
    let merge = |v| Patch::Merge(v);
    let ssa = PatchParams::apply("operator").force();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "owned"}, "data": {"by": what}}))
            .unwrap();
    let mut replaced = ns.api::<ConfigMap>().get("owned").await.unwrap();
    replaced.data = Some([("by".to_string(), what.to_string())].into());
    let apply = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned"}, "data": {"by": what}});
    let mut writes: Vec<(&str, Result<(), kube::Error>)> = vec![
        ("create", cms.create(&pp, &cm).await.map(drop)),
        (
            "update",
            cms.replace("owned", &pp, &replaced).await.map(drop),
        ),
        (
            "merge patch",
            cms.patch(
                "owned",
                &PatchParams::default(),
                &merge(json!({"data": {"by": what}})),
            )
            .await
            .map(drop),
        ),
        (
            "server-side apply",
            cms.patch("owned", &ssa, &Patch::Apply(apply))
                .await
                .map(drop),
        ),
        (
            "delete",
            cms.delete("owned", &DeleteParams::default())
                .await
                .map(drop),
        ),
        (
            "deletecollection",
            cms.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
                .map(drop),
        ),
        (
            "status",
            deployments
                .patch_status(
                    "owned",
                    &PatchParams::default(),
                    &merge(json!({"status": {"observedGeneration": 7}})),
                )
                .await
                .map(drop),
        ),
        (
            "scale",
            deployments
                .patch_scale(
                    "owned",
                    &PatchParams::default(),
                    &merge(json!({"spec": {"replicas": 3}})),
                )
                .await
                .map(drop),
        ),
    ];
    if custom {
        let other = Lease::new("other", LeaseSpec::default());
        writes.push((
            "custom resource",
            Api::<Lease>::namespaced(client.clone(), &ns.name)
                .create(&pp, &other)
                .await
                .map(drop),
        ));
    }
    for (verb, result) in writes {
        let status = refusal(&format!("{what}: {verb}"), result);
        assert_eq!(status.code, 403, "{what}: {verb}: {status:?}");
        assert!(
            status.message.contains(expected),
            "{what}: {verb}: {}",
            status.message
        );
    }
}

/// With the published token, the writes the stale and tokenless clients tried land.
async fn the_current_tokens_writes_land(leader: &palisade::operator::Fence, ns: &TestNamespace) {
    leader
        .lead(PUBLISHED)
        .await
        .expect("the one API server refuses the tokens below");
    let client = leader.client().unwrap();
    let cms = configmaps(&client, &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let merge = PatchParams::default();
    cms.patch(
        "owned",
        &merge,
        &Patch::Merge(json!({"data": {"by": "leader"}})),
    )
    .await
    .expect("merge patch");
    let apply = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned"}, "data": {"by": "leader"}});
    cms.patch(
        "owned",
        &PatchParams::apply("operator").force(),
        &Patch::Apply(apply),
    )
    .await
    .expect("server-side apply");
    deployments
        .patch_status(
            "owned",
            &merge,
            &Patch::Merge(json!({"status": {"observedGeneration": 7}})),
        )
        .await
        .expect("status");
    deployments
        .patch_scale(
            "owned",
            &merge,
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale");
    cms.delete("owned", &DeleteParams::default())
        .await
        .expect("delete");
    assert_eq!(leader.token(), PUBLISHED);
}

#[tokio::test]
async fn every_write_of_the_operator_is_judged_by_its_lease_token() {
    let ns = support::setup("op-verdicts").await;
    let (_release, config) = fenced_operator(&ns).await;
    lease_with_token(&ns, PUBLISHED).await;
    ns.api::<ConfigMap>()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owned"}})).unwrap(),
        )
        .await
        .unwrap();
    ns.api::<Deployment>()
        .create(&PostParams::default(), &deployment("owned"))
        .await
        .unwrap();

    // Before it leads, the operator's client stamps nothing and is refused.
    let leader = fence(&ns.name, &config).await;
    let unstamped = leader.client().unwrap();
    let cms = configmaps(&unstamped, &ns.name);
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    let pp = PostParams::default();
    until_rejected(
        "a tokenless create",
        "carries no fencing token",
        || cms.create(&pp, &probe),
        || async {
            let _ = ns
                .api::<ConfigMap>()
                .delete("probe", &DeleteParams::default())
                .await;
        },
    )
    .await;
    every_write_is_refused(
        &unstamped,
        &ns,
        "tokenless",
        "carries no fencing token",
        false,
    )
    .await;
    // Tokenless writes to palisade.dev are how a candidate claims the Lease: not judged.
    Api::<Lease>::namespaced(unstamped.clone(), &ns.name)
        .create(
            &PostParams::default(),
            &Lease::new("declared", LeaseSpec::default()),
        )
        .await
        .expect("a tokenless write to palisade.dev is not judged");

    // A stale token: every verb, subresource and kind is refused, naming both tokens.
    let stale = fence(&ns.name, &config).await;
    stale
        .lead(PUBLISHED - 1)
        .await
        .expect("a token below the published one needs no wait");
    every_write_is_refused(
        &stale.client().unwrap(),
        &ns,
        "stale",
        &format!("stale fencing token {} of system:serviceaccount:{}:op is lower than the current token {PUBLISHED} of Lease {}/{LEASE}", PUBLISHED - 1, ns.name, ns.name),
        true,
    )
    .await;

    the_current_tokens_writes_land(&leader, &ns).await;

    // Everyone else is untouched: the admin writes without a token.
    let admin: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "admin"}})).unwrap();
    ns.api::<ConfigMap>()
        .create(&PostParams::default(), &admin)
        .await
        .expect("the admin's create is not judged");
    ns.api::<ConfigMap>()
        .delete("admin", &DeleteParams::default())
        .await
        .expect("nor its delete");
    ns.api::<Deployment>()
        .patch_scale(
            "owned",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("the admin's write is not judged");
}

#[tokio::test]
async fn leading_fails_with_the_reason_when_nothing_judges_the_operator() {
    let ns = support::setup("op-unfenced").await;
    let (_release, config) = fenced_operator(&ns).await;
    let leader = fence(&ns.name, &config)
        .await
        .with_confirm_timeout(std::time::Duration::from_secs(2));

    // No Lease: a dry-run create of it succeeds, so the policy has nothing to judge by.
    match leader.lead(PUBLISHED).await {
        Err(Error::LeaseMissing(lease)) => assert!(lease.contains(LEASE), "{lease}"),
        other => panic!("leading by a missing Lease: expected LeaseMissing, got {other:?}"),
    }

    // A Lease that never published this token: servers keep accepting the one below,
    // and leadership is given up naming the server and what it answered.
    lease_with_token(&ns, PUBLISHED).await;
    match leader.lead(PUBLISHED + 10).await {
        Err(e @ Error::NotConfirmed { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains(&config.cluster_url.to_string()),
                "{message}"
            );
            assert!(message.contains("StillAccepts"), "{message}");
        }
        other => panic!(
            "leading with a token the Lease never published: expected NotConfirmed, got {other:?}"
        ),
    }
}
