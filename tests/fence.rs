//! The file-backed fence from the outside: persistence, corruption, concurrent
//! threads and processes, the `palisade fence` command, and SIGKILL mid-admit.
//! No cluster needed.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use palisade::fence::{Fence, FenceError, FileStore, JournalEntry, Stale};
use support::cli::{fence as fence_cmd, palisade};

fn store_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    (dir, store)
}

fn open(store: &Path) -> Fence<FileStore> {
    Fence::new(FileStore::open_or_create(store).expect("open store"))
}

/// A new store.
fn open_new(store: &Path) -> Fence<FileStore> {
    Fence::new(FileStore::create(store).expect("create store"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_non_decreasing(journal: &[JournalEntry]) {
    for pair in journal.windows(2) {
        assert!(
            pair[0].key != pair[1].key || pair[0].token <= pair[1].token,
            "journal admitted {:?} after {:?}",
            pair[1],
            pair[0]
        );
    }
}

#[test]
fn file_store_keeps_marks_and_journal_across_reopen() {
    let (_tmp, store) = store_dir();
    {
        let fence = open(&store);
        fence.admit_write("a", 5, "first").unwrap();
        fence.admit("b", 9).unwrap();
    }
    let fence = open(&store);
    assert_eq!(fence.highest("a").unwrap(), Some(5));
    assert_eq!(fence.highest("b").unwrap(), Some(9));
    assert!(matches!(
        fence.admit("a", 4),
        Err(FenceError::Stale(Stale { highest: 5, .. }))
    ));
    assert_eq!(
        fence.journal().unwrap(),
        [JournalEntry {
            key: "a".into(),
            token: 5,
            payload: "first".into()
        }]
    );
}

#[test]
fn every_admit_rereads_what_another_handle_wrote() {
    let (_tmp, store) = store_dir();
    let first = open(&store);
    let second = open(&store);
    first.admit("k", 1).unwrap();
    second.admit("k", 10).unwrap();
    // `first` last saw 1; the store says 10.
    assert!(matches!(
        first.admit("k", 5),
        Err(FenceError::Stale(Stale { highest: 10, .. }))
    ));
}

#[test]
fn corrupt_marks_file_is_an_error_naming_it_never_an_empty_store() {
    for garbage in [
        "",
        "not json",
        "{\"highest\": {\"k\": 7",
        "{\"highest\": {\"k\": -1}}",
    ] {
        let (_tmp, store) = store_dir();
        let fence = open(&store);
        fence.admit("k", 7).unwrap();
        let marks = store.join("marks.json");
        fs::write(&marks, garbage).unwrap();

        match fence.admit("k", 1) {
            Err(err @ FenceError::Corrupt { .. }) => {
                let message = err.to_string();
                assert!(message.contains(&marks.display().to_string()), "{message}");
            }
            other => panic!("{garbage:?}: expected Corrupt, got {other:?}"),
        }
        assert!(fence.highest("k").is_err());
        assert_eq!(
            fs::read_to_string(&marks).unwrap(),
            garbage,
            "left as found"
        );

        let output = fence_cmd(&store, &["--key", "k", "--token", "1"]);
        assert_eq!(output.status.code(), Some(1), "{garbage:?}");
        assert!(
            stderr(&output).contains("marks.json"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn missing_marks_file_in_an_existing_store_is_an_error() {
    let (_tmp, store) = store_dir();
    let fence = open(&store);
    fence.admit("k", 7).unwrap();
    fs::remove_file(store.join("marks.json")).unwrap();
    match fence.admit("k", 1) {
        Err(err @ FenceError::Io { .. }) => {
            assert!(err.to_string().contains("marks.json"), "{err}")
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn corrupt_journal_line_is_an_error_naming_file_and_line() {
    let (_tmp, store) = store_dir();
    let fence = open(&store);
    fence.admit_write("k", 1, "ok").unwrap();
    let journal = store.join("journal.jsonl");
    let mut text = fs::read_to_string(&journal).unwrap();
    text.push_str("garbage\n");
    fs::write(&journal, text).unwrap();
    let message = fence.journal().unwrap_err().to_string();
    assert!(message.contains("journal.jsonl"), "{message}");
    assert!(message.contains("line 2"), "{message}");
}

#[test]
fn torn_journal_tail_is_skipped_and_cut_before_the_next_append() {
    let (_tmp, store) = store_dir();
    let fence = open(&store);
    fence.admit_write("k", 1, "one").unwrap();
    let journal = store.join("journal.jsonl");
    let mut bytes = fs::read(&journal).unwrap();
    bytes.extend_from_slice(b"{\"key\":\"k\",\"tok");
    fs::write(&journal, bytes).unwrap();

    assert_eq!(fence.journal().unwrap().len(), 1, "fragment skipped");
    fence.admit_write("k", 2, "two").unwrap();
    let payloads: Vec<_> = fence
        .journal()
        .unwrap()
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(payloads, ["one", "two"]);
}

/// Each thread has its own handle, so only the file lock keeps the
/// read-check-write of one from interleaving with another's.
#[test]
fn threads_with_separate_handles_never_admit_a_lower_token() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    let next = AtomicU64::new(1);
    let deadline = Instant::now() + Duration::from_secs(60);
    let results = Mutex::new(Vec::new());
    thread::scope(|scope| {
        for thread in 0..4u64 {
            let (store, next, results) = (&store, &next, &results);
            scope.spawn(move || {
                let fence = open(store);
                for i in 0..40u64 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let ticket = next.fetch_add(1, Ordering::Relaxed);
                    // Jitter, so that tokens arrive out of order and some are stale.
                    let token = ticket.saturating_sub((ticket * 7 + i + thread) % 4);
                    let outcome = fence.admit_write("k", token, &format!("t{thread}-{i}"));
                    results.lock().unwrap().push((token, outcome));
                }
            });
        }
    });

    let fence = open(&store);
    let journal = fence.journal().unwrap();
    assert_non_decreasing(&journal);
    let results = results.into_inner().unwrap();
    let admitted = results.iter().filter(|(_, r)| r.is_ok()).count();
    assert_eq!(
        journal.len(),
        admitted,
        "every admitted write is journalled once"
    );
    for (token, result) in &results {
        match result {
            Ok(_) => {}
            Err(FenceError::Stale(Stale { highest, .. })) => assert!(token < highest),
            Err(other) => panic!("store failed under contention: {other}"),
        }
    }
    assert_eq!(
        fence.highest("k").unwrap(),
        journal.iter().map(|e| e.token).max()
    );
}

#[test]
fn processes_sharing_a_store_never_admit_a_lower_token() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    let next = AtomicU64::new(1);
    let deadline = Instant::now() + Duration::from_secs(90);
    let results = Mutex::new(Vec::new());
    thread::scope(|scope| {
        for worker in 0..3u64 {
            let (store, next, results) = (&store, &next, &results);
            scope.spawn(move || {
                for i in 0..15u64 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let ticket = next.fetch_add(1, Ordering::Relaxed);
                    let token = ticket.saturating_sub((ticket * 5 + i + worker) % 3);
                    let payload = format!("w{worker}-{i}");
                    let output = fence_cmd(
                        store,
                        &[
                            "--key",
                            "k",
                            "--token",
                            &token.to_string(),
                            "--payload",
                            &payload,
                        ],
                    );
                    results.lock().unwrap().push((token, payload, output));
                }
            });
        }
    });

    let journal = open(&store).journal().unwrap();
    assert_non_decreasing(&journal);
    let journalled: BTreeSet<_> = journal.iter().map(|e| e.payload.clone()).collect();
    for (token, payload, output) in results.into_inner().unwrap() {
        match output.status.code() {
            Some(0) => assert!(
                journalled.contains(&payload),
                "{payload} admitted, not journalled"
            ),
            Some(3) => {
                assert!(
                    !journalled.contains(&payload),
                    "{payload} rejected, yet journalled"
                );
                let message = stderr(&output);
                assert!(
                    message.contains(&format!("stale fencing token {token} ")),
                    "{message}"
                );
            }
            other => panic!("exit {other:?}: {}", stderr(&output)),
        }
    }
}

/// SIGKILL lands at random points of many `palisade fence` processes, each
/// admitting the next token. Whatever was torn, the store must still parse, keep
/// every token a process reported as admitted, and refuse anything lower.
#[test]
fn sigkill_mid_admit_leaves_a_store_that_still_refuses_stale_tokens() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    let admit = |token: u64| {
        let mut command = palisade();
        command
            .arg("fence")
            .arg("--store")
            .arg(&store)
            .args(["--key", "k", "--token", &token.to_string()])
            .args(["--payload", &format!("write-{token}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };

    // How long one admit takes here, so that kill delays spread across its run.
    let started = Instant::now();
    for token in 1..=3 {
        let output = admit(token).output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
    }
    let typical = started.elapsed() / 3;

    let mut reported = vec![1, 2, 3];
    let (mut killed, mut last_token) = (0, 3);
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..300u32 {
        if Instant::now() > deadline {
            break;
        }
        last_token += 1;
        let mut child = admit(last_token).spawn().unwrap();
        // 0% to 120% of a typical run, stepping through that range in a fixed order.
        thread::sleep(typical * ((i * 37) % 121) / 100);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
        }
        let output = child.wait_with_output().unwrap();
        if output.status.signal() == Some(9) {
            killed += 1;
        } else {
            // Tokens only rise, so a process that ran to the end must have been
            // admitted: a stale or failed exit means a kill left damage behind.
            let status = output.status;
            assert!(
                status.success(),
                "token {last_token}: {status}: {}",
                stderr(&output)
            );
            reported.push(last_token);
        }
    }
    eprintln!("{killed} admits killed, {} finished", reported.len());
    let highest_reported = *reported.last().unwrap();
    assert!(
        killed > 0,
        "no process was killed mid-run; the test proved nothing"
    );
    assert!(
        reported.len() > 3,
        "no process finished; the test proved nothing"
    );

    let fence = open(&store);
    let mark = fence.highest("k").expect("marks file parses after SIGKILL");
    let mark = mark.expect("a mark for k");
    assert!(
        (highest_reported..=last_token).contains(&mark),
        "mark {mark}"
    );
    assert!(matches!(
        fence.admit("k", highest_reported - 1),
        Err(FenceError::Stale(Stale { .. }))
    ));

    let journal = fence.journal().expect("journal parses after SIGKILL");
    assert_non_decreasing(&journal);
    let journalled: BTreeSet<_> = journal.iter().map(|e| e.token).collect();
    for token in &reported {
        assert!(
            journalled.contains(token),
            "acknowledged token {token} not journalled"
        );
    }

    // No lock was left held by a dead process: the store still takes new writes.
    let output = fence_cmd(
        &store,
        &["--key", "k", "--token", &(last_token + 1).to_string()],
    );
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn cli_admits_and_exits_0_with_one_line() {
    let (_tmp, store) = store_dir();
    assert!(fence_cmd(&store, &["--create"]).status.success());
    let output = fence_cmd(
        &store,
        &["--key", "x", "--token", "34", "--payload", "hello"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        stdout,
        "admitted: fencing token 34 for key \"x\" (first token for this key)\n"
    );
    let output = fence_cmd(&store, &["--key", "x", "--token", "34"]);
    assert!(String::from_utf8_lossy(&output.stdout).contains("same as the highest"));
    assert_eq!(open(&store).journal().unwrap()[0].payload, "hello");
}

#[test]
fn cli_rejects_a_stale_token_with_exit_3_and_both_tokens() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    assert!(
        fence_cmd(&store, &["--key", "x", "--token", "34"])
            .status
            .success()
    );
    let output = fence_cmd(
        &store,
        &["--key", "x", "--token", "33", "--payload", "late"],
    );
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(
        stderr(&output).trim_end(),
        "write rejected: stale fencing token 33 for key \"x\" is lower than \
         the highest admitted token 34"
    );
    assert!(output.stdout.is_empty());
    assert!(
        open(&store).journal().unwrap().is_empty(),
        "nothing recorded"
    );
}

#[test]
fn cli_refuses_malformed_tokens_with_exit_2_naming_the_flag() {
    let (_tmp, store) = store_dir();
    for bad in [
        "abc",
        "-1",
        "+5",
        " 5",
        "5 ",
        "",
        "18446744073709551616",
        "1.5",
    ] {
        let output = fence_cmd(&store, &["--token", bad]);
        assert_eq!(output.status.code(), Some(2), "{bad:?}");
        assert!(
            stderr(&output).contains("--token"),
            "{bad:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("fencing token"),
            "{bad:?}: {}",
            stderr(&output)
        );
    }
    let output = palisade()
        .args(["fence", "--store"])
        .arg(&store)
        .env("PALISADE_FENCING_TOKEN", "12x")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("\"12x\""), "{}", stderr(&output));
    assert!(
        !store.join("marks.json").exists(),
        "bad input changes nothing"
    );
}

#[test]
fn cli_requires_a_token() {
    let (_tmp, store) = store_dir();
    let output = fence_cmd(&store, &["--key", "x"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("--token"), "{}", stderr(&output));
}

#[test]
fn cli_takes_token_and_key_from_the_lock_environment() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    let run = |token: &str| {
        palisade()
            .args(["fence", "--store"])
            .arg(&store)
            .env("PALISADE_FENCING_TOKEN", token)
            .env("PALISADE_LEASE", "billing-cron")
            .output()
            .unwrap()
    };
    assert_eq!(run("1839202").status.code(), Some(0));
    assert_eq!(run("1839201").status.code(), Some(3));
    // With the lease alone, the key is the lease name.
    assert_eq!(open(&store).highest("billing-cron").unwrap(), Some(1839202));

    // With the namespace too (as `palisade lock` sets both), `<namespace>/<lease>`.
    let output = palisade()
        .args(["fence", "--store"])
        .arg(&store)
        .env("PALISADE_FENCING_TOKEN", "12")
        .env("PALISADE_NAMESPACE", "payments")
        .env("PALISADE_LEASE", "invoices")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("for key \"payments/invoices\""),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(open(&store).highest("payments/invoices").unwrap(), Some(12));
    assert_eq!(open(&store).highest("invoices").unwrap(), None);

    // The flag wins over the environment; the key falls back to "default".
    let output = fence_cmd(&store, &["--token", "5"]);
    assert!(output.status.success());
    assert_eq!(open(&store).highest("default").unwrap(), Some(5));
}

/// A store fenced under bare lease names (older palisade) is never started over by
/// the namespaced default key: the CLI refuses naming both keys until `--key` is
/// passed or the mark is migrated.
#[test]
fn cli_default_key_never_starts_a_bare_lease_mark_over() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    open(&store).admit("invoices", 40).unwrap();
    let run = |token: &str, extra: &[&str]| {
        palisade()
            .args(["fence", "--store"])
            .arg(&store)
            .args(extra)
            .env("PALISADE_FENCING_TOKEN", token)
            .env("PALISADE_NAMESPACE", "payments")
            .env("PALISADE_LEASE", "invoices")
            .output()
            .unwrap()
    };
    let output = run("41", &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("\"payments/invoices\"")
            && err.contains("\"invoices\"")
            && err.contains("--key"),
        "{err}"
    );
    assert_eq!(open(&store).highest("payments/invoices").unwrap(), None);
    assert_eq!(open(&store).highest("invoices").unwrap(), Some(40));

    let output = run("41", &["--key", "invoices"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(open(&store).highest("invoices").unwrap(), Some(41));

    // Migrated: the namespaced key has a mark, and the default is used as it is.
    open(&store).admit("payments/invoices", 41).unwrap();
    let output = run("42", &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(open(&store).highest("payments/invoices").unwrap(), Some(42));
}

/// Setting a store up and fencing are separate steps: `--create` takes no token
/// (nor one from the environment), so a writer can never recreate a deleted store
/// and have its token admitted as the first.
#[test]
fn cli_create_takes_no_token_so_a_deleted_store_is_never_recreated_by_a_write() {
    let (_tmp, store) = store_dir();
    assert!(fence_cmd(&store, &["--create"]).status.success());
    assert!(
        fence_cmd(&store, &["--key", "k", "--token", "7"])
            .status
            .success()
    );
    fs::remove_dir_all(&store).unwrap();

    let output = fence_cmd(&store, &["--create", "--key", "k", "--token", "1"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--create") && stderr(&output).contains("--token"),
        "{}",
        stderr(&output)
    );
    assert!(!store.exists(), "--create --token recreated the store");

    let output = palisade()
        .args(["fence", "--create", "--store"])
        .arg(&store)
        .env("PALISADE_FENCING_TOKEN", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        !store.exists(),
        "--create with a token in the environment recreated the store"
    );

    let output = fence_cmd(&store, &["--key", "k", "--token", "1"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(!store.exists());
}

#[test]
fn cli_show_prints_marks_as_json() {
    let (_tmp, store) = store_dir();
    FileStore::create(&store).unwrap();
    assert!(
        fence_cmd(&store, &["--key", "a", "--token", "3"])
            .status
            .success()
    );
    assert!(
        fence_cmd(&store, &["--key", "b", "--token", "8"])
            .status
            .success()
    );
    // A token in the environment (as under `palisade lock`) does not get in the way.
    let output = palisade()
        .args(["fence", "--show", "--store"])
        .arg(&store)
        .env("PALISADE_FENCING_TOKEN", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let marks: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(marks, serde_json::json!({"a": 3, "b": 8}));
}

#[test]
fn cli_store_errors_exit_1_and_show_creates_nothing() {
    let (tmp, _) = store_dir();
    let missing = tmp.path().join("no-such-parent").join("store");
    let output = fence_cmd(&missing, &["--token", "1"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no-such-parent"),
        "{}",
        stderr(&output)
    );

    let never_made = tmp.path().join("typo");
    let output = fence_cmd(&never_made, &["--show"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(!never_made.exists());
}

#[test]
fn opening_a_missing_store_is_an_error_naming_it_and_creates_nothing() {
    let (_tmp, store) = store_dir();
    let err = FileStore::open(&store).expect_err("a missing store must not be created by open");
    assert!(
        err.to_string().contains(&store.display().to_string()),
        "{err}"
    );
    assert!(!store.exists(), "open created {}", store.display());

    let output = fence_cmd(&store, &["--key", "k", "--token", "5"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("--create"), "{}", stderr(&output));
    assert!(
        !store.exists(),
        "palisade fence created {}",
        store.display()
    );
}

#[test]
fn a_journal_without_its_marks_file_is_damage_never_a_new_store() {
    let (_tmp, store) = store_dir();
    open_new(&store).admit_write("k", 7, "first").unwrap();
    fs::remove_file(store.join("marks.json")).unwrap();
    let err = FileStore::open(&store).expect_err("open started over at zero");
    assert!(err.to_string().contains("marks.json"), "{err}");
    assert!(
        !store.join("marks.json").exists(),
        "open wrote a new marks file"
    );

    let output = fence_cmd(&store, &["--create"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        !store.join("marks.json").exists(),
        "--create started over at zero"
    );
}

#[test]
fn a_writer_that_holds_the_store_lock_makes_others_fail_in_bounded_time() {
    let (_tmp, store) = store_dir();
    open_new(&store).admit("k", 1).unwrap();
    // Another writer paused inside admit: it holds the store's lock.
    let held = fs::File::options()
        .write(true)
        .open(store.join("lock"))
        .unwrap();
    held.lock().unwrap();

    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let path = store.clone();
    thread::spawn(move || {
        let started = Instant::now();
        let result = FileStore::open(&path)
            .map(Fence::new)
            .and_then(|f| f.admit("k", 2));
        let _ = done_tx.send((result, started.elapsed()));
    });
    let (result, took) = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("admit returned while another writer holds the lock");
    let err = result.expect_err("admitted while another writer holds the lock");
    assert!(
        err.to_string().contains(&store.display().to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("locked"), "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");

    let started = Instant::now();
    let output = fence_cmd(
        &store,
        &["--key", "k", "--token", "3", "--lock-timeout", "200ms"],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("locked"), "{}", stderr(&output));
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(held);
    assert_eq!(open(&store).highest("k").unwrap(), Some(1));
}

#[test]
fn cli_create_makes_a_store_once_and_then_opens_it() {
    let (_tmp, store) = store_dir();
    let output = fence_cmd(&store, &["--create"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(store.join("marks.json").exists() && store.join("journal.jsonl").exists());
    assert!(
        fence_cmd(&store, &["--key", "k", "--token", "9"])
            .status
            .success()
    );
    // Again: the store exists, and keeps its marks.
    assert!(fence_cmd(&store, &["--create"]).status.success());
    assert_eq!(open(&store).highest("k").unwrap(), Some(9));
    // An empty directory is made a store too; a directory with other files is not.
    let (_tmp2, empty) = store_dir();
    fs::create_dir(&empty).unwrap();
    assert!(fence_cmd(&empty, &["--create"]).status.success());
    assert!(matches!(
        FileStore::create(&store),
        Err(FenceError::AlreadyExists { .. })
    ));
}
