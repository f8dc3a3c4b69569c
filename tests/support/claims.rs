//! palisade Leases and LeaseClaims in a test namespace: creating them, and waiting
//! (watching, not polling) for the controller to grant, hand over or revoke.

use kube::api::{DeleteParams, PostParams};
use palisade::crd::{ClaimPhase, Lease, LeaseClaim};
use serde_json::{Value, json};

use super::{TestNamespace, holder_claim, wait_for, wait_lease};

/// Creates a Lease of `duration` seconds.
pub async fn create_lease(ns: &TestNamespace, name: &str, duration: i64) -> Lease {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"leaseDurationSeconds": duration}
    }))
    .unwrap();
    ns.api::<Lease>()
        .create(&PostParams::default(), &lease)
        .await
        .expect("create Lease")
}

/// A claim named `name` for `lease`, held by `identity`, bound to `pod` (a `spec.pod`
/// object: name, and uid if given) when there is one.
pub fn claim_for(name: &str, lease: &str, identity: &str, pod: Option<Value>) -> LeaseClaim {
    let mut spec = json!({"leaseName": lease, "holderIdentity": identity});
    if let Some(pod) = pod {
        spec["pod"] = pod;
    }
    serde_json::from_value(json!({
        "apiVersion": "palisade.dev/v1alpha1", "kind": "LeaseClaim",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

/// A claim named `name`; bound to `pod` when given, and then shown as held by that pod (as
/// the claim-identity policy requires of a pod's own claims), else by `name`.
pub fn claim(name: &str, lease: &str, pod: Option<Value>) -> LeaseClaim {
    let identity = match &pod {
        Some(pod) => pod["name"].as_str().expect("spec.pod.name").to_string(),
        None => name.to_string(),
    };
    claim_for(name, lease, &identity, pod)
}

/// A claim bound to pod `pod` (by name only), shown as held by `identity`.
pub fn pod_claim(name: &str, lease: &str, identity: &str, pod: &str) -> LeaseClaim {
    claim_for(name, lease, identity, Some(json!({"name": pod})))
}

/// Creates a claim held by `name`, bound to `pod` (name, uid) when given.
pub async fn create_claim(
    ns: &TestNamespace,
    name: &str,
    lease: &str,
    pod: Option<(&str, &str)>,
) -> LeaseClaim {
    let pod = pod.map(|(pod, uid)| json!({"name": pod, "uid": uid}));
    ns.api::<LeaseClaim>()
        .create(&PostParams::default(), &claim_for(name, lease, name, pod))
        .await
        .expect("create LeaseClaim")
}

pub async fn delete_claim(ns: &TestNamespace, name: &str) {
    ns.api::<LeaseClaim>()
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete LeaseClaim");
}

/// Waits until `claim` holds `lease`, returning the Lease.
pub async fn wait_holder(ns: &TestNamespace, lease: &str, claim: &str) -> Lease {
    wait_lease(ns, lease, &format!("holder {claim}"), |l| {
        holder_claim(l).as_deref() == Some(claim)
    })
    .await
}

/// Waits until the claim exists and its status shows `phase`, returning it.
pub async fn wait_claim_phase(ns: &TestNamespace, name: &str, phase: ClaimPhase) -> LeaseClaim {
    wait_for(
        ns.api::<LeaseClaim>(),
        name,
        &format!("phase {phase:?}"),
        |c| c.is_some_and(|c| c.status.as_ref().and_then(|s| s.phase) == Some(phase)),
    )
    .await
    .expect("a claim in the phase exists")
}
