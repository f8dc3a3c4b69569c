//! The watchdog of CMD's process group: a forked process that SIGKILLs the group
//! when `palisade lock` dies, or when the grant's kill time passes while it is
//! stopped or starved.
//!
//! `palisade lock` runs the command in its own process group and signals the whole
//! group. The group's leader is this watchdog, forked (without exec) before the
//! command starts; it holds the read end of a pipe whose only write end `palisade
//! lock` holds, and SIGKILLs the group when it reads EOF, i.e. when `palisade lock`
//! exits or dies by any signal. `PR_SET_PDEATHSIG` (kept for the command itself)
//! reaches only the direct child. On a normal exit the rest of the group is killed
//! before the release too: nothing started under the lease outlives it. Processes
//! that leave the group (`setsid`, `setpgid`) are out of reach, and documented so.
//! The watchdog closes every descriptor it inherited but its two (the pipe and a
//! timer), so a connection `palisade lock` drops really closes.
//!
//! **A stopped or starved `palisade lock` cannot act, so the watchdog does.**
//! `palisade lock` publishes a kill time in a page shared with the watchdog: the
//! grant's local deadline plus the grace (`--grace`), on `CLOCK_BOOTTIME`, moved on
//! by every renewal that counts (`Grant::local_deadline`). The watchdog SIGKILLs the
//! group when it passes, the moment `palisade lock` itself would have, a twelfth of
//! the duration at least before the controller can hand the lease on. So SIGSTOP to
//! `palisade lock` alone (or a pause) ends the command before the lease can move on;
//! with `palisade lock` running both act, which is harmless. A SIGSTOP to the whole
//! group stops the watchdog too, so the kill time waits for whoever continues the
//! group (`process` has the rule `palisade lock` then applies).
//!
//! **The watchdog's death is noticed at once** (SIGCHLD, `waitid` with `WNOWAIT`,
//! so its pid, the group's id, stays reserved): `palisade lock` says so, ends the
//! command's group (SIGTERM, SIGKILL after the grace), releases the lease and exits
//! 1, since without the watchdog nothing would end the group should `palisade lock`
//! die.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The watchdog's kill time before the first one is set: never.
const NO_DEADLINE: u64 = u64::MAX;

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
/// It also SIGKILLs the group at a kill time this process publishes in a shared page
/// (the grant's local deadline plus the grace, on `CLOCK_BOOTTIME`), so the group is
/// gone before the lease can move on even when this process is stopped or starved
/// and cannot do it itself.
///
/// A forked process without `exec`, because the watchdog must need nothing from the
/// filesystem (no shell in a distroless image) and does only async-signal-safe calls.
/// It closes every descriptor it inherited but its two, so it keeps no connection
/// of this process open.
pub(super) struct Group {
    /// The watchdog's pid, which is also the group's id. Never reaped before the
    /// group is finished with, so the id cannot be reused while we signal it.
    leader: libc::pid_t,
    /// Dropping it tells the watchdog to kill the group; a byte written to it tells
    /// the watchdog to read the kill time again.
    alive: Option<std::io::PipeWriter>,
    /// The kill time in nanoseconds on `CLOCK_BOOTTIME`: a page shared with the watchdog.
    kill_at: *mut AtomicU64,
}

impl Group {
    pub(super) fn new() -> std::io::Result<Self> {
        // Both ends close on exec: CMD inherits neither.
        let (reader, writer) = std::io::pipe()?;
        // A poke never blocks: one pending byte is as good as many.
        set_nonblocking(writer.as_raw_fd())?;
        // SAFETY: timerfd_create has no memory-safety preconditions; the fd is owned below.
        let timer = unsafe {
            libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
        };
        if timer < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let timer = unsafe { OwnedFd::from_raw_fd(timer) };
        // SAFETY: a fresh anonymous shared mapping of one page, checked below.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<AtomicU64>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let kill_at = page.cast::<AtomicU64>();
        // SAFETY: the mapping is page-aligned, writable and ours alone until the fork.
        unsafe { kill_at.write(AtomicU64::new(NO_DEADLINE)) };
        let (read_fd, write_fd, timer_fd) =
            (reader.as_raw_fd(), writer.as_raw_fd(), timer.as_raw_fd());
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
        // setpgid, close, poll, read, clock_gettime, timerfd_settime, kill, _exit)
        // and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe { watchdog(read_fd, write_fd, timer_fd, kill_at, &previous) }
        }
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: unmaps the page mapped above, which nobody else uses.
            unsafe { libc::munmap(page, std::mem::size_of::<AtomicU64>()) };
            return Err(e);
        }
        // Also here, so that CMD can join the group whichever process runs first.
        // SAFETY: setpgid on our own child.
        unsafe { libc::setpgid(pid, pid) };
        drop((reader, timer));
        Ok(Self {
            leader: pid,
            alive: Some(writer),
            kill_at,
        })
    }

    /// The group's id (the watchdog's pid).
    pub(super) fn id(&self) -> libc::pid_t {
        self.leader
    }

    /// Tells the watchdog to SIGKILL the group at `at` (time since boot, on
    /// `CLOCK_BOOTTIME`) unless told a later time first.
    pub(super) fn kill_at(&self, at: Duration) {
        let nanos = u64::try_from(at.as_nanos()).unwrap_or(NO_DEADLINE - 1);
        // SAFETY: the page lives until drop; atomics are fine in shared memory.
        unsafe { (*self.kill_at).store(nanos, Ordering::Release) };
        if let Some(alive) = &self.alive {
            // SAFETY: writes one byte from a valid buffer; EAGAIN (a byte already
            // pending) and EPIPE (the watchdog is gone, noticed elsewhere) are fine.
            unsafe { libc::write(alive.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
    }

    pub(super) fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names the group.
        unsafe { libc::kill(-self.leader, signal) };
    }

    /// How the watchdog ended, if it has: without reaping it, so that its pid (the
    /// group's id) stays reserved.
    pub(super) fn watchdog_ended(&self) -> Option<String> {
        // Finished: reaped.
        self.alive.as_ref()?;
        // SAFETY: siginfo_t is plain data that waitid fills in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid siginfo pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.leader as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid and si_status are valid for a SIGCHLD siginfo, as waitid writes.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if rc != 0 || pid == 0 {
            return None;
        }
        Some(match info.si_code {
            libc::CLD_EXITED => format!("exited with status {status}"),
            _ => format!("killed by signal {status}"),
        })
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
        // SAFETY: the watchdog is gone and nothing else refers to the page.
        unsafe { libc::munmap(self.kill_at.cast(), std::mem::size_of::<AtomicU64>()) };
    }
}

