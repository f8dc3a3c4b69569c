//! Installing: only on purpose (`--create`, `install`), idempotent, never downgrading,
//! and a fence call that never creates anything.

use mysql_async::prelude::Queryable;
use palisade::fence::mysql::{self, Error};

use support::cli;
use support::databases::{self, runtime};

use crate::{APP_USER, SERVER, admin_url, connect, connect_app, setup};

#[test]
fn installing_again_changes_nothing_and_keeps_the_writers_grants() {
    // Writing: installing waits for other tests' open transactions that fenced.
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("reinstall");
        let mut admin = setup().await;
        let mut app = connect_app().await;
        mysql::admit_with(&mut app, &key, 7).await.unwrap();
        for _ in 0..2 {
            mysql::install(&mut admin).await.expect("install again");
        }
        let version: Option<i32> = admin
            .query_first("SELECT version FROM palisade.version")
            .await
            .unwrap();
        assert_eq!(version, Some(mysql::SQL_VERSION));
        // CREATE OR REPLACE kept the EXECUTE grant, and the mark is still there.
        let admitted = mysql::admit_with(&mut app, &key, 7).await.unwrap();
        assert_eq!(admitted.previous, Some(7));
        let grants: Vec<String> = admin
            .query(format!("SHOW GRANTS FOR '{APP_USER}'@'%'"))
            .await
            .unwrap();
        assert!(
            grants
                .iter()
                .any(|g| g.contains("EXECUTE ON FUNCTION `palisade`.`fence`")),
            "{grants:?}"
        );
    });
}

/// Without the database a call fails naming what is missing, and creates nothing,
/// even as an account that could; the CLI installs only with `--create`.
#[test]
fn a_fence_call_never_installs_anything() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    rt.block_on(async {
        let mut admin = setup().await;
        admin.query_drop("DROP DATABASE palisade").await.unwrap();
        let err = mysql::admit_with(&mut admin, "never-created", 5)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::NotInstalled { reason } if reason.contains("palisade")),
            "{err:?}"
        );
        assert!(err.to_string().contains("--create"), "{err}");
        let schemas: Vec<String> = admin
            .query("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'palisade'")
            .await
            .unwrap();
        assert!(schemas.is_empty(), "a fence call created {schemas:?}");
    });
    let url = admin_url();
    let call = cli::fence(&url, &["--key", "never-created", "--token", "5"]);
    assert_eq!(call.status.code(), Some(1));
    let err = String::from_utf8_lossy(&call.stderr);
    assert!(err.contains("not installed"), "{err}");
    // --create takes no token: setting up and fencing are separate steps.
    let both = cli::fence(&url, &["--create", "--token", "5"]);
    assert_eq!(both.status.code(), Some(2));
    let create = cli::fence(&url, &["--create"]);
    assert!(
        create.status.success(),
        "{}",
        String::from_utf8_lossy(&create.stderr)
    );
    assert!(String::from_utf8_lossy(&create.stdout).contains("schema version 1 is installed"));
    rt.block_on(async {
        let mut admin = setup().await;
        let admitted = mysql::admit_with(&mut admin, "never-created", 5).await;
        assert_eq!(admitted.unwrap().previous, None, "the marks start empty");
        admin
            .query_drop("DELETE FROM palisade.marks WHERE `key` = 'never-created'")
            .await
            .unwrap();
    });
}

#[test]
fn an_older_file_never_replaces_a_newer_install() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("downgrade");
        let mut admin = setup().await;
        admin
            .query_drop("UPDATE palisade.version SET version = 2")
            .await
            .unwrap();
        let err = mysql::install(&mut admin).await.unwrap_err();
        let Error::Mysql(mysql_async::Error::Server(server)) = &err else {
            panic!("expected the server's refusal, got {err:?}");
        };
        assert_eq!(server.state, "PF002", "{server:?}");
        assert!(server.message.contains("will not downgrade"), "{server:?}");
        // The refusal released the installers' lock and left the newer install alone.
        let mut other = connect().await;
        let held: Option<Option<i64>> = other
            .query_first("SELECT IS_USED_LOCK('palisade.install')")
            .await
            .unwrap();
        assert_eq!(held, Some(None));
        let version: Option<i32> = other
            .query_first("SELECT version FROM palisade.version")
            .await
            .unwrap();
        assert_eq!(version, Some(2));
        mysql::admit_with(&mut other, &key, 1).await.unwrap();
        other
            .query_drop("UPDATE palisade.version SET version = 1")
            .await
            .unwrap();
        mysql::install(&mut other)
            .await
            .expect("the same version installs again");
    });
}

/// Installing again replaces the function, which waits for every open transaction
/// that called it while new calls queue behind it: the install gives up after 10 s
/// (1205) instead of stalling the key's fencers for `lock_wait_timeout` (a day), and
/// gives the installer's session its settings back.
#[test]
fn installing_while_a_fenced_transaction_is_open_gives_up_after_10s() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let key = databases::unique("install-wait");
        let mut holder = setup().await;
        let mut held = crate::begin(&mut holder, mysql_async::IsolationLevel::RepeatableRead).await;
        mysql::admit(&mut held, &key, 1).await.unwrap();
        let mut installer = connect().await;
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            mysql::install(&mut installer),
        )
        .await
        .expect("the install's wait is bounded");
        let waited = started.elapsed();
        let err = result.unwrap_err();
        assert_eq!(err.server_code(), Some(1205), "{err:?}");
        assert!(waited >= std::time::Duration::from_secs(9), "{waited:?}");
        let settings: Option<(u64, String)> = installer
            .query_first("SELECT @@SESSION.lock_wait_timeout, @@SESSION.sql_mode")
            .await
            .unwrap();
        let (timeout, sql_mode) = settings.unwrap();
        assert_ne!(timeout, 10, "the session's lock_wait_timeout came back");
        assert!(!sql_mode.contains("STRICT_ALL_TABLES"), "{sql_mode}");
        // Fencers go on once the install gave up, and it installs after the holder ends.
        mysql::admit_with(&mut connect_app().await, &databases::unique("after"), 1)
            .await
            .unwrap();
        held.commit().await.unwrap();
        mysql::install(&mut installer)
            .await
            .expect("install after the holder ended");
    });
}
