//! The API priority objects (FlowSchemas, PriorityLevelConfiguration), as rendered:
//! they match the controller's ServiceAccount and nothing else.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use support::helm::render;

use crate::{find, rule_set};

/// The (apiGroup, resource) pairs a FlowSchema's resource rules match in `namespace`
/// (a rule with namespaces ["*"] matches every namespace).
fn flow_schema_matches(fs: &Value, namespace: &str) -> BTreeSet<(String, String)> {
    let mut set = BTreeSet::new();
    for rule in fs["spec"]["rules"].as_array().unwrap() {
        for r in rule["resourceRules"].as_array().unwrap() {
            let namespaces = r["namespaces"].as_array().unwrap();
            if !namespaces.contains(&json!("*")) && !namespaces.contains(&json!(namespace)) {
                continue;
            }
            assert_eq!(r["verbs"], json!(["*"]), "every verb: {r}");
            for g in r["apiGroups"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    set.insert((
                        g.as_str().unwrap().to_string(),
                        res.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    set
}

#[test]
fn rendered_api_priority_objects_match_only_the_controller_service_account() {
    let objects = render("palisade", "ops", &[]);
    let sa = json!([{"kind": "ServiceAccount", "serviceAccount": {"name": "palisade", "namespace": "ops"}}]);

    assert_controller_level_and_flow_schema(&objects, &sa);

    let election = find(&objects, "FlowSchema", "palisade-election");
    assert_eq!(
        election["spec"]["priorityLevelConfiguration"]["name"],
        "leader-election"
    );
    assert_eq!(election["spec"]["matchingPrecedence"], 500);
    assert_eq!(
        election["spec"]["rules"],
        json!([{"subjects": sa, "resourceRules": [{
            "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "create", "update"], "namespaces": ["ops"]}]}])
    );

    let tuned = tuned_values_are_rendered();
    // Two releases never share a cluster-scoped name.
    assert_eq!(flow_control_names(&objects).len(), 3);
    assert!(flow_control_names(&objects).is_disjoint(&flow_control_names(&tuned)));

    // The election's own level, or none at all.
    for extra in [
        &["--set", "apiPriority.electionPriorityLevel="][..],
        &["--set", "controller.leaderElection.enabled=false"][..],
    ] {
        let objects = render("palisade", "ops", extra);
        find(&objects, "FlowSchema", "palisade");
        assert_eq!(
            flow_control_names(&objects),
            BTreeSet::from([
                "FlowSchema/palisade".to_string(),
                "PriorityLevelConfiguration/palisade".to_string()
            ]),
            "{extra:?}"
        );
    }
    let other_level = render(
        "palisade",
        "ops",
        &["--set", "apiPriority.electionPriorityLevel=workload-high"],
    );
    assert_eq!(
        find(&other_level, "FlowSchema", "palisade-election")["spec"]["priorityLevelConfiguration"]
            ["name"],
        "workload-high"
    );
    let off = render("palisade", "ops", &["--set", "apiPriority.enabled=false"]);
    assert!(
        flow_control_names(&off).is_empty(),
        "{:?}",
        flow_control_names(&off)
    );
}

/// The controller's priority level and FlowSchema: its ServiceAccount (`sa`) only, every
/// resource its ClusterRole grants, the election Lease in the release namespace.
fn assert_controller_level_and_flow_schema(objects: &[Value], sa: &Value) {
    let level = find(objects, "PriorityLevelConfiguration", "palisade");
    assert_eq!(level["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    assert_eq!(
        level["spec"],
        json!({"type": "Limited", "limited": {
            "nominalConcurrencyShares": 20, "lendablePercent": 50,
            "limitResponse": {"type": "Queue",
                "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 50}}}})
    );

    let fs = find(objects, "FlowSchema", "palisade");
    assert_eq!(fs["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
    assert_eq!(fs["spec"]["priorityLevelConfiguration"]["name"], "palisade");
    assert_eq!(fs["spec"]["matchingPrecedence"], 501);
    assert_eq!(fs["spec"]["distinguisherMethod"]["type"], "ByNamespace");
    let rules = fs["spec"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["subjects"], *sa,
        "the controller's ServiceAccount only"
    );
    assert!(rules[0]["nonResourceRules"].is_null());
    // Every resource the controller's ClusterRole grants is classified here (a new grant
    // without a rule would fall back to the cluster's default priority), and the election
    // Lease too, as a fallback for the election FlowSchema.
    let granted: BTreeSet<(String, String)> =
        rule_set(find(objects, "ClusterRole", "palisade-controller"))
            .into_iter()
            .map(|(g, r, _, _)| (g, r))
            .collect();
    let matched = flow_schema_matches(fs, "some-tenant");
    assert!(
        granted.is_subset(&matched),
        "granted {granted:?}, classified {matched:?}"
    );
    let in_release_ns = flow_schema_matches(fs, "ops");
    assert!(in_release_ns.contains(&("coordination.k8s.io".into(), "leases".into())));
    assert!(
        !matched.contains(&("coordination.k8s.io".into(), "leases".into())),
        "coordination Leases only in the release namespace"
    );
    // Lists and watches across namespaces are cluster-scope requests.
    let palisade_rule = rules[0]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["apiGroups"] == json!(["palisade.dev"]))
        .unwrap();
    assert_eq!(palisade_rule["clusterScope"], true);
}

/// Values: precedence, shares, a ServiceAccount of the user's, another release.
/// Returns what that release renders.
fn tuned_values_are_rendered() -> Vec<Value> {
    let tuned = render(
        "other",
        "tenant-a",
        &[
            "--set",
            "apiPriority.matchingPrecedence=1000",
            "--set",
            "apiPriority.priorityLevel.nominalConcurrencyShares=7",
            "--set",
            "apiPriority.priorityLevel.lendablePercent=0",
            "--set",
            "apiPriority.priorityLevel.queues=64",
            "--set",
            "apiPriority.priorityLevel.handSize=8",
            "--set",
            "apiPriority.priorityLevel.queueLengthLimit=100",
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=lease-controller",
        ],
    );
    let level = find(&tuned, "PriorityLevelConfiguration", "other-palisade");
    assert_eq!(level["spec"]["limited"]["nominalConcurrencyShares"], 7);
    assert_eq!(level["spec"]["limited"]["lendablePercent"], 0);
    assert_eq!(
        level["spec"]["limited"]["limitResponse"]["queuing"],
        json!({"queues": 64, "handSize": 8, "queueLengthLimit": 100})
    );
    let fs = find(&tuned, "FlowSchema", "other-palisade");
    assert_eq!(fs["spec"]["matchingPrecedence"], 1001);
    assert_eq!(
        fs["spec"]["priorityLevelConfiguration"]["name"],
        "other-palisade"
    );
    let sa = json!([{"kind": "ServiceAccount",
        "serviceAccount": {"name": "lease-controller", "namespace": "tenant-a"}}]);
    assert_eq!(fs["spec"]["rules"][0]["subjects"], sa);
    let election = find(&tuned, "FlowSchema", "other-palisade-election");
    assert_eq!(election["spec"]["matchingPrecedence"], 1000);
    assert_eq!(election["spec"]["rules"][0]["subjects"], sa);
    assert_eq!(
        election["spec"]["rules"][0]["resourceRules"][0]["namespaces"],
        json!(["tenant-a"])
    );
    tuned
}

/// The FlowSchemas and PriorityLevelConfigurations rendered, as kind/name.
fn flow_control_names(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "FlowSchema" || o["kind"] == "PriorityLevelConfiguration")
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}
