//! The chart on the node: README.md's install command, the controller's image and
//! leadership, `helm test`, and the uninstall when the story ends.

use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use support::helm::{assert_check_passed, oci_chart, release_crds, test_registry};

use crate::{
    LEDGER_NS, PUBLISHED_REGISTRY, README_INSTALL_BEGIN, README_INSTALL_END, RELEASE, SYSTEM_NS,
};
use crate::{event_naming, ok, run};

/// README.md's install command as helm arguments (without `helm`), installing from the
/// cluster's registry instead of the published one, over plain HTTP: a README change that
/// breaks the install fails the test that runs it.
pub fn readme_install_args() -> Vec<String> {
    let readme = std::fs::read_to_string(support::repo_root().join("README.md")).unwrap();
    let block = readme
        .split_once(README_INSTALL_BEGIN)
        .and_then(|(_, rest)| rest.split_once(README_INSTALL_END))
        .map(|(block, _)| block.replace("\\\n", " "))
        .unwrap_or_else(|| {
            panic!("README.md has no install command between {README_INSTALL_BEGIN} and {README_INSTALL_END}")
        });
    let commands: Vec<&str> = block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("helm "))
        .collect();
    let [command] = commands[..] else {
        panic!("README.md's install block must hold one helm command: {block}");
    };
    let registry = test_registry();
    let mut args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|w| w.replace(PUBLISHED_REGISTRY, &registry))
        .collect();
    let (chart, version) = oci_chart();
    let arg = |i: usize| args.get(i).map(String::as_str);
    assert!(
        arg(0) == Some("install") && arg(1) == Some(RELEASE) && arg(2) == Some(chart.as_str()),
        "README.md's command must be `helm install {RELEASE} oci://{PUBLISHED_REGISTRY}/charts/palisade ...` \
         (the test installs {chart} and checks release {RELEASE}): {command}"
    );
    let readme_version = args.iter().skip_while(|a| *a != "--version").nth(1);
    assert_eq!(
        readme_version,
        Some(&version),
        "README.md installs chart version {readme_version:?}, charts/palisade/Chart.yaml is {version}: \
         update README.md's install command"
    );
    assert!(
        args.windows(2).any(|w| w == ["--namespace", SYSTEM_NS]),
        "README.md's command must install into --namespace {SYSTEM_NS}: {command}"
    );
    args.push("--plain-http".into());
    args
}

/// The controller pods run `image` (as the Deployment names it), pulled from the registry:
/// their imageID is `repository@digest`. Returns the kubelet's Pulled event of one of them.
pub async fn check_controller_image(
    client: &Client,
    image: &str,
    repository: &str,
    digest: &str,
) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=controller");
    let running: Vec<Pod> = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(running.len(), 2, "expected 2 controller pods");
    let pulled_id = format!("{repository}@{digest}");
    for p in &running {
        let spec = &p.spec.as_ref().unwrap().containers[0];
        let status = &p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert_eq!(spec.image.as_deref(), Some(image), "pod {}", p.name_any());
        assert!(
            status.image_id.ends_with(&pulled_id),
            "pod {} runs imageID {}, not {pulled_id} (what make image-local pushed)",
            p.name_any(),
            status.image_id
        );
    }
    event_naming(client, SYSTEM_NS, &running[0].name_any(), "Pulled", image).await
}

/// `palisade_is_leader` of every controller pod, read through the API server's pod proxy.
pub async fn leaders(client: &Client) -> Vec<(String, bool)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=controller");
    let mut out = Vec::new();
    for p in pods.list(&lp).await.unwrap() {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.name_any();
        let req = http::Request::get(format!(
            "/api/v1/namespaces/{SYSTEM_NS}/pods/{name}:8080/proxy/metrics"
        ))
        .body(Vec::new())
        .unwrap();
        let Ok(metrics) = client.request_text(req).await else {
            continue;
        };
        let leader = metrics
            .lines()
            .find(|l| l.starts_with("palisade_is_leader"))
            .is_some_and(|l| l.trim_end().ends_with(" 1"));
        out.push((name, leader));
    }
    out
}

pub async fn ready_replicas(client: &Client) -> i32 {
    let d = Api::<Deployment>::namespaced(client.clone(), SYSTEM_NS)
        .get(RELEASE)
        .await
        .unwrap();
    let s = d.status.unwrap_or_default();
    if s.updated_replicas == Some(2) && s.replicas == Some(2) {
        s.ready_replicas.unwrap_or(0)
    } else {
        0
    }
}

/// `helm test`: the chart's check pod (`palisade check`, in the watched namespace) is
/// granted a Lease by the installed controller and finds both admission policies enforced.
pub fn helm_test(when: &str) {
    let t0 = Instant::now();
    ok(
        "helm",
        &["test", RELEASE, "-n", SYSTEM_NS, "--timeout", "3m"],
    );
    // The pod runs in the watched namespace, where `helm test --logs` does not look.
    let out = ok(
        "kubectl",
        &["logs", "-n", LEDGER_NS, &format!("{RELEASE}-test")],
    );
    let logs = String::from_utf8_lossy(&out.stdout);
    assert_check_passed(&logs, when);
    println!(
        "helm test {when}: passed in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

/// Uninstalls the release when the test ends, passed or not: a cluster-wide controller
/// left running would interfere with the test binaries that run after this one. The
/// CRDs it kept are left to no release, as the other tests expect them.
pub struct Uninstall;

impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", RELEASE, "-n", SYSTEM_NS, "--wait"]);
        let _ = run(
            "kubectl",
            &[
                "delete",
                "namespace",
                LEDGER_NS,
                "palisade-demo-test",
                "--wait=false",
            ],
        );
        release_crds();
    }
}
