//! `palisade lock LEASE -- CMD ARGS...`: run a command while holding a Lease, like
//! `etcdctl lock` and `consul lock`, but fenced: the command gets the grant's
//! fencing token to pass to the resource it protects.

use std::ffi::OsString;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::api::MAX_LEASE_DURATION_SECONDS;
use crate::client::{AcquireOptions, Error, Grant, LeaseClient, PodBinding, call};

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
    init_logging();
    ExitCode::from(runtime().block_on(lock(args)))
}

/// A single-threaded runtime is plenty for a client command.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime")
}

/// Library warnings (a renewal that keeps failing, a claim that could not be deleted) on stderr.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
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
        return match e {
            // The API server refused the input itself, e.g. a lease name that is not a DNS label.
            Error::Api(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => EXIT_USAGE,
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
    if let Err(message) = check_grace(args.grace, lease, duration) {
        eprintln!("palisade lock: {message}");
        return EXIT_USAGE;
    }
    let options = AcquireOptions {
        identity: args.identity.clone(),
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
    if let Err(message) = check_grace(args.grace, lease, grant.lease_duration()) {
        eprintln!("palisade lock: {message}");
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

/// CMD's process group: CMD and everything it starts that stays in the group.
///
/// Its leader is a watchdog, forked from this process before CMD starts. It holds the
/// read end of a pipe whose only write end this process holds, and waits for EOF:
/// when this process exits or dies by any signal (SIGKILL and the OOM killer
/// included), the kernel closes the write end and the watchdog SIGKILLs the whole
/// group, itself included. `PR_SET_PDEATHSIG` alone reaches only the direct child;
/// the group reaches grandchildren too. A process that leaves the group on purpose
/// (`setsid`, `setpgid`) is out of reach.
///
/// A forked process without `exec`, because the watchdog must need nothing from the
/// filesystem (no shell in a distroless image) and does only async-signal-safe calls.
struct Group {
    /// The watchdog's pid, which is also the group's id. Never reaped before the
    /// group is finished with, so the id cannot be reused while we signal it.
    leader: libc::pid_t,
    /// Dropping it tells the watchdog to kill the group.
    alive: Option<std::io::PipeWriter>,
}

impl Group {
    fn new() -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        // Both ends close on exec: CMD inherits neither.
        let (reader, writer) = std::io::pipe()?;
        let (read_fd, write_fd) = (reader.as_raw_fd(), writer.as_raw_fd());
        // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask get valid pointers.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
        // Signals stay blocked across the fork, so that none runs this process's
        // handlers (tokio's) in the watchdog before it ignores them.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        }
        // SAFETY: the child only makes async-signal-safe calls (signal, sigmask,
        // setpgid, close, read, kill, _exit) and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe { watchdog(read_fd, write_fd, &previous) }
        }
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Also here, so that CMD can join the group whichever process runs first.
        // SAFETY: setpgid on our own child.
        unsafe { libc::setpgid(pid, pid) };
        drop(reader);
        Ok(Self {
            leader: pid,
            alive: Some(writer),
        })
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names the group.
        unsafe { libc::kill(-self.leader, signal) };
    }

    /// SIGKILLs whatever is left of the group and reaps the watchdog.
    fn finish(&mut self) {
        if self.alive.take().is_some() {
            self.signal(libc::SIGKILL);
            // SAFETY: reaps our own child, which SIGKILL has ended (or is ending).
            unsafe { libc::waitpid(self.leader, std::ptr::null_mut(), 0) };
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The watchdog process: waits for EOF on `read_fd`, then SIGKILLs its process group.
///
/// # Safety
/// Only in the child of a fork, with all signals blocked.
unsafe fn watchdog(read_fd: libc::c_int, write_fd: libc::c_int, mask: &libc::sigset_t) -> ! {
    unsafe {
        // Signals forwarded to the group, or from a terminal, must not end the
        // watchdog: only SIGKILL (which ends the whole group anyway) may.
        for signal in 1..32 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP && signal != libc::SIGCONT {
                libc::signal(signal, libc::SIG_IGN);
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
        libc::setpgid(0, 0);
        libc::close(write_fd);
        let mut byte = 0u8;
        loop {
            let n = libc::read(read_fd, (&raw mut byte).cast(), 1);
            if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                break;
            }
        }
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0)
    }
}

fn spawn(command: &[OsString], grant: &Grant, group: &Group) -> std::io::Result<Child> {
    let mut cmd = Command::new(&command[0]);
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // The group's watchdog covers the whole tree; this also covers CMD itself
    // should the watchdog be gone.
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // This process may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(libc::c_int::from(EXIT_ERROR));
            }
            Ok(())
        });
    }
    cmd.args(&command[1..])
        .env("PALISADE_FENCING_TOKEN", grant.token().to_string())
        .env("PALISADE_LEASE", grant.lease())
        .env("PALISADE_HOLDER", grant.identity())
        .env("PALISADE_CLAIM", grant.claim_name())
        .env("PALISADE_NAMESPACE", grant.namespace())
        // The watchdog's group, so that stopping it stops everything CMD started.
        .process_group(group.leader)
        .kill_on_drop(true)
        .spawn()
}

