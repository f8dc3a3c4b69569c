//! CMD under supervision: its process group and the watchdog that kills the group
//! when `palisade lock` dies, starting CMD with the grant in its environment,
//! stopping it, its exit status, and the signals this process forwards to it.
//!
//! Part of the command, not of the library: DESIGN.md, "The crate's features and the CLI".

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::EXIT_ERROR;
use crate::client::Grant;

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
pub(super) struct Group {
    /// The watchdog's pid, which is also the group's id. Never reaped before the
    /// group is finished with, so the id cannot be reused while we signal it.
    leader: libc::pid_t,
    /// Dropping it tells the watchdog to kill the group.
    alive: Option<std::io::PipeWriter>,
}

impl Group {
    pub(super) fn new() -> std::io::Result<Self> {
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
    pub(super) fn finish(&mut self) {
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

pub(super) fn spawn(command: &[OsString], grant: &Grant, group: &Group) -> std::io::Result<Child> {
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
pub(super) async fn stop(child: &mut Child, group: &Group, grace: Duration) -> Option<ExitStatus> {
    group.signal(libc::SIGTERM);
    if let Ok(Ok(status)) = tokio::time::timeout(grace, child.wait()).await {
        return Some(status);
    }
    group.signal(libc::SIGKILL);
    child.wait().await.ok()
}

/// The shell's convention: the exit code, or 128 + the signal that killed it.
pub(super) fn exit_code(status: Option<ExitStatus>) -> u8 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(Some(ExitStatus::from_raw(7 << 8))), 7);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(libc::SIGTERM))), 143);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(libc::SIGKILL))), 137);
        assert_eq!(exit_code(None), EXIT_ERROR);
    }
}
