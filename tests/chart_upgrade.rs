//! The chart's upgrade path on the node, as a cluster meets it: the last released chart
//! before this one (charts/released/) installed from the registry, Leases granted by its
//! controller, then `helm upgrade` to this chart: the CRDs change (they are templates
//! now, so Helm upgrades them), every Lease keeps its holder and token, tokens keep
//! rising, `helm test` passes, and `helm uninstall` keeps the CRDs and the Leases.
//!
//! One test in a binary of its own: it sets the cluster's CRDs back to the released
//! chart's, and cargo runs test binaries one at a time. It ends with this chart's CRDs.

use std::path::Path;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use palisade::crd::Lease;
use serde::Deserialize;
use support::claims::{create_claim, create_lease, delete_claim, wait_holder};
use support::helm::{
    CRDS, adopt_crds, assert_check_passed, chart_field, chart_version, helm_ok, oci_chart,
    packaged_files, release_crds, released_charts, test_registry,
};
use support::tools::{kubectl_ok, text};
use support::{TestNamespace, setup, token};

/// Long enough that no test grant expires (claims here are never renewed).
const LEASE_SECONDS: i64 = 3600;

#[tokio::test]
async fn upgrade_from_the_last_released_chart_keeps_every_lease_and_token() {
    let ns = setup("chart-upgrade").await;
    run_pods_in(&ns).await;
    let (chart, version) = oci_chart();
    let work = tempfile::tempdir().unwrap();
    let previous = push_released_chart(work.path());
    let release = format!("palisade-{}", ns.name.trim_start_matches("t-"));
    let registry = test_registry();
    let values = [
        "--set".to_string(),
        format!("image.repository={registry}/palisade"),
        "--set".to_string(),
        format!("image.tag={}", chart_field("appVersion")),
        "--set-json".to_string(),
        format!(
            r#"policies.namespaceSelector={{"matchLabels":{{"kubernetes.io/metadata.name":"{}"}}}}"#,
            ns.name
        ),
        "--wait".to_string(),
        "--timeout".to_string(),
        "3m".to_string(),
    ];

    // A cluster on the released chart: its CRDs, as it installed them (chart 0.2.0 from
    // crds/, which Helm never owns; a later chart from its templates, as the release's).
    replace_crds(&previous.crds).await;
    let columns_before = printer_columns("leases.palisade.dev").await;
    assert_eq!(columns_before, lease_columns(&previous.crds));
    if !previous.crds_in_crds_dir {
        adopt_crds(&release, &ns.name);
    }
    helm(
        &[
            &[
                "install",
                &release,
                &chart,
                "--version",
                &previous.version,
                "--plain-http",
            ],
            &["--namespace", &ns.name][..],
        ],
        &values,
    );
    let (leases, before) = hold_leases(&ns).await;

    // The CRDs the released chart left are not Helm's yet: adopt them (CHANGELOG.md,
    // "Upgrading from chart 0.2.0"), then upgrade.
    if previous.crds_in_crds_dir {
        adopt_crds(&release, &ns.name);
    }
    helm(
        &[
            &[
                "upgrade",
                &release,
                &chart,
                "--version",
                &version,
                "--plain-http",
            ],
            &["--namespace", &ns.name][..],
        ],
        &values,
    );

    this_charts_crds_are_served(&ns, &columns_before, &previous.version, &version).await;
    leases_keep_holders_and_tokens_rise(&ns, &leases, &before).await;

    let tested = helm_ok(true, &["test", &release, "--namespace", &ns.name, "--logs"]);
    let logs = text(&tested);
    println!("helm test after the upgrade:\n{logs}");
    assert_check_passed(&logs, "after the upgrade");

    uninstall_keeps_the_crds_and_leases(&ns, &release, &leases).await;
    release_crds();
}

/// The upgraded CRDs are this chart's: the Lease's printer columns, as `kubectl get`
/// shows them.
async fn this_charts_crds_are_served(
    ns: &TestNamespace,
    columns_before: &[String],
    previous_version: &str,
    version: &str,
) {
    let current_crds = std::fs::read_to_string(support::repo_root().join("crds/palisade.dev.yaml"))
        .expect("crds/palisade.dev.yaml");
    let columns = printer_columns("leases.palisade.dev").await;
    assert_eq!(
        columns,
        lease_columns(&current_crds),
        "the upgraded CRD is this chart's"
    );
    println!(
        "leases.palisade.dev columns: chart {previous_version} {columns_before:?} -> chart {version} {columns:?}"
    );
    let table = kubectl_ok(&["get", "pl", "-n", &ns.name]).stdout;
    let table = String::from_utf8_lossy(&table);
    let header = table.lines().next().unwrap_or_default();
    for column in &columns {
        assert!(
            header.contains(&column.to_uppercase()),
            "kubectl get pl shows the column {column}:\n{table}"
        );
    }
}

