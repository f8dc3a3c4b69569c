//! The least-privilege role docs/fences.md documents: enough to fence, never to
//! change a mark.

use palisade::fence::Stale;
use palisade::fence::postgres::{self, Error};

use support::databases::{self, runtime};

use crate::{
    SERVER, SHOW_ROLE, TEST_DB, assert_denied, connect_app, connect_to, mark, setup, url_as,
};

/// docs/fences.md's grants (USAGE on the schema, EXECUTE on the function, DML on the
/// application's own table) are enough to fence, and give no way to lower, delete,
/// forge or read a mark.
#[test]
fn least_privilege_role_fences_and_cannot_change_the_marks() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let admin = setup().await;
        let key = databases::unique("least-privilege");
        let mut app = connect_app().await;
        let tx = app.transaction().await.unwrap();
        let admitted = postgres::admit(&tx, &key, 5)
            .await
            .expect("the application role admits a token");
        assert_eq!(admitted.previous, None);
        tx.execute(
            "INSERT INTO public.app_writes (key, token) VALUES ($1, 5)",
            &[&key],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();

        let tx = app.transaction().await.unwrap();
        match postgres::admit(&tx, &key, 4).await {
            Err(Error::Stale(Stale { highest: 5, .. })) => {}
            other => panic!("a stale token as the application role: {other:?}"),
        }
        tx.rollback().await.unwrap();

        let lowered = app
            .execute(
                "UPDATE palisade.marks SET token = 0 WHERE key = $1",
                &[&key],
            )
            .await;
        assert_denied(lowered, "UPDATE palisade.marks");
        let deleted = app
            .execute("DELETE FROM palisade.marks WHERE key = $1", &[&key])
            .await;
        assert_denied(deleted, "DELETE FROM palisade.marks");
        let forged = app
            .execute(
                "INSERT INTO palisade.marks (key, token) VALUES ($1 || '-forged', 0)",
                &[&key],
            )
            .await;
        assert_denied(forged, "INSERT INTO palisade.marks");
        let truncated = app.execute("TRUNCATE palisade.marks", &[]).await;
        assert_denied(truncated, "TRUNCATE palisade.marks");
        let version = app
            .execute("UPDATE palisade.version SET version = 1", &[])
            .await;
        assert_denied(version, "UPDATE palisade.version");
        let read = app
            .execute("SELECT token FROM palisade.marks WHERE key = $1", &[&key])
            .await;
        assert_denied(read, "SELECT FROM palisade.marks");
        assert_eq!(mark(&admin, &key).await, Some(5), "the mark is untouched");

        // The role granted SELECT reads the marks, and cannot fence: PUBLIC has no EXECUTE.
        let show = connect_to(&url_as(SHOW_ROLE, TEST_DB)).await;
        let marks = postgres::marks(&show).await.expect("SELECT on the marks");
        assert_eq!(marks.get(&key), Some(&5));
        match postgres::admit_with(&show, &key, 6).await {
            Err(Error::Database(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {}
            other => panic!("fencing without EXECUTE: {other:?}"),
        }
        assert_eq!(mark(&admin, &key).await, Some(5));
    });
}
