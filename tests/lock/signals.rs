//! Signals to `palisade lock`: forwarded, and nothing of the command outlives it.

use std::time::{Duration, Instant};

use support::{WAIT, claim_names, wait_lease};
use tokio::time::timeout;

use crate::{
    describe, hold, lock, output, process_running, send_signal, setup, wait_file, wait_pid,
};

#[tokio::test]
async fn sigterm_to_the_lock_process_is_forwarded_and_the_lease_released() {
    let (ns, _controller) = setup("lock-sigterm").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // The pid file is written once `sleep` runs, so the forwarded SIGTERM reaches it too
    // (a sleep forked after the signal would keep the stderr pipe open for 30 s).
    let script = format!(
        r#"trap 'echo got-term > {d}/trapped; exit 3' TERM; sleep 30 & echo $$ > {d}/pid; wait"#
    );
    let child = lock(&ns.name, &[], "terminated", &script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_file(&dir.path().join("pid")).await;
    assert_eq!(claim_names(&ns).await.len(), 1);

    send_signal(child.id().unwrap(), libc::SIGTERM);
    let out = timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "CMD's status: {}",
        describe(&out)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("trapped")).unwrap(),
        "got-term\n"
    );
    assert!(claim_names(&ns).await.is_empty(), "released before exiting");
}

#[tokio::test]
async fn sigkill_of_the_lock_process_kills_the_command() {
    let (ns, _controller) = setup("lock-sigkill").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // `exec`: the command palisade lock started is the sleep itself.
    let script = format!("echo $$ > {d}/pid; exec sleep 300");
    let mut child = lock(&ns.name, &[], "killed", &script).spawn().unwrap();
    let pid = wait_pid(&dir.path().join("pid")).await;
    assert!(
        process_running(pid),
        "the command runs while the lease is held"
    );

    send_signal(child.id().unwrap(), libc::SIGKILL);
    child.wait().await.unwrap();
    wait_gone(pid, "the command", WAIT).await;
}

/// Waits until the process is gone, for at most `limit`; panics naming `what` otherwise.
async fn wait_gone(pid: i32, what: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while process_running(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) outlived palisade lock by {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigkill_of_the_lock_process_kills_the_commands_grandchildren() {
    let (ns, _controller) = setup("lock-tree").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // The shell is the command; `sleep` is its child, a grandchild of palisade lock.
    let script = format!("sleep 1000 & echo $! > {d}/pid.tmp; mv {d}/pid.tmp {d}/pid; wait");
    let mut child = lock(&ns.name, &[], "tree", &script).spawn().unwrap();
    let grandchild = wait_pid(&dir.path().join("pid")).await;
    assert!(process_running(grandchild));

    send_signal(child.id().unwrap(), libc::SIGKILL);
    child.wait().await.unwrap();
    wait_gone(grandchild, "the command's child", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn nothing_the_command_left_behind_outlives_palisade_lock() {
    let (ns, _controller) = setup("lock-leftover").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // The command exits at once and leaves a background child running with the token.
    let script =
        format!("sleep 1000 >/dev/null 2>&1 & echo $! > {d}/pid.tmp; mv {d}/pid.tmp {d}/pid");
    let out = output(&mut lock(&ns.name, &[], "leftover", &script)).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let leftover = wait_pid(&dir.path().join("pid")).await;
    wait_gone(
        leftover,
        "the command's background child",
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test]
async fn a_signal_while_waiting_deletes_the_claim() {
    let (ns, _controller) = setup("lock-sigint").await;
    let holder = hold(&ns, "busy", "holder").await;
    let child = lock(&ns.name, &[], "busy", "true")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_lease(&ns, "busy", "a waiter", |l| {
        l.status.as_ref().and_then(|s| s.waiting_count) == Some(1)
    })
    .await;
    send_signal(child.id().unwrap(), libc::SIGINT);
    let out = timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert_eq!(
        claim_names(&ns).await,
        vec![holder.claim_name().to_string()]
    );
    holder.release().await.unwrap();
}
