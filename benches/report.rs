//! Merges the benchmark outputs of one `make bench` run into one report.
//!
//! Reads every `DIR/*.json` in the schema of `benches/common/schema.rs` (palisade's
//! handover bench, the client-go and Rust peers, the scale bench, the HA bench, the
//! fenced-operator bench) and writes `DIR/results.json` (every figure with its unit,
//! the versions used, the machine), `DIR/results.md` (printed too: the handover
//! latency table, the failover, storm, HA and fenced-operator tables, other figures,
//! the targets met or missed) and `DIR/handover-latency.png`
//! (the handover latency distributions, one panel per scenario). `cargo bench --bench report -- [--dir DIR] [--smoke]`; `make test`
//! runs it on the smoke outputs so it cannot rot.
//!
//! The chart's text is drawn with the DejaVu Sans font read at run time from
//! [`FONT`] (Debian/Ubuntu package `fonts-dejavu-core`).

#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::combinators::{BindKeyPoints, IntoLogRange};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use schema::{
    Figure, HA_LEADER_MOVED, HA_ROWS, Latency, OPERATOR_ADMISSION_ADDED,
    OPERATOR_ADMISSION_CONFIGS, OPERATOR_ADMISSION_NO_POLICY_DIFFERENCE, OPERATOR_SCENARIOS,
    OPERATOR_TO_LEADING, OTHER_SCENARIOS, SCENARIOS, SEMAPHORE_ROWS, Source, StormWaiters,
};
use serde_json::json;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const OUTPUTS: [&str; 3] = ["results.json", "results.md", "handover-latency.png"];
/// The sources `make bench` is meant to produce; a missing one is named in the report.
const EXPECTED: [&str; 7] = [
    "palisade-handover",
    "palisade-agent",
    "palisade-operator",
    "clientgo",
    "rust-peers",
    "scale",
    "ha",
];

/// Merges the outputs of one `make bench` run into results.json, results.md and the chart.
#[derive(clap::Parser)]
struct Args {
    /// The directory of the benchmark outputs, and of the report.
    #[arg(long, default_value = "target/bench")]
    dir: PathBuf,
    /// Say the figures come from a smoke run (they mean nothing).
    #[arg(long)]
    smoke: bool,
    /// Also write the figures into this document (docs/performance.md), between its
    /// markers ([`FIGURES_BEGIN`], [`FIGURES_END`]), with the run's date.
    #[arg(long)]
    publish: Option<PathBuf>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let published = |md: &str| match &args.publish {
        Some(doc) => publish(doc, md),
        None => Ok(()),
    };
    if let Err(e) = run(&args.dir, args.smoke).and_then(|md| published(&md)) {
        eprintln!("report: {e}");
        std::process::exit(1);
    }
}

/// Writes the report into `dir` and returns its Markdown.
fn run(dir: &Path, smoke: bool) -> Result<String, String> {
    let (sources, rejected) = read_sources(dir)?;
    // The smoke run of `make test` keeps the writers to the schema.
    if smoke && !rejected.is_empty() {
        return Err(format!(
            "outputs not in the schema of benches/common/schema.rs: {}",
            rejected.join("; ")
        ));
    }
    if sources.is_empty() {
        return Err(format!(
            "no benchmark outputs (*.json) in {}: run `make bench`",
            dir.display()
        ));
    }
    let missing: Vec<&str> = EXPECTED
        .iter()
        .copied()
        .filter(|e| !sources.iter().any(|(_, s)| s.source.starts_with(e)))
        .collect();
    let machine = machine();
    let mut versions: BTreeMap<String, String> = BTreeMap::new();
    for (_, s) in &sources {
        for (k, v) in &s.versions {
            let entry = versions.entry(k.clone()).or_default();
            if entry.is_empty() {
                *entry = v.clone();
            } else if !entry.split(", ").any(|e| e == v) {
                *entry = format!("{entry}, {v}");
            }
        }
    }
    let mut latency: Vec<Latency> = sources
        .iter()
        .flat_map(|(_, s)| s.latency.iter().cloned())
        .collect();
    for l in &mut latency {
        to_ms(l);
    }
    let figures: Vec<Figure> = sources
        .iter()
        .flat_map(|(_, s)| s.figures.iter().cloned())
        .collect();
    let targets = targets(&latency, &figures);

    let results = json!({
        "generated_by": "benches/report.rs",
        "smoke": smoke,
        "versions": versions,
        "machine": machine,
        "sources": sources.iter().map(|(file, s)| json!({
            "source": s.source, "file": file, "parameters": s.parameters,
        })).collect::<Vec<_>>(),
        "missing_sources": missing,
        "rejected_sources": rejected,
        "latency": latency,
        "figures": figures.iter().map(figure_json).collect::<Vec<_>>(),
        "targets": targets.iter().map(|t| json!({
            "target": t.target, "measured": t.measured, "status": t.status.word(),
        })).collect::<Vec<_>>(),
    });
    write(
        &dir.join(OUTPUTS[0]),
        serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?,
    )?;
    let md = markdown(
        smoke, &versions, &machine, &sources, &missing, &rejected, &latency, &figures, &targets,
    );
    write(&dir.join(OUTPUTS[1]), &md)?;
    let png = dir.join(OUTPUTS[2]);
    chart(&png, &handover_only(&latency), smoke)?;
    println!("{md}");
    println!(
        "wrote {}, {} and {}",
        dir.join(OUTPUTS[0]).display(),
        dir.join(OUTPUTS[1]).display(),
        png.display()
    );
    Ok(md)
}

/// Where a published document holds the figures of the latest run.
const FIGURES_BEGIN: &str =
    "<!-- make bench writes what follows, up to the end marker: do not edit by hand -->";
const FIGURES_END: &str = "<!-- end of what make bench writes -->";

