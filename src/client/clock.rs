//! The client's deadline clock: `CLOCK_BOOTTIME`, which keeps counting while the
//! machine is suspended. `CLOCK_MONOTONIC` (tokio's and `std::time::Instant`'s
//! clock) stops during a suspension, so a deadline measured on it would pass that
//! much later than the controller's expiry, which kept counting on another machine.
//!
//! tokio has no timer on this clock, so [`BootTimer`] is a Linux `timerfd` on
//! `CLOCK_BOOTTIME`, armed at an absolute time and awaited through tokio's reactor:
//! after a resume it fires at once if its time passed meanwhile.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

/// A point in time on `CLOCK_BOOTTIME`: time since boot, suspensions included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec it is given.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(
            rc, 0,
            "CLOCK_BOOTTIME is available on every supported Linux"
        );
        BootInstant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// The time since boot this instant is.
    pub fn since_boot(self) -> Duration {
        self.0
    }

    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::ops::Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

/// A re-armable one-shot timer on `CLOCK_BOOTTIME`.
pub struct BootTimer {
    fd: AsyncFd<OwnedFd>,
}

impl BootTimer {
    pub fn new() -> io::Result<Self> {
        // SAFETY: timerfd_create has no memory-safety preconditions; the fd is owned below.
        let fd = unsafe {
            libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd stays open, and is the same descriptor, until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// Fires at `at` (or at once, if that has passed); replaces any earlier arming.
    pub fn arm(&self, at: BootInstant) -> io::Result<()> {
        // A zero it_value would disarm the timer: the earliest time is 1 ns after boot.
        let at = at.0.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: at.as_secs() as libc::time_t,
                tv_nsec: at.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: valid fd and itimerspec; the old value is not asked for.
        let rc = unsafe {
            libc::timerfd_settime(
                self.fd.get_ref().as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Completes when the armed time has come.
    pub async fn fired(&self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let read = guard.try_io(|fd| {
                let mut expirations = 0u64;
                // SAFETY: reads 8 bytes into a u64, as timerfd requires.
                let n = unsafe {
                    libc::read(
                        fd.get_ref().as_raw_fd(),
                        (&raw mut expirations).cast(),
                        std::mem::size_of::<u64>(),
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(result) => return result,
                // Not yet (or re-armed since it was readable): wait again.
                Err(_would_block) => continue,
            }
        }
    }

    /// The clock this timer runs on, as the kernel reports it (`/proc/self/fdinfo`).
    #[cfg(test)]
    fn clock_id(&self) -> io::Result<i32> {
        let info = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            self.fd.get_ref().as_raw_fd()
        ))?;
        info.lines()
            .find_map(|l| l.strip_prefix("clockid:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| io::Error::other("no clockid in fdinfo"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_instant_is_clock_boottime_and_never_behind_monotonic() {
        let mut mono = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: as in BootInstant::now.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut mono) };
        let boot = BootInstant::now();
        // BOOTTIME = MONOTONIC + time suspended, so never less.
        assert!(boot.0 >= Duration::new(mono.tv_sec as u64, mono.tv_nsec as u32));
    }

    #[tokio::test]
    async fn the_timer_runs_on_clock_boottime_and_fires_at_its_time() {
        let timer = BootTimer::new().unwrap();
        assert_eq!(timer.clock_id().unwrap(), libc::CLOCK_BOOTTIME);
        let start = BootInstant::now();
        timer.arm(start + Duration::from_millis(50)).unwrap();
        timer.fired().await.unwrap();
        let waited = BootInstant::now().saturating_duration_since(start);
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        // Re-armed in the past: fires at once.
        timer.arm(start).unwrap();
        tokio::time::timeout(Duration::from_secs(1), timer.fired())
            .await
            .expect("a past time fires at once")
            .unwrap();
    }
}
