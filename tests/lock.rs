//! `palisade lock` and `palisade status` as processes, against the real API server
//! and a real controller: mutual exclusion, the command's environment, losing the
//! lease, timeouts, signals, exit codes.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use palisade::client::{AcquireOptions, Grant, LeaseClient, PodBinding};
use palisade::crd::{Lease, LeaseClaim, LeasePhase};
use support::{
    ControllerProcess, TestNamespace, WAIT, claim_names, palisade_on_cluster, wait_lease,
};
use tokio::process::Command;
use tokio::time::timeout;

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

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

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
    };
    timeout(WAIT, leases.acquire(lease, options))
        .await
        .expect("granted in time")
        .expect("granted")
}

#[tokio::test]
async fn two_lock_processes_never_run_their_commands_at_once() {
    let (ns, _controller) = setup("lock-mutex").await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        r#"echo "start $(date +%s%N) $PALISADE_FENCING_TOKEN $PALISADE_HOLDER" >> {log}; sleep 0.05; echo "end $(date +%s%N) $PALISADE_FENCING_TOKEN $PALISADE_HOLDER" >> {log}"#,
        log = log.display()
    );
    const ROUNDS: usize = 10;
    // Two workers on the same Lease, each running `palisade lock` ROUNDS times in a row.
    let worker = |id: usize| {
        let (ns, script) = (ns.name.clone(), script.clone());
        async move {
            for round in 0..ROUNDS {
                let identity = format!("worker-{id}");
                let out =
                    output(&mut lock(&ns, &["--identity", &identity], "mutex", &script)).await;
                assert!(
                    out.status.success(),
                    "worker {id} round {round}: {}",
                    describe(&out)
                );
            }
        }
    };
    let started = Instant::now();
    tokio::join!(worker(0), worker(1));
    println!("{} lock rounds in {:?}", 2 * ROUNDS, started.elapsed());

    // The log, in the order it was written, must be start/end pairs of one token each,
    // in time order, with tokens increasing from one interval to the next.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(&str, u128, i64, &str)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 4, "malformed line {l:?}");
            (f[0], f[1].parse().unwrap(), f[2].parse().unwrap(), f[3])
        })
        .collect();
    assert_eq!(lines.len(), 4 * ROUNDS, "{text}");
    let mut previous: Option<(u128, i64)> = None;
    let mut handovers = 0;
    for (i, pair) in lines.chunks(2).enumerate() {
        let [(start, t0, token, holder), (end, t1, end_token, end_holder)] = pair else {
            unreachable!()
        };
        assert_eq!(
            (*start, *end),
            ("start", "end"),
            "overlapping commands:\n{text}"
        );
        assert_eq!((token, holder), (end_token, end_holder), "{text}");
        if i > 0 && lines[2 * i - 1].3 != *holder {
            handovers += 1;
        }
        assert!(t0 <= t1, "{text}");
        if let Some((last_end, last_token)) = previous {
            assert!(
                last_end <= *t0,
                "interval began before the previous ended:\n{text}"
            );
            assert!(*token > last_token, "token did not increase:\n{text}");
        }
        previous = Some((*t1, *token));
    }
    // Both were queued at once most of the time (FIFO alternates them), so without the
    // lock their commands would have overlapped.
    println!("{handovers} handovers between the two workers");
    assert!(
        handovers >= ROUNDS / 2,
        "the workers hardly contended:\n{text}"
    );
    assert!(claim_names(&ns).await.is_empty(), "every claim released");
}