/// Replaces the figures between the markers of `doc` with `md` (its title dropped,
/// its sections one level down) and today's date; the document is replaced whole
/// (written beside it, then renamed), so it is never left half-written.
fn publish(doc: &Path, md: &str) -> Result<(), String> {
    let text =
        std::fs::read_to_string(doc).map_err(|e| format!("reading {}: {e}", doc.display()))?;
    let (Some(begin), Some(end)) = (text.find(FIGURES_BEGIN), text.find(FIGURES_END)) else {
        return Err(format!(
            "{} has no figures to replace: it needs the lines {FIGURES_BEGIN:?} and {FIGURES_END:?}",
            doc.display()
        ));
    };
    if end < begin {
        return Err(format!(
            "{}: the end marker comes before the begin marker",
            doc.display()
        ));
    }
    let date = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d");
    let body: String = md
        .lines()
        .filter(|l| !l.starts_with("# "))
        .map(|l| {
            if l.starts_with('#') {
                format!("#{l}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let replaced = format!(
        "{}{FIGURES_BEGIN}\n\nThe figures of the latest `make bench` run, of {date}:\n{body}\n{}",
        &text[..begin],
        &text[end..]
    );
    let partial = doc.with_extension("md.partial");
    write(&partial, replaced)?;
    std::fs::rename(&partial, doc).map_err(|e| format!("replacing {}: {e}", doc.display()))?;
    println!("published the figures into {}", doc.display());
    Ok(())
}

fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), String> {
    std::fs::write(path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Every `*.json` of `dir` but the report's own, by file name, checked against the
/// schema ([`Source::problems`]); those that break it come back apart, with why.
type Sources = (Vec<(String, Source)>, Vec<String>);

fn read_sources(dir: &Path) -> Result<Sources, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| p.file_name().is_some_and(|n| n != OUTPUTS[0]))
        .collect();
    files.sort();
    let mut sources = Vec::new();
    let mut rejected = Vec::new();
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let text =
            std::fs::read_to_string(&f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let problems = match serde_json::from_str::<Source>(&text) {
            Ok(s) => match s.problems() {
                p if p.is_empty() => {
                    sources.push((name, s));
                    continue;
                }
                p => p.join("; "),
            },
            Err(e) => e.to_string(),
        };
        eprintln!(
            "report: skipping {} (not in the common schema: {problems})",
            f.display()
        );
        rejected.push(format!("{name}: {problems}"));
    }
    // palisade first, then the peers, then the rest, each group by file name.
    sources.sort_by_key(|(name, s)| (rank(&s.source), name.clone()));
    Ok((sources, rejected))
}

fn rank(source_or_system: &str) -> usize {
    const ORDER: [&str; 5] = ["palisade", "client", "kube-leader", "kubert", "rust"];
    ORDER
        .iter()
        .position(|p| source_or_system.starts_with(p))
        .unwrap_or(ORDER.len())
}

/// Latencies in milliseconds whatever unit they came in.
fn to_ms(l: &mut Latency) {
    let k = match l.unit.as_str() {
        "s" => 1e3,
        "us" | "µs" => 1e-3,
        "ns" => 1e-6,
        _ => return,
    };
    for v in [
        &mut l.p50,
        &mut l.p95,
        &mut l.p99,
        &mut l.min,
        &mut l.max,
        &mut l.mean,
    ] {
        *v *= k;
    }
    for v in &mut l.samples {
        *v *= k;
    }
    l.unit = "ms".into();
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| Some(l.strip_prefix(key)?.trim_start_matches([' ', '\t', ':'])))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let meminfo = read("/proc/meminfo");
    let mem_kib: f64 = field(&meminfo, "MemTotal")
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap_or(f64::NAN);
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": field(&read("/proc/cpuinfo"), "model name"),
        "memory_total_mib": (mem_kib / 1024.0).round() as u64,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "arch": std::env::consts::ARCH,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Status {
    Met,
    Missed,
    NotMeasured,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Met => "met",
            Status::Missed => "missed",
            Status::NotMeasured => "not measured",
        }
    }

    fn of(ok: bool) -> Self {
        if ok { Status::Met } else { Status::Missed }
    }
}

struct Target {
    target: &'static str,
    measured: String,
    status: Status,
}

/// The rows of the handover scenarios (the failover and storm rows have tables of their own).
fn handover_only(latency: &[Latency]) -> Vec<Latency> {
    latency
        .iter()
        .filter(|l| SCENARIOS.contains(&l.scenario.as_str()))
        .cloned()
        .collect()
}

fn palisade_latency<'a>(latency: &'a [Latency], scenario: &str) -> Option<&'a Latency> {
    latency
        .iter()
        .find(|l| l.system == "palisade" && l.scenario == scenario && l.n > 0)
}

fn figure<'a>(figures: &'a [Figure], system: &str, config: &str, name: &str) -> Option<&'a Figure> {
    figures.iter().find(|f| {
        f.system == system
            && (config.is_empty() || f.config == config || f.config.is_empty())
            && f.name == name
            && f.value.is_finite()
    })
}

fn targets(latency: &[Latency], figures: &[Figure]) -> Vec<Target> {
    let not_measured = |target| Target {
        target,
        measured: "-".into(),
        status: Status::NotMeasured,
    };
    let mut out = Vec::new();

    let t = "palisade release handover: p50 < 10 ms and p99 < 50 ms";
    out.push(match palisade_latency(latency, "release") {
        Some(l) => Target {
            target: t,
            measured: format!("p50 {} ms, p99 {} ms (n={})", ms(l.p50), ms(l.p99), l.n),
            status: Status::of(l.p50 < 10.0 && l.p99 < 50.0),
        },
        None => not_measured(t),
    });
    let t = "palisade Pod-deletion handover: p99 < 100 ms";
    out.push(match palisade_latency(latency, "pod-deletion") {
        Some(l) => Target {
            target: t,
            measured: format!("p99 {} ms (n={})", ms(l.p99), l.n),
            status: Status::of(l.p99 < 100.0),
        },
        None => not_measured(t),
    });
    let t = "palisade expiry handover: < 100 ms past the lease duration (p99)";
    out.push(match palisade_latency(latency, "expiry-past-duration") {
        Some(l) => Target {
            target: t,
            measured: format!("p99 {} ms, max {} ms (n={})", ms(l.p99), ms(l.max), l.n),
            status: Status::of(l.p99 < 100.0),
        },
        None => not_measured(t),
    });
    let t = "palisade failover (leader SIGKILLed, default timings): p99 < 2 s to the first grant";
    out.push(
        match latency.iter().find(|l| {
            l.system == "palisade" && l.scenario == "failover" && l.config == "default" && l.n > 0
        }) {
            Some(l) => Target {
                target: t,
                measured: format!("p99 {} ms, max {} ms (n={})", ms(l.p99), ms(l.max), l.n),
                status: Status::of(l.p99 < 2000.0),
            },
            None => not_measured(t),
        },
    );
    let t = "storm of 1,000 silent holders: the last re-grant within 3 s past the duration";
    out.push(
        match latency.iter().find(|l| {
            l.system == "palisade"
                && l.scenario == "storm-past-duration"
                && l.config == "1000"
                && l.n > 0
        }) {
            Some(l) => Target {
                target: t,
                // 1,000 re-grants in 3 s need 333/s: say what the API server itself took.
                measured: format!(
                    "last {} ms past /readyz + D (bare claims, n={}); 3 s needs 333 re-grants/s, the floor's median was {} writes/s",
                    ms(l.max),
                    l.n,
                    figures
                        .iter()
                        .find(|f| f.name == "leases_1000_storm_floor_status_writes_per_s")
                        .map_or("-".to_string(), |f| value(f.value))
                ),
                status: Status::of(l.max < 3000.0),
            },
            None => not_measured(t),
        },
    );
    out.push(api_target(figures));
    out.extend(operator_targets(latency));
    out.extend(agent_targets(latency, figures));
    let t = "< 64 MiB RSS at 10,000 leases";
    out.push(
        match figures
            .iter()
            .find(|f| f.name == "leases_10000_peak_rss" && f.value.is_finite())
        {
            Some(f) => match mib(f.value, &f.unit) {
                Some(v) => Target {
                    target: t,
                    measured: format!("{v:.1} MiB peak"),
                    status: Status::of(v < 64.0),
                },
                None => Target {
                    target: t,
                    measured: format!("{} {} (unknown unit)", f.value, f.unit),
                    status: Status::NotMeasured,
                },
            },
            None => not_measured(t),
        },
    );
    out
}

