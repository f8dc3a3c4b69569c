//! `palisade lock LEASE -- CMD ARGS...`: run a command while holding a Lease, like
//! `etcdctl lock` and `consul lock`, but fenced: the command gets the grant's
//! fencing token to pass to the resource it protects.

mod supervise;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use self::supervise::{Group, Signals, exit_code, spawn, stop};
use super::{
    Threads, block_on, default_identity, init_logging, parse_duration, parse_lease_duration,
    show_duration,
};
use crate::client::{AcquireOptions, Error, Grant, LeaseClient, PodBinding, call};
use crate::error::ApiErrorKind;

/// The lease was lost while CMD ran (EX_TEMPFAIL: try again).
pub const EXIT_LOST: u8 = 75;
/// The lease was not granted within `--timeout`.
pub const EXIT_TIMEOUT: u8 = 76;
/// Bad usage or input (also what clap exits with on a usage error).
pub const EXIT_USAGE: u8 = 2;
/// A Kubernetes API or other error.
pub const EXIT_ERROR: u8 = 1;
/// CMD exists but could not be started (shell convention).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// CMD was not found (shell convention).
pub const EXIT_NOT_FOUND: u8 = 127;

/// How long, at most, to wait for claim deletions before exiting.
const FLUSH_LIMIT: Duration = Duration::from_secs(10);

const AFTER_HELP: &str = "\
CMD runs in its own process group with these variables in its environment:
  PALISADE_FENCING_TOKEN  the grant's fencing token: send it with every write it protects
  PALISADE_LEASE          the Lease name
  PALISADE_HOLDER         the holder identity
  PALISADE_CLAIM          the LeaseClaim name
  PALISADE_NAMESPACE      the namespace

The lease is renewed while CMD runs. If it is lost (revoked, expired, deleted, or
not renewed in time), CMD's process group gets SIGTERM, then SIGKILL after --grace
(by default a sixth of the lease duration; a --grace over a quarter of it is refused,
so that CMD is gone before the controller can hand the lease on).
When this process exits, or dies by any signal (even SIGKILL), whatever is left of
CMD's process group gets SIGKILL at once: CMD's children and grandchildren too, but
not a process that left the group on purpose (setsid, setpgid).
SIGINT, SIGTERM and SIGHUP to this process are forwarded to CMD as SIGTERM (SIGKILL
after --grace). The claim is deleted (the lease released) on every way out.

Exit codes:
  CMD's exit status  CMD ran to completion (128+N if it was killed by signal N)
  75                 the lease was lost while CMD ran; CMD was stopped
  76                 the lease was not granted within --timeout
  2                  bad usage or input (e.g. a malformed duration, an invalid lease name)
  1                  Kubernetes API or other error
  126, 127           CMD could not be started, or was not found
  129, 130, 143      SIGHUP, SIGINT or SIGTERM arrived before CMD started
Since CMD's own status is passed through, a CMD that exits 75 or 76 itself cannot be
told apart by the code alone; the reason is also printed on stderr.";

/// Run a command while holding a Lease.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct LockArgs {
    /// Namespace of the Lease [default: $POD_NAMESPACE, else the kubeconfig's namespace].
    #[arg(short = 'n', long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// leaseDurationSeconds of the Lease, when this command creates it (whole seconds,
    /// 1s to 24h, e.g. 15s or 2m). An existing Lease keeps its own duration.
    #[arg(long, default_value = "15s", value_parser = parse_lease_duration)]
    pub duration: Duration,

    /// Holder identity [default: $POD_NAME, else the host name].
    #[arg(long)]
    pub identity: Option<String>,

    /// How long CMD may take to exit after SIGTERM before it gets SIGKILL (e.g. 500ms)
    /// [default: a sixth of the lease duration]. At most a quarter of the lease
    /// duration, so that CMD is stopped before the controller can hand the lease on.
    #[arg(long, value_parser = parse_duration)]
    pub grace: Option<Duration>,

    /// Give up (exit 76) when the lease is not granted within this long [default: wait].
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Name of the Lease (created if missing).
    pub lease: String,

    /// The command to run, and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