fn set_nonblocking(fd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Now on `CLOCK_BOOTTIME`, in nanoseconds.
fn boot_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given (async-signal-safe).
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Closes every descriptor but `keep` (two of them), with `close_range` where the
/// kernel has it (Linux 5.9), else one by one up to the descriptor limit.
///
/// # Safety
/// Only in the child of a fork: descriptors owned by Rust objects are closed under them.
unsafe fn close_all_but(keep: [libc::c_int; 2]) {
    let (low, high) = (keep[0].min(keep[1]) as u32, keep[0].max(keep[1]) as u32);
    let ranges = [
        (0, low.checked_sub(1)),
        (low + 1, high.checked_sub(1)),
        (high + 1, Some(u32::MAX)),
    ];
    for (first, last) in ranges {
        let Some(last) = last.filter(|&last| last >= first) else {
            continue;
        };
        // SAFETY: close_range takes plain integers.
        if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) } != 0 {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes into the struct it is given.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
            let end = (limit.rlim_cur.min(1 << 20) as u32).min(last.saturating_add(1));
            for fd in first..end {
                // SAFETY: closing a descriptor number; EBADF is harmless.
                unsafe { libc::close(fd as libc::c_int) };
            }
        }
    }
}

/// The watchdog process: SIGKILLs its process group on EOF on `read_fd` or when the
/// kill time in `kill_at` passes.
///
/// # Safety
/// Only in the child of a fork, with all signals blocked; `kill_at` points to the
/// shared page.
unsafe fn watchdog(
    read_fd: libc::c_int,
    write_fd: libc::c_int,
    timer_fd: libc::c_int,
    kill_at: *const AtomicU64,
    mask: &libc::sigset_t,
) -> ! {
    unsafe {
        // Signals forwarded to the group, or from a terminal (the group may be its
        // foreground group), must not end or stop the watchdog: only SIGKILL (which
        // ends the whole group anyway) and SIGSTOP may.
        for signal in 1..32 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP && signal != libc::SIGCONT {
                libc::signal(signal, libc::SIG_IGN);
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
        libc::setpgid(0, 0);
        libc::close(write_fd);
        // Nothing of this process's: its API connections must close when it drops them.
        close_all_but([read_fd, timer_fd]);
        let mut fds = [
            libc::pollfd {
                fd: read_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: timer_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let mut buf = [0u8; 64];
        loop {
            let at = (*kill_at).load(Ordering::Acquire);
            if at != NO_DEADLINE {
                if boot_nanos() >= at {
                    break;
                }
                let spec = libc::itimerspec {
                    it_interval: libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    },
                    it_value: libc::timespec {
                        tv_sec: (at / 1_000_000_000) as libc::time_t,
                        tv_nsec: (at % 1_000_000_000) as libc::c_long,
                    },
                };
                if libc::timerfd_settime(
                    timer_fd,
                    libc::TFD_TIMER_ABSTIME,
                    &spec,
                    std::ptr::null_mut(),
                ) != 0
                {
                    break;
                }
            }
            if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break;
            }
            if fds[0].revents != 0 {
                let n = libc::read(read_fd, buf.as_mut_ptr().cast(), buf.len());
                if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                    break;
                }
            }
            if fds[1].revents != 0 {
                // Drains the expiry count (non-blocking); the loop checks the time itself.
                libc::read(timer_fd, buf.as_mut_ptr().cast(), 8);
            }
        }
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0)
    }
}
