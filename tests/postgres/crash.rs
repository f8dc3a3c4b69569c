//! Crashes: a client SIGKILLed mid-transaction, the server stopped immediately.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use palisade::fence::Stale;
use palisade::fence::postgres::{self, Error};

use support::databases::{self, runtime};

use crate::{SERVER, admin_url, connect, mark, setup, written};

/// A client SIGKILLed with its transaction open: no write, no raised mark, no lock left.
#[test]
fn sigkill_of_a_client_mid_transaction_leaves_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let key = databases::unique("sigkill");
        let client = setup().await;
        postgres::admit_with(&client, &key, 5).await.unwrap();
        let mut psql = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &admin_url()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("psql");
        let mut stdin = psql.stdin.take().unwrap();
        writeln!(
            stdin,
            "BEGIN;\nSELECT palisade.fence('{key}', 100);\n\
             INSERT INTO public.fenced_writes (key, token, writer) VALUES ('{key}', 100, 9);\n\
             \\echo in-transaction"
        )
        .unwrap();
        stdin.flush().unwrap();
        let mut lines = BufReader::new(psql.stdout.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("psql output").unwrap();
            if line.contains("in-transaction") {
                break;
            }
        }
        psql.kill().unwrap(); // SIGKILL
        psql.wait().unwrap();
        // The row lock goes with the backend; a lower token than the unfinished one passes.
        let admitted = tokio::time::timeout(
            Duration::from_secs(10),
            postgres::admit_with(&client, &key, 6),
        )
        .await
        .expect("the killed client's lock was released")
        .unwrap();
        assert_eq!(admitted.previous, Some(5));
        let n = written(&client, &key).await;
        assert_eq!(n, 0, "the killed transaction's write is gone");
        drop(stdin);
    });
}

/// `pg_ctl stop -m immediate` (no checkpoint: a crash) and start: every committed mark is there.
#[test]
fn immediate_shutdown_and_restart_keep_every_committed_mark() {
    let _server = SERVER.write().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let prefix = databases::unique("restart");
    let expected: HashMap<String, i64> = rt.block_on(async {
        let client = setup().await;
        let mut expected = HashMap::new();
        for i in 0..50u64 {
            let key = format!("{prefix}-{}", i % 5);
            postgres::admit_with(&client, &key, i).await.unwrap();
            expected.insert(key, i as i64);
        }
        expected
    });
    databases::restart("postgres");
    rt.block_on(async {
        let client = connect().await;
        for (key, token) in &expected {
            assert_eq!(mark(&client, key).await, Some(*token), "{key}");
            assert!(matches!(
                postgres::admit_with(&client, key, *token as u64 - 1).await,
                Err(Error::Stale(Stale { .. }))
            ));
        }
    });
}
