//! Marks across a SIGKILL restart, and a Redis that lost them (no AOF, eviction,
//! FLUSHDB, never created): the fence fails closed.

use std::time::Duration;

use palisade::fence::Stale;
use palisade::fence::redis::{self as fence_redis, Error, RedisFence, Settings, Write};

use support::databases::{self, runtime};

use crate::{
    DEFAULT_PERSISTENCE, OwnRedis, SAFE, SERVER, assert_no_mark, connect, connect_to, create, get,
    journal,
};

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
        create(&mut conn, &key).await;
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
            Err(Error::Stale(Stale { highest: 99, .. }))
        ));
    });
}

/// Redis' default persistence (RDB snapshots only): a SIGKILL before the first
/// snapshot comes back with no marks. The fence refuses every token, writes nothing,
/// and does not start over.
#[test]
fn a_restart_without_aof_loses_the_mark_and_the_fence_refuses() {
    let mut server = OwnRedis::start(DEFAULT_PERSISTENCE);
    let key = "ledger";
    let value_key = fence_redis::data_key(key, "value");
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect_to(&server.url()).await;
        // The test plays an operator who ignored the check (create would refuse).
        let _: () = redis::cmd("SET")
            .arg(fence_redis::mark_key(key))
            .arg("")
            .query_async(&mut conn)
            .await
            .unwrap();
        let write = Write::Set {
            key: &value_key,
            value: "new",
        };
        let fence = RedisFence::new();
        assert_eq!(
            fence
                .admit(&mut conn, key, 5, write)
                .await
                .unwrap()
                .previous,
            None
        );
    });
    server.kill_and_restart();
    rt.block_on(async {
        let mut conn = connect_to(&server.url()).await;
        let fence = RedisFence::new();
        for token in [3, 5, 6] {
            let write = Write::Set {
                key: &value_key,
                value: "stale",
            };
            let refused = fence.admit(&mut conn, key, token, write).await;
            assert_no_mark(refused, key);
        }
        assert_eq!(get(&mut conn, &value_key).await, None, "nothing written");
        assert_eq!(get(&mut conn, &fence_redis::mark_key(key)).await, None);
        let message = fence
            .admit(&mut conn, key, 3, Write::None)
            .await
            .unwrap_err()
            .to_string();
        for words in [
            "\"ledger\"",
            "missing",
            "never created",
            "lost",
            "start over",
        ] {
            assert!(message.contains(words), "{words:?} not in: {message}");
        }
    });
}

/// `allkeys-lru` with a small `maxmemory`: writes to other keys evict the idle mark,
/// and the next admit is refused.
#[test]
fn an_evicted_mark_makes_the_fence_refuse() {
    let server = OwnRedis::start(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    runtime().block_on(async {
        let mut conn = connect_to(&server.url()).await;
        let key = "ledger";
        let mark = fence_redis::mark_key(key);
        let _: () = redis::cmd("SET")
            .arg(&mark)
            .arg("")
            .query_async(&mut conn)
            .await
            .unwrap();
        let fence = RedisFence::new();
        fence.admit(&mut conn, key, 7, Write::None).await.unwrap();
        // The LRU clock counts seconds: let the mark become the idlest key.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let filler = "x".repeat(64 * 1024);
        let mut written = 0;
        while get(&mut conn, &mark).await.is_some() {
            assert!(written < 5000, "the mark survived {written} filler writes");
            let _: () = redis::cmd("SET")
                .arg(format!("filler-{written}"))
                .arg(&filler)
                .query_async(&mut conn)
                .await
                .unwrap();
            written += 1;
        }
        println!("the mark was evicted after {written} filler writes of 64 KiB");
        assert_no_mark(fence.admit(&mut conn, key, 6, Write::None).await, key);
        assert_no_mark(fence.admit(&mut conn, key, 8, Write::None).await, key);
    });
}

/// FLUSHDB (or a new empty server behind the same URL) looks like a key never
/// fenced: refused.
#[test]
fn flushdb_makes_the_fence_refuse() {
    let server = OwnRedis::start(SAFE);
    runtime().block_on(async {
        let mut conn = connect_to(&server.url()).await;
        let key = "ledger";
        create(&mut conn, key).await;
        let fence = RedisFence::new();
        fence.admit(&mut conn, key, 7, Write::None).await.unwrap();
        let _: () = redis::cmd("FLUSHDB").query_async(&mut conn).await.unwrap();
        assert_no_mark(fence.admit(&mut conn, key, 1, Write::None).await, key);
    });
}

/// A created mark is empty: the first token's `previous` is None, creating again
/// keeps the mark, and a key never created is refused.
#[test]
fn create_is_once_and_an_uncreated_key_is_refused() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let mut conn = connect().await;
        let key = databases::unique("redis-create");
        let fence = RedisFence::new();
        assert_no_mark(fence.admit(&mut conn, &key, 1, Write::None).await, &key);
        assert_eq!(get(&mut conn, &fence_redis::mark_key(&key)).await, None);
        let created = RedisFence::create(&mut conn, &key).await.unwrap();
        assert_eq!((created.new, created.settings), (true, Settings::Safe));
        assert_eq!(
            get(&mut conn, &fence_redis::mark_key(&key))
                .await
                .as_deref(),
            Some("")
        );
        // Token 0 is a token like any other: admitted, then seen as the previous mark.
        assert_eq!(
            fence
                .admit(&mut conn, &key, 0, Write::None)
                .await
                .unwrap()
                .previous,
            None
        );
        assert_eq!(
            fence
                .admit(&mut conn, &key, 4, Write::None)
                .await
                .unwrap()
                .previous,
            Some(0)
        );
        assert!(!RedisFence::create(&mut conn, &key).await.unwrap().new);
        assert_eq!(
            get(&mut conn, &fence_redis::mark_key(&key))
                .await
                .as_deref(),
            Some("4")
        );
    });
}