pub fn run(args: LockArgs) -> ExitCode {
    // Library warnings (a renewal that keeps failing, a claim that could not be deleted).
    init_logging("warn", false);
    block_on("lock", Threads::One, async {
        ExitCode::from(lock(args).await)
    })
}

async fn lock(args: LockArgs) -> u8 {
    // Installed first: from here on these signals are ours to handle (release, forward).
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("palisade lock: cannot install signal handlers: {e}");
            return EXIT_ERROR;
        }
    };
    let leases = match LeaseClient::try_default(args.namespace.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "palisade lock: no Kubernetes client configuration (KUBECONFIG or in-cluster): {e}"
            );
            return EXIT_ERROR;
        }
    };
    let code = acquire_and_run(&leases, &args, &mut signals).await;
    // A claim whose acquire was interrupted is deleted by a spawned task: let it finish.
    if !leases.flush(FLUSH_LIMIT).await {
        eprintln!("palisade lock: gave up waiting for the claim to be deleted");
    }
    code
}

async fn acquire_and_run(leases: &LeaseClient, args: &LockArgs, signals: &mut Signals) -> u8 {
    let lease = args.lease.as_str();
    let ns = leases.namespace();
    if let Err(e) = leases
        .ensure_lease(lease, args.duration.as_secs() as i64)
        .await
    {
        eprintln!("palisade lock: cannot create lease {lease} in namespace {ns}: {e}");
        return match &e {
            // The API server refused the input itself, e.g. a lease name that is not a DNS label.
            Error::Api(e)
                if matches!(
                    ApiErrorKind::of(e),
                    ApiErrorKind::Invalid | ApiErrorKind::BadRequest
                ) =>
            {
                EXIT_USAGE
            }
            _ => EXIT_ERROR,
        };
    }
    // Refused before a claim exists when the Lease's duration already rules it out.
    let duration = match call(
        || format!("reading lease {lease}"),
        leases.leases().get(lease),
    )
    .await
    {
        Ok(l) => Duration::from_secs(l.spec.lease_duration_seconds.clamp(1, 86_400) as u64),
        Err(e) => {
            eprintln!("palisade lock: cannot read lease {lease} in namespace {ns}: {e}");
            return EXIT_ERROR;
        }
    };
    if let Err(e) = check_grace(args.grace, lease, duration) {
        eprintln!("palisade lock: {e}");
        return EXIT_USAGE;
    }
    let options = AcquireOptions {
        identity: Some(args.identity.clone().unwrap_or_else(default_identity)),
        pod: PodBinding::FromEnv,
        timeout: args.timeout,
    };
    // Dropping the acquire (on a signal) deletes its claim; `lock` waits for that.
    let grant = tokio::select! {
        acquired = leases.acquire(lease, options) => match acquired {
            Ok(grant) => grant,
            Err(e @ Error::Timeout { .. }) => {
                eprintln!("palisade lock: {e}");
                return EXIT_TIMEOUT;
            }
            Err(e) => {
                eprintln!("palisade lock: cannot acquire lease {lease} in namespace {ns}: {e}");
                return EXIT_ERROR;
            }
        },
        signal = signals.recv() => {
            eprintln!("palisade lock: interrupted by signal {signal} while waiting for lease {lease}");
            return 128 + signal as u8;
        }
    };
    tracing::info!(
        lease,
        claim = grant.claim_name(),
        token = grant.token(),
        "acquired"
    );
    // The duration may have been edited since it was read.
    if let Err(e) = check_grace(args.grace, lease, grant.lease_duration()) {
        eprintln!("palisade lock: {e}");
        release(grant).await;
        return EXIT_USAGE;
    }

    let mut group = match Group::new() {
        Ok(group) => group,
        Err(e) => {
            eprintln!("palisade lock: cannot start the command's watchdog: {e}");
            release(grant).await;
            return EXIT_ERROR;
        }
    };
    let mut child = match spawn(&args.command, &grant, &group) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("palisade lock: cannot run {:?}: {e}", args.command[0]);
            group.finish();
            release(grant).await;
            return match e.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_RUN,
            };
        }
    };
    let lost = grant.lost();
    let code = tokio::select! {
        // A loss noticed together with CMD's exit is reported as a loss.
        biased;
        reason = lost => {
            eprintln!(
                "palisade lock: lost lease {lease} (fencing token {}): {reason}; stopping the command",
                grant.token()
            );
            stop(&mut child, &group, grace(args.grace, grant.lease_duration())).await;
            EXIT_LOST
        }
        signal = signals.recv() => {
            eprintln!("palisade lock: signal {signal}: stopping the command, then releasing lease {lease}");
            exit_code(stop(&mut child, &group, grace(args.grace, grant.lease_duration())).await)
        }
        status = child.wait() => match status {
            Ok(status) => exit_code(Some(status)),
            Err(e) => {
                eprintln!("palisade lock: waiting for the command failed: {e}");
                EXIT_ERROR
            }
        },
    };
    // Whatever CMD left running in its group would go on writing with the token
    // after the release: it is killed first.
    group.finish();
    release(grant).await;
    code
}