/// Every Lease kept its holder and token; the upgraded controller grants with a higher
/// token.
async fn leases_keep_holders_and_tokens_rise(
    ns: &TestNamespace,
    leases: &[String],
    before: &[(String, i64)],
) {
    for (lease, (holder, token_before)) in leases.iter().zip(before) {
        let now = wait_holder(ns, lease, holder).await;
        assert_eq!(
            token(&now),
            *token_before,
            "{lease} kept its holder and token"
        );
    }
    // The upgraded controller grants with a higher token.
    let first = &leases[0];
    delete_claim(ns, &before[0].0).await;
    let next = wait_holder(ns, first, &format!("{first}-waiter")).await;
    assert!(
        token(&next) > before[0].1,
        "the next grant's token {} > {}",
        token(&next),
        before[0].1
    );
}

/// `helm uninstall` keeps the CRDs (resource-policy keep) and the Leases.
async fn uninstall_keeps_the_crds_and_leases(ns: &TestNamespace, release: &str, leases: &[String]) {
    helm_ok(
        true,
        &["uninstall", release, "--namespace", &ns.name, "--wait"],
    );
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    for crd in CRDS {
        let kept = crds
            .get(crd)
            .await
            .unwrap_or_else(|e| panic!("helm uninstall kept {crd}: {e}"));
        let annotations = kept.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("helm.sh/resource-policy")
                .map(String::as_str),
            Some("keep")
        );
    }
    for lease in leases {
        ns.api::<Lease>()
            .get(lease)
            .await
            .expect("helm uninstall keeps the Leases");
    }
}

/// Lets pods of `ns` run on the node (cluster.sh keeps other namespaces' pods off it),
/// under the `restricted` Pod Security Standard, as the controller's and helm test's
/// pods must pass.
async fn run_pods_in(ns: &TestNamespace) {
    let patch = serde_json::json!({"metadata": {
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
        "annotations": {"scheduler.alpha.kubernetes.io/node-selector": ""},
    }});
    Api::<Namespace>::all(ns.client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("patching the test namespace");
}

struct Released {
    version: String,
    /// Its CRDs' YAML.
    crds: String,
    /// Whether it ships its CRDs in crds/ (chart 0.2.0), which Helm never owns.
    crds_in_crds_dir: bool,
}

/// The newest released chart older than this one (charts/released/), pushed to the
/// registry as it was released; its files unpacked under `scratch`.
fn push_released_chart(scratch: &Path) -> Released {
    let current = chart_version(&chart_field("version"));
    let (version, package) = released_charts()
        .into_iter()
        .find(|(version, _)| chart_version(version) < current)
        .expect("charts/released/ holds a chart older than Chart.yaml's version");
    let target = format!("oci://{}/charts", test_registry());
    helm_ok(
        false,
        &["push", package.to_str().unwrap(), &target, "--plain-http"],
    );
    let files = packaged_files(&package, scratch);
    let in_crds_dir = files.get(Path::new("palisade/crds/palisade.dev.yaml"));
    let crds = in_crds_dir
        .or_else(|| files.get(Path::new("palisade/files/crds.yaml")))
        .unwrap_or_else(|| panic!("{} has no CRDs", package.display()));
    Released {
        version,
        crds: String::from_utf8(crds.clone()).unwrap(),
        crds_in_crds_dir: in_crds_dir.is_some(),
    }
}

/// Three Leases, each held by a claim with one waiter behind it; their holders and tokens.
async fn hold_leases(ns: &TestNamespace) -> (Vec<String>, Vec<(String, i64)>) {
    let mut leases = Vec::new();
    let mut held = Vec::new();
    for i in 0..3 {
        let lease = format!("before-upgrade-{i}");
        create_lease(ns, &lease, LEASE_SECONDS).await;
        let holder = format!("{lease}-holder");
        create_claim(ns, &holder, &lease, None).await;
        let granted = wait_holder(ns, &lease, &holder).await;
        create_claim(ns, &format!("{lease}-waiter"), &lease, None).await;
        held.push((holder, token(&granted)));
        leases.push(lease);
    }
    (leases, held)
}

/// Sets each CRD in `yaml` to exactly that (no Helm metadata), as an install of a chart
/// with a crds/ directory leaves them. An update, not a delete: Leases of the cluster stay.
async fn replace_crds(yaml: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(support::client().await);
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let mut crd = CustomResourceDefinition::deserialize(doc).expect("a CRD");
        let name = crd.metadata.name.clone().expect("a CRD's name");
        let mut metadata = crds.get(&name).await.expect("the CRD exists").metadata;
        metadata.labels = None;
        metadata.annotations = None;
        metadata.managed_fields = None;
        crd.metadata = metadata;
        crds.replace(&name, &PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("replacing CRD {name}: {e}"));
    }
}

/// The printer columns of leases.palisade.dev in CRD YAML.
fn lease_columns(yaml: &str) -> Vec<String> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| CustomResourceDefinition::deserialize(doc).expect("a CRD"))
        .find(|crd| crd.metadata.name.as_deref() == Some("leases.palisade.dev"))
        .expect("leases.palisade.dev")
        .spec
        .versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect()
}

/// The printer columns `crd` is served with.
async fn printer_columns(crd: &str) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(support::client().await);
    let crd = crds.get(crd).await.expect("the CRD exists");
    crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect()
}

fn helm(command: &[&[&str]], values: &[String]) {
    let mut args: Vec<&str> = command.concat();
    args.extend(values.iter().map(String::as_str));
    helm_ok(true, &args);
}
