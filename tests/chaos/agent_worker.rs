//! A worker that holds its grants through `palisade agent` and the Go thin client
//! (the conformance suite's Go driver), as a Go service in a pod would: the agent and
//! the driver are its children, in its process group, so a fault that freezes or
//! kills the worker freezes or kills the whole "pod" (they die with it: PDEATHSIG).
//! The driver prints `granted <token> <claim UID> slot=<slot> fence-key=<key>`; this process does
//! the writes with that token under that key, exactly as `worker.rs` does, and records them in the history the
//! checker reads. Its renewals are the agent's, which the history does not see, so
//! the renewal-contract check covers only the library's workers.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use palisade::fence::{Fence, FileStore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::history::{Event, Recorder};
use crate::rng::{Rng, now_ns};
use crate::worker::{Held, WorkerArgs, client_from, write_configmap, write_file};

/// Where the Go driver is (the Makefile builds it; `make chaos` and `make test` set it).
pub const GO_DRIVER_ENV: &str = "PALISADE_CONFORMANCE_GO";

/// The agent clients' session keepalive: a third of it is well within a third of the lease.
const KEEPALIVE_MS: &str = "1000";

/// A child that dies with this process, even by SIGKILL.
fn dies_with_us(command: &mut Command) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

pub async fn run(args: WorkerArgs, palisade: PathBuf) {
    let driver = std::env::var(GO_DRIVER_ENV)
        .unwrap_or_else(|_| panic!("{GO_DRIVER_ENV} (the Go driver's path) is not set"));
    let dir = args.history.with_extension("agent");
    std::fs::create_dir_all(&dir).expect("the agent's directory");
    let socket = dir.join("agent.sock");
    let mut agent = Command::new(&palisade);
    agent
        .args(["agent", "--namespace", &args.namespace, "--no-token-files"])
        .args(["--admin-addr", "127.0.0.1:0", "--socket"])
        .arg(&socket)
        .env("KUBECONFIG", &args.kubeconfig)
        .env("RUST_LOG", "info")
        .kill_on_drop(true);
    dies_with_us(&mut agent);
    let _agent = agent.spawn().expect("spawning palisade agent");
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client = client_from(&args.kubeconfig).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    let fence = Fence::new(FileStore::open(&args.store).expect("opening the file fence"));
    let mut history = Recorder::create(&args.history).expect("creating the history file");
    let mut databases = crate::dbstores::Stores::from_env(&args.identity);
    let mut rng = Rng::new(args.seed);
    let mut seq = 0u64;
    loop {
        let lease = &args.leases[rng.range(0, args.leases.len() as u64) as usize];
        let mut command = Command::new(&driver);
        command
            .args([
                "--lease",
                lease,
                "--namespace",
                &args.namespace,
                "--keepalive-ms",
                KEEPALIVE_MS,
            ])
            .env("PALISADE_AGENT_SOCKET", &socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        dies_with_us(&mut command);
        let mut holder = command.spawn().expect("spawning the Go driver");
        let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
        let granted = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(granted) = parse_granted(lease, &line) {
                    return Some(granted);
                }
            }
            None
        })
        .await;
        let Ok(Some((held, claim_uid))) = granted else {
            eprintln!(
                "{}: no grant of {lease} through the agent within 30 s",
                args.identity
            );
            drop(holder);
            tokio::time::sleep(rng.millis(100, 500)).await;
            continue;
        };
        history.record(&Event::Grant {
            worker: args.identity.clone(),
            lease: lease.clone(),
            slot: held.slot,
            token: held.token,
            claim_uid,
            t_ns: now_ns(),
        });
        // The driver's own `write` lines are not needed: drained so it never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        for _ in 0..args.writes_per_grant {
            seq += 1;
            history.record(&write_file(&fence, &args.identity, &held, seq));
            history.record(&write_configmap(&configmaps, &args.identity, &held, seq).await);
            if let Some(databases) = databases.as_mut() {
                let hold = rng.millis(0, 100);
                databases.write(&mut history, &held, seq, hold).await;
            }
            tokio::time::sleep(rng.millis(50, 250)).await;
        }
        // A clean exit releases (the driver's protocol).
        if let Some(pid) = holder.id() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(12), holder.wait())
            .await
            .is_err()
        {
            eprintln!(
                "{}: the driver did not exit on SIGTERM within 12 s",
                args.identity
            );
        }
        tokio::time::sleep(rng.millis(0, 300)).await;
    }
}

/// The grant of a driver's `granted <token> <claim UID> slot=<slot> fence-key=<key>`
/// line (tests/conformance/README.md), with its claim's UID.
fn parse_granted(lease: &str, line: &str) -> Option<(Held, String)> {
    let mut words = line.split_whitespace();
    if words.next() != Some("granted") {
        return None;
    }
    let token = words.next()?.parse().ok()?;
    let claim_uid = words.next()?.to_string();
    let slot = words.next()?.strip_prefix("slot=")?.parse().ok()?;
    let key = words.next()?.strip_prefix("fence-key=")?.to_string();
    let held = Held {
        lease: lease.to_string(),
        slot,
        key,
        token,
    };
    Some((held, claim_uid))
}
