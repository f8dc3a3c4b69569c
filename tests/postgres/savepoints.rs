//! Drivers that wrap each statement in a savepoint (pgjdbc `autosave`, psql
//! `ON_ERROR_ROLLBACK`): the hazard, and the fence in the write's own statement.

use std::io::Write;
use std::process::{Command, Stdio};

use palisade::fence::postgres;
use tokio_postgres::Client;

use support::databases::{self, runtime};

use crate::{APP_ROLE, SERVER, TEST_DB, connect_app, mark, setup, url_as};

/// Runs `statements` in one transaction the way a driver that wraps each statement
/// in a savepoint does (pgjdbc `autosave=always`): an error rolls back to the
/// savepoint and the transaction goes on, to COMMIT. The errors, in order.
async fn autosave(client: &Client, statements: &[String]) -> Vec<tokio_postgres::Error> {
    let mut errors = Vec::new();
    client.batch_execute("BEGIN").await.unwrap();
    for statement in statements {
        client
            .batch_execute("SAVEPOINT pgjdbc_autosave")
            .await
            .unwrap();
        match client.batch_execute(statement).await {
            Ok(()) => client
                .batch_execute("RELEASE SAVEPOINT pgjdbc_autosave")
                .await
                .unwrap(),
            Err(e) => {
                errors.push(e);
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT pgjdbc_autosave")
                    .await
                    .unwrap();
            }
        }
    }
    client.batch_execute("COMMIT").await.unwrap();
    errors
}

/// The same statements through `psql -v ON_ERROR_ROLLBACK=on` in one transaction
/// block, as the application role; psql's stderr.
fn psql_on_error_rollback(statements: &[String]) -> String {
    let mut psql = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_ROLLBACK=on",
            &url_as(APP_ROLE, TEST_DB),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    let mut stdin = psql.stdin.take().unwrap();
    writeln!(stdin, "BEGIN;").unwrap();
    for statement in statements {
        writeln!(stdin, "{statement};").unwrap();
    }
    writeln!(stdin, "COMMIT;").unwrap();
    drop(stdin);
    let out = psql.wait_with_output().unwrap();
    assert!(out.status.success(), "psql: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn app_rows(client: &Client, key: &str) -> Vec<i64> {
    client
        .query(
            "SELECT token FROM public.app_writes WHERE key = $1 ORDER BY id",
            &[&key],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The hazard, shown: with a driver that wraps each statement in a savepoint, the
/// separate `SELECT palisade.fence(...)` fails alone and the write after it commits.
#[test]
fn savepoint_wrapping_drivers_commit_a_separate_write_after_pf001() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let admin = setup().await;
        let app = connect_app().await;
        for driver in ["pgjdbc autosave", "psql ON_ERROR_ROLLBACK"] {
            let key = databases::unique("autosave-separate");
            postgres::admit_with(&admin, &key, 5).await.unwrap();
            let statements = [
                format!("SELECT palisade.fence('{key}', 4)"),
                format!("INSERT INTO public.app_writes (key, token) VALUES ('{key}', 4)"),
            ];
            if driver == "psql ON_ERROR_ROLLBACK" {
                let err = psql_on_error_rollback(&statements);
                assert!(err.contains("stale fencing token 4"), "{driver}: {err}");
            } else {
                let errors = autosave(&app, &statements).await;
                assert_eq!(errors.len(), 1, "{driver}: {errors:?}");
                assert_eq!(
                    errors[0].code().map(|c| c.code()),
                    Some(postgres::STALE_SQLSTATE)
                );
            }
            assert_eq!(
                app_rows(&app, &key).await,
                vec![4],
                "{driver}: the write after PF001 committed (the hazard docs/fences.md warns of)"
            );
            assert_eq!(mark(&admin, &key).await, Some(5));
        }
    });
}

/// What docs/fences.md recommends for such drivers: the fence in the write's own
/// statement, so the statement that fails is the write. A stale token commits
/// nothing under either wrapping; a current one writes.
#[test]
fn fence_in_the_write_statement_commits_nothing_stale_under_savepoint_wrapping() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let admin = setup().await;
        let app = connect_app().await;
        for driver in ["pgjdbc autosave", "psql ON_ERROR_ROLLBACK"] {
            let key = databases::unique("autosave-one-statement");
            let forms = |token: u64| {
                [
                    format!(
                        "INSERT INTO public.app_writes (key, token) \
                         SELECT '{key}', {token} FROM palisade.fence('{key}', {token})"
                    ),
                    format!(
                        "UPDATE public.app_writes SET token = {token} \
                         FROM palisade.fence('{key}', {token}) WHERE key = '{key}'"
                    ),
                    format!(
                        "DELETE FROM public.app_writes \
                         USING palisade.fence('{key}', {token}) WHERE key = '{key}'"
                    ),
                ]
            };
            let run = |statements: Vec<String>| {
                let app = &app;
                async move {
                    if driver == "psql ON_ERROR_ROLLBACK" {
                        let err = psql_on_error_rollback(&statements);
                        err.matches("stale fencing token").count()
                    } else {
                        autosave(app, &statements).await.len()
                    }
                }
            };
            // Token 5 writes one row (the INSERT form alone).
            assert_eq!(run(vec![forms(5)[0].clone()]).await, 0, "{driver}");
            assert_eq!(app_rows(&app, &key).await, vec![5], "{driver}");
            // Token 4 is stale: each of the three forms fails, and nothing changes.
            assert_eq!(run(forms(4).to_vec()).await, 3, "{driver}");
            assert_eq!(
                app_rows(&app, &key).await,
                vec![5],
                "{driver}: a stale write committed"
            );
            assert_eq!(mark(&admin, &key).await, Some(5));
            // Token 6 passes: the UPDATE form writes.
            assert_eq!(run(vec![forms(6)[1].clone()]).await, 0, "{driver}");
            assert_eq!(app_rows(&app, &key).await, vec![6], "{driver}");
            assert_eq!(mark(&admin, &key).await, Some(6));
        }
    });
}