/// The fenced operators' budgets: what the admission policy adds to a write, and the
/// failover to the new leader's first accepted write.
fn operator_targets(latency: &[Latency]) -> Vec<Target> {
    let admission = |config: &str| {
        latency.iter().find(|l| {
            l.system == "palisade"
                && l.scenario == OPERATOR_SCENARIOS[0]
                && l.config == config
                && l.n > 0
        })
    };
    let t = "fenced operator: the admission policy adds at most 1 ms to a write at p50 (named account against not named, same run)";
    let added = match (
        admission(OPERATOR_ADMISSION_CONFIGS[0]),
        admission(OPERATOR_ADMISSION_CONFIGS[1]),
    ) {
        (Some(named), Some(other)) => Target {
            target: t,
            measured: format!(
                "{:+.2} ms ({} against {} ms, n={})",
                named.p50 - other.p50,
                ms(named.p50),
                ms(other.p50),
                named.n
            ),
            status: Status::of(named.p50 - other.p50 <= 1.0),
        },
        _ => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    };
    let t = "fenced operator failover (leader SIGKILLed, a Lease as long as client-go's tuned LeaseDuration): p99 < 2 s to the new leader's first accepted write";
    let failover = match latency
        .iter()
        .find(|l| l.system == "palisade" && l.scenario == OPERATOR_SCENARIOS[1] && l.n > 0)
    {
        Some(l) => Target {
            target: t,
            measured: format!(
                "p99 {} ms, max {} ms (n={}, {})",
                ms(l.p99),
                ms(l.max),
                l.n,
                l.config
            ),
            status: Status::of(l.p99 < 2000.0),
        },
        None => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    };
    vec![added, failover]
}

/// The agent's budgets: its release handover against the library's in the same run,
/// its memory and its API requests per held grant against the library's.
fn agent_targets(latency: &[Latency], figures: &[Figure]) -> Vec<Target> {
    let release = |config: &str| {
        latency.iter().find(|l| {
            l.system == "palisade-agent" && l.config == config && l.scenario == "release" && l.n > 0
        })
    };
    let figure = |name: &str| figure(figures, "palisade-agent", "default", name).map(|f| f.value);
    let t = "agent release handover: at most 2 ms more than the library's at p99 (same run)";
    let handover = match (release("agent"), release("library")) {
        (Some(a), Some(l)) => Target {
            target: t,
            measured: format!(
                "p99 {} ms against {} ms (+{:.2} ms, n={})",
                ms(a.p99),
                ms(l.p99),
                a.p99 - l.p99,
                a.n
            ),
            status: Status::of(a.p99 - l.p99 <= 2.0),
        },
        _ => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    };
    let t = "agent holding 10 Leases: RSS <= 16 MiB";
    let rss = match figure("rss_bytes_holding_leases") {
        Some(v) => Target {
            target: t,
            measured: format!("{:.1} MiB", v / 1048576.0),
            status: Status::of(v <= 16.0 * 1048576.0),
        },
        None => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    };
    let t = "agent: API requests per held grant within 10% of the library's";
    let requests = match (
        figure("requests_per_s_per_grant_agent"),
        figure("requests_per_s_per_grant_library"),
    ) {
        (Some(a), Some(l)) => Target {
            target: t,
            measured: format!("{a:.3} against {l:.3} req/s per grant"),
            status: Status::of((a - l).abs() <= 0.1 * l.max(0.01)),
        },
        _ => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    };
    vec![
        handover,
        rss,
        requests,
        readme_client_target(latency, figures),
        java_client_target(latency, figures),
    ]
}

/// The Java client's release handover against the Go client's, warm (a later acquire
/// in a long-lived process, as a service's), interleaved in the same run: the bench's
/// figure of the p99s' difference.
fn java_client_target(latency: &[Latency], figures: &[Figure]) -> Target {
    let t = "Java client release p99 within 2 ms of the Go client's (warm)";
    let release = |config: &str| {
        latency.iter().find(|l| {
            l.system == "palisade-agent" && l.config == config && l.scenario == "release" && l.n > 0
        })
    };
    let over = figure(
        figures,
        "palisade-agent",
        "java-client-warm",
        "release_p99_warm_java_over_go",
    );
    match (over, release("java-client-warm"), release("go-client-warm")) {
        (Some(f), Some(j), Some(g)) => Target {
            target: t,
            measured: format!(
                "p99 {} ms against {} ms ({:+.2} ms, n={})",
                ms(j.p99),
                ms(g.p99),
                f.value,
                j.n
            ),
            status: Status::of(f.value <= 2.0),
        },
        _ => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    }
}