#[tokio::test]
async fn the_command_sees_the_grant_in_its_environment_and_its_status_is_passed_through() {
    let (ns, _controller) = setup("lock-env").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // Also admits a write with `palisade fence`, which reads the token and key from the
    // environment, to a store set up beforehand.
    palisade::fence::FileStore::create(dir.path().join("fence")).unwrap();
    let script = format!(
        r#"env | grep ^PALISADE_ | sort > {d}/env.tmp
"$PALISADE_BIN" fence --store {d}/fence --payload hello > {d}/fence.out 2>&1 || echo "fence failed" >> {d}/fence.out
mv {d}/env.tmp {d}/env
i=0; while [ ! -e {d}/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
exit 7"#
    );
    let child = lock(&ns.name, &["--identity", "env-test"], "envlease", &script)
        .env("PALISADE_BIN", env!("CARGO_BIN_EXE_palisade"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    let env = wait_file(&dir.path().join("env")).await;
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} not in the environment:\n{env}"))
            .to_string()
    };
    let lease = ns.api::<Lease>().get("envlease").await.unwrap();
    let status = lease.status.unwrap();
    let holder = status.holder.unwrap();
    assert_eq!(
        var("PALISADE_FENCING_TOKEN"),
        status.fencing_token.unwrap().to_string()
    );
    assert_eq!(var("PALISADE_LEASE"), "envlease");
    assert_eq!(var("PALISADE_HOLDER"), "env-test");
    assert_eq!(holder.identity, "env-test");
    assert_eq!(var("PALISADE_CLAIM"), holder.claim);
    assert_eq!(var("PALISADE_NAMESPACE"), ns.name);
    let fence = std::fs::read_to_string(dir.path().join("fence.out")).unwrap();
    assert!(
        fence.contains(&format!(
            "admitted: fencing token {} for key \"{}/envlease\"",
            var("PALISADE_FENCING_TOKEN"),
            ns.name
        )),
        "{fence}"
    );
    assert_eq!(
        lease.spec.lease_duration_seconds, 15,
        "created with the default duration"
    );

    std::fs::write(dir.path().join("go"), "").unwrap();
    let out = timeout(WAIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(claim_names(&ns).await.is_empty(), "released before exiting");
    wait_lease(&ns, "envlease", "Free", |l| {
        l.status.as_ref().and_then(|s| s.phase) == Some(LeasePhase::Free)
    })
    .await;
}

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

/// The command's process group (its watchdog's pid), written by the command before it execs.
const WRITE_PGID: &str = "cut -d' ' -f5 /proc/$$/stat > {d}/pgid.tmp; mv {d}/pgid.tmp {d}/pgid";

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

#[tokio::test]
async fn a_timeout_while_another_holds_the_lease_exits_76_and_leaves_no_claim() {
    let (ns, _controller) = setup("lock-timeout").await;
    let holder = hold(&ns, "busy", "holder").await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");

    let started = Instant::now();
    let out = output(&mut lock(
        &ns.name,
        &["--timeout", "1s"],
        "busy",
        &format!("touch {}", marker.display()),
    ))
    .await;
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(!marker.exists(), "the command ran without the lease");
    assert_eq!(
        claim_names(&ns).await,
        vec![holder.claim_name().to_string()],
        "the timed-out claim is gone"
    );
    holder.release().await.unwrap();
}

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

#[tokio::test]
async fn bad_input_exits_2_and_help_documents_the_exit_codes() {
    support::install_crds().await;
    let ns = TestNamespace::new("lock-usage").await;
    for (args, expected) in [
        (vec!["--duration", "5x"], "invalid duration \"5x\""),
        (vec!["--duration", "500ms"], "whole seconds"),
        (vec!["--grace", "soon"], "invalid duration \"soon\""),
        (vec!["--timeout", "10"], "missing unit"),
    ] {
        let out = output(&mut lock(&ns.name, &args, "l", "true")).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(expected),
            "{args:?}: {}",
            describe(&out)
        );
    }
    let out = output(palisade_on_cluster().args(["lock", "-n", &ns.name, "l"])).await;
    assert_eq!(out.status.code(), Some(2), "no command: {}", describe(&out));
    // Rejected by the API server: a Lease name must be a DNS label.
    let out = output(&mut lock(&ns.name, &[], "Not_A_Label", "true")).await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(claim_names(&ns).await.is_empty());

    let out = output(palisade_on_cluster().args(["lock", "--help"])).await;
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", describe(&out));
    for needle in [
        "Exit codes",
        "75",
        "76",
        "PALISADE_FENCING_TOKEN",
        "--grace",
    ] {
        assert!(help.contains(needle), "help lacks {needle:?}:\n{help}");
    }

    // As a kubectl plugin the binary is called kubectl-palisade; usage says so.
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-palisade");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_palisade"), &plugin).unwrap();
    let out = output(Command::new(&plugin).args(["lock", "--help"])).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Usage: kubectl-palisade lock"),
        "{}",
        describe(&out)
    );
}

#[tokio::test]
async fn status_shows_holder_token_and_the_queue_in_grant_order() {
    let (ns, _controller) = setup("lock-status").await;
    let holder = hold(&ns, "board", "holder-a").await;
    let leases = LeaseClient::new(ns.client.clone(), &ns.name);
    let waiters: Vec<_> = ["w-1", "w-2"]
        .into_iter()
        .map(|identity| {
            let leases = leases.clone();
            tokio::spawn(async move {
                let options = AcquireOptions {
                    identity: Some(identity.into()),
                    pod: PodBinding::None,
                    timeout: None,
                };
                leases.acquire("board", options).await
            })
        })
        .collect();
    wait_lease(&ns, "board", "two waiters", |l| {
        l.status.as_ref().and_then(|s| s.waiting_count) == Some(2)
    })
    .await;
    let lease = ns.api::<Lease>().get("board").await.unwrap();
    let status = lease.status.unwrap();

    let out = output(palisade_on_cluster().args(["status", "-n", &ns.name])).await;
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "HOLDER", "TOKEN", "PHASE", "WAITING"],
        "{text}"
    );
    let token = holder.token().to_string();
    assert_eq!(
        lines[1],
        ["board", "holder-a", &token, "Held", "2"],
        "{text}"
    );

    let out = output(palisade_on_cluster().args(["status", "-n", &ns.name, "board"])).await;
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let queue: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("POSITION"))
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(queue, status.waiting, "the controller's order:\n{text}");

    let out = output(palisade_on_cluster().args(["status", "-n", &ns.name, "missing"])).await;
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    for waiter in waiters {
        waiter.abort();
    }
    holder.release().await.unwrap();
}

#[tokio::test]
async fn status_and_lock_give_up_within_seconds_on_a_silently_dead_connection() {
    support::install_crds().await;
    let ns = TestNamespace::new("lock-dead").await;
    let (_, proxy) = support::proxied_config(&ns.name).await;
    proxy.set(support::proxy::Mode::Blackhole);
    let mut kubeconfig = support::kubeconfig();
    for cluster in &mut kubeconfig.clusters {
        if let Some(c) = cluster.cluster.as_mut() {
            c.server = Some(proxy.url());
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();

    let started = Instant::now();
    let out = timeout(
        Duration::from_secs(60),
        palisade_on_cluster()
            .env("KUBECONFIG", &path)
            .args(["status", "-n", &ns.name])
            .output(),
    )
    .await
    .expect("palisade status finished")
    .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(took < Duration::from_secs(10), "status took {took:?}");

    let started = Instant::now();
    let out = timeout(
        Duration::from_secs(60),
        palisade_on_cluster()
            .env("KUBECONFIG", &path)
            .args(["lock", "-n", &ns.name, "dead", "--", "true"])
            .output(),
    )
    .await
    .expect("palisade lock finished")
    .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(took < Duration::from_secs(10), "lock took {took:?}");
}

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
