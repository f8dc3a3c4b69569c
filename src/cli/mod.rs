//! The command line: `palisade <subcommand>`, also installable as the kubectl plugin
//! `kubectl-palisade` (feature `cli`).
//!
//! One file per subcommand ([`lock`], [`agent`], [`status`], [`fence`], [`check`],
//! [`controller`], [`crds`]); what they share is here: the async runtime, the logging set-up, the
//! holder identity when none is given, and the syntax of the flags' durations, slots
//! and permits. The
//! logic they run lives in the library ([`crate::client`], [`crate::fence`],
//! [`crate::controller`]); this module only turns flags into calls, and results into
//! messages and exit codes.
//!
//! What only the binary does lives here, so that a library build (the crate's
//! features) carries none of it: the async runtime (one builder: single-threaded for
//! the client commands, multi-threaded for the controller), the logging set-up
//! (stderr, `RUST_LOG`, else `warn` for client commands and `info` for the
//! controller) and the identity default (`$POD_NAME`, else the host name; the
//! controller adds its PID so two replicas on one host never share an election
//! identity). `palisade lock`'s process supervision (the watchdog-led process group,
//! signal forwarding) stays here, not in the library: it forks and takes over SIGINT,
//! SIGTERM, SIGHUP, SIGTSTP, SIGCHLD and SIGTTOU for the whole process and reaps the
//! command itself, which a library must not do behind its user's back, and its
//! behaviour is the command's (exit codes, messages).

pub mod agent;
pub mod check;
pub mod controller;
pub mod crds;
pub mod fence;
pub mod lock;
#[cfg(feature = "outbox")]
pub mod outbox;
pub mod status;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::crd::{MAX_LEASE_DURATION_SECONDS, MAX_PERMITS};

#[derive(Parser, Debug)]
#[command(
    name = "palisade",
    version,
    about = "Kubernetes leases with fencing tokens"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hold Leases for this pod's applications, behind a local HTTP API (a native sidecar).
    Agent(agent::AgentArgs),
    /// Check an installation: a Lease is granted a fencing token, and the admission
    /// policies refuse a stale write and a claim posing as another pod (`helm test`).
    Check(check::CheckArgs),
    /// Print the CustomResourceDefinitions (Lease, LeaseClaim) as YAML.
    Crds,
    /// Run the lease controller.
    Controller(controller::ControllerArgs),
    /// Admit a write to a file-backed fenced store (the enforcement side of a fencing token).
    Fence(fence::FenceArgs),
    /// Run a command while holding a Lease, with its fencing token in the environment.
    Lock(lock::LockArgs),
    /// The fenced outbox: install it in PostgreSQL, or run its relay.
    #[cfg(feature = "outbox")]
    Outbox(outbox::OutboxArgs),
    /// Show Leases: holder, fencing token, phase and waiting claims.
    Status(status::StatusArgs),
}

/// Runs the subcommand; its exit code.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Agent(args) => agent::run(args),
        Command::Check(args) => check::run(args),
        Command::Crds => crds::run(),
        Command::Controller(args) => controller::run(args),
        Command::Fence(args) => fence::run(args),
        Command::Lock(args) => lock::run(args),
        #[cfg(feature = "outbox")]
        Command::Outbox(args) => outbox::run(args),
        Command::Status(args) => status::run(args),
    }
}

/// How many threads a subcommand's runtime has.
#[derive(Clone, Copy, Debug)]
enum Threads {
    /// A client command: one thread is plenty.
    One,
    /// The controller: its writes, watches and admin server run in parallel.
    Many,
}

/// The one runtime builder: runs `task` of `palisade <command>` to completion.
fn block_on(command: &str, threads: Threads, task: impl Future<Output = ExitCode>) -> ExitCode {
    let mut builder = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::Many => tokio::runtime::Builder::new_multi_thread(),
    };
    match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(task),
        Err(e) => {
            eprintln!("palisade {command}: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The one logging set-up: to stderr (stdout is the commands' output), filtered by
/// `RUST_LOG`, else at `default_level`; one JSON object per line with `json`.
fn init_logging(default_level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The one identity default, when `--identity` is not given: the pod name (`$POD_NAME`),
/// else the host name ([`crate::client::default_identity`]). The controller adds its
/// process id to the host name (see [`controller`]).
fn default_identity() -> String {
    crate::client::default_identity()
}

/// A malformed `--duration`, `--grace`, `--timeout` or `--lock-timeout`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}: {USAGE}")]
    NoNumber(String),
    #[error("invalid duration {text:?}: {number} is too large")]
    NumberTooLarge { text: String, number: String },
    #[error("invalid duration {0:?}: missing unit; {USAGE}")]
    MissingUnit(String),
    #[error("invalid duration {text:?}: unknown unit {unit:?}; {USAGE}")]
    UnknownUnit { text: String, unit: String },
    #[error("invalid duration {0:?}: too large")]
    TooLarge(String),
    #[error(
        "invalid lease duration {0:?}: must be whole seconds from 1s to 24h \
         (leaseDurationSeconds is in seconds)"
    )]
    NotALeaseDuration(String),
}

