//! The Redis fencing script in a real Redis (`make databases`, AOF with
//! `appendfsync always`): concurrent writers, refusals, bad input, NOSCRIPT
//! fallback, and a SIGKILL restart that keeps marks and writes. And in servers of
//! the tests' own (default persistence, `allkeys-lru`, an ACL without CONFIG): a
//! Redis that lost its marks fails closed, and the settings check names what is unsafe.
#![cfg(feature = "redis")]

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use palisade::fence::Stale;
use palisade::fence::redis::{
    self as fence_redis, Error, RedisFence, Settings, UnsafeSetting, Write,
};
use proptest::prelude::*;
use redis::aio::MultiplexedConnection;

use support::cli;
use support::databases::{self, runtime};

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

async fn connect_to(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to the test's own Redis")
}

async fn create(conn: &mut MultiplexedConnection, key: &str) {
    let created = RedisFence::create(conn, key).await.unwrap();
    assert!(created.new, "{key}: {created:?}");
}

/// A redis-server of the test's own on a free loopback port, with the settings
/// under test and its data in a temporary directory; SIGKILLed when dropped.
struct OwnRedis {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    settings: Vec<String>,
}

impl OwnRedis {
    fn start(settings: &[&str]) -> Self {
        // `make databases` installs redis-server when it is missing.
        databases::redis_url();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        let child = Self::spawn(port, dir.path(), &settings);
        let server = OwnRedis {
            child,
            port,
            dir,
            settings,
        };
        server.wait_ready();
        server
    }

    fn spawn(port: u16, dir: &std::path::Path, settings: &[String]) -> Child {
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--protected-mode", "yes", "--port"])
            .arg(port.to_string())
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(settings)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server")
    }

    /// Until it answers PING with PONG (not LOADING), for at most 10 s; a TLS
    /// server until its log says it is ready.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let tls = self.settings.iter().any(|s| s == "--tls-port");
        loop {
            let log_path = self.dir.path().join("redis.log");
            if tls
                && std::fs::read_to_string(&log_path)
                    .is_ok_and(|log| log.contains("Ready to accept connections"))
            {
                return;
            }
            let pong = std::net::TcpStream::connect(("127.0.0.1", self.port)).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                s.write_all(b"PING\r\n")?;
                let mut buf = [0u8; 64];
                let n = s.read(&mut buf)?;
                Ok(buf[..n].starts_with(b"+PONG"))
            });
            if !tls && matches!(pong, Ok(true)) {
                return;
            }
            let log =
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "redis-server on 127.0.0.1:{} did not answer within 10 s; log:\n{log}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL (no shutdown save) and start again on the same directory.
    fn kill_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn(self.port, self.dir.path(), &self.settings);
        self.wait_ready();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis' own defaults: RDB snapshots only (after 3600 s, 300 s or 60 s, given
