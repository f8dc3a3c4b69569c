//! The chart's upgrade path on the node, as a cluster meets it: the last released chart
//! (the newest `chart-v*` tag) installed from the registry, Leases granted by its
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
use palisade::api::Lease;
use serde::Deserialize;
use support::claims::{create_claim, create_lease, delete_claim, wait_holder};
use support::helm::{
    CRDS, adopt_crds, assert_check_passed, chart_field, helm_ok, oci_chart, release_crds,
    test_registry,
};
use support::tools::{git, kubectl_ok, text};
use support::{TestNamespace, setup, token};

/// Long enough that no test grant expires (claims here are never renewed).
const LEASE_SECONDS: i64 = 3600;

#[tokio::test]
async fn upgrade_from_the_last_released_chart_keeps_every_lease_and_token() {
    let ns = setup("chart-upgrade").await;
    run_pods_in(&ns).await;
    let (chart, version) = oci_chart();
    let work = tempdir();
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

    // A cluster on the released chart: its CRDs, as its crds/ directory installed them.
    let old_crds = work.path().join("charts/palisade/crds/palisade.dev.yaml");
    replace_crds(&std::fs::read_to_string(old_crds).expect("the released chart's crds/")).await;
    let columns_before = printer_columns("leases.palisade.dev").await;
    assert!(!columns_before.contains(&"Duration".to_string()));
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

    let columns = printer_columns("leases.palisade.dev").await;
    assert!(
        columns.contains(&"Duration".to_string()),
        "the upgraded CRD serves the new column: {columns:?}"
    );
    println!(
        "leases.palisade.dev columns: chart {} {columns_before:?} -> chart {version} {columns:?}",
        previous.version
    );
    let table = text(&kubectl_ok(&["get", "pl", "-n", &ns.name]));
    assert!(
        table.contains("DURATION"),
        "kubectl get pl shows the new column:\n{table}"
    );
    for (lease, (holder, token_before)) in leases.iter().zip(&before) {
        let now = wait_holder(&ns, lease, holder).await;
        assert_eq!(
            token(&now),
            *token_before,
            "{lease} kept its holder and token"
        );
    }
    // The upgraded controller grants with a higher token.
    let first = &leases[0];
    delete_claim(&ns, &before[0].0).await;
    let next = wait_holder(&ns, first, &format!("{first}-waiter")).await;
    assert!(
        token(&next) > before[0].1,
        "the next grant's token {} > {}",
        token(&next),
        before[0].1
    );

    let tested = helm_ok(true, &["test", &release, "--namespace", &ns.name, "--logs"]);
    let logs = text(&tested);
    println!("helm test after the upgrade:\n{logs}");
    assert_check_passed(&logs, "after the upgrade");

    helm_ok(
        true,
        &["uninstall", &release, "--namespace", &ns.name, "--wait"],
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
    for lease in &leases {
        ns.api::<Lease>()
            .get(lease)
            .await
            .expect("helm uninstall keeps the Leases");
    }
    release_crds();
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
    /// Whether it ships its CRDs in crds/ (chart 0.2.0), which Helm never owns.
    crds_in_crds_dir: bool,
}

/// The newest `chart-v*` tag's chart, packaged and pushed to the registry, unpacked in `dir`.
fn push_released_chart(dir: &Path) -> Released {
    let tags = git(&["tag", "--list", "chart-v*", "--sort=-v:refname"]);
    let current = chart_field("version");
    let tag = tags
        .lines()
        .find(|t| t.trim_start_matches("chart-v") != current)
        .expect("a chart-v* tag of an earlier chart version (git fetch --tags)")
        .to_string();
    let archive = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "git archive {tag} charts/palisade | tar -x -C '{}'",
            dir.display()
        ))
        .current_dir(support::repo_root())
        .output()
        .expect("git archive | tar");
    assert!(
        archive.status.success(),
        "unpacking {tag}: {}",
        text(&archive)
    );
    let chart_dir = dir.join("charts/palisade");
    let dest = dir.to_str().unwrap();
    helm_ok(
        false,
        &[
            "package",
            chart_dir.to_str().unwrap(),
            "--destination",
            dest,
        ],
    );
    let version = tag.trim_start_matches("chart-v").to_string();
    let package = dir.join(format!("palisade-{version}.tgz"));
    let target = format!("oci://{}/charts", test_registry());
    helm_ok(
        false,
        &["push", package.to_str().unwrap(), &target, "--plain-http"],
    );
    Released {
        version,
        crds_in_crds_dir: chart_dir.join("crds").is_dir(),
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

/// A directory of this test's own, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> TempDir {
    let dir = std::env::temp_dir().join(format!("palisade-chart-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}
