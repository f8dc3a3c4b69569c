//! The Helm chart (charts/palisade): helm with a home of its own, and a release
//! installed into a test namespace and uninstalled when the test ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Value, json};

use super::TestNamespace;
use super::tools::{kubectl_ok, run, text, tool};

pub fn chart_dir() -> PathBuf {
    super::repo_root().join("charts/palisade")
}

/// Gives `cmd` (helm, or a script that runs it) helm config/cache/data directories of
/// this test process, never the user's.
pub fn with_helm_home(cmd: &mut Command) -> &mut Command {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    let home = HOME.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("palisade-helm-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
}

/// helm with its own home ([`with_helm_home`]), and the test cluster's kubeconfig when
/// `cluster` is set.
pub fn helm_command(cluster: bool) -> Command {
    let mut cmd = Command::new(tool("helm"));
    with_helm_home(&mut cmd);
    if cluster {
        cmd.env("KUBECONFIG", super::kubeconfig_path());
    } else {
        // helm lint/template must not need a cluster.
        cmd.env("KUBECONFIG", "/nonexistent/kubeconfig");
    }
    cmd
}

/// helm `args`, which must succeed.
pub fn helm_ok(cluster: bool, args: &[&str]) -> Output {
    let mut cmd = helm_command(cluster);
    cmd.args(args);
    let out = run(cmd, None);
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}",
        text(&out)
    );
    out
}

/// A release installed into a test namespace; uninstalled when dropped (before the namespace).
pub struct Release {
    pub name: String,
    pub namespace: String,
}

impl Release {
    /// A release name of its own per namespace. It contains "palisade", so the chart's
    /// full name (and thus the ServiceAccount and cluster-scoped object names) is the
    /// release name itself.
    pub fn name_for(ns: &TestNamespace) -> String {
        let name = format!("palisade-{}", ns.name.trim_start_matches("t-"));
        assert!(name.len() <= 48, "release name {name} too long");
        name
    }

    /// Installs the chart with the policy bindings limited to `policy_namespaces`.
    pub fn install(ns: &TestNamespace, policy_namespaces: &[&str], extra: &[&str]) -> Self {
        let name = Self::name_for(ns);
        let selector = json!({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": policy_namespaces
        }]});
        let selector = format!("policies.namespaceSelector={selector}");
        let chart = chart_dir();
        let mut args = vec![
            "install",
            &name,
            chart.to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--set-json",
            &selector,
            // The suite applies the CRDs (`apply_crds`) and many releases run at once: one
            // release cannot own them. tests/chart_upgrade.rs tests the chart's CRDs.
            "--set",
            "crds.enabled=false",
        ];
        args.extend_from_slice(extra);
        let out = helm_ok(true, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("Warning") && !stderr.contains("WARNING"),
            "helm install printed warnings:\n{}",
            text(&out)
        );
        Self {
            name,
            namespace: ns.name.clone(),
        }
    }

    pub fn uninstall(&self) -> Output {
        helm_ok(
            true,
            &["uninstall", &self.name, "--namespace", &self.namespace],
        )
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut cmd = helm_command(true);
        cmd.args([
            "uninstall",
            &self.name,
            "--namespace",
            &self.namespace,
            "--ignore-not-found",
        ]);
        let _ = run(cmd, None);
    }
}

/// A top-level field of charts/palisade/Chart.yaml, unquoted: `version`, `appVersion`.
pub fn chart_field(key: &str) -> String {
    let path = chart_dir().join("Chart.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("{} has no `{key}:`", path.display()))
}

/// `x.y.z` of a chart version (no pre-release or build parts), comparable.
pub fn chart_version(version: &str) -> (u64, u64, u64) {
    let parts: Vec<u64> = version
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("chart version {version:?} is not x.y.z"))
        })
        .collect();
    match parts[..] {
        [x, y, z] => (x, y, z),
        _ => panic!("chart version {version:?} is not x.y.z"),
    }
}

/// The released charts as `make chart-release` keeps them in the repository
/// (charts/released/palisade-<version>.tgz): version and package, newest first.
pub fn released_charts() -> Vec<(String, PathBuf)> {
    let dir = super::repo_root().join("charts/released");
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e} (the released charts)", dir.display()));
    let mut charts: Vec<(String, PathBuf)> = entries
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let version = name.strip_prefix("palisade-")?.strip_suffix(".tgz")?;
            Some((version.to_string(), path.clone()))
        })
        .collect();
    charts.sort_by_key(|(version, _)| std::cmp::Reverse(chart_version(version)));
    charts
}