/// The README's client against the library on a caller's client, in the same
/// interleaved rounds: p50 within 1.2x, p99 within 3 serial writes' p99 on its connections.
fn readme_client_target(latency: &[Latency], figures: &[Figure]) -> Target {
    let t = "README client release handover: p50 <= 1.2x the library's, p99 <= 3 serial writes' p99 (interleaved, same run)";
    let release = |config: &str| {
        latency.iter().find(|l| {
            l.system == "palisade-agent" && l.config == config && l.scenario == "release" && l.n > 0
        })
    };
    let write_p99 = figure(
        figures,
        "palisade-agent",
        "readme-client",
        "serial_write_p99",
    );
    match (release("readme-client"), release("library"), write_p99) {
        (Some(r), Some(l), Some(w)) => Target {
            target: t,
            measured: format!(
                "p50 {} against {} ms ({:.2}x), p99 {} ms against 3 x {} ms (n={})",
                ms(r.p50),
                ms(l.p50),
                r.p50 / l.p50,
                ms(r.p99),
                ms(w.value),
                r.n
            ),
            status: Status::of(r.p50 <= 1.2 * l.p50 && r.p99 <= 3.0 * w.value),
        },
        _ => Target {
            target: t,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    }
}

/// Ours against client-go at default timings, from the API server's count; when
/// either idle baseline shows other traffic on the cluster, or a server-side rate
/// comes out below what that side's own clients sent (other traffic fell into the
/// idle window and was subtracted), from the client-side counts.
fn api_target(figures: &[Figure]) -> Target {
    let target = "≥ 10× fewer API requests per held lease than client-go at default timings";
    let name = "lease_requests_per_s_1_holder_3_waiters";
    let idle = |system, name| figure(figures, system, "", name).map_or(0.0, |f| f.value);
    let undercounted = |system, config| {
        let rate = |name: &str| figure(figures, system, config, name).map(|f| f.value);
        match (rate(name), rate(&format!("{name}_client_side"))) {
            (Some(server), Some(client)) => server < 0.9 * client,
            (Some(server), None) => server < 0.0,
            _ => false,
        }
    };
    let busy = idle("palisade", "idle_requests_per_s") > 1.0
        || idle("client-go", "idle_cluster_lease_requests_per_s") > 1.0
        || undercounted("palisade", "")
        || undercounted("client-go", "default");
    let (name, how) = if busy {
        (
            format!("{name}_client_side"),
            "client-side counts, the controller's not in ours: the cluster was not idle, or a server-side rate came out below its clients' own count",
        )
    } else {
        (
            name.to_string(),
            "apiserver_request_total less the idle rate",
        )
    };
    match (
        figure(figures, "palisade", "", &name),
        figure(figures, "client-go", "default", &name),
    ) {
        (Some(ours), Some(theirs)) => {
            let ratio = theirs.value / ours.value;
            Target {
                target,
                measured: if ours.value > 0.0 {
                    format!(
                        "{:.3} vs {:.3} req/s: {ratio:.1}× fewer ({how})",
                        ours.value, theirs.value
                    )
                } else {
                    format!(
                        "{:.3} vs {:.3} req/s: ours at or below the idle rate ({how})",
                        ours.value, theirs.value
                    )
                },
                status: Status::of(ours.value <= 0.0 || ratio >= 10.0),
            }
        }
        _ => Target {
            target,
            measured: "-".into(),
            status: Status::NotMeasured,
        },
    }
}

fn mib(value: f64, unit: &str) -> Option<f64> {
    let k = match unit {
        "MiB" => 1.0,
        "B" | "bytes" | "byte" => 1.0 / 1048576.0,
        "KiB" | "kB" | "KB" => 1.0 / 1024.0,
        "GiB" => 1024.0,
        "MB" => 1e6 / 1048576.0,
        _ => return None,
    };
    Some(value * k)
}

/// `m × 10^k` for each `m` of `mantissas`, within `lo..=hi`.
fn decades(lo: f64, hi: f64, mantissas: &[f64]) -> Vec<f64> {
    let mut out = Vec::new();
    for k in (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32) {
        for m in mantissas {
            let v = m * 10f64.powi(k);
            if (lo..=hi).contains(&v) {
                out.push(v);
            }
        }
    }
    out
}

/// A log axis label.
fn axis_label(v: &f64) -> String {
    if *v <= FLOOR_MS {
        format!("≤{FLOOR_MS}")
    } else if *v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Milliseconds, to a precision that fits the size.
fn ms(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A rate that came out negative: a server-side count less an idle rate that
/// other traffic inflated. Shown as invalid, never as a number or clamped to 0.
fn invalid(f: &Figure) -> bool {
    f.unit == "req/s" && f.value < 0.0
}

/// A figure's value for the table: "invalid" for [`invalid`] ones.
fn figure_value(f: &Figure) -> String {
    if invalid(f) {
        "invalid (negative rate: other traffic in the idle window)".into()
    } else {
        value(f.value)
    }
}

/// A figure for results.json: an [`invalid`] one has `value: null`, `invalid: true`
/// and its raw value in `invalid_value`.
fn figure_json(f: &Figure) -> serde_json::Value {
    let mut v = json!(f);
    if invalid(f) {
        v["value"] = serde_json::Value::Null;
        v["invalid"] = json!(true);
        v["invalid_value"] = json!(f.value);
    }
    v
}

fn value(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The (system, config) pairs in report order: those with a measurement, and a
/// system that has none at all once (its config of the first entry).
fn series(latency: &[Latency]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for l in latency.iter().filter(|l| l.n > 0) {
        let key = (l.system.clone(), l.config.clone());
        if !out.contains(&key) {
            out.push(key);
        }
    }
    for l in latency {
        if !out.iter().any(|(system, _)| system == &l.system) {
            out.push((l.system.clone(), l.config.clone()));
        }
    }
    // stable: palisade first, the rest in the order the sources came
    out.sort_by_key(|(system, _)| rank(system).min(1));
    out
}

/// The entry of a row and scenario; a "not applicable" entry (n = 0) of the same
/// system stands for all its configs.
fn cell<'a>(
    latency: &'a [Latency],
    system: &str,
    config: &str,
    scenario: &str,
) -> Option<&'a Latency> {
    let of_system = || {
        latency
            .iter()
            .filter(|l| l.system == system && l.scenario == scenario)
    };
    of_system()
        .find(|l| l.config == config && l.n > 0)
        .or_else(|| of_system().find(|l| l.config == config))
        .or_else(|| of_system().find(|l| l.n == 0))
}

/// "system (config)", the config cut at its first colon ("tuned: lease_ttl 2s, ..." is "tuned").
fn label(system: &str, config: &str) -> String {
    match config.split(':').next().unwrap_or("").trim() {
        "" | "-" => system.to_string(),
        config => format!("{system} ({config})"),
    }
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    smoke: bool,
    versions: &BTreeMap<String, String>,
    machine: &serde_json::Value,
    sources: &[(String, Source)],
    missing: &[&str],
    rejected: &[String],
    latency: &[Latency],
    figures: &[Figure],
    targets: &[Target],
) -> String {
    let mut md = String::from("# palisade benchmark results\n\n");
    if smoke {
        md += "**Smoke run** (debug build, a few rounds): these figures mean nothing; see `make bench`.\n\n";
    }
    let _ = writeln!(
        md,
        "Machine: {} CPUs ({}), {} MiB memory, Linux {}. Versions: {}.\n",
        machine["nproc"],
        machine["cpu"].as_str().unwrap_or("?"),
        machine["memory_total_mib"],
        machine["kernel"].as_str().unwrap_or("?"),
        versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    md += "## Handover latency\n\nRelease and Pod deletion: from the holder letting go (its release sent, its \
           Pod deleted) to the next holder's process observing its grant. Expiry, every system alike: from the \
           send of the silent holder's last renewal, as its own client saw it, plus the lease duration, to the \
           next holder observing its grant, signed. The palisade-agent rows are an A/B in one process, \
           interleaved round by round: the README's client (readme-client), the library on a caller's \
           kube::Client (library), the agent, and the Go and Java clients' conformance drivers on the \
           agent: go-client and java-client a fresh process's first acquire (a cron job's), go-client-warm \
           and java-client-warm a later acquire in a long-lived process (a service's); their spread over \
           blocks is in Other figures. Milliseconds, \
           p50 / p95 / p99 (n), nearest rank.\n\n";
    md += "| system (config) | voluntary release | holder's Pod deleted | expiry, past the duration |\n|---|---|---|---|\n";
    let all_latency = latency;
    let handover = handover_only(latency);
    let latency = &handover[..];
    let mut notes: Vec<String> = Vec::new();
    for (system, config) in series(latency) {
        let mut row = format!("| {} |", label(&system, &config));
        for scenario in SCENARIOS {
            let text = match cell(latency, &system, &config, scenario) {
                Some(l) if l.n > 0 => {
                    format!("{} / {} / {} ({})", ms(l.p50), ms(l.p95), ms(l.p99), l.n)
                }
                Some(l) if !l.note.is_empty() => {
                    let note = format!("{}, {scenario}: {}", l.system, l.note);
                    let i = match notes.iter().position(|n| n == &note) {
                        Some(i) => i,
                        None => {
                            notes.push(note);
                            notes.len() - 1
                        }
                    };
                    format!("n/a [{}]", i + 1)
                }
                _ => "not measured".into(),
            };
            let _ = write!(row, " {text} |");
        }
        md += &row;
        md += "\n";
    }
    for (i, n) in notes.iter().enumerate() {
        let _ = write!(md, "\n[{}] {n}", i + 1);
    }
    if !notes.is_empty() {
        md += "\n";
    }
    md += "\nHow each was measured (rounds, parallel lanes of independent leases) is in results.json, \
           `latency[].note` and `sources[].parameters`.\n";

    md += &failover_table(all_latency, figures);
    md += &storm_table(all_latency, figures);
    md += &ha_table(all_latency, figures);
    md += &operator_admission_table(all_latency, figures);
    md += &operator_failover_table(all_latency, figures);
    md += &semaphore_table(all_latency, figures);

    md += "\n## Other figures\n\n| system (config) | figure | value | unit |\n|---|---|---|---|\n";
    // The HA and fenced-operator figures are in their own tables.
    for f in figures.iter().filter(|f| {
        !f.name.starts_with("ha_")
            && !f.name.starts_with("operator_")
            && !f.name.starts_with("semaphore_")
    }) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            label(&f.system, &f.config),
            f.name,
            figure_value(f),
            f.unit
        );
    }

    md += "\n## Targets\n\n| target | measured | status |\n|---|---|---|\n";
    for t in targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            t.target,
            t.measured,
            t.status.word()
        );
    }
    md += "\nSources: ";
    md += &sources
        .iter()
        .map(|(file, s)| format!("{} ({file})", s.source))
        .collect::<Vec<_>>()
        .join(", ");
    md += ".";
    if !missing.is_empty() {
        let _ = write!(md, " Not present: {}.", missing.join(", "));
    }
    if !rejected.is_empty() {
        let _ = write!(
            md,
            " Skipped, not in the schema of benches/common/schema.rs: {}.",
            rejected.join("; ")
        );
    }
    md += "\n";
    md
}

