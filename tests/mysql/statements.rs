//! An error ends the statement, not the transaction: the fence inside the write's own
//! statement against a separate `SELECT palisade.fence(?, ?)` whose error the program
//! ignores before it commits (what a JDBC program with a swallowed SQLException does).

use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use palisade::fence::mysql;

use support::databases::{self, runtime};

use crate::{SERVER, TEST_DB, connect_app, setup, written};

/// Runs `statements` (SQL, parameters) in one transaction, ignoring errors as a
/// careless program does, then COMMITs; the SQLSTATEs of the errors, in order.
async fn ignoring_errors(
    conn: &mut Conn,
    statements: &[(String, Vec<mysql_async::Value>)],
) -> Vec<String> {
    let mut states = Vec::new();
    conn.query_drop("START TRANSACTION").await.unwrap();
    for (sql, params) in statements {
        match conn.exec_drop(sql.as_str(), params.clone()).await {
            Ok(()) => {}
            Err(mysql_async::Error::Server(e)) => states.push(e.state),
            Err(e) => panic!("{sql}: {e}"),
        }
    }
    conn.query_drop("COMMIT").await.unwrap();
    states
}

fn params(values: impl IntoIterator<Item = mysql_async::Value>) -> Vec<mysql_async::Value> {
    values.into_iter().collect()
}

/// The hazard, stated: a separate fence statement's error does not stop a program
/// that ignores it, and its write commits. MySQL and MariaDB roll back only the
/// failing statement (PostgreSQL would abort the transaction).
#[test]
fn a_separate_fence_statement_whose_error_is_ignored_lets_the_write_commit() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("separate");
        let _ = setup().await;
        let mut app = connect_app().await;
        mysql::admit_with(&mut app, &key, 20).await.unwrap();
        let states = ignoring_errors(
            &mut app,
            &[
                (
                    "SELECT palisade.fence(?, ?)".into(),
                    params([key.as_str().into(), 19.into()]),
                ),
                (
                    format!(
                        "INSERT INTO {TEST_DB}.fenced_writes (k, token, writer) VALUES (?, ?, 1)"
                    ),
                    params([key.as_str().into(), 19.into()]),
                ),
            ],
        )
        .await;
        assert_eq!(states, ["PF001"]);
        assert_eq!(
            written(&mut app, &key).await,
            1,
            "the stale write committed, as stated"
        );
    });
}

/// The fence inside the write's statement: INSERT ... SELECT ... WHERE and UPDATE ...
/// WHERE. A stale token fails the write itself, and the COMMIT that follows the
/// ignored error commits nothing of it; a current token writes.
#[test]
fn the_fence_in_the_writes_own_statement_never_commits_a_stale_write() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("in-statement");
        let _ = setup().await;
        let mut app = connect_app().await;
        let insert = format!(
            "INSERT INTO {TEST_DB}.fenced_writes (k, token, writer) SELECT ?, ?, 2 FROM DUAL \
             WHERE COALESCE(palisade.fence(?, ?), 0) >= 0"
        );
        let update = format!(
            "UPDATE {TEST_DB}.fenced_writes SET token = ? WHERE k = ? \
             AND COALESCE(palisade.fence(?, ?), 0) >= 0"
        );
        let fenced_insert = |token: i64| {
            (
                insert.clone(),
                params([
                    key.as_str().into(),
                    token.into(),
                    key.as_str().into(),
                    token.into(),
                ]),
            )
        };
        let fenced_update = |token: i64| {
            (
                update.clone(),
                params([
                    token.into(),
                    key.as_str().into(),
                    key.as_str().into(),
                    token.into(),
                ]),
            )
        };
        // The current holder writes through both forms.
        let states = ignoring_errors(&mut app, &[fenced_insert(20), fenced_update(20)]).await;
        assert!(states.is_empty(), "{states:?}");
        assert_eq!(written(&mut app, &key).await, 1);
        // The stale holder, ignoring its errors, commits: nothing of its writes lands.
        let states = ignoring_errors(&mut app, &[fenced_insert(19), fenced_update(19)]).await;
        assert_eq!(states, ["PF001", "PF001"]);
        assert_eq!(written(&mut app, &key).await, 1, "a stale INSERT committed");
        let tokens: Vec<i64> = app
            .exec(
                format!("SELECT token FROM {TEST_DB}.fenced_writes WHERE k = ?"),
                (&key,),
            )
            .await
            .unwrap();
        assert_eq!(tokens, [20], "a stale UPDATE committed");
    });
}
