//! What the fence refuses and how it says so: stale tokens, bad input, a mark
//! another transaction holds; and a call in autocommit.

use std::process::Stdio;
use std::time::{Duration, Instant};

use palisade::fence::Stale;
use palisade::fence::postgres::{self, Error};

use support::cli;
use support::databases::{self, runtime};

use crate::{APP_ROLE, SERVER, TEST_DB, connect, connect_app, mark, setup, url_as, written};

#[test]
fn stale_refusal_names_key_and_both_tokens_and_nothing_commits() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("stale");
        let mut client = setup().await;
        postgres::admit_with(&client, &key, 34).await.unwrap();
        let tx = client.transaction().await.unwrap();
        tx.execute(
            "INSERT INTO public.fenced_writes (key, token, writer) VALUES ($1, 33, 0)",
            &[&key],
        )
        .await
        .unwrap();
        let err = postgres::admit(&tx, &key, 33).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "write rejected: stale fencing token 33 for key {key:?} is lower than the \
                 highest admitted token 34"
            )
        );
        assert!(!err.is_retryable());
        // The transaction is aborted: PostgreSQL answers its COMMIT with ROLLBACK.
        let _ = tx.commit().await;
        let n = written(&client, &key).await;
        assert_eq!(n, 0);
        // Any language sees the SQLSTATE and the message.
        let raw = client
            .query("SELECT palisade.fence($1, 2)", &[&key])
            .await
            .unwrap_err();
        let db = raw.as_db_error().unwrap();
        assert_eq!(db.code().code(), postgres::STALE_SQLSTATE);
        assert!(
            db.message().contains("stale fencing token 2"),
            "{}",
            db.message()
        );
        assert!(db.message().contains("34"), "{}", db.message());
    });
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let client = setup().await;
        let key = databases::unique("bad");
        let long = "k".repeat(postgres::MAX_KEY_BYTES + 1);
        // (SQL, SQLSTATE, words in the message)
        let sql_cases: [(String, &str, &str); 6] = [
            (
                format!("SELECT palisade.fence('{key}', -1)"),
                "22023",
                "negative",
            ),
            (
                format!("SELECT palisade.fence('{key}', NULL)"),
                "22004",
                "token is NULL",
            ),
            (
                "SELECT palisade.fence(NULL, 1)".into(),
                "22004",
                "key is NULL",
            ),
            ("SELECT palisade.fence('', 1)".into(), "22023", "empty"),
            (
                format!("SELECT palisade.fence('{long}', 1)"),
                "22023",
                "1025 bytes",
            ),
            (
                format!("SELECT palisade.fence('{key}', 9223372036854775808::numeric::bigint)"),
                "22003",
                "out of range",
            ),
        ];
        for (sql, code, words) in &sql_cases {
            let err = client.query(sql.as_str(), &[]).await.unwrap_err();
            let db = err.as_db_error().unwrap_or_else(|| panic!("{sql}: {err}"));
            assert_eq!(db.code().code(), *code, "{sql}: {}", db.message());
            assert!(db.message().contains(words), "{sql}: {}", db.message());
        }
        // The same through Rust: refused before the server is asked.
        for (k, token, words) in [
            ("", 1u64, "empty"),
            (long.as_str(), 1, "1025 bytes"),
            (key.as_str(), i64::MAX as u64 + 1, "bigint"),
        ] {
            match postgres::admit_with(&client, k, token).await {
                Err(Error::BadInput(m)) => assert!(m.contains(words), "{m}"),
                other => panic!("{k:.10}/{token}: expected BadInput, got {other:?}"),
            }
        }
        assert_eq!(mark(&client, &key).await, None, "nothing written");
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM palisade.marks WHERE key = '' OR length(key) > 1024",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0);
    });
}

/// Autocommit: the call is its own transaction; the mark is committed at once.
#[test]
fn autocommit_call_commits_the_mark_by_itself() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("autocommit");
        let a = setup().await;
        let b = connect().await;
        a.query_one("SELECT palisade.fence($1, 7)", &[&key])
            .await
            .unwrap();
        // Visible to another session without any COMMIT.
        assert_eq!(mark(&b, &key).await, Some(7));
        assert!(matches!(
            postgres::admit_with(&b, &key, 6).await,
            Err(Error::Stale(Stale { highest: 7, .. }))
        ));
    });
}

/// A holder paused inside its transaction keeps the mark's row lock: `--lock-timeout`
/// bounds the CLI's wait (PostgreSQL's `lock_timeout`) with an error that says so.
#[test]
fn lock_timeout_bounds_the_wait_for_a_mark_another_transaction_holds() {
    let _server = SERVER.read().unwrap();
    let rt = runtime();
    let key = databases::unique("held");
    let holder = rt.block_on(async {
        let admin = setup().await;
        postgres::admit_with(&admin, &key, 10).await.unwrap();
        let holder = connect().await;
        holder
            .batch_execute(&format!("BEGIN; SELECT palisade.fence('{key}', 10)"))
            .await
            .unwrap();
        holder
    });
    let started = Instant::now();
    let mut child = cli::palisade()
        .arg("fence")
        .arg("--store")
        .arg(url_as(APP_ROLE, TEST_DB))
        .args(["--key", &key, "--token", "11", "--lock-timeout", "300ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("palisade fence");
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("palisade fence --lock-timeout 300ms still waits after 20 s for a held mark");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "timed out after 300ms waiting for the mark of key {key:?}: another transaction holds it"
        )),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    rt.block_on(async {
        // The library types the same error (the caller sets lock_timeout).
        let app = connect_app().await;
        app.batch_execute("SET lock_timeout = '200ms'")
            .await
            .unwrap();
        match postgres::admit_with(&app, &key, 11).await {
            Err(e @ Error::LockTimeout { .. }) => {
                assert!(e.to_string().contains(&format!("{key:?}")), "{e}")
            }
            other => panic!("a held mark under lock_timeout: {other:?}"),
        }
        holder.batch_execute("ROLLBACK").await.unwrap();
        let admin = connect().await;
        assert_eq!(mark(&admin, &key).await, Some(10));
    });
}
