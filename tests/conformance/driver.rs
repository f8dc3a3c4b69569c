//! The conformance driver of the Rust client library (this binary, started as
//! `conformance driver ...`). The protocol every driver follows is in
//! tests/conformance/README.md: `granted T slot=S fence-key=K`, `write T` every 100 ms
//! without looking at the grant, `lost R` and one more (stale) write, `released` on a
//! clean exit. `--permits N` creates the Lease as a semaphore of N, if it is new.

use std::io::Write;
use std::time::Duration;

use palisade::client::{AcquireOptions, LeaseClient};
use palisade::crd::LeaseSpec;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{SignalKind, signal};

pub struct DriverArgs {
    pub lease: String,
    pub namespace: Option<String>,
    pub duration_secs: i64,
    pub permits: i32,
}

impl DriverArgs {
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut parsed = DriverArgs {
            lease: String::new(),
            namespace: None,
            duration_secs: 15,
            permits: 1,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--lease" => parsed.lease = value()?,
                "--namespace" => parsed.namespace = Some(value()?),
                "--duration-seconds" => {
                    parsed.duration_secs = value()?.parse().map_err(|e| format!("{e}"))?
                }
                "--permits" => parsed.permits = value()?.parse().map_err(|e| format!("{e}"))?,
                // The agent's clients take it; the library has no session.
                "--keepalive-ms" => drop(value()?),
                other => return Err(format!("unknown flag {other}")),
            }
        }
        if parsed.lease.is_empty() {
            return Err("--lease is required".into());
        }
        Ok(parsed)
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

pub async fn run(args: DriverArgs) -> i32 {
    let leases = LeaseClient::try_default(args.namespace.as_deref())
        .await
        .expect("a kubeconfig");
    let spec = LeaseSpec {
        lease_duration_seconds: args.duration_secs,
        permits: args.permits,
    };
    if let Err(e) = leases.ensure_lease_with(&args.lease, spec).await {
        eprintln!("driver: creating the Lease: {e}");
        return 1;
    }
    let grant = match leases.acquire(&args.lease, AcquireOptions::default()).await {
        Ok(grant) => grant,
        Err(e) => {
            eprintln!("driver: acquire: {e}");
            return 1;
        }
    };
    let token = grant.token();
    say(&format!(
        "granted {token} slot={} fence-key={}",
        grant.slot(),
        grant.fence_key()
    ));
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut writes = tokio::time::interval(Duration::from_millis(100));
    let lost = grant.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            _ = writes.tick() => say(&format!("write {token}")),
            reason = &mut lost => {
                say(&format!("lost {reason}"));
                say(&format!("write {token}"));
                return 3;
            }
            _ = term.recv() => break,
            line = stdin.next_line() => match line {
                Ok(Some(l)) if l.trim() != "release" => continue,
                _ => break,
            },
        }
    }
    if let Err(e) = grant.release().await {
        eprintln!("driver: release: {e}");
        return 1;
    }
    say("released");
    0
}
