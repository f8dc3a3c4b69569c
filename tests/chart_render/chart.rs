//! The chart as a package: its CRDs are the generated ones, and a change to it comes
//! with a new version.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use support::helm::{chart_dir, parse_objects, render};

use crate::find;

#[test]
fn chart_crds_are_a_byte_identical_copy_of_the_generated_crds() {
    let generated = support::repo_root().join("crds/palisade.dev.yaml");
    let copy = chart_dir().join("files/crds.yaml");
    let a = std::fs::read(&generated).expect("crds/palisade.dev.yaml");
    let b = std::fs::read(&copy).expect("charts/palisade/files/crds.yaml");
    assert!(
        a == b,
        "{} differs from {}: run `make crds`",
        copy.display(),
        generated.display()
    );
    // Helm installs a chart's crds/ directory once and never upgrades it.
    assert!(
        !chart_dir().join("crds").exists(),
        "charts/palisade/crds/ must not exist: the CRDs are templates (templates/crds.yaml)"
    );
}

/// The rendered CRDs are the generated ones, with the release's labels and, with
/// crds.keep (the default), the annotation that keeps them on `helm uninstall`.
#[test]
fn crds_render_from_the_generated_yaml_and_follow_crds_enabled_and_keep() {
    let generated = parse_objects(
        &std::fs::read_to_string(support::repo_root().join("crds/palisade.dev.yaml")).unwrap(),
    );
    let crds = |extra: &[&str]| -> Vec<Value> {
        render("rel", "ns", extra)
            .into_iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .collect()
    };
    let rendered = crds(&[]);
    assert_eq!(
        rendered.len(),
        generated.len(),
        "one rendered CRD per generated one"
    );
    for want in &generated {
        let name = want["metadata"]["name"].as_str().unwrap();
        let got = find(&rendered, "CustomResourceDefinition", name);
        let meta = &got["metadata"];
        assert_eq!(
            meta["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}"
        );
        assert_eq!(
            meta["labels"]["app.kubernetes.io/managed-by"], "Helm",
            "{name}"
        );
        assert_eq!(
            meta["labels"]["app.kubernetes.io/part-of"], "palisade",
            "{name}"
        );
        // Numbers compare as numbers (the generator writes 1.0, Helm's toYaml 1).
        let mut got = got.clone();
        got["metadata"] = json!({"name": name});
        assert!(
            same_numbers(&got, want),
            "the rendered {name} is not the generated one:\n{}",
            serde_json::to_string_pretty(&got).unwrap()
        );
    }
    for crd in crds(&["--set", "crds.keep=false"]) {
        assert!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
            "crds.keep=false still keeps {}",
            crd["metadata"]["name"]
        );
    }
    assert!(crds(&["--set", "crds.enabled=false"]).is_empty());
}

/// JSON equality where 1 and 1.0 are the same number.
fn same_numbers(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_numbers(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_numbers(v, w)))
        }
        _ => a == b,
    }
}

/// Every change to the chart comes with a new chart version: a version that is released
/// (charts/released/) is exactly the released chart, any other is above the newest
/// released one, and CHANGELOG.md has an entry for it; the app version is the crate's.
#[test]
fn chart_changes_come_with_a_version_bump_and_a_changelog_entry() {
    let chart = support::helm::chart_field("version");
    let app = support::helm::chart_field("appVersion");
    assert_eq!(
        app,
        env!("CARGO_PKG_VERSION"),
        "appVersion is the crate's version"
    );
    let released = support::helm::released_charts();
    let (newest, _) = released
        .first()
        .expect("charts/released/ holds at least one released chart");
    match released.iter().find(|(version, _)| *version == chart) {
        Some((_, package)) => {
            let scratch = tempfile::tempdir().unwrap();
            let dir = |name: &str| {
                let dir = scratch.path().join(name);
                std::fs::create_dir(&dir).unwrap();
                dir
            };
            let was = support::helm::packaged_files(package, &dir("released"));
            let current = support::helm::package_chart(&dir("package"));
            let now = support::helm::packaged_files(&current, &dir("current"));
            let paths: BTreeSet<_> = was.keys().chain(now.keys()).collect();
            let changed: Vec<String> = paths
                .into_iter()
                .filter(|path| was.get(*path) != now.get(*path))
                .map(|path| path.display().to_string())
                .collect();
            assert!(
                changed.is_empty(),
                "charts/palisade differs from the released chart {chart} \
                 (charts/released/palisade-{chart}.tgz) in {}: bump Chart.yaml's version \
                 (SemVer: minor for new values or objects, patch for fixes) and add its \
                 CHANGELOG.md entry",
                changed.join(", ")
            );
        }
        None => assert!(
            support::helm::chart_version(&chart) > support::helm::chart_version(newest),
            "Chart.yaml's version {chart} is not released and not above the newest released \
             chart, {newest} (charts/released/)"
        ),
    }
    let changelog = std::fs::read_to_string(support::repo_root().join("CHANGELOG.md")).unwrap();
    assert!(
        changelog.lines().any(|l| l.starts_with("## [")
            && l.contains(&format!("[{app}]"))
            && l.contains(&format!("(chart {chart})"))),
        "CHANGELOG.md has no entry `## [{app}] - <date> (chart {chart})`"
    );
}
