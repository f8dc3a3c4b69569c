//! `palisade lock LEASE -- CMD ARGS...`: run a command while holding a Lease, like
//! `etcdctl lock` and `consul lock`, but fenced: the command gets the grant's
//! fencing token to pass to the resource it protects.
//!
//! **`--grace`** defaults to a sixth of the lease duration and is refused (exit 2,
//! before any claim is made, and again if the duration at grant is shorter) when
//! longer than a quarter of it: after the local deadline the controller cannot hand
//! the lease on for a third of the duration (the safety margin), and the command must
//! be gone within it; the last quarter of the margin is left for the SIGKILL and late
//! timers. Refused rather than clamped, because a user who asked for a long grace
//! wants the command to finish its work, and silently cutting that short is a
//! surprise. If an edit shortens the Lease while the command runs, the grace is
//! clamped to the new quarter. The process group, the terminal, stops and exit codes:
//! `process`; the watchdog: `watchdog`.

mod process;
mod watchdog;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use self::process::{
    Child, ChildState, JobSignal, JobSignals, Signals, Terminal, exit_code, ignore_terminal_output,
    spawn, stop, stop_self,
};
use self::watchdog::Group;
use super::{
    Threads, block_on, default_identity, init_logging, parse_duration, parse_lease_duration,
    show_duration,
};
use crate::client::{AcquireOptions, Error, Grant, LeaseClient, LostReason, PodBinding, call};
use crate::kube_error::ApiErrorKind;

/// The lease was lost while CMD ran (EX_TEMPFAIL: try again).
pub const EXIT_LOST: u8 = 75;
/// The lease was not granted within `--timeout`.
pub const EXIT_TIMEOUT: u8 = 76;
/// Bad usage or input (also what clap exits with on a usage error).
pub const EXIT_USAGE: u8 = 2;
/// A Kubernetes API or other error; also: the command's watchdog died.
pub const EXIT_ERROR: u8 = 1;
/// The command's watchdog died while the command ran: the command was stopped.
const EXIT_WATCHDOG: u8 = EXIT_ERROR;
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
If this process is stopped or starved, its watchdog SIGKILLs CMD's group at the local
deadline plus --grace; if the watchdog is killed, CMD is stopped and this exits 1.
SIGINT, SIGTERM and SIGHUP to this process are forwarded to CMD as SIGTERM (SIGKILL
after --grace). The claim is deleted (the lease released) on every way out.

When stdin is the terminal (and stdout is not a pipe), CMD's group gets the terminal
while it runs: it can read it, and Ctrl-C and Ctrl-Z reach it. When CMD is stopped
(Ctrl-Z, SIGSTOP...) or this process gets SIGTSTP, the whole job stops, this process
too, so the lease is not renewed; once continued, CMD is continued only if the lease
is still held, else it is killed and this exits 75.

Exit codes:
  CMD's exit status  CMD ran to completion (128+N if it was killed by signal N)
  75                 the lease was lost while CMD ran (or was stopped); CMD was stopped
  76                 the lease was not granted within --timeout
  2                  bad usage or input (e.g. a malformed duration, an invalid lease name)
  1                  Kubernetes API or other error, or CMD's watchdog died
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
        slot: None,
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

    let code = run_command(leases, args, &grant, signals).await;
    release(grant).await;
    code
}

/// Runs CMD under the grant and supervises it until it ends or must be ended;
/// returns the exit code. Whatever CMD left running in its group is killed before
/// this returns: it would go on writing with the token after the release.
async fn run_command(
    leases: &LeaseClient,
    args: &LockArgs,
    grant: &Grant,
    signals: &mut Signals,
) -> u8 {
    let mut job = match JobSignals::new() {
        Ok(job) => job,
        Err(e) => {
            eprintln!("palisade lock: cannot install signal handlers: {e}");
            return EXIT_ERROR;
        }
    };
    let mut group = match Group::new() {
        Ok(group) => group,
        Err(e) => {
            eprintln!("palisade lock: cannot start the command's watchdog: {e}");
            return EXIT_ERROR;
        }
    };
    group.kill_at(kill_time(args, grant));
    ignore_terminal_output();
    // Handed over before CMD starts, so that its first read finds it in the foreground.
    let terminal = Terminal::of_stdin();
    if let Some(terminal) = &terminal {
        terminal.give(&group);
    }
    let code = match spawn(&args.command, grant, &group) {
        Ok(mut child) => {
            supervise(
                leases,
                args,
                grant,
                signals,
                &mut job,
                &group,
                terminal.as_ref(),
                &mut child,
            )
            .await
        }
        Err(e) => {
            eprintln!("palisade lock: cannot run {:?}: {e}", args.command[0]);
            match e.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_RUN,
            }
        }
    };
    if let Some(terminal) = &terminal {
        terminal.take_back(&group);
    }
    group.finish();
    code
}

/// When the watchdog kills CMD's group if this process has not: the local deadline
/// plus the grace, when this process itself would have SIGKILLed it.
fn kill_time(args: &LockArgs, grant: &Grant) -> Duration {
    *grant.local_deadline().borrow() + grace(args.grace, grant.lease_duration())
}

