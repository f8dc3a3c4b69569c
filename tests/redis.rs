//! The Redis fencing script in a real Redis (`make databases`, AOF with
//! `appendfsync always`): concurrent writers, refusals, bad input, NOSCRIPT
//! fallback, and a SIGKILL restart that keeps marks and writes.
#![cfg(feature = "redis")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/databases.rs"]
mod databases;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use palisade::fence::redis::{self as fence_redis, Error, RedisFence, Write};
use proptest::prelude::*;
use redis::aio::MultiplexedConnection;

use databases::runtime;

/// The restart test kills the server: it takes this for writing, others for reading.
static SERVER: RwLock<()> = RwLock::new(());

async fn connect() -> MultiplexedConnection {
    redis::Client::open(databases::redis_url())
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to the test Redis")
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

async fn journal(conn: &mut MultiplexedConnection, key: &str) -> Vec<u64> {
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(fence_redis::data_key(key, "journal"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    items.iter().map(|t| t.parse().unwrap()).collect()
}

const CASES: u32 = 8;
const WRITES_PER_CASE: usize = 150;

#[test]
fn concurrent_writers_never_commit_a_lower_token() {
    let _server = SERVER.read().unwrap();
    let rt = runtime();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    });
    let plan = prop::collection::vec((0u8..8, 0u8..3, 0u64..30), WRITES_PER_CASE);
    let totals = Mutex::new((0usize, 0usize));
    runner
        .run(&plan, |ops| {
            let prefix = databases::unique("redis-conc");
            let stale = Arc::new(Mutex::new(Vec::new()));
            // (key, token, began, acked)
            let accepted = Arc::new(Mutex::new(Vec::new()));
            rt.block_on(async {
                let mut tasks = Vec::new();
                for w in 0..8u8 {
                    let mine: Vec<(String, u64)> = ops
                        .iter()
                        .enumerate()
                        .filter(|(_, op)| op.0 == w)
                        .map(|(i, &(_, key, jitter))| {
                            (format!("{prefix}-{key}"), i as u64 / 2 + jitter)
                        })
                        .collect();
                    let (stale, accepted) = (stale.clone(), accepted.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut conn = connect().await;
                        let fence = RedisFence::new();
                        for (key, token) in mine {
                            let value = token.to_string();
                            let journal_key = fence_redis::data_key(&key, "journal");
                            let began = Instant::now();
                            let write = Write::Push {
                                key: &journal_key,
                                value: &value,
                            };
                            match fence.admit(&mut conn, &key, token, write).await {
                                Ok(_) => accepted.lock().unwrap().push((
                                    key,
                                    token,
                                    began,
                                    Instant::now(),
                                )),
                                Err(Error::Stale {
                                    key: k,
                                    token: t,
                                    highest,
                                }) => {
                                    assert_eq!((&k, t), (&key, token));
                                    stale.lock().unwrap().push((k, t, highest));
                                }
                                Err(e) => panic!("{e:?}"),
                            }
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
            });
            let accepted = accepted.lock().unwrap();
            let stale = stale.lock().unwrap();
            let mut by_key: BTreeMap<&str, Vec<&(String, u64, Instant, Instant)>> = BTreeMap::new();
            for a in accepted.iter() {
                by_key.entry(&a.0).or_default().push(a);
            }
            let mut conn = rt.block_on(connect());
            for (key, writes) in &by_key {
                // Commit order: the list the script appended to.
                let order = rt.block_on(journal(&mut conn, key));
                prop_assert_eq!(order.len(), writes.len(), "{}", key);
                prop_assert!(
                    order.windows(2).all(|w| w[0] <= w[1]),
                    "{}: {:?}",
                    key,
                    order
                );
                let mark = rt.block_on(get(&mut conn, &fence_redis::mark_key(key)));
                prop_assert_eq!(mark, order.last().map(|t| t.to_string()));
                for a in writes {
                    for b in writes {
                        if a.3 < b.2 {
                            prop_assert!(a.1 <= b.1, "{}: {} after {}", key, b.1, a.1);
                        }
                    }
                }
            }
            for (key, token, highest) in stale.iter() {
                prop_assert!(token < highest);
                prop_assert!(
                    accepted.iter().any(|a| &a.0 == key && a.1 == *highest),
                    "{} refused {} naming {}, never accepted",
                    key,
                    token,
                    highest
                );
            }
            let mut totals = totals.lock().unwrap();
            totals.0 += accepted.len();
            totals.1 += stale.len();
            Ok(())
        })
        .unwrap();
    let (accepted, stale) = *totals.lock().unwrap();
    println!(
        "redis: {} writes, {accepted} accepted, {stale} stale refused",
        CASES as usize * WRITES_PER_CASE
    );
    assert!(stale > 0, "no stale token met: the plans prove nothing");
}

#[test]
fn stale_refusal_names_key_and_tokens_and_writes_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let mut conn = connect().await;
        let key = databases::unique("redis-stale");
        let value_key = fence_redis::data_key(&key, "value");
        let fence = RedisFence::new();
        let admitted = fence
            .admit(
                &mut conn,
                &key,
                34,
                Write::Set {
                    key: &value_key,
                    value: "new",
                },
            )
            .await
            .unwrap();
        assert_eq!(admitted.previous, None);
        let err = fence
            .admit(
                &mut conn,
                &key,
                33,
                Write::Set {
                    key: &value_key,
                    value: "stale",
                },
            )
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "write rejected: stale fencing token 33 for key {key:?} is lower than the \
                 highest admitted token 34"
            )
        );
        assert_eq!(get(&mut conn, &value_key).await.as_deref(), Some("new"));
        assert_eq!(
            get(&mut conn, &fence_redis::mark_key(&key))
                .await
                .as_deref(),
            Some("34")
        );
        // Tokens compare exactly beyond 2^53 (Lua numbers are doubles).
        let big = 1u64 << 60;
        fence
            .admit(&mut conn, &key, big + 1, Write::None)
            .await
            .unwrap();
        assert!(matches!(
            fence.admit(&mut conn, &key, big, Write::None).await,
            Err(Error::Stale { highest, .. }) if highest == big + 1
        ));
        fence
            .admit(&mut conn, &key, u64::MAX, Write::None)
            .await
            .unwrap();
    });
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let mut conn = connect().await;
        let key = databases::unique("redis-bad");
        let mark = fence_redis::mark_key(&key);
        for (token, words) in [
            ("-1", "not an unsigned decimal integer"),
            ("", "not an unsigned decimal integer"),
            ("1e3", "not an unsigned decimal integer"),
            ("18446744073709551616", "larger than 18446744073709551615"),
        ] {
            let err = redis::cmd("EVAL")
                .arg(fence_redis::SCRIPT)
                .arg(1)
                .arg(&mark)
                .arg(token)
                .arg(&key)
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap_err();
            assert!(err.to_string().contains(words), "{token:?}: {err}");
        }
        let fence = RedisFence::new();
        for k in [String::new(), "k".repeat(fence_redis::MAX_KEY_BYTES + 1)] {
            assert!(matches!(
                fence.admit(&mut conn, &k, 1, Write::None).await,
                Err(Error::BadInput(_))
            ));
        }
        assert_eq!(get(&mut conn, &mark).await, None, "nothing written");
    });
}