/// enough changes), no AOF.
const DEFAULT_PERSISTENCE: &[&str] = &[];
/// What the fence needs (tests/databases/databases.sh starts the shared one so).
const SAFE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn assert_no_mark(result: Result<palisade::fence::Admitted, Error>, key: &str) {
    match result {
        Err(Error::NoMark { key: k }) => assert_eq!(k, key),
        other => panic!("expected Error::NoMark for {key:?}, got {other:?}"),
    }
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

#[test]
fn stale_refusal_names_key_and_tokens_and_writes_nothing() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let mut conn = connect().await;
        let key = databases::unique("redis-stale");
        let value_key = fence_redis::data_key(&key, "value");
        let fence = RedisFence::new();
        create(&mut conn, &key).await;
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
            Err(Error::Stale(Stale { highest, .. })) if highest == big + 1
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
        create(&mut conn, &key).await;
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

/// `palisade fence --store redis://...`: the payload is the protected write.
#[test]
fn cli_admits_writes_the_payload_and_refuses_with_exit_3() {
    let _server = SERVER.read().unwrap();
    let url = databases::redis_url();
    let key = databases::unique("redis-cli");
    let run = |args: &[&str]| cli::fence(&url, args);
    assert!(run(&["--key", &key, "--create"]).status.success());
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

/// The settings check names each unsafe setting with the value needed, passes on
/// the safe ones, says "cannot see" where CONFIG is refused, and `create` refuses
/// in a Redis it sees is unsafe.
#[test]
fn check_settings_names_the_unsafe_settings() {
    let default = OwnRedis::start(DEFAULT_PERSISTENCE);
    let lru = OwnRedis::start(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    let volatile = OwnRedis::start(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--maxmemory-policy",
        "volatile-lru",
    ]);
    let unsafe_of = |s: &[(&'static str, &str, &'static str)]| -> Vec<UnsafeSetting> {
        s.iter()
            .map(|&(name, value, required)| UnsafeSetting {
                name,
                value: value.into(),
                required,
            })
            .collect()
    };
    runtime().block_on(async {
        let mut conn = connect_to(&default.url()).await;
        match fence_redis::check_settings(&mut conn).await {
            Err(Error::UnsafeSettings(found)) => assert_eq!(
                found,
                unsafe_of(&[
                    ("appendonly", "no", "yes"),
                    ("appendfsync", "everysec", "always")
                ])
            ),
            other => panic!("default persistence: {other:?}"),
        }
        let refused = RedisFence::create(&mut conn, "ledger").await.unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("appendonly is \"no\" (needs yes)")
                && message.contains("appendfsync is \"everysec\" (needs always)"),
            "{message}"
        );
        assert_eq!(get(&mut conn, &fence_redis::mark_key("ledger")).await, None);

        let mut conn = connect_to(&lru.url()).await;
        match fence_redis::check_settings(&mut conn).await {
            Err(Error::UnsafeSettings(found)) => assert_eq!(
                found,
                unsafe_of(&[
                    ("appendfsync", "everysec", "always"),
                    (
                        "maxmemory-policy",
                        "allkeys-lru",
                        "noeviction or a volatile-* policy"
                    )
                ])
            ),
            other => panic!("allkeys-lru: {other:?}"),
        }

        let mut conn = connect_to(&volatile.url()).await;
        assert_eq!(
            fence_redis::check_settings(&mut conn).await.unwrap(),
            Settings::Safe
        );
        assert_eq!(
            fence_redis::check_settings(&mut connect().await)
                .await
                .unwrap(),
            Settings::Safe,
            "the shared test Redis"
        );

        // A user whose ACL leaves out CONFIG, as on many managed services.
        let _: () = redis::cmd("ACL")
            .arg(
                &[
                    "SETUSER", "fencer", "on", ">secret", "~*", "+@all", "-config",
                ][..],
            )
            .query_async(&mut conn)
            .await
            .unwrap();
        let url = format!("redis://fencer:secret@127.0.0.1:{}/", volatile.port);
        let mut limited = connect_to(&url).await;
        match fence_redis::check_settings(&mut limited).await {
            Ok(Settings::CannotSee(why)) => assert!(why.contains("no permissions"), "{why}"),
            other => panic!("CONFIG refused by an ACL: {other:?}"),
        }
        let created = RedisFence::create(&mut limited, "ledger").await.unwrap();
        assert!(created.new && matches!(created.settings, Settings::CannotSee(_)));
    });
}

/// No payload can land on a mark: the script refuses a protected key that is this
/// key's mark or shaped like any mark, and the Rust caller refuses before sending.
#[test]
fn a_protected_key_that_is_a_mark_is_refused() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(async {
        let mut conn = connect().await;
        let key = databases::unique("redis-markwrite");
        let mark = fence_redis::mark_key(&key);
        create(&mut conn, &key).await;
        RedisFence::new()
            .admit(&mut conn, &key, 5, Write::None)
            .await
            .unwrap();
        // Another key's mark, spelled as a data key with a crafted name.
        let other = fence_redis::data_key(&key, "x}:token");
        assert!(fence_redis::is_mark_key(&other));
        for protected in [&mark, &other] {
            let err = redis::cmd("EVAL")
                .arg(fence_redis::SCRIPT)
                .arg(2)
                .arg(&mark)
                .arg(protected)
                .arg("9")
                .arg(&key)
                .arg("set")
                .arg("99")
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap_err();
            assert!(err.to_string().contains("is a fence mark"), "{err}");
            let write = Write::Set {
                key: protected,
                value: "99",
            };
            assert!(matches!(
                RedisFence::new().admit(&mut conn, &key, 9, write).await,
                Err(Error::BadInput(m)) if m.contains("is a fence mark")
            ));
        }
        assert_eq!(get(&mut conn, &mark).await.as_deref(), Some("5"));
        assert_eq!(get(&mut conn, &other).await, None);
        assert_ne!(fence_redis::data_key(&key, "token"), mark);
    });
}

