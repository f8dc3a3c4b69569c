//! CMD's process, which `supervise` (in `lock.rs`) watches: starting it in the
//! watchdog's process group ([`super::watchdog`]) with the grant in its environment,
//! its state changes (exited, stopped), the terminal, stopping it, its exit status,
//! and the signals this process handles.
//!
//! Part of the command, not of the library: the `cli` module's docs say why. The
//! watchdog's rules are in [`super::watchdog`]; a terminal's and a stop's are here.
//!
//! **A terminal.** When standard input is the controlling terminal and `palisade
//! lock` is in its foreground group, the command's group is made the foreground group
//! before the command starts (so it can read the terminal, and Ctrl-C, Ctrl-Z and
//! Ctrl-\ reach it, not `palisade lock`), and the terminal is handed back when it
//! ends; after a stop it is handed over again only if `palisade lock` was put in the
//! foreground (`fg`, not `bg`). Not when standard output is a pipe: a pipeline's other
//! commands are in `palisade lock`'s group, and a pager there needs the terminal (it
//! would be stopped, and the command blocked on the full pipe). SIGTTOU is ignored by
//! `palisade lock` (not by the command), so it can move the terminal and write to it
//! from the background.
//!
//! **Stops are the job's.** `palisade lock` reaps the command itself (`waitpid` with
//! `WUNTRACED`); as for a shell, the job's stop is its direct child's (a shell waiting
//! on a vfork child that was stopped before its exec is not stopped). When the command
//! is stopped (Ctrl-Z, SIGSTOP, SIGTTIN...) or `palisade lock` gets SIGTSTP, it takes
//! the terminal back, sends SIGTSTP to the command's group (the whole job stops, not
//! only the command) and stops itself with SIGSTOP (never discarded, as SIGTSTP is in
//! an orphaned process group), so the shell sees a stopped job and nothing renews the
//! lease of a stopped command. When it is continued, it continues the command's group
//! only if the grant is still held: its local deadline has not passed and a fresh read
//! of the Lease still names its claim and token (what came while it was stopped may be
//! unread). Otherwise it SIGKILLs the group before anything else and exits 75. A job
//! stopped longer than the kill time finds the command already killed by the
//! watchdog. A SIGSTOP to the whole group stops the watchdog too; `palisade lock` sees
//! the command stopped and applies the same rule.
//!
//! **Exit codes**: the command's own status, 75 lost while running (also when the
//! command was killed by the watchdog at the kill time), 76 not granted within
//! `--timeout`, 2 bad input, 1 API error or the watchdog died, 126/127 cannot start,
//! 129/130/143 signalled before the command started.

use std::ffi::OsString;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;

use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::EXIT_ERROR;
use super::watchdog::Group;
use crate::client::Grant;

/// CMD, the direct child, reaped by [`Child::poll`] (not by tokio, which cannot
/// report a stop).
pub(super) struct Child {
    pid: libc::pid_t,
    state: ChildState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChildState {
    Running,
    /// Stopped by this signal.
    Stopped(libc::c_int),
    Exited(ExitStatus),
}

impl Child {
    /// Collects CMD's state changes so far (without blocking) and returns its state.
    pub(super) fn poll(&mut self) -> ChildState {
        while !matches!(self.state, ChildState::Exited(_)) {
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let pid = unsafe {
                libc::waitpid(
                    self.pid,
                    &mut status,
                    libc::WNOHANG | libc::WUNTRACED | libc::WCONTINUED,
                )
            };
            if pid != self.pid {
                break;
            }
            self.state = if libc::WIFSTOPPED(status) {
                ChildState::Stopped(libc::WSTOPSIG(status))
            } else if libc::WIFCONTINUED(status) {
                ChildState::Running
            } else {
                ChildState::Exited(ExitStatus::from_raw(status))
            };
        }
        self.state
    }

    fn kill(&self) {
        if !matches!(self.state, ChildState::Exited(_)) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Never left behind, even if it left the group.
        self.kill();
        if !matches!(self.state, ChildState::Exited(_)) {
            // SAFETY: reaps our own child, which SIGKILL ends.
            unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        }
    }
}

pub(super) fn spawn(command: &[OsString], grant: &Grant, group: &Group) -> std::io::Result<Child> {
    let mut cmd = std::process::Command::new(&command[0]);
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // The group's watchdog covers the whole tree; this also covers CMD itself
    // should the watchdog be gone.
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid,
    // signal, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // This process may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(libc::c_int::from(EXIT_ERROR));
            }
            // Ignored here (see `ignore_terminal_output`), and an ignored signal stays
            // ignored across exec.
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = cmd
        .args(&command[1..])
        .env("PALISADE_FENCING_TOKEN", grant.token().to_string())
        .env("PALISADE_SLOT", grant.slot().to_string())
        .env("PALISADE_FENCE_KEY", grant.fence_key())
        .env("PALISADE_LEASE", grant.lease())
        .env("PALISADE_HOLDER", grant.identity())
        .env("PALISADE_CLAIM", grant.claim_name())
        .env("PALISADE_NAMESPACE", grant.namespace())
        // The watchdog's group, so that stopping it stops everything CMD started.
        .process_group(group.id())
        .spawn()?;
    Ok(Child {
        pid: child.id() as libc::pid_t,
        state: ChildState::Running,
    })
}

