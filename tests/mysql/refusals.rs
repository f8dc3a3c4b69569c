//! Stale, equal and bad tokens and keys; the least-privilege writer; a held row lock.

use mysql_async::IsolationLevel;
use mysql_async::prelude::Queryable;
use palisade::fence::Stale;
use palisade::fence::mysql::{self, Error, MAX_KEY_BYTES};

use support::databases::{self, runtime};

use crate::{SERVER, TEST_DB, begin, connect, connect_app, mark, server_code, setup, written};

/// A stale token is `Error::Stale` naming key, token and highest; the transaction is
/// rolled back (its write before the call never commits) and a write after the
/// ignored error fails instead of committing. An equal token is admitted.
#[test]
fn a_stale_token_commits_nothing_and_an_equal_one_is_admitted() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("stale");
        let _ = setup().await;
        let mut app = connect_app().await;
        let insert =
            format!("INSERT INTO {TEST_DB}.fenced_writes (k, token, writer) VALUES (?, ?, 0)");
        let first = mysql::admit_with(&mut app, &key, 34).await.unwrap();
        assert_eq!(first.previous, None);

        let mut tx = begin(&mut app, IsolationLevel::RepeatableRead).await;
        tx.exec_drop(&insert, (&key, 33)).await.unwrap();
        let err = mysql::admit(&mut tx, &key, 33).await.unwrap_err();
        assert!(!err.is_retryable());
        let Error::Stale(stale) = err else {
            panic!("expected Stale, got {err:?}")
        };
        assert_eq!(
            stale,
            Stale {
                key: key.clone(),
                token: 33,
                highest: 34
            }
        );
        // The program ignores the error and goes on: the write fails (READ ONLY).
        let code = server_code(
            tx.exec_drop(&insert, (&key, 33)).await,
            "a write after PF001",
        );
        assert_eq!(code, 1792, "ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION");
        tx.commit().await.unwrap();
        assert_eq!(written(&mut app, &key).await, 0, "a stale write committed");

        let mut tx = begin(&mut app, IsolationLevel::RepeatableRead).await;
        let equal = mysql::admit(&mut tx, &key, 34).await.unwrap();
        assert_eq!(equal.previous, Some(34));
        tx.exec_drop(&insert, (&key, 34)).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(written(&mut app, &key).await, 1);
        assert_eq!(mark(&mut connect().await, &key).await, Some(34));
    });
}

/// The function's own checks (for callers other than this crate), and keys compared
/// byte for byte: case, trailing spaces and accents make different keys.
#[test]
fn bad_keys_and_tokens_are_refused_and_keys_are_exact() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let _ = setup().await;
        let mut app = connect_app().await;
        for (key, token) in [("", 1), ("k", u64::MAX)] {
            let err = mysql::admit_with(&mut app, key, token).await.unwrap_err();
            assert!(
                matches!(err, Error::BadInput(_)),
                "{key:?} {token}: {err:?}"
            );
        }
        let long = "é".repeat(MAX_KEY_BYTES / 2) + "x";
        let err = mysql::admit_with(&mut app, &long, 1).await.unwrap_err();
        assert!(
            matches!(&err, Error::BadInput(m) if m.contains("1025 bytes")),
            "{err:?}"
        );
        for (sql, reason) in [
            ("SELECT palisade.fence(NULL, 1)", "is NULL"),
            ("SELECT palisade.fence('k', NULL)", "is NULL"),
            ("SELECT palisade.fence('k', -1)", "negative"),
            ("SELECT palisade.fence('', 1)", "empty"),
            ("SELECT palisade.fence(REPEAT('x', 1025), 1)", "1025 bytes"),
        ] {
            let err = app.query_drop(sql).await.unwrap_err();
            let mysql_async::Error::Server(e) = &err else {
                panic!("{sql}: {err:?}")
            };
            assert!(
                matches!(e.state.as_str(), "22004" | "22023"),
                "{sql}: {e:?}"
            );
            assert!(e.message.contains(reason), "{sql}: {e:?}");
        }

        let base = databases::unique("Exact");
        let longest = format!("{base}{}", "k".repeat(MAX_KEY_BYTES - base.len()));
        let keys = [
            base.clone(),
            base.to_lowercase(),
            format!("{base} "),
            format!("{base}é"),
            longest,
        ];
        for (i, key) in keys.iter().enumerate() {
            let admitted = mysql::admit_with(&mut app, key, 10 + i as u64)
                .await
                .unwrap();
            assert_eq!(admitted.previous, None, "{key:?} shared a mark");
        }
        // A stale token on a 1024-byte key: the message is cut, the highest is not.
        let err = mysql::admit_with(&mut app, &keys[4], 1).await.unwrap_err();
        assert!(
            matches!(&err, Error::Stale(s) if s.highest == 14 && s.key == keys[4]),
            "{err:?}"
        );
    });
}

/// The writer's grants are EXECUTE on the function: it fences, and cannot lower,
/// delete, forge or read a mark, or replace the function.
#[test]
fn the_writer_can_fence_but_cannot_touch_the_marks() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("writer");
        let _ = setup().await;
        let mut app = connect_app().await;
        mysql::admit_with(&mut app, &key, 50).await.unwrap();
        for sql in [
            format!("UPDATE palisade.marks SET token = 1 WHERE `key` = '{key}'"),
            format!("DELETE FROM palisade.marks WHERE `key` = '{key}'"),
            format!("INSERT INTO palisade.marks VALUES ('{key}-forged', 1)"),
            "SELECT * FROM palisade.marks".to_owned(),
        ] {
            let code = server_code(app.query_drop(&sql).await, &sql);
            assert_eq!(code, 1142, "{sql}: ER_TABLEACCESS_DENIED_ERROR");
        }
        let replace = "CREATE OR REPLACE FUNCTION palisade.fence(k TEXT, t BIGINT) RETURNS BIGINT RETURN NULL";
        let code = server_code(app.query_drop(replace).await, "replacing the function");
        assert!(matches!(code, 1044 | 1370), "{code}: access denied expected");
        assert_eq!(mark(&mut connect().await, &key).await, Some(50));
    });
}

/// A transaction that fenced a key and has not ended holds its mark: the next fencer
/// waits at most innodb_lock_wait_timeout, gets `LockTimeout`, and no decision.
#[test]
fn a_held_mark_times_out_the_next_fencer() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("held");
        let mut holder = setup().await;
        let mut waiter = connect_app().await;
        mysql::admit_with(&mut holder, &key, 5).await.unwrap();
        let mut held = begin(&mut holder, IsolationLevel::RepeatableRead).await;
        mysql::admit(&mut held, &key, 6).await.unwrap();
        waiter
            .query_drop("SET SESSION innodb_lock_wait_timeout = 1")
            .await
            .unwrap();
        let mut tx = begin(&mut waiter, IsolationLevel::RepeatableRead).await;
        let err = mysql::admit(&mut tx, &key, 7).await.unwrap_err();
        assert!(
            matches!(&err, Error::LockTimeout { key: k, .. } if *k == key),
            "{err:?}"
        );
        tx.rollback().await.unwrap();
        held.commit().await.unwrap();
        assert_eq!(mark(&mut connect().await, &key).await, Some(6));
    });
}
