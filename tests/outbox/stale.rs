//! What the outbox refuses: a stale holder's intent (with the rest of its
//! transaction), a stale relay's claim and record, an install without the fence.

use palisade::fence::Stale;
use palisade::outbox::{self, Error};

use super::{TestDb, enqueue, rows};

#[tokio::test]
async fn a_stale_holders_intent_is_never_inserted_and_its_transaction_aborts() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL)")
        .await
        .unwrap();
    // The new holder (token 8) has written; the old one (token 7) still tries.
    let fresh = enqueue(
        &mut client,
        "shop/payments",
        8,
        serde_json::json!({"order": 1}),
    )
    .await;

    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (2, 'paid')", &[])
        .await
        .unwrap();
    let refused = outbox::enqueue(&tx, "shop/payments", 7, &serde_json::json!({"order": 2})).await;
    match refused {
        Err(Error::Stale(Stale {
            key,
            token: 7,
            highest: 8,
        })) if key == "shop/payments" => {}
        other => panic!("expected the stale token to be refused, got {other:?}"),
    }
    // PostgreSQL answers the COMMIT of an aborted transaction with a ROLLBACK.
    let _ = tx.commit().await;

    let intents = rows(&client).await;
    assert_eq!(
        intents.keys().collect::<Vec<_>>(),
        [&fresh],
        "only the fresh holder's intent is in the outbox"
    );
    let orders = client.query("SELECT id FROM orders", &[]).await.unwrap();
    assert!(
        orders.is_empty(),
        "the stale holder's own write was rolled back with it"
    );

    // The equal token (the same grant writing again) is admitted.
    enqueue(
        &mut client,
        "shop/payments",
        8,
        serde_json::json!({"order": 3}),
    )
    .await;
    assert_eq!(rows(&client).await.len(), 2);
}

#[tokio::test]
async fn a_stale_relay_can_neither_claim_nor_record() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let id = enqueue(
        &mut client,
        "shop/payments",
        1,
        serde_json::json!({"order": 1}),
    )
    .await;
    let claim = "SELECT intent_id::text FROM palisade.outbox_claim($1, $2, 10, interval '10 s')";
    let record = "SELECT palisade.outbox_record($1, $2, $3::text::uuid, 200, 'ok', interval '1 s')";
    let claimed = client.query(claim, &[&"ops/relay", &4i64]).await.unwrap();
    assert_eq!(claimed.len(), 1, "the first relay claims the intent");
    // Its successor (token 5) takes the intent over at once, although it is in flight.
    let taken = client.query(claim, &[&"ops/relay", &5i64]).await.unwrap();
    assert_eq!(taken.len(), 1, "the successor claims the intent in flight");

    for (what, sql, params) in [
        ("claim", claim, vec![]),
        ("record", record, vec![id.clone()]),
    ] {
        let error = match params.first() {
            None => client.query(sql, &[&"ops/relay", &4i64]).await.err(),
            Some(id) => client.query(sql, &[&"ops/relay", &4i64, id]).await.err(),
        }
        .unwrap_or_else(|| panic!("the stale relay's {what} was accepted"));
        assert_eq!(
            error.code().map(|c| c.code()),
            Some("PF001"),
            "{what}: {error}"
        );
    }
    assert_eq!(
        rows(&client).await[&id].state,
        "pending",
        "nothing recorded"
    );
    let state: String = client
        .query_one(record, &[&"ops/relay", &5i64, &id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "delivered", "the successor records");
}

#[tokio::test]
async fn the_outbox_refuses_to_install_without_the_fence_and_installs_twice_harmlessly() {
    let empty = TestDb::empty().await;
    let client = empty.connect().await;
    let error = outbox::install(&client)
        .await
        .expect_err("installed without the fence");
    assert!(matches!(error, Error::NotInstalled { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("palisade.fence(text, bigint) is not installed")
            && message.contains("palisade-fence.sql"),
        "{message}"
    );
    let schemas = client
        .query("SELECT 1 FROM pg_namespace WHERE nspname = 'palisade'", &[])
        .await
        .unwrap();
    assert!(
        schemas.is_empty(),
        "the refused install left nothing behind"
    );

    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let id = enqueue(&mut client, "k", 1, serde_json::json!({})).await;
    outbox::install(&client).await.expect("installing again");
    assert!(
        rows(&client).await.contains_key(&id),
        "installing again keeps the intents"
    );
    let version: i32 = client
        .query_one("SELECT version FROM palisade.outbox_version", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, outbox::SQL_VERSION);
}

#[tokio::test]
async fn a_writer_with_execute_only_enqueues_but_cannot_touch_the_outbox() {
    const WRITER: &str = "palisade_test_outbox_writer";
    let db = TestDb::new().await;
    let admin = db.connect().await;
    admin
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7273612897165101);
             DO $$ BEGIN CREATE ROLE {WRITER} LOGIN;
               EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             GRANT USAGE ON SCHEMA palisade TO {WRITER};
             GRANT EXECUTE ON FUNCTION palisade.enqueue(text, bigint, jsonb) TO {WRITER};
             COMMIT"
        ))
        .await
        .unwrap();
    let as_writer = db.url.replacen("postgres@", &format!("{WRITER}@"), 1);
    assert_ne!(as_writer, db.url, "the test URL names the postgres user");
    let mut writer = super::connect(&as_writer).await;
    let id = enqueue(
        &mut writer,
        "shop/payments",
        3,
        serde_json::json!({"order": 9}),
    )
    .await;
    for sql in [
        "SELECT count(*) FROM palisade.outbox",
        "UPDATE palisade.outbox SET state = 'delivered'",
        "DELETE FROM palisade.outbox",
        "SELECT * FROM palisade.outbox_claim('w', 3, 1, interval '1 s')",
    ] {
        let error = writer.batch_execute(sql).await.expect_err(sql);
        assert_eq!(
            error.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}"
        );
    }
    assert_eq!(rows(&admin).await[&id].state, "pending");
}

#[tokio::test]
async fn palisade_outbox_install_refuses_without_the_fence_then_installs() {
    let db = TestDb::empty().await;
    let install = || {
        support::cli::palisade()
            .args(["outbox", "install", "--store", &db.url])
            .output()
            .expect("run palisade outbox install")
    };
    let refused = install();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("palisade.fence(text, bigint) is not installed")
            && stderr.contains("palisade fence --store URL --create"),
        "{stderr}"
    );
    let fence = support::cli::fence(&db.url, &["--create"]);
    assert!(fence.status.success(), "{fence:?}");
    let installed = install();
    assert!(installed.status.success(), "{installed:?}");
    assert_eq!(
        String::from_utf8_lossy(&installed.stdout).trim(),
        format!(
            "palisade outbox schema version {} is installed",
            outbox::SQL_VERSION
        )
    );
}