async fn release(grant: Grant) {
    let claim = grant.claim_name().to_string();
    if let Err(e) = grant.release().await {
        eprintln!("palisade lock: could not delete claim {claim} (it expires on its own): {e}");
    }
}

/// The longest `--grace` for a lease duration: a quarter of it. A holder gives up at
/// its local deadline a third of the duration before the controller can hand the
/// lease on (the safety margin); CMD must be gone within it, and the last quarter of
/// the margin is left for SIGKILL and for timers that fire late.
pub fn max_grace(duration: Duration) -> Duration {
    duration / 4
}

/// The grace period to use now: `--grace`, else a sixth of the duration, and never
/// more than [`max_grace`] of the duration the grant is held under (which an edit
/// of the Lease can shorten while CMD runs).
fn grace(requested: Option<Duration>, duration: Duration) -> Duration {
    requested.unwrap_or(duration / 6).min(max_grace(duration))
}

/// A `--grace` longer than [`max_grace`] of the lease's duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--grace {} is longer than a quarter of lease {lease}'s duration ({}): the command \
     must be stopped before the controller can hand the lease on, a third of the \
     duration after this process gives up; use --grace {} or less, or a Lease with a \
     longer leaseDurationSeconds",
    show_duration(*grace),
    show_duration(*duration),
    show_duration(max_grace(*duration))
)]
pub struct GraceTooLong {
    pub grace: Duration,
    pub lease: String,
    pub duration: Duration,
}

/// A `--grace` longer than [`max_grace`] of the lease's duration is refused.
fn check_grace(
    requested: Option<Duration>,
    lease: &str,
    duration: Duration,
) -> Result<(), GraceTooLong> {
    match requested {
        Some(grace) if grace > max_grace(duration) => Err(GraceTooLong {
            grace,
            lease: lease.to_owned(),
            duration,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_defaults_to_a_sixth_and_never_exceeds_a_quarter_of_the_duration() {
        let d = Duration::from_secs(15);
        assert_eq!(grace(None, d), Duration::from_millis(2500));
        assert_eq!(
            grace(Some(Duration::from_secs(1)), d),
            Duration::from_secs(1)
        );
        // A Lease shortened while CMD runs clamps an accepted --grace.
        assert_eq!(
            grace(Some(Duration::from_secs(3)), Duration::from_secs(4)),
            Duration::from_secs(1)
        );
        assert!(check_grace(Some(Duration::from_millis(3750)), "l", d).is_ok());
        let err = check_grace(Some(Duration::from_secs(4)), "l", d)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--grace 4s") && err.contains("(15s)") && err.contains("3750ms"),
            "{err}"
        );
        assert!(check_grace(None, "l", Duration::from_secs(1)).is_ok());
    }
}
