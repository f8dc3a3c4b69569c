//! `palisade lock` under a terminal: job control, the terminal's keys, Ctrl-Z.

use std::path::Path;
use std::time::{Duration, Instant};

use palisade::crd::LeaseClaim;
use support::{WAIT, claim_names};
use tokio::process::Command;
use tokio::time::timeout;

use crate::{
    WRITE_PGID, hold, lock, process_running, process_state, send_signal, setup, wait_file, wait_pid,
};

/// `palisade lock` on a pseudo-terminal of its own, as its session leader with the
/// terminal as its controlling terminal and standard streams (as a login shell
/// would be); the test types on the terminal's master side and reads what is shown.
struct OnTerminal {
    child: tokio::process::Child,
    master: std::fs::File,
    shown: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl OnTerminal {
    fn spawn(mut cmd: Command) -> Self {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty writes two descriptors; no name, termios or window size.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: fresh descriptors, owned from here on.
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        for fd in [master.as_raw_fd(), slave.as_raw_fd()] {
            // SAFETY: fcntl on our own descriptor.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        cmd.stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap());
        // SAFETY: between fork and exec only setsid and ioctl.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        drop(slave);
        let master = std::fs::File::from(master);
        let shown = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (mut reader, sink) = (master.try_clone().unwrap(), shown.clone());
        // Ends with EIO once every process has closed the terminal.
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self {
            child,
            master,
            shown,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }

    /// Types `keys` on the terminal.
    fn type_keys(&mut self, keys: &[u8]) {
        use std::io::Write;
        self.master.write_all(keys).unwrap();
    }

    fn shown(&self) -> String {
        String::from_utf8_lossy(&self.shown.lock().unwrap()).into_owned()
    }

    /// Waits for palisade lock to exit (bounded); returns its exit code and what was shown.
    async fn exit(&mut self, limit: Duration) -> (Option<i32>, String) {
        let status = timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "palisade lock still runs after {limit:?}; shown:\n{}",
                    self.shown()
                )
            })
            .unwrap();
        // What it wrote last may still be on its way through the terminal.
        tokio::time::sleep(Duration::from_millis(100)).await;
        (status.code(), self.shown())
    }
}

/// The process group and the terminal's foreground process group of a process.
fn groups(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // After the state: ppid, pgrp, session, tty_nr, tpgid.
    (fields[2].parse().unwrap(), fields[5].parse().unwrap())
}

#[tokio::test]
async fn under_a_terminal_the_command_gets_the_terminal_and_its_keys() {
    let (ns, _controller) = setup("lock-tty").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        "echo $$ > {d}/pid; read line; echo \"got:$line\" > {d}/line; echo waiting; exec sleep 30"
    );
    let mut term = OnTerminal::spawn(lock(&ns.name, &[], "tty", &script));
    let pid = wait_pid(&dir.path().join("pid")).await;
    let (pgrp, foreground) = groups(pid);
    assert_eq!(
        foreground,
        pgrp,
        "the terminal's foreground group ({foreground}) is not the command's ({pgrp}); \
         palisade lock is {}",
        term.pid()
    );
    term.type_keys(b"hello\n");
    assert_eq!(wait_file(&dir.path().join("line")).await, "got:hello\n");
    // Ctrl-C reaches the command (SIGINT), which dies of it.
    let deadline = Instant::now() + WAIT;
    while !term.shown().contains("waiting") {
        assert!(Instant::now() < deadline, "shown:\n{}", term.shown());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    term.type_keys(b"\x03");
    let (code, shown) = term.exit(Duration::from_secs(5)).await;
    assert_eq!(code, Some(130), "shown:\n{shown}");
    assert!(claim_names(&ns).await.is_empty(), "released before exiting");
}

/// Waits (bounded) until the process is in state `state` ('T': stopped).
async fn wait_state(pid: i32, state: char, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while process_state(pid) != Some(state) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is in state {:?}, not {state:?}",
            process_state(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[tokio::test]
async fn ctrl_z_stops_the_job_and_a_continue_after_the_lease_moved_on_never_runs_the_command() {
    let (ns, _controller) = setup("lock-ctrl-z").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let ticks = dir.path().join("ticks");
    // `(sleep)`: a subshell is forked, where dash runs a plain `sleep` with vfork, and
    // a vfork child stopped before its exec leaves the shell waiting, not stopped.
    let script = format!(
        "{}; echo $$ > {d}/pid; while :; do echo tick >> {d}/ticks; (sleep 0.05); done",
        WRITE_PGID.replace("{d}", &d.to_string())
    );
    let mut term = OnTerminal::spawn(lock(
        &ns.name,
        &["--duration", "3s", "--grace", "500ms"],
        "ctrlz",
        &script,
    ));
    let lock_pid = term.pid();
    let pid = wait_pid(&dir.path().join("pid")).await;
    let group = wait_pid(&dir.path().join("pgid")).await;
    wait_file(&ticks).await;

    // Ctrl-Z: the command stops, and so does palisade lock (the shell's job).
    term.type_keys(b"\x1a");
    wait_state(pid, 'T', "the command after Ctrl-Z").await;
    wait_state(lock_pid, 'T', "palisade lock after Ctrl-Z").await;
    let n = count_lines(&ticks);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count_lines(&ticks), n, "the command ran on while stopped");

    // `fg` within the lease: the command goes on, under the same grant.
    let claim = claim_names(&ns).await;
    send_signal(lock_pid as u32, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(3);
    while count_lines(&ticks) <= n {
        assert!(
            Instant::now() < deadline,
            "the command was not continued; shown:\n{}",
            term.shown()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        claim_names(&ns).await,
        claim,
        "the same claim holds the lease"
    );

    // Stopped again, long enough for the lease to move on.
    term.type_keys(b"\x1a");
    wait_state(pid, 'T', "the command after the second Ctrl-Z").await;
    wait_state(lock_pid, 'T', "palisade lock after the second Ctrl-Z").await;
    let stopped_at = count_lines(&ticks);
    let claims = ns.api::<LeaseClaim>();
    let renewed = claims.get(&claim[0]).await.unwrap().spec.renew_time;
    let next = hold(&ns, "ctrlz", "next").await;
    println!("the lease moved on to token {}", next.token());
    assert_eq!(
        claims.get(&claim[0]).await.unwrap().spec.renew_time,
        renewed,
        "the stopped job's claim was renewed"
    );

    // `fg`, and even a SIGCONT to the command's group: it never runs again.
    send_signal(lock_pid as u32, libc::SIGCONT);
    // SAFETY: kill(2) has no memory-safety preconditions; the group may be gone (ESRCH).
    unsafe { libc::kill(-group, libc::SIGCONT) };
    let (code, shown) = term.exit(Duration::from_secs(5)).await;
    assert_eq!(code, Some(75), "shown:\n{shown}");
    assert!(shown.contains("lost lease ctrlz"), "shown:\n{shown}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count_lines(&ticks),
        stopped_at,
        "the command ran after its lease moved on"
    );
    assert!(!process_running(pid), "the command (pid {pid}) still runs");
    next.release().await.unwrap();
}
