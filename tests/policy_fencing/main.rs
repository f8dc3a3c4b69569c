//! The chart's object-fencing admission policies (DESIGN rule 6) against the real API
//! server: fenced objects refuse missing, malformed and stale tokens, also against the
//! token the Lease has published since; deletes, re-creates, writes that leave the token
//! untouched, changes of the label's value and subresource writes of fenced kinds are
//! refused; removing the label is judged against the Lease it named; a namespace with
//! fenced objects can still be deleted. One module per concern: the token itself
//! (tokens.rs), deletes and re-creates (deletes.rs), the label (labels.rs),
//! subresources (subresources.rs).
//!
//! The policy bindings are limited to the test's namespaces (`policies.namespaceSelector`),
//! so tests running at the same time never see each other's policies.

mod deletes;
mod labels;
mod slots;
mod subresources;
mod tokens;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use palisade::crd::Lease;
use serde_json::json;
use support::TestNamespace;
use support::admission::until_rejected;

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
