//! What the script refuses and how it says so: stale tokens, bad input, a
//! protected key that is a mark; and its NOSCRIPT fallback.

use palisade::fence::Stale;
use palisade::fence::redis::{self as fence_redis, Error, RedisFence, Write};

use support::databases::{self, runtime};

use crate::{SERVER, connect, create, get};

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
