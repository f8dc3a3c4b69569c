//! The Helm chart (charts/palisade) on its own, no cluster: the CRD copy and the
//! chart's version (chart.rs), `helm lint` and the values schema (values.rs), and
//! what `helm template` renders: the controller Deployment (deployment.rs), the
//! least-privilege RBAC (rbac.rs), the admission policies and their bindings
//! (policies.rs), the API priority objects (api_priority.rs).

mod api_priority;
mod chart;
mod deployment;
mod policies;
mod rbac;
mod values;

use std::collections::BTreeSet;

use serde_json::Value;

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| {
            let have: Vec<String> = objects
                .iter()
                .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
                .collect();
            panic!("the chart renders no {kind} {name}; it renders {have:?}")
        })
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Flattens RBAC rules into (apiGroup, resource, verb, resourceName) tuples.
fn rule_set(role: &Value) -> BTreeSet<(String, String, String, String)> {
    let mut set = BTreeSet::new();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    for rule in role["rules"].as_array().expect("rules") {
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    for n in &names {
                        set.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    set
}

/// What a workload may do: the `<fullname>-client` ClusterRole's rules.
const CLIENT_RULES: &[Rule] = &[
    (
        "palisade.dev",
        "leases",
        &["create", "get", "list", "watch"],
        "",
    ),
    (
        "palisade.dev",
        "leaseclaims",
        &["create", "get", "list", "watch", "patch", "delete"],
        "",
    ),
];

/// (apiGroup, resource, verbs, resourceName).
type Rule = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

fn rules(spec: &[(&str, &str, &[&str], &str)]) -> BTreeSet<(String, String, String, String)> {
    spec.iter()
        .flat_map(|(g, r, verbs, name)| {
            verbs.iter().map(move |v| {
                (
                    g.to_string(),
                    r.to_string(),
                    v.to_string(),
                    name.to_string(),
                )
            })
        })
        .collect()
}
