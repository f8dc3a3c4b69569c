//! Holding: mutual exclusion, the command's environment and exit status, a
//! timeout while another holds, bad input.

use std::time::{Duration, Instant};

use palisade::crd::{Lease, LeasePhase};
use support::{TestNamespace, WAIT, claim_names, palisade_on_cluster, wait_lease};
use tokio::process::Command;
use tokio::time::timeout;

use crate::{describe, hold, lock, output, setup, wait_file};

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
    // A lock is slot 0, under the key fences have always used.
    assert_eq!(var("PALISADE_SLOT"), "0");
    assert_eq!(var("PALISADE_FENCE_KEY"), format!("{}/envlease", ns.name));
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
        "PALISADE_SLOT",
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