/// `palisade fence --create` makes the mark (no token); an admit without it fails
/// with exit 1 naming the key; a Redis it sees is unsafe is refused, exit 1.
#[test]
fn cli_create_then_admit_and_refusals() {
    let _server = SERVER.read().unwrap();
    let url = databases::redis_url();
    let key = databases::unique("redis-cli-create");
    let run = |args: &[&str]| cli::fence(&url, args);
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let uncreated = run(&["--key", &key, "--token", "3"]);
    assert_eq!(uncreated.status.code(), Some(1), "{}", stderr(&uncreated));
    let message = stderr(&uncreated);
    assert!(
        message.contains(&format!("{key:?}")) && message.contains("missing"),
        "{message}"
    );

    let with_token = run(&["--key", &key, "--create", "--token", "3"]);
    assert_eq!(with_token.status.code(), Some(2), "{}", stderr(&with_token));

    let created = run(&["--key", &key, "--create"]);
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(String::from_utf8_lossy(&created.stdout).contains("created"));
    let again = run(&["--key", &key, "--create"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("kept as it is"));

    let admitted = run(&["--key", &key, "--token", "3"]);
    assert!(admitted.status.success(), "{}", stderr(&admitted));
    assert!(
        String::from_utf8_lossy(&admitted.stdout).contains("first token"),
        "{}",
        String::from_utf8_lossy(&admitted.stdout)
    );

    let default = OwnRedis::start(DEFAULT_PERSISTENCE);
    for args in [
        &["--key", "ledger", "--create"][..],
        &["--key", "ledger", "--token", "3"][..],
    ] {
        let out = cli::fence(default.url(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("appendonly is \"no\" (needs yes)"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// `rediss://`: the CLI speaks TLS (rustls; the server's certificate checked
/// against the roots, here `SSL_CERT_FILE`, a CA the test makes with openssl).
#[test]
fn cli_speaks_tls_to_rediss() {
    let certs = tempfile::tempdir().unwrap();
    let path = |name: &str| certs.path().join(name);
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(certs.path())
            .output()
            .expect("running openssl to make the test's certificates");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(path("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (port_s, cert, key, ca) = (
        port.to_string(),
        path("server.pem").display().to_string(),
        path("server.key").display().to_string(),
        path("ca.pem").display().to_string(),
    );
    let mut settings = SAFE.to_vec();
    settings.extend([
        "--port",
        "0",
        "--tls-port",
        &port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    // Its plain port is turned off (`--port 0`); the TLS port is ours.
    let _server = OwnRedis::start(&settings);
    let url = format!("rediss://127.0.0.1:{port}/");
    let fence = |args: &[&str]| {
        cli::palisade()
            .env("SSL_CERT_FILE", &ca)
            .args(["fence", "--store", &url])
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["--key", "ledger", "--create"][..],
        &["--key", "ledger", "--token", "4", "--payload", "over tls"][..],
    ] {
        let out = fence(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        fence(&["--key", "ledger", "--token", "3"]).status.code(),
        Some(3)
    );
}
