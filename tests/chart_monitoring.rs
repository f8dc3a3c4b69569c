//! The chart's monitoring objects, no cluster: the PrometheusRule (the controller's
//! alerts) and the Grafana dashboard's ConfigMap, as `helm template` renders them, with
//! the rules checked and unit-tested by promtool (tests/monitoring/alerts.test.yaml) and
//! every dashboard query evaluated by promtool on series named after the controller's
//! real metrics (`palisade::controller::metrics::Metrics`), so that a metric renamed in
//! src/ fails here.
//!
//! helm is the pinned one on PATH (`make test`); promtool the one `make promtool` builds,
//! found through `PROMTOOL`, which the Makefile exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use palisade::controller::metrics::Metrics;
use serde_json::{Value, json};
use support::helm::{chart_dir, helm_ok};
use support::tools::{run, text};

const RELEASE: &str = "palisade";
const NAMESPACE: &str = "palisade-system";
/// The series labels the chart's default selector picks (the ServiceMonitor's job).
const JOB: &str = "palisade-metrics";

/// `helm template` of the chart with `extra` flags, parsed into its objects.
fn render(extra: &[&str]) -> Vec<Value> {
    support::helm::render(RELEASE, NAMESPACE, extra)
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind)
}

fn dashboard_config_map(objects: &[Value]) -> Option<&Value> {
    objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"].get("palisade.json").is_some())
}

/// The rule groups of the chart's PrometheusRule, with its default values.
fn rule_groups() -> Value {
    let objects = render(&["--set", "prometheusRule.enabled=true"]);
    let rule = find(&objects, "PrometheusRule").expect("a PrometheusRule");
    json!({"groups": rule["spec"]["groups"]})
}

fn rules(groups: &Value) -> Vec<&Value> {
    groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect()
}

/// promtool, as `make promtool` builds it; never skipped.
fn promtool() -> PathBuf {
    let path = std::env::var_os("PROMTOOL").map(PathBuf::from);
    match path {
        Some(p) if p.is_file() => p,
        _ => panic!(
            "promtool is missing (PROMTOOL={path:?}). `make promtool` builds it and the \
             Makefile exports PROMTOOL (`make test` does both); outside make, set PROMTOOL \
             to the binary in ~/.cache/palisade/promtool-<version>-<hash>/"
        ),
    }
}

/// promtool `args` in `dir`, which must succeed; its output.
fn promtool_ok(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(promtool());
    cmd.current_dir(dir).args(args);
    let out = run(cmd, None);
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}",
        text(&out)
    );
    text(&out)
}

fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// The `palisade_*` names in `s`.
fn metric_names(s: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = s;
    while let Some(at) = rest.find("palisade_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// One sample line of the controller's exposition: its series name, labels, and the
/// type of its metric family.
struct Sample {
    name: String,
    labels: String,
    family_type: String,
}

/// The controller's metrics as `/metrics` serves them, from the real registry.
fn controller_samples() -> Vec<Sample> {
    // Metrics::default() materializes the label families (every `kind` at 0), so
    // the labelled series are in the exposition too.
    let text = Metrics::default().encode();
    let mut family_type = String::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family_type = rest.split_whitespace().nth(1).unwrap().to_string();
        } else if !line.starts_with('#') {
            let series = line.rsplit_once(' ').unwrap().0;
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            samples.push(Sample {
                name: name.to_string(),
                labels: labels.to_string(),
                family_type: family_type.clone(),
            });
        }
    }
    assert!(
        samples.iter().any(|s| s.name == "palisade_grants_total"),
        "the exposition parsed into no known series:\n{text}"
    );
    samples
}

/// A GitHub heading anchor.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn operating_md_anchors() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(support::repo_root().join("docs/operating.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn monitoring_objects_are_off_by_default() {
    let objects = render(&[]);
    assert!(find(&objects, "PrometheusRule").is_none());
    assert!(dashboard_config_map(&objects).is_none());
}