const USAGE: &str = "expected a whole number and a unit: ms, s, m or h (e.g. 500ms, 15s, 2m)";

/// A duration such as `500ms`, `15s`, `2m` or `1h`: a whole number and a unit.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(DurationError::NoNumber(text.to_owned()));
    }
    let n: u64 = number.parse().map_err(|_| DurationError::NumberTooLarge {
        text: text.to_owned(),
        number: number.to_owned(),
    })?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(DurationError::MissingUnit(text.to_owned())),
        _ => {
            return Err(DurationError::UnknownUnit {
                text: text.to_owned(),
                unit: unit.to_owned(),
            });
        }
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| DurationError::TooLarge(text.to_owned()))
}

/// A lease duration: whole seconds from 1s to 24h, as `leaseDurationSeconds` allows.
pub fn parse_lease_duration(text: &str) -> Result<Duration, DurationError> {
    let d = parse_duration(text)?;
    let max = Duration::from_secs(MAX_LEASE_DURATION_SECONDS as u64);
    if d.subsec_nanos() != 0 || d < Duration::from_secs(1) || d > max {
        return Err(DurationError::NotALeaseDuration(text.to_owned()));
    }
    Ok(d)
}

/// A `--slot`: a whole number from 0 to 63, the slots a Lease can have.
pub fn parse_slot(text: &str) -> Result<i32, String> {
    parse_in(text, 0, MAX_PERMITS - 1).map_err(|why| {
        format!(
            "{why}: a slot is a whole number from 0 to {} (a Lease has at most {MAX_PERMITS} \
             permits, slots 0 to permits-1)",
            MAX_PERMITS - 1
        )
    })
}

/// A `--permits`: a whole number from 1 (a lock) to 64.
pub fn parse_permits(text: &str) -> Result<i32, String> {
    parse_in(text, 1, MAX_PERMITS)
        .map_err(|why| format!("{why}: permits is a whole number from 1 (a lock) to {MAX_PERMITS}"))
}

fn parse_in(text: &str, min: i32, max: i32) -> Result<i32, String> {
    let n: i64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if n < i64::from(min) || n > i64::from(max) {
        return Err(format!("{n} is out of range"));
    }
    Ok(n as i32)
}

/// `2s`, `750ms`: as [`parse_duration`] reads it.
fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in [
            "",
            "15",
            "s",
            "1.5s",
            "-1s",
            "15 s",
            "15sec",
            "5x",
            "99999999999999999999s",
        ] {
            let err = parse_duration(bad).expect_err(bad).to_string();
            assert!(err.contains("invalid duration"), "{bad}: {err}");
        }
        assert!(
            parse_duration("15")
                .unwrap_err()
                .to_string()
                .contains("missing unit")
        );
    }

    #[test]
    fn lease_durations_are_whole_seconds_within_the_crd_range() {
        assert_eq!(parse_lease_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_lease_duration("24h"), Ok(Duration::from_secs(86_400)));
        for bad in ["500ms", "1500ms", "0s", "25h"] {
            let err = parse_lease_duration(bad).expect_err(bad).to_string();
            assert!(err.contains("whole seconds from 1s to 24h"), "{bad}: {err}");
        }
    }

    #[test]
    fn slots_are_0_to_63_and_permits_1_to_64() {
        assert_eq!(parse_slot("0"), Ok(0));
        assert_eq!(parse_slot("63"), Ok(63));
        for bad in ["64", "-1", "x", "", "1.5", "99999999999"] {
            let err = parse_slot(bad).unwrap_err();
            assert!(err.contains("0 to 63"), "{bad}: {err}");
        }
        assert_eq!(parse_permits("1"), Ok(1));
        assert_eq!(parse_permits("64"), Ok(64));
        for bad in ["0", "65", "-3", "three"] {
            let err = parse_permits(bad).unwrap_err();
            assert!(err.contains("1 (a lock) to 64"), "{bad}: {err}");
        }
    }

    #[test]
    fn durations_are_shown_as_they_are_parsed() {
        for text in ["2s", "750ms", "0s", "3750ms"] {
            assert_eq!(show_duration(parse_duration(text).unwrap()), text);
        }
    }
}
