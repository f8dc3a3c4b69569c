//! Concurrent writers: no lower token is ever written after a higher one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use palisade::fence::Stale;
use palisade::fence::redis::{self as fence_redis, Error, RedisFence, Write};
use proptest::prelude::*;

use support::databases::{self, runtime};

use crate::{SERVER, connect, create, get, journal};

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
                let mut conn = connect().await;
                for key in 0..3 {
                    create(&mut conn, &format!("{prefix}-{key}")).await;
                }
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
                                Err(Error::Stale(Stale {
                                    key: k,
                                    token: t,
                                    highest,
                                })) => {
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
