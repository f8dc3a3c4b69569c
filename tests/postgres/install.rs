//! Installing: twice and concurrently, over a v1 install, and a fence call with the
//! install missing (it never installs).

use palisade::fence::Stale;
use palisade::fence::postgres::{self, Error};

use support::cli;
use support::databases::{self, runtime};

use crate::{
    APP_ROLE, SERVER, assert_denied, connect_to, create_database, grant_least_privilege, superuser,
    url_as,
};

#[test]
fn install_is_idempotent_concurrent_and_versioned() {
    let _server = SERVER.read().unwrap();
    // Its own database: the other tests install meanwhile, and would meet version 99.
    let db = ScratchDb::new("palisade_install");
    let url = url_as(&superuser(), &db.0);
    runtime().block_on(async {
        let clients = futures::future::join_all((0..4).map(|_| connect_to(&url))).await;
        let installs = futures::future::join_all(clients.iter().map(postgres::install)).await;
        for result in installs {
            result.expect("concurrent installs all succeed");
        }
        postgres::install(&clients[0]).await.expect("and again");
        let version: i32 = clients[0]
            .query_one("SELECT version FROM palisade.version", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, postgres::SQL_VERSION);
        // A newer version installed is never downgraded.
        let tx_client = &clients[1];
        tx_client
            .batch_execute("UPDATE palisade.version SET version = 99")
            .await
            .unwrap();
        let err = postgres::install(tx_client).await.unwrap_err();
        let text = format!("{:?}", err);
        tx_client
            .batch_execute(&format!(
                "ROLLBACK; UPDATE palisade.version SET version = {}",
                postgres::SQL_VERSION
            ))
            .await
            .unwrap();
        assert!(text.contains("will not downgrade"), "{text}");
    });
}

/// A database of one test, dropped when the test ends (passed or not).
struct ScratchDb(String);

impl ScratchDb {
    fn new(prefix: &str) -> Self {
        let name = databases::unique(prefix).replace('-', "_");
        let db = ScratchDb(name);
        let created = db.0.clone();
        std::thread::spawn(move || runtime().block_on(create_database(&created)))
            .join()
            .expect("creating a scratch database");
        db
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            runtime().block_on(async {
                let admin = connect_to(&databases::postgres_url()).await;
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            })
        })
        .join();
    }
}

/// A fence call never installs: with the schema dropped, the CLI fails naming the
/// function and how to install it, as the superuser (who could create it) too, and
/// nothing is recreated. `--create` is the explicit install.
#[test]
fn a_dropped_schema_makes_the_fence_fail_naming_the_function_and_nothing_is_recreated() {
    let _server = SERVER.read().unwrap();
    let db = ScratchDb::new("palisade_dropped");
    let admin_url = url_as(&superuser(), &db.0);
    runtime().block_on(async {
        let admin = connect_to(&admin_url).await;
        postgres::install(&admin).await.expect("install");
        grant_least_privilege(&admin).await;
        postgres::admit_with(&admin, "k", 7).await.unwrap();
        admin
            .batch_execute("DROP SCHEMA palisade CASCADE")
            .await
            .unwrap();
    });
    for url in [admin_url.clone(), url_as(APP_ROLE, &db.0)] {
        for args in [&["--key", "k", "--token", "1"][..], &["--show"][..]] {
            let out = cli::fence(&url, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{url} {args:?}: {err}");
            assert!(
                err.contains("palisade.fence(text, bigint) is not installed in this database"),
                "{url} {args:?}: {err}"
            );
            assert!(
                err.contains("--create") && err.contains("sql/palisade-fence.sql"),
                "{url} {args:?}: {err}"
            );
        }
    }
    runtime().block_on(async {
        let admin = connect_to(&admin_url).await;
        let schema = admin
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = 'palisade'", &[])
            .await
            .unwrap();
        assert!(schema.is_none(), "a fence call recreated the schema");
        match postgres::admit_with(&admin, "k", 1).await {
            Err(e @ Error::NotInstalled { .. }) => assert!(
                e.to_string()
                    .contains("palisade.fence(text, bigint) is not installed"),
                "{e}"
            ),
            other => panic!("fencing with no schema: {other:?}"),
        }
    });
    // Installing is a step of its own, and takes no token.
    let with_token = cli::fence(&admin_url, &["--create", "--token", "1"]);
    assert_eq!(with_token.status.code(), Some(2));
    let install = cli::fence(&admin_url, &["--create"]);
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    assert!(
        String::from_utf8_lossy(&install.stdout).contains(&format!(
            "schema version {} is installed",
            postgres::SQL_VERSION
        )),
        "{}",
        String::from_utf8_lossy(&install.stdout)
    );
    let out = cli::fence(&admin_url, &["--key", "k", "--token", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A v1 install (SECURITY INVOKER: writers had DML on the marks) upgrades in place:
/// the marks are kept, every v1 writer may EXECUTE the function and no longer
/// write the marks table, and PUBLIC loses EXECUTE.
#[test]
fn upgrading_a_v1_install_keeps_the_marks_and_takes_dml_from_writers() {
    let _server = SERVER.read().unwrap();
    let db = ScratchDb::new("palisade_upgrade");
    let writer = "palisade_test_v1_writer";
    runtime().block_on(async {
        let admin = connect_to(&url_as(&superuser(), &db.0)).await;
        admin
            .batch_execute(include_str!("../databases/palisade-fence-v1.sql"))
            .await
            .expect("installing version 1");
        admin
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {writer} LOGIN;
                   EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                 GRANT USAGE ON SCHEMA palisade TO {writer};
                 GRANT SELECT, INSERT, UPDATE ON palisade.marks TO {writer}"
            ))
            .await
            .unwrap();
        let v1_writer = connect_to(&url_as(writer, &db.0)).await;
        postgres::admit_with(&v1_writer, "k", 9)
            .await
            .expect("a version 1 writer fences");

        postgres::install(&admin).await.expect("upgrading to the current version");
        let version: i32 = admin
            .query_one("SELECT version FROM palisade.version", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, postgres::SQL_VERSION);
        let admitted = postgres::admit_with(&v1_writer, "k", 10)
            .await
            .expect("the v1 writer still fences after the upgrade");
        assert_eq!(admitted.previous, Some(9), "the mark was kept");
        assert!(matches!(
            postgres::admit_with(&v1_writer, "k", 8).await,
            Err(Error::Stale(Stale { highest: 10, .. }))
        ));
        let lowered = v1_writer
            .execute("UPDATE palisade.marks SET token = 0 WHERE key = 'k'", &[])
            .await;
        assert_denied(lowered, "UPDATE palisade.marks after the upgrade");
        let public: bool = admin
            .query_one(
                "SELECT has_function_privilege('public', 'palisade.fence(text, bigint)', 'EXECUTE')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!public, "PUBLIC may still EXECUTE palisade.fence");
        // Installing again changes no grant.
        postgres::install(&admin).await.unwrap();
        postgres::admit_with(&v1_writer, "k", 11).await.unwrap();
    });
}