#[test]
fn helm_lint_is_clean_with_the_monitoring_objects_on() {
    let chart = chart_dir();
    let out = helm_ok(
        false,
        &[
            "lint",
            "--strict",
            chart.to_str().unwrap(),
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "grafanaDashboard.folder=Locks",
        ],
    );
    let all = text(&out);
    assert!(
        !all.contains("[WARNING]") && !all.contains("[ERROR]"),
        "helm lint is not clean:\n{all}"
    );
}

#[test]
fn bad_monitoring_values_fail_naming_the_value() {
    for (set, named) in [
        (
            "prometheusRule.noLeader.for=2 minutes",
            "/prometheusRule/noLeader/for",
        ),
        (
            "prometheusRule.writeConflicts.factor=0",
            "/prometheusRule/writeConflicts/factor",
        ),
        ("prometheusRule.severity=critical", "severity"),
        (
            "grafanaDashboard.label=not a label",
            "/grafanaDashboard/label",
        ),
    ] {
        let chart = chart_dir();
        let mut cmd = support::helm::helm_command(false);
        cmd.args(["template", "p", chart.to_str().unwrap(), "--set", set]);
        let out = run(cmd, None);
        let all = text(&out);
        assert!(!out.status.success(), "--set {set} rendered:\n{all}");
        assert!(
            all.contains(named),
            "--set {set}: the error does not name {named}:\n{all}"
        );
    }
}

#[test]
fn the_prometheus_rule_renders_with_its_labels_and_runbooks() {
    let objects = render(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusRule.labels.release=kube-prometheus",
        "--set",
        "prometheusRule.alertLabels.team=locks",
        "--set",
        "prometheusRule.noLeader.for=7m",
    ]);
    let rule = find(&objects, "PrometheusRule").expect("a PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    let labels = &rule["metadata"]["labels"];
    assert_eq!(labels["release"], "kube-prometheus");
    assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
    let groups = json!({"groups": rule["spec"]["groups"]});
    let anchors = operating_md_anchors();
    let mut names = Vec::new();
    for r in rules(&groups) {
        let name = r["alert"].as_str().expect("only alerting rules");
        names.push(name);
        assert_eq!(r["labels"]["team"], "locks", "{name}: alertLabels");
        assert!(r["labels"]["severity"].is_string(), "{name}: severity");
        let selector = format!("job=\"{JOB}\", namespace=\"{NAMESPACE}\"");
        assert!(
            r["expr"].as_str().unwrap().contains(&selector),
            "{name} does not select this release's series: {}",
            r["expr"]
        );
        let a = &r["annotations"];
        assert!(a["summary"].as_str().is_some_and(|s| !s.is_empty()));
        let runbook = format!("docs/operating.md#{}", name.to_lowercase());
        assert!(
            a["description"].as_str().unwrap().contains(&runbook),
            "{name}: the description names its runbook {runbook}"
        );
        let url = a["runbook_url"].as_str().unwrap();
        assert!(url.ends_with(&runbook), "{name}: runbook_url {url}");
        assert!(
            anchors.contains(&name.to_lowercase()),
            "{name}: docs/operating.md has no heading `{name}` for its runbook link"
        );
    }
    let no_leader = rules(&groups)
        .into_iter()
        .find(|r| r["alert"] == "PalisadeNoLeader")
        .unwrap();
    assert_eq!(no_leader["for"], "7m");
    assert_eq!(
        names,
        [
            "PalisadeNoLeader",
            "PalisadeSeveralLeaders",
            "PalisadeWriteErrors",
            "PalisadeWriteConflictsHigh",
            "PalisadeEventsDropped",
            "PalisadeQueueGrowing",
        ]
    );
}

#[test]
fn several_leaders_is_no_alert_without_leader_election() {
    // Without the election every replica reports palisade_is_leader 1.
    let objects = render(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "controller.leaderElection.enabled=false",
    ]);
    let rule = find(&objects, "PrometheusRule").expect("a PrometheusRule");
    let groups = json!({"groups": rule["spec"]["groups"]});
    let names: Vec<&Value> = rules(&groups).iter().map(|r| &r["alert"]).collect();
    assert!(
        !names.contains(&&json!("PalisadeSeveralLeaders")),
        "{names:?}"
    );
    assert!(names.contains(&&json!("PalisadeNoLeader")), "{names:?}");
}