/// SIGTERM to CMD's process group, SIGKILL after `grace`; returns CMD's status.
async fn stop(child: &mut Child, group: &Group, grace: Duration) -> Option<ExitStatus> {
    group.signal(libc::SIGTERM);
    if let Ok(Ok(status)) = tokio::time::timeout(grace, child.wait()).await {
        return Some(status);
    }
    group.signal(libc::SIGKILL);
    child.wait().await.ok()
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

/// A `--grace` longer than [`max_grace`] of the lease's duration is refused.
fn check_grace(requested: Option<Duration>, lease: &str, duration: Duration) -> Result<(), String> {
    match requested {
        Some(g) if g > max_grace(duration) => Err(format!(
            "--grace {} is longer than a quarter of lease {lease}'s duration ({}): the command \
             must be stopped before the controller can hand the lease on, a third of the \
             duration after this process gives up; use --grace {} or less, or a Lease with a \
             longer leaseDurationSeconds",
            show_duration(g),
            show_duration(duration),
            show_duration(max_grace(duration)),
        )),
        _ => Ok(()),
    }
}

/// `2s`, `750ms`: as `parse_duration` reads it.
fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed it.
fn exit_code(status: Option<ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
            (None, None) => EXIT_ERROR,
        },
        None => EXIT_ERROR,
    }
}

/// SIGINT, SIGTERM and SIGHUP to this process.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
        }
    }
}

/// A duration such as `500ms`, `15s`, `2m` or `1h`: a whole number and a unit.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let usage = "expected a whole number and a unit: ms, s, m or h (e.g. 500ms, 15s, 2m)";
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!("invalid duration {text:?}: {usage}"));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: {number} is too large"))?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(format!("invalid duration {text:?}: missing unit; {usage}")),
        _ => {
            return Err(format!(
                "invalid duration {text:?}: unknown unit {unit:?}; {usage}"
            ));
        }
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("invalid duration {text:?}: too large"))
}

/// A lease duration: whole seconds from 1s to 24h, as `leaseDurationSeconds` allows.
pub fn parse_lease_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    let max = Duration::from_secs(MAX_LEASE_DURATION_SECONDS as u64);
    if d.subsec_nanos() != 0 || d < Duration::from_secs(1) || d > max {
        return Err(format!(
            "invalid lease duration {text:?}: must be whole seconds from 1s to 24h (leaseDurationSeconds is in seconds)"
        ));
    }
    Ok(d)
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
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.contains("invalid duration"), "{bad}: {err}");
        }
        assert!(parse_duration("15").unwrap_err().contains("missing unit"));
    }

    #[test]
    fn lease_durations_are_whole_seconds_within_the_crd_range() {
        assert_eq!(parse_lease_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_lease_duration("24h"), Ok(Duration::from_secs(86_400)));
        for bad in ["500ms", "1500ms", "0s", "25h"] {
            let err = parse_lease_duration(bad).expect_err(bad);
            assert!(err.contains("whole seconds from 1s to 24h"), "{bad}: {err}");
        }
    }

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
        let err = check_grace(Some(Duration::from_secs(4)), "l", d).unwrap_err();
        assert!(
            err.contains("--grace 4s") && err.contains("(15s)") && err.contains("3750ms"),
            "{err}"
        );
        assert!(check_grace(None, "l", Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(Some(ExitStatus::from_raw(7 << 8))), 7);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(libc::SIGTERM))), 143);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(libc::SIGKILL))), 137);
        assert_eq!(exit_code(None), EXIT_ERROR);
    }
}
