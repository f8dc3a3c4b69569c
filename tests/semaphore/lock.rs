//! `palisade lock --permits N --slot N` as a process: the semaphore it creates, the
//! slot and fence key in the command's environment, `palisade fence` under it, and
//! the flags' bad values refused before any claim is made.

use std::process::Output;

use palisade::crd::Lease;
use support::{WAIT, claim_names, palisade_on_cluster};
use tokio::process::Command;
use tokio::time::timeout;

use crate::setup;

/// `palisade lock -n NS ARGS... LEASE -- sh -c SCRIPT`, run to completion.
async fn lock(ns: &str, args: &[&str], lease: &str, script: &str) -> Output {
    let mut cmd: Command = palisade_on_cluster();
    cmd.args(["lock", "-n", ns])
        .args(args)
        .args([lease, "--", "sh", "-c", script])
        .env("PALISADE_BIN", env!("CARGO_BIN_EXE_palisade"));
    timeout(WAIT, cmd.output())
        .await
        .expect("palisade finished in time")
        .expect("palisade ran")
}

use support::cli::describe;

#[tokio::test]
async fn lock_creates_a_semaphore_and_its_command_sees_the_slot_it_holds() {
    let (ns, _controller, _leases) = setup("sem-lock-cli").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    palisade::fence::FileStore::create(dir.path().join("fence")).unwrap();
    // The command records its environment, and fences with the default key.
    let script = format!(
        r#"env | grep ^PALISADE_ | sort > {d}/env
"$PALISADE_BIN" fence --store {d}/fence > {d}/fence.out 2>&1 || echo "fence failed" >> {d}/fence.out"#
    );
    let args = ["--permits", "3", "--slot", "1", "--identity", "cli"];
    let out = lock(&ns.name, &args, "cli-pool", &script).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} not in the environment:\n{env}"))
            .to_string()
    };
    assert_eq!(var("PALISADE_SLOT"), "1");
    let key = format!("{}/cli-pool#1", ns.name);
    assert_eq!(var("PALISADE_FENCE_KEY"), key);
    let lease = ns.api::<Lease>().get("cli-pool").await.unwrap();
    assert_eq!(lease.spec.permits, 3, "created as a semaphore");
    // Released on exit: slot 1's row keeps the token it was granted with.
    let status = lease.status.unwrap();
    let row = status
        .slots
        .iter()
        .find(|s| s.slot == 1)
        .expect("slot 1's row");
    let token = row.fencing_token.expect("slot 1's token");
    assert_eq!(var("PALISADE_FENCING_TOKEN"), token.to_string());
    let fence = std::fs::read_to_string(dir.path().join("fence.out")).unwrap();
    assert!(
        fence.contains(&format!(
            "admitted: fencing token {token} for key \"{key}\""
        )),
        "{fence}"
    );

    // An existing Lease keeps its permits; a lock's command is in slot 0.
    let out = lock(
        &ns.name,
        &["--permits", "5"],
        "cli-pool",
        "echo $PALISADE_SLOT",
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let lease = ns.api::<Lease>().get("cli-pool").await.unwrap();
    assert_eq!(lease.spec.permits, 3, "left as it was");
    let out = lock(
        &ns.name,
        &[],
        "cli-lock",
        "echo $PALISADE_SLOT $PALISADE_FENCE_KEY",
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("0 {}/cli-lock", ns.name)
    );
}

#[tokio::test]
async fn lock_refuses_a_slot_or_permits_out_of_range_before_making_a_claim() {
    let (ns, _controller, _leases) = setup("sem-lock-bad").await;
    for (args, flag) in [
        (&["--slot", "64"][..], "--slot"),
        (&["--slot", "-1"][..], "--slot"),
        (&["--slot", "one"][..], "--slot"),
        (&["--permits", "0"][..], "--permits"),
        (&["--permits", "65"][..], "--permits"),
    ] {
        let out = lock(&ns.name, args, "bad-flags", "true").await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    // Parsed fine, but lease `two` has slots 0 and 1 only.
    let out = lock(&ns.name, &["--permits", "2", "--slot", "2"], "two", "true").await;
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--slot 2 is not a slot of lease two"),
        "{stderr}"
    );
    assert!(claim_names(&ns).await.is_empty(), "no claim was made");
}
