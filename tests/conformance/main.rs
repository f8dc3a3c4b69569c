//! One conformance suite for every way to hold a Lease: the Rust library, `palisade
//! lock`, and the agent through each thin client (Go, Python, Java). Black-box: each
//! client is a driver process speaking the protocol of tests/conformance/README.md,
//! and the scenarios (scenarios.rs) kill, freeze, cut off and release it while a
//! fence in this process judges every write. Prints the table the README shows.
//!
//!   conformance [--clients rust,lock,go,python,java] [--scenarios exclusion,kill,...]
//!
//! The Go driver, the Python interpreter and driver, and the Java driver's launcher
//! come from PALISADE_CONFORMANCE_GO, PALISADE_CONFORMANCE_PYTHON ("PYTHON SCRIPT")
//! and PALISADE_CONFORMANCE_JAVA, which the Makefile sets; a client asked for without
//! its driver fails the run.

mod driver;
mod holder;
mod scenarios;
mod semaphore;
mod verdict;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kube::ResourceExt;
use support::proxy;

use holder::{Client, Setup};
use scenarios::Scenario;

/// The lease duration of every scenario: short, so that expiries are quick.
const DURATION_SECS: i64 = 6;
/// The agent clients' session keepalive: a third of it is well within a third of the lease.
const KEEPALIVE_MS: u64 = 1_500;

pub struct Suite {
    pub setup: Setup,
    pub kube: kube::Client,
    ns: support::TestNamespace,
    proxy: proxy::Proxy,
}

impl Suite {
    /// A Pod object for a holder's claims (its name and UID).
    pub async fn pod(&self, name: &str) -> (String, String) {
        let pod = support::create_pod(&self.ns, name).await;
        (name.to_string(), pod.uid().expect("a pod has a UID"))
    }

    /// Cuts every holder's connection to the API server for `how_long`.
    pub async fn cut_api(&self, how_long: Duration) {
        self.proxy.set(proxy::Mode::Cut);
        tokio::time::sleep(how_long).await;
        self.proxy.set(proxy::Mode::Pass);
    }
}

struct Args {
    clients: Vec<Client>,
    scenarios: Vec<Scenario>,
}

fn parse_args(raw: &[String]) -> Result<Args, String> {
    let mut args = Args {
        clients: Client::ALL.to_vec(),
        scenarios: Scenario::ALL.to_vec(),
    };
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--clients" => {
                args.clients = value
                    .split(',')
                    .map(|c| {
                        Client::parse(c).ok_or(format!(
                            "unknown client {c:?} (rust, lock, go, python, java)"
                        ))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--scenarios" => {
                args.scenarios = value
                    .split(',')
                    .map(|s| {
                        Scenario::ALL
                            .into_iter()
                            .find(|k| k.name() == s)
                            .ok_or(format!("unknown scenario {s:?}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            // cargo test passes its own flags (e.g. --test-threads); none apply here.
            _ => {}
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if raw.first().map(String::as_str) == Some("driver") {
        let args = driver::DriverArgs::parse(&raw[1..]).expect("driver arguments");
        let code = runtime.block_on(driver::run(args));
        // Not a return: the runtime's drop would wait for the blocking read of stdin.
        std::process::exit(code);
    }
    let args = match parse_args(&raw) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("conformance: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(run(args))
}

/// The Go driver, the Python interpreter with the Python driver, and the Java driver's launcher.
type Drivers = (Option<PathBuf>, Option<(PathBuf, PathBuf)>, Option<PathBuf>);

/// `var`'s value; an error naming it (and `what` it holds) when unset and `client` is asked for.
fn driver_var(
    var: &str,
    what: &str,
    client: Client,
    clients: &[Client],
) -> Result<Option<String>, String> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(_) if clients.contains(&client) => Err(format!(
            "{var} ({what}) is not set: run it through `make test` or `make conformance`"
        )),
        Err(_) => Ok(None),
    }
}

fn drivers_of(clients: &[Client]) -> Result<Drivers, String> {
    let go = driver_var(
        "PALISADE_CONFORMANCE_GO",
        "the Go driver's path",
        Client::Go,
        clients,
    )?
    .map(PathBuf::from);
    let python = match driver_var(
        "PALISADE_CONFORMANCE_PYTHON",
        "\"PYTHON SCRIPT\" of the Python driver",
        Client::Python,
        clients,
    )? {
        Some(v) => {
            let (python, script) = v
                .split_once(' ')
                .ok_or("PALISADE_CONFORMANCE_PYTHON must be \"PYTHON SCRIPT\"")?;
            Some((PathBuf::from(python), PathBuf::from(script)))
        }
        None => None,
    };
    let java = driver_var(
        "PALISADE_CONFORMANCE_JAVA",
        "the Java driver's launcher",
        Client::Java,
        clients,
    )?
    .map(PathBuf::from);
    for path in go
        .iter()
        .chain(python.iter().flat_map(|(p, s)| [p, s]))
        .chain(java.iter())
    {
        if !path.exists() {
            return Err(format!(
                "{} does not exist (`make conformance` builds the drivers)",
                path.display()
            ));
        }
    }
    Ok((go, python, java))
}

async fn run(args: Args) -> ExitCode {
    let (go_driver, python, java_driver) = match drivers_of(&args.clients) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("conformance: {e}");
            return ExitCode::FAILURE;
        }
    };
    support::install_crds().await;
    let ns = support::TestNamespace::new("conformance").await;
    let _controller = support::ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    let out = support::repo_root().join("target/conformance");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("target/conformance");

    // The holders reach the API server through a proxy the outage scenario cuts.
    let proxy = proxy::Proxy::start(support::apiserver_port())
        .await
        .expect("a proxy");
    let kubeconfig = support::kubeconfig_through(&proxy, "conformance");

    let suite = Suite {
        setup: Setup {
            namespace: ns.name.clone(),
            kubeconfig,
            out: out.clone(),
            go_driver,
            python,
            java_driver,
            duration_secs: DURATION_SECS,
            keepalive_ms: KEEPALIVE_MS,
        },
        kube: support::client().await,
        ns,
        proxy,
    };
    let mut table = format!(
        "| scenario | {} |\n|---|{}\n",
        args.clients
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(args.clients.len())
    );
    let mut failures = Vec::new();
    for scenario in &args.scenarios {
        let mut row = format!("| {} |", scenario.title());
        for client in &args.clients {
            let started = std::time::Instant::now();
            let result = scenario.run(&suite, *client).await;
            let cell = match &result {
                Ok(measured) => format!("pass: {measured}"),
                Err(why) => {
                    failures.push(format!("{} / {}: {why}", client.name(), scenario.name()));
                    format!("FAIL: {why}")
                }
            };
            println!(
                "{:>7} {:<11} {:>5.1}s  {cell}",
                client.name(),
                scenario.name(),
                started.elapsed().as_secs_f64()
            );
            row.push_str(&format!(" {cell} |"));
        }
        table.push_str(&row);
        table.push('\n');
    }
    std::fs::write(out.join("results.md"), &table).expect("writing results.md");
    println!("\n{table}");
    if failures.is_empty() {
        println!(
            "conformance: every client passed every scenario ({})",
            out.join("results.md").display()
        );
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "conformance: {} failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
        ExitCode::FAILURE
    }
}