/// `helm package` of charts/palisade into `dir`; the package's path.
pub fn package_chart(dir: &Path) -> PathBuf {
    let chart = chart_dir();
    helm_ok(
        false,
        &[
            "package",
            chart.to_str().unwrap(),
            "--destination",
            dir.to_str().unwrap(),
        ],
    );
    dir.join(format!("palisade-{}.tgz", chart_field("version")))
}

/// Every file of a packaged chart (a `helm package` .tgz) by its path in the package.
pub fn packaged_files(package: &Path, scratch: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut cmd = Command::new("tar");
    cmd.arg("-xzf").arg(package).arg("-C").arg(scratch);
    let out = run(cmd, None);
    assert!(
        out.status.success(),
        "unpacking {}: {}",
        package.display(),
        text(&out)
    );
    let mut files = BTreeMap::new();
    let mut dirs = vec![scratch.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(path.strip_prefix(scratch).unwrap().to_path_buf(), bytes);
            }
        }
    }
    files
}

/// The cluster's image registry, `host:port` (PALISADE_TEST_REGISTRY, which the Makefile
/// exports), where `make chart` pushes the chart and `make image-local` the images.
pub fn test_registry() -> String {
    std::env::var("PALISADE_TEST_REGISTRY")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "PALISADE_TEST_REGISTRY is not set: it names the cluster's image registry \
                 (host:port, 127.0.0.1:15005 by default) that `make chart` pushes the chart to \
                 and `make image-local` the images; run the tests through `make test`, or \
                 export it after `make cluster chart image-local`"
            )
        })
}

/// The chart as `make chart` pushed it: `oci://<registry>/charts/palisade`, and its
/// version (Chart.yaml's), for `helm install <ref> --version <version> --plain-http`.
pub fn oci_chart() -> (String, String) {
    (
        format!("oci://{}/charts/palisade", test_registry()),
        chart_field("version"),
    )
}

/// `helm template` of the chart, parsed into its objects.
pub fn render(release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    let out = helm_ok(false, &args);
    parse_objects(&String::from_utf8(out.stdout).unwrap())
}

/// The objects of a multi-document YAML stream.
pub fn parse_objects(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart's CRDs.
pub const CRDS: [&str; 2] = ["leases.palisade.dev", "leaseclaims.palisade.dev"];

/// Marks the CRDs as `release`'s, the step docs/operating.md ("CRDs") gives users whose
/// cluster has them already (applied by hand, or left by chart 0.2.0): Helm then takes
/// them over instead of refusing the install.
pub fn adopt_crds(release: &str, namespace: &str) {
    let owner = [
        format!("meta.helm.sh/release-name={release}"),
        format!("meta.helm.sh/release-namespace={namespace}"),
    ];
    let owner: Vec<&str> = owner.iter().map(String::as_str).collect();
    kubectl_ok(
        &[
            &["label", "--overwrite", "crd"][..],
            &CRDS,
            &["app.kubernetes.io/managed-by=Helm"],
        ]
        .concat(),
    );
    kubectl_ok(&[&["annotate", "--overwrite", "crd"][..], &CRDS, &owner].concat());
}

/// Leaves the (kept) CRDs to no release, as the suite's other tests and a later install
/// expect them. Best effort: it runs from test clean-ups.
pub fn release_crds() {
    let release = [
        &["annotate", "crd"][..],
        &CRDS,
        &[
            "meta.helm.sh/release-name-",
            "meta.helm.sh/release-namespace-",
        ],
    ];
    let _ = super::tools::kubectl(&release.concat(), None);
}

/// Asserts that the log of `helm test`'s pod (`palisade check`) reports each check passed.
pub fn assert_check_passed(logs: &str, when: &str) {
    for line in [
        "ok: lease",
        "ok: object fencing refused",
        "ok: claim identity refused",
    ] {
        assert!(
            logs.contains(line),
            "helm test {when}: no {line:?} in\n{logs}"
        );
    }
}