/// Failover: palisade (default, before) and client-go (default, tuned), in that order,
/// then any other system's rows.
fn failover_table(latency: &[Latency], figures: &[Figure]) -> String {
    let mut md = String::from(
        "\n## Failover\n\nFrom SIGKILL of the leading replica to the first grant by the new leader, as the \
         bench's watch saw it (its delay included); milliseconds, nearest rank.\n\n\
         | system (config) | p50 | p95 | p99 | max | n |\n|---|---|---|---|---|---|\n",
    );
    const KNOWN: [(&str, &str); 4] = [
        ("palisade", "default"),
        ("palisade", "before"),
        ("client-go", "default"),
        ("client-go", "tuned"),
    ];
    let rows: Vec<&Latency> = latency
        .iter()
        .filter(|l| l.scenario == OTHER_SCENARIOS[0])
        .collect();
    // "tuned: lease 1s, ..." is config "tuned".
    let config_of = |l: &Latency| l.config.split(':').next().unwrap_or("").trim().to_string();
    let row = |l: &Latency| {
        if l.n == 0 {
            format!(
                "| {} | n/a: {} | | | | 0 |\n",
                label(&l.system, &l.config),
                l.note
            )
        } else {
            format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                label(&l.system, &l.config),
                ms(l.p50),
                ms(l.p95),
                ms(l.p99),
                ms(l.max),
                l.n
            )
        }
    };
    for (system, config) in KNOWN {
        match rows
            .iter()
            .find(|l| l.system == system && config_of(l) == config)
        {
            Some(l) => md += &row(l),
            None => {
                let _ = writeln!(md, "| {} | not measured | | | | |", label(system, config));
            }
        }
    }
    for l in &rows {
        if !KNOWN
            .iter()
            .any(|(s, c)| l.system == *s && config_of(l) == *c)
        {
            md += &row(l);
        }
    }
    let cost: Vec<String> = figures
        .iter()
        .filter(|f| f.name.ends_with("election_requests_per_s"))
        .map(|f| {
            format!(
                "{} {} {}",
                label(&f.system, &f.config),
                figure_value(f),
                f.unit
            )
        })
        .collect();
    if !cost.is_empty() {
        let _ = writeln!(
            md,
            "\nThe election's own API cost, two idle replicas: {} (kube-apiserver's count, less the idle cluster's).",
            cost.join("; ")
        );
    }
    md
}

