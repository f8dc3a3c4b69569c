//! Losing the lease: the command is stopped in time, by `palisade lock` or by its
//! watchdog.

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use palisade::crd::LeaseClaim;
use support::{WAIT, claim_names};
use tokio::time::timeout;

use crate::{
    WRITE_PGID, describe, lock, output, process_exists, process_running, process_state,
    send_signal, setup, wait_pid,
};

#[tokio::test]
async fn deleting_the_claim_stops_the_command_and_exits_75() {
    let (ns, _controller) = setup("lock-revoked").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let child = lock(&ns.name, &["--grace", "3s"], "revoked", &script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wait_pid(&pidfile).await;
    let claims = claim_names(&ns).await;
    assert_eq!(claims.len(), 1);

    let deleted = Instant::now();
    ns.api::<LeaseClaim>()
        .delete(&claims[0], &DeleteParams::default())
        .await
        .unwrap();
    let out = timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    // SIGTERM did it: well within the 3 s grace before SIGKILL.
    assert!(
        deleted.elapsed() < Duration::from_millis(2500),
        "took {:?}",
        deleted.elapsed()
    );
    assert!(!process_exists(pid), "the command (pid {pid}) still runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost lease revoked"), "{stderr}");
}

#[tokio::test]
async fn a_stopped_lock_process_has_the_command_killed_before_the_lease_can_move_on() {
    let (ns, _controller) = setup("lock-paused").await;
    // SIGSTOP (a debugger, a pause) cannot be caught; SIGTSTP (`kill -TSTP`, Ctrl-Z
    // without a terminal handed over) stops the whole job.
    for (signal, name) in [(libc::SIGSTOP, "stop"), (libc::SIGTSTP, "tstp")] {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The command ignores SIGTERM (inherited across exec): only SIGKILL stops it.
        let script = format!(
            "trap '' TERM; echo $$ > {}; exec sleep 30",
            pidfile.display()
        );
        let child = lock(
            &ns.name,
            &["--duration", "2s", "--grace", "500ms"],
            name,
            &script,
        )
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let lock_pid = child.id().unwrap();
        let pid = wait_pid(&pidfile).await;

        // The controller can hand the lease on a lease duration (2 s) after the last
        // renewal it observed, which was before this signal: the command must be gone
        // by then, although palisade lock, stopped, cannot act.
        send_signal(lock_pid, signal);
        let stopped = Instant::now();
        while process_running(pid) {
            assert!(
                stopped.elapsed() < Duration::from_secs(2),
                "{name}: the command (pid {pid}) still runs 2s after palisade lock was stopped, \
                 when the lease can move on; its state: {:?}",
                process_state(pid)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "{name}: the command was killed {:?} after the stop",
            stopped.elapsed()
        );
        assert_eq!(
            process_state(lock_pid as i32),
            Some('T'),
            "{name}: palisade lock is still stopped"
        );
        send_signal(lock_pid, libc::SIGCONT);
        let out = timeout(WAIT, child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        println!("{}", describe(&out));
        assert_eq!(out.status.code(), Some(75), "{name}: {}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("lost lease"),
            "{name}: {}",
            describe(&out)
        );
    }
    assert!(claim_names(&ns).await.is_empty(), "released before exiting");
}

#[tokio::test]
async fn killing_the_watchdog_alone_ends_the_command_and_lock_exits_1() {
    let (ns, _controller) = setup("lock-watchdog").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        "{}; echo $$ > {d}/pid; exec sleep 60",
        WRITE_PGID.replace("{d}", &d.to_string())
    );
    let child = lock(&ns.name, &[], "watchdog", &script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wait_pid(&dir.path().join("pid")).await;
    let watchdog = wait_pid(&dir.path().join("pgid")).await;
    assert_ne!(watchdog, pid, "the command is not its group's leader");

    send_signal(watchdog as u32, libc::SIGKILL);
    let out = timeout(Duration::from_secs(5), child.wait_with_output())
        .await
        .expect("palisade lock exits within 5s of its watchdog's death")
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("watchdog (pid {watchdog}) killed by signal 9")),
        "{stderr}"
    );
    assert!(!process_running(pid), "the command (pid {pid}) still runs");
    assert!(claim_names(&ns).await.is_empty(), "released before exiting");
}

/// What the process's descriptors are (`socket:[...]`, `pipe:[...]`, paths).
fn descriptors(pid: i32) -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.display().to_string())
        .collect();
    fds.sort();
    fds
}

#[tokio::test]
async fn the_watchdog_holds_no_descriptor_of_the_lock_process() {
    let (ns, _controller) = setup("lock-watchdog-fds").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        "{}; exec sleep 60",
        WRITE_PGID.replace("{d}", &d.to_string())
    );
    let child = lock(&ns.name, &[], "fds", &script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let watchdog = wait_pid(&dir.path().join("pgid")).await;
    let lock_fds = descriptors(child.id().unwrap() as i32);
    assert!(
        lock_fds.iter().any(|fd| fd.starts_with("socket:")),
        "palisade lock has its API connection: {lock_fds:?}"
    );
    // Its wake-up pipe and its deadline timer, nothing else: a connection palisade
    // lock drops must really close (a FIN, not silence).
    let fds = descriptors(watchdog);
    assert!(
        fds.len() == 2
            && fds.iter().any(|fd| fd.starts_with("pipe:"))
            && fds.iter().any(|fd| fd == "anon_inode:[timerfd]"),
        "the watchdog's descriptors: {fds:?}"
    );

    send_signal(child.id().unwrap(), libc::SIGTERM);
    let out = timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", describe(&out));
}

#[tokio::test]
async fn by_default_a_lost_command_is_killed_within_the_safety_margin() {
    let (ns, _controller) = setup("lock-grace").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // Ignores SIGTERM: only the SIGKILL after the default grace stops it.
    let script = format!(
        "trap '' TERM; echo $$ > {}; exec sleep 30",
        pidfile.display()
    );
    let child = lock(&ns.name, &["--duration", "3s"], "margin", &script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wait_pid(&pidfile).await;
    let claims = claim_names(&ns).await;
    let lost = Instant::now();
    ns.api::<LeaseClaim>()
        .delete(&claims[0], &DeleteParams::default())
        .await
        .unwrap();
    let out = timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    // The margin: the controller cannot hand the lease on until a third of the
    // duration after this process gave up at its local deadline.
    let took = lost.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the command was killed {took:?} after the loss; the margin at 3s is 1s"
    );
    assert!(!process_running(pid));
}

#[tokio::test]
async fn a_grace_longer_than_the_safety_margin_is_refused() {
    let (ns, _controller) = setup("lock-grace-refused").await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = output(&mut lock(
        &ns.name,
        &["--duration", "3s", "--grace", "2s"],
        "margin",
        &format!("touch {}", marker.display()),
    ))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--grace 2s") && stderr.contains("3s"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran");
    assert!(claim_names(&ns).await.is_empty(), "no claim left behind");
}