/// After SCRIPT FLUSH (as after a restart) EVALSHA answers NOSCRIPT; the call falls
/// back to EVAL and succeeds.
#[test]
fn noscript_falls_back_to_eval() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let mut conn = connect().await;
        let key = databases::unique("redis-noscript");
        let fence = RedisFence::new();
        fence.admit(&mut conn, &key, 1, Write::None).await.unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            fence
                .admit(&mut conn, &key, 2, Write::None)
                .await
                .unwrap()
                .previous,
            Some(1)
        );
    });
}

/// SIGKILL and restart: with `appendfsync always`, every acknowledged mark and
/// write is in the AOF.
#[test]
fn sigkill_and_restart_keep_marks_and_writes() {
    let _server = SERVER.write().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let key = databases::unique("redis-restart");
    rt.block_on(async {
        let mut conn = connect().await;
        let fence = RedisFence::new();
        let journal_key = fence_redis::data_key(&key, "journal");
        for token in 0..100u64 {
            let value = token.to_string();
            fence
                .admit(
                    &mut conn,
                    &key,
                    token,
                    Write::Push {
                        key: &journal_key,
                        value: &value,
                    },
                )
                .await
                .unwrap();
        }
    });
    databases::restart("redis");
    rt.block_on(async {
        let mut conn = connect().await;
        assert_eq!(journal(&mut conn, &key).await, (0..100).collect::<Vec<_>>());
        assert!(matches!(
            RedisFence::new()
                .admit(&mut conn, &key, 98, Write::None)
                .await,
            Err(Error::Stale { highest: 99, .. })
        ));
    });
}

/// `palisade fence --store redis://...`: the payload is the protected write.
#[test]
fn cli_admits_writes_the_payload_and_refuses_with_exit_3() {
    let _server = SERVER.read().unwrap();
    let url = databases::redis_url();
    let key = databases::unique("redis-cli");
    let run = |args: &[&str]| cli::fence(&url, args);
    let ok = run(&["--key", &key, "--token", "34", "--payload", "new"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stale = run(&["--key", &key, "--token", "33", "--payload", "stale"]);
    assert_eq!(stale.status.code(), Some(3));
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(err.contains("33") && err.contains("34"), "{err}");
    runtime().block_on(async {
        let mut conn = connect().await;
        let value = get(&mut conn, &fence_redis::data_key(&key, "value")).await;
        assert_eq!(value.as_deref(), Some("new"));
    });
    assert_eq!(run(&["--key", "", "--token", "1"]).status.code(), Some(2));
}