#[allow(clippy::too_many_arguments)]
async fn supervise(
    leases: &LeaseClient,
    args: &LockArgs,
    grant: &Grant,
    signals: &mut Signals,
    job: &mut JobSignals,
    group: &Group,
    terminal: Option<&Terminal>,
    child: &mut Child,
) -> u8 {
    let lease = args.lease.as_str();
    let token = grant.token();
    let grace = || grace(args.grace, grant.lease_duration());
    let lost = grant.lost();
    tokio::pin!(lost);
    let mut deadline = grant.local_deadline();
    let mut deadline_open = true;
    // Also on a state change before the first SIGCHLD was looked at.
    let mut check_children = true;
    loop {
        if check_children {
            check_children = false;
            match child.poll() {
                ChildState::Exited(status) if grant.is_held() => return exit_code(Some(status)),
                ChildState::Exited(_) => {
                    // Ended by the watchdog at the kill time, while this process could not act.
                    let reason = grant.lost_reason().unwrap_or(LostReason::LocalDeadline);
                    eprintln!(
                        "palisade lock: lost lease {lease} (fencing token {token}): {reason}; the command was killed"
                    );
                    return EXIT_LOST;
                }
                ChildState::Stopped(_) => {
                    if let Some(code) = suspend(leases, grant, group, terminal, child).await {
                        return code;
                    }
                    check_children = true;
                    continue;
                }
                ChildState::Running => {}
            }
            if let Some(how) = group.watchdog_ended() {
                if !grant.is_held() {
                    let reason = grant.lost_reason().unwrap_or(LostReason::LocalDeadline);
                    eprintln!(
                        "palisade lock: lost lease {lease} (fencing token {token}): {reason}; stopping the command"
                    );
                    return exit_lost(stop(child, group, job, grace(), false).await);
                }
                eprintln!(
                    "palisade lock: the command's watchdog (pid {}) {how}: nothing would stop the \
                     command's process group if this process died; stopping the command, then \
                     releasing lease {lease}",
                    group.id()
                );
                stop(child, group, job, grace(), true).await;
                return EXIT_WATCHDOG;
            }
        }
        tokio::select! {
            // A loss noticed together with CMD's exit is reported as a loss.
            biased;
            reason = &mut lost => {
                eprintln!(
                    "palisade lock: lost lease {lease} (fencing token {token}): {reason}; stopping the command"
                );
                return exit_lost(stop(child, group, job, grace(), false).await);
            }
            changed = deadline.changed(), if deadline_open => match changed {
                Ok(()) => group.kill_at(kill_time(args, grant)),
                Err(_) => deadline_open = false,
            },
            signal = job.recv() => {
                if let JobSignal::Suspend = signal
                    && let Some(code) = suspend(leases, grant, group, terminal, child).await
                {
                    return code;
                }
                check_children = true;
            }
            signal = signals.recv() => {
                eprintln!("palisade lock: signal {signal}: stopping the command, then releasing lease {lease}");
                return exit_code(stop(child, group, job, grace(), true).await);
            }
        }
    }
}

/// EXIT_LOST, whatever CMD's status on the way out.
fn exit_lost(_status: Option<std::process::ExitStatus>) -> u8 {
    EXIT_LOST
}

/// CMD was stopped, or this process got SIGTSTP: stops the job
/// as a shell would see it, by stopping this process too, so that nothing renews
/// the lease of a stopped command. Once continued, CMD is continued only if the grant
/// is still held (read back from the Lease); otherwise CMD is SIGKILLed before
/// anything else and the return is the exit code (EXIT_LOST).
async fn suspend(
    leases: &LeaseClient,
    grant: &Grant,
    group: &Group,
    terminal: Option<&Terminal>,
    child: &mut Child,
) -> Option<u8> {
    let lease = grant.lease();
    if let Some(terminal) = terminal {
        terminal.take_back(group);
    }
    // The whole job stops, not only CMD (a stop of CMD alone leaves the rest running).
    group.signal(libc::SIGTSTP);
    stop_self();
    // Continued.
    if !still_ours(leases, grant).await {
        group.signal(libc::SIGKILL);
        let reason = grant.lost_reason().unwrap_or(LostReason::LocalDeadline);
        eprintln!(
            "palisade lock: lost lease {lease} (fencing token {}) while the command was stopped: \
             {reason}; the command was killed",
            grant.token()
        );
        // Reaped on the way out.
        let _ = child.poll();
        return Some(EXIT_LOST);
    }
    if let Some(terminal) = terminal {
        terminal.give(group);
    }
    group.signal(libc::SIGCONT);
    None
}

/// Whether the grant is still held after a stop, by the clock and by a fresh read
/// of the Lease: what arrived while this process was stopped may not have been read
/// yet. Retried until the local deadline on errors.
async fn still_ours(leases: &LeaseClient, grant: &Grant) -> bool {
    if !grant.is_held() {
        return false;
    }
    let check = async {
        loop {
            match call(
                || format!("reading lease {}", grant.lease()),
                leases.leases().get(grant.lease()),
            )
            .await
            {
                Ok(l) => {
                    let status = l.status.unwrap_or_default();
                    return status.fencing_token == Some(grant.token())
                        && status
                            .holder
                            .is_some_and(|h| h.claim_uid == grant.claim_uid());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the lease after a stop; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    tokio::select! {
        biased;
        _ = grant.lost() => false,
        held = check => held && grant.is_held(),
    }
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
