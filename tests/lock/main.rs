//! `palisade lock` and `palisade status` as processes, against the real API server
//! and a real controller: mutual exclusion, the command's environment, losing the
//! lease, timeouts, signals, exit codes.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};
use support::{ControllerProcess, TestNamespace, WAIT, palisade_on_cluster};
use tokio::process::Command;
use tokio::time::timeout;

mod holding;
mod losing;
mod signals;
mod status;
mod terminal;

async fn setup(prefix: &str) -> (TestNamespace, ControllerProcess) {
    support::install_crds().await;
    let ns = TestNamespace::new(prefix).await;
    let controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;
    (ns, controller)
}

/// `palisade lock -n NS ARGS... LEASE -- sh -c SCRIPT`
fn lock(ns: &str, args: &[&str], lease: &str, script: &str) -> Command {
    let mut cmd = palisade_on_cluster();
    cmd.args(["lock", "-n", ns])
        .args(args)
        .args([lease, "--", "sh", "-c", script]);
    cmd
}

async fn output(cmd: &mut Command) -> Output {
    timeout(WAIT, cmd.output())
        .await
        .expect("palisade finished in time")
        .expect("palisade ran")
}

use support::cli::describe;

/// Waits (bounded) until a file the command writes is there and not empty.
async fn wait_file(path: &Path) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} not written within {WAIT:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until the command has written a pid to `path`, and returns it.
async fn wait_pid(path: &Path) -> i32 {
    wait_file(path).await.trim().parse().unwrap()
}

fn process_exists(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Running, as opposed to gone or a zombie waiting to be reaped by whoever inherited it.
fn process_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(") ")?.1.starts_with(['Z', 'X'])))
        .is_some_and(|dead| !dead)
}

/// The state letter of /proc/PID/stat (R, S, T, Z...), None when gone.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

fn send_signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill {pid}");
}

/// Holds `lease` from the test process itself (library client, not bound to a pod).
async fn hold(ns: &TestNamespace, lease: &str, identity: &str) -> Grant {
    let leases = LeaseClient::new(ns.client.clone(), &ns.name);
    leases.ensure_lease(lease, 600).await.unwrap();
    let options = AcquireOptions {
        identity: Some(identity.into()),
        pod: PodBinding::None,
        timeout: None,
        slot: None,
    };
    timeout(WAIT, leases.acquire(lease, options))
        .await
        .expect("granted in time")
        .expect("granted")
}

/// The command's process group (its watchdog's pid), written by the command before it execs.
const WRITE_PGID: &str = "cut -d' ' -f5 /proc/$$/stat > {d}/pgid.tmp; mv {d}/pgid.tmp {d}/pgid";
