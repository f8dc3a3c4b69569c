//! Subresources of fenced kinds: /status cannot carry a token, /scale shows no label.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::admission::until_rejected;
use support::helm::Release;
use support::{TestNamespace, WAIT, api_error, setup};

use crate::next_write_id;

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