#[test]
fn the_dashboard_config_map_carries_the_sidecar_label_and_the_dashboard() {
    let objects = render(&["--set", "grafanaDashboard.enabled=true"]);
    let cm = dashboard_config_map(&objects).expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["name"], "palisade-dashboard");
    assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        cm["metadata"]["labels"]["app.kubernetes.io/instance"],
        RELEASE
    );
    assert!(cm["metadata"].get("annotations").is_none(), "no folder");
    let shipped = cm["data"]["palisade.json"].as_str().unwrap();
    let dashboard: Value = serde_json::from_str(shipped).expect("the dashboard is valid JSON");
    let file = chart_dir().join("dashboards/palisade.json");
    let source: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(
        dashboard, source,
        "the ConfigMap ships dashboards/palisade.json"
    );
    assert_eq!(dashboard["uid"], "palisade-controller");
    assert!(dashboard["title"].is_string());

    let objects = render(&[
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "grafanaDashboard.label=dashboards",
        "--set",
        "grafanaDashboard.labelValue=palisade",
        "--set",
        "grafanaDashboard.namespace=monitoring",
        "--set",
        "grafanaDashboard.folder=Locks",
    ]);
    let cm = dashboard_config_map(&objects).expect("the dashboard ConfigMap");
    let meta = &cm["metadata"];
    assert_eq!(meta["namespace"], "monitoring");
    assert_eq!(meta["labels"]["dashboards"], "palisade");
    assert!(meta["labels"].get("grafana_dashboard").is_none());
    assert_eq!(
        meta["annotations"],
        json!({"k8s-sidecar-target-directory": "Locks"})
    );
}

#[test]
fn the_dashboard_has_a_datasource_variable_that_every_panel_uses() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(datasource["query"], "prometheus");
    let name = datasource["name"].as_str().unwrap();
    let uses = |v: &Value| v["datasource"]["uid"] == format!("${{{name}}}");
    for panel in panels(&dashboard) {
        assert!(uses(panel), "panel {} ignores the variable", panel["title"]);
        for target in panel["targets"].as_array().unwrap() {
            assert!(uses(target), "a query of {} ignores it", panel["title"]);
        }
    }
}

fn dashboard() -> Value {
    let file = chart_dir().join("dashboards/palisade.json");
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

fn panels(dashboard: &Value) -> Vec<&Value> {
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 7, "the dashboard's panels: {panels:?}");
    panels.iter().collect()
}

/// Every query of the dashboard, its Grafana variables replaced as Grafana would.
fn panel_queries() -> Vec<(String, String)> {
    let dashboard = dashboard();
    let mut queries = Vec::new();
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$namespace", NAMESPACE)
                .replace("$job", JOB);
            assert!(!expr.contains('$'), "a variable left in {expr}");
            queries.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    queries
}

#[test]
fn promtool_checks_the_rendered_rules() {
    let dir = tempfile::tempdir().unwrap();
    write_json(&dir.path().join("rules.json"), &rule_groups());
    let out = promtool_ok(
        dir.path(),
        &["check", "rules", "--lint-fatal", "rules.json"],
    );
    assert!(out.contains("6 rules found"), "{out}");
}

#[test]
fn promtool_tests_every_alert_firing_and_not_firing() {
    let mut groups = rule_groups();
    // promtool compares annotations in full: the test file checks labels only (the
    // annotations are checked above, their templates by `promtool check rules`).
    for group in groups["groups"].as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            rule.as_object_mut().unwrap().remove("annotations");
        }
    }
    let tests = support::repo_root().join("tests/monitoring/alerts.test.yaml");
    let dir = tempfile::tempdir().unwrap();
    write_json(&dir.path().join("palisade-rules.json"), &groups);
    std::fs::copy(&tests, dir.path().join("alerts.test.yaml")).unwrap();
    let out = promtool_ok(dir.path(), &["test", "rules", "alerts.test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");

    // Each alert is expected at least once to fire and once not to.
    let cases: Value = serde_yaml::from_str(&std::fs::read_to_string(&tests).unwrap()).unwrap();
    let checks: Vec<&Value> = cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .collect();
    for rule in rules(&groups) {
        let name = &rule["alert"];
        let expected = |firing: bool| {
            checks.iter().any(|c| {
                c["alertname"] == *name && c["exp_alerts"].as_array().unwrap().is_empty() != firing
            })
        };
        assert!(expected(true), "no test expects {name} to fire");
        assert!(expected(false), "no test expects {name} not to fire");
    }
}