/// The storm, one row per size and kind of waiter (bare claims: the Lease write as the
/// bench's watch saw it; library: `acquire` returning): the last re-grant and the
/// distribution past /readyz + D, the floor's passes, our rate first to last, absolute
/// and as a fraction of the floor's median, and who saturated.
fn storm_table(latency: &[Latency], figures: &[Figure]) -> String {
    let mut md = String::from(
        "\n## Storm\n\nN holders silent at once, each Lease with a waiter. Past due: each re-grant past \
         /readyz + D (the latest the due instant can be, so the delays are short by up to the controller's \
         sync; signed). Rates are from the first re-grant to the last (n - 1 intervals). The floor is the API \
         server's own rate for the controller's kind of write, a status PUT of the whole Lease conditioned on \
         its resourceVersion, one per Lease, 16 in flight, no controller: median (min to max) of three passes \
         interleaved with the storms. Waiters: bare claims (re-grant = the Lease write, as the bench's watch \
         saw it) or the client library's (`acquire` returning: all on one client, as the agent serves its callers; the head waiter writes before the grant, or confirms after it when that write is too old). \
         On semaphores (`--storm-permits`, 3), every slot's holder is silent and a bare claim waits for each slot: a \
         re-grant is one slot's, and one Lease write may re-grant several; their floor is the same write of those \
         Leases, the fraction re-grants over it.\n\n\
         | Leases | waiters | last past due | p50 / p99 past due (ms) | floor (writes/s) | ours (grants/s) | fraction of floor | saturated |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let mut rows: Vec<(usize, StormWaiters, &Latency)> = latency
        .iter()
        .filter(|l| l.system == "palisade" && l.scenario == OTHER_SCENARIOS[1])
        .filter_map(|l| schema::storm_size(&l.config).map(|(n, w)| (n, w, l)))
        .collect();
    rows.sort_by_key(|(n, w, _)| (*n, *w));
    if rows.is_empty() {
        md += "| - | - | not measured | | | | | |\n";
    }
    for (n, waiters, l) in rows {
        let fig = |name: &str| {
            figures
                .iter()
                .find(|f| f.system == "palisade" && f.name == format!("leases_{n}_{name}"))
        };
        let val = |name: &str| fig(name).map_or("-".to_string(), |f| value(f.value));
        let (kind, prefix, rate, floor_prefix) = match waiters {
            StormWaiters::Bare => (
                "bare claims",
                "storm",
                "storm_regrants_per_s",
                "storm_floor",
            ),
            StormWaiters::Library => (
                "library",
                "storm_library",
                "storm_library_acquires_per_s",
                "storm_floor",
            ),
            StormWaiters::Semaphore => (
                "bare claims on semaphores, a waiter per slot",
                "storm_semaphore",
                "storm_semaphore_regrants_per_s",
                "storm_semaphore_floor",
            ),
        };
        // The verdict in the rate's note: "saturated: WHO. CPU over ...".
        let saturated = fig(rate)
            .and_then(|f| {
                let rest = f.note.split_once("saturated: ")?.1;
                Some(rest.split(". CPU over").next()?.to_string())
            })
            .unwrap_or_else(|| "-".into());
        if l.n == 0 {
            let _ = writeln!(md, "| {n} | {kind} | n/a: {} | | | | | |", l.note);
            continue;
        }
        let floor = format!(
            "{} ({} to {})",
            val(&format!("{floor_prefix}_status_writes_per_s")),
            val(&format!("{floor_prefix}_min_status_writes_per_s")),
            val(&format!("{floor_prefix}_max_status_writes_per_s")),
        );
        let ours = match waiters {
            StormWaiters::Bare => val(rate),
            _ => format!(
                "{} (Lease writes {}/s)",
                val(rate),
                val(&format!("{prefix}_lease_writes_per_s"))
            ),
        };
        let _ = writeln!(
            md,
            "| {n} | {kind} | {} ms | {} / {} | {floor} | {ours} | {} | {saturated} |",
            ms(l.max),
            ms(l.p50),
            ms(l.p99),
            val(&format!("{prefix}_fraction_of_floor")),
        );
    }
    md
}

/// The HA control plane (benches/ha): release handovers across the two API servers,
/// either way, and the failover gap when the leading replica's API server dies, with
/// who led afterwards. Its figures (`ha_*`) are here, not among the other figures.
fn ha_table(latency: &[Latency], figures: &[Figure]) -> String {
    let mut md = String::from(
        "\n## HA control plane\n\nThree etcd members and two kube-apiservers, each with its own watch cache, \
         behind two load balancers (cluster.sh HA=1). Release handover: from the holder's release to the \
         waiter's acquire returning, holder and waiter on different API servers. Failover: from SIGKILL of \
         the API server the leading replica reaches (through lb-0) to the waiter's grant; the holder releases \
         right after the kill; the standby, holder and waiter on the other API server (lb-1). Milliseconds, \
         nearest rank.\n\n\
         | measurement | p50 | p99 | max | n |\n|---|---|---|---|---|\n",
    );
    let what = [
        "release handover: holder (and controller) on apiserver-0 → waiter on apiserver-1",
        "release handover: holder on apiserver-1 → waiter (and controller) on apiserver-0",
        "failover: leader's API server SIGKILLed → waiter's grant",
    ];
    for ((scenario, config), what) in HA_ROWS.into_iter().zip(what) {
        let found = latency
            .iter()
            .find(|l| l.system == "palisade" && l.scenario == scenario && l.config == config);
        match found {
            Some(l) if l.n > 0 => {
                let _ = writeln!(
                    md,
                    "| {what} | {} | {} | {} | {} |",
                    ms(l.p50),
                    ms(l.p99),
                    ms(l.max),
                    l.n
                );
            }
            Some(l) => {
                let _ = writeln!(md, "| {what} | n/a: {} | | | 0 |", l.note);
            }
            None => {
                let _ = writeln!(md, "| {what} | not measured | | | |");
            }
        }
    }
    if let Some(f) = figure(figures, "palisade", "ha", "ha_failover_apiserver_gone_mean") {
        let _ = writeln!(
            md,
            "\nThe killed API server's process was gone {} ms (mean) after the kill started; the holder \
             released then.",
            ms(f.value)
        );
    }
    if let Some(f) = figure(figures, "palisade", "ha", HA_LEADER_MOVED) {
        let _ = writeln!(
            md,
            "\nLeadership after the kill: {:.0} ({}), {}.",
            f.value, f.name, f.note
        );
    }
    md
}

/// Semaphores: a slot's release handover beside a lock's (same run), and a contended
/// semaphore's waits, grants/s and fairness.
fn semaphore_table(latency: &[Latency], figures: &[Figure]) -> String {
    let mut md = String::from(
        "\n## Semaphores\n\nRelease handover, one at a time: from the holder's release to the waiter's \
         acquire returning, on a lock and on slot 0 of a semaphore of 3 (slots 1 and 2 held), rounds \
         interleaved. Contention (`make bench`: 100 tasks on a semaphore of 10): each task acquires \
         any slot, holds it and releases, over and over; a wait is from acquire called to its \
         return. Milliseconds, nearest rank.\n\n\
         | measurement | p50 | p95 | p99 | max | n |\n|---|---|---|---|---|---|\n",
    );
    let what = [
        "release handover, lock",
        "release handover, semaphore slot",
        "wait for a permit, contended",
    ];
    for ((scenario, config), what) in SEMAPHORE_ROWS.into_iter().zip(what) {
        let found = latency
            .iter()
            .find(|l| l.system == "palisade" && l.scenario == scenario && l.config == config);
        match found {
            Some(l) if l.n > 0 => {
                let _ = writeln!(
                    md,
                    "| {what} | {} | {} | {} | {} | {} |",
                    ms(l.p50),
                    ms(l.p95),
                    ms(l.p99),
                    ms(l.max),
                    l.n
                );
            }
            _ => {
                let _ = writeln!(md, "| {what} | not measured | | | | |");
            }
        }
    }
    if let Some(l) = latency
        .iter()
        .find(|l| l.system == "palisade" && l.scenario == SEMAPHORE_ROWS[2].0)
    {
        let _ = writeln!(md, "\nContended: {}.", l.note);
    }
    for f in figures.iter().filter(|f| f.name.starts_with("semaphore_")) {
        let _ = write!(
            md,
            "\n{}: {} {} ({}).\n",
            f.name,
            figure_value(f),
            f.unit,
            f.note
        );
    }
    md
}

/// The admission policy's cost: each write's latency, and what the policy adds.
fn operator_admission_table(latency: &[Latency], figures: &[Figure]) -> String {
    let mut md = String::from(
        "\n## Fenced operators: admission cost\n\nOne write, a merge patch of a ConfigMap's data, one in flight, \
         by the service account the chart's `policies.operators` names (through `Fence::client` while leading: \
         stamped with its grant's token, the policy judges it) and by an identical account not named (stamped \
         the same way, the same RBAC: the policy's match condition is false), which goes first alternating \
         round by round; then both again once the release is upgraded without the operators policy. \
         Milliseconds, nearest rank.\n\n\
         | write | p50 | p95 | p99 | max | n |\n|---|---|---|---|---|---|\n",
    );
    let what = [
        "named in policies.operators, stamped: judged",
        "not named: match condition false",
        "named, operators policy not installed",
        "not named, operators policy not installed",
    ];
    for (config, what) in OPERATOR_ADMISSION_CONFIGS.iter().zip(what) {
        let found = latency.iter().find(|l| {
            l.system == "palisade" && l.scenario == OPERATOR_SCENARIOS[0] && l.config == *config
        });
        match found {
            Some(l) if l.n > 0 => {
                let _ = writeln!(
                    md,
                    "| {what} | {} | {} | {} | {} | {} |",
                    ms(l.p50),
                    ms(l.p95),
                    ms(l.p99),
                    ms(l.max),
                    l.n
                );
            }
            Some(l) => {
                let _ = writeln!(md, "| {what} | n/a: {} | | | | 0 |", l.note);
            }
            None => {
                let _ = writeln!(md, "| {what} | not measured | | | | |");
            }
        }
    }
    let value = |name: &str| figure(figures, "palisade", "", name).map(|f| f.value);
    if let [Some(p50), Some(p99), Some(pairs)] = OPERATOR_ADMISSION_ADDED.map(value) {
        let _ = write!(
            md,
            "\nAdded by the policy's judgement (the named account's writes less the other's, same run): \
             {p50:+.2} ms at p50, {p99:+.2} ms at p99; the median of the per-round differences {pairs:+.2} ms."
        );
        if let Some(noise) = value(OPERATOR_ADMISSION_NO_POLICY_DIFFERENCE) {
            let _ = write!(
                md,
                " With no operators policy the two accounts' p50s are {noise:+.2} ms apart: the noise \
                 between them."
            );
        }
        md += "\n";
    }
    md
}

/// Failover of a fenced operator to its successor's first accepted write: palisade's
/// rows, then client-go's (tuned, default), then any other system's.
fn operator_failover_table(latency: &[Latency], figures: &[Figure]) -> String {
    let mut md = String::from(
        "\n## Fenced operators: failover\n\nFrom SIGKILL of the leading operator process (the harness's clock) \
         to the new leader's first accepted write, a merge patch of a ConfigMap it writes as soon as its code \
         runs and every 50 ms after; to leading: to its code starting (palisade: the grant acquired and every API \
         server confirmed to refuse the predecessor's token; client-go: OnStartedLeading). palisade's operators \
         (`run_while_leading`; the config names the Lease's duration, by default 1 s: client-go's tuned \
         LeaseDuration) are plain processes on the host whose claims are bound to no pod, so a SIGKILLed \
         leader's grant ends by expiry, one lease duration after its last renewal: the duration bounds the \
         figure, as LeaseDuration bounds client-go's. A claim bound to a pod is revoked as soon as the pod is \
         deleted or terminal; a container killed in a pod that lives on waits for the expiry too. client-go's \
         `tools/leaderelection` at its default (15 s / 10 s / 2 s) and tuned (1 s / 750 ms / 250 ms) timings; \
         its writes are not fenced. Milliseconds, nearest rank.\n\n\
         | system (config) | to leading p50 / p99 | first write p50 | p95 | p99 | max | n |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut rows: Vec<&Latency> = latency
        .iter()
        .filter(|l| l.scenario == OPERATOR_SCENARIOS[1])
        .collect();
    let order = |l: &Latency| match (l.system.as_str(), l.config.as_str()) {
        ("palisade", _) => 0,
        ("client-go", "tuned") => 1,
        ("client-go", "default") => 2,
        _ => 3,
    };
    rows.sort_by_key(|l| order(l));
    if rows.is_empty() {
        md += "| - | not measured | | | | | |\n";
    }
    for l in rows {
        let leading = |name: &str| {
            figures
                .iter()
                .find(|f| f.system == l.system && f.config == l.config && f.name == name)
                .map_or("-".to_string(), |f| ms(f.value))
        };
        if l.n == 0 {
            let _ = writeln!(
                md,
                "| {} | n/a: {} | | | | | 0 |",
                label(&l.system, &l.config),
                l.note
            );
            continue;
        }
        let _ = writeln!(
            md,
            "| {} | {} / {} | {} | {} | {} | {} | {} |",
            label(&l.system, &l.config),
            leading(OPERATOR_TO_LEADING[0]),
            leading(OPERATOR_TO_LEADING[1]),
            ms(l.p50),
            ms(l.p95),
            ms(l.p99),
            ms(l.max),
            l.n
        );
    }
    md
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The smallest value drawn on the log axis; smaller ones (an expiry right on time, or
/// "early" by the clock skew between two observers) sit on it, labelled "≤1".
const FLOOR_MS: f64 = 1.0;

/// One panel per scenario: the ECDF of each system/config, log-scale x.
fn chart(path: &Path, latency: &[Latency], smoke: bool) -> Result<(), String> {
    let font = std::fs::read(FONT).map_err(|e| {
        format!("reading the chart font {FONT}: {e} (install the package fonts-dejavu-core)")
    })?;
    register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| format!("{FONT} is not a usable font"))?;
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());

    let all = series(latency);
    let color = |key: &(String, String)| {
        COLORS[all.iter().position(|k| k == key).unwrap_or(0) % COLORS.len()]
    };
    let root = BitMapBackend::new(path, (2400, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, rest) = root.split_vertically(70);
    let (panels, legend) = rest.split_vertically(780);
    let title = if smoke {
        "Handover latency (SMOKE RUN: debug build, a few rounds; meaningless)"
    } else {
        "Handover latency: fraction of handovers completed within x (ECDF)"
    };
    top.draw(&Text::new(
        title,
        (30, 18),
        ("sans-serif", 36).into_font().color(&BLACK),
    ))
    .map_err(|e| err(&e))?;

    let titles = [
        "voluntary release",
        "holder's Pod deleted",
        "expiry: time past the lease duration",
    ];
    for (area, (scenario, title)) in panels
        .split_evenly((1, 3))
        .iter()
        .zip(SCENARIOS.iter().zip(titles))
    {
        let data: Vec<(&Latency, Vec<f64>)> = all
            .iter()
            .filter_map(|(system, config)| {
                let l = latency.iter().find(|l| {
                    &l.system == system && &l.config == config && l.scenario == *scenario && l.n > 0
                })?;
                let mut s: Vec<f64> = l.samples.iter().map(|v| v.max(FLOOR_MS)).collect();
                s.sort_by(f64::total_cmp);
                (!s.is_empty()).then_some((l, s))
            })
            .collect();
        let lo = data.iter().map(|(_, s)| s[0]).fold(f64::INFINITY, f64::min);
        let hi = data.iter().map(|(_, s)| s[s.len() - 1]).fold(0.0, f64::max);
        // a margin of half the value either side, and at least one decade in all
        let (lo, hi) = if data.is_empty() {
            (1.0, 1000.0)
        } else {
            let (lo, hi) = ((lo / 1.5).max(FLOOR_MS), hi * 1.5);
            if hi / lo < 10.0 {
                let mid = (lo * hi).sqrt();
                ((mid / 10f64.sqrt()).max(FLOOR_MS), mid * 10f64.sqrt())
            } else {
                (lo, hi)
            }
        };
        // 1, 2 and 5 times the powers of ten when they fit, else the powers alone
        let labelled: &[f64] = if hi / lo <= 300.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 30))
            .margin(20)
            .x_label_area_size(70)
            .y_label_area_size(90)
            .build_cartesian_2d(
                (lo..hi)
                    .log_scale()
                    .with_key_points(decades(lo, hi, labelled))
                    .with_light_points(decades(lo, hi, &[2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])),
                0.0..1.0,
            )
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("milliseconds (log scale)")
            .y_desc("fraction of handovers")
            .label_style(("sans-serif", 22))
            .axis_desc_style(("sans-serif", 24))
            .x_label_formatter(&axis_label)
            .y_labels(6)
            .draw()
            .map_err(|e| err(&e))?;
        if data.is_empty() {
            let (w, h) = area.dim_in_pixel();
            area.draw(&Text::new(
                "not measured",
                (w as i32 / 2 - 80, h as i32 / 2),
                ("sans-serif", 28).into_font().color(&BLACK.mix(0.6)),
            ))
            .map_err(|e| err(&e))?;
        }
        for (l, s) in &data {
            let c = color(&(l.system.clone(), l.config.clone()));
            let n = s.len() as f64;
            // a step function: up by 1/n at each sample
            let steps = s
                .iter()
                .enumerate()
                .flat_map(|(i, &x)| [(x, i as f64 / n), (x, (i + 1) as f64 / n)]);
            chart
                .draw_series(LineSeries::new(steps, c.stroke_width(3)))
                .map_err(|e| err(&e))?;
        }
    }

    // One legend for all panels, in the order of the series.
    let font = ("sans-serif", 26).into_font().color(&BLACK);
    for (i, key) in all.iter().enumerate() {
        let (x, y) = (60 + (i % 4) as i32 * 580, 40 + (i / 4) as i32 * 50);
        legend
            .draw(&PathElement::new(
                vec![(x, y + 14), (x + 60, y + 14)],
                color(key).stroke_width(6),
            ))
            .map_err(|e| err(&e))?;
        legend
            .draw(&Text::new(label(&key.0, &key.1), (x + 75, y), font.clone()))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