/// This process may hand the terminal to CMD's group and take it back from the
/// background, and write to it from there: SIGTTOU must not stop it.
pub(super) fn ignore_terminal_output() {
    // SAFETY: sets a disposition; no handler runs.
    unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
}

/// The controlling terminal, when it is standard input and standard output is not a
/// pipe (a pipeline's other commands, a pager among them, stay in this process's group
/// and need the terminal themselves).
pub(super) struct Terminal {
    fd: libc::c_int,
}

impl Terminal {
    pub(super) fn of_stdin() -> Option<Terminal> {
        // SAFETY: isatty, tcgetpgrp and fstat on standard descriptors, with a valid stat buffer.
        unsafe {
            if libc::isatty(0) != 1 || libc::tcgetpgrp(0) < 0 {
                return None;
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(1, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO {
                return None;
            }
        }
        Some(Terminal { fd: 0 })
    }

    /// Makes `group` the foreground group, if this process's group is: the terminal
    /// is only passed on by the job it belongs to.
    pub(super) fn give(&self, group: &Group) {
        // SAFETY: tcgetpgrp, getpgrp and tcsetpgrp take plain integers.
        unsafe {
            if libc::tcgetpgrp(self.fd) == libc::getpgrp() {
                libc::tcsetpgrp(self.fd, group.id());
            }
        }
    }

    /// Makes this process's group the foreground group again, if `group` has the terminal.
    pub(super) fn take_back(&self, group: &Group) {
        // SAFETY: as above.
        unsafe {
            if libc::tcgetpgrp(self.fd) == group.id() {
                libc::tcsetpgrp(self.fd, libc::getpgrp());
            }
        }
    }
}

/// Stops this process (SIGSTOP, which unlike SIGTSTP is never discarded for an
/// orphaned process group) and returns once it is continued.
pub(super) fn stop_self() {
    // SAFETY: kill(2) on ourselves.
    unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
}

/// Ends CMD's process group: SIGTERM, SIGKILL after `grace`; returns CMD's status.
/// A stopped CMD is continued to handle the SIGTERM only when `may_continue` (its
/// grant is held); otherwise it gets SIGKILL at once, and never runs again.
pub(super) async fn stop(
    child: &mut Child,
    group: &Group,
    signals: &mut JobSignals,
    grace: Duration,
    may_continue: bool,
) -> Option<ExitStatus> {
    let stopped = matches!(child.poll(), ChildState::Stopped(_));
    if stopped && !may_continue {
        group.signal(libc::SIGKILL);
        child.kill();
    } else {
        group.signal(libc::SIGTERM);
        if stopped {
            group.signal(libc::SIGCONT);
        }
    }
    let exited = async {
        loop {
            if let ChildState::Exited(status) = child.poll() {
                return status;
            }
            signals.child().await;
        }
    };
    if let Ok(status) = tokio::time::timeout(grace, exited).await {
        return Some(status);
    }
    group.signal(libc::SIGKILL);
    child.kill();
    loop {
        if let ChildState::Exited(status) = child.poll() {
            return Some(status);
        }
        signals.child().await;
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed it.
pub(super) fn exit_code(status: Option<ExitStatus>) -> u8 {
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
pub(super) struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    pub(super) async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
        }
    }
}

/// SIGCHLD and SIGTSTP to this process, handled from just before CMD starts (until
/// then SIGTSTP stops this process as usual).
pub(super) struct JobSignals {
    child: Signal,
    suspend: Signal,
}

impl JobSignals {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            child: signal(SignalKind::child())?,
            suspend: signal(SignalKind::from_raw(libc::SIGTSTP))?,
        })
    }

    /// The next SIGCHLD: CMD or the watchdog changed state.
    pub(super) async fn child(&mut self) {
        self.child.recv().await;
    }

    /// The next SIGCHLD or SIGTSTP.
    pub(super) async fn recv(&mut self) -> JobSignal {
        tokio::select! {
            _ = self.child.recv() => JobSignal::Child,
            _ = self.suspend.recv() => JobSignal::Suspend,
        }
    }
}

pub(super) enum JobSignal {
    /// SIGCHLD: CMD or the watchdog changed state.
    Child,
    /// SIGTSTP to this process: stop the job.
    Suspend,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(Some(ExitStatus::from_raw(7 << 8))), 7);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(libc::SIGTERM))), 143);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(libc::SIGKILL))), 137);
        assert_eq!(exit_code(None), EXIT_ERROR);
    }
}