#[test]
fn every_metric_the_rules_the_dashboard_and_the_alert_tests_name_is_exposed() {
    let exposed: BTreeSet<String> = controller_samples().into_iter().map(|s| s.name).collect();
    let tests =
        std::fs::read_to_string(support::repo_root().join("tests/monitoring/alerts.test.yaml"));
    let groups = rule_groups();
    let exprs = |e: Vec<String>| e.join("\n");
    let sources = [
        (
            "the chart's alerts",
            exprs(
                rules(&groups)
                    .iter()
                    .map(|r| r["expr"].to_string())
                    .collect(),
            ),
        ),
        (
            "the dashboard's queries",
            exprs(panel_queries().into_iter().map(|(_, e)| e).collect()),
        ),
        ("tests/monitoring/alerts.test.yaml", tests.unwrap()),
    ];
    for (what, source) in sources {
        let named = metric_names(&source);
        assert!(!named.is_empty(), "{what} names no metric");
        let unknown: Vec<_> = named.difference(&exposed).collect();
        assert!(
            unknown.is_empty(),
            "{what} names series the controller does not expose: {unknown:?}; it exposes {exposed:?}"
        );
    }
}

/// promtool input series for every series of the controller's exposition, on two
/// replicas: counters grow, histogram buckets grow faster the wider they are (so
/// quantiles exist), gauges are 1.
fn synthetic_series() -> Vec<Value> {
    let mut series = Vec::new();
    let mut bucket_rank = 0;
    for sample in controller_samples() {
        let values = match sample.family_type.as_str() {
            "histogram" if sample.name.ends_with("_bucket") => {
                bucket_rank += 1;
                format!("0+{bucket_rank}x60")
            }
            "counter" | "histogram" => "0+1x60".to_string(),
            "gauge" => "1x60".to_string(),
            other => panic!("a metric of type {other}: give it synthetic values"),
        };
        for pod in ["palisade-a", "palisade-b"] {
            let mut labels = format!("job=\"{JOB}\", namespace=\"{NAMESPACE}\", pod=\"{pod}\"");
            if !sample.labels.is_empty() {
                labels = format!("{}, {labels}", sample.labels);
            }
            series
                .push(json!({"series": format!("{}{{{labels}}}", sample.name), "values": values}));
        }
    }
    series
}

#[test]
fn promtool_evaluates_every_dashboard_query_on_the_controller_series() {
    let queries = panel_queries();
    let checks: Vec<Value> = queries
        .iter()
        .map(|(_, expr)| {
            json!({
                "expr": format!("clamp_max(count({expr}), 1)"),
                "eval_time": "30m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            })
        })
        .collect();
    let test = json!({
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "every dashboard query has a result on the controller's series",
            "interval": "1m",
            "input_series": synthetic_series(),
            "promql_expr_test": checks,
        }],
    });
    let dir = tempfile::tempdir().unwrap();
    write_json(&dir.path().join("dashboard.test.json"), &test);
    let mut cmd = Command::new(promtool());
    cmd.current_dir(dir.path())
        .args(["test", "rules", "dashboard.test.json"]);
    let out = run(cmd, None);
    let panels: Vec<String> = queries.iter().map(|(t, e)| format!("{t}: {e}")).collect();
    assert!(
        out.status.success(),
        "a dashboard query has no result on series named after the controller's metrics \
         (a metric renamed?). The queries:\n{}\n{}",
        panels.join("\n"),
        text(&out)
    );
}
