//! `palisade outbox install|relay`: set the fenced outbox up in PostgreSQL, and run
//! its relay ([`crate::outbox`] says what they promise, [`crate::outbox::relay`] how
//! the relay keeps it).
//!
//! The relay's fence key defaults to `<namespace>/<lease>` of its own Lease, as
//! `palisade fence` keys are; it must differ from every writer's key, since the
//! relay's tokens and the writers' come from different Leases. The relay is a
//! long-running process: it logs at `info` by default, and on SIGTERM or SIGINT
//! releases its Lease (a standby takes over at once) and exits 0.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use http::Uri;

use super::{
    Threads, block_on, default_identity, init_logging, parse_duration, parse_lease_duration,
};
use crate::client::LeaseClient;
use crate::outbox::relay::{self, Backoff, RelayConfig};
use crate::outbox::{self, Error};

/// Exit status for bad arguments (clap uses the same for its usage errors).
const EXIT_USAGE: u8 = 2;

#[derive(Args, Debug)]
pub struct OutboxArgs {
    #[command(subcommand)]
    pub command: OutboxCommand,
}

#[derive(Subcommand, Debug)]
pub enum OutboxCommand {
    /// Install or upgrade the outbox (sql/palisade-outbox.sql) in PostgreSQL, after
    /// palisade.fence (`palisade fence --store URL --create`), as the same role.
    Install {
        /// The database, `postgres://...`.
        #[arg(long, value_name = "URL")]
        store: String,
    },
    /// Deliver the outbox's intents to an HTTP endpoint while holding a Lease.
    Relay(Box<RelayArgs>),
}

/// `palisade outbox relay`.
#[derive(Args, Debug)]
#[command(
    after_help = "Each intent is POSTed as application/json with the header \
    Idempotency-Key: <intent id>. 2xx: delivered. 408, 409, 425, 429, 5xx, a timeout or \
    no connection: retried with capped exponential backoff, forever. Any other status: \
    rejected, recorded, never retried. Exit codes: 0 stopped by SIGTERM or SIGINT, 1 an \
    error (not installed, no Kubernetes configuration), 2 bad arguments."
)]
pub struct RelayArgs {
    /// The outbox's database, `postgres://...`.
    #[arg(long, value_name = "URL")]
    pub store: String,
    /// The relay's own Lease (created if missing).
    #[arg(long)]
    pub lease: String,
    /// Namespace of the Lease [default: $POD_NAMESPACE, else the kubeconfig's namespace].
    #[arg(short = 'n', long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// leaseDurationSeconds of the Lease, when this command creates it.
    #[arg(long, default_value = "15s", value_parser = parse_lease_duration)]
    pub duration: Duration,
    /// The fence key of the relay's claims and records [default: NAMESPACE/LEASE].
    #[arg(long)]
    pub key: Option<String>,
    /// Holder identity [default: $POD_NAME, else the host name].
    #[arg(long)]
    pub identity: Option<String>,
    /// Where each intent is POSTed (http:// or https://).
    #[arg(long, value_parser = parse_endpoint)]
    pub endpoint: Uri,
    /// Intents claimed, and delivered concurrently, at a time (1 to 1000).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch: u32,
    /// Deadline of one delivery: connect, send, answer (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub timeout: Duration,
    /// Wait before the first retry of an intent; doubled per attempt.
    #[arg(long, default_value = "500ms", value_parser = parse_positive_duration)]
    pub backoff: Duration,
    /// The longest wait between retries.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    pub max_backoff: Duration,
    /// How often to look for due intents when there were none.
    #[arg(long, default_value = "100ms", value_parser = parse_positive_duration)]
    pub poll: Duration,
    /// Log one JSON object per line.
    #[arg(long)]
    pub log_json: bool,
}

fn parse_endpoint(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("invalid endpoint {text:?}: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(format!(
            "invalid endpoint {text:?}: expected an http:// or https:// URL with a host"
        )),
    }
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(d) if d.is_zero() => Err(format!("invalid duration {text:?}: must be above zero")),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

pub fn run(args: OutboxArgs) -> ExitCode {
    match args.command {
        OutboxCommand::Install { store } => {
            init_logging("warn", false);
            block_on("outbox install", Threads::One, install(store))
        }
        OutboxCommand::Relay(args) => {
            init_logging("info", args.log_json);
            block_on("outbox relay", Threads::One, relay(*args))
        }
    }
}

fn check_store(store: &str) -> Result<(), ExitCode> {
    if store.starts_with("postgres://") || store.starts_with("postgresql://") {
        return Ok(());
    }
    eprintln!(
        "palisade outbox: --store {store:?} is not a postgres:// URL (the outbox lives in PostgreSQL)"
    );
    Err(ExitCode::from(EXIT_USAGE))
}

async fn install(store: String) -> ExitCode {
    if let Err(code) = check_store(&store) {
        return code;
    }
    let client = match tokio_postgres::connect(&store, tokio_postgres::NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            client
        }
        Err(e) => {
            eprintln!(
                "palisade outbox install: cannot connect: {}",
                outbox::error_chain(&e)
            );
            return ExitCode::FAILURE;
        }
    };
    match outbox::install(&client).await {
        Ok(()) => {
            println!(
                "palisade outbox schema version {} is installed",
                outbox::SQL_VERSION
            );
            ExitCode::SUCCESS
        }
        Err(Error::NotInstalled { reason }) => {
            eprintln!(
                "palisade outbox install: refused: {reason}; `palisade fence --store URL \
                 --create` installs it"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "palisade outbox install: cannot install (run it as the role that installed \
                 palisade.fence): {}",
                outbox::error_chain(&e)
            );
            ExitCode::FAILURE
        }
    }
}

async fn relay(args: RelayArgs) -> ExitCode {
    if let Err(code) = check_store(&args.store) {
        return code;
    }
    let leases = match LeaseClient::try_default(args.namespace.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "palisade outbox relay: no Kubernetes client configuration (KUBECONFIG or in-cluster): {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    let key = args
        .key
        .clone()
        .unwrap_or_else(|| format!("{}/{}", leases.namespace(), args.lease));
    let config = RelayConfig {
        store: args.store,
        lease: args.lease,
        lease_duration: args.duration,
        key,
        identity: Some(args.identity.unwrap_or_else(default_identity)),
        endpoint: args.endpoint,
        batch: args.batch,
        timeout: args.timeout,
        backoff: Backoff {
            initial: args.backoff,
            max: args.max_backoff.max(args.backoff),
        },
        poll: args.poll,
    };
    let result = relay::run(&leases, &config, stop_signal()).await;
    leases.flush(Duration::from_secs(10)).await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(relay::RelayError::Outbox(Error::BadInput(e))) => {
            eprintln!("palisade outbox relay: {e}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("palisade outbox relay: {}", outbox::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls_with_a_host() {
        assert!(parse_endpoint("http://127.0.0.1:8080/pay").is_ok());
        assert!(parse_endpoint("https://provider.example/v1/charges").is_ok());
        for bad in ["/pay", "ftp://host/x", "localhost:80", ""] {
            let err = parse_endpoint(bad).expect_err(bad);
            assert!(err.contains("invalid endpoint"), "{bad}: {err}");
        }
    }

    #[test]
    fn zero_durations_are_refused() {
        assert!(
            parse_positive_duration("0s")
                .unwrap_err()
                .contains("above zero")
        );
        assert_eq!(
            parse_positive_duration("250ms"),
            Ok(Duration::from_millis(250))
        );
    }
}
