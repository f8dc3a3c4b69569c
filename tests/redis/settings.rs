//! The settings check names what is unsafe.

use palisade::fence::redis::{self as fence_redis, Error, RedisFence, Settings, UnsafeSetting};

use support::databases::runtime;

use crate::{DEFAULT_PERSISTENCE, OwnRedis, connect, connect_to, get};

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
